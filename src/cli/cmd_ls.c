/* dcp ls: one line per key (a table, or JSON lines with --json). */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: dcp ls [--json] [--keys PATTERN] CKPT\n");
}

static void shape_text(const dcp_entry *e, char *buf, size_t n)
{
    size_t used = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < e->ndim && used < n; d++)
        used += (size_t)snprintf(buf + used, n - used, "%s%lld", d ? "," : "", (long long)e->shape[d]);
    if (used < n)
        snprintf(buf + used, n - used, "]");
}

int cmd_ls(int argc, char **argv)
{
    static const struct option opts[] = {
        {"json", no_argument, 0, 'j'}, {"keys", required_argument, 0, 'k'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int json = 0, c;
    const char *pattern = NULL;
    while ((c = getopt_long(argc, argv, "jk:h", opts, NULL)) != -1) {
        switch (c) {
        case 'j': json = 1; break;
        case 'k': pattern = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind != argc - 1) {
        usage(stderr);
        return 2;
    }
    dcp_checkpoint *ck = cli_open(argv[optind]);
    if (!ck)
        return cli_open_status();
    int status = 0;
    size_t n = dcp_num_entries(ck), matched = 0;
    /* The header comes with the first line it heads: a --keys pattern that
     * matches nothing prints the error alone, not an empty table before it. */
    int header = !json && !pattern;
    if (header)
        printf("%-48s %-10s %-20s %s\n", "KEY", "DTYPE", "SHAPE", "SIZE");
    for (size_t i = 0; i < n; i++) {
        const dcp_entry *e;
        dcp_error err;
        if (dcp_get_entry(ck, i, &e, &err) < 0) {
            cli_error("%s", err.msg);
            status = 1;
            break;
        }
        if (!dcp_key_matches(pattern, e->key))
            continue;
        matched++;
        if (!json && !header) {
            printf("%-48s %-10s %-20s %s\n", "KEY", "DTYPE", "SHAPE", "SIZE");
            header = 1;
        }
        uint64_t nbytes = 0;
        if (dcp_entry_nbytes(ck, e, &nbytes, &err) < 0) {
            cli_error("%s", err.msg);
            status = 1;
            continue;
        }
        if (json) {
            fputs("{\"key\":", stdout);
            cli_json_string(stdout, e->key);
            if (e->kind == DCP_KIND_TENSOR) {
                printf(",\"kind\":\"tensor\",\"dtype\":\"%s\",\"shape\":", dcp_dtype_name(e->dtype));
                cli_json_shape(stdout, e->shape, e->ndim);
            } else {
                fputs(",\"kind\":\"bytes\"", stdout);
            }
            printf(",\"nbytes\":%llu,\"chunks\":%zu}\n", (unsigned long long)nbytes,
                   e->kind == DCP_KIND_TENSOR ? e->nchunks : (size_t)e->has_blob);
        } else {
            char shape[256], human[32];
            if (e->kind == DCP_KIND_TENSOR)
                shape_text(e, shape, sizeof shape);
            else
                snprintf(shape, sizeof shape, "-");
            cli_pad(stdout, cli_text(e->key), 48);   /* by display width: CJK 2 columns, marks 0 */
            printf(" %-10s %-20s %s\n",
                   e->kind == DCP_KIND_TENSOR ? dcp_dtype_name(e->dtype) : "bytes", shape,
                   cli_human_bytes(nbytes, human));
        }
    }
    if (pattern && !matched && status == 0) {   /* a typo must not read as "nothing there" */
        cli_error("%s: no key matches '%s'", argv[optind], pattern);
        status = 1;
    }
    if (fflush(stdout) != 0) {
        cli_error("writing the listing: %m");
        status = 1;
    }
    dcp_close(ck);
    return status;
}
