/* STUB: replaced by the planner. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "internal.h"
void dcp_plan_init(dcp_plan *p) { memset(p, 0, sizeof *p); }
void dcp_plan_reset(dcp_plan *p) { p->nops = 0; p->nbytes = 0; p->zero_fill = 0; }
void dcp_plan_free(dcp_plan *p) { free(p->ops); dcp_plan_init(p); }
int dcp_plan_region(dcp_checkpoint *ck, const dcp_entry *e, const int64_t *o, const int64_t *l, dcp_plan *p, dcp_error *err)
{ (void)o; (void)l; (void)p; return dcpi_err(err, ENOSYS, "%s: %s: planner not implemented", ck->path, e->key); }
int dcp_plan_bytes(dcp_checkpoint *ck, const dcp_entry *e, uint64_t o, uint64_t l, dcp_plan *p, dcp_error *err)
{ (void)o; (void)l; (void)p; return dcpi_err(err, ENOSYS, "%s: %s: planner not implemented", ck->path, e->key); }
