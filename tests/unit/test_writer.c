/* Unit tests of the writers' building blocks: the pickle writer read back by
 * the restricted pickle reader (both protocols, memo references, batches,
 * frames past 64 KiB, big integers, bytes), the zip writer read back by the
 * record locator's zip reader (alignment, sizes, empty records), and the DCP
 * writer's output read back by dcp_open / dcp_read_entry. */
#include "check_quiet.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "dcp_write.h"
#include "internal.h"
#include "pickle.h"
#include "write/atomic.h"
#include "write/pickle_write.h"
#include "zip.h"
#include "write/zip_write.h"

static char tmpdir[256];

static void setup(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dcp-test-writer.XXXXXX");
    ck_assert(mkdtemp(tmpdir) != NULL);
}

static void teardown(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    ck_assert(system(cmd) == 0);
}

static void check_roundtrip(int proto)
{
    pw w;
    pw_init(&w, proto, -1, "test");
    pw_dict_begin(&w);
    pw_dict_key(&w);
    pw_cstr(&w, "ints");
    pw_list_begin(&w);
    const int64_t vals[] = {0, 1, 255, 256, 65535, 65536, -1, -129, INT32_MAX, INT32_MIN, (int64_t)1 << 40,
                            INT64_MIN, INT64_MAX};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
        pw_list_elem(&w);
        pw_int(&w, vals[i]);
    }
    pw_list_end(&w);
    pw_dict_key(&w);
    pw_cstr(&w, "shared");
    pw_tuple_begin(&w, 5);
    for (int i = 0; i < 5; i++)
        pw_cstr(&w, "same");                 /* memo references after the first */
    pw_tuple_end(&w, 5);
    pw_dict_key(&w);
    pw_cstr(&w, "bytes");
    const unsigned char raw[] = {0, 0x7f, 0x80, 0xff, 'P', 'K'};
    pw_bytes(&w, raw, sizeof raw);
    /* 2500 items: three SETITEMS batches, and (protocol 4) more than one frame. */
    pw_dict_key(&w);
    pw_cstr(&w, "big");
    pw_dict_begin(&w);
    char k[48];
    for (int i = 0; i < 2500; i++) {
        pw_dict_key(&w);
        snprintf(k, sizeof k, "key.%04d.with.a.longer.name", i);
        pw_str(&w, k, strlen(k));
        pw_int(&w, i);
    }
    pw_dict_end(&w);
    pw_dict_key(&w);
    pw_cstr(&w, "one");
    pw_list_begin(&w);
    pw_list_elem(&w);
    pw_none(&w);
    pw_list_end(&w);
    pw_dict_end(&w);
    dcp_error err;
    ck_assert_msg(pw_finish(&w, &err) == 0, "%s", err.msg);

    pk_doc *doc;
    const pk_node *root;
    ck_assert_msg(pk_parse(w.buf, w.len, "test", &doc, &root, &err) == 0, "%s", err.msg);
    ck_assert_int_eq(root->type, PK_DICT);
    const pk_node *ints = pk_dict_get(root, "ints");
    ck_assert_uint_eq(pk_len(ints), sizeof vals / sizeof vals[0]);
    for (size_t i = 0; i < pk_len(ints); i++) {
        int64_t v;
        ck_assert(pk_int(pk_item(ints, i), &v));
        ck_assert_int_eq(v, vals[i]);
    }
    const pk_node *sh = pk_dict_get(root, "shared");
    ck_assert_uint_eq(pk_len(sh), 5);
    for (int i = 0; i < 5; i++) {
        const char *s;
        size_t n;
        ck_assert(pk_str(pk_item(sh, (size_t)i), &s, &n));
        ck_assert(n == 4 && !memcmp(s, "same", 4));
    }
    const pk_node *b = pk_dict_get(root, "bytes");
    if (proto >= 4) {
        ck_assert_int_eq(b->type, PK_BYTES);
        ck_assert(b->u.s.len == sizeof raw && !memcmp(b->u.s.p, raw, sizeof raw));
    } else {
        /* _codecs.encode(text, 'latin1'): the text's code points are the bytes. */
        ck_assert(pk_is_global(pk_call_global(b), "_codecs", "encode"));
        const char *text, *enc;
        size_t tl;
        ck_assert(pk_str(pk_item(b->u.call.args, 0), &text, &tl));
        ck_assert(pk_str(pk_item(b->u.call.args, 1), &enc, NULL) && !strcmp(enc, "latin1"));
        unsigned char dec[16];
        size_t dn = 0;
        for (size_t i = 0; i < tl && dn < sizeof dec; i++) {
            unsigned char ch = (unsigned char)text[i];
            if (ch < 0x80) {
                dec[dn++] = ch;
            } else {
                ck_assert(ch == 0xc2 || ch == 0xc3);
                ck_assert(i + 1 < tl);
                dec[dn++] = (unsigned char)(((ch & 3) << 6) | ((unsigned char)text[++i] & 0x3f));
            }
        }
        ck_assert(dn == sizeof raw && !memcmp(dec, raw, sizeof raw));
    }
    ck_assert_uint_eq(pk_len(pk_dict_get(root, "big")), 2500);
    ck_assert_uint_eq(pk_len(pk_dict_get(root, "one")), 1);
    pk_free(doc);
    if (proto >= 4)
        ck_assert_msg(memchr(w.buf, 0x95, 16) != NULL, "protocol 4 output is framed");
    pw_free(&w);
}

START_TEST(pickle_proto2) { check_roundtrip(2); }
END_TEST

START_TEST(pickle_proto4) { check_roundtrip(4); }
END_TEST

START_TEST(pickle_tensor)
{
    pw w;
    pw_init(&w, 2, -1, "test");
    const int64_t shape[] = {3, 2, 5};
    pw_torch_tensor(&w, DCP_FLOAT8_E4M3FN, 3, shape, "7");
    dcp_error err;
    ck_assert(pw_finish(&w, &err) == 0);
    pk_doc *doc;
    const pk_node *root;
    ck_assert(pk_parse(w.buf, w.len, "test", &doc, &root, &err) == 0);
    ck_assert(pk_is_global(pk_call_global(root), "torch._utils", "_rebuild_tensor_v3"));
    const pk_node *args = root->u.call.args, *stride = pk_item(args, 3);
    int64_t v;
    ck_assert(pk_int(pk_item(stride, 0), &v) && v == 10);
    ck_assert(pk_int(pk_item(stride, 1), &v) && v == 5);
    ck_assert(pk_int(pk_item(stride, 2), &v) && v == 1);
    ck_assert(pk_is_global(pk_item(args, 6), "torch", "float8_e4m3fn"));
    /* The shared parser reads it back: UntypedStorage counts bytes, 30 here. */
    dcpi_rebuild rb;
    char why[256];
    ck_assert_msg(dcpi_torch_rebuild_parse(root, &rb, why, sizeof why) == 0, "%s", why);
    ck_assert_uint_eq(rb.storage_bytes, 30);
    ck_assert(rb.dtype == DCP_FLOAT8_E4M3FN && rb.ndim == 3 && rb.storage_key_len == 1 && rb.storage_key[0] == '7');
    ck_assert(dcpi_torch_rebuild_check_view(&rb, why, sizeof why) == 0);
    pk_free(doc);
    pw_free(&w);

    /* A typed storage counts elements; an empty dimension keeps torch's max(size, 1) strides. */
    pw_init(&w, 2, -1, "test");
    const int64_t empty[] = {3, 0, 5};
    pw_torch_tensor(&w, DCP_FLOAT32, 3, empty, "0");
    ck_assert(pw_finish(&w, &err) == 0);
    ck_assert(pk_parse(w.buf, w.len, "test", &doc, &root, &err) == 0);
    ck_assert(dcpi_torch_rebuild_parse(root, &rb, why, sizeof why) == 0);
    ck_assert(rb.storage_bytes == 0 && rb.stride[0] == 5 && rb.stride[1] == 5);
    pk_free(doc);
    pw_free(&w);
}
END_TEST

/* A zip written by zw_* is read back by the record locator's reader; every
 * record's data starts at a multiple of 64 from the archive start. */
START_TEST(zip_roundtrip)
{
    char path[300];
    snprintf(path, sizeof path, "%s/z.bin", tmpdir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ck_assert(fd >= 0);
    dcp_error err;
    zw_out o;
    ck_assert(zw_out_init(&o, fd, 0, path, &err) == 0);
    ck_assert(zw_out_write(&o, "prefix!", 7, &err) == 0);   /* the archive starts mid-file */
    zw z;
    ck_assert(zw_begin(&z, &o, "archive", &err) == 0);
    ck_assert(zw_torch_prologue(&z, "\x80\x02N.", 4, &err) == 0);
    unsigned char big[100000];
    for (size_t i = 0; i < sizeof big; i++)
        big[i] = (unsigned char)(i * 7);
    ck_assert(zw_record(&z, "data/0", big, sizeof big, &err) == 0);
    ck_assert(zw_record(&z, "data/1", NULL, 0, &err) == 0);
    uint64_t len;
    ck_assert(zw_finish(&z, &len, &err) == 0);
    ck_assert(zw_out_flush(&o, &err) == 0);
    zw_free(&z);
    zw_out_free(&o);
    close(fd);

    /* Walk the central directory by hand: names, sizes, 64-byte alignment. */
    size_t n;
    FILE *f = fopen(path, "rb");
    ck_assert(f != NULL);
    unsigned char *b = malloc(200000);
    n = fread(b, 1, 200000, f);
    fclose(f);
    ck_assert_uint_eq(n, 7 + len);
    const unsigned char *a = b + 7, *eocd = a + len - 22;
    ck_assert(!memcmp(eocd, "PK\5\6", 4));
    ck_assert(!memcmp(eocd - 20, "PK\6\7", 4));     /* zip64 locator, always */
    uint32_t cdofs = (uint32_t)(eocd[16] | eocd[17] << 8 | eocd[18] << 16 | (uint32_t)eocd[19] << 24);
    unsigned nent = eocd[10] | eocd[11] << 8;
    ck_assert_uint_eq(nent, 8);   /* data.pkl, 3 prologue records, data/0, data/1, version, serialization_id */
    const unsigned char *p = a + cdofs;
    int saw_big = 0, saw_empty = 0;
    for (unsigned i = 0; i < nent; i++) {
        ck_assert(!memcmp(p, "PK\1\2", 4));
        uint32_t size = (uint32_t)(p[24] | p[25] << 8 | p[26] << 16 | (uint32_t)p[27] << 24);
        unsigned nl = p[28] | p[29] << 8, xl = p[30] | p[31] << 8, cl = p[32] | p[33] << 8;
        uint32_t lofs = (uint32_t)(p[42] | p[43] << 8 | p[44] << 16 | (uint32_t)p[45] << 24);
        const unsigned char *lh = a + lofs;
        ck_assert(!memcmp(lh, "PK\3\4", 4));
        size_t dstart = lofs + 30 + (size_t)(lh[26] | lh[27] << 8) + (size_t)(lh[28] | lh[29] << 8);
        ck_assert_msg(dstart % 64 == 0, "record %u data at %zu", i, dstart);
        if (nl == 14 && !memcmp(p + 46, "archive/data/0", 14)) {
            ck_assert(size == sizeof big && !memcmp(a + dstart, big, sizeof big));
            saw_big = 1;
        }
        if (nl == 14 && !memcmp(p + 46, "archive/data/1", 14)) {
            ck_assert(size == 0 && (p[8] | p[9] << 8) == 0x0800);   /* no data descriptor */
            saw_empty = 1;
        }
        p += 46 + nl + xl + cl;
    }
    ck_assert(saw_big && saw_empty);
    free(b);
}
END_TEST

static int mem_fill(void *ctx, uint64_t tag, uint64_t off, void *buf, size_t len, dcp_error *err)
{
    (void)tag;
    (void)err;
    memcpy(buf, (const unsigned char *)ctx + off, len);
    return 0;
}

static int fill_two(void *ctx, uint64_t tag, uint64_t off, void *buf, size_t len, dcp_error *err)
{
    (void)err;
    memcpy(buf, ((unsigned char **)ctx)[tag] + off, len);
    return 0;
}

/* zw_crc32 (libdeflate when built with it) gives zlib's values, at every
 * length and alignment. */
START_TEST(crc_matches_zlib)
{
    static unsigned char b[70000];
    for (size_t i = 0; i < sizeof b; i++)
        b[i] = (unsigned char)(i * 131 + (i >> 7));
    const size_t lens[] = {0, 1, 3, 15, 16, 63, 64, 65, 255, 4096, 65535, 69000};
    for (size_t a = 0; a < 17; a++)
        for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++) {
            uint32_t want = (uint32_t)crc32(crc32(0, Z_NULL, 0), b + a, (uInt)lens[l]);
            ck_assert_uint_eq(zw_crc32(0, b + a, lens[l]), want);
            /* in two parts, as records are written piece by piece */
            size_t h = lens[l] / 3;
            ck_assert_uint_eq(zw_crc32(zw_crc32(0, b + a, h), b + a + h, lens[l] - h), want);
        }
}
END_TEST

/* ---- zw_pump's paths: kernel copy, read+write, recorded CRCs, fallbacks. */

#define RUN_LEN 300000u                   /* past KERNEL_MIN */
#define BIG_LEN (5u << 20)                /* past THREAD_MIN: CRC on a second thread */
static size_t run_len = RUN_LEN;
static uint64_t fail_at = UINT64_MAX;     /* file_fill fails at this item offset */

typedef struct file_src {
    int fd;
    uint64_t base;                        /* the item's first byte in the file */
    int has_crc;
    uint32_t crc;                         /* recorded for the whole item */
    uint64_t split;                       /* when set: only [split, end) is a run, with CRC crc */
} file_src;
static uint64_t split_at;                 /* file_src.split for pump_case */

static int file_fill(void *ctx, uint64_t tag, uint64_t off, void *buf, size_t len, dcp_error *err)
{
    (void)tag;
    file_src *f = ctx;
    if (off <= fail_at && fail_at < off + len)
        return dcpi_err(err, EIO, "injected read error");
    ssize_t r = pread(f->fd, buf, len, (off_t)(f->base + off));
    return r == (ssize_t)len ? 0 : dcpi_err(err, EIO, "short read");
}

static int file_range(void *ctx, uint64_t tag, uint64_t off, uint64_t len, dcp_run *run, dcp_error *err)
{
    (void)tag;
    (void)err;
    file_src *f = ctx;
    if (f->split && off < f->split) {   /* a head without recorded CRC */
        *run = (dcp_run){.fd = f->fd, .offset = f->base + off, .length = f->split - off};
        return 1;
    }
    /* the recorded CRC covers the whole item (or tail) only */
    *run = (dcp_run){.fd = f->fd, .offset = f->base + off, .length = len,
                     .has_crc = f->has_crc && off == f->split, .crc = f->crc};
    return 1;
}

enum { CFR_REAL, CFR_EXDEV, CFR_ENOSYS, CFR_PARTIAL, CFR_EOF };
static int cfr_mode, cfr_calls;
static ssize_t cfr_stub(int in, loff_t *ioff, int out, loff_t *ooff, size_t len, unsigned flags)
{
    cfr_calls++;
    switch (cfr_mode) {
    case CFR_EXDEV: errno = EXDEV; return -1;
    case CFR_ENOSYS: errno = ENOSYS; return -1;
    case CFR_EOF: return 0;
    case CFR_PARTIAL:   /* 70000 bytes, then the kernel refuses */
        if (cfr_calls > 1) {
            errno = EXDEV;
            return -1;
        }
        return copy_file_range(in, ioff, out, ooff, len < 70000 ? len : 70000, flags);
    default: return copy_file_range(in, ioff, out, ooff, len, flags);
    }
}

/* Pump RUN_LEN bytes into archive/data/0 of a new archive, the source lying
 * in a file at the output's page offset (aligned) or 100 bytes off; read the
 * archive back and return the record's CRC from the central directory after
 * checking its bytes. *rc gets zw_pump's result (the archive is then not read). */
static uint32_t pump_case(int aligned, int no_crc, int has_crc, uint32_t recorded, int mode, int *rc,
                          char *msg, size_t msglen)
{
    static unsigned char data[BIG_LEN];
    for (size_t i = 0; i < run_len; i++)
        data[i] = (unsigned char)((i * 2654435761u) >> 13);
    char out[300], in[300];
    snprintf(out, sizeof out, "%s/pump.zip", tmpdir);
    snprintf(in, sizeof in, "%s/pump.src", tmpdir);
    int fd = open(out, O_RDWR | O_CREAT | O_TRUNC, 0644);
    ck_assert(fd >= 0);
    dcp_error err;
    zw_out o;
    zw z;
    ck_assert(zw_out_init(&o, fd, 0, out, &err) == 0);
    ck_assert(zw_begin(&z, &o, "archive", &err) == 0);
    z.no_crc = no_crc;
    ck_assert(zw_torch_prologue(&z, "\x80\x02N.", 4, &err) == 0);
    ck_assert(zw_record_begin(&z, "data/0", run_len, &err) == 0);
    file_src fs = {.base = 8192 + o.pos % 4096 + (aligned ? 0 : 100), .has_crc = has_crc, .crc = recorded,
                   .split = split_at};
    fs.fd = open(in, O_RDWR | O_CREAT | O_TRUNC, 0644);
    ck_assert(fs.fd >= 0);
    ck_assert(pwrite(fs.fd, data, run_len, (off_t)fs.base) == (ssize_t)run_len);
    dcp_source src = {.fill = file_fill, .range = file_range, .ctx = &fs};
    void *piece = malloc(1 << 16);
    cfr_mode = mode;
    cfr_calls = 0;
    zw_copy_file_range = cfr_stub;
    *rc = zw_pump(&o, &z, &src, 0, run_len, piece, 1 << 16, NULL, 0, NULL, NULL, &err);
    zw_copy_file_range = copy_file_range;
    if (*rc < 0)
        snprintf(msg, msglen, "%s", err.msg);
    uint32_t crc = 0;
    if (*rc == 0) {
        ck_assert(zw_record_end(&z, &err) == 0);
        uint64_t len;
        ck_assert(zw_finish(&z, &len, &err) == 0);
        ck_assert(zw_out_flush(&o, &err) == 0);
        unsigned char *a = malloc(len);
        ck_assert(pread(fd, a, len, 0) == (ssize_t)len);
        const unsigned char *eocd = a + len - 22;
        uint32_t cdofs = (uint32_t)(eocd[16] | eocd[17] << 8 | eocd[18] << 16 | (uint32_t)eocd[19] << 24);
        unsigned nent = eocd[10] | eocd[11] << 8;
        const unsigned char *p = a + cdofs;
        int seen = 0;
        for (unsigned i = 0; i < nent; i++) {
            unsigned nl = p[28] | p[29] << 8, xl = p[30] | p[31] << 8, cl = p[32] | p[33] << 8;
            if (nl == 14 && !memcmp(p + 46, "archive/data/0", 14)) {
                uint32_t lofs = (uint32_t)(p[42] | p[43] << 8 | p[44] << 16 | (uint32_t)p[45] << 24);
                const unsigned char *lh = a + lofs;
                size_t dstart = lofs + 30 + (size_t)(lh[26] | lh[27] << 8) + (size_t)(lh[28] | lh[29] << 8);
                ck_assert(!memcmp(a + dstart, data, run_len));
                ck_assert(!memcmp(a + dstart + run_len, "PK\7\10", 4));   /* descriptor: same CRC */
                crc = (uint32_t)(p[16] | p[17] << 8 | p[18] << 16 | (uint32_t)p[19] << 24);
                ck_assert(!memcmp(a + dstart + run_len + 4, p + 16, 4));
                seen = 1;
            }
            p += 46 + nl + xl + cl;
        }
        ck_assert(seen);
        free(a);
    }
    zw_free(&z);
    zw_out_free(&o);
    free(piece);
    close(fs.fd);
    close(fd);
    return crc;
}

START_TEST(pump_paths)
{
    int rc;
    char msg[sizeof ((dcp_error *)0)->msg] = "";
    /* the CRC every correct path must produce */
    static unsigned char d2[RUN_LEN];
    for (size_t i = 0; i < sizeof d2; i++)
        d2[i] = (unsigned char)((i * 2654435761u) >> 13);
    uint32_t want = (uint32_t)crc32(crc32(0, Z_NULL, 0), d2, RUN_LEN);

    /* No recorded CRC: every byte is read for it; no kernel copy. */
    ck_assert_uint_eq(pump_case(1, 0, 0, 0, CFR_REAL, &rc, msg, sizeof msg), want);
    ck_assert_int_eq(rc, 0);
    ck_assert_int_eq(cfr_calls, 0);
    /* A recorded CRC, page offsets agreeing: copied in the kernel, CRC taken over. */
    ck_assert_uint_eq(pump_case(1, 0, 1, want, CFR_REAL, &rc, msg, sizeof msg), want);
    ck_assert_int_gt(cfr_calls, 0);
    /* ... disagreeing: read and written (faster than a split kernel copy), CRC still taken over. */
    ck_assert_uint_eq(pump_case(0, 0, 1, want, CFR_REAL, &rc, msg, sizeof msg), want);
    ck_assert_int_eq(cfr_calls, 0);
    /* The source's recorded CRC is carried, not recomputed (a bad one stays detectable). */
    ck_assert_uint_eq(pump_case(1, 0, 1, 0x12345678u, CFR_REAL, &rc, msg, sizeof msg), 0x12345678u);
    ck_assert_uint_eq(pump_case(0, 0, 1, 0x12345678u, CFR_REAL, &rc, msg, sizeof msg), 0x12345678u);
    /* The kernel cannot copy between these files: read and write instead. */
    ck_assert_uint_eq(pump_case(1, 0, 1, want, CFR_EXDEV, &rc, msg, sizeof msg), want);
    ck_assert_int_eq(cfr_calls, 1);
    ck_assert_uint_eq(pump_case(1, 0, 1, want, CFR_ENOSYS, &rc, msg, sizeof msg), want);
    ck_assert_int_eq(cfr_calls, 1);
    ck_assert_uint_eq(pump_case(1, 1, 0, 0, CFR_EXDEV, &rc, msg, sizeof msg), 0);   /* --no-crc: CRC 0 */
    ck_assert_int_eq(rc, 0);
    /* ... after copying part: the CRC of the whole is computed, not taken over. */
    ck_assert_uint_eq(pump_case(1, 0, 1, 0x12345678u, CFR_PARTIAL, &rc, msg, sizeof msg), want);
    ck_assert_int_eq(cfr_calls, 2);
    ck_assert_uint_eq(pump_case(1, 1, 0, 0, CFR_PARTIAL, &rc, msg, sizeof msg), 0);
    ck_assert_int_eq(rc, 0);
    /* No CRC wanted: the kernel copies. */
    ck_assert_uint_eq(pump_case(1, 1, 0, 0, CFR_REAL, &rc, msg, sizeof msg), 0);
    ck_assert_int_gt(cfr_calls, 0);
    /* A source that ends early is an error naming the file. */
    pump_case(1, 1, 0, 0, CFR_EOF, &rc, msg, sizeof msg);
    ck_assert_int_eq(rc, -1);
    ck_assert_msg(strstr(msg, "pump.zip") && strstr(msg, "ends early"), "%s", msg);

    /* A large record whose CRC is computed: on the second thread, same CRC. */
    static unsigned char d3[BIG_LEN];
    for (size_t i = 0; i < sizeof d3; i++)
        d3[i] = (unsigned char)((i * 2654435761u) >> 13);
    uint32_t want_big = (uint32_t)crc32(crc32(0, Z_NULL, 0), d3, BIG_LEN);
    run_len = BIG_LEN;
    ck_assert_uint_eq(pump_case(0, 0, 0, 0, CFR_REAL, &rc, msg, sizeof msg), want_big);
    ck_assert_int_eq(rc, 0);
    /* ... then a run with a recorded CRC: the thread hands its CRC back before they combine */
    split_at = 2u << 20;
    uint32_t tail = (uint32_t)crc32(crc32(0, Z_NULL, 0), d3 + split_at, (uInt)(BIG_LEN - split_at));
    ck_assert_uint_eq(pump_case(1, 0, 1, tail, CFR_REAL, &rc, msg, sizeof msg), want_big);
    ck_assert_int_eq(rc, 0);
    ck_assert_int_gt(cfr_calls, 0);
    split_at = 0;
    /* ... and a read error part way: reported, the thread stopped (no leak under ASan). */
    fail_at = 3u << 20;
    pump_case(0, 0, 0, 0, CFR_REAL, &rc, msg, sizeof msg);
    fail_at = UINT64_MAX;
    run_len = RUN_LEN;
    ck_assert_int_eq(rc, -1);
    ck_assert_msg(strstr(msg, "injected read error"), "%s", msg);
}
END_TEST

/* The DCP writer's output opens with libdcp and reads back byte-exact;
 * replicas are written once; .metadata appears only at finish. */
START_TEST(dcp_writer_roundtrip)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/ck", tmpdir);
    dcp_error err;
    dcp_ckpt_writer *w;
    ck_assert_msg(dcp_ckpt_create(dir, NULL, &w, &err) == 0, "%s", err.msg);
    const int64_t shape[] = {4, 6};
    ck_assert(dcp_ckpt_add_tensor(w, "a.w", DCP_INT16, 2, shape, &err) == 0);
    int16_t data[24];
    for (int i = 0; i < 24; i++)
        data[i] = (int16_t)(i * 1000 - 7);
    /* Two column halves from two ranks: each chunk's own C order. */
    int16_t half[2][12];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 6; c++)
            half[c / 3][r * 3 + c % 3] = data[r * 6 + c];
    const int64_t o0[] = {0, 0}, o1[] = {0, 3}, sz[] = {4, 3};
    dcp_source s0 = {.fill = mem_fill, .ctx = half[0]}, s1 = {.fill = mem_fill, .ctx = half[1]};
    int written;
    ck_assert(dcp_ckpt_add_chunk(w, "a.w", 0, o0, sz, &s0, 0, &written, &err) == 0 && written);
    ck_assert(dcp_ckpt_add_chunk(w, "a.w", 1, o1, sz, &s1, 0, &written, &err) == 0 && written);
    ck_assert(dcp_ckpt_add_chunk(w, "a.w", 1, o0, sz, &s0, 0, &written, &err) == 0 && !written);
    const int64_t none[1] = {0};
    ck_assert(dcp_ckpt_add_tensor(w, "scalar", DCP_FLOAT64, 0, none, &err) == 0);
    double pi = 3.25;
    dcp_source sp = {.fill = mem_fill, .ctx = &pi};
    ck_assert(dcp_ckpt_add_chunk(w, "scalar", 1, NULL, NULL, &sp, 0, NULL, &err) == 0);
    struct stat st;
    char meta[400];
    snprintf(meta, sizeof meta, "%s/.metadata", dir);
    ck_assert(stat(meta, &st) < 0);
    ck_assert_msg(dcp_ckpt_finish(w, &err) == 0, "%s", err.msg);
    dcp_ckpt_free(w);
    ck_assert(stat(meta, &st) == 0);

    dcp_checkpoint *ck;
    ck_assert_msg(dcp_open(dir, 0, &ck, &err) == 0, "%s", err.msg);
    const dcp_entry *e = dcp_find(ck, "a.w");
    ck_assert(e && e->nchunks == 2 && e->dtype == DCP_INT16);
    void *buf;
    uint64_t len;
    ck_assert(dcp_read_entry(ck, e, &buf, &len, &err) == 0);
    ck_assert(len == sizeof data && !memcmp(buf, data, sizeof data));
    free(buf);
    e = dcp_find(ck, "scalar");
    ck_assert(e && e->ndim == 0);
    ck_assert(dcp_read_entry(ck, e, &buf, &len, &err) == 0);
    ck_assert(len == 8 && !memcmp(buf, &pi, 8));
    free(buf);

    /* The virtual safetensors view, read in odd pieces, equals the file
     * dcp_write_safetensors writes for the same tensors. */
    dcp_st_view *v;
    ck_assert_msg(dcp_st_view_build(ck, NULL, NULL, &v, &err) == 0, "%s", err.msg);
    ck_assert_uint_eq(v->ntensors, 2);
    unsigned char *img = malloc(v->size + 16);
    dcp_plan plan;
    dcp_plan_init(&plan);
    for (uint64_t off = 0; off < v->size + 10; off += 7) {
        size_t got;
        ck_assert_msg(dcp_st_view_read(ck, v, off, img + (off < v->size ? off : v->size), 7, &got, &plan, &err) == 0,
                      "%s", err.msg);
        ck_assert_uint_eq(got, off >= v->size ? 0 : (v->size - off < 7 ? v->size - off : 7));
    }
    dcp_plan_free(&plan);
    dcp_item items[2];
    for (size_t i = 0; i < 2; i++) {
        const dcp_entry *te = v->tensors[i].entry;
        items[i] = (dcp_item){.key = te->key, .kind = te->kind, .dtype = te->dtype, .ndim = te->ndim,
                              .shape = te->shape, .nbytes = v->tensors[i].length, .tag = i};
    }
    unsigned char *tensor_bytes[2];
    for (size_t i = 0; i < 2; i++)
        ck_assert(dcp_read_entry(ck, v->tensors[i].entry, (void **)&tensor_bytes[i], &len, &err) == 0);
    char stp[400];
    snprintf(stp, sizeof stp, "%s/x.safetensors", tmpdir);
    dcp_source src = {.fill = fill_two, .ctx = tensor_bytes};
    ck_assert_msg(dcp_write_safetensors(stp, items, 2, DCP_WRITE_NO_SYNC, &src, NULL, NULL, &err) == 0, "%s", err.msg);
    FILE *f = fopen(stp, "rb");
    unsigned char *file = malloc(v->size + 1);
    ck_assert(fread(file, 1, v->size + 1, f) == v->size);
    fclose(f);
    ck_assert(!memcmp(file, img, v->size));
    free(file);
    free(img);
    free(tensor_bytes[0]);
    free(tensor_bytes[1]);
    dcp_st_view_free(v);
    dcp_close(ck);
}
END_TEST

/* Coverage is checked at finish, and a checkpoint folder is never reused. */
START_TEST(dcp_writer_errors)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/bad", tmpdir);
    dcp_error err;
    dcp_ckpt_writer *w;
    ck_assert(dcp_ckpt_create(dir, NULL, &w, &err) == 0);
    const int64_t shape[] = {4}, off[] = {0}, sz[] = {2}, out[] = {3};
    char zeros[16] = {0};
    dcp_source s = {.fill = mem_fill, .ctx = zeros};
    ck_assert(dcp_ckpt_add_tensor(w, "t", DCP_FLOAT32, 1, shape, &err) == 0);
    ck_assert(dcp_ckpt_add_tensor(w, "t", DCP_FLOAT32, 1, shape, &err) < 0);
    ck_assert(strstr(err.msg, "declared twice"));
    /* A shape its chunks' pickles could not hold is refused when declared,
     * named: contiguous strides past int64 (torch.empty refuses it too), a 0
     * in front or not; [0, INT64_MAX] is torch's (strides fit) and declared. */
    const int64_t wide[] = {0, INT64_MAX, 2}, empty[] = {0, INT64_MAX};
    ck_assert(dcp_ckpt_add_tensor(w, "wide", DCP_INT8, 3, wide, &err) < 0);
    ck_assert_msg(strstr(err.msg, "/bad: wide: shape [0,9223372036854775807,2]: too large"), "%s", err.msg);
    ck_assert_msg(dcp_ckpt_add_tensor(w, "empty", DCP_FLOAT64, 2, empty, &err) == 0, "%s", err.msg);
    ck_assert(dcp_ckpt_add_chunk(w, "t", 0, out, sz, &s, 0, NULL, &err) < 0);
    ck_assert(strstr(err.msg, "outside"));
    ck_assert(dcp_ckpt_add_chunk(w, "t", 0, off, sz, &s, 0, NULL, &err) == 0);
    ck_assert(dcp_ckpt_finish(w, &err) < 0);
    ck_assert_msg(strstr(err.msg, "t: chunks hold 2 elements"), "%s", err.msg);
    dcp_ckpt_free(w);
    char meta[400];
    struct stat st;
    snprintf(meta, sizeof meta, "%s/.metadata", dir);
    ck_assert(stat(meta, &st) < 0);
    /* The abandoned folder holds __0_0.distcp: it is not written into again. */
    char data[400];
    snprintf(data, sizeof data, "%s/__0_0.distcp", dir);
    ck_assert(stat(data, &st) == 0);
    off_t size = st.st_size;
    ck_assert(dcp_ckpt_create(dir, NULL, &w, &err) < 0 && w == NULL);
    ck_assert_msg(strstr(err.msg, "not empty") && strstr(err.msg, "__0_0.distcp"), "%s", err.msg);
    ck_assert(stat(data, &st) == 0 && st.st_size == size);
}
END_TEST

/* A stop asked for while the data files were synced or .metadata written
 * (a signal to dcp synth or convert) is honoured just before the rename:
 * ECANCELED, neither .metadata nor .metadata.tmp; the writer then finishes
 * or is discarded as after any failure. (The public dcp_ckpt_finish has no
 * flag: it finished regardless, and synth exited 0.) */
START_TEST(dcp_writer_cancel_at_finish)
{
    for (int discard = 0; discard < 2; discard++) {
        char dir[300], meta[400], tmp[400], data[400];
        snprintf(dir, sizeof dir, "%s/cancel%d", tmpdir, discard);
        snprintf(meta, sizeof meta, "%s/.metadata", dir);
        snprintf(tmp, sizeof tmp, "%s/.metadata.tmp", dir);
        snprintf(data, sizeof data, "%s/__0_0.distcp", dir);
        dcp_error err;
        dcp_ckpt_writer *w;
        ck_assert(dcp_ckpt_create(dir, NULL, &w, &err) == 0);
        const int64_t shape[] = {4}, off[] = {0};
        char zeros[16] = {0};
        dcp_source s = {.fill = mem_fill, .ctx = zeros};
        ck_assert(dcp_ckpt_add_tensor(w, "t", DCP_FLOAT32, 1, shape, &err) == 0);
        ck_assert(dcp_ckpt_add_chunk(w, "t", 0, off, shape, &s, 0, NULL, &err) == 0);
        volatile sig_atomic_t stop = SIGTERM;
        ck_assert(dcpw_ckpt_finish(w, &stop, &err) < 0);
        ck_assert_int_eq(err.code, ECANCELED);
        ck_assert_msg(strstr(err.msg, "/cancel") && strstr(err.msg, ": interrupted"), "%s", err.msg);
        struct stat st;
        ck_assert(stat(meta, &st) < 0 && errno == ENOENT);
        ck_assert(stat(tmp, &st) < 0 && errno == ENOENT);
        if (discard) {
            dcpw_ckpt_discard(w, dir);
            ck_assert(stat(dir, &st) < 0 && errno == ENOENT);
        } else {
            stop = 0;   /* nothing else stopped it: without the flag it finishes */
            ck_assert_msg(dcpw_ckpt_finish(w, &stop, &err) == 0, "%s", err.msg);
            dcp_ckpt_free(w);
            ck_assert(stat(meta, &st) == 0 && stat(data, &st) == 0);
        }
    }
}
END_TEST

static uint64_t splitmix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The bytes follow dcp-synth(1)'s formula: checked against values computed
 * by tests/interop/writer_synth_expect.py and against the formula here. */
START_TEST(synth_formula)
{
    static const unsigned char k00[16] = {0xaf, 0xcd, 0x1d, 0x7b, 0x39, 0xa8, 0x20, 0xe2,
                                          0xf4, 0x65, 0xb9, 0xa1, 0x6a, 0x9e, 0x78, 0x6e};
    static const unsigned char k53[16] = {0x60, 0xa0, 0xad, 0xb9, 0x81, 0x90, 0xbb, 0x57,
                                          0xe2, 0xa1, 0x87, 0x88, 0xe8, 0xb6, 0x31, 0xa0};
    unsigned char b[16];
    dcp_synth_fill(0, 0, DCP_UINT8, 0, b, 16);
    ck_assert(!memcmp(b, k00, 16));
    dcp_synth_fill(5, 3, DCP_FLOAT32, 0, b, 16);
    ck_assert(!memcmp(b, k53, 16));
    unsigned char c[5];
    dcp_synth_fill(5, 3, DCP_FLOAT32, 3, c, 5);   /* any offset gives the same bytes */
    ck_assert(!memcmp(k53 + 3, c, 5));
    dcp_synth_fill(5, 3, DCP_BOOL, 0, b, 16);      /* bool: the lowest bit of each byte */
    for (int i = 0; i < 16; i++)
        ck_assert_int_eq(b[i], k53[i] & 1);
    /* Far into a key: word j = mix(base + (j+1) G), little-endian. */
    const uint64_t G = 0x9E3779B97F4A7C15ull, seed = 77, key = 123456, j = 1000003;
    uint64_t base = splitmix(seed + key * G), w = splitmix(base + (j + 1) * G);
    unsigned char far[8];
    dcp_synth_fill(seed, key, DCP_INT64, j * 8, far, 8);
    for (int i = 0; i < 8; i++)
        ck_assert_int_eq(far[i], (unsigned char)(w >> (8 * i)));
}
END_TEST

/* 1 when path is an empty folder, 0 when it does not exist; fails the test otherwise. */
static int empty_folder(const char *path)
{
    struct stat st;
    if (stat(path, &st) < 0) {
        ck_assert_int_eq(errno, ENOENT);
        return 0;
    }
    ck_assert(S_ISDIR(st.st_mode));
    DIR *d = opendir(path);
    ck_assert(d != NULL);
    struct dirent *de;
    while ((de = readdir(d)))
        ck_assert_msg(!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."), "%s holds %s", path, de->d_name);
    closedir(d);
    return 1;
}

/* A synthetic checkpoint that fails (bounded up front, interrupted, refused
 * by the writer part way) leaves nothing: the folder goes when it made it,
 * a given empty folder stays empty. */
/* synth_failures' cancel flag, set by synth's progress call after a key. */
static volatile sig_atomic_t stop_after_key;
static void stop_at_progress(void *ctx, uint64_t done, uint64_t total)
{
    (void)ctx, (void)done, (void)total;
    stop_after_key = 1;
}

START_TEST(synth_failures)
{
    char dir[400], given[400];
    snprintf(dir, sizeof dir, "%s/s", tmpdir);
    snprintf(given, sizeof given, "%s/given", tmpdir);
    dcp_error err;
    dcp_synth_options o = DCP_SYNTH_OPTIONS_INIT;
    o.nkeys = (uint64_t)1 << 40;   /* zero-size keys: no bytes, but a chunk each */
    o.ndim = 1;
    o.shape[0] = 0;
    o.dtype = DCP_FLOAT32;
    o.ranks = 4;
    o.chunks_per_key = 1;
    ck_assert(dcp_synth_checkpoint(dir, &o, &err) < 0);
    ck_assert_int_eq(err.code, EINVAL);
    ck_assert_msg(strstr(err.msg, "too many chunks: 1099511627776 keys of 1 chunk each"), "%s", err.msg);
    ck_assert(!empty_folder(dir));
    o.nkeys = DCP_SYNTH_CHUNKS_MAX / 4 + 1;   /* 4 rows over 4 ranks: 4 chunks a key */
    o.shape[0] = 4;
    ck_assert(dcp_synth_checkpoint(dir, &o, &err) < 0);
    ck_assert_msg(strstr(err.msg, "4194305 keys of 4 chunks each"), "%s", err.msg);
    o.nkeys = DCP_SYNTH_CHUNKS_MAX / 4;
    o.bytes_items = 1;
    ck_assert(dcp_synth_checkpoint(dir, &o, &err) < 0);
    ck_assert_msg(strstr(err.msg, "and 1 bytes items"), "%s", err.msg);
    ck_assert(!empty_folder(dir));

    /* Interrupted: the flag a signal handler sets, here before the first key. */
    volatile sig_atomic_t stop = 1;
    o.nkeys = 3;
    o.bytes_items = 0;
    o.cancel = &stop;
    ck_assert(dcp_synth_checkpoint(dir, &o, &err) < 0);
    ck_assert_int_eq(err.code, ECANCELED);
    ck_assert(!empty_folder(dir));
    ck_assert(mkdir(given, 0777) == 0);
    ck_assert(dcp_synth_checkpoint(given, &o, &err) < 0 && err.code == ECANCELED);
    ck_assert(empty_folder(given));

    /* A shape the writer refuses (its strides overflow: a 0 in front does
     * not make it fit) is refused up front, naming the folder and the
     * shape: nothing is created, not even a missing parent's error comes
     * first. (It failed at the first chunk's pickle, naming the key.) */
    stop = 0;
    o.ndim = 3;
    o.shape[0] = 0;
    o.shape[1] = INT64_MAX;
    o.shape[2] = 2;
    o.shard = DCP_SHARD_COLS;
    char nodir[420], want[520];
    snprintf(nodir, sizeof nodir, "%s/nodir/s", tmpdir);
    snprintf(want, sizeof want, "%s: shape [0,9223372036854775807,2]: too large (its strides or element count overflow)",
             nodir);
    ck_assert(dcp_synth_checkpoint(nodir, &o, &err) < 0);
    ck_assert_int_eq(err.code, EINVAL);
    ck_assert_msg(!strcmp(err.msg, want), "%s", err.msg);
    ck_assert(dcp_synth_checkpoint(given, &o, &err) < 0);
    ck_assert_msg(strstr(err.msg, "shape [0,9223372036854775807,2]: too large"), "%s", err.msg);
    ck_assert(empty_folder(given));
    o.ndim = 2;

    /* Stopped part way, after __0_0.distcp was created (the flag set once
     * the first key is written): nothing is left. */
    o.shape[0] = o.shape[1] = 4;
    o.cancel = &stop_after_key;
    o.progress = stop_at_progress;
    ck_assert(dcp_synth_checkpoint(dir, &o, &err) < 0 && err.code == ECANCELED);
    ck_assert(!empty_folder(dir));
    stop_after_key = 0;
    ck_assert(dcp_synth_checkpoint(given, &o, &err) < 0 && err.code == ECANCELED);
    ck_assert(empty_folder(given));
    o.cancel = &stop;
    o.progress = NULL;

    /* And a good one into the folder given. */
    ck_assert_msg(dcp_synth_checkpoint(given, &o, &err) == 0, "%s", err.msg);
    char meta[420];
    snprintf(meta, sizeof meta, "%s/.metadata", given);
    struct stat st;
    ck_assert(stat(meta, &st) == 0);
}
END_TEST

static int refuse_fill(void *ctx, uint64_t tag, uint64_t off, void *buf, size_t len, dcp_error *err)
{
    (void)ctx, (void)tag, (void)off, (void)buf, (void)len;
    return dcpi_err(err, EIO, "fill called");
}

/* Sizes that overflow are refused up front with EFBIG naming the key;
 * nothing is read and no file is left. */
START_TEST(size_overflow)
{
    const int64_t shape[] = {(int64_t)1 << 62};
    dcp_item items[3];
    const char *keys[] = {"k0", "k1", "k2"};
    for (int i = 0; i < 3; i++)
        items[i] = (dcp_item){.key = keys[i], .kind = DCP_KIND_TENSOR, .dtype = DCP_UINT8, .ndim = 1,
                              .shape = shape, .nbytes = (uint64_t)1 << 62, .tag = (uint64_t)i};
    char path[400];
    snprintf(path, sizeof path, "%s/o.safetensors", tmpdir);
    dcp_source src = {.fill = refuse_fill};
    dcp_error err;
    ck_assert(dcp_write_safetensors(path, items, 3, DCP_WRITE_NO_SYNC, &src, NULL, NULL, &err) < 0);
    ck_assert_int_eq(err.code, EFBIG);
    ck_assert_msg(strstr(err.msg, "k1: data offsets overflow"), "%s", err.msg);
    struct stat st;
    ck_assert(stat(path, &st) < 0);

    /* A shape whose strides overflow int64 (torch.save's pickle of a chunk). */
    pw w;
    pw_init(&w, 2, -1, "test");
    const int64_t big[] = {(int64_t)1 << 40, (int64_t)1 << 40, 4};
    pw_torch_tensor(&w, DCP_FLOAT32, 3, big, "0");
    ck_assert(pw_finish(&w, &err) < 0);
    ck_assert_msg(strstr(err.msg, "overflow"), "%s", err.msg);
    pw_free(&w);

    /* Ending a record when none is open is an error, not a read before the array. */
    zw_out o;
    zw z;
    ck_assert(zw_out_init(&o, -1, 0, "mem", &err) == 0);
    zw_begin(&z, &o, "archive", &err);
    ck_assert(zw_record_end(&z, &err) < 0);
    ck_assert_msg(strstr(err.msg, "no record open"), "%s", err.msg);
    zw_free(&z);
    zw_out_free(&o);
}
END_TEST

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert(f && fputs(text, f) >= 0 && fclose(f) == 0);
}

static int file_is(const char *path, const char *text)
{
    char buf[64] = "";
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    return n == strlen(text) && !memcmp(buf, text, n);
}

static int only_entries(const char *dir, int want)
{
    char cmd[400];
    snprintf(cmd, sizeof cmd, "test $(ls -A '%s' | wc -l) -eq %d", dir, want);
    return system(cmd) == 0;
}

/* The single-file writers replace path only when complete: a failure part
 * way leaves the old file and no temporary; NO_REPLACE keeps an existing one. */
START_TEST(atomic_outputs)
{
    const int64_t shape[] = {4};
    float vals[4] = {1, 2, 3, 4};
    dcp_item item = {.key = "w", .kind = DCP_KIND_TENSOR, .dtype = DCP_FLOAT32, .ndim = 1, .shape = shape,
                     .nbytes = sizeof vals};
    dcp_source bad = {.fill = refuse_fill}, good = {.fill = mem_fill, .ctx = vals};
    char st[400], pt[400];
    snprintf(st, sizeof st, "%s/a.safetensors", tmpdir);
    snprintf(pt, sizeof pt, "%s/a.pt", tmpdir);
    write_text(st, "old safetensors");
    write_text(pt, "old pt");
    dcp_error err;
    ck_assert(dcp_write_safetensors(st, &item, 1, DCP_WRITE_NO_SYNC, &bad, NULL, NULL, &err) < 0);
    ck_assert_msg(strstr(err.msg, "fill called"), "%s", err.msg);
    ck_assert(dcp_write_torch_save(pt, NULL, &item, 1, DCP_WRITE_NO_SYNC, &bad, NULL, NULL, &err) < 0);
    ck_assert(file_is(st, "old safetensors") && file_is(pt, "old pt"));
    ck_assert(only_entries(tmpdir, 2));
    ck_assert(dcp_write_safetensors(st, &item, 1, DCP_WRITE_NO_REPLACE, &good, NULL, NULL, &err) < 0);
    ck_assert_int_eq(err.code, EEXIST);
    ck_assert(dcp_write_torch_save(pt, NULL, &item, 1, DCP_WRITE_NO_REPLACE, &good, NULL, NULL, &err) < 0);
    ck_assert_int_eq(err.code, EEXIST);
    ck_assert(file_is(st, "old safetensors") && file_is(pt, "old pt"));
    ck_assert(only_entries(tmpdir, 2));
    /* Complete: replaced (the safetensors data ends with the 16 bytes). */
    ck_assert_msg(dcp_write_safetensors(st, &item, 1, 0, &good, NULL, NULL, &err) == 0, "%s", err.msg);
    ck_assert_msg(dcp_write_torch_save(pt, NULL, &item, 1, 0, &good, NULL, NULL, &err) == 0, "%s", err.msg);
    ck_assert(only_entries(tmpdir, 2));
    FILE *f = fopen(st, "rb");
    float tail[4];
    ck_assert(f && fseek(f, -16, SEEK_END) == 0 && fread(tail, 1, 16, f) == 16);
    fclose(f);
    ck_assert(!memcmp(tail, vals, 16));
}
END_TEST

/* dcp_format_guess as dcp_write.h says: a folder of only *.safetensors. */
START_TEST(format_guess)
{
    char d[400], f[500];
    snprintf(d, sizeof d, "%s/hf", tmpdir);
    ck_assert(mkdir(d, 0755) == 0);
    snprintf(f, sizeof f, "%s/model.safetensors", d);
    write_text(f, "x");
    ck_assert_int_eq(dcp_format_guess(d), DCP_FORMAT_SAFETENSORS);
    snprintf(f, sizeof f, "%s/__0_0.distcp", d);
    write_text(f, "x");
    ck_assert_int_eq(dcp_format_guess(d), DCP_FORMAT_DCP);
    ck_assert_int_eq(dcp_format_guess("x.pt"), DCP_FORMAT_TORCH_SAVE);
    ck_assert_int_eq(dcp_format_guess("x.safetensors"), DCP_FORMAT_SAFETENSORS);
}
END_TEST

/* Bytes items are held in memory: their total is bounded before any is read. */
START_TEST(bytes_total_cap)
{
    dcp_item items[3] = {
        {.key = "small", .kind = DCP_KIND_BYTES, .nbytes = 100},
        {.key = "big1", .kind = DCP_KIND_BYTES, .nbytes = 600u << 20},
        {.key = "big2", .kind = DCP_KIND_BYTES, .nbytes = 600u << 20},
    };
    dcp_source bad = {.fill = refuse_fill};
    char pt[400];
    snprintf(pt, sizeof pt, "%s/b.pt", tmpdir);
    dcp_error err;
    ck_assert(dcp_write_torch_save(pt, NULL, items, 3, DCP_WRITE_NO_SYNC, &bad, NULL, NULL, &err) < 0);
    ck_assert_int_eq(err.code, EFBIG);
    ck_assert_msg(strstr(err.msg, "big2: bytes items would total more than 1073741824 bytes"), "%s", err.msg);
    ck_assert(only_entries(tmpdir, 0));
}
END_TEST

/* One key selection for dcp ls/convert and dcpload. */
START_TEST(key_matches)
{
    ck_assert(dcp_key_matches(NULL, "anything"));
    ck_assert(dcp_key_matches("model", "model"));
    ck_assert(dcp_key_matches("model", "model.layer.weight"));
    ck_assert(!dcp_key_matches("model", "modelx.weight"));
    ck_assert(!dcp_key_matches("model.layer", "model.layers.0"));
    ck_assert(dcp_key_matches("model.*", "model.a.b"));        /* '*' crosses dots */
    ck_assert(!dcp_key_matches("model.*", "model"));
    ck_assert(dcp_key_matches("*.weight", "enc.0.weight"));
    ck_assert(dcp_key_matches("enc.[01].w", "enc.1.w"));
    ck_assert(!dcp_key_matches("enc.?", "enc.1.w"));           /* a pattern is not a prefix */
    ck_assert(!dcp_key_matches("", ".x"));
    ck_assert(!dcp_key_matches("", "x"));
}
END_TEST

/* Keys that are not UTF-8: told apart, and shown as the JSON of the str Python loads. */
static void json_is(const char *key, const char *want)
{
    char *got = dcp_key_json(key);
    ck_assert_ptr_nonnull(got);
    ck_assert_msg(strcmp(got, want) == 0, "%s: got %s, want %s", key, got, want);
    free(got);
}

START_TEST(key_utf8_and_json)
{
    ck_assert(dcp_key_utf8("") && dcp_key_utf8("model.w") && dcp_key_utf8("caf\xc3\xa9"));
    ck_assert(dcp_key_utf8("\xf4\x8f\xbf\xbf"));                  /* U+10FFFF */
    ck_assert(!dcp_key_utf8("\xf4\x90\x80\x80"));                 /* past U+10FFFF */
    ck_assert(!dcp_key_utf8("\xc0\x80") && !dcp_key_utf8("\xe0\x80\x80"));   /* overlong */
    ck_assert(!dcp_key_utf8("\xed\xb2\x80"));                     /* U+DC80, pickle's surrogatepass */
    ck_assert(!dcp_key_utf8("a\xe2\x82") && !dcp_key_utf8("\x80") && !dcp_key_utf8("\xff"));
    json_is("plain", "\"plain\"");
    json_is("caf\xc3\xa9", "\"caf\xc3\xa9\"");
    json_is("q\"b\\s\n\t\x01", "\"q\\\"b\\\\s\\n\\t\\u0001\"");
    json_is("sur\xed\xb2\x80x", "\"sur\\udc80x\"");               /* as json.dumps("sur\udc80x") */
    json_is("\xed\xa0\x80", "\"\\ud800\"");
    json_is("bad\xff\xe2\x82k", "\"bad\\udcff\\udce2\\udc82k\"");  /* each stray byte, surrogateescape */
    json_is("\xc0\x80", "\"\\udcc0\\udc80\"");
    json_is("end\xe2", "\"end\\udce2\"");                          /* a sequence cut by the NUL */
    char out[64];
    ck_assert_uint_eq(dcp_key_text("caf\xc3\xa9.w", out, sizeof out), 7);
    ck_assert_str_eq(out, "caf\xc3\xa9.w");
    ck_assert_uint_eq(dcp_key_text("a\nb\x1b[\x7f\xff\xed\xb2\x80", out, sizeof out), 29);
    ck_assert_str_eq(out, "a\\nb\\x1b[\\x7f\\xff\\xed\\xb2\\x80");
    ck_assert_uint_eq(dcp_key_text("a\xc2\x9b""31m\xc2\xa0", out, sizeof out), 14);   /* C1 CSI escaped, NBSP kept */
    ck_assert_str_eq(out, "a\\xc2\\x9b31m\xc2\xa0");
    ck_assert_uint_eq(dcp_key_text("a\nb", NULL, 0), 4);
    ck_assert_uint_eq(dcp_key_text("a\nbcdef", out, 4), 8);      /* snprintf's contract: cut, terminated */
    ck_assert_str_eq(out, "a\\n");
}
END_TEST

START_TEST(parse_size)
{
    uint64_t v;
    ck_assert(dcp_parse_size("64K", &v) == 0 && v == 65536);
    ck_assert(dcp_parse_size("5GB", &v) == 0 && v == 5000000000ull);
    ck_assert(dcp_parse_size("2GiB", &v) == 0 && v == 2ull << 30);
    ck_assert(dcp_parse_size("12", &v) == 0 && v == 12);
    ck_assert(dcp_parse_size("x", &v) < 0);
    ck_assert(dcp_parse_size("-1", &v) < 0);
    ck_assert(dcp_parse_size("99999999999999999999T", &v) < 0);
}
END_TEST

/* The first tensor of a virtual safetensors file whose bytes reach past an
 * offset: empty tensors are passed over, the end gives n. */
START_TEST(st_view_find)
{
    const dcp_st_view_tensor t[] = {{NULL, 100, 10}, {NULL, 110, 0}, {NULL, 110, 20}, {NULL, 130, 5}};
    ck_assert_uint_eq(dcp_st_view_find(t, 4, 0), 0);
    ck_assert_uint_eq(dcp_st_view_find(t, 4, 109), 0);
    ck_assert_uint_eq(dcp_st_view_find(t, 4, 110), 2);
    ck_assert_uint_eq(dcp_st_view_find(t, 4, 129), 2);
    ck_assert_uint_eq(dcp_st_view_find(t, 4, 130), 3);
    ck_assert_uint_eq(dcp_st_view_find(t, 4, 135), 4);
    ck_assert_uint_eq(dcp_st_view_find(t, 0, 0), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("writer");
    TCase *t = tcase_create("writer");
    tcase_add_checked_fixture(t, setup, teardown);
    tcase_add_test(t, pickle_proto2);
    tcase_add_test(t, pickle_proto4);
    tcase_add_test(t, pickle_tensor);
    tcase_add_test(t, zip_roundtrip);
    tcase_add_test(t, crc_matches_zlib);
    tcase_add_test(t, pump_paths);
    tcase_add_test(t, dcp_writer_roundtrip);
    tcase_add_test(t, dcp_writer_errors);
    tcase_add_test(t, dcp_writer_cancel_at_finish);
    tcase_add_test(t, synth_formula);
    tcase_add_test(t, synth_failures);
    tcase_add_test(t, parse_size);
    tcase_add_test(t, size_overflow);
    tcase_add_test(t, atomic_outputs);
    tcase_add_test(t, key_matches);
    tcase_add_test(t, key_utf8_and_json);
    tcase_add_test(t, bytes_total_cap);
    tcase_add_test(t, format_guess);
    tcase_add_test(t, st_view_find);
    suite_add_tcase(s, t);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? 1 : 0;
}
