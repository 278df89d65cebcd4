/* dcp digest: a digest of each key's value that does not depend on how it
 * is stored (DCP of any sharding, rank-local, Megatron, torch.save,
 * safetensors, Hugging Face folders): XXH3-128 of a tensor's global bytes
 * in C order, of a bytes item's bytes. JSON lines with --json, a format
 * anyone can produce from Python (README, man dcp). --dtype hashes each
 * floating tensor cast to that dtype first (dcp_value_digest_as), so a
 * bfloat16 export and a float32 training checkpoint can be compared. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "dcp_integrity.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: dcp digest [--json] [--keys PATTERN] [--dtype bfloat16|float16|float32|float64] SOURCE\n");
}

int cmd_digest(int argc, char **argv)
{
    static const struct option opts[] = {
        {"json", no_argument, 0, 'j'}, {"keys", required_argument, 0, 'k'}, {"dtype", required_argument, 0, 'd'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int json = 0, c;
    const char *pattern = NULL;
    dcp_dtype as = DCP_DTYPE_INVALID;
    while ((c = getopt_long(argc, argv, "jk:d:h", opts, NULL)) != -1) {
        switch (c) {
        case 'j': json = 1; break;
        case 'd':
            if (cli_float_dtype(optarg, &as) < 0)
                return 2;
            break;
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
        unsigned char d[16];
        int cast = 0;
        if (dcp_value_digest_as(ck, e, as, d, &cast, &err) < 0) {
            cli_error("%s", err.msg);
            status = 1;
            continue;
        }
        char hex[33];
        for (int k = 0; k < 16; k++)
            snprintf(hex + 2 * k, 3, "%02x", d[k]);
        if (json) {
            fputs("{\"key\":", stdout);
            cli_json_string(stdout, e->key);
            if (e->kind == DCP_KIND_TENSOR) {
                /* "dtype" is the dtype of the bytes hashed: after a cast, the cast's */
                printf(",\"dtype\":\"%s\",\"shape\":", dcp_dtype_name(cast ? as : e->dtype));
                cli_json_shape(stdout, e->shape, e->ndim);
            } else {
                fputs(",\"dtype\":\"bytes\",\"shape\":null", stdout);
            }
            if (cast)
                printf(",\"cast_from\":\"%s\"", dcp_dtype_name(e->dtype));
            printf(",\"xxh3_128\":\"%s\"}\n", hex);
        } else {
            printf("%s  %s\n", hex, cli_text(e->key));
        }
    }
    if (pattern && !matched && status == 0) {   /* a typo must not read as "nothing there" */
        cli_error("%s: no key matches '%s'", argv[optind], pattern);
        status = 1;
    }
    if (fflush(stdout) != 0) {
        cli_error("stdout: write failed");
        status = 1;
    }
    dcp_close(ck);
    return status;
}
