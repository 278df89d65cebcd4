/* dcp verify: structure always; content digests recorded (--record) or
 * checked against earlier records (the catalog, or an imported sidecar). */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli.h"
#include "dcp_integrity.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: dcp verify [--record] [--crc] [--export FILE] [--import FILE] [--catalog PATH | --no-catalog] CKPT\n");
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Bytes the content pass reads (every distinct blob, as the library counts
 * them) and when hashing them began: the library reports done == 0 then,
 * after listing the blobs and reading the catalog. */
struct rate { const char *label; uint64_t total; double start, end; };

static void progress(void *ctx, uint64_t done, uint64_t total)
{
    struct rate *r = ctx;
    r->total = total;
    if (done == 0)
        r->start = now();
    if (done == total)
        r->end = now();
    cli_progress((void *)r->label, done, total);
}

/* What was hashed and how fast ("PREFIX: VERB SIZE WHAT in S s at R MB/s"),
 * and the whole pass's time when listing the blobs and the catalog's work
 * add much to it. */
static void print_rate(const char *prefix, const char *verb, const char *what, const struct rate *r, double t0,
                       double t1)
{
    char h[32];
    if (!r->total)
        return;
    double hs = r->start > 0 && r->end >= r->start ? r->end - r->start : t1 - t0;
    printf("%s: %s %s %s in %.2f s at %.0f MB/s", prefix, verb, cli_human_bytes(r->total, h), what, hs,
           hs > 0 ? (double)r->total / hs / 1e6 : 0.0);
    if (t1 - t0 > hs + 0.05)
        printf("; %.2f s with listing the blobs and the catalog's work", t1 - t0);
    printf("\n");
}

static void print_problem(void *ctx, const char *msg)
{
    (void)ctx;
    printf("PROBLEM: %s\n", msg);
}

static void print_note(void *ctx, const char *msg)
{
    (void)ctx;
    printf("note: %s\n", msg);
}

/* Megatron-Core's integrity.json, when the folder has one: of the open
 * checkpoint ck, else of the folder that did not open. 0, or 1 when a file
 * differs, is missing, or the manifest cannot be used; *present: the
 * folder has one. */
static int check_manifest(dcp_checkpoint *ck, const char *folder, int *present)
{
    uint64_t files, problems;
    dcp_error err;
    struct rate rate = {"integrity.json", 0, 0, 0};
    double t0 = now();
    int rc = ck ? dcp_verify_manifest(ck, print_problem, print_note, NULL, progress, &rate, &files, &problems, &err)
                : dcp_verify_manifest_folder(folder, print_problem, print_note, NULL, progress, &rate, &files,
                                             &problems, &err);
    *present = rc != 0;
    if (rc < 0) {
        cli_error("%s", err.msg);
        printf("integrity.json: not checked\n");
        return 1;
    }
    if (rc == 0)
        return 0;
    print_rate("integrity.json", "read and hashed", "of files", &rate, t0, now());
    printf("integrity.json: %" PRIu64 " files re-hashed (SHA-256), %" PRIu64 " problems\n", files, problems);
    return problems ? 1 : 0;
}

/* --crc: the CRC-32 of every torch.save record, against its bytes. 0, or 1
 * when one differs or cannot be read (or the check cannot run). */
static int check_crc(dcp_checkpoint *ck)
{
    uint64_t checked, nocrc, problems;
    dcp_error err;
    struct rate rate = {"crc", 0, 0, 0};
    double t0 = now();
    if (dcp_verify_crc(ck, print_problem, NULL, progress, &rate, &checked, &nocrc, &problems, &err) < 0) {
        cli_error("%s", err.msg);
        printf("crc: not checked\n");
        return 1;
    }
    print_rate("crc", "read and checked", "of torch.save records", &rate, t0, now());
    printf("crc: %" PRIu64 " records checked (CRC-32), %" PRIu64 " problems\n", checked, problems);
    if (nocrc)
        printf("crc: %" PRIu64 " records carry no CRC-32 (written as 0, as torch does with "
               "save.compute_crc32=False): not checked\n", nocrc);
    return problems ? 1 : 0;
}

/* CKPT did not open (its .metadata missing, truncated or not a pickle; the
 * error above says which): whatever does not need the model is checked
 * still. Megatron-Core writes integrity.json last, so a folder with one is
 * a finished save, damaged since: 1, not a partial checkpoint's 3. */
static int verify_unopened(const char *path, int status)
{
    struct stat st;
    int present;
    if (stat(path, &st) < 0 || !S_ISDIR(st.st_mode))
        return status;
    check_manifest(NULL, path, &present);
    if (!present)
        return status;
    printf("structure: not checked (the checkpoint does not open: the error above)\n");
    printf("%s: FAILED\n", path);
    return 1;
}

/* 1 when path is a folder that reads as a partial save (dcp_probe_folder)
 * but holds integrity.json: Megatron-Core writes that last, so the save
 * finished and files were lost or damaged since. */
static int damaged_finished_save(const char *path)
{
    struct stat st;
    char manifest[4096];
    dcp_folder_probe probe;
    dcp_error err;
    if (stat(path, &st) < 0 || !S_ISDIR(st.st_mode))
        return 0;
    snprintf(manifest, sizeof manifest, "%s/integrity.json", path);
    return lstat(manifest, &st) == 0 && dcp_probe_folder(path, &probe, &err) == 0 &&
           probe.kind == DCP_FOLDER_PARTIAL;
}

int cmd_verify(int argc, char **argv)
{
    static const struct option opts[] = {
        {"record", no_argument, 0, 'r'}, {"crc", no_argument, 0, 'C'}, {"export", required_argument, 0, 'e'},
        {"import", required_argument, 0, 'i'}, {"catalog", required_argument, 0, 'c'},
        {"no-catalog", no_argument, 0, 'n'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int record = 0, crc = 0, c;
    const char *export = NULL, *import = NULL, *catalog = cli_catalog_enabled ? cli_catalog_path : ":memory:";
    while ((c = getopt_long(argc, argv, "re:i:c:nh", opts, NULL)) != -1) {
        switch (c) {
        case 'r': record = 1; break;
        case 'C': crc = 1; break;
        case 'e': export = optarg; break;
        case 'i': import = optarg; break;
        case 'c': catalog = cli_catalog_path = optarg; break;
        case 'n': catalog = ":memory:"; cli_catalog_enabled = 0; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind != argc - 1) {
        usage(stderr);
        return 2;
    }
    const char *path = argv[optind];
    if (damaged_finished_save(path)) {   /* said once, never called partial */
        cli_error("%s: a damaged checkpoint, not a partial save: it holds integrity.json, which Megatron-Core "
                  "writes last, so the save finished and files were lost or damaged since", path);
        return verify_unopened(path, 1);
    }
    dcp_checkpoint *ck = cli_open(path);
    if (!ck)
        return verify_unopened(path, cli_open_status());
    dcp_error err;
    dcp_catalog *cat = NULL;
    uint64_t structural = 0, content = 0, checked = 0, missing = 0, n;
    int status = 1, present;
    if (dcp_verify_structure(ck, print_problem, NULL, &structural, &err) < 0) {
        cli_error("%s", err.msg);
        goto out;
    }
    if (dcp_catalog_check_location(catalog, ck, &err) < 0 || dcp_catalog_open(catalog, &cat, &err) < 0) {
        cli_error("%s", err.msg);
        goto out;
    }
    if (import) {
        if (dcp_catalog_import(cat, ck, import, &n, &err) < 0) {
            cli_error("%s", err.msg);
            goto out;
        }
        printf("imported %" PRIu64 " digests from %s\n", n, import);
    }
    struct rate rate = {record ? "hashing" : "verifying", 0, 0, 0};
    double t0 = now();
    if (record) {
        if (dcp_catalog_record(cat, ck, progress, &rate, &n, &err) < 0) {
            cli_error("%s", err.msg);
            goto out;
        }
        printf("recorded %" PRIu64 " digests in %s\n", n, dcp_catalog_path(cat));
        print_rate("content", "hashed", "of stored data (XXH3-64)", &rate, t0, now());
    } else {
        if (dcp_verify_digests(cat, ck, print_problem, NULL, progress, &rate, &checked, &missing, &content,
                               &err) < 0) {
            /* content could not be checked (a shard the structure check found missing): the
             * summary still says what was found */
            cli_error("%s", err.msg);
            printf("content: not checked\n");
            if (crc)
                check_crc(ck);
            check_manifest(ck, path, &present);
            printf("structure: %" PRIu64 " problems\n", structural);
            printf("%s: FAILED\n", path);
            status = 1;
            goto out;
        }
        print_rate("content", "re-hashed", "of stored data (XXH3-64)", &rate, t0, now());
        if (checked)
            printf("content: %" PRIu64 " blobs checked against their recorded digests, %" PRIu64 " problems\n",
                   checked, content);
        /* never advise recording over a damaged checkpoint: its records, if any, were tied to
         * the files as they were (.metadata, every shard file's size) */
        if (missing)
            printf("content: %" PRIu64 " blobs have no recorded digest%s\n", missing,
                   structural ? " for the files as they are now (recorded digests are tied to the .metadata and "
                                "every shard file's size; repair the problems above, never record over them)"
                              : " (run dcp verify --record first)");
    }
    if (export) {
        if (dcp_digests_export(cat, ck, export, &err) < 0) {
            cli_error("%s", err.msg);
            goto out;
        }
        printf("exported digests to %s\n", export);
    }
    int crcs = crc ? check_crc(ck) : 0;
    int manifest = check_manifest(ck, path, &present);
    printf("structure: %" PRIu64 " problems\n", structural);
    status = structural || content || crcs || manifest ? 1 : 0;
    printf("%s: %s\n", path, status ? "FAILED" : "OK");
out:
    dcp_catalog_close(cat);
    dcp_close(ck);
    return status;
}
