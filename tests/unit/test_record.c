/* Unit tests of the record locator (src/torchsave.c) and the Hugging Face
 * layout loader (src/safetensors.c): every fixture chunk against its
 * manifest, archives with hand-made data.pkl (v2, v3, wrappers, flags, and
 * hostile contents), SAFETENSORS-format shards, raw safetensors chunks, zstd
 * blobs and Hugging Face folders, good and corrupt. */
#include "check_quiet.h"
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include "internal.h"
#include "planner_ck.h"
#include "zipbuild.h"

/* The chunks of an entry of a parsed model (they stay until dcp_close). */
static const dcp_chunk *chunks_of(dcp_checkpoint *ck, const dcp_entry *e)
{
    const dcp_chunk *c;
    dcp_error err;
    ck_assert_msg(dcp_entry_chunks(ck, e, &c, &err) == 0, "%s", err.msg);
    return c;
}

/* The locator on chunk i of a parsed model's entry, the strides kept in the
 * checkpoint's arena (as dcp_chunk_record keeps them). */
static int locate(dcp_checkpoint *ck, const dcp_entry *e, size_t i, dcp_record *rec, dcp_error *err)
{
    int64_t *stride = dcpi_arena_alloc(&ck->arena, DCPI_MAX_NDIM * sizeof *stride);
    ck_assert_ptr_nonnull(stride);
    return dcpi_locate_record(ck, e, &chunks_of(ck, e)[i], i, rec, stride, err);
}

static char fixtures[4096];

/* ------------------------------------------------------------ fixtures */

START_TEST(fixture_records_match_manifest)
{
    static const char *names[] = {"01_single_plain", "02_rowwise_4ranks", "03_colwise_4ranks",
                                  "04_block_4ranks", "05_mixed_2ranks", "08_single_file_per_rank"};
    size_t checked = 0;
    for (size_t f = 0; f < sizeof names / sizeof *names; f++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s/ckpt", fixtures, names[f]);
        dcp_checkpoint *ck;
        dcp_error err;
        ck_assert_msg(dcp_open(path, 0, &ck, &err) == 0, "%s", err.msg);
        snprintf(path, sizeof path, "%s/%s/expected/manifest.json", fixtures, names[f]);
        json_error_t je;
        json_t *m = json_load_file(path, 0, &je), *e;
        ck_assert_msg(m != NULL, "%s: %s", path, je.text);
        size_t i;
        json_array_foreach(json_object_get(m, "entries"), i, e) {
            const dcp_entry *de = dcp_find(ck, json_string_value(json_object_get(e, "key")));
            ck_assert_ptr_nonnull(de);
            json_t *c;
            size_t j;
            json_array_foreach(json_object_get(e, "chunks"), j, c) {
                json_t *st = json_object_get(c, "stored_tensor");
                if (!st)
                    continue;
                dcp_record rec;
                ck_assert_msg(locate(ck, de, j, &rec, &err) == 0, "%s", err.msg);
                ck_assert_uint_eq(rec.data_offset, json_integer_value(json_object_get(st, "data_offset_in_file")));
                ck_assert_str_eq(dcp_dtype_name(rec.dtype), json_string_value(json_object_get(st, "dtype")));
                ck_assert_uint_eq(rec.data_length,
                                  json_integer_value(json_object_get(st, "storage_numel")) * dcp_dtype_size(rec.dtype));
                ck_assert_int_eq(rec.storage_offset, json_integer_value(json_object_get(st, "storage_offset")));
                ck_assert_uint_eq(rec.flags, 0);
                json_t *stride = json_object_get(st, "stride");
                ck_assert_uint_eq(json_array_size(stride), (size_t)de->ndim);
                for (int d = 0; d < de->ndim; d++)
                    ck_assert_int_eq(rec.stride[d], json_integer_value(json_array_get(stride, (size_t)d)));
                /* The record is the zip's data/0, at the blob's offset plus its data offset. */
                json_t *zr;
                size_t k;
                json_array_foreach(json_object_get(c, "zip_records"), k, zr)
                    if (!strcmp(json_string_value(json_object_get(zr, "name")), "archive/data/0"))
                        ck_assert_uint_eq(rec.data_offset,
                                          chunks_of(ck, de)[j].blob.offset +
                                              (uint64_t)json_integer_value(json_object_get(zr, "data_offset")));
                checked++;
            }
        }
        json_decref(m);
        dcp_close(ck);
    }
    ck_assert_uint_ge(checked, 63);
}
END_TEST

START_TEST(fixture_transposed_views)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/01_single_plain/ckpt", fixtures);
    dcp_checkpoint *ck;
    dcp_error err;
    ck_assert_msg(dcp_open(path, 0, &ck, &err) == 0, "%s", err.msg);
    dcp_record rec;
    ck_assert(locate(ck, dcp_find(ck, "views.transposed"), 0, &rec, &err) == 0);
    ck_assert(rec.stride[0] == 1 && rec.stride[1] == 10);
    ck_assert(locate(ck, dcp_find(ck, "views.slice_of_transposed"), 0, &rec, &err) == 0);
    ck_assert(rec.stride[0] == 1 && rec.stride[1] == 12);
    dcp_close(ck);
}
END_TEST

/* ------------------------------------------------------------ built archives */

#define KEY "layer.w"
#define FILLER 77   /* bytes before the blob in its file */

typedef struct built {
    dcp_checkpoint *ck;
    const dcp_entry *e;
    zb_layout lay;
    uint64_t blob_offset;
} built;

/* A checkpoint whose tensor KEY (dtype dt, chunk sizes = shape) has one chunk:
 * the archive of t with `data` as data/<key>. */
static built build(const pb_tensor *t, const char *byteorder, const void *data, size_t len, dcp_dtype dt,
                   int ndim, const int64_t *shape, uint32_t transforms)
{
    built r = {0};
    zb_buf z = zb_tensor_zip(t, byteorder, data, len, 0, &r.lay);
    zb_buf f = {0};
    for (int i = 0; i < FILLER; i++)
        zb_put(&f, "\xee", 1);
    uint64_t blen = z.n;
    if (transforms & DCP_TRANSFORM_ZSTD) {
        size_t cap = ZSTD_compressBound(z.n);
        unsigned char *c = malloc(cap);
        size_t n = ZSTD_compress(c, cap, z.p, z.n, 3);
        ck_assert(!ZSTD_isError(n));
        zb_put(&f, c, n);
        blen = n;
        free(c);
    } else {
        zb_put(&f, z.p, z.n);
    }
    r.ck = tck_new();
    uint32_t file = tck_file(r.ck, "__0_0.distcp", f.p, f.n);
    size_t idx = tck_tensor(r.ck, KEY, dt, ndim, shape);
    int64_t zeros[8] = {0};
    tck_chunk(r.ck, idx, zeros, shape, file, FILLER, blen);
    r.ck->priv[idx].chunks[0].blob.transforms = transforms;
    tck_finish(r.ck);
    r.e = &r.ck->entries[idx];
    r.blob_offset = FILLER;
    free(z.p);
    free(f.p);
    return r;
}

static const float f12[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};

static pb_tensor float_2x3(void)
{
    return (pb_tensor){.storage = "FloatStorage", .numel = 6, .ndim = 2, .size = {2, 3}, .stride = {3, 1}};
}

/* Locate must fail; the message names the checkpoint file, the key and `want`. */
static void locate_fails(const pb_tensor *t, const char *byteorder, size_t len, dcp_dtype dt, int ndim,
                         const int64_t *shape, const char *want)
{
    unsigned char data[256] = {0};
    ck_assert(len <= sizeof data);
    built b = build(t, byteorder, data, len, dt, ndim, shape, 0);
    dcp_record rec;
    dcp_error err;
    ck_assert_int_eq(locate(b.ck, b.e, 0, &rec, &err), -1);
    ck_assert_msg(strstr(err.msg, want) != NULL, "error '%s' lacks '%s'", err.msg, want);
    ck_assert_msg(strstr(err.msg, "/__0_0.distcp: " KEY ": ") != NULL, "error names no file and key: %s", err.msg);
    ck_assert_int_eq(err.code, EIO);
    tck_free(b.ck);
}

START_TEST(v2_plain_and_strided)
{
    pb_tensor t = float_2x3();
    int64_t shape[] = {2, 3};
    built b = build(&t, "little", f12, 24, DCP_FLOAT32, 2, shape, 0);
    dcp_record rec;
    dcp_error err;
    ck_assert_msg(locate(b.ck, b.e, 0, &rec, &err) == 0, "%s", err.msg);
    ck_assert_uint_eq(rec.data_offset, b.blob_offset + b.lay.data[2]);   /* data.pkl, byteorder, data/0 */
    ck_assert_uint_eq(rec.data_length, 24);
    ck_assert_int_eq(rec.dtype, DCP_FLOAT32);
    ck_assert(rec.stride[0] == 3 && rec.stride[1] == 1);
    ck_assert_int_eq(rec.storage_offset, 0);
    ck_assert_uint_eq(rec.flags, 0);
    void *buf;
    uint64_t len;
    ck_assert_msg(dcp_read_entry(b.ck, b.e, &buf, &len, &err) == 0, "%s", err.msg);
    ck_assert(len == 24 && !memcmp(buf, f12, 24));
    free(buf);
    tck_free(b.ck);

    /* A transposed view with a storage offset inside a larger storage:
     * elements 2 + i + 3j of a 12-element storage, shape (3, 2). */
    t = (pb_tensor){.storage = "FloatStorage", .numel = 12, .storage_offset = 2, .ndim = 2, .size = {3, 2},
                    .stride = {1, 3}};
    int64_t tshape[] = {3, 2};
    b = build(&t, NULL, f12, 48, DCP_FLOAT32, 2, tshape, 0);
    ck_assert_msg(locate(b.ck, b.e, 0, &rec, &err) == 0, "%s", err.msg);
    ck_assert(rec.stride[0] == 1 && rec.stride[1] == 3 && rec.storage_offset == 2);
    ck_assert_uint_eq(rec.data_offset, b.blob_offset + b.lay.data[1]);   /* no byteorder record */
    ck_assert_msg(dcp_read_entry(b.ck, b.e, &buf, &len, &err) == 0, "%s", err.msg);
    const float want[6] = {3, 6, 4, 7, 5, 8};
    ck_assert(len == 24 && !memcmp(buf, want, 24));
    free(buf);
    tck_free(b.ck);
}
END_TEST

START_TEST(v3_untyped_storage)
{
    /* float8 and uint16: UntypedStorage counts bytes, the dtype is an argument. */
    unsigned char bytes[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    pb_tensor t = {.v3 = 1, .storage = "UntypedStorage", .dtype = "float8_e4m3fn", .numel = 12, .ndim = 2,
                   .size = {3, 4}, .stride = {4, 1}};
    int64_t shape[] = {3, 4};
    built b = build(&t, "little", bytes, 12, DCP_FLOAT8_E4M3FN, 2, shape, 0);
    dcp_record rec;
    dcp_error err;
    ck_assert_msg(locate(b.ck, b.e, 0, &rec, &err) == 0, "%s", err.msg);
    ck_assert_int_eq(rec.dtype, DCP_FLOAT8_E4M3FN);
    ck_assert_uint_eq(rec.data_length, 12);
    tck_free(b.ck);

    t = (pb_tensor){.v3 = 1, .storage = "UntypedStorage", .dtype = "uint16", .numel = 12, .ndim = 1,
                    .size = {6}, .stride = {1}};
    int64_t s6[] = {6};
    b = build(&t, "little", bytes, 12, DCP_UINT16, 1, s6, 0);
    ck_assert_msg(locate(b.ck, b.e, 0, &rec, &err) == 0, "%s", err.msg);
    ck_assert_int_eq(rec.dtype, DCP_UINT16);
    tck_free(b.ck);
    /* v3 bytes that are not a whole number of elements reach past the storage. */
    t.numel = 11;
    locate_fails(&t, "little", 11, DCP_UINT16, 1, s6, "reaches element");
    t.numel = 12;
    t.dtype = "float128";
    locate_fails(&t, "little", 12, DCP_UINT16, 1, s6, "unknown dtype float128");
}
END_TEST

START_TEST(wrappers_and_flags)
{
    int64_t shape[] = {2, 3};
    const char *wraps[] = {"parameter", "from_type"};
    for (int w = 0; w < 2; w++) {
        pb_tensor t = float_2x3();
        t.wrap = wraps[w];
        built b = build(&t, "little", f12, 24, DCP_FLOAT32, 2, shape, 0);
        dcp_record rec;
        dcp_error err;
        ck_assert_msg(locate(b.ck, b.e, 0, &rec, &err) == 0, "%s: %s", wraps[w], err.msg);
        ck_assert_uint_eq(rec.data_offset, b.blob_offset + b.lay.data[2]);
        tck_free(b.ck);
    }
    struct { const char *meta, *order; uint32_t flag; } cases[] = {
        {"conj", "little", DCP_RECORD_CONJ}, {"neg", "little", DCP_RECORD_NEG},
        {"other", "little", 0}, {NULL, "big", DCP_RECORD_BIG_ENDIAN}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        pb_tensor t = float_2x3();
        t.meta_key = cases[i].meta;
        built b = build(&t, cases[i].order, f12, 24, DCP_FLOAT32, 2, shape, 0);
        dcp_record rec;
        dcp_error err;
        ck_assert_msg(locate(b.ck, b.e, 0, &rec, &err) == 0, "%s", err.msg);
        ck_assert_uint_eq(rec.flags, cases[i].flag);
        tck_free(b.ck);
    }
    pb_tensor t = float_2x3();
    locate_fails(&t, "middle", 24, DCP_FLOAT32, 2, shape, "unknown byteorder 'middle'");
    locate_fails(&t, "little-endian-but-much-longer", 24, DCP_FLOAT32, 2, shape, "too large");
}
END_TEST

START_TEST(big_endian_read)
{
    /* archive/byteorder "big": the reader swaps each element. */
    float be[6];
    for (int i = 0; i < 6; i++) {
        unsigned char *s = (unsigned char *)&f12[i], *d = (unsigned char *)&be[i];
        d[0] = s[3], d[1] = s[2], d[2] = s[1], d[3] = s[0];
    }
    pb_tensor t = float_2x3();
    int64_t shape[] = {2, 3};
    built b = build(&t, "big", be, 24, DCP_FLOAT32, 2, shape, 0);
    void *buf;
    uint64_t len;
    dcp_error err;
    ck_assert_msg(dcp_read_entry(b.ck, b.e, &buf, &len, &err) == 0, "%s", err.msg);
    ck_assert(len == 24 && !memcmp(buf, f12, 24));
    free(buf);
    tck_free(b.ck);
}
END_TEST

START_TEST(dtype_trust_and_sizes)
{
    int64_t shape[] = {2, 3};
    /* Same element size, another dtype: the blob's dtype wins. */
    pb_tensor t = float_2x3();
    t.storage = "IntStorage";
    built b = build(&t, "little", f12, 24, DCP_FLOAT32, 2, shape, 0);
    dcp_record rec;
    dcp_error err;
    ck_assert_msg(locate(b.ck, b.e, 0, &rec, &err) == 0, "%s", err.msg);
    ck_assert_int_eq(rec.dtype, DCP_INT32);
    tck_free(b.ck);
    /* Another element size is an error. */
    t.storage = "DoubleStorage";
    locate_fails(&t, "little", 48, DCP_FLOAT32, 2, shape, "differs in size");
    t.storage = "NoSuchStorage";
    locate_fails(&t, "little", 24, DCP_FLOAT32, 2, shape, "unknown storage type NoSuchStorage");
}
END_TEST

START_TEST(zero_dim_and_empty)
{
    static const int64_t noshape[1] = {0};
    /* 0-d: size (), stride (). */
    pb_tensor t = {.storage = "FloatStorage", .numel = 1, .ndim = 0};
    built b = build(&t, "little", f12, 4, DCP_FLOAT32, 0, noshape, 0);
    dcp_record rec;
    dcp_error err;
    ck_assert_msg(locate(b.ck, b.e, 0, &rec, &err) == 0, "%s", err.msg);
    ck_assert_ptr_nonnull(rec.stride);
    ck_assert_uint_eq(rec.data_length, 4);
    tck_free(b.ck);
    /* Empty: a zero-length record; a zero-size dimension excuses any stride. */
    t = (pb_tensor){.storage = "FloatStorage", .numel = 0, .ndim = 2, .size = {0, 4}, .stride = {1000, 1}};
    int64_t shape[] = {0, 4};
    b = build(&t, "little", "", 0, DCP_FLOAT32, 2, shape, 0);
    ck_assert_msg(locate(b.ck, b.e, 0, &rec, &err) == 0, "%s", err.msg);
    ck_assert_uint_eq(rec.data_length, 0);
    void *buf;
    uint64_t len;
    ck_assert(dcp_read_entry(b.ck, b.e, &buf, &len, &err) == 0 && len == 0);
    free(buf);
    tck_free(b.ck);
    /* 0-d with a negative storage offset. */
    t = (pb_tensor){.storage = "FloatStorage", .numel = 1, .storage_offset = -1, .ndim = 0};
    locate_fails(&t, "little", 4, DCP_FLOAT32, 0, noshape, "negative storage offset");
    t.storage_offset = 1;
    locate_fails(&t, "little", 4, DCP_FLOAT32, 0, noshape, "reaches element 1 of a 1-element storage");
}
END_TEST

START_TEST(hostile_views)
{
    int64_t shape[] = {2, 3};
    pb_tensor t = float_2x3();
    t.stride[1] = -1;
    locate_fails(&t, "little", 24, DCP_FLOAT32, 2, shape, "negative stride -1 in dimension 1");
    t = float_2x3();
    t.stride[0] = 4;   /* (1)*4 + (2)*1 = 6: one past the end */
    locate_fails(&t, "little", 24, DCP_FLOAT32, 2, shape, "reaches element 6 of a 6-element storage");
    t = float_2x3();
    t.stride[0] = t.stride[1] = INT64_MAX;   /* 1*(2^63-1) + 2*(2^63-1) wraps 64 bits */
    locate_fails(&t, "little", 24, DCP_FLOAT32, 2, shape, "strides overflow");
    t = float_2x3();
    t.stride[0] = INT64_MAX;
    locate_fails(&t, "little", 24, DCP_FLOAT32, 2, shape, "reaches element 9223372036854775809 of a 6-element");
    t = float_2x3();
    t.storage_offset = INT64_MAX;
    locate_fails(&t, "little", 24, DCP_FLOAT32, 2, shape, "reaches element");
    t = float_2x3();
    t.size[0] = 3;
    locate_fails(&t, "little", 24, DCP_FLOAT32, 2, shape, "shape differs from the chunk's sizes");
    t = float_2x3();
    t.ndim = 1;
    locate_fails(&t, "little", 24, DCP_FLOAT32, 2, shape, "shape differs");
    t = float_2x3();
    t.numel = 7;   /* data.pkl and the record disagree */
    locate_fails(&t, "little", 24, DCP_FLOAT32, 2, shape, "holds 24 bytes, data.pkl says 28");
    t.numel = -1;
    locate_fails(&t, "little", 24, DCP_FLOAT32, 2, shape, "bad storage size");
    t.numel = INT64_MAX;
    locate_fails(&t, "little", 24, DCP_FLOAT32, 2, shape, "bad storage size");
    t = float_2x3();
    t.key = "1";   /* data.pkl names a record the archive lacks (it holds data/1 only) */
    {
        unsigned char data[24] = {0};
        built b = build(&t, "little", data, 24, DCP_FLOAT32, 2, shape, 0);
        dcp_record rec;
        dcp_error err;
        ck_assert_msg(locate(b.ck, b.e, 0, &rec, &err) == 0, "%s", err.msg);   /* key "1" is fine */
        tck_free(b.ck);
    }
    char longkey[200];
    memset(longkey, '7', sizeof longkey - 1);
    longkey[sizeof longkey - 1] = 0;
    t.key = longkey;
    locate_fails(&t, "little", 24, DCP_FLOAT32, 2, shape, "bad storage key");
}
END_TEST

/* data.pkl contents that are not a tensor rebuild: each an error (of code
 * when not 0), never a crash. */
static void pkl_fails_code(const void *pkl, size_t n, int code, const char *want)
{
    zb_rec recs[] = {{"archive/data.pkl", pkl, n}, {"archive/data/0", f12, 24}};
    zb_buf z = zb_zip(recs, 2, 0, NULL);
    dcp_checkpoint *ck = tck_new();
    uint32_t file = tck_file(ck, "__0_0.distcp", z.p, z.n);
    int64_t shape[] = {2, 3}, zeros[] = {0, 0};
    size_t idx = tck_tensor(ck, KEY, DCP_FLOAT32, 2, shape);
    tck_chunk(ck, idx, zeros, shape, file, 0, z.n);
    tck_finish(ck);
    dcp_record rec;
    dcp_error err;
    ck_assert_int_eq(locate(ck, &ck->entries[idx], 0, &rec, &err), -1);
    ck_assert_msg(!want || strstr(err.msg, want) != NULL, "error '%s' lacks '%s'", err.msg, want);
    ck_assert_msg(!code || err.code == code, "error code %d, not %d: %s", err.code, code, err.msg);
    ck_assert_msg(strstr(err.msg, KEY) != NULL, "error names no key: %s", err.msg);
    tck_free(ck);
    free(z.p);
}

static void pkl_fails(const void *pkl, size_t n, const char *want)
{
    pkl_fails_code(pkl, n, 0, want);
}

START_TEST(hostile_data_pkl)
{
    pkl_fails("\x80\x02K\x07.", 5, "does not rebuild a plain tensor (not a call)");
    /* A call of one global with no arguments: torch.ao's quantized tensor,
     * TransformerEngine's Float8Tensor are intact records libdcp does not
     * read (ENOTSUP); another library's call is no tensor record (EIO). */
    static const struct {
        const char *module, *name, *want;
        int code;
    } calls[] = {
        {"torch._utils", "_rebuild_qtensor", "does not rebuild a plain tensor (torch._utils._rebuild_qtensor, a "
         "rebuild libdcp does not read: its stored bytes alone are not the values)", ENOTSUP},
        {"transformer_engine.pytorch.tensor.float8_tensor", "_make_float8_tensor_in_reduce_ex",
         "(transformer_engine.pytorch.tensor.float8_tensor._make_float8_tensor_in_reduce_ex, a rebuild", ENOTSUP},
        {"mylib", "make_thing", "does not rebuild a plain tensor (make_thing)", EIO},
    };
    zb_buf b = {0};
    for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
        b.n = 0;
        pb_op(&b, "\x80\x02");
        pb_global(&b, calls[i].module, calls[i].name);
        pb_op(&b, ")R.");
        pkl_fails_code(b.p, b.n, calls[i].code, calls[i].want);
    }
    b.n = 0;   /* _rebuild_tensor_v2 with no arguments */
    pb_op(&b, "\x80\x02");
    pb_global(&b, "torch._utils", "_rebuild_tensor_v2");
    pb_op(&b, ")R.");
    pkl_fails(b.p, b.n, "malformed _rebuild_tensor arguments");
    b.n = 0;   /* a plain tuple where the persistent id belongs */
    pb_op(&b, "\x80\x02");
    pb_global(&b, "torch._utils", "_rebuild_tensor_v2");
    static const char args[] = "((K\x01tK\x00(K\x02K\x03t(K\x03K\x01t\x89}tR.";
    zb_put(&b, args, sizeof args - 1);   /* holds a NUL */
    pkl_fails(b.p, b.n, "malformed");
    b.n = 0;   /* _rebuild_parameter nested deeper than any real file */
    pb_op(&b, "\x80\x02");
    for (int i = 0; i < 6; i++) {
        pb_global(&b, "torch._utils", "_rebuild_parameter");
        pb_byte(&b, '(');
    }
    pb_op(&b, "K\x01");
    for (int i = 0; i < 6; i++)
        pb_op(&b, "tR");
    pb_byte(&b, '.');
    pkl_fails(b.p, b.n, "does not rebuild a plain tensor");
    b.n = 0;   /* _rebuild_from_type_v2 of a subclass rebuilt from its storage: read, its arguments checked */
    pb_op(&b, "\x80\x02");
    pb_global(&b, "torch._tensor", "_rebuild_from_type_v2");
    pb_byte(&b, '(');
    pb_global(&b, "torch._utils", "_rebuild_tensor_v2");
    pb_global(&b, "mylib", "FancyTensor");
    pb_op(&b, ")}tR.");
    pkl_fails(b.p, b.n, "malformed _rebuild_tensor arguments");
    /* A wrapper subclass (no storage of its own) libdcp does not know:
     * refused naming the class (ENOTSUP: not damage); a known value wrapper
     * whose state lacks its tensor or nests wrappers deeper than any real
     * file: refused (EIO). */
    static const char *const wrappers[][2] = {{"mylib", "FancyTensor"},
                                              {"torchao.float8.fsdp_utils", "WeightWithDynamicFloat8CastTensor"}};
    for (int w = 0; w < 2; w++) {
        b.n = 0;
        pb_op(&b, "\x80\x02");
        pb_global(&b, "torch._tensor", "_rebuild_from_type_v2");
        pb_byte(&b, '(');
        pb_global(&b, "torch._utils", "_rebuild_wrapper_subclass");
        pb_global(&b, wrappers[w][0], wrappers[w][1]);
        pb_op(&b, ")}tR.");
        pkl_fails_code(b.p, b.n, w ? EIO : ENOTSUP,
                       w ? "does not rebuild a plain tensor (_rebuild_from_type_v2)"
                         : "does not rebuild a plain tensor (a mylib.FancyTensor, a tensor subclass whose stored "
                           "tensors libdcp does not know to be its values)");
    }
    b.n = 0;
    pb_op(&b, "\x80\x02");
    for (int i = 0; i < 6; i++) {   /* state {"_tensor": <the next wrapper>} */
        pb_global(&b, "torch._tensor", "_rebuild_from_type_v2");
        pb_byte(&b, '(');
        pb_global(&b, "torch._utils", "_rebuild_wrapper_subclass");
        pb_global(&b, "torchao.float8.fsdp_utils", "WeightWithDynamicFloat8CastTensor");
        pb_op(&b, ")}");
        zb_put(&b, "X\x07\x00\x00\x00_tensor", 12);
    }
    pb_op(&b, "K\x01");
    for (int i = 0; i < 6; i++)
        pb_op(&b, "stR");
    pb_byte(&b, '.');
    pkl_fails_code(b.p, b.n, EIO, "does not rebuild a plain tensor (_rebuild_from_type_v2)");
    /* Wrong tag in the persistent id. */
    pb_tensor t = float_2x3();
    zb_buf p = pb_tensor_pkl(&t);
    char *tag = memmem(p.p, p.n, "storage", 7);
    ck_assert_ptr_nonnull(tag);
    tag[0] = 'S';
    pkl_fails(p.p, p.n, "malformed");
    free(p.p);
    /* Not a pickle at all, and a truncated one. */
    pkl_fails("PK\3\4 not a pickle", 17, "data.pkl");
    p = pb_tensor_pkl(&t);
    pkl_fails(p.p, p.n / 2, "data.pkl");
    free(p.p);
    /* No data.pkl in the archive. */
    zb_rec recs[] = {{"archive/other.pkl", "\x80\x02K\x07.", 5}, {"archive/data/0", f12, 24}};
    zb_buf z = zb_zip(recs, 2, 0, NULL);
    dcp_checkpoint *ck = tck_new();
    uint32_t file = tck_file(ck, "__0_0.distcp", z.p, z.n);
    int64_t shape[] = {2, 3}, zeros[] = {0, 0};
    size_t idx = tck_tensor(ck, KEY, DCP_FLOAT32, 2, shape);
    tck_chunk(ck, idx, zeros, shape, file, 0, z.n);
    tck_finish(ck);
    dcp_record rec;
    dcp_error err;
    ck_assert_int_eq(locate(ck, &ck->entries[idx], 0, &rec, &err), -1);
    ck_assert_msg(strstr(err.msg, "no data.pkl"), "%s", err.msg);
    tck_free(ck);
    free(z.p);
    free(b.p);
}
END_TEST

/* Every byte of a valid data.pkl flipped: a record that stays inside the
 * storage, or an error naming the key. */
START_TEST(data_pkl_mutations)
{
    pb_tensor t = float_2x3();
    t.meta_key = "conj";
    zb_buf p = pb_tensor_pkl(&t);
    int ok = 0, errors = 0;
    for (size_t i = 0; i < p.n; i++) {
        for (int v = 0; v < 2; v++) {
            unsigned char *m = malloc(p.n);
            memcpy(m, p.p, p.n);
            m[i] = v ? (unsigned char)(m[i] ^ 0x01) : 0xff;
            zb_rec recs[] = {{"archive/data.pkl", m, p.n}, {"archive/data/0", f12, 48}};
            zb_buf z = zb_zip(recs, 2, 0, NULL);
            dcp_checkpoint *ck = tck_new();
            uint32_t file = tck_file(ck, "__0_0.distcp", z.p, z.n);
            int64_t shape[] = {2, 3}, zeros[] = {0, 0};
            size_t idx = tck_tensor(ck, KEY, DCP_FLOAT32, 2, shape);
            tck_chunk(ck, idx, zeros, shape, file, 0, z.n);
            tck_finish(ck);
            dcp_record rec;
            dcp_error err;
            if (locate(ck, &ck->entries[idx], 0, &rec, &err) == 0) {
                ok++;
                uint64_t last = (uint64_t)rec.storage_offset + (uint64_t)rec.stride[0] + 2 * (uint64_t)rec.stride[1];
                ck_assert(last * dcp_dtype_size(rec.dtype) < rec.data_length);
            } else {
                errors++;
                ck_assert_msg(strstr(err.msg, KEY) != NULL, "%s", err.msg);
            }
            tck_free(ck);
            free(z.p);
            free(m);
        }
    }
    ck_assert_int_gt(errors, (int)p.n);
    free(p.p);
    (void)ok;
}
END_TEST

START_TEST(zstd_record_is_decoded)
{
    pb_tensor t = float_2x3();
    int64_t shape[] = {2, 3};
    built b = build(&t, "little", f12, 24, DCP_FLOAT32, 2, shape, DCP_TRANSFORM_ZSTD);
    dcp_record rec;
    dcp_error err;
    ck_assert_msg(locate(b.ck, b.e, 0, &rec, &err) == 0, "%s", err.msg);
    ck_assert_uint_eq(rec.flags, DCP_RECORD_DECODED);
    ck_assert_uint_eq(rec.data_offset, b.lay.data[2]);   /* inside the decoded blob */
    void *buf;
    uint64_t len;
    ck_assert_msg(dcp_read_entry(b.ck, b.e, &buf, &len, &err) == 0, "%s", err.msg);
    ck_assert(len == 24 && !memcmp(buf, f12, 24));
    free(buf);
    tck_free(b.ck);
}
END_TEST

START_TEST(missing_blob)
{
    dcp_checkpoint *ck = tck_new();
    int64_t shape[] = {4, 6}, offs[] = {2, 3}, sizes[] = {2, 3};
    size_t idx = tck_tensor(ck, KEY, DCP_FLOAT32, 2, shape);
    size_t ci;
    dcp_error err;
    ck_assert(dcpi_model_add_chunk(ck, idx, offs, sizes, &ci, &err) == 0);
    tck_finish(ck);
    dcp_record rec;
    ck_assert_int_eq(locate(ck, &ck->entries[idx], 0, &rec, &err), -1);
    ck_assert_int_eq(err.code, ENOENT);
    ck_assert_msg(strstr(err.msg, KEY ": no storage entry for the chunk at offsets [2,3]"), "%s", err.msg);
    tck_free(ck);
}
END_TEST

/* ------------------------------------------------------------ safetensors */

/* A safetensors buffer: u64 header length, the JSON, the data. */
static zb_buf st_buffer(const char *json, const void *data, size_t len)
{
    zb_buf b = {0};
    zb_le(&b, strlen(json), 8);
    zb_put(&b, json, strlen(json));
    zb_put(&b, data, len);
    return b;
}

static const char st_json[] =
    "{\"__metadata__\":{\"format\":\"pt\"},"
    "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
    "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]},"
    "\"c\":{\"dtype\":\"U16\",\"shape\":[2,2],\"data_offsets\":[32,40]},"
    "\"s\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[40,48]}}";

typedef struct stk {
    const char *key;
    dcp_dtype dt;
    int ndim;
    int64_t shape[4];
    uint64_t length;
} stk;

/* A SAFETENSORS-format shard: `pre` bytes (a byte item), then the buffer;
 * every key's chunk points at the buffer start with its byte count. */
static dcp_checkpoint *st_shard(const char *json, const stk *keys, int n, uint64_t *buf_off)
{
    unsigned char data[48];
    for (int i = 0; i < 48; i++)
        data[i] = (unsigned char)i;
    zb_buf f = {0};
    for (int i = 0; i < 100; i++)
        zb_put(&f, "B", 1);
    *buf_off = f.n;
    zb_buf st = st_buffer(json, data, sizeof data);
    zb_put(&f, st.p, st.n);
    dcp_checkpoint *ck = tck_new();
    uint32_t file = tck_file(ck, "__0_0.distcp", f.p, f.n);
    for (int i = 0; i < n; i++) {
        size_t idx = tck_tensor(ck, keys[i].key, keys[i].dt, keys[i].ndim, keys[i].shape);
        int64_t zeros[4] = {0};
        tck_chunk(ck, idx, zeros, keys[i].shape, file, *buf_off, keys[i].length);
    }
    tck_finish(ck);
    free(st.p);
    free(f.p);
    return ck;
}

START_TEST(safetensors_format_shard)
{
    stk keys[] = {{"a", DCP_FLOAT32, 2, {2, 3}, 24}, {"b", DCP_BFLOAT16, 1, {4}, 8},
                  {"c", DCP_UINT16, 2, {2, 2}, 8}, {"s", DCP_INT64, 0, {0}, 8}};
    uint64_t off;
    dcp_checkpoint *ck = st_shard(st_json, keys, 4, &off);
    uint64_t data_start = off + 8 + strlen(st_json);
    uint64_t begin[] = {0, 24, 32, 40};
    for (int i = 0; i < 4; i++) {
        const dcp_entry *e = dcp_find(ck, keys[i].key);
        dcp_record rec;
        dcp_error err;
        ck_assert_msg(locate(ck, e, 0, &rec, &err) == 0, "%s", err.msg);
        ck_assert_uint_eq(rec.data_offset, data_start + begin[i]);
        ck_assert_uint_eq(rec.data_length, keys[i].length);
        ck_assert_int_eq(rec.dtype, keys[i].dt);
        ck_assert_uint_eq(rec.flags, 0);
        ck_assert_int_eq(rec.storage_offset, 0);
        if (i == 0)
            ck_assert(rec.stride[0] == 3 && rec.stride[1] == 1);
        void *buf;
        uint64_t len;
        ck_assert_msg(dcp_read_entry(ck, e, &buf, &len, &err) == 0, "%s", err.msg);
        ck_assert_uint_eq(len, keys[i].length);
        for (uint64_t k = 0; k < len; k++)
            ck_assert_uint_eq(((unsigned char *)buf)[k], begin[i] + k);
        free(buf);
    }
    /* The header was parsed once for the four chunks (`next` is the index's
     * first member; the struct is private to torchsave.c). */
    int n = 0;
    for (const struct dcpi_st_index *ix = ck->st_index; ix; ix = *(struct dcpi_st_index *const *)ix)
        n++;
    ck_assert_int_eq(n, 1);
    tck_free(ck);
}
END_TEST

static void st_fails(const char *json, const stk *k, const char *want)
{
    uint64_t off;
    dcp_checkpoint *ck = st_shard(json, k, 1, &off);
    dcp_record rec;
    dcp_error err;
    ck_assert_int_eq(locate(ck, &ck->entries[0], 0, &rec, &err), -1);
    ck_assert_msg(strstr(err.msg, want) != NULL, "error '%s' lacks '%s'", err.msg, want);
    ck_assert_msg(strstr(err.msg, "/__0_0.distcp: ") && strstr(err.msg, k->key), "error names no file/key: %s",
                  err.msg);
    tck_free(ck);
}

START_TEST(safetensors_format_errors)
{
    stk a = {"a", DCP_FLOAT32, 2, {2, 3}, 24};
    st_fails(st_json, &(stk){"zz", DCP_FLOAT32, 1, {6}, 24}, "no tensor named by this key");
    st_fails(st_json, &(stk){"a", DCP_FLOAT32, 2, {3, 2}, 24}, "stored shape differs");
    st_fails(st_json, &(stk){"a", DCP_FLOAT32, 2, {2, 3}, 20}, "the storage entry says 20 bytes");
    st_fails(st_json, &(stk){"a", DCP_FLOAT64, 2, {2, 3}, 24}, "another element size");
    st_fails("{\"a\":{\"dtype\":\"F99\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", &a, "unknown safetensors dtype");
    st_fails("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,4000]}}", &a, "malformed safetensors entry");
    st_fails("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,-3],\"data_offsets\":[0,24]}}", &a, "malformed safetensors entry");
    st_fails("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[8,4]}}", &a, "malformed safetensors entry");
    st_fails("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3]}}", &a, "malformed safetensors entry");
    st_fails("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,16]}}", &a, "the safetensors entry holds 16");
    st_fails("[1, 2, 3]", &a, "not a JSON object");
    st_fails("{\"a\": ", &a, "bad safetensors header");
    /* A header length that does not fit the file: not a safetensors buffer. */
    dcp_checkpoint *ck = tck_new();
    unsigned char junk[64];
    memset(junk, 0x41, sizeof junk);
    uint32_t file = tck_file(ck, "__0_0.distcp", junk, sizeof junk);
    int64_t shape[] = {2, 3}, zeros[] = {0, 0};
    size_t idx = tck_tensor(ck, "a", DCP_FLOAT32, 2, shape);
    tck_chunk(ck, idx, zeros, shape, file, 8, 24);
    tck_finish(ck);
    dcp_record rec;
    dcp_error err;
    ck_assert_int_eq(locate(ck, &ck->entries[idx], 0, &rec, &err), -1);
    ck_assert_msg(strstr(err.msg, "neither a torch.save archive nor a safetensors buffer"), "%s", err.msg);
    tck_free(ck);
}
END_TEST

START_TEST(safetensors_many_tensors)
{
    /* 3000 tensors in one buffer, each looked up by its own chunk. */
    enum { N = 3000 };
    zb_buf j = {0};
    zb_put(&j, "{", 1);
    char item[160];
    for (int i = 0; i < N; i++) {
        int n = snprintf(item, sizeof item, "%s\"layers.%d.w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[%d,%d]}",
                         i ? "," : "", (i * 7919) % N, ((i * 7919) % N) * 8, ((i * 7919) % N) * 8 + 8);
        zb_put(&j, item, (size_t)n);
    }
    zb_put(&j, "}", 2);
    zb_buf f = {0};
    zb_le(&f, strlen((char *)j.p), 8);
    zb_put(&f, j.p, strlen((char *)j.p));
    for (int i = 0; i < N; i++) {
        float v[2] = {(float)i, (float)-i};
        zb_put(&f, v, 8);
    }
    dcp_checkpoint *ck = tck_new();
    uint32_t file = tck_file(ck, "__0_0.distcp", f.p, f.n);
    int64_t shape[] = {2}, zeros[] = {0};
    for (int i = 0; i < N; i++) {
        char key[32];
        snprintf(key, sizeof key, "layers.%d.w", i);
        size_t idx = tck_tensor(ck, key, DCP_FLOAT32, 1, shape);
        tck_chunk(ck, idx, zeros, shape, file, 0, 8);
    }
    tck_finish(ck);
    for (int i = N - 1; i >= 0; i--) {
        char key[32];
        snprintf(key, sizeof key, "layers.%d.w", i);
        const dcp_entry *e = dcp_find(ck, key);
        void *buf;
        uint64_t len;
        dcp_error err;
        ck_assert_msg(dcp_read_entry(ck, e, &buf, &len, &err) == 0, "%s", err.msg);
        ck_assert(((float *)buf)[0] == (float)i && ((float *)buf)[1] == (float)-i);
        free(buf);
    }
    tck_free(ck);
    free(j.p);
    free(f.p);
}
END_TEST

START_TEST(raw_chunks)
{
    /* Hugging Face layout chunks: raw C-contiguous bytes, checked in size. */
    dcp_checkpoint *ck = tck_new();
    uint32_t file = tck_file(ck, "model.safetensors", f12, sizeof f12);
    int64_t shape[] = {3, 4}, zeros[] = {0, 0};
    size_t idx = tck_tensor(ck, "w", DCP_FLOAT32, 2, shape);
    tck_chunk(ck, idx, zeros, shape, file, 0, 48);
    ck->priv[idx].chunks[0].blob.transforms = DCPI_BLOB_RAW;
    size_t bad = tck_tensor(ck, "short", DCP_FLOAT32, 2, shape);
    tck_chunk(ck, bad, zeros, shape, file, 0, 44);
    ck->priv[bad].chunks[0].blob.transforms = DCPI_BLOB_RAW;
    tck_finish(ck);
    dcp_record rec;
    dcp_error err;
    ck_assert_msg(locate(ck, &ck->entries[idx], 0, &rec, &err) == 0, "%s", err.msg);
    ck_assert(rec.stride[0] == 4 && rec.stride[1] == 1 && rec.data_offset == 0 && rec.data_length == 48);
    ck_assert_int_eq(locate(ck, &ck->entries[bad], 0, &rec, &err), -1);
    ck_assert_msg(strstr(err.msg, "44 bytes stored, the chunk needs 48"), "%s", err.msg);
    tck_free(ck);
}
END_TEST

/* ------------------------------------------------------------ Hugging Face folders */

static char *hf_dir(void)
{
    static char tmpl[128];
    const char *tmp = getenv("TMPDIR");
    snprintf(tmpl, sizeof tmpl, "%s/dcp-hf-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    ck_assert_ptr_nonnull(mkdtemp(tmpl));
    return tmpl;
}

static void hf_write(const char *dir, const char *name, const char *json, const void *data, size_t len)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    zb_buf b = st_buffer(json, data, len);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(b.p, 1, b.n, f), b.n);
    fclose(f);
    free(b.p);
}

static void rm_rf(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

START_TEST(hf_layout_with_sharding_info)
{
    /* Two rank files hold the row halves of w (4x3); b is whole in one file. */
    char *dir = hf_dir();
    const char *h1 = "{\"__metadata__\":{\"DCP_SHARDING_INFO\":\"{\\\"w\\\": {\\\"saved_offsets\\\": [0, 0]}}\",\"format\":\"pt\"},"
                     "\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                     "\"b\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[24,32]}}";
    const char *h2 = "{\"__metadata__\":{\"DCP_SHARDING_INFO\":\"{\\\"w\\\": {\\\"saved_offsets\\\": [2, 0]}}\"},"
                     "\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}";
    int64_t bval = 42;
    unsigned char d1[32];
    memcpy(d1, f12, 24);
    memcpy(d1 + 24, &bval, 8);
    hf_write(dir, "shard-00001-model-00001-of-00001.safetensors", h1, d1, 32);
    hf_write(dir, "shard-00002-model-00001-of-00001.safetensors", h2, f12 + 6, 24);
    dcp_checkpoint *ck;
    dcp_error err;
    ck_assert_msg(dcp_open(dir, 0, &ck, &err) == 0, "%s", err.msg);
    ck_assert_str_eq(dcp_get_info(ck)->serialization, "hf_safetensors");
    ck_assert_str_eq(dcp_get_info(ck)->layout, "huggingface");
    ck_assert_ptr_nonnull(strstr(dcp_get_info(ck)->generation, "DCP_SHARDING_INFO"));
    const dcp_entry *w = dcp_find(ck, "w"), *b = dcp_find(ck, "b");
    ck_assert(w && b && w->ndim == 2 && w->shape[0] == 4 && w->shape[1] == 3 && w->nchunks == 2);
    void *buf;
    uint64_t len;
    ck_assert_msg(dcp_read_entry(ck, w, &buf, &len, &err) == 0, "%s", err.msg);
    ck_assert(len == 48 && !memcmp(buf, f12, 48));
    free(buf);
    ck_assert(dcp_read_entry(ck, b, &buf, &len, &err) == 0 && len == 8 && !memcmp(buf, &bval, 8));
    free(buf);
    dcp_close(ck);
    rm_rf(dir);
}
END_TEST

START_TEST(hf_layout_sharded_subfolder)
{
    /* Only sharded/ (a consolidation that failed): the loader reads it. */
    dcp_checkpoint *ck = tck_new();
    char sub[4200];
    snprintf(sub, sizeof sub, "%s/sharded", ck->path);
    ck_assert_int_eq(mkdir(sub, 0755), 0);
    const char *h = "{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}";
    hf_write(sub, "shard-00001-model-00001-of-00001.safetensors", h, f12, 12);
    dcp_error err;
    ck_assert_msg(dcpi_load_huggingface(ck, &err) == 0, "%s", err.msg);
    tck_finish(ck);
    const dcp_entry *w = dcp_find(ck, "w");
    ck_assert_ptr_nonnull(w);
    ck_assert_str_eq(dcp_file_name(ck, chunks_of(ck, w)[0].blob.file), "sharded/shard-00001-model-00001-of-00001.safetensors");
    ck_assert_str_eq(dcp_get_info(ck)->generation, "Hugging Face safetensors");
    void *buf;
    uint64_t len;
    ck_assert_msg(dcp_read_entry(ck, w, &buf, &len, &err) == 0, "%s", err.msg);
    ck_assert(len == 12 && !memcmp(buf, f12, 12));
    free(buf);
    rm_rf(sub);
    tck_free(ck);

    /* Consolidated files beside sharded/ win. */
    char *dir = hf_dir();
    snprintf(sub, sizeof sub, "%s/sharded", dir);
    ck_assert_int_eq(mkdir(sub, 0755), 0);
    hf_write(sub, "shard-00001-model-00001-of-00001.safetensors", h, f12, 12);
    hf_write(dir, "model-00001-of-00001.safetensors", h, f12 + 3, 12);
    ck_assert_msg(dcp_open(dir, 0, &ck, &err) == 0, "%s", err.msg);
    w = dcp_find(ck, "w");
    ck_assert_uint_eq(w->nchunks, 1);
    ck_assert(dcp_read_entry(ck, w, &buf, &len, &err) == 0 && len == 12 && !memcmp(buf, f12 + 3, 12));
    free(buf);
    dcp_close(ck);
    rm_rf(dir);
}
END_TEST

static void hf_open_fails(const void *bytes, size_t n, const char *want)
{
    char *dir = hf_dir();
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(bytes, 1, n, f), n);
    fclose(f);
    dcp_checkpoint *ck;
    dcp_error err;
    ck_assert_int_eq(dcp_open(dir, 0, &ck, &err), -1);
    ck_assert_msg(strstr(err.msg, want) != NULL, "error '%s' lacks '%s'", err.msg, want);
    ck_assert_msg(strstr(err.msg, "model.safetensors") != NULL, "error names no file: %s", err.msg);
    rm_rf(dir);
}

static void hf_header_fails(const char *json, size_t datalen, const char *want)
{
    unsigned char data[64] = {0};
    zb_buf b = st_buffer(json, data, datalen);
    hf_open_fails(b.p, b.n, want);
    free(b.p);
}

START_TEST(hf_layout_errors)
{
    zb_buf b = {0};
    zb_le(&b, 1000, 8);   /* header longer than the file */
    zb_put(&b, "{}", 2);
    hf_open_fails(b.p, b.n, "header length 1000 is out of range");
    b.n = 0;
    zb_le(&b, UINT64_MAX, 8);
    hf_open_fails(b.p, b.n, "out of range");
    hf_open_fails("abc", 3, "too short");
    free(b.p);
    hf_header_fails("{\"w\": [", 0, "bad safetensors header");
    hf_header_fails("{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "bad dtype, shape, offsets");
    hf_header_fails("{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}", 8, "bad dtype, shape, offsets");
    hf_header_fails("{\"w\":{\"dtype\":\"X9\",\"shape\":[3],\"data_offsets\":[0,12]}}", 12, "bad dtype");
    hf_header_fails("{\"w\":{\"dtype\":\"F32\",\"shape\":[-3],\"data_offsets\":[0,0]}}", 0, "bad dtype, shape");
    hf_header_fails("{\"w\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,0]}}", 0,
                    "bad dtype, shape");
    /* 2^61 x 4 floats: 2^65 bytes, which wraps to 0 in 64 bits. */
    hf_header_fails("{\"w\":{\"dtype\":\"F32\",\"shape\":[2305843009213693952,4],\"data_offsets\":[0,0]}}", 0,
                    "bad dtype, shape");
    hf_header_fails("{\"w\":{\"dtype\":\"F32\",\"shape\":[3]}}", 12, "malformed safetensors entry");
    hf_header_fails("{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,"
                    "1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}",
                    4, "malformed safetensors entry");
}
END_TEST

START_TEST(hf_layout_disagreeing_chunks)
{
    char *dir = hf_dir();
    const char *h1 = "{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}";
    const char *h2 = "{\"w\":{\"dtype\":\"F64\",\"shape\":[3],\"data_offsets\":[0,24]}}";
    hf_write(dir, "a.safetensors", h1, f12, 12);
    hf_write(dir, "b.safetensors", h2, f12, 24);
    dcp_checkpoint *ck;
    dcp_error err;
    ck_assert_int_eq(dcp_open(dir, 0, &ck, &err), -1);
    ck_assert_msg(strstr(err.msg, "w: chunks disagree on dtype"), "%s", err.msg);
    rm_rf(dir);
}
END_TEST

int main(void)
{
    const char *top = getenv("top_srcdir");
    snprintf(fixtures, sizeof fixtures, "%s/tests/fixtures", top ? top : "..");
    Suite *s = suite_create("record");
    TCase *f = tcase_create("fixtures");
    tcase_set_timeout(f, 120);
    tcase_add_test(f, fixture_records_match_manifest);
    tcase_add_test(f, fixture_transposed_views);
    suite_add_tcase(s, f);
    TCase *z = tcase_create("torch.save");
    tcase_set_timeout(z, 300);
    tcase_add_test(z, v2_plain_and_strided);
    tcase_add_test(z, v3_untyped_storage);
    tcase_add_test(z, wrappers_and_flags);
    tcase_add_test(z, big_endian_read);
    tcase_add_test(z, dtype_trust_and_sizes);
    tcase_add_test(z, zero_dim_and_empty);
    tcase_add_test(z, hostile_views);
    tcase_add_test(z, hostile_data_pkl);
    tcase_add_test(z, data_pkl_mutations);
    tcase_add_test(z, zstd_record_is_decoded);
    tcase_add_test(z, missing_blob);
    suite_add_tcase(s, z);
    TCase *st = tcase_create("safetensors");
    tcase_set_timeout(st, 120);
    tcase_add_test(st, safetensors_format_shard);
    tcase_add_test(st, safetensors_format_errors);
    tcase_add_test(st, safetensors_many_tensors);
    tcase_add_test(st, raw_chunks);
    tcase_add_test(st, hf_layout_with_sharding_info);
    tcase_add_test(st, hf_layout_sharded_subfolder);
    tcase_add_test(st, hf_layout_errors);
    tcase_add_test(st, hf_layout_disagreeing_chunks);
    suite_add_tcase(s, st);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
