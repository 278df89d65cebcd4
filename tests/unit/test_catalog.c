/* The catalog, structural verification and content digests (issue 5):
 * coverage against a brute-force reference, a large grid, digests recorded,
 * checked, exported and imported, hostile sidecars and catalog files, and the
 * model cache's round trip. */
#include "check_quiet.h"
#include <errno.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "dcp_write.h"
#include "dcp_integrity.h"
#include "planner_ck.h"

static void count_problem(void *ctx, const char *msg)
{
    (void)msg;
    (*(int *)ctx)++;
}

static void last_problem(void *ctx, const char *msg) { snprintf(ctx, 1024, "%s", msg); }

/* A checkpoint whose tensors' chunk records are resolved by hand (so no
 * torch.save zip is needed): every blob is [0, 4) of a 64-byte file. */
static size_t add_boxes(dcp_checkpoint *ck, const char *key, int ndim, const int64_t *shape, size_t nbox,
                        const int64_t *boxes /* nbox * (offsets, sizes) */)
{
    size_t idx = tck_tensor(ck, key, DCP_FLOAT32, ndim, shape);
    for (size_t b = 0; b < nbox; b++)
        tck_chunk(ck, idx, boxes + b * 2 * (size_t)ndim, boxes + b * 2 * (size_t)ndim + ndim, 0, 0, 4);
    int64_t stride[DCPI_MAX_NDIM] = {0};
    for (size_t b = 0; b < nbox; b++)
        tck_record(ck, idx, b, DCP_FLOAT32, 0, 4, 0, stride, 0);
    return idx;
}

static dcp_checkpoint *small_ck(void)
{
    dcp_checkpoint *ck = tck_new();
    unsigned char data[64] = {0};
    tck_file(ck, "__0_0.distcp", data, sizeof data);
    return ck;
}

/* Random boxes in a 4x3x5 tensor: verify reports nothing exactly when every
 * element is covered once (checked element by element). */
START_TEST(coverage_matches_reference)
{
    const int64_t shape[3] = {4, 3, 5};
    unsigned seed = 12345;
    for (int round = 0; round < 400; round++) {
        dcp_checkpoint *ck = small_ck();
        int64_t boxes[8 * 6];
        size_t nbox;
        if (round % 2) {   /* a real tiling, then maybe one box changed */
            int64_t cut0 = 1 + rand_r(&seed) % 3, cut2 = 1 + rand_r(&seed) % 4;
            int64_t t[4][6] = {{0, 0, 0, cut0, 3, cut2}, {0, 0, cut2, cut0, 3, 5 - cut2},
                               {cut0, 0, 0, 4 - cut0, 3, cut2}, {cut0, 0, cut2, 4 - cut0, 3, 5 - cut2}};
            memcpy(boxes, t, sizeof t);
            nbox = 4;
            if (round % 3 == 0) {
                int b = rand_r(&seed) % 4, d = rand_r(&seed) % 3;
                if (boxes[b * 6 + d] > 0)
                    boxes[b * 6 + d]--;
                else if (boxes[b * 6 + 3 + d] > 1)
                    boxes[b * 6 + 3 + d]--;
            }
        } else {
            nbox = 1 + (size_t)(rand_r(&seed) % 6);
            for (size_t b = 0; b < nbox; b++)
                for (int d = 0; d < 3; d++) {
                    boxes[b * 6 + d] = rand_r(&seed) % shape[d];
                    boxes[b * 6 + 3 + d] = 1 + rand_r(&seed) % (shape[d] - boxes[b * 6 + d]);
                }
        }
        int cover[4][3][5] = {{{0}}};
        for (size_t b = 0; b < nbox; b++)
            for (int64_t i = boxes[b * 6]; i < boxes[b * 6] + boxes[b * 6 + 3]; i++)
                for (int64_t j = boxes[b * 6 + 1]; j < boxes[b * 6 + 1] + boxes[b * 6 + 4]; j++)
                    for (int64_t k = boxes[b * 6 + 2]; k < boxes[b * 6 + 2] + boxes[b * 6 + 5]; k++)
                        cover[i][j][k]++;
        int exact = 1;
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 3; j++)
                for (int k = 0; k < 5; k++)
                    exact &= cover[i][j][k] == 1;
        add_boxes(ck, "t", 3, shape, nbox, boxes);
        tck_finish(ck);
        int seen = 0;
        uint64_t n = 99;
        dcp_error err;
        ck_assert_int_eq(dcp_verify_structure(ck, count_problem, &seen, &n, &err), 0);
        ck_assert_msg((n == 0) == exact, "round %d: %llu problems, exact %d", round, (unsigned long long)n, exact);
        ck_assert_int_eq((int)n, seen);
        tck_free(ck);
    }
}
END_TEST

/* A 400x400 grid of one tensor (160,000 chunks): intact, then one chunk
 * shifted (an overlap and a gap), then one dropped (a gap). */
static void grid(int variant, uint64_t *nproblems, char *msg)
{
    enum { G = 400 };
    const int64_t shape[2] = {G * 2, G * 3};
    int64_t *boxes = malloc((size_t)G * G * 4 * sizeof *boxes);
    ck_assert_ptr_nonnull(boxes);
    size_t n = 0;
    for (int i = 0; i < G; i++)
        for (int j = 0; j < G; j++) {
            if (variant == 2 && i == 123 && j == 321)
                continue;
            int64_t *b = boxes + n++ * 4;
            b[0] = i * 2, b[1] = j * 3, b[2] = 2, b[3] = 3;
            if (variant == 1 && i == 200 && j == 7)
                b[1] += 1;   /* overlaps (200,8) and leaves a gap */
        }
    dcp_checkpoint *ck = small_ck();
    add_boxes(ck, "grid", 2, shape, n, boxes);
    free(boxes);
    tck_finish(ck);
    dcp_error err;
    msg[0] = 0;
    ck_assert_int_eq(dcp_verify_structure(ck, last_problem, msg, nproblems, &err), 0);
    tck_free(ck);
}

START_TEST(coverage_large_grid)
{
    char msg[1024];
    uint64_t n;
    grid(0, &n, msg);
    ck_assert_msg(n == 0, "intact grid: %s", msg);
    grid(1, &n, msg);
    ck_assert_uint_eq(n, 1);
    ck_assert_msg(strstr(msg, "grid: chunks [400:2,22:3] and [400:2,24:3] (start:count) overlap"), "%s", msg);
    grid(2, &n, msg);
    ck_assert_uint_eq(n, 1);
    ck_assert_msg(strstr(msg, "grid: chunks cover 959994 of 960000 elements (a gap)"), "%s", msg);
}
END_TEST

/* ------------------------------------------------------------ digests */

static char tmpdir[4096];

static void make_tmpdir(void)
{
    const char *t = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/dcp-cat-XXXXXX", t && *t ? t : "/tmp");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void rm_tmpdir(void)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    ck_assert_int_eq(system(cmd), 0);
}

/* Two files of blobs, some inside one hashing window, one larger than it. */
static dcp_checkpoint *blob_ck(void)
{
    dcp_checkpoint *ck = tck_new();
    size_t big = (5u << 20) + 17;
    unsigned char *data = malloc(big);
    ck_assert_ptr_nonnull(data);
    for (size_t i = 0; i < big; i++)
        data[i] = (unsigned char)(i * 7 + (i >> 9));
    tck_file(ck, "a.distcp", data, 4096);
    tck_file(ck, "b.distcp", data, big);
    free(data);
    const int64_t shape[1] = {1024}, off0[1] = {0}, off1[1] = {512}, sz[1] = {512};
    size_t w = tck_tensor(ck, "w", DCP_FLOAT32, 1, shape);
    tck_chunk(ck, w, off0, sz, 0, 0, 2048);
    tck_chunk(ck, w, off1, sz, 0, 2048, 2048);
    const int64_t bshape[1] = {(int64_t)(big - 17)}, boff[1] = {0}, bsz[1] = {(int64_t)(big - 17)};
    size_t b = tck_tensor(ck, "big", DCP_UINT8, 1, bshape);
    tck_chunk(ck, b, boff, bsz, 1, 17, big - 17);
    tck_finish(ck);
    return ck;
}

static void flip(dcp_checkpoint *ck, const char *file, off_t off)
{
    int fd = openat(ck->dirfd, file, O_RDWR);
    unsigned char c;
    struct stat st;
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(fstat(fd, &st), 0);
    ck_assert_int_eq(pread(fd, &c, 1, off), 1);
    c ^= 0x40;
    ck_assert_int_eq(pwrite(fd, &c, 1, off), 1);
    /* bit rot leaves the mtime as it was (a write that moves it is a new
     * save to the open checkpoint, whose reads fail before any digest) */
    struct timespec t[2] = {{.tv_nsec = UTIME_OMIT}, st.st_mtim};
    ck_assert_int_eq(futimens(fd, t), 0);
    close(fd);
}

/* Reads of one file (by inode) can be made to fail or to stall: this
 * definition of pread takes the place of the C library's in this program,
 * the library's objects included. */
static struct {
    ino_t ino;                 /* 0: no file chosen */
    off_t fail_at;             /* a read at this offset fails with EIO */
    off_t helper_stall_at;     /* a read at this offset by a helper thread waits stall_us first */
    off_t main_stall_at;       /* one by the main thread waits 2 * stall_us after reading */
    useconds_t stall_us;
    int main_started;          /* the main thread's first read waits stall_us / 3 */
} inject;

static ssize_t real_pread(int fd, void *buf, size_t n, off_t off)
{
    return (ssize_t)syscall(SYS_pread64, fd, buf, n, off);
}

ssize_t pread(int fd, void *buf, size_t n, off_t off)
{
    struct stat sb;
    if (!inject.ino || fstat(fd, &sb) < 0 || sb.st_ino != inject.ino)
        return real_pread(fd, buf, n, off);
    int helper = syscall(SYS_gettid) != getpid();
    if (!helper && !inject.main_started) {
        inject.main_started = 1;
        usleep(inject.stall_us / 3);   /* the reader thread gets ahead */
    }
    if (off == inject.fail_at) {
        errno = EIO;
        return -1;
    }
    if (off == inject.helper_stall_at && helper)
        usleep(inject.stall_us);
    ssize_t r = real_pread(fd, buf, n, off);
    if (off == inject.main_stall_at && !helper)
        usleep(2 * inject.stall_us);
    return r;
}

/* A read error inside a large blob: that blob is reported, the next ones
 * (read while the reader thread may still be filling a buffer of the one
 * that failed) hash right, and verify ends. The check timeout stands in
 * for `timeout`: before buffers were kept from being claimed twice, this
 * hung or reported the blobs after it as changed. */
START_TEST(verify_read_error_mid_blob)
{
    const size_t window = 256u << 10, pieces = 20, big = pieces * window;
    dcp_checkpoint *ck = tck_new();
    unsigned char *data = malloc(3 * big);
    ck_assert_ptr_nonnull(data);
    for (size_t i = 0; i < 3 * big; i++)
        data[i] = (unsigned char)((i * 0x9E3779B97F4A7C15ull) >> 56);   /* no two pieces alike */
    tck_file(ck, "c.distcp", data, 3 * big);
    free(data);
    const int64_t shape[1] = {(int64_t)big}, off0[1] = {0};
    const char *keys[3] = {"first", "second", "third"};
    for (int k = 0; k < 3; k++) {
        size_t t = tck_tensor(ck, keys[k], DCP_UINT8, 1, shape);
        tck_chunk(ck, t, off0, shape, 0, (uint64_t)k * big, big);
    }
    tck_finish(ck);
    dcp_catalog *cat;
    dcp_error err;
    uint64_t n, checked, missing, problems;
    ck_assert_int_eq(dcp_catalog_open(":memory:", &cat, &err), 0);
    ck_assert_msg(dcp_catalog_record(cat, ck, NULL, NULL, &n, &err) == 0, "%s", err.msg);
    ck_assert_uint_eq(n, 3);
    struct stat sb;
    ck_assert_int_eq(fstatat(ck->dirfd, "c.distcp", &sb, 0), 0);
    for (int round = 0; round < 2; round++) {
        /* the first blob's second piece fails; its fifth is still being
         * read by the reader thread when the hasher moves on to the second
         * blob, whose first piece falls in the same buffer */
        inject.fail_at = (off_t)window;
        inject.helper_stall_at = (off_t)(4 * window);
        inject.main_stall_at = (off_t)big;
        inject.stall_us = 300000;
        inject.main_started = 0;
        inject.ino = sb.st_ino;
        char msg[1024] = "";
        int rc = dcp_verify_digests(cat, ck, last_problem, msg, NULL, NULL, &checked, &missing, &problems, &err);
        inject.ino = 0;
        ck_assert_msg(rc == 0, "%s", err.msg);
        ck_assert_uint_eq(checked, 3);
        ck_assert_msg(problems == 1, "round %d: %llu problems, the last: %s", round, (unsigned long long)problems, msg);
        ck_assert_msg(strstr(msg, "/c.distcp: first: cannot re-hash the bytes at offset 0 (length 5242880): Input/output error"),
                      "%s", msg);
    }
    dcp_catalog_close(cat);
    tck_free(ck);
}
END_TEST

START_TEST(digests_record_verify_export_import)
{
    make_tmpdir();
    char catpath[4200], sidecar[4200];
    snprintf(catpath, sizeof catpath, "%s/sub/dir/catalog.sqlite", tmpdir);
    snprintf(sidecar, sizeof sidecar, "%s/digests.txt", tmpdir);
    dcp_checkpoint *ck = blob_ck();
    dcp_catalog *cat;
    dcp_error err;
    uint64_t n, checked, missing, problems;
    ck_assert_msg(dcp_catalog_open(catpath, &cat, &err) == 0, "%s", err.msg);
    /* nothing recorded yet */
    ck_assert_int_eq(dcp_verify_digests(cat, ck, NULL, NULL, NULL, NULL, &checked, &missing, &problems, &err), 0);
    ck_assert_uint_eq(checked, 0);
    ck_assert_uint_eq(missing, 3);
    ck_assert_msg(dcp_catalog_record(cat, ck, NULL, NULL, &n, &err) == 0, "%s", err.msg);
    ck_assert_uint_eq(n, 3);
    /* the bulk hasher and the one-blob digest agree */
    for (size_t c = 0; c < 2; c++) {
        uint64_t h, want;
        int found;
        const dcp_blob *b = &ck->priv[0].chunks[c].blob;
        ck_assert_int_eq(dcp_blob_digest(ck, b, &h, &err), 0);
        ck_assert_int_eq(dcp_catalog_digest(cat, ck, b, &want, &found, &err), 0);
        ck_assert_int_eq(found, 1);
        ck_assert_uint_eq(h, want);
    }
    ck_assert_int_eq(dcp_verify_digests(cat, ck, NULL, NULL, NULL, NULL, &checked, &missing, &problems, &err), 0);
    ck_assert_uint_eq(checked, 3);
    ck_assert_uint_eq(problems, 0);
    ck_assert_int_eq(dcp_digests_export(cat, ck, sidecar, &err), 0);
    ck_assert_int_eq(dcp_verify_blob(cat, ck, "w", &ck->priv[0].chunks[1].blob, &err), 1);
    ck_assert_msg(dcp_check_blob(cat, ck, "w", &ck->priv[0].chunks[1].blob, &err) == 0, "%s", err.msg);
    /* a blob nothing was recorded for: not found, which is no failure of its bytes */
    dcp_blob other = ck->priv[0].chunks[1].blob;
    other.offset += 1;
    other.length -= 1;
    ck_assert_int_eq(dcp_check_blob(cat, ck, "w", &other, &err), -1);
    ck_assert_int_eq(err.code, DCP_ENOTFOUND);
    ck_assert_msg(strstr(err.msg, "/a.distcp: w: no digest recorded in ") &&
                  strstr(err.msg, "catalog.sqlite for the blob at offset 2049 (length 2047)"), "%s", err.msg);
    ck_assert_int_eq(dcp_verify_blob(cat, ck, "w", &other, &err), 0);

    /* a flipped byte in the second chunk and one deep in the large blob */
    flip(ck, "a.distcp", 3000);
    flip(ck, "b.distcp", (5 << 20) - 3);
    char msg[1024];
    ck_assert_int_eq(dcp_verify_digests(cat, ck, last_problem, msg, NULL, NULL, &checked, &missing, &problems, &err), 0);
    ck_assert_uint_eq(problems, 2);
    ck_assert_msg(strstr(msg, "/b.distcp: big: bytes at offset 17 (length 5242880) changed"), "%s", msg);
    ck_assert_int_eq(dcp_verify_blob(cat, ck, "w", &ck->priv[0].chunks[0].blob, &err), 1);
    ck_assert_int_eq(dcp_verify_blob(cat, ck, "w", &ck->priv[0].chunks[1].blob, &err), -1);
    ck_assert_int_eq(err.code, EIO);
    ck_assert_msg(strstr(err.msg, "/a.distcp: w: bytes at offset 2048 (length 2048) do not match"), "%s", err.msg);
    ck_assert_int_eq(dcp_check_blob(cat, ck, "w", &ck->priv[0].chunks[0].blob, &err), 0);
    ck_assert_int_eq(dcp_check_blob(cat, ck, "w", &ck->priv[0].chunks[1].blob, &err), -1);
    ck_assert_int_eq(err.code, EIO);
    ck_assert_msg(strstr(err.msg, "/a.distcp: w: bytes at offset 2048 (length 2048) do not match"), "%s", err.msg);
    dcp_catalog_close(cat);

    /* the sidecar carries the digests into a fresh in-memory catalog */
    ck_assert_int_eq(dcp_catalog_open(":memory:", &cat, &err), 0);
    ck_assert_msg(dcp_catalog_import(cat, ck, sidecar, &n, &err) == 0, "%s", err.msg);
    ck_assert_uint_eq(n, 3);
    ck_assert_int_eq(dcp_verify_digests(cat, ck, NULL, NULL, NULL, NULL, &checked, &missing, &problems, &err), 0);
    ck_assert_uint_eq(checked, 3);
    ck_assert_uint_eq(problems, 2);

    /* a truncated file: the blob past its end is reported, not fatal */
    int fd = openat(ck->dirfd, "b.distcp", O_WRONLY);
    ck_assert_int_eq(ftruncate(fd, 1000), 0);
    close(fd);
    ck_assert_int_eq(dcp_verify_digests(cat, ck, last_problem, msg, NULL, NULL, &checked, &missing, &problems, &err), 0);
    ck_assert_uint_eq(problems, 2);
    ck_assert_msg(strstr(msg, "big: cannot re-hash the bytes at offset 17"), "%s", msg);
    dcp_catalog_close(cat);
    tck_free(ck);
    rm_tmpdir();
}
END_TEST

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

START_TEST(sidecar_hostile)
{
    make_tmpdir();
    char side[4200];
    snprintf(side, sizeof side, "%s/s.txt", tmpdir);
    dcp_checkpoint *ck = blob_ck();
    dcp_catalog *cat;
    dcp_error err;
    uint64_t n;
    ck_assert_int_eq(dcp_catalog_open(":memory:", &cat, &err), 0);
    static const char *bad[] = {
        "not a sidecar\n",
        "dcpfs-digests 1\n0123456789abcdef 0 10 ../escape\n",
        "dcpfs-digests 1\n0123456789abcdef 0 10 /etc/passwd\n",
        "dcpfs-digests 1\n0123456789abcdef -1\n",
        "dcpfs-digests 1\n0123456789abcdef 9223372036854775808 1 a.distcp\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        write_file(side, bad[i]);
        ck_assert_int_eq(dcp_catalog_import(cat, ck, side, &n, &err), -1);
        ck_assert_int_eq(err.code, EINVAL);
        ck_assert_uint_eq(n, 0);
    }
    /* a rolled-back import leaves nothing behind */
    uint64_t checked, missing, problems;
    ck_assert_int_eq(dcp_verify_digests(cat, ck, NULL, NULL, NULL, NULL, &checked, &missing, &problems, &err), 0);
    ck_assert_uint_eq(checked, 0);
    dcp_catalog_close(cat);
    tck_free(ck);
    rm_tmpdir();
}
END_TEST

/* ------------------------------------------------------------ catalog files */

START_TEST(catalog_foreign_and_garbage_files_rebuilt)
{
    make_tmpdir();
    char path[4200], aside[4300];
    snprintf(path, sizeof path, "%s/catalog.sqlite", tmpdir);
    snprintf(aside, sizeof aside, "%s.corrupt", path);
    dcp_catalog *cat;
    dcp_error err;
    /* some other program's database */
    sqlite3 *db;
    ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
    ck_assert_int_eq(sqlite3_exec(db, "CREATE TABLE t(x); INSERT INTO t VALUES(1)", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    ck_assert_int_eq(dcp_catalog_open(path, &cat, &err), 0);
    dcp_catalog_close(cat);
    ck_assert_int_eq(access(aside, F_OK), 0);
    unlink(aside);
    /* reopening our own catalog keeps it */
    ck_assert_int_eq(dcp_catalog_open(path, &cat, &err), 0);
    dcp_catalog_close(cat);
    ck_assert_int_eq(access(aside, F_OK), -1);
    /* garbage bytes */
    write_file(path, "SQLite format 3 but not really, just garbage..................................................");
    ck_assert_int_eq(dcp_catalog_open(path, &cat, &err), 0);
    dcp_catalog_close(cat);
    ck_assert_int_eq(access(aside, F_OK), 0);
    rm_tmpdir();
}
END_TEST

/* A format-2 catalog that cannot be upgraded now (here: read-only to the
 * user; likewise when another process keeps it busy) is an error, not a
 * foreign file: it stays where it is, with its digests. */
START_TEST(catalog_format2_kept_when_upgrade_fails)
{
    make_tmpdir();
    char path[4200], aside[4300];
    snprintf(path, sizeof path, "%s/catalog.sqlite", tmpdir);
    snprintf(aside, sizeof aside, "%s.corrupt", path);
    dcp_checkpoint *ck = blob_ck();
    dcp_catalog *cat;
    dcp_error err;
    uint64_t n;
    ck_assert_int_eq(dcp_catalog_open(path, &cat, &err), 0);
    ck_assert_msg(dcp_catalog_record(cat, ck, NULL, NULL, &n, &err) == 0, "%s", err.msg);
    dcp_catalog_close(cat);
    sqlite3 *db;
    ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
    ck_assert_int_eq(sqlite3_exec(db, "PRAGMA journal_mode=DELETE; UPDATE catalog_meta SET value='dcpfs-catalog-2'"
                                      " WHERE key='format'", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    /* read-only to whoever opens it (root ignores modes: open it as nobody);
     * the folder stays writable, so a quarantine could move the file */
    ck_assert_int_eq(chmod(tmpdir, 0777), 0);
    ck_assert_int_eq(chmod(path, 0444), 0);
    int status = 0;
    if (getuid() == 0) {
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
            if (setgid(65534) < 0 || setuid(65534) < 0)
                _exit(3);
            int rc = dcp_catalog_open(path, &cat, &err);
            dcp_catalog_close(cat);
            _exit(rc == 0 ? 0 : strstr(err.msg, "left as it is") ? 1 : 2);
        }
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_assert(WIFEXITED(status));
        status = WEXITSTATUS(status);
    } else {
        int rc = dcp_catalog_open(path, &cat, &err);
        dcp_catalog_close(cat);
        status = rc == 0 ? 0 : strstr(err.msg, "left as it is") ? 1 : 2;
    }
    ck_assert_msg(status == 0 || status == 1, "open status %d", status);
    ck_assert_int_eq(access(path, F_OK), 0);
    ck_assert_int_eq(access(aside, F_OK), -1);
    ck_assert_int_eq(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_stmt *st;
    ck_assert_int_eq(sqlite3_prepare_v2(db, "SELECT count(*) FROM digests", -1, &st, NULL), SQLITE_OK);
    ck_assert_int_eq(sqlite3_step(st), SQLITE_ROW);
    ck_assert_int_eq(sqlite3_column_int(st, 0), 3);
    sqlite3_finalize(st);
    sqlite3_close(db);
    tck_free(ck);
    rm_tmpdir();
}
END_TEST

/* ------------------------------------------------------------ model cache */

/* Two models of one checkpoint hold the same entries, chunks and info. */
static void same_model(dcp_checkpoint *a, dcp_checkpoint *b)
{
    dcp_error err;
    ck_assert_uint_eq(dcp_num_entries(a), dcp_num_entries(b));
    ck_assert_uint_eq(dcp_num_files(a), dcp_num_files(b));
    for (size_t f = 0; f < dcp_num_files(a); f++)
        ck_assert_str_eq(dcp_file_name(a, (uint32_t)f), dcp_file_name(b, (uint32_t)f));
    for (size_t i = 0; i < dcp_num_entries(a); i++) {
        const dcp_entry *x = dcp_entry_at(a, i), *y = dcp_entry_at(b, i);
        ck_assert_ptr_nonnull(x);
        ck_assert_ptr_nonnull(y);
        ck_assert_str_eq(x->key, y->key);
        ck_assert_int_eq(x->kind, y->kind);
        ck_assert_int_eq(x->dtype, y->dtype);
        ck_assert_int_eq(x->ndim, y->ndim);
        ck_assert_uint_eq(x->nchunks, y->nchunks);
        ck_assert(!x->ndim || !memcmp(x->shape, y->shape, (size_t)x->ndim * 8));
        ck_assert(!memcmp(&x->blob, &y->blob, sizeof x->blob));
        const dcp_chunk *cx, *cy;
        ck_assert_msg(dcp_entry_chunks(a, x, &cx, &err) == 0, "%s", err.msg);
        ck_assert_msg(dcp_entry_chunks(b, y, &cy, &err) == 0, "%s", err.msg);
        for (size_t c = 0; c < x->nchunks; c++) {
            ck_assert(!memcmp(&cx[c].blob, &cy[c].blob, sizeof cx[c].blob));
            ck_assert_int_eq(cx[c].has_blob, cy[c].has_blob);
            ck_assert(!x->ndim || !memcmp(cx[c].offsets, cy[c].offsets, (size_t)x->ndim * 8));
            ck_assert(!x->ndim || !memcmp(cx[c].sizes, cy[c].sizes, (size_t)x->ndim * 8));
        }
        dcp_release_chunks(a, x);
        dcp_release_chunks(b, y);
    }
    const dcp_info *p = dcp_get_info(a), *q = dcp_get_info(b);
    ck_assert_str_eq(p->serialization, q->serialization);
    ck_assert_str_eq(p->generation, q->generation);
    ck_assert_uint_eq(p->metadata_bytes, q->metadata_bytes);
}

START_TEST(model_cache_round_trip)
{
    const char *top = getenv("top_srcdir");
    static const char *cases[] = {"01_single_plain", "02_rowwise_4ranks", "04_block_4ranks", "05_mixed_2ranks",
                                  "09_megatron_torch_dist"};
    make_tmpdir();
    char catpath[4200];
    snprintf(catpath, sizeof catpath, "%s/catalog.sqlite", tmpdir);
    dcp_open_options cat = DCP_OPEN_OPTIONS_INIT;
    cat.flags = DCP_OPEN_CATALOG;
    cat.catalog = catpath;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/tests/fixtures/%s/ckpt", top ? top : "..", cases[i]);
        dcp_checkpoint *parsed, *first, *cached;
        dcp_error err;
        ck_assert_msg(dcp_open(path, 0, &parsed, &err) == 0, "%s", err.msg);
        ck_assert_msg(dcp_open_ex(path, &cat, &first, &err) == 0, "%s", err.msg);
        ck_assert_int_eq(dcp_from_catalog(first), 0);
        ck_assert_msg(dcp_open_ex(path, &cat, &cached, &err) == 0, "%s", err.msg);
        ck_assert_msg(dcp_from_catalog(cached) == 1, "%s: not served from the catalog", cases[i]);
        same_model(parsed, cached);
        dcp_close(parsed);
        dcp_close(first);
        dcp_close(cached);
    }
    /* every stored record damaged in turn: never served, always parsed */
    sqlite3 *db;
    ck_assert_int_eq(sqlite3_open(catpath, &db), SQLITE_OK);
    ck_assert_int_eq(sqlite3_exec(db, "UPDATE models SET head = CAST(zeroblob(length(head)) AS BLOB)", NULL, NULL, NULL),
                     SQLITE_OK);
    sqlite3_close(db);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/tests/fixtures/%s/ckpt", top ? top : "..", cases[i]);
        dcp_checkpoint *ck;
        dcp_error err;
        ck_assert_int_eq(dcp_open_ex(path, &cat, &ck, &err), 0);
        ck_assert_int_eq(dcp_from_catalog(ck), 0);
        dcp_close(ck);
    }
    rm_tmpdir();
}
END_TEST

/* Checkpoints written by the project's own DCP writer, whose volume check
 * lets an overlap that leaves a gap of the same size through: rows [0,2)
 * and [1,3) of a 4x4 tensor. verify names the overlap; a plain gap is
 * refused by the writer already. */
static int fill_iota(void *ctx, uint64_t tag, uint64_t off, void *buf, size_t len, dcp_error *err)
{
    (void)ctx, (void)tag, (void)err;
    for (size_t i = 0; i < len; i++)
        ((unsigned char *)buf)[i] = (unsigned char)(off + i);
    return 0;
}

static int write_rows(const char *dir, const int64_t (*rows)[2], int n, dcp_error *err)
{
    const int64_t shape[2] = {4, 4};
    dcp_source src = {.fill = fill_iota};
    dcp_ckpt_writer *w = NULL;
    int rc = dcp_ckpt_create(dir, NULL, &w, err);
    if (rc == 0)
        rc = dcp_ckpt_add_tensor(w, "w", DCP_FLOAT32, 2, shape, err);
    for (int i = 0; rc == 0 && i < n; i++) {
        const int64_t off[2] = {rows[i][0], 0}, size[2] = {rows[i][1] - rows[i][0], 4};
        rc = dcp_ckpt_add_chunk(w, "w", i, off, size, &src, (uint64_t)i, NULL, err);
    }
    if (rc == 0)
        rc = dcp_ckpt_finish(w, err);
    dcp_ckpt_free(w);
    return rc;
}

START_TEST(verify_writer_built_overlap_and_gap)
{
    make_tmpdir();
    char dir[4200], msg[1024] = "";
    dcp_error err;
    snprintf(dir, sizeof dir, "%s/overlap", tmpdir);
    const int64_t overlap[2][2] = {{0, 2}, {1, 3}};
    ck_assert_msg(write_rows(dir, overlap, 2, &err) == 0, "%s", err.msg);
    dcp_checkpoint *ck;
    ck_assert_msg(dcp_open(dir, DCP_OPEN_DEFAULT, &ck, &err) == 0, "%s", err.msg);
    uint64_t n = 0;
    ck_assert_int_eq(dcp_verify_structure(ck, last_problem, msg, &n, &err), 0);
    ck_assert_uint_ge(n, 1);
    ck_assert_msg(strstr(msg, "w: chunks [0:2,0:4] and [1:2,0:4] (start:count) overlap"), "%s", msg);
    dcp_close(ck);

    snprintf(dir, sizeof dir, "%s/gap", tmpdir);
    const int64_t gap[2][2] = {{0, 2}, {3, 4}};
    ck_assert_int_lt(write_rows(dir, gap, 2, &err), 0);
    ck_assert_msg(strstr(err.msg, "w"), "%s", err.msg);
    strcat(dir, "/.metadata");
    ck_assert_int_eq(access(dir, F_OK), -1);   /* refused: no checkpoint left behind */
    rm_tmpdir();
}
END_TEST

int main(void)
{
    Suite *s = suite_create("catalog");
    TCase *tc = tcase_create("all");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, coverage_matches_reference);
    tcase_add_test(tc, coverage_large_grid);
    tcase_add_test(tc, verify_writer_built_overlap_and_gap);
    tcase_add_test(tc, digests_record_verify_export_import);
    tcase_add_test(tc, verify_read_error_mid_blob);
    tcase_add_test(tc, sidecar_hostile);
    tcase_add_test(tc, catalog_foreign_and_garbage_files_rebuilt);
    tcase_add_test(tc, catalog_format2_kept_when_upgrade_fails);
    tcase_add_test(tc, model_cache_round_trip);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
