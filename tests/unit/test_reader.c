/* Reader tests: placement flags (byte swap, negation, conjugation), short
 * files and missing files with their messages, preadv batches and bounce
 * pieces, the fd cache under a low RLIMIT_NOFILE, 8 threads executing
 * plans on one checkpoint at once, and the cached read and prefetch advice
 * of the loader, its reads bypassing the page cache, reads in pieces on
 * several threads. */
#include "check_quiet.h"
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/uio.h>
#include <unistd.h>

#include "files.h"
#include "planner_ck.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd64_r(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

static uint64_t rnd_r(uint64_t *s, uint64_t n) { return n ? rnd64_r(s) % n : 0; }

static void bswap_buf(unsigned char *p, size_t n, size_t unit)
{
    for (size_t i = 0; i + unit <= n; i += unit)
        for (size_t a = i, b = i + unit - 1; a < b; a++, b--) {
            unsigned char t = p[a]; p[a] = p[b]; p[b] = t;
        }
}

/* A 1-d entry stored C-contiguous at the end of a growing file image. */
struct img {
    unsigned char *buf;
    size_t len;
};

static uint64_t img_add(struct img *m, const void *data, size_t n)
{
    uint64_t off = m->len + 16;   /* a gap, as zip headers would be */
    m->buf = realloc(m->buf, off + n);
    memset(m->buf + m->len, 0x77, 16);
    memcpy(m->buf + off, data, n);
    m->len = off + n;
    return off;
}

static size_t entry_1d(dcp_checkpoint *ck, const char *key, dcp_dtype dt, int64_t n, uint32_t file,
                       uint64_t off)
{
    int64_t shape[1] = {n}, zero[1] = {0};
    size_t idx = tck_tensor(ck, key, dt, 1, shape);
    tck_chunk(ck, idx, zero, shape, file, off, (uint64_t)n * dcp_dtype_size(dt));
    return idx;
}

static void read_all(dcp_checkpoint *ck, size_t idx, void *out, size_t n)
{
    void *buf;
    uint64_t len;
    dcp_error err;
    ck_assert_msg(dcp_read_entry(ck, &ck->entries[idx], &buf, &len, &err) == 0, "%s", err.msg);
    ck_assert_uint_eq(len, n);
    memcpy(out, buf, n);
    free(buf);
}

START_TEST(test_flags)
{
    struct img m = {0};
    float f[4] = {1.5f, -2.25f, 3.0f, 0.0f}, fbe[4];
    memcpy(fbe, f, sizeof f);
    bswap_buf((unsigned char *)fbe, sizeof fbe, 4);
    uint64_t o_fbe = img_add(&m, fbe, sizeof fbe);
    uint64_t o_f = img_add(&m, f, sizeof f);
    int32_t i32[3] = {5, -7, INT32_MIN};
    uint64_t o_i = img_add(&m, i32, sizeof i32);
    int16_t i16[2] = {300, -2}, i16be[2];
    memcpy(i16be, i16, sizeof i16);
    bswap_buf((unsigned char *)i16be, sizeof i16be, 2);
    uint64_t o_i16 = img_add(&m, i16be, sizeof i16be);
    uint16_t bf[2] = {0x3fc0 /* 1.5 */, 0xc000 /* -2 */};
    uint64_t o_bf = img_add(&m, bf, sizeof bf);
    float c64[4] = {1, 2, -3, 4};   /* (1+2i), (-3+4i) */
    uint64_t o_c64 = img_add(&m, c64, sizeof c64);
    double c128[2] = {1.25, -6.5}, c128be[2];
    memcpy(c128be, c128, sizeof c128);
    bswap_buf((unsigned char *)c128be, sizeof c128be, 8);
    uint64_t o_c128 = img_add(&m, c128be, sizeof c128be);
    /* a transposed 2x5 big-endian float32 chunk: the tiled scatter + swap path */
    float t[10] = {0, 5, 1, 6, 2, 7, 3, 8, 4, 9}, tbe[10];   /* column-major of [[0..4],[5..9]] */
    memcpy(tbe, t, sizeof t);
    bswap_buf((unsigned char *)tbe, sizeof tbe, 4);
    uint64_t o_t = img_add(&m, tbe, sizeof tbe);

    dcp_checkpoint *ck = tck_new();
    tck_file(ck, "__0_0.distcp", m.buf, m.len);
    size_t e_be = entry_1d(ck, "f_be", DCP_FLOAT32, 4, 0, o_fbe);
    size_t e_neg = entry_1d(ck, "f_neg", DCP_FLOAT32, 4, 0, o_f);
    size_t e_i = entry_1d(ck, "i_neg", DCP_INT32, 3, 0, o_i);
    size_t e_i16 = entry_1d(ck, "i16_be_neg", DCP_INT16, 2, 0, o_i16);
    size_t e_bf = entry_1d(ck, "bf_neg", DCP_BFLOAT16, 2, 0, o_bf);
    size_t e_c64 = entry_1d(ck, "c64_conj", DCP_COMPLEX64, 2, 0, o_c64);
    size_t e_c128 = entry_1d(ck, "c128_be_conj_neg", DCP_COMPLEX128, 1, 0, o_c128);
    int64_t shape[2] = {2, 5}, zero[2] = {0, 0};
    size_t e_t = tck_tensor(ck, "t_be", DCP_FLOAT32, 2, shape);
    tck_chunk(ck, e_t, zero, shape, 0, o_t, 40);
    tck_finish(ck);
    int64_t s1[1] = {1}, st[2] = {1, 2};
    tck_record(ck, e_be, 0, DCP_FLOAT32, o_fbe, 16, 0, s1, DCP_RECORD_BIG_ENDIAN);
    tck_record(ck, e_neg, 0, DCP_FLOAT32, o_f, 16, 0, s1, DCP_RECORD_NEG);
    tck_record(ck, e_i, 0, DCP_INT32, o_i, 12, 0, s1, DCP_RECORD_NEG);
    tck_record(ck, e_i16, 0, DCP_INT16, o_i16, 4, 0, s1, DCP_RECORD_BIG_ENDIAN | DCP_RECORD_NEG);
    tck_record(ck, e_bf, 0, DCP_BFLOAT16, o_bf, 4, 0, s1, DCP_RECORD_NEG);
    tck_record(ck, e_c64, 0, DCP_COMPLEX64, o_c64, 16, 0, s1, DCP_RECORD_CONJ);
    tck_record(ck, e_c128, 0, DCP_COMPLEX128, o_c128, 16, 0, s1,
               DCP_RECORD_BIG_ENDIAN | DCP_RECORD_CONJ | DCP_RECORD_NEG);
    tck_record(ck, e_t, 0, DCP_FLOAT32, o_t, 40, 0, st, DCP_RECORD_BIG_ENDIAN);

    float fo[4];
    read_all(ck, e_be, fo, 16);
    ck_assert(fo[0] == 1.5f && fo[1] == -2.25f && fo[2] == 3.0f && fo[3] == 0.0f);
    read_all(ck, e_neg, fo, 16);
    ck_assert(fo[0] == -1.5f && fo[1] == 2.25f && fo[2] == -3.0f && fo[3] == 0.0f && signbit(fo[3]));
    int32_t io[3];
    read_all(ck, e_i, io, 12);
    ck_assert(io[0] == -5 && io[1] == 7 && io[2] == INT32_MIN);
    int16_t i16o[2];
    read_all(ck, e_i16, i16o, 4);
    ck_assert(i16o[0] == -300 && i16o[1] == 2);
    uint16_t bfo[2];
    read_all(ck, e_bf, bfo, 4);
    ck_assert_uint_eq(bfo[0], 0xbfc0);
    ck_assert_uint_eq(bfo[1], 0x4000);
    float co[4];
    read_all(ck, e_c64, co, 16);
    ck_assert(co[0] == 1 && co[1] == -2 && co[2] == -3 && co[3] == -4);
    double c128o[2];
    read_all(ck, e_c128, c128o, 16);
    ck_assert(c128o[0] == -1.25 && c128o[1] == -6.5);   /* -(conj(1.25-6.5i)) */
    float to[10];
    read_all(ck, e_t, to, 40);
    for (int i = 0; i < 10; i++)
        ck_assert(to[i] == (float)i);

    /* dcp_op_place on its own: strided destination with negation */
    int32_t src[3] = {1, 2, 3}, region[9] = {0};
    dcp_op op = { .flags = DCP_OP_NEG, .length = 12, .dest_offset = 4, .dest_stride = 12, .elem_size = 4 };
    dcp_op_place(&op, src, region, DCP_INT32);
    ck_assert(region[1] == -1 && region[4] == -2 && region[7] == -3 && region[0] == 0 && region[2] == 0);
    /* float16 negation flips the sign bit */
    uint16_t h[1] = {0x3c00}, hr[1];
    dcp_op oph = { .flags = DCP_OP_NEG | DCP_OP_BSWAP, .length = 2, .dest_stride = 2, .elem_size = 2 };
    h[0] = 0x003c;   /* 1.0 big-endian */
    dcp_op_place(&oph, h, hr, DCP_FLOAT16);
    ck_assert_uint_eq(hr[0], 0xbc00);
    free(m.buf);
    tck_free(ck);
}
END_TEST

START_TEST(test_short_and_missing)
{
    unsigned char data[100];
    memset(data, 1, sizeof data);
    dcp_checkpoint *ck = tck_new();
    tck_file(ck, "__0_0.distcp", data, sizeof data);
    tck_file(ck, "__1_0.distcp", NULL, 0);   /* named by metadata, absent on disk */
    size_t a = entry_1d(ck, "short.direct", DCP_FLOAT32, 10, 0, 80);
    int64_t shape[2] = {2, 5}, zero[2] = {0, 0}, st[2] = {1, 2};
    size_t b = tck_tensor(ck, "short.strided", DCP_FLOAT32, 2, shape);
    tck_chunk(ck, b, zero, shape, 0, 80, 40);
    size_t c = entry_1d(ck, "gone", DCP_FLOAT32, 4, 1, 0);
    tck_finish(ck);
    int64_t s1[1] = {1};
    tck_record(ck, a, 0, DCP_FLOAT32, 80, 40, 0, s1, 0);
    tck_record(ck, b, 0, DCP_FLOAT32, 80, 40, 0, st, 0);
    tck_record(ck, c, 0, DCP_FLOAT32, 0, 16, 0, s1, 0);
    void *buf = NULL;
    uint64_t len;
    dcp_error err;
    char want[2048];
    snprintf(want, sizeof want,
             "%s/__0_0.distcp: short.direct: short read at offset 80 (wanted 40 bytes, the file has 100)", ck->path);
    ck_assert_int_eq(dcp_read_entry(ck, &ck->entries[a], &buf, &len, &err), -1);
    ck_assert_int_eq(err.code, EIO);
    ck_assert_str_eq(err.msg, want);
    ck_assert_ptr_null(buf);
    ck_assert_int_eq(dcp_read_entry(ck, &ck->entries[b], &buf, &len, &err), -1);
    ck_assert_int_eq(err.code, EIO);
    ck_assert_msg(strstr(err.msg, "__0_0.distcp: short.strided: short read at offset 96 (wanted 8 bytes, the file has 100)"), "%s", err.msg);
    ck_assert_int_eq(dcp_read_entry(ck, &ck->entries[c], &buf, &len, &err), -1);
    ck_assert_int_eq(err.code, ENOENT);
    ck_assert_msg(strstr(err.msg, "/__1_0.distcp: gone: ") && strstr(err.msg, "missing"), "%s", err.msg);
    /* the internal helpers */
    char small[8];
    ck_assert_int_eq(dcpi_pread_full(ck, 0, small, 8, 96, "k", &err), -1);
    ck_assert_int_eq(err.code, EIO);
    ck_assert_int_eq(dcpi_pread_full(ck, 0, small, 8, 90, "k", &err), 0);
    ck_assert_int_eq(dcpi_pread_full(ck, 0, small, 8, UINT64_MAX - 4, "k", &err), -1);
    ck_assert_int_eq(dcpi_pread_full(ck, 7, small, 8, 0, "k", &err), -1);
    ck_assert_int_eq(err.code, EINVAL);
    uint64_t size;
    ck_assert_int_eq(dcpi_ck_file_size(ck, 0, &size, &err), 0);
    ck_assert_uint_eq(size, 100);
    ck_assert_int_eq(dcpi_ck_file_size(ck, 1, &size, &err), -1);
    ck_assert_int_eq(err.code, ENOENT);
    int fd;
    ck_assert_int_eq(dcp_file_fd(ck, 0, &fd, &err), 0);
    ck_assert_int_eq(pread(fd, small, 1, 0), 1);
    /* truncated after it was opened: the message gives the size it has now, not the one at open */
    char path[4200];
    snprintf(path, sizeof path, "%s/__0_0.distcp", ck->path);
    ck_assert_int_eq(truncate(path, 50), 0);
    ck_assert_int_eq(dcpi_pread_full(ck, 0, small, 8, 60, "k", &err), -1);
    ck_assert_msg(strstr(err.msg, "/__0_0.distcp: k: short read at offset 60 (wanted 8 bytes, the file has 50)"), "%s",
                  err.msg);
    tck_free(ck);
}
END_TEST

/* Many direct ops adjacent in the file (preadv batches), and one flagged op
 * larger than the bounce buffer (read in pieces). */
START_TEST(test_batches_and_pieces)
{
    const int64_t rows = 1300, cols = 4;
    size_t n = (size_t)(rows * cols);
    float *img = malloc(n * 4), *want = malloc(n * 4);
    /* column-sharded: chunk j holds columns [2j, 2j+2), row-major */
    for (int j = 0; j < 2; j++)
        for (int64_t r = 0; r < rows; r++)
            for (int c = 0; c < 2; c++) {
                float v = (float)(r * cols + 2 * j + c);
                img[(size_t)j * (size_t)rows * 2 + (size_t)r * 2 + (size_t)c] = v;
                want[r * cols + 2 * j + c] = v;
            }
    const size_t big = (size_t)3 << 20;   /* 12 MiB of big-endian int32 */
    int32_t *bigv = malloc(big * 4), *bigbe = malloc(big * 4);
    for (size_t i = 0; i < big; i++)
        bigv[i] = (int32_t)(i * 2654435761u);
    memcpy(bigbe, bigv, big * 4);
    bswap_buf((unsigned char *)bigbe, big * 4, 4);

    dcp_checkpoint *ck = tck_new();
    tck_file(ck, "__0_0.distcp", img, n * 4);
    tck_file(ck, "__0_1.distcp", bigbe, big * 4);
    int64_t shape[2] = {rows, cols}, csize[2] = {rows, 2};
    size_t e = tck_tensor(ck, "embed", DCP_FLOAT32, 2, shape);
    for (int j = 0; j < 2; j++) {
        int64_t off[2] = {0, 2 * j};
        tck_chunk(ck, e, off, csize, 0, (uint64_t)j * (uint64_t)rows * 8, (uint64_t)rows * 8);
    }
    size_t b = entry_1d(ck, "big", DCP_INT32, (int64_t)big, 1, 0);
    tck_finish(ck);
    int64_t st[2] = {2, 1}, s1[1] = {1};
    for (int j = 0; j < 2; j++)
        tck_record(ck, e, (size_t)j, DCP_FLOAT32, (uint64_t)j * (uint64_t)rows * 8, (uint64_t)rows * 8, 0, st, 0);
    tck_record(ck, b, 0, DCP_INT32, 0, big * 4, 0, s1, DCP_RECORD_BIG_ENDIAN);

    dcp_plan p;
    dcp_plan_init(&p);
    dcp_error err;
    ck_assert_int_eq(dcp_plan_bytes(ck, &ck->entries[e], 0, n * 4, &p, &err), 0);
    ck_assert_uint_eq(p.nops, (size_t)(2 * rows));
    float *out = malloc(n * 4);
    ck_assert_msg(dcp_plan_execute(ck, &p, out, &err) == 0, "%s", err.msg);
    ck_assert(memcmp(out, want, n * 4) == 0);
    ck_assert_int_eq(dcp_plan_bytes(ck, &ck->entries[b], 0, big * 4, &p, &err), 0);
    ck_assert_uint_eq(p.nops, 1);
    int32_t *bo = malloc(big * 4);
    ck_assert_msg(dcp_plan_execute(ck, &p, bo, &err) == 0, "%s", err.msg);
    ck_assert(memcmp(bo, bigv, big * 4) == 0);
    dcp_plan_free(&p);
    free(img), free(want), free(out), free(bigv), free(bigbe), free(bo);
    tck_free(ck);
}
END_TEST

/* ------------------------------------------------------------ threads */

struct shared {
    dcp_checkpoint *ck;
    const dcp_entry *e;
    const float *want;
    int64_t rows, cols;
    int failures;
    char msg[DCP_ERRMSG_MAX];
};

static void *worker(void *arg)
{
    struct shared *s = arg;
    uint64_t seed = (uint64_t)(uintptr_t)&seed ^ 0x1234567ull;
    dcp_plan p;
    dcp_plan_init(&p);
    dcp_error err;
    size_t cap = (size_t)(s->rows * s->cols) * 4;
    float *buf = malloc(cap);
    for (int it = 0; it < 150; it++) {
        int64_t off[2], len[2];
        off[0] = (int64_t)rnd_r(&seed, (uint64_t)s->rows);
        off[1] = (int64_t)rnd_r(&seed, (uint64_t)s->cols);
        len[0] = 1 + (int64_t)rnd_r(&seed, (uint64_t)(s->rows - off[0]));
        len[1] = 1 + (int64_t)rnd_r(&seed, (uint64_t)(s->cols - off[1]));
        int ok = dcp_plan_region(s->ck, s->e, off, len, &p, &err) == 0 &&
                 dcp_plan_execute(s->ck, &p, buf, &err) == 0;
        for (int64_t r = 0; ok && r < len[0]; r++)
            ok = memcmp(buf + r * len[1], s->want + (off[0] + r) * s->cols + off[1], (size_t)len[1] * 4) == 0;
        uint64_t bo = rnd_r(&seed, (uint64_t)(s->rows * s->cols)) * 4, bl = rnd_r(&seed, 1 << 14) * 4;
        ok = ok && dcp_plan_bytes(s->ck, s->e, bo, bl, &p, &err) == 0 &&
             dcp_plan_execute(s->ck, &p, buf, &err) == 0 &&
             memcmp(buf, (const char *)s->want + bo, (size_t)p.nbytes) == 0;
        if (!ok) {
            __atomic_add_fetch(&s->failures, 1, __ATOMIC_RELAXED);
            snprintf(s->msg, sizeof s->msg, "%s", err.msg);
            break;
        }
    }
    free(buf);
    dcp_plan_free(&p);
    return NULL;
}

/* A [rows, cols] float32 tensor in a 4x3 grid of chunks over `nfiles` files,
 * every other chunk stored transposed; value = global index. */
static dcp_checkpoint *threads_ck(int64_t rows, int64_t cols, int nfiles, float **want_out, size_t *idx)
{
    float *want = malloc((size_t)(rows * cols) * 4);
    for (int64_t i = 0; i < rows * cols; i++)
        want[i] = (float)i;
    struct img files[8] = {{0}};
    int64_t rb[5], cb[4];
    for (int i = 0; i <= 4; i++) rb[i] = rows * i / 4;
    for (int j = 0; j <= 3; j++) cb[j] = cols * j / 3;
    struct { int64_t off[2], size[2], st[2]; uint32_t f; uint64_t pos; } ch[12];
    for (int i = 0, k = 0; i < 4; i++)
        for (int j = 0; j < 3; j++, k++) {
            int64_t h = rb[i + 1] - rb[i], w = cb[j + 1] - cb[j];
            int tr = k % 2;
            ch[k].off[0] = rb[i], ch[k].off[1] = cb[j], ch[k].size[0] = h, ch[k].size[1] = w;
            ch[k].st[0] = tr ? 1 : w, ch[k].st[1] = tr ? h : 1;
            float *v = malloc((size_t)(h * w) * 4);
            for (int64_t r = 0; r < h; r++)
                for (int64_t c = 0; c < w; c++)
                    v[r * ch[k].st[0] + c * ch[k].st[1]] = want[(rb[i] + r) * cols + cb[j] + c];
            ch[k].f = (uint32_t)(k % nfiles);
            ch[k].pos = img_add(&files[ch[k].f], v, (size_t)(h * w) * 4);
            free(v);
        }
    dcp_checkpoint *ck = tck_new();
    for (int f = 0; f < nfiles; f++) {
        char name[32];
        snprintf(name, sizeof name, "__%d_0.distcp", f);
        tck_file(ck, name, files[f].buf, files[f].len);
        free(files[f].buf);
    }
    int64_t shape[2] = {rows, cols};
    *idx = tck_tensor(ck, "layers.7.mlp.w", DCP_FLOAT32, 2, shape);
    for (int k = 0; k < 12; k++)
        tck_chunk(ck, *idx, ch[k].off, ch[k].size, ch[k].f, ch[k].pos, (uint64_t)(ch[k].size[0] * ch[k].size[1]) * 4);
    tck_finish(ck);
    for (int k = 0; k < 12; k++)
        tck_record(ck, *idx, (size_t)k, DCP_FLOAT32, ch[k].pos, (uint64_t)(ch[k].size[0] * ch[k].size[1]) * 4,
                   0, ch[k].st, 0);
    *want_out = want;
    return ck;
}

START_TEST(test_threads)
{
    float *want;
    size_t idx;
    struct shared s = { .rows = 96, .cols = 75 };
    s.ck = threads_ck(s.rows, s.cols, 5, &want, &idx);
    s.e = &s.ck->entries[idx];
    s.want = want;
    pthread_t th[8];
    for (int i = 0; i < 8; i++)
        ck_assert_int_eq(pthread_create(&th[i], NULL, worker, &s), 0);
    for (int i = 0; i < 8; i++)
        pthread_join(th[i], NULL);
    ck_assert_msg(s.failures == 0, "%d threads failed: %s", s.failures, s.msg);
    tck_free(s.ck);
    free(want);
}
END_TEST

/* ------------------------------------------------------------ fd cache */

struct many {
    dcp_checkpoint *ck;
    size_t n;
    int failures;
    char msg[DCP_ERRMSG_MAX + 64];
};

static void *many_worker(void *arg)
{
    struct many *m = arg;
    uint64_t seed = (uint64_t)(uintptr_t)&seed;
    dcp_error err;
    for (int it = 0; it < 600; it++) {
        size_t i = rnd_r(&seed, m->n);
        void *buf;
        uint64_t len;
        if (dcp_read_entry(m->ck, &m->ck->entries[i], &buf, &len, &err) < 0 || len != 8 ||
            ((uint32_t *)buf)[0] != (uint32_t)i || ((uint32_t *)buf)[1] != ~(uint32_t)i) {
            __atomic_add_fetch(&m->failures, 1, __ATOMIC_RELAXED);
            snprintf(m->msg, sizeof m->msg, "entry %zu: %s", i, err.msg);
            return NULL;
        }
        free(buf);
    }
    return NULL;
}

/* 300 files under RLIMIT_NOFILE = 64: the cache closes idle fds, never one
 * in use, and never a pinned one. */
START_TEST(test_fd_cache)
{
    struct rlimit old, low;
    ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &old), 0);
    const size_t n = 300;
    dcp_checkpoint *ck = tck_new();
    for (size_t i = 0; i < n; i++) {
        char name[32];
        uint32_t v[2] = {(uint32_t)i, ~(uint32_t)i};
        snprintf(name, sizeof name, "__%zu_0.distcp", i);
        tck_file(ck, name, v, sizeof v);
    }
    for (size_t i = 0; i < n; i++) {
        char key[32];
        snprintf(key, sizeof key, "k%zu", i);
        entry_1d(ck, key, DCP_UINT32, 2, (uint32_t)i, 0);
    }
    tck_finish(ck);
    int64_t s1[1] = {1};
    for (size_t i = 0; i < n; i++)
        tck_record(ck, i, 0, DCP_UINT32, 0, 8, 0, s1, 0);
    low = old;
    low.rlim_cur = 64;
    ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &low), 0);
    dcp_error err;
    int pinned;
    ck_assert_msg(dcp_file_fd(ck, 5, &pinned, &err) == 0, "%s", err.msg);
    struct many m = { .ck = ck, .n = n };
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(pthread_create(&th[i], NULL, many_worker, &m), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    setrlimit(RLIMIT_NOFILE, &old);
    ck_assert_msg(m.failures == 0, "%s", m.msg);
    uint32_t v[2];
    ck_assert_int_eq(pread(pinned, v, 8, 0), 8);
    ck_assert_uint_eq(v[0], 5);
    ck_assert_uint_le(dcpi_files_open(ck), 32);
    tck_free(ck);
}
END_TEST

/* dcp_op_fetch_cached takes the cached prefix of an op's bytes (all of a
 * file just written, where the kernel can tell), never past the end of the
 * file, nothing of decoded ops or missing files; dcp_op_prefetch is advice
 * that never fails a later read. */
START_TEST(test_cached_and_prefetch)
{
    const size_t size = (size_t)1 << 20;
    unsigned char *data = malloc(size), *buf = malloc(size);
    uint64_t s = 7;
    for (size_t i = 0; i < size; i++)
        data[i] = (unsigned char)rnd64_r(&s);
    dcp_checkpoint *ck = tck_new();
    tck_file(ck, "__0_0.distcp", data, size);
    tck_file(ck, "__1_0.distcp", NULL, 0);   /* named, absent on disk */
    tck_finish(ck);
    /* can this kernel and file system tell what is cached? */
    int fd = openat(ck->dirfd, "__0_0.distcp", O_RDONLY | O_CLOEXEC);
    ck_assert_int_ge(fd, 0);
    struct iovec v = {buf, 4096};
    int can_tell = preadv2(fd, &v, 1, 0, RWF_NOWAIT) > 0;
    close(fd);

    dcp_op op = {0};
    op.src_offset = 100;
    op.length = 500000;
    op.elem_size = op.dest_stride = 1;
    memset(buf, 0, size);
    uint64_t got = dcp_op_fetch_cached(ck, &op, buf);
    ck_assert_uint_le(got, op.length);
    if (can_tell)
        ck_assert_uint_eq(got, op.length);
    ck_assert_int_eq(memcmp(buf, data + 100, (size_t)got), 0);

    op.src_offset = size - 10;   /* past the end: at most the 10 bytes there */
    op.length = 100;
    got = dcp_op_fetch_cached(ck, &op, buf);
    ck_assert_uint_le(got, 10);
    if (can_tell)
        ck_assert_uint_eq(got, 10);
    ck_assert_int_eq(memcmp(buf, data + size - 10, (size_t)got), 0);

    op.src_offset = UINT64_MAX - 4;   /* beyond any file */
    ck_assert_uint_eq(dcp_op_fetch_cached(ck, &op, buf), 0);
    dcp_op_prefetch(ck, &op);
    op.src_offset = 0;
    op.file = 1;   /* missing */
    ck_assert_uint_eq(dcp_op_fetch_cached(ck, &op, buf), 0);
    dcp_op_prefetch(ck, &op);
    op.file = 9;   /* no such index */
    ck_assert_uint_eq(dcp_op_fetch_cached(ck, &op, buf), 0);
    dcp_op_prefetch(ck, &op);
    op.file = 0;
    op.flags = DCP_OP_DECODED;   /* a decoded blob: never read here */
    ck_assert_uint_eq(dcp_op_fetch_cached(ck, &op, buf), 0);
    dcp_op_prefetch(ck, &op);

    /* advice, then the read it was for */
    op.flags = 0;
    op.src_offset = 4096;
    op.length = size - 4096;
    dcp_op_prefetch(ck, &op);
    dcp_error err;
    memset(buf, 0, size);
    ck_assert_msg(dcp_op_fetch(ck, NULL, &op, buf, &err) == 0, "%s", err.msg);
    ck_assert_int_eq(memcmp(buf, data + 4096, size - 4096), 0);
    tck_free(ck);
    free(data);
    free(buf);
}
END_TEST

/* A data file written to in place after the open (torch's second save into
 * the same folder rewrites each shard, same name and inode): reads, a blob's
 * and dcp_file_fd fail with EIO naming file, key and reason, rather than give
 * the new bytes at the old offsets; so does a file that grew. */
START_TEST(test_rewritten_in_place)
{
    float v[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, out[10];
    dcp_checkpoint *ck = tck_new();
    tck_file(ck, "__0_0.distcp", v, sizeof v);
    size_t a = entry_1d(ck, "w", DCP_FLOAT32, 10, 0, 0);
    tck_finish(ck);
    int64_t s1[1] = {1};
    tck_record(ck, a, 0, DCP_FLOAT32, 0, 40, 0, s1, 0);
    dcpi_files_note_identity(ck);   /* as dcp_open does */
    read_all(ck, a, out, sizeof out);
    ck_assert_int_eq(memcmp(out, v, sizeof v), 0);
    int fd;
    dcp_error err;
    ck_assert_msg(dcp_file_fd(ck, 0, &fd, &err) == 0, "%s", err.msg);

    /* the same bytes' length, other values; an mtime of its own (a write
     * within the clock tick of the first one would keep it) */
    float w[10] = {-1, -2, -3, -4, -5, -6, -7, -8, -9, -10};
    int wfd = openat(ck->dirfd, "__0_0.distcp", O_WRONLY | O_CLOEXEC);
    ck_assert_int_ge(wfd, 0);
    struct stat st0;
    ck_assert_int_eq(fstat(wfd, &st0), 0);
    ck_assert_int_eq(pwrite(wfd, w, sizeof w, 0), (ssize_t)sizeof w);
    struct timespec t[2] = {{.tv_nsec = UTIME_OMIT}, {.tv_sec = 1000000000, .tv_nsec = 0}};
    ck_assert_int_eq(futimens(wfd, t), 0);
    char want[2048];
    snprintf(want, sizeof want,
             "%s/__0_0.distcp: w: the data file was written to since the checkpoint was opened (saved again in place)",
             ck->path);
    void *buf = NULL;
    uint64_t len;
    ck_assert_int_eq(dcp_read_entry(ck, &ck->entries[a], &buf, &len, &err), -1);
    ck_assert_int_eq(err.code, EIO);
    ck_assert_str_eq(err.msg, want);
    ck_assert_ptr_null(buf);
    char small[8];
    ck_assert_int_eq(dcpi_pread_full(ck, 0, small, 8, 0, "w", &err), -1);
    ck_assert_str_eq(err.msg, want);
    ck_assert_int_eq(dcp_file_fd(ck, 0, &fd, &err), -1);
    ck_assert_int_eq(err.code, EIO);
    ck_assert_msg(strstr(err.msg, "/__0_0.distcp: the data file was written to since the checkpoint was opened"),
                  "%s", err.msg);
    /* the loader's fast paths (cached bytes, a mapping, O_DIRECT) give none
     * of the new bytes: their callers fall back to the read that says why */
    dcp_op op = {0};
    op.elem_size = op.dest_stride = 1;
    op.length = sizeof w;
    ck_assert_uint_eq(dcp_op_fetch_cached(ck, &op, out), 0);
    const void *at;
    void *base;
    size_t mlen;
    ck_assert_int_eq(dcp_op_map_cached(ck, &op, &at, &base, &mlen), 0);
    ck_assert_ptr_null(base);
    void *dbuf;
    size_t lead;
    ck_assert_int_eq(posix_memalign(&dbuf, DCP_DIRECT_ALIGN, 2 * DCP_DIRECT_ALIGN), 0);
    ck_assert_int_eq(dcp_op_fetch_direct(ck, &op, dbuf, 2 * DCP_DIRECT_ALIGN, &lead), 1);
    ck_assert_int_eq(dcp_op_fetch_direct_at(ck, &op, dbuf), 1);
    free(dbuf);

    /* the old mtime back, and 4 bytes more: the size tells */
    ck_assert_int_eq(pwrite(wfd, v, sizeof v, 0), (ssize_t)sizeof v);
    ck_assert_int_eq(pwrite(wfd, v, 4, sizeof v), 4);
    t[1] = st0.st_mtim;
    ck_assert_int_eq(futimens(wfd, t), 0);
    close(wfd);
    ck_assert_int_eq(dcp_read_entry(ck, &ck->entries[a], &buf, &len, &err), -1);
    ck_assert_str_eq(err.msg, want);
    tck_free(ck);
}
END_TEST

/* The checkpoint of the O_DIRECT tests: __0_0.distcp holds `size` random
 * bytes (*data, seeded), already seen once so its identity is noted, and
 * __1_0.distcp is named but absent. *can: the file system takes O_DIRECT
 * (tmpfs and some others refuse it). A plain one-byte op of file 0 in *op. */
static dcp_checkpoint *direct_ck(size_t size, uint64_t seed, unsigned char **data, int *can, dcp_op *op)
{
    *data = malloc(size);
    for (size_t i = 0; i < size; i++)
        (*data)[i] = (unsigned char)rnd64_r(&seed);
    dcp_checkpoint *ck = tck_new();
    tck_file(ck, "__0_0.distcp", *data, size);
    tck_file(ck, "__1_0.distcp", NULL, 0);
    tck_finish(ck);
    int fd = openat(ck->dirfd, "__0_0.distcp", O_RDONLY | O_CLOEXEC | O_DIRECT);
    *can = fd >= 0;
    if (fd >= 0)
        close(fd);
    memset(op, 0, sizeof *op);
    op->elem_size = op->dest_stride = 1;
    op->length = 1;
    unsigned char one;
    (void)dcp_op_fetch_cached(ck, op, &one);
    return ck;
}

/* dcp_op_fetch_direct: whole blocks with O_DIRECT into an aligned buffer,
 * the op's first byte at buf + lead; 1 (the caller reads the usual way) for
 * a misaligned buffer, a small cap, a decoded op, a read past the end of
 * the file, a missing file, or a file replaced since it was first read. */
START_TEST(test_direct)
{
    const size_t size = ((size_t)3 << 20) + 123;
    unsigned char *data, *mem = NULL;
    int can;
    dcp_op op;
    dcp_checkpoint *ck = direct_ck(size, 11, &data, &can, &op);
    const size_t cap = size + 2 * DCP_DIRECT_ALIGN;
    ck_assert_int_eq(posix_memalign((void **)&mem, DCP_DIRECT_ALIGN, cap + 1), 0);
    size_t lead = 99;
    op.src_offset = 3 * DCP_DIRECT_ALIGN + 17;   /* starts and ends inside blocks */
    op.length = ((uint64_t)2 << 20) + 5;
    memset(mem, 0, cap);
    int rc = dcp_op_fetch_direct(ck, &op, mem, cap, &lead);
    ck_assert_uint_eq(lead, 17);
    if (can) {
        ck_assert_int_eq(rc, 0);
        ck_assert_int_eq(memcmp(mem + lead, data + op.src_offset, (size_t)op.length), 0);
    } else {
        ck_assert_int_eq(rc, 1);
    }
    op.src_offset = 5;   /* up to the end of the file, which ends inside a block */
    op.length = size - 5;
    memset(mem, 0, cap);
    rc = dcp_op_fetch_direct(ck, &op, mem, cap, &lead);
    ck_assert_int_eq(rc, can ? 0 : 1);
    if (can)
        ck_assert_int_eq(memcmp(mem + 5, data + 5, size - 5), 0);
    ck_assert_int_eq(dcp_op_fetch_direct(ck, &op, mem + 1, cap - 1, &lead), 1);       /* misaligned */
    ck_assert_int_eq(dcp_op_fetch_direct(ck, &op, mem, size - DCP_DIRECT_ALIGN, &lead), 1);   /* small */
    op.length = size;   /* 5 bytes past the end */
    ck_assert_int_eq(dcp_op_fetch_direct(ck, &op, mem, cap, &lead), 1);
    op.length = 100;
    op.src_offset = UINT64_MAX - 4;   /* beyond any file */
    ck_assert_int_eq(dcp_op_fetch_direct(ck, &op, mem, cap, &lead), 1);
    op.src_offset = 0;
    op.flags = DCP_OP_DECODED;
    ck_assert_int_eq(dcp_op_fetch_direct(ck, &op, mem, cap, &lead), 1);
    op.flags = 0;
    op.file = 1;   /* missing */
    ck_assert_int_eq(dcp_op_fetch_direct(ck, &op, mem, cap, &lead), 1);
    op.file = 0;
    /* replaced since first read: another file renamed over it */
    int nfd = openat(ck->dirfd, "other", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ck_assert_int_ge(nfd, 0);
    ck_assert_int_eq(write(nfd, data, 8192), 8192);
    close(nfd);
    ck_assert_int_eq(renameat(ck->dirfd, "other", ck->dirfd, "__0_0.distcp"), 0);
    ck_assert_int_eq(dcp_op_fetch_direct(ck, &op, mem, cap, &lead), 1);
    tck_free(ck);
    free(data);
    free(mem);
}
END_TEST

/* dcp_op_fetch_direct_at: straight into the caller's memory where it agrees
 * with the file modulo the block size. Ops that start and end inside
 * blocks, lie inside one block, start or end on a boundary, or end with the
 * file, each land whole and alone: the bytes around dest keep their
 * pattern. 1 for a dest that does not agree, a read past the end, a decoded
 * op, a missing file. */
START_TEST(test_direct_at)
{
    const size_t size = ((size_t)3 << 20) + 123, A = DCP_DIRECT_ALIGN;
    unsigned char *data, *mem = NULL;
    int can;
    dcp_op op;
    dcp_checkpoint *ck = direct_ck(size, 12, &data, &can, &op);
    const size_t room = size + 4 * A;
    ck_assert_int_eq(posix_memalign((void **)&mem, A, room), 0);
    static const struct { uint64_t off, len; } cases[] = {
        {3 * 4096 + 17, (2u << 20) + 5},   /* inside blocks at both ends */
        {4096 + 100, 200},                 /* inside one block */
        {2 * 4096, 4096},                  /* one whole block */
        {2 * 4096, 3 * 4096 + 9},          /* from a boundary, into a block */
        {8191, 4097},                      /* into a boundary */
        {5, ((3u << 20) + 123) - 5},       /* to the end of the file, inside a block */
        {(3u << 20) + 100, 23},            /* the file's last bytes */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        op.src_offset = cases[c].off;
        op.length = cases[c].len;
        unsigned char *dest = mem + A + op.src_offset % A;
        memset(mem, 0x5a, room);
        int rc = dcp_op_fetch_direct_at(ck, &op, dest);
        ck_assert_int_eq(rc, can ? 0 : 1);
        if (!can)
            continue;
        ck_assert_msg(!memcmp(dest, data + op.src_offset, (size_t)op.length), "case %zu: bytes differ", c);
        for (unsigned char *p = mem; p < dest; p++)
            ck_assert_msg(*p == 0x5a, "case %zu: a byte before dest written", c);
        for (unsigned char *p = dest + op.length; p < mem + room; p++)
            ck_assert_msg(*p == 0x5a, "case %zu: a byte after dest written", c);
    }
    op.src_offset = 3 * A + 17;
    op.length = 1000;
    ck_assert_int_eq(dcp_op_fetch_direct_at(ck, &op, mem + A + 18), 1);   /* disagrees */
    ck_assert_int_eq(dcp_op_fetch_direct_at(ck, &op, mem + A), 1);
    op.src_offset = 5;
    op.length = size;   /* 5 bytes past the end */
    ck_assert_int_eq(dcp_op_fetch_direct_at(ck, &op, mem + 5), 1);
    op.src_offset = size - 4;   /* past the end inside its last block */
    op.length = 100;
    ck_assert_int_eq(dcp_op_fetch_direct_at(ck, &op, mem + (size - 4) % A), 1);
    op.src_offset = UINT64_MAX - 4;   /* beyond any file */
    ck_assert_int_eq(dcp_op_fetch_direct_at(ck, &op, mem + op.src_offset % A), 1);
    op.src_offset = 0;
    op.length = 0;   /* nothing */
    ck_assert_int_eq(dcp_op_fetch_direct_at(ck, &op, mem), 1);
    op.length = 100;
    op.flags = DCP_OP_DECODED;
    ck_assert_int_eq(dcp_op_fetch_direct_at(ck, &op, mem), 1);
    op.flags = 0;
    op.file = 1;   /* missing */
    ck_assert_int_eq(dcp_op_fetch_direct_at(ck, &op, mem), 1);
    tck_free(ck);
    free(data);
    free(mem);
}
END_TEST

/* Reads in pieces on several threads: any vector, any thread count, the
 * prefix up to end of file, errors that name the file. */
/* The layers' state is theirs: reads before the data files' state is made
 * fail naming the folder (never a NULL dereference), and dcp_close frees
 * what each layer registered, latest first, with a bounded number of slots. */
static int closed_order[8], nclosed;
static void note_closed(void *state) { closed_order[nclosed++] = *(int *)state; }

START_TEST(test_layer_state)
{
    dcp_checkpoint *ck = tck_new();
    uint32_t f = tck_file(ck, "a.bin", "abcdefgh", 8);
    dcp_error err;
    int fd;
    char buf[8];
    ck_assert_int_eq(dcp_file_fd(ck, f, &fd, &err), -1);
    ck_assert_int_eq(err.code, EINVAL);
    ck_assert_msg(strstr(err.msg, ck->path) && strstr(err.msg, "data files are not set up"), "%s", err.msg);
    ck_assert_int_eq(dcpi_pread_full(ck, f, buf, 8, 0, "k", &err), -1);
    ck_assert_int_eq(err.code, EINVAL);
    tck_finish(ck);
    ck_assert_int_eq(dcpi_ck_files_ready(ck, &err), -1);   /* made once */
    ck_assert_int_eq(err.code, EINVAL);
    ck_assert_msg(dcpi_pread_full(ck, f, buf, 8, 0, "k", &err) == 0, "%s", err.msg);
    ck_assert_int_eq(memcmp(buf, "abcdefgh", 8), 0);
    ck_assert_uint_eq(dcpi_files_open(ck), 1);

    static int ids[DCPI_MAX_CLOSERS] = {1, 2, 3, 4};
    nclosed = 0;
    unsigned taken = ck->nclosers;   /* files.c's */
    for (unsigned i = taken; i < DCPI_MAX_CLOSERS; i++)
        ck_assert_int_eq(dcpi_ck_on_close(ck, note_closed, &ids[i], &err), 0);
    ck_assert_int_eq(dcpi_ck_on_close(ck, note_closed, &ids[0], &err), -1);
    ck_assert_int_eq(err.code, EOVERFLOW);
    tck_free(ck);
    ck_assert_int_eq(nclosed, DCPI_MAX_CLOSERS - (int)taken);
    for (int i = 0; i < nclosed; i++)   /* latest first */
        ck_assert_int_eq(closed_order[i], DCPI_MAX_CLOSERS - i);
}
END_TEST

START_TEST(test_parallel_pieces)
{
    const size_t size = ((size_t)9 << 20) + 12345;
    unsigned char *data = malloc(size), *buf = malloc(size + 4096);
    uint64_t s = 11;
    for (size_t i = 0; i < size; i++)
        data[i] = (unsigned char)rnd64_r(&s);
    dcp_checkpoint *ck = tck_new();
    tck_file(ck, "__0_0.distcp", data, size);
    tck_finish(ck);
    int fd;
    dcp_error err;
    ck_assert_msg(dcpi_ck_fd(ck, 0, &fd, &err) == 0, "%s", err.msg);
    unsigned old = dcp_read_threads(0);
    ck_assert_uint_ge(old, 1);
    static const unsigned threads[] = {1, 2, 3, 8, 64, 1000};
    for (size_t ti = 0; ti < sizeof threads / sizeof threads[0]; ti++) {
        dcp_read_threads(threads[ti]);
        ck_assert_uint_eq(dcp_read_threads(0), threads[ti] > 64 ? 64 : threads[ti]);
        /* seven vectors of odd sizes from an odd offset */
        static const size_t lens[] = {1, 4095, (size_t)3 << 20, 7, (size_t)1 << 20, 999999, 3};
        struct iovec v[7];
        size_t total = 0, off = 333;
        memset(buf, 0, size);
        for (int i = 0; i < 7; i++) {
            v[i].iov_base = buf + total;
            v[i].iov_len = lens[i];
            total += lens[i];
        }
        size_t got = 0;
        ck_assert_int_eq(dcpi_preadv_exact(fd, v, 7, off, 0, &got), 0);
        ck_assert_uint_eq(got, total);
        ck_assert_int_eq(memcmp(buf, data + off, total), 0);
        ck_assert_ptr_eq(v[2].iov_base, buf + 4096);   /* the vector is not modified */
        /* past the end: the prefix that exists */
        memset(buf, 0, size);
        ck_assert_int_eq(dcpi_pread_exact(fd, buf, size + 4096 - 100, 100, &got), 0);
        ck_assert_uint_eq(got, size - 100);
        ck_assert_int_eq(memcmp(buf, data + 100, size - 100), 0);
        ck_assert_int_eq(dcpi_pread_full(ck, 0, buf, size, 1, "k", &err), -1);
        ck_assert_int_eq(err.code, EIO);
        ck_assert_ptr_nonnull(strstr(err.msg, "__0_0.distcp: k: short read at offset 1"));
        /* the whole file through dcp_op_fetch and the cached read */
        dcp_op op = {0};
        op.length = size;
        op.elem_size = op.dest_stride = 1;
        memset(buf, 0, size);
        ck_assert_msg(dcp_op_fetch(ck, NULL, &op, buf, &err) == 0, "%s", err.msg);
        ck_assert_int_eq(memcmp(buf, data, size), 0);
        memset(buf, 0, size);
        uint64_t c = dcp_op_fetch_cached(ck, &op, buf);
        ck_assert_uint_le(c, size);
        ck_assert_int_eq(memcmp(buf, data, (size_t)c), 0);
    }
    ck_assert_int_eq(dcpi_pread_exact(-1, buf, (size_t)8 << 20, 0, &(size_t){0}), EBADF);
    dcp_read_threads(old);
    tck_free(ck);
    free(data);
    free(buf);
}
END_TEST

/* The dcp_read_threads() budget is shared by the threads reading at once: a
 * read alone is cut into pieces, one among many is read whole; and reads on
 * many threads at once return the right bytes either way. */
struct budget_reader {
    int fd;
    const unsigned char *data;
    size_t off, len;
    int ok;
};

static void *budget_read(void *arg)
{
    struct budget_reader *r = arg;
    unsigned char *b = malloc(r->len);
    size_t got = 0;
    r->ok = b && dcpi_pread_exact(r->fd, b, r->len, r->off, &got) == 0 && got == r->len &&
            memcmp(b, r->data + r->off, r->len) == 0;
    free(b);
    return NULL;
}

START_TEST(test_shared_budget)
{
    const size_t size = (size_t)24 << 20;
    unsigned char *data = malloc(size), *buf = malloc(size);
    uint64_t s = 29;
    for (size_t i = 0; i < size; i++)
        data[i] = (unsigned char)rnd64_r(&s);
    dcp_checkpoint *ck = tck_new();
    tck_file(ck, "__0_0.distcp", data, size);
    tck_finish(ck);
    int fd;
    dcp_error err;
    ck_assert_msg(dcpi_ck_fd(ck, 0, &fd, &err) == 0, "%s", err.msg);
    unsigned old = dcp_read_threads(8);
    size_t got;
    /* alone: 8 MiB in 8 pieces, 7 threads started */
    unsigned long p0 = dcpi_read_pieces_started();
    ck_assert_int_eq(dcpi_pread_exact(fd, buf, (size_t)8 << 20, 0, &got), 0);
    ck_assert_uint_eq(dcpi_read_pieces_started() - p0, 7);
    /* five other threads reading: three pieces, on the two threads left of
     * the budget and this one */
    dcpi_read_budget_hold(5);
    p0 = dcpi_read_pieces_started();
    ck_assert_int_eq(dcpi_pread_exact(fd, buf, (size_t)8 << 20, 4096, &got), 0);
    ck_assert_uint_eq(dcpi_read_pieces_started() - p0, 2);
    ck_assert_int_eq(memcmp(buf, data + 4096, (size_t)8 << 20), 0);
    /* the budget taken (8 others): read whole, on the calling thread */
    dcpi_read_budget_hold(3);
    p0 = dcpi_read_pieces_started();
    ck_assert_int_eq(dcpi_pread_exact(fd, buf, (size_t)8 << 20, 1, &got), 0);
    ck_assert_uint_eq(dcpi_read_pieces_started() - p0, 0);
    ck_assert_uint_eq(got, (size_t)8 << 20);
    ck_assert_int_eq(memcmp(buf, data + 1, (size_t)8 << 20), 0);
    dcpi_read_budget_hold(-8);
    /* twelve readers at once, odd offsets: every one gets its bytes */
    struct budget_reader r[12];
    pthread_t th[12];
    for (int i = 0; i < 12; i++) {
        r[i] = (struct budget_reader){fd, data, (size_t)i * 1234567 + 7, ((size_t)3 << 20) + (size_t)i * 4099, 0};
        ck_assert_int_eq(pthread_create(&th[i], NULL, budget_read, &r[i]), 0);
    }
    for (int i = 0; i < 12; i++) {
        pthread_join(th[i], NULL);
        ck_assert_msg(r[i].ok, "reader %d got other bytes", i);
    }
    /* all done: alone again, pieces again */
    p0 = dcpi_read_pieces_started();
    ck_assert_int_eq(dcpi_pread_exact(fd, buf, (size_t)8 << 20, 0, &got), 0);
    ck_assert_uint_eq(dcpi_read_pieces_started() - p0, 7);
    dcp_read_threads(old);
    tck_free(ck);
    free(data);
    free(buf);
}
END_TEST

/* dcp_op_map_cached: cached bytes mapped read-only, equal to the file's;
 * nothing mapped for a decoded op, an op past the end of its file, a file
 * replaced since the checkpoint saw it, or (where the file system drops
 * pages) bytes evicted from the page cache. */
START_TEST(test_map_cached)
{
    const size_t size = ((size_t)3 << 20) + 777;
    unsigned char *data = malloc(size), *buf = malloc(size);
    uint64_t s = 41;
    for (size_t i = 0; i < size; i++)
        data[i] = (unsigned char)rnd64_r(&s);
    dcp_checkpoint *ck = tck_new();
    tck_file(ck, "__0_0.distcp", data, size);
    tck_file(ck, "__1_0.distcp", data + 5000, 4096);
    tck_finish(ck);
    dcp_error err;
    dcp_op op = {0};
    op.elem_size = op.dest_stride = 1;
    op.src_offset = 12345;   /* inside a page: the mapping starts at its page */
    op.length = size - 12345 - 100;
    ck_assert_msg(dcp_op_fetch(ck, NULL, &op, buf, &err) == 0, "%s", err.msg);   /* cached now */
    const void *at;
    void *base;
    size_t len;
    ck_assert_int_eq(dcp_op_map_cached(ck, &op, &at, &base, &len), 1);
    ck_assert_ptr_eq(at, (unsigned char *)base + 12345 % 4096);
    ck_assert_uint_ge(len, op.length);
    ck_assert_int_eq(memcmp(at, data + 12345, (size_t)op.length), 0);
    dcp_op_unmap(base, len);
    /* decoded, empty, past the end: not mapped, nothing to unmap */
    dcp_op d = op;
    d.flags = DCP_OP_DECODED;
    ck_assert_int_eq(dcp_op_map_cached(ck, &d, &at, &base, &len), 0);
    ck_assert_ptr_null(base);
    d = op;
    d.length = 0;
    ck_assert_int_eq(dcp_op_map_cached(ck, &d, &at, &base, &len), 0);
    d = op;
    d.src_offset = size - 10;
    d.length = 11;
    ck_assert_int_eq(dcp_op_map_cached(ck, &d, &at, &base, &len), 0);
    d.src_offset = UINT64_MAX - 5;
    d.length = 10;
    ck_assert_int_eq(dcp_op_map_cached(ck, &d, &at, &base, &len), 0);
    /* evicted: not all cached (tmpfs keeps its pages: skipped there) */
    int fd = openat(ck->dirfd, "__0_0.distcp", O_RDONLY);
    ck_assert_int_ge(fd, 0);
    struct statfs sf;
    int tmpfs = fstatfs(fd, &sf) == 0 && sf.f_type == 0x01021994;   /* TMPFS_MAGIC */
    if (!tmpfs) {
        ck_assert_int_eq(fdatasync(fd), 0);
        ck_assert_int_eq(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
        ck_assert_int_eq(dcp_op_map_cached(ck, &op, &at, &base, &len), 0);
    }
    close(fd);
    /* replaced by another file of the same name: never the new file's bytes */
    op.file = 1;
    op.src_offset = 0;
    op.length = 4096;
    ck_assert_msg(dcp_op_fetch(ck, NULL, &op, buf, &err) == 0, "%s", err.msg);   /* identity noted */
    ck_assert_int_eq(renameat(ck->dirfd, "__0_0.distcp", ck->dirfd, "__1_0.distcp"), 0);
    int m = dcp_op_map_cached(ck, &op, &at, &base, &len);
    if (m) {   /* the fd cached from the read above: still the original file */
        ck_assert_int_eq(memcmp(at, data + 5000, 4096), 0);
        dcp_op_unmap(base, len);
    }
    tck_free(ck);
    free(data);
    free(buf);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("reader");
    TCase *t = tcase_create("reader");
    tcase_set_timeout(t, 300);
    tcase_add_test(t, test_flags);
    tcase_add_test(t, test_short_and_missing);
    tcase_add_test(t, test_rewritten_in_place);
    tcase_add_test(t, test_batches_and_pieces);
    tcase_add_test(t, test_threads);
    tcase_add_test(t, test_fd_cache);
    tcase_add_test(t, test_cached_and_prefetch);
    tcase_add_test(t, test_direct);
    tcase_add_test(t, test_direct_at);
    tcase_add_test(t, test_parallel_pieces);
    tcase_add_test(t, test_shared_budget);
    tcase_add_test(t, test_map_cached);
    tcase_add_test(t, test_layer_state);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    (void)rng_state;
    SRunner *r = srunner_create(suite());
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? 1 : 0;
}
