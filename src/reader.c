/* STUB: replaced by the reader. */
#include <errno.h>
#include "internal.h"
int dcp_plan_execute(dcp_checkpoint *ck, const dcp_plan *p, void *d, dcp_error *err)
{ (void)p; (void)d; return dcpi_err(err, ENOSYS, "%s: reader not implemented", ck->path); }
int dcp_op_fetch(dcp_checkpoint *ck, const dcp_entry *e, const dcp_op *op, void *buf, dcp_error *err)
{ (void)op; (void)buf; return dcpi_err(err, ENOSYS, "%s: %s: not implemented", ck->path, e->key); }
void dcp_op_place(const dcp_op *op, const void *src, void *region, dcp_dtype dtype) { (void)op; (void)src; (void)region; (void)dtype; }
int dcp_file_fd(dcp_checkpoint *ck, uint32_t file, int *fd, dcp_error *err)
{ (void)file; (void)fd; return dcpi_err(err, ENOSYS, "%s: not implemented", ck->path); }
int dcp_read_entry(dcp_checkpoint *ck, const dcp_entry *e, void **buf, uint64_t *len, dcp_error *err)
{ (void)buf; (void)len; return dcpi_err(err, ENOSYS, "%s: %s: not implemented", ck->path, e->key); }
int dcpi_ck_fd(dcp_checkpoint *ck, uint32_t file, int *fd, dcp_error *err)
{ (void)file; (void)fd; return dcpi_err(err, ENOSYS, "%s: not implemented", ck->path); }
int dcpi_ck_file_size(dcp_checkpoint *ck, uint32_t file, uint64_t *size, dcp_error *err)
{ (void)file; (void)size; return dcpi_err(err, ENOSYS, "%s: not implemented", ck->path); }
int dcpi_pread_full(dcp_checkpoint *ck, uint32_t file, void *buf, size_t len, uint64_t off, const char *key, dcp_error *err)
{ (void)file; (void)buf; (void)len; (void)off; return dcpi_err(err, ENOSYS, "%s: %s: not implemented", ck->path, key); }
