/* Unit tests of dcp_probe_folder (src/probe.c): each kind of save that did
 * not finish, complete layouts, folders that are no checkpoint, hostile
 * names, and dcp_open's message for a partial folder. Public API only. */
#include "check_quiet.h"
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dcp.h"

static char root[256];

/* Make folder root/name holding the given files (empty), NULL-terminated. */
static const char *folder(const char *name, ...)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", root, name);
    ck_assert_int_eq(mkdir(path, 0755), 0);
    va_list ap;
    va_start(ap, name);
    for (const char *f; (f = va_arg(ap, const char *));) {
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", path, f);
        int fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 0644);
        ck_assert_int_ge(fd, 0);
        close(fd);
    }
    va_end(ap);
    return path;
}

static void expect(const char *path, dcp_folder_kind kind, unsigned nshards, const char *reason)
{
    dcp_folder_probe p;
    dcp_error err;
    memset(&p, 0x5a, sizeof p);
    ck_assert_msg(dcp_probe_folder(path, &p, &err) == 0, "%s", err.msg);
    ck_assert_msg(p.kind == kind, "%s: kind %d, not %d (%s)", path, p.kind, kind, p.reason);
    ck_assert_uint_eq(p.nshards, nshards);
    ck_assert_msg(strcmp(p.reason, reason) == 0, "%s: reason \"%s\", not \"%s\"", path, p.reason, reason);
}

START_TEST(partial_kinds)
{
    expect(folder("crashed", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp", NULL),
           DCP_FOLDER_PARTIAL, 4, "4 shard files, no .metadata (the save did not finish)");
    expect(folder("inflight", "__0_0.distcp", ".metadata.tmp", NULL), DCP_FOLDER_PARTIAL, 1,
           "1 shard file, .metadata.tmp, no .metadata (the save was writing its metadata and did not finish)");
    expect(folder("resave", "__0_0.distcp", "__1_0.distcp", ".metadata", ".metadata.tmp", NULL), DCP_FOLDER_PARTIAL,
           2, "2 shard files, .metadata.tmp beside .metadata (the save was writing its metadata and did not finish)");
    expect(folder("ranklocal", "__0_0.distcp", "__0.metadata", "__1.metadata.tmp", NULL), DCP_FOLDER_PARTIAL, 1,
           "1 shard file, __R.metadata.tmp files (the save was writing its metadata and did not finish)");
    expect(folder("megatron", "__0_0.distcp", ".metadata", "common.pt", NULL), DCP_FOLDER_PARTIAL, 1,
           "1 shard file, no metadata.json (Megatron writes it last: the save did not finish)");
    expect(folder("megatron_start", "common.pt", NULL), DCP_FOLDER_PARTIAL, 0,
           "common.pt but no shard files, no .metadata (a Megatron save that did not finish)");
    expect(folder("tmp-checkpoint-7", "model.safetensors", NULL), DCP_FOLDER_PARTIAL, 1,
           "1 shard file in a temporary folder \"tmp-checkpoint-7\" (the save did not finish, or was not renamed yet)");
    expect(folder("step_9.tmp", "__0_0.distcp", ".metadata", NULL), DCP_FOLDER_PARTIAL, 1,
           "1 shard file in a temporary folder \"step_9.tmp\" (the save did not finish, or was not renamed yet)");
    /* Hugging Face: shards without their index (written last), or fewer than it counts */
    expect(folder("hf_noindex", "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors", NULL),
           DCP_FOLDER_PARTIAL, 2,
           "2 of 3 shard files, no model.safetensors.index.json (it is written last: the save did not finish)");
    expect(folder("hf_short", "model-00001-of-00003.safetensors", "model-00003-of-00003.safetensors",
                  "model.safetensors.index.json", NULL),
           DCP_FOLDER_PARTIAL, 2, "2 of 3 shard files (the save did not finish)");
    /* trailing slashes do not hide the folder's name */
    char p[512];
    snprintf(p, sizeof p, "%s/step_9.tmp//", root);
    expect(p, DCP_FOLDER_PARTIAL, 1,
           "1 shard file in a temporary folder \"step_9.tmp\" (the save did not finish, or was not renamed yet)");
}
END_TEST

START_TEST(complete_and_none)
{
    expect(folder("dcp", "__0_0.distcp", "__1_0.distcp", ".metadata", NULL), DCP_FOLDER_CHECKPOINT, 2, "");
    expect(folder("iter_0000200", "__0_0.distcp", ".metadata", "common.pt", "metadata.json", NULL),
           DCP_FOLDER_CHECKPOINT, 1, "");
    /* Megatron-LM's fsdp_dtensor and torch_dcp formats: torch's own save into
     * iter_N, no common.pt nor metadata.json (dist_checkpointing's), complete
     * with its .metadata */
    expect(folder("iter_0000100", "__0_0.distcp", "__1_0.distcp", ".metadata", NULL), DCP_FOLDER_CHECKPOINT, 2, "");
    expect(folder("rank_local", "__0_0.distcp", "__0.metadata", "__1_0.distcp", "__1.metadata", NULL),
           DCP_FOLDER_CHECKPOINT, 2, "");
    expect(folder("hf", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                  "model.safetensors.index.json", NULL),
           DCP_FOLDER_CHECKPOINT, 2, "");
    expect(folder("hf_single", "model.safetensors", NULL), DCP_FOLDER_CHECKPOINT, 1, "");
    /* per-rank torch.save files (torch-checkpointing, verl): rank 0's file names a checkpoint */
    expect(folder("torch_checkpointing", "model_0.pt", "model_1.pt", "step_0.pt", "step_1.pt", NULL),
           DCP_FOLDER_CHECKPOINT, 0, "");
    expect(folder("verl", "model_world_size_2_rank_0.pt", "model_world_size_2_rank_1.pt", NULL),
           DCP_FOLDER_CHECKPOINT, 0, "");
    /* a finished Megatron save in a backend without DCP files (zarr): not
     * partial (metadata.json is written last); dcp_open names the backend */
    expect(folder("iter_0000300", "common.pt", "metadata.json", NULL), DCP_FOLDER_NOT_CHECKPOINT, 0,
           "Megatron-Core common.pt and metadata.json but no .metadata or shard files (not the torch_dist backend)");
    expect(folder("hf_one_of_one", "model-00001-of-00001.safetensors", NULL), DCP_FOLDER_CHECKPOINT, 1, "");
    expect(folder("hf_odd", "x-of-.safetensors", "model-1-of-99999999999.safetensors", "model-0001-of-0002x.safetensors",
                  "model--of-3.safetensors", "model-x1-of-3.safetensors", "-of-3.safetensors", "model-of-3.safetensors", NULL),
           DCP_FOLDER_CHECKPOINT, 7, "");
    /* torch's distributed HuggingFaceStorageWriter without consolidation: no index, complete */
    expect(folder("hf_distributed", "shard-00001-model-00001-of-00002.safetensors",
                  "shard-00002-model-00002-of-00002.safetensors", NULL),
           DCP_FOLDER_CHECKPOINT, 2, "");
    /* mktemp's tmp.XXXXXX and Python's tmpXXXXXXXX are no staging names */
    expect(folder("tmp.Ab12Cd", "__0_0.distcp", ".metadata", NULL), DCP_FOLDER_CHECKPOINT, 1, "");
    expect(folder("tmpk3j4h5", "__0_0.distcp", ".metadata", NULL), DCP_FOLDER_CHECKPOINT, 1, "");
    expect(folder("tmp_k3j4h5", "__0_0.distcp", ".metadata", NULL), DCP_FOLDER_CHECKPOINT, 1, "");
    expect(folder("tmp_step_200", "__0_0.distcp", ".metadata", NULL), DCP_FOLDER_PARTIAL, 1,
           "1 shard file in a temporary folder \"tmp_step_200\" (the save did not finish, or was not renamed yet)");
    expect(folder("empty", NULL), DCP_FOLDER_NOT_CHECKPOINT, 0, "no .metadata, __R.metadata or .safetensors files");
    /* names that only look like checkpoint files */
    expect(folder("lookalikes", "__x.metadata", "__.metadata", "__1.metadata.bak", "metadata", ".distcp", "x.metadata.tmp.1",
                  "iter_", NULL),
           DCP_FOLDER_NOT_CHECKPOINT, 0, "no .metadata, __R.metadata or .safetensors files");
    expect(folder("tmp_empty", "notes.txt", NULL), DCP_FOLDER_NOT_CHECKPOINT, 0,
           "no .metadata, __R.metadata or .safetensors files");
    /* epoch snapshots, not rank files: no rank 0 (nor a leading zero, nor an item name) */
    expect(folder("epochs", "model_10.pt", "model_20.pt", "model_00.pt", "_0.pt", "model_0.pth", NULL),
           DCP_FOLDER_NOT_CHECKPOINT, 0, "no .metadata, __R.metadata or .safetensors files");
}
END_TEST

START_TEST(errors_and_open)
{
    dcp_folder_probe p;
    dcp_error err;
    char path[512];
    snprintf(path, sizeof path, "%s/no-such", root);
    ck_assert_int_eq(dcp_probe_folder(path, &p, &err), -1);
    ck_assert_int_eq(err.code, ENOENT);
    ck_assert_msg(strstr(err.msg, "no-such") != NULL, "%s", err.msg);
    snprintf(path, sizeof path, "%s/file", root);
    int fd = open(path, O_WRONLY | O_CREAT, 0644);
    ck_assert_int_ge(fd, 0);
    close(fd);
    ck_assert_int_eq(dcp_probe_folder(path, &p, &err), -1);
    ck_assert_int_eq(err.code, ENOTDIR);
    ck_assert_int_eq(dcp_probe_folder(NULL, &p, &err), -1);
    ck_assert_int_eq(err.code, EINVAL);

    /* dcp_open names a partial checkpoint as such (ENOENT, as for none) */
    dcp_checkpoint *ck = NULL;
    const char *crashed = folder("open_crashed", "__0_0.distcp", "__1_0.distcp", NULL);
    ck_assert_int_eq(dcp_open(crashed, 0, &ck, &err), -1);
    ck_assert_ptr_null(ck);
    ck_assert_int_eq(err.code, ENOENT);
    ck_assert_msg(strstr(err.msg, "open_crashed: a partial checkpoint: 2 shard files, no .metadata (the save did not finish)"),
                  "%s", err.msg);
    const char *inflight = folder("open_inflight", ".metadata.tmp", NULL);
    ck_assert_int_eq(dcp_open(inflight, 0, &ck, &err), -1);
    ck_assert_msg(strstr(err.msg, "open_inflight: a partial checkpoint: 0 shard files, .metadata.tmp, no .metadata"),
                  "%s", err.msg);
    const char *none = folder("open_none", "readme.txt", NULL);
    ck_assert_int_eq(dcp_open(none, 0, &ck, &err), -1);
    ck_assert_int_eq(err.code, ENOENT);
    ck_assert_msg(strstr(err.msg, "not a checkpoint") && !strstr(err.msg, "partial"), "%s", err.msg);
}
END_TEST

/* dcp_is_part_of_checkpoint: a checkpoint's own files by name, and the folder to open instead */
START_TEST(part_of_checkpoint)
{
    static const struct {
        const char *path;
        int part;
        const char *folder;   /* the first folder_len bytes of folder */
    } cases[] = {
        {".metadata", 1, "."},
        {"/.metadata", 1, "/"},
        {"step/.metadata", 1, "step"},
        {"/ck/step_10/.metadata.tmp", 1, "/ck/step_10"},
        {"run/__3.metadata", 1, "run"},
        {"run/__0_0.distcp", 1, "run"},
        {"iter_0000010/metadata.json", 1, "iter_0000010"},
        {"hf/model.safetensors.index.json", 1, "hf"},
        {"__.metadata", 0, "."},          /* no rank between "__" and ".metadata" */
        {"run/.distcp", 0, "run"},        /* nothing before the suffix */
        {"run/model.safetensors", 0, "run"},
        {"run/model.pt", 0, "run"},
        {"run/", 0, "run"},
        {"", 0, "."},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *folder = NULL;
        int len = -1;
        ck_assert_msg(dcp_is_part_of_checkpoint(cases[i].path, &folder, &len) == cases[i].part, "%s", cases[i].path);
        ck_assert_msg(len == (int)strlen(cases[i].folder) && !strncmp(folder, cases[i].folder, (size_t)len),
                      "%s: folder %.*s", cases[i].path, len, folder);
        ck_assert_int_eq(dcp_is_part_of_checkpoint(cases[i].path, NULL, NULL), cases[i].part);
    }
}
END_TEST

int main(void)
{
    snprintf(root, sizeof root, "%s/dcp-probe.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 99;
    }
    Suite *s = suite_create("probe");
    TCase *t = tcase_create("probe");
    tcase_add_test(t, partial_kinds);
    tcase_add_test(t, complete_and_none);
    tcase_add_test(t, errors_and_open);
    tcase_add_test(t, part_of_checkpoint);
    suite_add_tcase(s, t);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK);   /* the tests share root's folders */
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", root);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
