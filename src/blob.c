/* STUB: replaced by blob reading and zstd decoding. */
#include <errno.h>
#include "internal.h"
int dcpi_blob_read(dcp_checkpoint *ck, const dcp_blob *b, void *buf, size_t len, uint64_t off, const char *key, dcp_error *err)
{ (void)b; (void)buf; (void)len; (void)off; return dcpi_err(err, ENOSYS, "%s: %s: not implemented", ck->path, key); }
int dcpi_blob_size(dcp_checkpoint *ck, const dcp_blob *b, uint64_t *size, const char *key, dcp_error *err)
{ (void)b; (void)size; return dcpi_err(err, ENOSYS, "%s: %s: not implemented", ck->path, key); }
