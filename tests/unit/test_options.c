/* Options structs that can grow (dcp.h, options): a caller with a size from
 * the initialiser, a size too small (0: no initialiser), a size past what
 * the library knows (zero tail accepted, set tail E2BIG), and a program
 * linked against 0.1 (the DCP_0.1 versions of the calls, reached with
 * dlvsym as the dynamic linker would bind an old binary) with the old
 * layouts and the old DCP_CKPT_* flag values. Also dcp_parse_size_ex. */

#include "check_quiet.h"
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dcp_export.h"
#include "dcp_gplan.h"
#include "dcp_write.h"

static char tmpdir[256];

static void setup(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dcp-test-options.XXXXXX");
    ck_assert(mkdtemp(tmpdir) != NULL);
}

static void teardown(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    ck_assert(system(cmd) == 0);
}

/* A small checkpoint made with sized options: 3 keys of 4x4 float32 over 2 ranks. */
static void synth(const char *dir)
{
    dcp_synth_options o = DCP_SYNTH_OPTIONS_INIT;
    o.nkeys = 3;
    o.ndim = 2;
    o.shape[0] = o.shape[1] = 4;
    o.dtype = DCP_FLOAT32;
    o.ranks = 2;
    o.chunks_per_key = 1;
    dcp_error err;
    ck_assert_msg(dcp_synth_checkpoint(dir, &o, &err) == 0, "%s", err.msg);
}

START_TEST(test_sized_caller)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/ck", tmpdir);
    synth(dir);
    dcp_error err;
    dcp_checkpoint *ck;
    dcp_open_options o = DCP_OPEN_OPTIONS_INIT;
    ck_assert_uint_eq(o.size, sizeof(dcp_open_options));
    ck_assert_msg(dcp_open_ex(dir, &o, &ck, &err) == 0, "%s", err.msg);
    ck_assert_uint_eq(dcp_num_entries(ck), 3);
    dcp_close(ck);
    /* NULL options: the defaults, as before */
    ck_assert_msg(dcp_open_ex(dir, NULL, &ck, &err) == 0, "%s", err.msg);
    dcp_close(ck);
}
END_TEST

START_TEST(test_size_too_small)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/ck", tmpdir);
    synth(dir);
    dcp_error err;
    dcp_checkpoint *ck = (dcp_checkpoint *)1;
    dcp_open_options o = {0};   /* not made by DCP_OPEN_OPTIONS_INIT */
    ck_assert_int_eq(dcp_open_ex(dir, &o, &ck, &err), -1);
    ck_assert_int_eq(err.code, EINVAL);
    ck_assert_ptr_null(ck);
    ck_assert_msg(strstr(err.msg, "dcp_open_ex") && strstr(err.msg, "DCP_OPEN_OPTIONS_INIT"), "%s", err.msg);
    o.size = offsetof(dcp_open_options, catalog) + sizeof o.catalog - 1;   /* below the first sized layout */
    ck_assert_int_eq(dcp_open_ex(dir, &o, &ck, &err), -1);
    ck_assert_int_eq(err.code, EINVAL);
    /* the first sized layout (before rank was appended) is accepted, rank reading as 0 */
    o.size = offsetof(dcp_open_options, catalog) + sizeof o.catalog;
    o.rank = 3;
    ck_assert_msg(dcp_open_ex(dir, &o, &ck, &err) == 0, "%s", err.msg);
    dcp_close(ck);
    o.rank = 0;

    /* the same rule for every sized struct */
    dcp_ckpt_writer *w;
    dcp_ckpt_options co = {0};
    char out[300];
    snprintf(out, sizeof out, "%s/w", tmpdir);
    ck_assert_int_eq(dcp_ckpt_create(out, &co, &w, &err), -1);
    ck_assert_int_eq(err.code, EINVAL);
    ck_assert_msg(strstr(err.msg, "DCP_CKPT_OPTIONS_INIT"), "%s", err.msg);
    dcp_convert_options cv = {0};
    snprintf(out, sizeof out, "%s/x.safetensors", tmpdir);
    ck_assert_int_eq(dcp_convert_files(dir, out, &cv, &err), -1);
    ck_assert_int_eq(err.code, EINVAL);
    ck_assert_int_eq(access(out, F_OK), -1);
    dcp_synth_options so = {0};
    snprintf(out, sizeof out, "%s/s", tmpdir);
    ck_assert_int_eq(dcp_synth_checkpoint(out, &so, &err), -1);
    ck_assert_int_eq(err.code, EINVAL);
    dcp_export_options xo = {0};
    ck_assert_int_eq(dcp_export_hf(dir, out, &xo, &err), -1);
    ck_assert_int_eq(err.code, EINVAL);
}
END_TEST

/* A caller built against newer headers: its struct is longer. */
typedef struct newer_open_options {
    dcp_open_options known;
    uint64_t later_field;
} newer_open_options;

START_TEST(test_size_too_large)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/ck", tmpdir);
    synth(dir);
    dcp_error err;
    dcp_checkpoint *ck;
    newer_open_options n;
    memset(&n, 0, sizeof n);
    n.known.size = sizeof n;
    /* a field this library does not know, left at its default: accepted */
    ck_assert_msg(dcp_open_ex(dir, &n.known, &ck, &err) == 0, "%s", err.msg);
    dcp_close(ck);
    /* set: refused rather than silently ignored */
    n.later_field = 1;
    ck_assert_int_eq(dcp_open_ex(dir, &n.known, &ck, &err), -1);
    ck_assert_int_eq(err.code, E2BIG);
    ck_assert_msg(strstr(err.msg, "dcp_open_ex"), "%s", err.msg);
}
END_TEST

/* 0.1's layouts, as src/abi_0_1.c knows them. */
typedef struct open_options_0_1 {
    unsigned flags;
    const char *catalog;
} open_options_0_1;
typedef struct ckpt_options_0_1 {
    unsigned flags;
    const char *checkpoint_id;
} ckpt_options_0_1;
typedef struct convert_options_0_1 {
    dcp_format from, to;
    const char *keys;
    uint64_t max_shard_size;
    unsigned flags;
    dcp_progress_fn progress;
    void *progress_ctx;
    dcp_skip_fn skipped;
    void *skipped_ctx;
} convert_options_0_1;
typedef struct gplan_opts_0_1 {
    uint64_t unit_max;
    int no_bcast;
    const int *node;
    int shm;
    int bcast_local;
} gplan_opts_0_1;

static void *old_call(const char *name)
{
    void *f = dlvsym(RTLD_DEFAULT, name, "DCP_0.1");
    ck_assert_msg(f != NULL, "%s@DCP_0.1 is not exported", name);
    /* the default version is another function */
    ck_assert_ptr_ne(f, dlvsym(RTLD_DEFAULT, name, "DCP_0.2"));
    return f;
}

/* libdcp linked as a shared library (the versions exist only there). */
static int linked_shared(void)
{
    return dlvsym(RTLD_DEFAULT, "dcp_open_ex", "DCP_0.2") != NULL;
}

/* The CRC-32 of the first central-directory record of a zip file. */
static uint32_t first_cd_crc(const char *path)
{
    int fd = open(path, O_RDONLY);
    ck_assert_int_ge(fd, 0);
    struct stat sb;
    ck_assert_int_eq(fstat(fd, &sb), 0);
    unsigned char *b = malloc((size_t)sb.st_size);
    ck_assert(b && read(fd, b, (size_t)sb.st_size) == sb.st_size);
    close(fd);
    uint32_t crc = 0;
    int found = 0;
    for (off_t i = 0; i + 20 <= sb.st_size && !found; i++)
        if (!memcmp(b + i, "PK\1\2", 4)) {
            crc = (uint32_t)b[i + 16] | (uint32_t)b[i + 17] << 8 | (uint32_t)b[i + 18] << 16 |
                  (uint32_t)b[i + 19] << 24;
            found = 1;
        }
    free(b);
    ck_assert(found);
    return crc;
}

/* One 2-float tensor written through dcp_ckpt_create (old or new), with
 * the given checkpoint_id; returns the data file's first CRC. */
static int fill2(void *ctx, uint64_t tag, uint64_t off, void *buf, size_t len, dcp_error *err)
{
    (void)ctx, (void)tag, (void)err;
    static const float v[2] = {1.5f, -2.0f};
    memcpy(buf, (const unsigned char *)v + off, len);
    return 0;
}

static uint32_t write_one(dcp_ckpt_writer *w, const char *dir)
{
    dcp_error err;
    int64_t shape[1] = {2}, off[1] = {0};
    dcp_source src = {.fill = fill2};
    ck_assert_msg(dcp_ckpt_add_tensor(w, "t", DCP_FLOAT32, 1, shape, &err) == 0, "%s", err.msg);
    ck_assert_msg(dcp_ckpt_add_chunk(w, "t", 0, off, shape, &src, 0, NULL, &err) == 0, "%s", err.msg);
    ck_assert_msg(dcp_ckpt_finish(w, &err) == 0, "%s", err.msg);
    dcp_ckpt_free(w);
    char p[400];
    snprintf(p, sizeof p, "%s/__0_0.distcp", dir);
    return first_cd_crc(p);
}

static int metadata_has(const char *dir, const char *text)
{
    char p[400], buf[65536];
    snprintf(p, sizeof p, "%s/.metadata", dir);
    FILE *f = fopen(p, "rb");
    ck_assert(f != NULL);
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    return memmem(buf, n, text, strlen(text)) != NULL;
}

START_TEST(test_old_layouts)
{
    char dir[300], out[300];
    snprintf(dir, sizeof dir, "%s/ck", tmpdir);
    synth(dir);
    dcp_error err;

    /* dcp_open_ex@DCP_0.1: {flags, catalog} */
    int (*open_0_1)(const char *, const open_options_0_1 *, dcp_checkpoint **, dcp_error *) =
        (int (*)(const char *, const open_options_0_1 *, dcp_checkpoint **, dcp_error *))old_call("dcp_open_ex");
    open_options_0_1 oo = {.flags = 0, .catalog = NULL};
    dcp_checkpoint *ck;
    ck_assert_msg(open_0_1(dir, &oo, &ck, &err) == 0, "%s", err.msg);
    ck_assert_uint_eq(dcp_num_entries(ck), 3);
    dcp_close(ck);

    /* dcp_ckpt_create@DCP_0.1: 0.1's flag values (NO_SYNC 1, NO_CRC 2) */
    int (*create_0_1)(const char *, const ckpt_options_0_1 *, dcp_ckpt_writer **, dcp_error *) =
        (int (*)(const char *, const ckpt_options_0_1 *, dcp_ckpt_writer **, dcp_error *))old_call("dcp_ckpt_create");
    dcp_ckpt_writer *w;
    snprintf(out, sizeof out, "%s/old_nocrc", tmpdir);
    ckpt_options_0_1 co = {.flags = (1u << 0) | (1u << 1), .checkpoint_id = "old-layout-id"};
    ck_assert_msg(create_0_1(out, &co, &w, &err) == 0, "%s", err.msg);
    ck_assert_uint_eq(write_one(w, out), 0);   /* NO_CRC taken */
    ck_assert(metadata_has(out, "old-layout-id"));
    snprintf(out, sizeof out, "%s/old_crc", tmpdir);
    co.flags = 1u << 0;                          /* NO_SYNC only */
    ck_assert_msg(create_0_1(out, &co, &w, &err) == 0, "%s", err.msg);
    ck_assert_uint_ne(write_one(w, out), 0);

    /* the same through the sized struct and the one flag family; the old
     * names are aliases that still work */
    ck_assert_uint_eq(DCP_CKPT_NO_CRC, DCP_WRITE_NO_CRC);
    ck_assert_uint_eq(DCP_CKPT_NO_SYNC, DCP_WRITE_NO_SYNC);
    dcp_ckpt_options no = DCP_CKPT_OPTIONS_INIT;
    no.flags = DCP_CKPT_NO_SYNC | DCP_CKPT_NO_CRC;
    no.checkpoint_id = "sized-id";
    snprintf(out, sizeof out, "%s/new_nocrc", tmpdir);
    ck_assert_msg(dcp_ckpt_create(out, &no, &w, &err) == 0, "%s", err.msg);
    ck_assert_uint_eq(write_one(w, out), 0);
    ck_assert(metadata_has(out, "sized-id"));
    no.flags = DCP_WRITE_NESTED | DCP_WRITE_NO_SYNC;   /* NESTED means nothing to the DCP writer */
    snprintf(out, sizeof out, "%s/new_crc", tmpdir);
    ck_assert_msg(dcp_ckpt_create(out, &no, &w, &err) == 0, "%s", err.msg);
    ck_assert_uint_ne(write_one(w, out), 0);

    /* dcp_convert_files@DCP_0.1 */
    int (*convert_0_1)(const char *, const char *, const convert_options_0_1 *, dcp_error *) =
        (int (*)(const char *, const char *, const convert_options_0_1 *, dcp_error *))old_call("dcp_convert_files");
    convert_options_0_1 cv = {.to = DCP_FORMAT_SAFETENSORS, .keys = "model.layers.1", .flags = DCP_WRITE_NO_SYNC};
    snprintf(out, sizeof out, "%s/one.safetensors", tmpdir);
    ck_assert_msg(convert_0_1(dir, out, &cv, &err) == 0, "%s", err.msg);
    ck_assert_msg(dcp_open_file(out, DCP_FORMAT_AUTO, &ck, NULL, &err) == 0, "%s", err.msg);
    ck_assert_uint_eq(dcp_num_entries(ck), 1);   /* keys read at its 0.1 offset */
    dcp_close(ck);

    /* dcp_gplan_build@DCP_0.1: unit_max at offset 0 */
    int (*gplan_0_1)(dcp_checkpoint *, const dcp_greqs *, int, int, const gplan_opts_0_1 *, dcp_gplan *,
                     dcp_error *) = (int (*)(dcp_checkpoint *, const dcp_greqs *, int, int, const gplan_opts_0_1 *,
                                             dcp_gplan *, dcp_error *))old_call("dcp_gplan_build");
    ck_assert_msg(dcp_open(dir, 0, &ck, &err) == 0, "%s", err.msg);
    dcp_greqs r;
    memset(&r, 0, sizeof r);
    size_t first[2] = {0, 0};
    r.first = first;
    dcp_gplan g;
    gplan_opts_0_1 go = {.unit_max = 0};
    ck_assert_int_eq(gplan_0_1(ck, &r, 1, 0, &go, &g, &err), -1);
    ck_assert_msg(strstr(err.msg, "zero staging size"), "%s", err.msg);
    go.unit_max = 1 << 20;
    ck_assert_msg(gplan_0_1(ck, &r, 1, 0, &go, &g, &err) == 0, "%s", err.msg);
    dcp_gplan_free(&g);
    dcp_close(ck);
}
END_TEST

START_TEST(test_parse_size_ex)
{
    dcp_error err;
    uint64_t v;
    ck_assert(dcp_parse_size_ex("64K", NULL, &v, &err) == 0 && v == 65536);
    ck_assert(dcp_parse_size_ex("5GB", "x", &v, &err) == 0 && v == 5000000000ull);
    ck_assert_int_eq(dcp_parse_size_ex("12Q", "--max-shard-size", &v, &err), -1);
    ck_assert_int_eq(err.code, EINVAL);
    ck_assert_str_eq(err.msg, "--max-shard-size: '12Q': unknown unit 'Q' (B, K, KiB, KB, M, MiB, MB, G, GiB, GB, "
                              "T, TiB, TB)");
    ck_assert_int_eq(dcp_parse_size_ex("-1", NULL, &v, &err), -1);
    ck_assert_int_eq(err.code, EINVAL);
    ck_assert_msg(!strncmp(err.msg, "'-1' is not a size", 18), "%s", err.msg);
    ck_assert_int_eq(dcp_parse_size_ex("99999999999999999999", "s", &v, &err), -1);
    ck_assert_int_eq(err.code, ERANGE);
    ck_assert_int_eq(dcp_parse_size_ex("17179869184G", "s", &v, &err), -1);   /* 2^64 bytes */
    ck_assert_int_eq(err.code, ERANGE);
    /* the 0.1 call agrees */
    ck_assert(dcp_parse_size("2GiB", &v) == 0 && v == 2ull << 30);
    ck_assert(dcp_parse_size("12Q", &v) < 0);
}
END_TEST

int main(void)
{
    if (!linked_shared()) {   /* --disable-shared: no symbol versions to call */
        fprintf(stderr, "test_options: libdcp is not a shared library here: skipped\n");
        return 77;
    }
    Suite *s = suite_create("options");
    TCase *tc = tcase_create("options");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_sized_caller);
    tcase_add_test(tc, test_size_too_small);
    tcase_add_test(tc, test_size_too_large);
    tcase_add_test(tc, test_old_layouts);
    tcase_add_test(tc, test_parse_size_ex);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
