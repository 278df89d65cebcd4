/* What every rank of a call must share: the options (after defaults) and
 * the checkpoint. Ranks that differ would plan differently and post
 * mismatched transfers, so each rank sends this with its requests and all
 * compare it with rank 0's.
 *
 * The checkpoint's identity is cheap on purpose (it runs on every call): the
 * names and sizes of its data files, its entry count and the size of its
 * .metadata. Modification times are left out, so copies of one checkpoint
 * on node-local disks still match. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "load.h"

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ c[i]) * 1099511628211ull;
    return h;
}

int ldi_identity(dcp_checkpoint *ck, uint64_t *out, dcp_error *err)
{
    uint64_t h = 1469598103934665603ull;   /* FNV-1a */
    uint64_t v[2] = {dcp_num_files(ck), dcp_num_entries(ck)};
    h = fnv(h, v, sizeof v);
    char path[4352];
    struct stat sb;
    for (uint32_t f = 0; f < dcp_num_files(ck); f++) {
        /* stat, not dcp_file_fd: no file is opened (or evicted from the
         * reader's descriptor cache) for this */
        const char *name = dcp_file_name(ck, f);
        snprintf(path, sizeof path, "%s/%s", dcp_path(ck), name ? name : "");
        if (stat(path, &sb) < 0)
            return ldi_err(err, errno, "%s: %s", path, strerror(errno));
        uint64_t size = (uint64_t)sb.st_size;
        h = fnv(h, name ? name : "", name ? strlen(name) + 1 : 1);
        h = fnv(h, &size, sizeof size);
    }
    snprintf(path, sizeof path, "%s/.metadata", dcp_path(ck));
    uint64_t msize = stat(path, &sb) == 0 && S_ISREG(sb.st_mode) ? (uint64_t)sb.st_size : 0;
    *out = fnv(h, &msize, sizeof msize);
    return 0;
}
