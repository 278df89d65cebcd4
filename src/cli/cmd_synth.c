/* dcp synth: write a synthetic DCP checkpoint with deterministic contents
 * (the formula is in dcp-synth(1) and src/write/synth.c). */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "dcp_write.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: dcp synth DST [--keys N | --total SIZE] [--shape A,B,...] [--dtype D] [--ranks R]\n"
               "                 [--shard rows|cols|blocks|replicated] [--seed S] [--chunks-per-key C]\n"
               "                 [--bytes-items M] [--crc]\n"
               "defaults: --keys 4 --shape 1024,1024 --dtype float32 --ranks 1 --shard rows --seed 0\n");
}

/* Decimal, as the man page writes them ("010" is ten, not octal eight). */
static int parse_u64(const char *s, uint64_t *v)
{
    char *end;
    errno = 0;
    unsigned long long x = strtoull(s, &end, 10);
    if (end == s || *end || errno || s[0] < '0' || s[0] > '9')   /* no sign, no space */
        return -1;
    *v = x;
    return 0;
}

static int parse_shape(const char *s, dcp_synth_options *o)
{
    o->ndim = 0;
    if (!strcmp(s, "") || !strcmp(s, "scalar"))
        return 0;   /* a 0-d tensor */
    const char *p = s;
    while (*p) {
        if (o->ndim == 8)
            return -1;
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno || v < 0 || (*end && *end != ',' && *end != 'x'))
            return -1;
        o->shape[o->ndim++] = v;
        p = *end ? end + 1 : end;
    }
    return 0;
}

int cmd_synth(int argc, char **argv)
{
    static const struct option opts[] = {
        {"keys", required_argument, 0, 'k'},   {"shape", required_argument, 0, 's'},
        {"dtype", required_argument, 0, 'd'},  {"ranks", required_argument, 0, 'r'},
        {"shard", required_argument, 0, 'S'},  {"seed", required_argument, 0, 'e'},
        {"chunks-per-key", required_argument, 0, 'c'}, {"bytes-items", required_argument, 0, 'b'},
        {"total", required_argument, 0, 't'},  {"crc", no_argument, 0, 'C'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    dcp_synth_options o = DCP_SYNTH_OPTIONS_INIT;
    o.nkeys = 4;
    o.ndim = 2;
    o.shape[0] = o.shape[1] = 1024;
    o.dtype = DCP_FLOAT32;
    o.ranks = 1;
    o.shard = DCP_SHARD_ROWS;
    o.chunks_per_key = 1;
    uint64_t v, total = 0;
    int total_given = 0;
    int keys_given = 0, c, li = 0;
    while ((c = getopt_long(argc, argv, "h", opts, &li)) != -1) {
        switch (c) {
        case 'k':
            if (parse_u64(optarg, &o.nkeys) < 0)
                goto bad;
            keys_given = 1;
            break;
        case 's':
            if (parse_shape(optarg, &o) < 0)
                goto bad;
            break;
        case 'd':
            if ((o.dtype = dcp_dtype_from_name(optarg)) == DCP_DTYPE_INVALID) {
                cli_error("synth: unknown dtype '%s'", optarg);
                return 2;
            }
            break;
        case 'r':
            if (parse_u64(optarg, &v) < 0 || v < 1 || v > 65536)
                goto bad;
            o.ranks = (int)v;
            break;
        case 'S':
            if (!strcmp(optarg, "rows"))
                o.shard = DCP_SHARD_ROWS;
            else if (!strcmp(optarg, "cols"))
                o.shard = DCP_SHARD_COLS;
            else if (!strcmp(optarg, "blocks"))
                o.shard = DCP_SHARD_BLOCKS;
            else if (!strcmp(optarg, "replicated"))
                o.shard = DCP_SHARD_REPLICATED;
            else
                goto bad;
            break;
        case 'e':
            if (parse_u64(optarg, &o.seed) < 0)
                goto bad;
            break;
        case 'c':
            if (parse_u64(optarg, &v) < 0 || v < 1 || v > (1u << 20))
                goto bad;
            o.chunks_per_key = (int)v;
            break;
        case 'b':
            if (parse_u64(optarg, &o.bytes_items) < 0)
                goto bad;
            break;
        case 't': {
            dcp_error perr;
            if (dcp_parse_size_ex(optarg, "synth: --total", &total, &perr) < 0) {
                cli_error("%s", perr.msg);
                return 2;
            }
            total_given = 1;
            break;
        }
        case 'C':
            o.crc = 1;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind != argc - 1) {
        usage(stderr);
        return 2;
    }
    if (keys_given && total_given) {   /* one says how many keys, the other how many bytes */
        cli_error("synth: --keys and --total: give one of them");
        return 2;
    }
    if (total && !keys_given) {
        /* As many keys as it takes to reach the total. A key whose byte
         * size overflows is one key: dcp_synth_checkpoint refuses its shape
         * (naming DST and the shape) unless a 0 in it makes the size 0. */
        uint64_t kb = dcp_dtype_size(o.dtype);
        int over = 0;
        for (int d = 0; d < o.ndim; d++)
            over |= __builtin_mul_overflow(kb, (uint64_t)o.shape[d], &kb);
        o.nkeys = kb && !over ? (total + kb - 1) / kb : 1;
    }
    o.progress = cli_progress;
    o.progress_ctx = "synth";
    o.cancel = &cli_stop_signal;   /* stopped, DST is removed as after any failure */
    cli_catch_signals();
    dcp_error err;
    if (dcp_synth_checkpoint(argv[optind], &o, &err) < 0) {
        if (err.code == ECANCELED && cli_stop_signal) {
            cli_error("synth: %s: interrupted (%s): what it wrote is removed", argv[optind],
                      strsignal(cli_stop_signal));
            cli_end_by_signal();
        } else {
            cli_error("%s", err.msg);
        }
        return 1;
    }
    return 0;
bad:
    cli_error("synth: bad value '%s' for --%s", optarg, opts[li].name);
    usage(stderr);
    return 2;
}
