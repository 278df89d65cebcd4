/* dcp convert: DCP <-> torch.save <-> safetensors, streaming (src/write/convert.c). */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "dcp_write.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: dcp convert [--from FMT] [--to FMT] [--keys PATTERN] [--max-shard-size SIZE]\n"
               "                   [--nested] [--no-crc] [--no-sync] [--quiet] SRC DST\n"
               "FMT: dcp, torch (.pt/.pth), safetensors. Taken from the paths when not given: a folder\n"
               "or a path with neither suffix is a DCP checkpoint. DST must not exist.\n");
}

static int parse_format(const char *s, dcp_format *f)
{
    if (!strcmp(s, "dcp"))
        *f = DCP_FORMAT_DCP;
    else if (!strcmp(s, "torch") || !strcmp(s, "torch.save") || !strcmp(s, "pt") || !strcmp(s, "pth"))
        *f = DCP_FORMAT_TORCH_SAVE;
    else if (!strcmp(s, "safetensors") || !strcmp(s, "st"))
        *f = DCP_FORMAT_SAFETENSORS;
    else
        return -1;
    return 0;
}

static void report_skip(void *ctx, const char *key, const char *why)
{
    int *quiet = ctx;
    if (!*quiet)
        fprintf(stderr, "dcp: convert: skipped %s: %s\n", key, why);
}

int cmd_convert(int argc, char **argv)
{
    static const struct option opts[] = {
        {"from", required_argument, 0, 'f'}, {"to", required_argument, 0, 't'},
        {"keys", required_argument, 0, 'k'}, {"max-shard-size", required_argument, 0, 'm'},
        {"nested", no_argument, 0, 'n'},     {"quiet", no_argument, 0, 'q'},
        {"no-crc", no_argument, 0, 'C'},     {"no-sync", no_argument, 0, 'S'},
        {"help", no_argument, 0, 'h'},       {0, 0, 0, 0}};
    dcp_convert_options o = {0};
    int quiet = 0, c;
    while ((c = getopt_long(argc, argv, "hq", opts, NULL)) != -1) {
        switch (c) {
        case 'f':
        case 't':
            if (parse_format(optarg, c == 'f' ? &o.from : &o.to) < 0) {
                cli_error("convert: unknown format '%s' (dcp, torch, safetensors)", optarg);
                return 2;
            }
            break;
        case 'k': o.keys = optarg; break;
        case 'm':
            if (dcp_parse_size(optarg, &o.max_shard_size) < 0 || !o.max_shard_size) {
                cli_error("convert: bad size '%s' for --max-shard-size (e.g. 5GB, 512MiB)", optarg);
                return 2;
            }
            break;
        case 'n': o.flags |= DCP_WRITE_NESTED; break;
        case 'q': quiet = 1; break;
        case 'C': o.flags |= DCP_WRITE_NO_CRC; break;
        case 'S': o.flags |= DCP_WRITE_NO_SYNC; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind != argc - 2) {
        usage(stderr);
        return 2;
    }
    if (o.max_shard_size && o.to == DCP_FORMAT_AUTO)
        o.to = DCP_FORMAT_SAFETENSORS;   /* a shard size only means something for safetensors */
    o.progress = cli_progress;
    o.progress_ctx = "convert";
    o.skipped = report_skip;
    o.skipped_ctx = &quiet;
    dcp_error err;
    if (dcp_convert_files(argv[optind], argv[optind + 1], &o, &err) < 0) {
        cli_error("%s", err.msg);
        return 1;
    }
    return 0;
}
