/* dcpfs: the .npy header of -o view=npy.
 *
 * Format 1.0 (2.0 when the header dict exceeds 65535 bytes): magic, version,
 * header length, a Python dict literal padded with spaces and a final '\n' so
 * the data starts at a multiple of 64 bytes. Data follows in C order,
 * little-endian, exactly as in the raw view.
 *
 * dtypes numpy lacks (bfloat16, the float8 family, complex32, quantized and
 * bit types) are written as unsigned integers of the same element size
 * ('<u2' for bfloat16, '|u1' for float8): the raw bits, so
 * `np.load(f).view(ml_dtypes.bfloat16)` gives the values. The real dtype is
 * in the user.dcp.dtype extended attribute.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcpfs.h"

const char *dfs_npy_descr(dcp_dtype dt, char *tmp, size_t tmplen)
{
    const char *d = dcp_dtype_numpy(dt);
    if (d)
        return d;
    switch (dcp_dtype_size(dt)) {
    case 1: return "|u1";
    case 2: return "<u2";
    case 4: return "<u4";
    case 8: return "<u8";
    default:
        snprintf(tmp, tmplen, "|V%zu", dcp_dtype_size(dt));
        return tmp;
    }
}

int dfs_npy_header(const dcp_entry *e, char **hdr, uint32_t *len)
{
    char tmp[32];
    const char *descr = dfs_npy_descr(e->dtype, tmp, sizeof tmp);
    /* "(a, b, )" at most 22 bytes per dimension. */
    size_t cap = 128 + (size_t)e->ndim * 24;
    char *dict = malloc(cap);
    if (!dict)
        return -1;
    size_t n = (size_t)snprintf(dict, cap, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
    for (int d = 0; d < e->ndim; d++)
        n += (size_t)snprintf(dict + n, cap - n, "%s%" PRId64, d ? ", " : "", e->shape[d]);
    n += (size_t)snprintf(dict + n, cap - n, "%s), }", e->ndim == 1 ? "," : "");
    /* magic(6) + version(2) + length(2 or 4) + dict + padding + '\n' = k*64 */
    size_t pre = n + 1 < 65536 - 64 ? 10 : 12;
    size_t total = (pre + n + 1 + 63) / 64 * 64;
    char *h = malloc(total);
    if (!h) {
        free(dict);
        return -1;
    }
    size_t hlen = total - pre;
    memcpy(h, "\x93NUMPY", 6);
    if (pre == 10) {
        h[6] = 1, h[7] = 0;
        h[8] = (char)(hlen & 0xff), h[9] = (char)(hlen >> 8);
    } else {
        h[6] = 2, h[7] = 0;
        for (int i = 0; i < 4; i++)
            h[8 + i] = (char)((hlen >> (8 * i)) & 0xff);
    }
    memcpy(h + pre, dict, n);
    memset(h + pre + n, ' ', total - pre - n - 1);
    h[total - 1] = '\n';
    free(dict);
    *hdr = h;
    *len = (uint32_t)total;
    return 0;
}
