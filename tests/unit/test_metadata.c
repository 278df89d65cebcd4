/* The .metadata interpreter: every bundled fixture against its manifest,
 * real PyTorch 2.x saves (plain, zstd transforms, rank-local __R.metadata,
 * a Megatron-style subclass) against expected.json written by
 * tests/data/gen_metadata.py, synthetic variants of the schema, and the
 * errors the CLI reports (each naming the file). */
#include "check_quiet.h"
#include <errno.h>
#include <dirent.h>
#include <jansson.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

/* The chunks of an entry of a parsed model (they stay until dcp_close). */
static const dcp_chunk *chunks_of(dcp_checkpoint *ck, const dcp_entry *e)
{
    const dcp_chunk *c;
    dcp_error err;
    ck_assert_msg(dcp_entry_chunks(ck, e, &c, &err) == 0, "%s", err.msg);
    return c;
}

static char srcdir[4096];   /* top_srcdir */

static void path_of(char *out, size_t sz, const char *rel)
{
    snprintf(out, sz, "%s/%s", srcdir, rel);
}

static void *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *b = malloc(n > 0 ? (size_t)n : 1);
    ck_assert(fread(b, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

static void spit(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    ck_assert_msg(f != NULL, "cannot write %s", path);
    ck_assert(fwrite(b, 1, n, f) == n);
    fclose(f);
}

static char *scratch_dir(void)
{
    static char tmpl[64];
    strcpy(tmpl, "/tmp/dcp-meta.XXXXXX");
    ck_assert(mkdtemp(tmpl) != NULL);
    return tmpl;
}

static void remove_tree(const char *dir)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert(system(cmd) == 0);
}

static dcp_checkpoint *open_ok(const char *dir)
{
    dcp_checkpoint *ck;
    dcp_error err;
    ck_assert_msg(dcp_open(dir, 0, &ck, &err) == 0, "%s: %s", dir, err.msg);
    return ck;
}

/* Opening fails, and the message contains each of the NULL-terminated wants. */
static void open_fails(const char *dir, ...)
{
    dcp_checkpoint *ck;
    dcp_error err;
    ck_assert_msg(dcp_open(dir, 0, &ck, &err) == -1, "%s opened", dir);
    va_list ap;
    va_start(ap, dir);
    for (const char *w; (w = va_arg(ap, const char *));)
        ck_assert_msg(strstr(err.msg, w) != NULL, "error '%s' lacks '%s'", err.msg, w);
    va_end(ap);
}

/* A folder holding only the synthetic tests/data/metadata/synthetic/NAME.metadata as .metadata. */
static char *synthetic(const char *name)
{
    char src[4200], dst[4200];
    snprintf(src, sizeof src, "%s/tests/data/metadata/synthetic/%s.metadata", srcdir, name);
    size_t n;
    void *b = slurp(src, &n);
    char *dir = scratch_dir();
    snprintf(dst, sizeof dst, "%s/.metadata", dir);
    spit(dst, b, n);
    free(b);
    return dir;
}

static const dcp_chunk *chunk_at(dcp_checkpoint *ck, const dcp_entry *e, json_t *offsets)
{
    const dcp_chunk *chunks = chunks_of(ck, e);
    for (size_t c = 0; c < e->nchunks; c++) {
        int same = 1;
        for (int d = 0; d < e->ndim; d++)
            same &= chunks[c].offsets[d] == json_integer_value(json_array_get(offsets, (size_t)d));
        if (same)
            return &chunks[c];
    }
    return NULL;
}

/* The entries of ck equal `entries` (manifest.json or expected.json form). */
static void check_entries(dcp_checkpoint *ck, json_t *entries, const char *name)
{
    ck_assert_msg(dcp_num_entries(ck) == json_array_size(entries), "%s: %zu entries, expected %zu", name,
                  dcp_num_entries(ck), json_array_size(entries));
    size_t i;
    json_t *e;
    json_array_foreach(entries, i, e) {
        const char *key = json_string_value(json_object_get(e, "key"));
        const dcp_entry *de = dcp_find(ck, key);
        ck_assert_msg(de != NULL, "%s: key %s missing", name, key);
        if (!strcmp(json_string_value(json_object_get(e, "kind")), "bytes")) {
            ck_assert_msg(de->kind == DCP_KIND_BYTES, "%s: %s is not bytes", name, key);
            json_t *loc = json_object_get(e, "location");
            if (!loc)
                loc = e;
            ck_assert(de->has_blob);
            ck_assert_str_eq(dcp_file_name(ck, de->blob.file), json_string_value(json_object_get(loc, "file")));
            ck_assert_uint_eq(de->blob.offset, json_integer_value(json_object_get(loc, "offset")));
            ck_assert_uint_eq(de->blob.length, json_integer_value(json_object_get(loc, "length")));
            continue;
        }
        ck_assert_msg(de->kind == DCP_KIND_TENSOR, "%s: %s is not a tensor", name, key);
        ck_assert_str_eq(dcp_dtype_name(de->dtype), json_string_value(json_object_get(e, "dtype")));
        json_t *shape = json_object_get(e, "shape");
        ck_assert_int_eq(de->ndim, (int)json_array_size(shape));
        for (int d = 0; d < de->ndim; d++)
            ck_assert_int_eq(de->shape[d], json_integer_value(json_array_get(shape, (size_t)d)));
        json_t *chunks = json_object_get(e, "chunks"), *c;
        size_t j;
        ck_assert_msg(de->nchunks == json_array_size(chunks), "%s: %s has %zu chunks, expected %zu", name, key,
                      de->nchunks, json_array_size(chunks));
        json_array_foreach(chunks, j, c) {
            const dcp_chunk *dc = chunk_at(ck, de, json_object_get(c, "offsets"));
            ck_assert_msg(dc != NULL, "%s: %s: chunk %zu missing", name, key, j);
            json_t *sizes = json_object_get(c, "sizes");
            for (int d = 0; sizes && d < de->ndim; d++)
                ck_assert_int_eq(dc->sizes[d], json_integer_value(json_array_get(sizes, (size_t)d)));
            ck_assert_msg(dc->has_blob, "%s: %s: chunk %zu has no storage", name, key, j);
            ck_assert_str_eq(dcp_file_name(ck, dc->blob.file), json_string_value(json_object_get(c, "file")));
            ck_assert_uint_eq(dc->blob.offset, json_integer_value(json_object_get(c, "offset")));
            ck_assert_uint_eq(dc->blob.length, json_integer_value(json_object_get(c, "length")));
            json_t *tr = json_object_get(c, "transforms");
            ck_assert_uint_eq(dc->blob.transforms, json_array_size(tr) ? DCP_TRANSFORM_ZSTD : 0);
        }
    }
}

/* ------------------------------------------------------------ fixtures */

START_TEST(every_fixture_matches_its_manifest)
{
    char dir[4200];
    path_of(dir, sizeof dir, "tests/fixtures");
    DIR *d = opendir(dir);
    ck_assert_msg(d != NULL, "no %s", dir);
    struct dirent *de;
    int n = 0;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        char man[8400], ckpt[8400];
        snprintf(man, sizeof man, "%s/%s/expected/manifest.json", dir, de->d_name);
        snprintf(ckpt, sizeof ckpt, "%s/%s/ckpt", dir, de->d_name);
        json_error_t je;
        json_t *m = json_load_file(man, 0, &je);
        ck_assert_msg(m != NULL, "%s: %s", man, je.text);
        dcp_checkpoint *ck = open_ok(ckpt);
        check_entries(ck, json_object_get(m, "entries"), de->d_name);
        const dcp_info *info = dcp_get_info(ck);
        ck_assert_str_eq(info->serialization, "torch_save");
        ck_assert_str_eq(info->layout, "global .metadata");
        ck_assert_uint_gt(info->metadata_bytes, 0);
        if (!strncmp(de->d_name, "09_", 3)) {
            ck_assert(info->megatron);
        } else {
            ck_assert_str_eq(info->generation, "torch 1.13 (torch.distributed._shard.checkpoint)");
            ck_assert(!info->has_planner_data);
            ck_assert_ptr_null(info->version);
        }
        dcp_close(ck);
        json_decref(m);
        n++;
    }
    closedir(d);
    ck_assert_int_ge(n, 6);
}
END_TEST

/* ------------------------------------------------------------ real 2.x saves */

static void check_saved(const char *name, const char *generation_prefix)
{
    char dir[4200], exp[4300];
    snprintf(dir, sizeof dir, "%s/tests/data/metadata/%s", srcdir, name);
    snprintf(exp, sizeof exp, "%s/expected.json", dir);
    json_error_t je;
    json_t *m = json_load_file(exp, 0, &je);
    ck_assert_msg(m != NULL, "%s: %s", exp, je.text);
    dcp_checkpoint *ck = open_ok(dir);
    json_t *entries = json_object_get(m, "entries");
    check_entries(ck, entries, name);
    const dcp_info *info = dcp_get_info(ck);
    ck_assert_msg(!strncmp(info->generation, generation_prefix, strlen(generation_prefix)),
                  "%s: generation '%s'", name, info->generation);
    ck_assert_str_eq(info->layout, json_string_value(json_object_get(m, "layout")));
    ck_assert_str_eq(info->serialization, "torch_save");
    ck_assert_str_eq(info->version, json_string_value(json_object_get(m, "version")));
    ck_assert_int_eq(info->has_planner_data, json_is_true(json_object_get(m, "has_planner_data")));
    if (json_is_string(json_object_get(m, "checkpoint_id"))) {
        ck_assert_str_eq(info->checkpoint_id, json_string_value(json_object_get(m, "checkpoint_id")));
        ck_assert_str_eq(info->save_id, json_string_value(json_object_get(m, "save_id")));
    }
    ck_assert_int_eq(info->megatron, json_is_true(json_object_get(m, "megatron")));
    if (!json_is_false(json_object_get(m, "data"))) {
        /* End to end: the located blobs decode to the saved values. */
        size_t i;
        json_t *e;
        json_array_foreach(entries, i, e) {
            const char *hex = json_string_value(json_object_get(e, "hex"));
            if (!hex)
                continue;
            const dcp_entry *de = dcp_find(ck, json_string_value(json_object_get(e, "key")));
            void *buf;
            uint64_t len;
            dcp_error err;
            ck_assert_msg(dcp_read_entry(ck, de, &buf, &len, &err) == 0, "%s: %s", name, err.msg);
            ck_assert_uint_eq(len * 2, strlen(hex));
            for (uint64_t k = 0; k < len; k++) {
                unsigned v;
                ck_assert(sscanf(hex + 2 * k, "%2x", &v) == 1);
                ck_assert_msg(((unsigned char *)buf)[k] == v, "%s: %s: byte %llu differs", name, de->key,
                              (unsigned long long)k);
            }
            free(buf);
        }
    }
    dcp_close(ck);
    json_decref(m);
}

START_TEST(pytorch_2x_plain)
{
    check_saved("pt_plain", "torch 2.9+ (version 1.0.0)");
}
END_TEST

START_TEST(pytorch_2x_zstd_transforms)
{
    check_saved("pt_zstd", "torch 2.9+ (version 1.0.0)");
}
END_TEST

START_TEST(pytorch_2x_rank_local_merge)
{
    check_saved("pt_ranklocal", "torch 2.9+ (version 1.0.0)");
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/tests/data/metadata/pt_ranklocal", srcdir);
    dcp_checkpoint *ck = open_ok(dir);
    ck_assert_uint_eq(dcp_find(ck, "shared")->nchunks, 1);     /* a replica on both ranks, kept once */
    ck_assert_uint_eq(dcp_find(ck, "sharded")->nchunks, 2);    /* one row block from each file */
    ck_assert_str_eq(dcp_file_name(ck, chunks_of(ck, dcp_find(ck, "shared"))[0].blob.file), "__0_0.distcp");
    ck_assert_uint_eq(dcp_get_info(ck)->metadata_bytes, 2 * 1287);
    dcp_close(ck);
}
END_TEST

START_TEST(megatron_subclass_is_opaque)
{
    check_saved("mcore", "Megatron-Core megatron.core.dist_checkpointing.strategies.torch.MCoreMetadata on torch 2.9+");
}
END_TEST

/* DCP_OPEN_RANK: rank R's __R.metadata alone, as torch's dcp.load reads it
 * on rank R; the merged default marks what several ranks saved. */
static dcp_checkpoint *open_rank(const char *dir, unsigned rank, size_t size, dcp_error *err)
{
    dcp_checkpoint *ck = NULL;
    dcp_open_options o = DCP_OPEN_OPTIONS_INIT;
    o.flags = DCP_OPEN_RANK | DCP_OPEN_CATALOG;   /* (the catalog is not used for a rank's view) */
    o.rank = rank;
    o.size = size;
    return dcp_open_ex(dir, &o, &ck, err) == 0 ? ck : NULL;
}

START_TEST(rank_local_one_rank_view)
{
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/tests/data/metadata/pt_ranklocal", srcdir);
    dcp_checkpoint *ck = open_ok(dir);   /* merged: "shared" is a box both ranks saved */
    ck_assert_int_eq(dcp_entry_replicated(ck, dcp_find(ck, "shared")), 1);
    ck_assert_int_eq(dcp_entry_replicated(ck, dcp_find(ck, "sharded")), 0);      /* one row block each */
    ck_assert_int_eq(dcp_entry_replicated(ck, dcp_find(ck, "rank1.only")), 0);
    ck_assert_int_eq(dcp_entry_replicated(ck, dcp_find(ck, "rank1.meta.rank")), 0);
    ck_assert_int_eq(dcp_entry_replicated(ck, NULL), 0);
    dcp_close(ck);
    dcp_error err;
    for (unsigned r = 0; r < 2; r++) {
        ck = open_rank(dir, r, sizeof(dcp_open_options), &err);
        ck_assert_msg(ck != NULL, "rank %u: %s", r, err.msg);
        char mine[32], other[32], file[32], layout[64];
        snprintf(mine, sizeof mine, "rank%u.only", r);
        snprintf(other, sizeof other, "rank%u.only", 1 - r);
        snprintf(file, sizeof file, "__%u_0.distcp", r);
        snprintf(layout, sizeof layout, "rank-local __R.metadata, rank %u's view", r);
        ck_assert_ptr_nonnull(dcp_find(ck, mine));
        ck_assert_ptr_null(dcp_find(ck, other));
        ck_assert_uint_eq(dcp_num_files(ck), 1);    /* only the shard its file names */
        ck_assert_str_eq(dcp_file_name(ck, 0), file);
        const dcp_entry *sh = dcp_find(ck, "shared");
        ck_assert_str_eq(dcp_file_name(ck, chunks_of(ck, sh)[0].blob.file), file);   /* its own copy */
        ck_assert_int_eq(dcp_entry_replicated(ck, sh), 0);
        const dcp_entry *sd = dcp_find(ck, "sharded");
        ck_assert_uint_eq(sd->nchunks, 1);
        ck_assert_int_eq(chunks_of(ck, sd)[0].offsets[0], 3 * (int64_t)r);
        ck_assert_str_eq(dcp_get_info(ck)->layout, layout);
        ck_assert_int_eq(dcp_from_catalog(ck), 0);
        int32_t v[3];
        void *buf = NULL;
        uint64_t len = 0;
        ck_assert_msg(dcp_read_entry(ck, sh, &buf, &len, &err) == 0, "%s", err.msg);
        ck_assert_uint_eq(len, sizeof v);
        memcpy(v, buf, sizeof v);
        free(buf);
        ck_assert(v[0] == 0 && v[1] == 1 && v[2] == 2);
        dcp_close(ck);
    }
    /* No such rank: ENOENT naming the file; a caller of the first sized layout (no rank field) gets rank 0. */
    ck_assert_ptr_null(open_rank(dir, 2, sizeof(dcp_open_options), &err));
    ck_assert_int_eq(err.code, ENOENT);
    ck_assert_msg(strstr(err.msg, "pt_ranklocal/__2.metadata: no such file") != NULL, "%s", err.msg);
    ck = open_rank(dir, 1, offsetof(dcp_open_options, rank), &err);
    ck_assert_msg(ck != NULL, "%s", err.msg);
    ck_assert_ptr_nonnull(dcp_find(ck, "rank0.only"));
    dcp_close(ck);
    ck_assert_ptr_null(open_rank(dir, 1000000000u, sizeof(dcp_open_options), &err));
    ck_assert_int_eq(err.code, EINVAL);
    /* A folder with a global .metadata: the rank's file is read all the same (as torch does when asked). */
    char *tmp = scratch_dir(), cmd[22000];
    snprintf(cmd, sizeof cmd, "cp '%s'/__1.metadata '%s'/__1_0.distcp '%s'/ && cp '%s'/__0.metadata '%s'/.metadata",
             dir, dir, tmp, dir, tmp);
    ck_assert(system(cmd) == 0);
    ck = open_rank(tmp, 1, sizeof(dcp_open_options), &err);
    ck_assert_msg(ck != NULL, "%s", err.msg);
    ck_assert_ptr_nonnull(dcp_find(ck, "rank1.only"));
    ck_assert_ptr_null(dcp_find(ck, "rank0.only"));
    dcp_close(ck);
    remove_tree(tmp);
}
END_TEST

/* Rank-local edge cases on a scratch copy: one bad file names itself;
 * differing shapes between files are an error; a lone file works. */
START_TEST(rank_local_errors)
{
    char src[4200], cmd[9000];
    snprintf(src, sizeof src, "%s/tests/data/metadata/pt_ranklocal", srcdir);
    char *dir = scratch_dir();
    snprintf(cmd, sizeof cmd, "cp '%s'/__0.metadata '%s'/__1.metadata '%s'/ && chmod u+w '%s'/*", src, src, dir, dir);
    ck_assert(system(cmd) == 0);
    char p1[4200];
    snprintf(p1, sizeof p1, "%s/__1.metadata", dir);
    size_t n;
    unsigned char *b = slurp(p1, &n);
    spit(p1, b, n / 2);
    open_fails(dir, "__1.metadata", "truncated", NULL);
    /* Only __1.metadata's items remain when __0 is gone; no __R files: an error. */
    spit(p1, b, n);
    snprintf(cmd, sizeof cmd, "%s/__0.metadata", dir);
    unlink(cmd);
    dcp_checkpoint *ck = open_ok(dir);
    ck_assert_ptr_nonnull(dcp_find(ck, "rank1.only"));
    ck_assert_ptr_null(dcp_find(ck, "rank0.only"));
    ck_assert_uint_eq(dcp_find(ck, "sharded")->nchunks, 1);
    ck_assert_str_eq(dcp_get_info(ck)->layout, "rank-local __R.metadata");
    dcp_close(ck);
    free(b);
    remove_tree(dir);
}
END_TEST

/* ------------------------------------------------------------ synthetic */

START_TEST(python313_paths_and_big_offsets)
{
    char *dir = synthetic("py313_zstd");
    dcp_checkpoint *ck = open_ok(dir);
    const dcp_info *info = dcp_get_info(ck);
    ck_assert_str_eq(info->generation, "torch 2.9+ (version 1.0.0)");
    ck_assert_str_eq(info->checkpoint_id, "/tmp/ck313");
    ck_assert_str_eq(info->save_id, "uuid-313");
    ck_assert_str_eq(info->version, "1.0.0");
    ck_assert(info->has_planner_data);
    const dcp_entry *w = dcp_find(ck, "w");
    ck_assert_uint_eq(w->nchunks, 2);
    ck_assert_uint_eq(chunks_of(ck, w)[1].blob.offset, 5000000000ULL);
    ck_assert_uint_eq(chunks_of(ck, w)[1].blob.transforms, DCP_TRANSFORM_ZSTD);
    ck_assert_str_eq(dcp_file_name(ck, chunks_of(ck, w)[1].blob.file), "__1_0.distcp");
    const dcp_entry *step = dcp_find(ck, "step");
    ck_assert(step->kind == DCP_KIND_BYTES && step->has_blob && step->blob.offset == 100 && step->blob.length == 30);
    ck_assert_uint_eq(step->blob.transforms, 0);
    dcp_close(ck);
    remove_tree(dir);
}
END_TEST

START_TEST(dict_and_long_properties_float_version_slots)
{
    char *dir = synthetic("dictprops_floatversion");
    dcp_checkpoint *ck = open_ok(dir);
    const dcp_info *info = dcp_get_info(ck);
    ck_assert_str_eq(info->generation, "torch 2.9+ (version 1)");
    ck_assert_str_eq(info->version, "1");
    ck_assert_str_eq(info->checkpoint_id, "/tmp/ck312");   /* parts ('/', 'tmp', 'ck312') */
    const dcp_entry *a = dcp_find(ck, "a"), *b = dcp_find(ck, "b");
    ck_assert_int_eq(a->dtype, DCP_INT64);           /* dict state */
    ck_assert(chunks_of(ck, a)[0].has_blob);                      /* slots MetadataIndex (None, {...}) */
    ck_assert_int_eq(b->dtype, DCP_BFLOAT16);        /* 6-tuple state, getattr enum */
    ck_assert_str_eq(dcp_file_name(ck, chunks_of(ck, b)[0].blob.file), "sub/__0_1.distcp");
    dcp_close(ck);
    remove_tree(dir);
}
END_TEST

START_TEST(generations_from_fields)
{
    static const struct { const char *file, *generation, *checkpoint_id; } cases[] = {
        {"gen_2_0", "torch 2.0-2.2", NULL},
        {"gen_2_3", "torch 2.3+", NULL},
        {"gen_2_4_str_id", "torch 2.4+ (StorageMeta)", "s3://bucket/ck"},
        {"int_key_113", "torch 1.13 (torch.distributed._shard.checkpoint)", NULL},
        {"subclass", "my.pkg.MyMetadata (a Metadata subclass) on torch 2.3+", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *dir = synthetic(cases[i].file);
        dcp_checkpoint *ck = open_ok(dir);
        const dcp_info *info = dcp_get_info(ck);
        ck_assert_str_eq(info->generation, cases[i].generation);
        if (cases[i].checkpoint_id)
            ck_assert_str_eq(info->checkpoint_id, cases[i].checkpoint_id);
        else
            ck_assert_ptr_null(info->checkpoint_id);
        ck_assert_ptr_null(info->version);
        dcp_close(ck);
        remove_tree(dir);
    }
}
END_TEST

START_TEST(int_keys_in_decimal)
{
    char *dir = synthetic("int_key_113");
    dcp_checkpoint *ck = open_ok(dir);
    const dcp_entry *one = dcp_find(ck, "1");
    ck_assert_ptr_nonnull(one);
    ck_assert(one->kind == DCP_KIND_BYTES && one->has_blob && one->blob.length == 10);
    ck_assert(chunks_of(ck, dcp_find(ck, "t"))[0].has_blob);
    dcp_close(ck);
    remove_tree(dir);
}
END_TEST

START_TEST(schema_errors_name_file_key_reason)
{
    static const struct { const char *file, *w1, *w2; } cases[] = {
        {"bad_transform", "w: unsupported transform 'stream.lz4/1'", NULL},
        {"outside", "w: chunk 1 (offsets [2, 3], sizes [2, 2]) lies outside the tensor of shape [4, 4]", NULL},
        {"escape", "w: relative path '../outside.distcp' leaves the checkpoint folder", NULL},
        {"pre_113", "pre-1.13 checkpoint schema", NULL},
        {"not_dcp", "a pickle, but not DCP metadata", NULL},
        {"same_offsets_other_sizes", "w: two chunks at offsets [0] with different sizes", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *dir = synthetic(cases[i].file);
        char meta[4200];
        snprintf(meta, sizeof meta, "%s/.metadata", dir);
        open_fails(dir, meta, cases[i].w1, cases[i].w2, NULL);
        remove_tree(dir);
    }
}
END_TEST

START_TEST(file_errors)
{
    char *dir = scratch_dir(), meta[4200];
    snprintf(meta, sizeof meta, "%s/.metadata", dir);
    spit(meta, "", 0);
    open_fails(dir, meta, "empty", NULL);
    spit(meta, "this is not a pickle\n", 21);
    open_fails(dir, meta, "is not a pickle", NULL);
    char want[4300];
    snprintf(want, sizeof want, "%s: truncated pickle", meta);
    spit(meta, "\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00", 11);
    open_fails(dir, want, NULL);
    unlink(meta);
    mkdir(meta, 0700);   /* .metadata that is not a regular file: named as such, never read */
    open_fails(dir, "/.metadata: not a regular file (a folder)", NULL);
    rmdir(meta);
    remove_tree(dir);
}
END_TEST

/* Every prefix and many flips of a real 2.x .metadata through dcp_open: an
 * error naming the file or a usable model, never a crash. */
START_TEST(pytorch_2x_truncated_and_flipped)
{
    char src[4200];
    snprintf(src, sizeof src, "%s/tests/data/metadata/pt_zstd/.metadata", srcdir);
    size_t n;
    unsigned char *orig = slurp(src, &n);
    char *dir = scratch_dir(), meta[4200];
    snprintf(meta, sizeof meta, "%s/.metadata", dir);
    dcp_checkpoint *ck;
    dcp_error err;
    for (size_t cut = 0; cut < n; cut++) {
        spit(meta, orig, cut);
        ck_assert_int_eq(dcp_open(dir, 0, &ck, &err), -1);
        ck_assert_msg(strstr(err.msg, meta) != NULL, "cut %zu: error lacks the file: %s", cut, err.msg);
    }
    unsigned char *copy = malloc(n);
    srand(7);
    for (size_t i = 0; i < n; i++) {
        memcpy(copy, orig, n);
        copy[i] ^= (unsigned char)(1 + rand() % 255);
        spit(meta, copy, n);
        if (dcp_open(dir, 0, &ck, &err) == 0) {
            for (size_t k = 0; k < dcp_num_entries(ck); k++) {
                const dcp_entry *e = dcp_entry_at(ck, k);
                for (size_t c = 0; c < e->nchunks; c++)
                    for (int d = 0; d < e->ndim; d++)   /* every box lies inside its tensor */
                        ck_assert(chunks_of(ck, e)[c].offsets[d] >= 0 &&
                                  chunks_of(ck, e)[c].offsets[d] + chunks_of(ck, e)[c].sizes[d] <= e->shape[d]);
            }
            dcp_close(ck);
        } else {
            ck_assert_msg(strstr(err.msg, dir) != NULL, "flip %zu: error lacks the folder: %s", i, err.msg);
        }
    }
    free(copy);
    free(orig);
    remove_tree(dir);
}
END_TEST

/* The streaming parse: a back-reference to an object of a freed batch (every
 * chunk's sizes one torch.Size) parses the whole tree instead, with the same
 * model; chunks listed out of order (one twice) are found by their offsets. */
START_TEST(stream_backref_and_unordered_chunks)
{
    char *dir = synthetic("shared_across_batches");
    dcp_checkpoint *ck = open_ok(dir);
    ck_assert_uint_eq(dcp_num_entries(ck), 1100);
    const dcp_entry *e = dcp_find(ck, "k1099");
    ck_assert_ptr_nonnull(e);
    ck_assert_uint_eq(e->nchunks, 1);
    const dcp_chunk *c = chunks_of(ck, e);
    ck_assert(c[0].has_blob);
    ck_assert_int_eq(c[0].sizes[0], 4);
    ck_assert_uint_eq(c[0].blob.offset, 16 * 1099);
    dcp_close(ck);
    remove_tree(dir);

    dir = synthetic("chunks_out_of_order");
    ck = open_ok(dir);
    e = dcp_find(ck, "w");
    ck_assert_uint_eq(e->nchunks, 20);   /* the replica of [5] dropped */
    c = chunks_of(ck, e);
    static const int64_t order[] = {7, 3, 19, 0, 12, 5, 16, 1, 9, 14, 2, 18, 6, 11, 4, 17, 8, 13, 10, 15};
    for (size_t i = 0; i < 20; i++) {
        ck_assert_int_eq(c[i].offsets[0], order[i]);   /* the order of the list */
        ck_assert_msg(c[i].has_blob && c[i].blob.offset == 4 * (uint64_t)order[i], "chunk %zu", i);
    }
    dcp_close(ck);
    remove_tree(dir);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("metadata");
    TCase *f = tcase_create("fixtures");
    tcase_set_timeout(f, 120);
    tcase_add_test(f, every_fixture_matches_its_manifest);
    tcase_add_test(f, pytorch_2x_plain);
    tcase_add_test(f, pytorch_2x_zstd_transforms);
    tcase_add_test(f, pytorch_2x_rank_local_merge);
    tcase_add_test(f, megatron_subclass_is_opaque);
    tcase_add_test(f, rank_local_errors);
    tcase_add_test(f, rank_local_one_rank_view);
    suite_add_tcase(s, f);
    TCase *y = tcase_create("synthetic");
    tcase_add_test(y, python313_paths_and_big_offsets);
    tcase_add_test(y, dict_and_long_properties_float_version_slots);
    tcase_add_test(y, generations_from_fields);
    tcase_add_test(y, int_keys_in_decimal);
    tcase_add_test(y, stream_backref_and_unordered_chunks);
    tcase_add_test(y, schema_errors_name_file_key_reason);
    tcase_add_test(y, file_errors);
    suite_add_tcase(s, y);
    TCase *h = tcase_create("hostile");
    tcase_set_timeout(h, 300);
    tcase_add_test(h, pytorch_2x_truncated_and_flipped);
    suite_add_tcase(s, h);
    return s;
}

int main(int argc, char **argv)
{
    (void)argc;
    const char *top = getenv("top_srcdir");
    if (top && *top) {
        snprintf(srcdir, sizeof srcdir, "%s", top);
    } else {   /* run by hand from an in-tree build: <top>/tests/unit/test_metadata */
        char self[4096];
        snprintf(self, sizeof self, "%s", argv[0]);
        snprintf(srcdir, sizeof srcdir, "%s/../..", dirname(self));
    }
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
