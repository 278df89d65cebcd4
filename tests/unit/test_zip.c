/* Unit tests of the torch.save zip reader (src/zip.c) and blob reads
 * (src/blob.c): the fixtures' real archives against their manifests, archives
 * built byte by byte (zip64, zero-length records, other roots), zstd blobs,
 * and corrupt archives, each of which must give a clear error, never a crash. */
#include "check_quiet.h"
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "internal.h"
#include "planner_ck.h"
#include "zip.h"
#include "zipbuild.h"

/* The chunks of an entry of a parsed model (they stay until dcp_close). */
static const dcp_chunk *chunks_of(dcp_checkpoint *ck, const dcp_entry *e)
{
    const dcp_chunk *c;
    dcp_error err;
    ck_assert_msg(dcp_entry_chunks(ck, e, &c, &err) == 0, "%s", err.msg);
    return c;
}

static char fixtures[4096];

/* A checkpoint over one data file holding `blob` at offset `pre` (after
 * `pre` filler bytes), and the dcp_blob naming it. */
static dcp_checkpoint *one_blob(const void *blob, size_t n, size_t pre, uint32_t transforms, dcp_blob *b)
{
    dcp_checkpoint *ck = tck_new();
    unsigned char *f = malloc(pre + n + 7);
    memset(f, 0xee, pre + n + 7);   /* filler around the blob must never be read */
    memcpy(f + pre, blob, n);
    uint32_t file = tck_file(ck, "__0_0.distcp", f, pre + n + 7);
    free(f);
    tck_finish(ck);
    *b = (dcp_blob){.file = file, .transforms = transforms, .offset = pre, .length = n};
    return ck;
}

/* Open must fail with EIO and a message naming the file, the key and `want`. */
static void open_fails(const zb_buf *z, const char *want)
{
    dcp_blob b;
    dcp_checkpoint *ck = one_blob(z->p, z->n, 100, 0, &b);
    dcpi_zip zip;
    dcp_error err;
    ck_assert_int_eq(dcpi_zip_open(ck, &b, "model.w", &zip, &err), -1);
    ck_assert_int_eq(err.code, EIO);
    ck_assert_msg(strstr(err.msg, want) != NULL, "error '%s' lacks '%s'", err.msg, want);
    ck_assert_msg(strstr(err.msg, "__0_0.distcp: model.w: ") != NULL, "error names no file and key: %s", err.msg);
    tck_free(ck);
}

/* Open succeeds but the record's data start is refused. */
static void data_fails(const zb_buf *z, const char *rec, const char *want)
{
    dcp_blob b;
    dcp_checkpoint *ck = one_blob(z->p, z->n, 0, 0, &b);
    dcpi_zip zip;
    dcp_error err;
    ck_assert_msg(dcpi_zip_open(ck, &b, "k", &zip, &err) == 0, "%s", err.msg);
    const dcpi_zip_entry *ze = dcpi_zip_find(&zip, rec);
    ck_assert_ptr_nonnull(ze);
    uint64_t start;
    ck_assert_int_eq(dcpi_zip_data(ck, &b, "k", ze, z->n, &start, &err), -1);
    ck_assert_msg(strstr(err.msg, want) != NULL, "error '%s' lacks '%s'", err.msg, want);
    dcpi_zip_close(&zip);
    tck_free(ck);
}

static const unsigned char payload[] = "0123456789abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ";

static zb_buf sample(unsigned flags, zb_layout *lay)
{
    zb_rec recs[] = {{"archive/data.pkl", "\x80\x02K\x07.", 5},
                     {"archive/byteorder", "little", 6},
                     {"archive/data/0", payload, sizeof payload},
                     {"archive/data/1", "", 0},
                     {"archive/version", "3\n", 2}};
    return zb_zip(recs, 5, flags, lay);
}

/* Read a record's bytes through the zip reader and compare. */
static void expect_record(dcp_checkpoint *ck, const dcp_blob *b, const dcpi_zip *z, const char *name,
                          const void *want, size_t len)
{
    dcp_error err;
    const dcpi_zip_entry *ze = dcpi_zip_find(z, name);
    ck_assert_msg(ze != NULL, "%s missing", name);
    ck_assert_uint_eq(ze->size, len);
    uint64_t start, blen;
    ck_assert(dcpi_blob_size(ck, b, &blen, "k", &err) == 0);
    ck_assert_msg(dcpi_zip_data(ck, b, "k", ze, blen, &start, &err) == 0, "%s", err.msg);
    ck_assert_uint_eq(start % 64, 0);   /* the builder aligns like torch */
    unsigned char got[256];
    ck_assert(len <= sizeof got);
    ck_assert_msg(dcpi_blob_read(ck, b, got, len, start, "k", &err) == 0, "%s", err.msg);
    ck_assert(!memcmp(got, want, len));
}

/* ------------------------------------------------------------ fixtures */

/* Every chunk of every fixture: the records the manifest lists, at the data
 * offsets it gives (relative to the blob), with their sizes. */
START_TEST(fixture_archives_match_manifest)
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
                json_t *recs = json_object_get(c, "zip_records"), *r;
                if (!recs)
                    continue;
                const dcp_blob *b = &chunks_of(ck, de)[j].blob;
                dcpi_zip z;
                ck_assert_msg(dcpi_zip_open(ck, b, de->key, &z, &err) == 0, "%s", err.msg);
                ck_assert_uint_eq(z.n, json_array_size(recs));
                ck_assert_uint_eq(z.root_len, strlen("archive/"));
                size_t k;
                json_array_foreach(recs, k, r) {
                    const char *name = json_string_value(json_object_get(r, "name"));
                    ck_assert_str_eq(z.entries[k].name, name);   /* directory order */
                    const dcpi_zip_entry *ze = dcpi_zip_find(&z, name + strlen("archive/"));
                    ck_assert_ptr_eq(ze, &z.entries[k]);
                    ck_assert_uint_eq(ze->size, json_integer_value(json_object_get(r, "size")));
                    ck_assert_uint_eq(ze->local_offset, json_integer_value(json_object_get(r, "header_offset")));
                    uint64_t start;
                    ck_assert(dcpi_zip_data(ck, b, de->key, ze, b->length, &start, &err) == 0);
                    ck_assert_uint_eq(start, json_integer_value(json_object_get(r, "data_offset")));
                    checked++;
                }
                dcpi_zip_close(&z);
            }
        }
        json_decref(m);
        dcp_close(ck);
    }
    ck_assert_uint_gt(checked, 150);
}
END_TEST

/* ------------------------------------------------------------ built archives */

START_TEST(built_archive_and_zero_length_record)
{
    zb_buf z = sample(0, NULL);
    dcp_blob b;
    dcp_checkpoint *ck = one_blob(z.p, z.n, 333, 0, &b);
    dcpi_zip zip;
    dcp_error err;
    ck_assert_msg(dcpi_zip_open(ck, &b, "k", &zip, &err) == 0, "%s", err.msg);
    ck_assert_uint_eq(zip.n, 5);
    expect_record(ck, &b, &zip, "data.pkl", "\x80\x02K\x07.", 5);
    expect_record(ck, &b, &zip, "byteorder", "little", 6);
    expect_record(ck, &b, &zip, "data/0", payload, sizeof payload);
    expect_record(ck, &b, &zip, "data/1", "", 0);   /* zero-length records are valid */
    expect_record(ck, &b, &zip, "version", "3\n", 2);
    ck_assert_ptr_null(dcpi_zip_find(&zip, "data/2"));
    ck_assert_ptr_null(dcpi_zip_find(&zip, "archive/data.pkl"));   /* names are below the root */
    ck_assert_ptr_null(dcpi_zip_find(&zip, "data"));
    dcpi_zip_close(&zip);
    tck_free(ck);
    free(z.p);
}
END_TEST

START_TEST(zip64_extra_fields)
{
    zb_layout lay;
    zb_buf z = sample(ZB_ZIP64_EXTRA, &lay);
    /* The classic EOCD says 0xFFFF/0xFFFFFFFF: only the zip64 records count. */
    ck_assert_uint_eq(z.p[lay.eocd + 10], 0xff);
    dcp_blob b;
    dcp_checkpoint *ck = one_blob(z.p, z.n, 5, 0, &b);
    dcpi_zip zip;
    dcp_error err;
    ck_assert_msg(dcpi_zip_open(ck, &b, "k", &zip, &err) == 0, "%s", err.msg);
    ck_assert_uint_eq(zip.n, 5);
    expect_record(ck, &b, &zip, "data/0", payload, sizeof payload);
    expect_record(ck, &b, &zip, "data/1", "", 0);
    expect_record(ck, &b, &zip, "version", "3\n", 2);
    dcpi_zip_close(&zip);
    tck_free(ck);
    free(z.p);
}
END_TEST

START_TEST(classic_eocd_without_zip64)
{
    /* Other zip writers end with a plain EOCD and may add a comment. */
    zb_layout lay;
    zb_buf z = sample(0, &lay);
    zb_buf c = {0};
    zb_put(&c, z.p, lay.z64eocd);
    zb_put(&c, z.p + lay.eocd, 20);
    zb_le(&c, 9, 2);
    zb_put(&c, "a comment", 9);
    dcp_blob b;
    dcp_checkpoint *ck = one_blob(c.p, c.n, 0, 0, &b);
    dcpi_zip zip;
    dcp_error err;
    ck_assert_msg(dcpi_zip_open(ck, &b, "k", &zip, &err) == 0, "%s", err.msg);
    expect_record(ck, &b, &zip, "data/0", payload, sizeof payload);
    dcpi_zip_close(&zip);
    tck_free(ck);
    free(z.p);
    free(c.p);
}
END_TEST

START_TEST(root_from_first_entry)
{
    zb_rec recs[] = {{"mymodel/data.pkl", "\x80\x02K\x07.", 5}, {"mymodel/data/0", payload, 8},
                     {"other/data/1", payload, 4}};
    zb_buf z = zb_zip(recs, 3, 0, NULL);
    dcp_blob b;
    dcp_checkpoint *ck = one_blob(z.p, z.n, 0, 0, &b);
    dcpi_zip zip;
    dcp_error err;
    ck_assert(dcpi_zip_open(ck, &b, "k", &zip, &err) == 0);
    ck_assert_uint_eq(zip.root_len, strlen("mymodel/"));
    expect_record(ck, &b, &zip, "data/0", payload, 8);
    ck_assert_ptr_null(dcpi_zip_find(&zip, "data/1"));   /* under another root */
    dcpi_zip_close(&zip);
    tck_free(ck);
    free(z.p);
}
END_TEST

/* ------------------------------------------------------------ corrupt archives */

START_TEST(corrupt_archives)
{
    zb_layout lay;
    zb_buf z = sample(0, &lay), c = {0};
#define FRESH() (c.n = 0, zb_put(&c, z.p, z.n))

    open_fails(&(zb_buf){(unsigned char *)"PK\3\4short", 10, 0}, "too short for a zip archive");
    /* Truncated EOCD: the last bytes are missing. */
    FRESH();
    c.n -= 10;
    open_fails(&c, "no end-of-central-directory record");
    /* An EOCD whose comment length does not reach the end of the blob. */
    FRESH();
    zb_set_le(c.p + lay.eocd + 20, 5, 2);
    open_fails(&c, "no end-of-central-directory record");
    /* Central directory offset past the directory's end, and before the archive. */
    FRESH();
    zb_set_le(c.p + lay.z64eocd + 48, lay.z64eocd - 10, 8);
    open_fails(&c, "central directory size or offset out of range");
    FRESH();
    zb_set_le(c.p + lay.z64eocd + 48, lay.cd + 1, 8);
    open_fails(&c, "central directory size or offset out of range");   /* now ends past the zip64 record */
    zb_set_le(c.p + lay.z64eocd + 40, lay.cd_size - 1, 8);
    open_fails(&c, "bad central directory entry");
    FRESH();
    zb_set_le(c.p + lay.z64eocd + 40, 1u << 30, 8);
    open_fails(&c, "central directory size or offset out of range");
    /* Absurd entry counts: beyond the limit, or more than the directory holds. */
    FRESH();
    zb_set_le(c.p + lay.z64eocd + 32, 5000000, 8);
    open_fails(&c, "central directory size or offset out of range");
    FRESH();
    zb_set_le(c.p + lay.z64eocd + 32, UINT64_MAX, 8);
    open_fails(&c, "central directory size or offset out of range");
    FRESH();
    zb_set_le(c.p + lay.z64eocd + 32, 0, 8);
    open_fails(&c, "central directory size or offset out of range");
    FRESH();
    zb_set_le(c.p + lay.z64eocd + 32, 6, 8);
    open_fails(&c, "bad central directory entry");
    /* zip64 locator pointing outside, or at something else. */
    FRESH();
    zb_set_le(c.p + lay.locator + 8, z.n + 100, 8);
    open_fails(&c, "zip64 end record outside the archive");
    FRESH();
    zb_set_le(c.p + lay.locator + 8, lay.cd, 8);
    open_fails(&c, "bad zip64 end record");
    /* Entry fields. */
    FRESH();
    zb_set_le(c.p + lay.cdent[2] + 10, 8, 2);   /* deflate */
    open_fails(&c, "compressed record");
    FRESH();
    zb_set_le(c.p + lay.cdent[2] + 8, 0x0809, 2);
    open_fails(&c, "encrypted record");
    FRESH();
    zb_set_le(c.p + lay.cdent[2] + 20, 3, 4);
    open_fails(&c, "different compressed and uncompressed sizes");
    FRESH();
    zb_set_le(c.p + lay.cdent[2] + 20, 0x7fffffff, 4);
    zb_set_le(c.p + lay.cdent[2] + 24, 0x7fffffff, 4);
    open_fails(&c, "record outside the archive");
    FRESH();
    zb_set_le(c.p + lay.cdent[2] + 42, z.n + 1, 4);
    open_fails(&c, "record outside the archive");
    FRESH();
    zb_set_le(c.p + lay.cdent[4] + 28, 0xffff, 2);   /* name runs past the directory */
    open_fails(&c, "runs past the directory");
    FRESH();
    c.p[lay.cdent[1] + 1] = 'X';
    open_fails(&c, "bad central directory entry");
    /* 0xFFFFFFFF sizes with no zip64 extra to resolve them. */
    FRESH();
    zb_set_le(c.p + lay.cdent[2] + 20, 0xffffffffu, 4);
    zb_set_le(c.p + lay.cdent[2] + 24, 0xffffffffu, 4);
    open_fails(&c, "record outside the archive");

    /* Local headers: the directory parses, the record's data does not. */
    FRESH();
    zb_set_le(c.p + lay.cdent[2] + 24, z.n - 10, 4);   /* size past the archive */
    zb_set_le(c.p + lay.cdent[2] + 20, z.n - 10, 4);
    data_fails(&c, "data/0", "record data runs past the archive");
    FRESH();
    c.p[lay.local[2] + 2] = 9;
    data_fails(&c, "data/0", "bad local header signature");
    FRESH();
    zb_set_le(c.p + lay.local[2] + 28, 0xffff, 2);   /* extra length pushes the data out */
    data_fails(&c, "data/0", "record data runs past the archive");
    FRESH();
    zb_set_le(c.p + lay.cdent[4] + 42, z.n - 10, 4);   /* local header straddles the end */
    data_fails(&c, "version", "local header outside the archive");
#undef FRESH
    free(c.p);
    free(z.p);
}
END_TEST

/* Every truncation and every byte flip of a zip64 archive: an error naming
 * the archive, or a directory whose records all lie inside the blob. */
START_TEST(mutations_never_crash)
{
    zb_buf z = sample(ZB_ZIP64_EXTRA, NULL);
    unsigned char *m = malloc(z.n);
    int errors = 0, ok = 0;
    for (size_t i = 0; i <= z.n * 2; i++) {
        size_t n = z.n;
        memcpy(m, z.p, z.n);
        if (i < z.n)
            n = i;                                   /* truncated */
        else if (i - z.n < z.n)
            m[i - z.n] ^= (unsigned char)(0x5a + i); /* flipped */
        else
            continue;
        dcp_blob b;
        dcp_checkpoint *ck = one_blob(m, n, 17, 0, &b);
        dcpi_zip zip;
        dcp_error err;
        if (dcpi_zip_open(ck, &b, "k", &zip, &err) < 0) {
            ck_assert_msg(strstr(err.msg, "torch.save archive") != NULL, "%s", err.msg);
            errors++;
        } else {
            ok++;
            for (size_t k = 0; k < zip.n; k++) {
                uint64_t start;
                if (dcpi_zip_data(ck, &b, "k", &zip.entries[k], n, &start, &err) == 0)
                    ck_assert(start <= n && n - start >= zip.entries[k].size);
            }
            dcpi_zip_close(&zip);
        }
        tck_free(ck);
    }
    ck_assert_int_gt(errors, (int)z.n);   /* every truncation at least */
    ck_assert_int_gt(ok, 10);            /* flips of record data are harmless */
    free(m);
    free(z.p);
}
END_TEST

/* ------------------------------------------------------------ zstd blobs */

static zb_buf zstd_compress(const void *src, size_t n, int with_size, int frames)
{
    zb_buf out = {0};
    ZSTD_CCtx *cc = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(cc, ZSTD_c_contentSizeFlag, with_size);
    size_t per = (n + (size_t)frames - 1) / (size_t)frames;
    for (size_t off = 0; off < n || (n == 0 && out.n == 0); off += per) {
        size_t len = n - off < per ? n - off : per;
        size_t cap = ZSTD_compressBound(len);
        unsigned char *buf = malloc(cap);
        ZSTD_inBuffer in = {(const char *)src + off, len, 0};
        ZSTD_outBuffer o = {buf, cap, 0};
        ck_assert(ZSTD_compressStream2(cc, &o, &in, ZSTD_e_end) == 0);
        zb_put(&out, buf, o.pos);
        free(buf);
        if (n == 0)
            break;
    }
    ZSTD_freeCCtx(cc);
    return out;
}

START_TEST(zstd_archive)
{
    /* The archive inside a zstd stream without a content size, in 3 frames:
     * offsets are relative to the decoded blob. */
    zb_buf z = sample(0, NULL);
    zb_buf c = zstd_compress(z.p, z.n, 0, 3);
    dcp_blob b;
    dcp_checkpoint *ck = one_blob(c.p, c.n, 1000, DCP_TRANSFORM_ZSTD, &b);
    dcp_error err;
    uint64_t size;
    ck_assert_msg(dcpi_blob_size(ck, &b, &size, "k", &err) == 0, "%s", err.msg);
    ck_assert_uint_eq(size, z.n);
    dcpi_zip zip;
    ck_assert_msg(dcpi_zip_open(ck, &b, "k", &zip, &err) == 0, "%s", err.msg);
    expect_record(ck, &b, &zip, "data/0", payload, sizeof payload);
    expect_record(ck, &b, &zip, "data/1", "", 0);
    dcpi_zip_close(&zip);
    unsigned char x[8];
    ck_assert_int_eq(dcpi_blob_read(ck, &b, x, 8, z.n - 7, "k", &err), -1);
    ck_assert_msg(strstr(err.msg, "runs past the decoded blob"), "%s", err.msg);
    tck_free(ck);
    free(c.p);
    free(z.p);
}
END_TEST

START_TEST(zstd_large_and_compressible)
{
    /* 24 MiB of mostly zeros: a tiny blob that inflates far past its
     * compressed size, with and without a content size. */
    size_t n = 24u << 20;
    unsigned char *src = calloc(1, n);
    for (size_t i = 0; i < n; i += 4099)
        src[i] = (unsigned char)i;
    for (int with_size = 0; with_size < 2; with_size++) {
        zb_buf c = zstd_compress(src, n, with_size, 1);
        ck_assert_uint_lt(c.n, n / 100);
        dcp_blob b;
        dcp_checkpoint *ck = one_blob(c.p, c.n, 3, DCP_TRANSFORM_ZSTD, &b);
        dcp_error err;
        uint64_t size;
        ck_assert_msg(dcpi_blob_size(ck, &b, &size, "k", &err) == 0, "%s", err.msg);
        ck_assert_uint_eq(size, n);
        unsigned char *back = malloc(n);
        ck_assert(dcpi_blob_read(ck, &b, back, n, 0, "k", &err) == 0);
        ck_assert(!memcmp(back, src, n));
        free(back);
        tck_free(ck);
        free(c.p);
    }
    free(src);
}
END_TEST

START_TEST(zstd_corrupt)
{
    zb_buf z = sample(0, NULL);
    zb_buf c = zstd_compress(z.p, z.n, 1, 1);
    struct { size_t cut; int flip; const char *want; } cases[] = {
        {c.n - 3, -1, "truncated stream"},
        {0, -1, "empty blob"},
        {c.n, 0, "corrupt zstd blob"},            /* bad magic */
        {c.n, (int)c.n - 2, "corrupt zstd blob"}, /* checksum or block damage */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        unsigned char *m = malloc(c.n);
        memcpy(m, c.p, c.n);
        if (cases[i].flip >= 0)
            m[cases[i].flip] ^= 0xff;
        dcp_blob b;
        dcp_checkpoint *ck = one_blob(m, cases[i].cut, 64, DCP_TRANSFORM_ZSTD, &b);
        dcp_error err;
        uint64_t size;
        int rc = dcpi_blob_size(ck, &b, &size, "model.w", &err);
        if (cases[i].flip == (int)c.n - 2 && rc == 0) {   /* a flip the frame does not detect */
            tck_free(ck);
            free(m);
            continue;
        }
        ck_assert_int_eq(rc, -1);
        ck_assert_int_eq(err.code, EIO);
        ck_assert_msg(strstr(err.msg, cases[i].want) && strstr(err.msg, "__0_0.distcp: model.w: "),
                      "case %zu: '%s' lacks '%s'", i, err.msg, cases[i].want);
        tck_free(ck);
        free(m);
    }
    /* Garbage after a complete frame is not ignored. */
    zb_buf g = {0};
    zb_put(&g, c.p, c.n);
    zb_put(&g, "garbage!", 8);
    dcp_blob b;
    dcp_checkpoint *ck = one_blob(g.p, g.n, 0, DCP_TRANSFORM_ZSTD, &b);
    dcp_error err;
    uint64_t size;
    ck_assert_int_eq(dcpi_blob_size(ck, &b, &size, "k", &err), -1);
    tck_free(ck);
    free(g.p);
    free(c.p);
    free(z.p);
}
END_TEST

/* More zstd blobs than the cache holds, read in turns and from threads:
 * every read returns its own blob's bytes. */
#define NBLOBS 7
typedef struct zctx {
    dcp_checkpoint *ck;
    dcp_blob b[NBLOBS];
    unsigned char *plain[NBLOBS];
    size_t plen[NBLOBS];
    int seed;
} zctx;

static void *zreader(void *arg)
{
    zctx *z = arg;
    unsigned s = (unsigned)z->seed;
    unsigned char buf[512];
    for (int it = 0; it < 300; it++) {
        s = s * 1103515245u + 12345u;
        int k = (int)((s >> 8) % NBLOBS);
        size_t off = (s >> 4) % (z->plen[k] - sizeof buf);
        dcp_error err;
        if (dcpi_blob_read(z->ck, &z->b[k], buf, sizeof buf, off, "k", &err) < 0 ||
            memcmp(buf, z->plain[k] + off, sizeof buf))
            return (void *)1;
    }
    return NULL;
}

START_TEST(zstd_cache_eviction_and_threads)
{
    zctx z = {0};
    zb_buf file = {0};
    for (int k = 0; k < NBLOBS; k++) {
        z.plen[k] = 4096 + (size_t)k * 1000;
        z.plain[k] = malloc(z.plen[k]);
        for (size_t i = 0; i < z.plen[k]; i++)
            z.plain[k][i] = (unsigned char)(i * (size_t)(k + 3) + (size_t)k);
        zb_buf c = zstd_compress(z.plain[k], z.plen[k], k % 2, 1);
        z.b[k] = (dcp_blob){.transforms = DCP_TRANSFORM_ZSTD, .offset = file.n, .length = c.n};
        zb_put(&file, c.p, c.n);
        free(c.p);
    }
    z.ck = tck_new();
    uint32_t f = tck_file(z.ck, "__0_0.distcp", file.p, file.n);
    tck_finish(z.ck);
    for (int k = 0; k < NBLOBS; k++)
        z.b[k].file = f;
    z.seed = 1;
    ck_assert_ptr_null(zreader(&z));
    pthread_t th[4];
    zctx zs[4];
    for (int t = 0; t < 4; t++) {
        zs[t] = z;
        zs[t].seed = 100 + t;
        ck_assert_int_eq(pthread_create(&th[t], NULL, zreader, &zs[t]), 0);
    }
    for (int t = 0; t < 4; t++) {
        void *rv;
        pthread_join(th[t], &rv);
        ck_assert_ptr_null(rv);
    }
    ck_assert_int_eq(dcpi_blob_cached(z.ck), DCPI_DECODED_CACHE);
    tck_free(z.ck);
    for (int k = 0; k < NBLOBS; k++)
        free(z.plain[k]);
    free(file.p);
}
END_TEST

START_TEST(plain_blob_bounds)
{
    dcp_blob b;
    dcp_checkpoint *ck = one_blob(payload, 20, 50, 0, &b);
    dcp_error err;
    unsigned char x[32];
    ck_assert(dcpi_blob_read(ck, &b, x, 20, 0, "k", &err) == 0);
    ck_assert(!memcmp(x, payload, 20));
    ck_assert(dcpi_blob_read(ck, &b, x, 0, 20, "k", &err) == 0);
    ck_assert_int_eq(dcpi_blob_read(ck, &b, x, 1, 20, "k", &err), -1);
    ck_assert_msg(strstr(err.msg, "runs past the blob"), "%s", err.msg);
    ck_assert_int_eq(dcpi_blob_read(ck, &b, x, 2, UINT64_MAX, "k", &err), -1);
    uint64_t size;
    ck_assert(dcpi_blob_size(ck, &b, &size, "k", &err) == 0 && size == 20);
    /* A blob that claims more than the file has: a short read is EIO. */
    b.length = 100;
    ck_assert_int_eq(dcpi_blob_read(ck, &b, x, 30, 60, "k", &err), -1);
    ck_assert_int_eq(err.code, EIO);
    tck_free(ck);
}
END_TEST

int main(void)
{
    const char *top = getenv("top_srcdir");
    snprintf(fixtures, sizeof fixtures, "%s/tests/fixtures", top ? top : "..");
    Suite *s = suite_create("zip");
    TCase *t = tcase_create("zip");
    tcase_set_timeout(t, 300);
    tcase_add_test(t, fixture_archives_match_manifest);
    tcase_add_test(t, built_archive_and_zero_length_record);
    tcase_add_test(t, zip64_extra_fields);
    tcase_add_test(t, classic_eocd_without_zip64);
    tcase_add_test(t, root_from_first_entry);
    tcase_add_test(t, corrupt_archives);
    tcase_add_test(t, mutations_never_crash);
    suite_add_tcase(s, t);
    TCase *b = tcase_create("blob");
    tcase_set_timeout(b, 300);
    tcase_add_test(b, zstd_archive);
    tcase_add_test(b, zstd_large_and_compressible);
    tcase_add_test(b, zstd_corrupt);
    tcase_add_test(b, zstd_cache_eviction_and_threads);
    tcase_add_test(b, plain_blob_bounds);
    suite_add_tcase(s, b);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
