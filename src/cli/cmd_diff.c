/* dcp diff: what changed between two checkpoints — keys only in one, dtype
 * or shape changes and, with --content, which values differ: by their value
 * digests, so A and B may be of any formats (DCP in any sharding, torch.save,
 * safetensors, Hugging Face and Megatron folders), and with --dtype after a
 * cast (a bfloat16 export against its float32 source). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "dcp_integrity.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: dcp diff [--content [--dtype bfloat16|float16|float32|float64]] [--catalog PATH | --no-catalog] A B\n");
}

static void shape(const dcp_entry *e, char *buf, size_t n)
{
    size_t used = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < e->ndim && used < n; d++)
        used += (size_t)snprintf(buf + used, n - used, "%s%lld", d ? "," : "", (long long)e->shape[d]);
    if (used < n)
        snprintf(buf + used, n - used, "]");
}

/* Same chunk boxes and equal recorded digests for every blob on both sides:
 * the stored bytes are identical, so the values are. */
static int same_by_digest(dcp_catalog *cat, dcp_checkpoint *a, const dcp_entry *ea, dcp_checkpoint *b,
                          const dcp_entry *eb)
{
    const dcp_chunk *xa, *xb;
    dcp_error err;
    if (!cat || ea->kind != DCP_KIND_TENSOR || ea->nchunks != eb->nchunks)
        return 0;
    if (dcp_entry_chunks(a, ea, &xa, &err) < 0)
        return 0;
    if (dcp_entry_chunks(b, eb, &xb, &err) < 0) {
        dcp_release_chunks(a, ea);
        return 0;
    }
    int same = 1;
    for (size_t i = 0; i < ea->nchunks && same; i++) {
        const dcp_chunk *ca = &xa[i], *cb = &xb[i];
        uint64_t ha, hb;
        int fa, fb;
        same = !memcmp(ca->offsets, cb->offsets, (size_t)ea->ndim * sizeof(int64_t)) &&
               !memcmp(ca->sizes, cb->sizes, (size_t)ea->ndim * sizeof(int64_t)) &&
               dcp_catalog_digest(cat, a, &ca->blob, &ha, &fa, &err) == 0 && fa &&
               dcp_catalog_digest(cat, b, &cb->blob, &hb, &fb, &err) == 0 && fb && ha == hb;
    }
    dcp_release_chunks(a, ea);
    dcp_release_chunks(b, eb);
    return same;
}

/* The entry of ck with key, NULL when there is none; -1 when the catalog
 * serving ck cannot be read (absent and unreadable are not the same). */
static int lookup(dcp_checkpoint *ck, const char *key, const dcp_entry **out, dcp_error *err)
{
    if (dcp_seek(ck, key, out, err) < 0)
        return -1;
    if (*out && strcmp((*out)->key, key))
        *out = NULL;
    return 0;
}

/* 1 if the values differ, 0 if equal, -1 on error: their XXH3-128 value
 * digests (dcp_value_digest_as: the global C-order bytes, after the cast to
 * `as` unless that is DCP_DTYPE_INVALID), which do not depend on format or
 * sharding; each side is read once, in 16 MiB pieces. */
static int values_differ(dcp_checkpoint *a, const dcp_entry *ea, dcp_checkpoint *b, const dcp_entry *eb,
                         dcp_dtype as, dcp_error *err)
{
    unsigned char da[16], db[16];
    if (dcp_value_digest_as(a, ea, as, da, NULL, err) < 0 || dcp_value_digest_as(b, eb, as, db, NULL, err) < 0)
        return -1;
    return memcmp(da, db, 16) != 0;
}

/* The dtypes --dtype casts (dcp_value_digest_as): two of them compare by value after the cast. */
static int castable(dcp_dtype dt)
{
    return dt == DCP_FLOAT64 || dt == DCP_FLOAT32 || dt == DCP_FLOAT16 || dt == DCP_BFLOAT16 ||
           dt == DCP_FLOAT8_E4M3FN || dt == DCP_FLOAT8_E5M2;
}

int cmd_diff(int argc, char **argv)
{
    static const struct option opts[] = {
        {"content", no_argument, 0, 'c'}, {"catalog", required_argument, 0, 'C'}, {"no-catalog", no_argument, 0, 'n'},
        {"dtype", required_argument, 0, 'd'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int content = 0, c;
    const char *catalog = cli_catalog_enabled ? cli_catalog_path : ":memory:";
    dcp_dtype as = DCP_DTYPE_INVALID;
    while ((c = getopt_long(argc, argv, "cC:nd:h", opts, NULL)) != -1) {
        switch (c) {
        case 'c': content = 1; break;
        case 'd':
            if (cli_float_dtype(optarg, &as) < 0)
                return 2;
            break;
        case 'C': catalog = cli_catalog_path = optarg; break;
        case 'n': catalog = ":memory:"; cli_catalog_enabled = 0; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind != argc - 2 || (as != DCP_DTYPE_INVALID && !content)) {
        usage(stderr);
        return 2;
    }
    /* One catalog serves both opens: inside A, opening B would create it
     * there (each open checks only its own folder). Then neither uses it. */
    dcp_error cerr;
    if (cli_catalog_enabled && (dcp_catalog_check_folder(cli_catalog_path, argv[optind], &cerr) < 0 ||
                                dcp_catalog_check_folder(cli_catalog_path, argv[optind + 1], &cerr) < 0)) {
        cli_catalog_enabled = 0;
        catalog = ":memory:";
    }
    dcp_checkpoint *a = cli_open(argv[optind]), *b = a ? cli_open(argv[optind + 1]) : NULL;
    if (!a || !b) {
        dcp_close(a);
        return 2;
    }
    dcp_catalog *cat = NULL;
    dcp_error err;
    /* Digests are a shortcut only: without a usable catalog, compare bytes. */
    if (content && (dcp_catalog_check_location(catalog, a, &err) < 0 || dcp_catalog_check_location(catalog, b, &err) < 0 ||
                    dcp_catalog_open(catalog, &cat, &err) < 0))
        cat = NULL;
    /* ... and only while both checkpoints' files are as they were when their
     * digests were recorded: a shard rewritten in place since (same size, so
     * the same identity) must be compared by its bytes. */
    int ua = 0, ub = 0;
    if (cat && (dcp_catalog_unchanged(cat, a, &ua, &err) < 0 || dcp_catalog_unchanged(cat, b, &ub, &err) < 0 || !ua ||
                !ub)) {
        dcp_catalog_close(cat);
        cat = NULL;
    }
    int differences = 0, trouble = 0;
    for (size_t i = 0; i < dcp_num_entries(a) && !trouble; i++) {
        const dcp_entry *ea, *eb = NULL;
        char sa[256], sb[256];
        if (dcp_get_entry(a, i, &ea, &err) < 0 || lookup(b, ea->key, &eb, &err) < 0) {
            cli_error("%s", err.msg);
            trouble = 1;
        } else if (!eb) {
            printf("only in A: %s\n", cli_text(ea->key));
            differences++;
        } else if (ea->kind != eb->kind) {
            printf("kind: %s: %s -> %s\n", cli_text(ea->key), ea->kind == DCP_KIND_TENSOR ? "tensor" : "bytes",
                   eb->kind == DCP_KIND_TENSOR ? "tensor" : "bytes");
            differences++;
        } else if (ea->kind == DCP_KIND_TENSOR && ea->dtype != eb->dtype &&
                   !(as != DCP_DTYPE_INVALID && castable(ea->dtype) && castable(eb->dtype))) {
            printf("dtype: %s: %s -> %s\n", cli_text(ea->key), dcp_dtype_name(ea->dtype), dcp_dtype_name(eb->dtype));
            differences++;
        } else if (ea->kind == DCP_KIND_TENSOR &&
                   (ea->ndim != eb->ndim || memcmp(ea->shape, eb->shape, (size_t)ea->ndim * sizeof(int64_t)))) {
            shape(ea, sa, sizeof sa);
            shape(eb, sb, sizeof sb);
            printf("shape: %s: %s -> %s\n", cli_text(ea->key), sa, sb);
            differences++;
        } else if (content && !(as == DCP_DTYPE_INVALID && same_by_digest(cat, a, ea, b, eb))) {
            int d = values_differ(a, ea, b, eb, as, &err);
            if (d < 0) {
                cli_error("%s", err.msg);
                trouble = 1;
            } else if (d) {
                printf("values: %s differ\n", cli_text(ea->key));
                differences++;
            }
        }
    }
    for (size_t i = 0; i < dcp_num_entries(b) && !trouble; i++) {
        const dcp_entry *eb, *ea = NULL;
        if (dcp_get_entry(b, i, &eb, &err) < 0 || lookup(a, eb->key, &ea, &err) < 0) {
            cli_error("%s", err.msg);
            trouble = 1;
        } else if (!ea) {
            printf("only in B: %s\n", cli_text(eb->key));
            differences++;
        }
    }
    dcp_catalog_close(cat);
    dcp_close(a);
    dcp_close(b);
    if (trouble)
        return 2;
    if (!differences)
        printf("no differences%s\n", content ? "" : " in keys, dtypes and shapes (use --content to compare values)");
    return differences ? 1 : 0;
}
