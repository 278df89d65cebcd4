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
 * (mincore): registering pages that are not would read them on this thread,
 * one fault at a time, where the parallel reader keeps the device busy.
 * Decoded (zstd) units, files that cannot be mapped, and registrations the
 * runtime refuses are read as usual; none of these is an error. The pages
 * are pinned once registered, so a shard truncated afterwards cannot pull
 * them from under a copy; the CPU never touches the mapping. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "device.h"
#include "load.h"

/* Is every page of [p, p+n) (page-aligned p) resident? */
static int resident(void *p, size_t n, size_t page)
{
    size_t pages = (n + page - 1) / page;
    unsigned char small[512];
    unsigned char *v = pages <= sizeof small ? small : malloc(pages);
    if (!v)
        return 0;
    int ok = mincore(p, n, v) == 0;
    for (size_t i = 0; ok && i < pages; i++)
        ok = v[i] & 1;
    if (v != small)
        free(v);
    return ok;
}

int ldi_map_unit(dcp_checkpoint *ck, const dcp_gplan *g, const dcp_gunit *u, const ldi_devops *ops,
                 ldi_map *m, const unsigned char **at)
{
    m->base = NULL;
    m->len = 0;
    if (!ops || !ops->host_register_ro)
        return 0;
    dcp_op op = dcp_gunit_op(g, u);
    long pg = sysconf(_SC_PAGESIZE);
    size_t page = pg > 0 ? (size_t)pg : 4096;
    int fd;
    dcp_error e;
    struct stat st;
    uint64_t end;
    if (op.flags & DCP_OP_DECODED || op.length == 0 || op.length != u->len || op.length > SIZE_MAX / 2 ||
        __builtin_add_overflow(op.src_offset, op.length, &end) || dcp_file_fd(ck, op.file, &fd, &e) < 0 ||
        fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size < 0 || (uint64_t)st.st_size < end)
        return 0;   /* read as usual: that read reports a short file */
    uint64_t from = op.src_offset / page * page;
    size_t lead = (size_t)(op.src_offset - from), len = lead + (size_t)op.length;
    if (from > (uint64_t)INT64_MAX)
        return 0;
    void *p = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, (off_t)from);
    if (p == MAP_FAILED)
        return 0;
    if (!resident(p, len, page) || ops->host_register_ro(p, len) < 0) {
        munmap(p, len);
        return 0;
    }
    m->base = p;
    m->len = len;
    *at = (const unsigned char *)p + lead;
    return 1;
}

void ldi_map_release(const ldi_devops *ops, ldi_map *m)
{
    if (!m->base)
        return;
    if (ops)
        ops->host_unregister(m->base);
    munmap(m->base, m->len);
    m->base = NULL;
    m->len = 0;
}
