/* Megatron-Core's integrity.json: the SHA-256 of every file of a checkpoint
 * folder, written by dist_checkpointing.save(..., verify_integrity=True)
 * (0.18 and later; validation.py save_integrity_manifest):
 *
 *     {"algorithm": "sha256", "files": {"__0_0.distcp": "<64 hex>", ...}}
 *
 * The manifest is hostile input: its size is bounded by the folder's file
 * count before it is read, every name must be a plain name of the folder
 * (no '/', not "." or "..", no NUL, at most NAME_MAX bytes) and every digest
 * 64 lowercase hex digits, as Python's hexdigest() writes them; anything else
 * refuses the whole manifest, naming it and the reason. Names in messages go
 * through dcp_key_text (no control character reaches a terminal).
 *
 * The listed files are hashed on up to dcp_read_threads() threads, one file
 * each at a time (SHA-256 of one file is sequential), opened non-blocking so
 * that a FIFO named in the manifest is refused, never waited on.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "integrity.h"

#define MANIFEST_NAME "integrity.json"
#define PER_FILE 1024u                /* manifest bytes one listed file may take (escaped name, digest) */
#define MANIFEST_MAX (64u << 20)
#define READ_CAP (4u << 20)           /* one read of a file being hashed */
#define PROGRESS_STEP (64u << 20)

typedef struct mfile {
    const char *name;                 /* the manifest's (owned by its json_t) */
    const char *want;                 /* 64 lowercase hex digits */
    unsigned char got[DCPI_SHA256_LEN];
    int err;                          /* errno of open or read (ENOENT: missing) */
    int notreg;                       /* not a regular file */
} mfile;

typedef struct hasher {
    int dirfd;                        /* the folder's */
    mfile *f;
    size_t n;
    atomic_size_t next;
    atomic_uint_fast64_t done;
    uint64_t total, reported;
    dcp_progress_fn progress;
    void *pctx;
    pthread_mutex_t lock;             /* progress calls */
    int oom;
} hasher;

static void step(void *ctx, size_t n)
{
    hasher *h = ctx;
    uint64_t done = atomic_fetch_add(&h->done, n) + n;
    if (!h->progress || pthread_mutex_trylock(&h->lock))
        return;   /* another thread is reporting */
    if (done > h->reported && done - h->reported >= PROGRESS_STEP && done < h->total) {
        h->reported = done;
        h->progress(h->pctx, done, h->total);
    }
    pthread_mutex_unlock(&h->lock);
}

static void *hash_files(void *arg)
{
    hasher *h = arg;
    void *buf = malloc(READ_CAP);
    if (!buf) {
        h->oom = 1;
        return NULL;
    }
    for (size_t i; (i = atomic_fetch_add(&h->next, 1)) < h->n;) {
        mfile *f = &h->f[i];
        struct stat st;   /* a device or FIFO the manifest names is not even opened */
        if (fstatat(h->dirfd, f->name, &st, 0) < 0) {
            f->err = errno;
            continue;
        }
        if (!S_ISREG(st.st_mode)) {
            f->notreg = 1;
            continue;
        }
        int fd = openat(h->dirfd, f->name, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
        if (fd < 0) {
            f->err = errno;
            continue;
        }
        if (fstat(fd, &st) < 0)
            f->err = errno;
        else if (!S_ISREG(st.st_mode))
            f->notreg = 1;
        else {
            uint64_t bytes;
            f->err = dcpi_sha256_fd(fd, buf, READ_CAP, f->got, &bytes, step, h);
        }
        close(fd);
    }
    free(buf);
    return NULL;
}

static int hex_digest(const char *s)
{
    size_t i = 0;
    for (; s[i] && i <= 2 * DCPI_SHA256_LEN; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    return i == 2 * DCPI_SHA256_LEN;
}

/* The regular files of the folder (links to one count), the manifest aside;
 * with listed, note(ctx, ...) each one it does not name. -1 with errno. */
static long folder_files(int dirfd, const char *folder, json_t *listed, dcp_problem_fn note, void *ctx)
{
    int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd < 0 ? NULL : fdopendir(fd);
    if (!d) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    long n = 0;
    for (struct dirent *de; (de = readdir(d));) {
        if (!strcmp(de->d_name, MANIFEST_NAME) || !dcpi_dirent_regular(fd, de))
            continue;
        n++;
        if (listed && note && !json_object_get(listed, de->d_name)) {
            char name[1024], msg[2048];
            dcp_key_text(de->d_name, name, sizeof name);
            snprintf(msg, sizeof msg, "%s/%s: not listed in %s (not checked)", folder, name,
                     MANIFEST_NAME);
            note(ctx, msg);
        }
    }
    closedir(d);
    return n;
}

/* The manifest's files, checked; -1 with err on the first that is not a
 * plain name with a SHA-256 digest. */
static int take_files(json_t *files, const char *what, mfile *f, dcp_error *err)
{
    const char *name;
    json_t *v;
    size_t i = 0;
    json_object_foreach(files, name, v) {
        char shown[1024];
        dcp_key_text(name, shown, sizeof shown);
        size_t len = strlen(name);
#if JANSSON_VERSION_HEX >= 0x020e00
        if (json_object_iter_key_len(json_object_key_to_iter(name)) != len)
            return dcpi_err(err, EINVAL, "%s: a file name holds a NUL byte (\"%s...\")", what, shown);
#endif
        const char *why = len == 0 ? "an empty file name"
                          : len > NAME_MAX ? "a name longer than any file name"
                          : strchr(name, '/') ? "not a plain file name of the folder (it holds '/')"
                          : !strcmp(name, ".") || !strcmp(name, "..") ? "not a file of the folder"
                          : !strcmp(name, MANIFEST_NAME) ? "the manifest lists itself"
                          : NULL;
        if (why)
            return dcpi_err(err, EINVAL, "%s: \"%.200s\": %s", what, shown, why);
        const char *hex = json_string_value(v);
        if (!hex || !hex_digest(hex))
            return dcpi_err(err, EINVAL, "%s: \"%.200s\": the digest is not a SHA-256 (64 lowercase hex digits)",
                            what, shown);
        f[i++] = (mfile){.name = name, .want = hex};
    }
    return 0;
}

/* 1 when name is a data file of ck that cannot be opened (missing,
 * unreadable, not a file): dcp_verify_structure names it with the reason,
 * so the manifest's check counts it without naming it again. */
static int named_by_structure(dcp_checkpoint *ck, const char *name)
{
    for (size_t i = 0; ck && i < ck->nfiles; i++)
        if (!strcmp(ck->files[i], name)) {
            uint64_t size;
            dcp_error e;
            return dcpi_ck_file_size(ck, (uint32_t)i, &size, &e) < 0;
        }
    return 0;
}

/* The manifest of the folder open as dirfd, named folder in messages; ck:
 * the checkpoint open there, or NULL. */
static int verify_at(dcp_checkpoint *ck, int dirfd, const char *folder, dcp_problem_fn problem,
                     dcp_problem_fn note, void *ctx, dcp_progress_fn progress, void *pctx, uint64_t *nfiles,
                     uint64_t *nproblems, dcp_error *err)
{
    *nfiles = *nproblems = 0;
    char what[4096], bound[128];
    snprintf(what, sizeof what, "%s/%s", folder, MANIFEST_NAME);
    struct stat st;
    if (fstatat(dirfd, MANIFEST_NAME, &st, 0) < 0 && errno == ENOENT)
        return 0;
    long have = folder_files(dirfd, folder, NULL, NULL, NULL);
    if (have < 0)
        return dcpi_err(err, errno, "%s: cannot list the folder: %s", folder, strerror(errno));
    uint64_t max = 4096 + (uint64_t)have * PER_FILE;
    if (max > MANIFEST_MAX)
        max = MANIFEST_MAX;
    snprintf(bound, sizeof bound, "a manifest of the folder's %ld files", have);
    json_t *root;
    if (dcpi_read_json_at(dirfd, MANIFEST_NAME, what, max, bound, &root, err) < 0)
        return -1;
    if (!root)
        return 0;
    int rc = -1;
    mfile *f = NULL;
    json_t *alg = json_object_get(root, "algorithm"), *files = json_object_get(root, "files");
    if (!json_is_object(root))
        dcpi_err(err, EINVAL, "%s: not a JSON object", what);
    else if (!json_is_string(alg)) {
        dcpi_err(err, EINVAL, "%s: no \"algorithm\" string", what);
    } else if (strcmp(json_string_value(alg), "sha256") || json_string_length(alg) != 6) {
        char shown[128];
        dcp_key_text(json_string_value(alg), shown, sizeof shown);
        dcpi_err(err, ENOTSUP, "%s: algorithm \"%.64s\": only sha256 is known", what, shown);
    } else if (!json_is_object(files)) {
        dcpi_err(err, EINVAL, "%s: no \"files\" object", what);
    } else if (!(f = calloc(json_object_size(files) + 1, sizeof *f))) {
        dcpi_err(err, ENOMEM, "%s: out of memory", what);
    } else if (take_files(files, what, f, err) == 0) {
        rc = 1;
    }
    size_t n = rc == 1 ? json_object_size(files) : 0;
    hasher h = {.dirfd = dirfd, .f = f, .n = n, .progress = progress, .pctx = pctx};
    for (size_t i = 0; i < n; i++)
        if (fstatat(dirfd, f[i].name, &st, 0) == 0 && S_ISREG(st.st_mode))
            h.total += (uint64_t)st.st_size;
    if (rc == 1 && n) {
        pthread_mutex_init(&h.lock, NULL);
        if (progress)
            progress(pctx, 0, h.total);
        unsigned nt = dcp_read_threads(0);
        if (nt > n)
            nt = (unsigned)n;
        pthread_t *t = calloc(nt, sizeof *t);
        unsigned started = 0;
        for (; t && started + 1 < nt; started++)
            if (pthread_create(&t[started], NULL, hash_files, &h))
                break;
        hash_files(&h);   /* the calling thread hashes too: all of it when no thread could start */
        for (unsigned i = 0; i < started; i++)
            pthread_join(t[i], NULL);
        free(t);
        pthread_mutex_destroy(&h.lock);
        if (h.oom && atomic_load(&h.next) < n)
            rc = dcpi_err(err, ENOMEM, "%s: out of memory for reading", what);
        /* the end: the bytes hashed, fewer than planned when a file was missing, unreadable or shorter */
        uint64_t end = atomic_load(&h.done);
        if (progress)
            progress(pctx, end, end);
    }
    for (size_t i = 0; rc == 1 && i < n; i++) {
        char shown[1024], msg[2048], hex[2 * DCPI_SHA256_LEN + 1];
        if ((f[i].err || f[i].notreg) && named_by_structure(ck, f[i].name)) {
            ++*nproblems;   /* one line per damaged file: the structure check's, which says why */
            continue;
        }
        dcp_key_text(f[i].name, shown, sizeof shown);
        if (f[i].err == ENOENT)
            snprintf(msg, sizeof msg, "%s/%s: listed in %s, missing", folder, shown, MANIFEST_NAME);
        else if (f[i].err)
            snprintf(msg, sizeof msg, "%s/%s: cannot read: %s", folder, shown, strerror(f[i].err));
        else if (f[i].notreg)
            snprintf(msg, sizeof msg, "%s/%s: listed in %s, not a regular file", folder, shown,
                     MANIFEST_NAME);
        else {
            for (int k = 0; k < DCPI_SHA256_LEN; k++)
                snprintf(hex + 2 * k, 3, "%02x", f[i].got[k]);
            if (!strcmp(hex, f[i].want))
                continue;
            snprintf(msg, sizeof msg, "%s/%s: SHA-256 %s, %s lists %s", folder, shown, hex,
                     MANIFEST_NAME, f[i].want);
        }
        ++*nproblems;
        if (problem)
            problem(ctx, msg);
    }
    if (rc == 1) {
        *nfiles = n;
        if (note)
            folder_files(dirfd, folder, files, note, ctx);
    }
    free(f);
    json_decref(root);
    return rc;
}

int dcp_verify_manifest(dcp_checkpoint *ck, dcp_problem_fn problem, dcp_problem_fn note, void *ctx,
                        dcp_progress_fn progress, void *pctx, uint64_t *nfiles, uint64_t *nproblems,
                        dcp_error *err)
{
    *nfiles = *nproblems = 0;
    if (dcpi_ck_is_file(ck))
        return 0;
    return verify_at(ck, ck->dirfd, dcpi_ck_name(ck), problem, note, ctx, progress, pctx, nfiles, nproblems, err);
}

int dcp_verify_manifest_folder(const char *folder, dcp_problem_fn problem, dcp_problem_fn note, void *ctx,
                               dcp_progress_fn progress, void *pctx, uint64_t *nfiles, uint64_t *nproblems,
                               dcp_error *err)
{
    *nfiles = *nproblems = 0;
    int dirfd = open(folder, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dirfd < 0)
        return dcpi_err(err, errno, "%s: cannot open the folder: %s", folder, strerror(errno));
    int rc = verify_at(NULL, dirfd, folder, problem, note, ctx, progress, pctx, nfiles, nproblems, err);
    close(dirfd);
    return rc;
}
