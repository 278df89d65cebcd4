/* Sizes as people type them ("64K", "256MiB", "5GB"): dcp_parse_size_ex and
 * its 0.1 form without a reason. Used for --max-shard-size, dcp synth's
 * --total and dcpload's --staging. */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "dcp_write.h"
#include "internal.h"

int dcp_parse_size_ex(const char *s, const char *what, uint64_t *out, dcp_error *err)
{
    /* "WHAT: " before the reason, or nothing. */
    const char *w = what ? what : "", *sep = what ? ": " : "";
    if (!s || !out)
        return dcpi_err(err, EINVAL, "%s%sno size given", w, sep);
    /* strtoull takes a sign and leading spaces: a size starts with a digit. */
    if (!isdigit((unsigned char)s[0]))
        return dcpi_err(err, EINVAL, "%s%s'%s' is not a size (digits, then an optional unit such as K, MiB, GB)",
                        w, sep, s);
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno == ERANGE)
        return dcpi_err(err, ERANGE, "%s%s'%s' is past the largest size (2^64 - 1 bytes)", w, sep, s);
    static const struct { const char *suf; uint64_t mul; } units[] = {
        {"", 1}, {"B", 1}, {"K", 1ull << 10}, {"KiB", 1ull << 10}, {"KB", 1000}, {"M", 1ull << 20},
        {"MiB", 1ull << 20}, {"MB", 1000000}, {"G", 1ull << 30}, {"GiB", 1ull << 30}, {"GB", 1000000000},
        {"T", 1ull << 40}, {"TiB", 1ull << 40}, {"TB", 1000000000000ull}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (!strcmp(end, units[i].suf)) {
            if (!dcpi_mul_u64((uint64_t)v, units[i].mul, out))
                return dcpi_err(err, ERANGE, "%s%s'%s' is past the largest size (2^64 - 1 bytes)", w, sep, s);
            return 0;
        }
    return dcpi_err(err, EINVAL, "%s%s'%s': unknown unit '%s' (B, K, KiB, KB, M, MiB, MB, G, GiB, GB, T, TiB, TB)",
                    w, sep, s, end);
}

int dcp_parse_size(const char *s, uint64_t *out)
{
    dcp_error err;
    return dcp_parse_size_ex(s, NULL, out, &err);
}
