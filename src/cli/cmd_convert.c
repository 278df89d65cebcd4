/* dcp convert: DCP <-> torch.save <-> safetensors, streaming (src/write/convert.c). */
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "dcp_export.h"
#include "dcp_write.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: dcp convert [--from FMT] [--to FMT] [--keys PATTERN] [--max-shard-size SIZE]\n"
               "                   [--nested] [--no-crc] [--no-sync] [--quiet] SRC DST\n"
               "       dcp convert --to hf --recipe NAME [--dtype float32|float16|bfloat16|float64] [--config FILE]\n"
               "                   [--max-shard-size SIZE] [--keys PATTERN] [--allow-unmapped] [--no-sync] [--quiet] SRC DST\n"
               "FMT: dcp, torch (.pt/.pth), safetensors, hf (a Hugging Face model folder, by a recipe). Taken from the paths when not given: a folder\n"
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
        fprintf(stderr, "dcp: convert: skipped %s: %s\n", cli_text(key), why);
}

/* A source folder holding a save that did not finish: said, and 1 (its exit
 * status is 3, as every command gives for one). */
static int partial_source(const char *src)
{
    struct stat st;
    dcp_folder_probe probe;
    dcp_error err;
    if (stat(src, &st) < 0 || !S_ISDIR(st.st_mode) || dcp_probe_folder(src, &probe, &err) < 0 ||
        probe.kind != DCP_FOLDER_PARTIAL)
        return 0;
    cli_error("%s: a partial checkpoint: %s", src, probe.reason);
    return 1;
}

/* After a failed call: 1, or (interrupted) the signal's own end; the
 * message names DST, not the temporary that is gone. */
static int failed(const dcp_error *err, const char *dst)
{
    if (err->code == ECANCELED && cli_stop_signal) {
        cli_error("convert: %s: interrupted (%s): nothing was written", dst, strsignal(cli_stop_signal));
        cli_end_by_signal();
    } else {
        cli_error("%s", err->msg);
    }
    return 1;
}

/* --to hf: an export by a recipe (dcp_export.h). Recipes are looked up in
 * $DCP_RECIPE_PATH, then where they are installed. */
static int export_hf(char **argv, int hf, dcp_export_options *x, const dcp_convert_options *o, int quiet)
{
    if (!hf) {
        cli_error("convert: --recipe, --dtype, --config and --allow-unmapped go with --to hf");
        return 2;
    }
    if (!x->recipe) {
        cli_error("convert: --to hf needs --recipe NAME (llama-torchtitan, qwen3-torchtitan, llama-megatron, "
                  "qwen2-megatron, gpt-neox-megatron, gpt2-megatron, mixtral-megatron, or a recipe file)");
        return 2;
    }
    if (o->from || (o->flags & (DCP_WRITE_NESTED | DCP_WRITE_NO_CRC))) {
        cli_error("convert: --from, --nested and --no-crc do not apply to --to hf");
        return 2;
    }
    x->recipe_dirs = getenv("DCP_RECIPE_PATH");
    x->max_shard_size = o->max_shard_size;
    x->keys = o->keys;
    if (o->flags & DCP_WRITE_NO_SYNC)
        x->flags |= DCP_EXPORT_NO_SYNC;
    if (o->flags & DCP_WRITE_RANK) {
        x->flags |= DCP_EXPORT_RANK;
        x->rank = o->rank;
    }
    x->progress = cli_progress;
    x->progress_ctx = "convert";
    x->skipped = report_skip;
    x->skipped_ctx = &quiet;
    x->cancel = &cli_stop_signal;
    cli_catch_signals();
    if (partial_source(argv[optind]))
        return 3;
    dcp_error err;
    if (dcp_export_hf(argv[optind], argv[optind + 1], x, &err) < 0)
        return failed(&err, argv[optind + 1]);
    return 0;
}

int cmd_convert(int argc, char **argv)
{
    static const struct option opts[] = {
        {"from", required_argument, 0, 'f'}, {"to", required_argument, 0, 't'},
        {"keys", required_argument, 0, 'k'}, {"max-shard-size", required_argument, 0, 'm'},
        {"nested", no_argument, 0, 'n'},     {"quiet", no_argument, 0, 'q'},
        {"no-crc", no_argument, 0, 'C'},     {"no-sync", no_argument, 0, 'S'},
        {"recipe", required_argument, 0, 'r'}, {"dtype", required_argument, 0, 'd'},
        {"config", required_argument, 0, 'c'}, {"allow-unmapped", no_argument, 0, 'u'},
        {"help", no_argument, 0, 'h'},       {0, 0, 0, 0}};
    dcp_convert_options o = DCP_CONVERT_OPTIONS_INIT;
    dcp_export_options x = DCP_EXPORT_OPTIONS_INIT;
    int quiet = 0, c, hf = 0;
    while ((c = getopt_long(argc, argv, "hq", opts, NULL)) != -1) {
        switch (c) {
        case 'f':
        case 't':
            if (c == 't' && !strcmp(optarg, "hf")) {
                hf = 1;
                break;
            }
            if (parse_format(optarg, c == 'f' ? &o.from : &o.to) < 0) {
                cli_error("convert: unknown format '%s' (dcp, torch, safetensors, hf)", optarg);
                return 2;
            }
            break;
        case 'k': o.keys = optarg; break;
        case 'm': {
            dcp_error perr;
            if (dcp_parse_size_ex(optarg, "convert: --max-shard-size", &o.max_shard_size, &perr) < 0) {
                cli_error("%s", perr.msg);
                return 2;
            }
            if (!o.max_shard_size) {
                cli_error("convert: --max-shard-size: '%s' is 0 (e.g. 5GB, 512MiB)", optarg);
                return 2;
            }
            break;
        }
        case 'n': o.flags |= DCP_WRITE_NESTED; break;
        case 'q': quiet = 1; break;
        case 'C': o.flags |= DCP_WRITE_NO_CRC; break;
        case 'S': o.flags |= DCP_WRITE_NO_SYNC; break;
        case 'r': x.recipe = optarg; break;
        case 'c': x.config = optarg; break;
        case 'u': x.flags |= DCP_EXPORT_ALLOW_UNMAPPED; break;
        case 'd':
            x.dtype = dcp_dtype_from_name(optarg);
            if (x.dtype != DCP_FLOAT32 && x.dtype != DCP_FLOAT16 && x.dtype != DCP_BFLOAT16 && x.dtype != DCP_FLOAT64) {
                cli_error("convert: --dtype %s: float32, float16, bfloat16 or float64", optarg);
                return 2;
            }
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind != argc - 2) {
        usage(stderr);
        return 2;
    }
    if (!*argv[optind] || !*argv[optind + 1]) {   /* "" would be found out only at the final rename */
        cli_error("convert: an empty %s path", *argv[optind] ? "DST" : "SRC");
        return 2;
    }
    if (cli_rank >= 0) {   /* dcp --rank R convert: rank R's view of a rank-local folder, as every command */
        o.flags |= DCP_WRITE_RANK;
        o.rank = (unsigned)cli_rank;
    }
    if (hf || x.recipe || x.config || x.dtype || x.flags)
        return export_hf(argv, hf, &x, &o, quiet);
    if (cli_megatron_fold)   /* dcp --megatron-fold convert: the original shapes written */
        o.flags |= DCP_WRITE_MEGATRON_FOLD;
    /* A shard size only means something for safetensors: never silently
     * ignored, nor a folder of safetensors shards named like a .pt file. */
    dcp_format to = o.to != DCP_FORMAT_AUTO ? o.to : dcp_format_guess(argv[optind + 1]);
    if (o.max_shard_size && to != DCP_FORMAT_SAFETENSORS && (o.to != DCP_FORMAT_AUTO || to != DCP_FORMAT_DCP)) {
        cli_error("convert: --max-shard-size: %s is written as %s, which has no shards (safetensors output: "
                  "--to safetensors, or DST a folder)", argv[optind + 1], dcp_format_name(to));
        return 2;
    }
    if (o.max_shard_size && o.to == DCP_FORMAT_AUTO)
        o.to = DCP_FORMAT_SAFETENSORS;
    o.progress = cli_progress;
    o.progress_ctx = "convert";
    o.skipped = report_skip;
    o.skipped_ctx = &quiet;
    o.cancel = &cli_stop_signal;
    cli_catch_signals();
    if (partial_source(argv[optind]))
        return 3;
    dcp_error err;
    if (dcp_convert_files(argv[optind], argv[optind + 1], &o, &err) < 0)
        return failed(&err, argv[optind + 1]);
    return 0;
}
