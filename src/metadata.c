/* STUB: replaced by the .metadata interpreter. */
#include <errno.h>
#include "internal.h"
int dcpi_load_metadata(dcp_checkpoint *ck, const char *relname, dcp_error *err)
{ return dcpi_err(err, ENOSYS, "%s/%s: not implemented", ck->path, relname); }
int dcpi_load_rank_local(dcp_checkpoint *ck, dcp_error *err)
{ return dcpi_err(err, ENOSYS, "%s: rank-local metadata not implemented", ck->path); }
