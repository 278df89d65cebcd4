/* Units for CUDA destinations copied by the GPU straight out of the page
 * cache (DCP_LOAD_MAP, issue 16): instead of a CPU copy from the page cache
 * into pinned staging and a GPU copy from there, the unit's stored bytes are
 * mapped read-only (mmap of the shard file), page-locked for the device
 * (cudaHostRegister with cudaHostRegisterReadOnly, through the device
 * layer), and the placement's copies read them from there. On an H100 a
 * probe registered an 8 GiB cached file in 0.27 s and copied it to the GPU
 * at 52 GB/s, where the staged path's CPU copy out of the page cache held a
 * rank at 12-18 GB/s.
 *
 * Only a unit whose every page is already in the page cache is mapped
 * (libdcp's dcp_op_map_cached: mincore; the file dcp_open saw):
 * registering pages that are not would read them on this thread,
 * one fault at a time, where the parallel reader keeps the device busy.
 * Decoded (zstd) units, files that cannot be mapped, and registrations the
 * runtime refuses are read as usual; none of these is an error. The pages
 * are pinned once registered, so a shard truncated afterwards cannot pull
 * them from under a copy; the CPU never touches the mapping. */
#include "device.h"
#include "load.h"

int ldi_map_unit(dcp_checkpoint *ck, const dcp_gplan *g, const dcp_gunit *u, const ldi_devops *ops,
                 ldi_map *m, const unsigned char **at)
{
    m->base = NULL;
    m->len = 0;
    if (!ops || !ops->host_register_ro)
        return 0;
    dcp_op op = dcp_gunit_op(g, u);
    const void *first;
    void *base;
    size_t len;
    if (op.length != u->len || !dcp_op_map_cached(ck, &op, &first, &base, &len))
        return 0;
    if (ops->host_register_ro(base, len) < 0) {
        dcp_op_unmap(base, len);
        return 0;
    }
    m->base = base;
    m->len = len;
    *at = first;
    return 1;
}

void ldi_map_release(const ldi_devops *ops, ldi_map *m)
{
    if (!m->base)
        return;
    if (ops)
        ops->host_unregister(m->base);
    dcp_op_unmap(m->base, m->len);
    m->base = NULL;
    m->len = 0;
}
