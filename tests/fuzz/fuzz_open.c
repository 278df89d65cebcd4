/* libFuzzer harness for the files a checkpoint folder holds: the fuzz input
 * becomes one file of a folder copied from a fixture, which is then opened
 * (dcp_open, or dcp_open_file for a single .pt/.safetensors), and every
 * entry's chunks, records and first 64 KiB planned and read. The target
 * (FUZZ_TARGET, or replay.c's first argument) picks the file:
 *
 *   metadata    .metadata (1.13 and 2.x) next to fixture 05's shards
 *   spilled     the same opened through a catalog file with its chunks
 *               spilled to scratch files as they are parsed (the first
 *               open of a large checkpoint: src/store_spill.c), stored,
 *               then served from the catalog; the catalog is removed
 *               after each input
 *   megatron    .metadata (MCoreMetadata) next to fixture 09's shards, opened
 *               as stored and with DCP_OPEN_MEGATRON_FOLD (mcore_data's
 *               original shapes: src/megatron_fold.c)
 *   ranklocal   __0.metadata of a rank-local (__R.metadata) save
 *   shard       __0_0.distcp of fixture 01: torch.save zip records
 *               (central directory, zip64, local headers, data.pkl)
 *   zstd        __0_0.distcp of a save with the ZStandard extension
 *   safetensors model.safetensors of a Hugging Face folder (header JSON,
 *               DCP_SHARDING_INFO), also opened as a single file
 *   torchfile   a torch.save file opened on its own (Megatron's common.pt)
 *   hfindex     model.safetensors.index.json beside a sharded Hugging Face
 *               folder's shards (tests/data/hf_sharded)
 *   mcoreconfig metadata.json (Megatron-Core's CheckpointingConfig) in
 *               fixture 09's folder
 *   rankfile    model_1.pt of a torch-checkpointing folder (per-rank
 *               torch.save files of DTensors: meshes, placements, shapes)
 *   recipe      an export recipe (dcp-recipe(5)) applied to fixture 09, a
 *               Megatron checkpoint: dcp_export_hf into a folder, removed
 *   manifest    integrity.json (Megatron-Core's SHA-256 of every file) in
 *               fixture 05's folder, checked by dcp_verify_manifest (opened,
 *               and as a folder not opened: dcp_verify_manifest_folder)
 * Every opened checkpoint is also checked as dcp verify does
 * (dcp_verify_structure, and dcp_verify_crc's read of every record).
 *
 * Built with -fsanitize=fuzzer by `make fuzz`, and with replay.c's main by
 * `make check`, which runs every committed input (tests/fuzz-regress.sh).
 * SRCDIR names the source tree (the bases are fixtures under tests/). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dcp.h"
#include "dcp_export.h"
#include "dcp_integrity.h"
#include "dcp_write.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

enum open_how { AS_FOLDER, AS_FILE, AS_BOTH, AS_RECIPE, AS_SPILLED, AS_FOLDED, AS_MANIFEST };

static const struct target {
    const char *name;
    const char *base;      /* folder under SRCDIR copied as the checkpoint, or NULL */
    const char *file;      /* the file the input replaces */
    enum open_how how;
} targets[] = {
    {"metadata", "tests/fixtures/05_mixed_2ranks/ckpt", ".metadata", AS_FOLDER},
    {"spilled", "tests/fixtures/05_mixed_2ranks/ckpt", ".metadata", AS_SPILLED},
    {"megatron", "tests/fixtures/09_megatron_torch_dist/ckpt", ".metadata", AS_FOLDED},
    {"ranklocal", "tests/data/metadata/pt_ranklocal", "__0.metadata", AS_FOLDER},
    {"shard", "tests/fixtures/01_single_plain/ckpt", "__0_0.distcp", AS_FOLDER},
    {"zstd", "tests/data/metadata/pt_zstd", "__0_0.distcp", AS_FOLDER},
    {"safetensors", NULL, "model.safetensors", AS_BOTH},
    {"torchfile", NULL, "common.pt", AS_FILE},
    {"hfindex", "tests/data/hf_sharded", "model.safetensors.index.json", AS_FOLDER},
    {"mcoreconfig", "tests/fixtures/09_megatron_torch_dist/ckpt", "metadata.json", AS_FOLDER},
    {"rankfile", "tests/data/rankfiles/tc2", "model_1.pt", AS_FOLDER},
    {"recipe", NULL, "r.json", AS_RECIPE},
    {"manifest", "tests/fixtures/05_mixed_2ranks/ckpt", "integrity.json", AS_MANIFEST},
};

static const struct target *tg;
static char dir[256], path[320], srcdir[4096], catdir[300], catalog[340];

static void cleanup(void)
{
    char cmd[700];
    if ((size_t)snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", dir, catdir) >= sizeof cmd || system(cmd) != 0)
        fprintf(stderr, "fuzz_open: cannot remove %s\n", dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *name = getenv("FUZZ_TARGET"), *src = getenv("SRCDIR");
    for (size_t i = 0; name && i < sizeof targets / sizeof *targets; i++)
        if (!strcmp(name, targets[i].name))
            tg = &targets[i];
    if (!tg || !src) {
        fprintf(stderr, "fuzz_open: set SRCDIR and FUZZ_TARGET to one of:");
        for (size_t i = 0; i < sizeof targets / sizeof *targets; i++)
            fprintf(stderr, " %s", targets[i].name);
        fprintf(stderr, "\n");
        exit(2);
    }
    snprintf(srcdir, sizeof srcdir, "%s", src);
    const char *tmp = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(dir, sizeof dir, "%s/dcpfuzz.%s.%d", tmp, tg->name, (int)getpid());
    snprintf(path, sizeof path, "%s/%s", dir, tg->file);
    snprintf(catdir, sizeof catdir, "%s.catalog", dir);
    snprintf(catalog, sizeof catalog, "%s/catalog.sqlite", catdir);
    if (tg->how == AS_SPILLED)
        setenv("DCP_SPILL_BYTES", "0", 1);   /* every .metadata spills */
    char cmd[4096];
    int n = tg->base ? snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s' && cp -r '%s/%s/.' '%s/'", dir, dir,
                                src, tg->base, dir)
                     : snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
    if ((size_t)n >= sizeof cmd || system(cmd) != 0) {
        fprintf(stderr, "fuzz_open: cannot lay out %s\n", dir);
        exit(2);
    }
    atexit(cleanup);
    return 0;
}

/* Read what an open gives: chunks, records, the first 64 KiB of each entry,
 * and whole byte entries up to 1 MiB. */
static void walk(dcp_checkpoint *ck)
{
    static unsigned char buf[65536];
    dcp_error err;
    dcp_plan plan;
    dcp_plan_init(&plan);
    (void)dcp_get_info(ck);
    uint64_t n1, n2, n3;   /* dcp verify's checks of the hostile files: structure, records' CRC-32s */
    (void)dcp_verify_structure(ck, NULL, NULL, &n1, &err);
    (void)dcp_verify_crc(ck, NULL, NULL, NULL, NULL, &n1, &n2, &n3, &err);
    for (size_t i = 0; i < dcp_num_entries(ck); i++) {
        const dcp_entry *e = dcp_entry_at(ck, i);
        if (!e)
            continue;
        const dcp_chunk *chunks;
        if (dcp_entry_chunks(ck, e, &chunks, &err) == 0) {
            for (size_t c = 0; c < e->nchunks; c++) {
                const dcp_record *rec;
                (void)dcp_chunk_record(ck, e, c, &rec, &err);
            }
            dcp_release_chunks(ck, e);
        }
        uint64_t nb;
        if (e->kind == DCP_KIND_BYTES && dcp_entry_nbytes(ck, e, &nb, &err) == 0 && nb <= (1u << 20)) {
            void *p;
            uint64_t len;
            if (dcp_read_entry(ck, e, &p, &len, &err) == 0)
                free(p);
        }
        dcp_plan_reset(&plan);
        if (dcp_plan_bytes(ck, e, 0, sizeof buf, &plan, &err) == 0 && plan.nbytes <= sizeof buf)
            (void)dcp_plan_execute(ck, &plan, buf, &err);
    }
    dcp_plan_free(&plan);
}

/* An open's outcome: the checkpoint walked and closed, or (verbose) why
 * not. *ck is read here, after the open set it (an argument's order of
 * evaluation is unspecified). */
static void walk_opened(const char *how, int rc, dcp_checkpoint **ck, const dcp_error *err, int verbose)
{
    if (verbose)
        fprintf(stderr, "fuzz_open: %s: %s\n", how, rc == 0 ? "opened" : err->msg);
    if (rc == 0) {
        walk(*ck);
        dcp_close(*ck);
    }
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || write(fd, data, size) != (ssize_t)size)
        abort();
    close(fd);
    dcp_checkpoint *ck;
    dcp_error err;
    int verbose = getenv("FUZZ_VERBOSE") != NULL;   /* what a seed opens to, for its author */
    if (tg->how == AS_RECIPE) {
        char ckpt[4200], out[400], cmd[500];
        snprintf(ckpt, sizeof ckpt, "%s/tests/fixtures/09_megatron_torch_dist/ckpt", srcdir);
        snprintf(out, sizeof out, "%s/out", dir);
        dcp_export_options o = {.size = sizeof o, .recipe = path,
                                .flags = DCP_EXPORT_NO_SYNC | DCP_EXPORT_ALLOW_UNMAPPED,
                                .max_shard_size = 256};
        int rc = dcp_export_hf(ckpt, out, &o, &err);
        if (verbose)
            fprintf(stderr, "fuzz_open: export: %s\n", rc == 0 ? "written" : err.msg);
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", out);
        if (rc == 0 && system(cmd) != 0)
            abort();
        return 0;
    }
    if (tg->how == AS_SPILLED) {
        char cmd[700];
        if ((size_t)snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", catdir, catdir) >= sizeof cmd ||
            system(cmd) != 0)
            abort();
        dcp_open_options o = DCP_OPEN_OPTIONS_INIT;
        o.flags = DCP_OPEN_CATALOG;
        o.catalog = catalog;
        walk_opened("spilled", dcp_open_ex(dir, &o, &ck, &err), &ck, &err, verbose);
        return 0;
    }
    if (tg->how == AS_MANIFEST) {
        int rc = dcp_open(dir, 0, &ck, &err);
        if (rc == 0) {
            uint64_t files, problems;
            rc = dcp_verify_manifest(ck, NULL, NULL, NULL, NULL, NULL, &files, &problems, &err);
            if (verbose)
                fprintf(stderr, "fuzz_open: manifest: %s\n", rc < 0 ? err.msg : rc ? "checked" : "none");
            dcp_close(ck);
        }
        uint64_t files, problems;   /* the same, of the folder not opened (dcp verify of a damaged one) */
        (void)dcp_verify_manifest_folder(dir, NULL, NULL, NULL, NULL, NULL, &files, &problems, &err);
        return 0;
    }
    if (tg->how != AS_FILE)
        walk_opened("folder", dcp_open(dir, 0, &ck, &err), &ck, &err, verbose);
    if (tg->how == AS_FOLDED) {
        walk_opened("folded", dcp_open(dir, DCP_OPEN_MEGATRON_FOLD, &ck, &err), &ck, &err, verbose);
        return 0;
    }
    if (tg->how != AS_FOLDER)
        walk_opened("file", dcp_open_file(path, DCP_FORMAT_AUTO, &ck, NULL, &err), &ck, &err, verbose);
    return 0;
}
