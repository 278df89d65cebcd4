/* STUB: replaced by the record locator. */
#include <errno.h>
#include "internal.h"
int dcpi_locate_record(dcp_checkpoint *ck, const dcp_entry *e, size_t chunk, dcp_record *rec, dcp_error *err)
{ (void)chunk; (void)rec; return dcpi_err(err, ENOSYS, "%s: %s: record locator not implemented", ck->path, e->key); }
