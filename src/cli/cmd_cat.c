/* dcp cat: a tensor's bytes in C order (or one box of it), or a bytes item's
 * stored bytes, streamed to stdout in bounded pieces. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define PIECE (8u << 20)   /* bytes planned and written at a time */

static void usage(FILE *f)
{
    fprintf(f, "usage: dcp cat [--box START:COUNT[,START:COUNT...]] CKPT KEY\n");
}

/* "0:10,5:3" -> offsets/lengths; one pair per dimension. */
static int parse_box(const char *s, const dcp_entry *e, int64_t *off, int64_t *len)
{
    int d = 0;
    const char *p = s;
    while (*p) {
        char *end;
        if (d >= e->ndim)
            break;
        errno = 0;
        long long a = strtoll(p, &end, 10);
        if (end == p || *end != ':' || errno)
            return -1;
        p = end + 1;
        long long b = strtoll(p, &end, 10);
        if (end == p || errno || (*end && *end != ','))
            return -1;
        off[d] = a;
        len[d] = b;
        d++;
        p = *end ? end + 1 : end;
    }
    return (d == e->ndim && !*p) ? 0 : -1;
}

static int stream_bytes(dcp_checkpoint *ck, const dcp_entry *e, void *buf, dcp_plan *plan, dcp_error *err)
{
    uint64_t total;
    if (dcp_entry_nbytes(ck, e, &total, err) < 0)
        return -1;
    uint64_t esz = e->kind == DCP_KIND_TENSOR ? dcp_dtype_size(e->dtype) : 1;
    uint64_t step = PIECE - PIECE % esz;
    for (uint64_t off = 0; off < total; off += step) {
        uint64_t n = total - off < step ? total - off : step;
        if (dcp_plan_bytes(ck, e, off, n, plan, err) < 0 || dcp_plan_execute(ck, plan, buf, err) < 0)
            return -1;
        if (cli_write_stdout(buf, plan->nbytes) < 0)
            return cli_err_stdout(err);
    }
    return 0;
}

static int stream_box(dcp_checkpoint *ck, const dcp_entry *e, int64_t *off, int64_t *len,
                      void **buf, dcp_plan *plan, dcp_error *err)
{
    /* The whole box first: a bad count found at a later slab would come after
     * earlier slabs were written, and the slab sizes below must not wrap. */
    for (int d = 0; d < e->ndim; d++)
        if (off[d] < 0 || len[d] < 0 || off[d] > e->shape[d] || len[d] > e->shape[d] - off[d]) {
            err->code = EINVAL;
            snprintf(err->msg, sizeof err->msg,
                     "%s: --box %" PRId64 ":%" PRId64 " lies outside dimension %d (size %" PRId64 ")", e->key, off[d],
                     len[d], d, e->shape[d]);
            return -1;
        }
    /* Slabs along dimension 0 of at most PIECE bytes (at least one row). */
    int empty = 0;   /* a box of no element: its other counts may be anything up to INT64_MAX */
    for (int d = 0; d < e->ndim; d++)
        empty |= len[d] == 0;
    uint64_t row = dcp_dtype_size(e->dtype);
    for (int d = 1; d < e->ndim && !empty; d++)
        row *= (uint64_t)len[d];   /* a box of a tensor the model holds: fits */
    if (e->ndim == 0 || empty) {
        if (dcp_plan_region(ck, e, off, len, plan, err) < 0)
            return -1;
        if (dcp_plan_execute(ck, plan, *buf, err) < 0)
            return -1;
        return cli_write_stdout(*buf, plan->nbytes) < 0 ? cli_err_stdout(err) : 0;
    }
    int64_t rows = (int64_t)(PIECE / row);
    if (rows < 1) {
        rows = 1;
        void *big = realloc(*buf, row);
        if (!big) {
            err->code = ENOMEM;
            snprintf(err->msg, sizeof err->msg, "%s: out of memory for one row (%" PRIu64 " bytes)", e->key, row);
            return -1;
        }
        *buf = big;
    }
    int64_t start = off[0], end = off[0] + len[0];   /* both within shape[0] */
    for (int64_t r = start; r < end; r += rows) {
        off[0] = r;
        int64_t saved = len[0];
        len[0] = end - r < rows ? end - r : rows;
        int rc = dcp_plan_region(ck, e, off, len, plan, err);
        len[0] = saved;
        if (rc < 0 || dcp_plan_execute(ck, plan, *buf, err) < 0)
            return -1;
        if (cli_write_stdout(*buf, plan->nbytes) < 0)
            return cli_err_stdout(err);
    }
    return 0;
}

int cmd_cat(int argc, char **argv)
{
    static const struct option opts[] = {
        {"box", required_argument, 0, 'b'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    const char *box = NULL;
    int c;
    while ((c = getopt_long(argc, argv, "b:h", opts, NULL)) != -1) {
        switch (c) {
        case 'b': box = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind != argc - 2) {
        usage(stderr);
        return 2;
    }
    const char *path = argv[optind], *key = argv[optind + 1];
    dcp_checkpoint *ck = cli_open(path);
    if (!ck)
        return cli_open_status();
    int status = 1;
    dcp_plan plan;
    dcp_plan_init(&plan);
    dcp_error err;
    void *buf = malloc(PIECE);
    const dcp_entry *e = NULL;
    if (!buf) {
        cli_error("out of memory");
    } else if (cli_find_key(ck, path, key, &e) < 0) {
        ;   /* said */
    } else if (box) {
        int64_t off[64], len[64];
        if (e->kind != DCP_KIND_TENSOR)
            cli_error("%s: %s: --box needs a tensor, this is a bytes item", path, key);
        else if (e->ndim > 64 || parse_box(box, e, off, len) < 0)
            cli_error("%s: %s: --box '%s' must give START:COUNT for each of the %d dimensions", path,
                      key, box, e->ndim);
        else if (stream_box(ck, e, off, len, &buf, &plan, &err) < 0)
            cli_error("%s: %s", path, err.msg);   /* err.msg begins with the key */
        else
            status = 0;
    } else if (stream_bytes(ck, e, buf, &plan, &err) < 0) {
        cli_error("%s", err.msg);
    } else {
        status = 0;
    }
    free(buf);
    dcp_plan_free(&plan);
    dcp_close(ck);
    return status;
}
