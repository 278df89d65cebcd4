/* Opening a checkpoint: the catalog's model when it holds one, else the
 * format loader the folder's content calls for, whose model is then stored
 * in the catalog and served from it.
 *
 * The top of the core: it uses the model (model.c), the loaders (metadata.c,
 * safetensors.c) and the catalog (integrity/modelcache.c), and none of them
 * calls back here (the catalog gets parse_folder as a function to fall back
 * on).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "files.h"
#include "internal.h"
#include "sized_opts.h"
#include "probe.h"

static int parse_folder(const char *path, dcp_checkpoint **out, dcp_error *err);

/* A .metadata from this size on is parsed with its chunks spilled
 * (store_spill.c): ~1 MB of pickle a 8,000 chunks, ~1 KiB of memory a chunk
 * as a model; 64 MiB (about 500,000 chunks) keeps a first parse near 100 MiB. */
#define SPILL_AT (64ULL << 20)

static int has_file(int dirfd, const char *name)
{
    struct stat st;
    return fstatat(dirfd, name, &st, 0) == 0 && S_ISREG(st.st_mode);
}

/* What a folder that is no checkpoint holds (a fixture's root holding ckpt/,
 * a run folder of step folders): "; it holds the checkpoint folder ckpt/:
 * open PATH/ckpt", "; it holds the checkpoint folders a/, b/ and c/: open one
 * of them", or for more than HINT_NAMED the first two and the last two,
 * "a/, b/, ..., y/ and z/ (N in all)" — in natural order (step-900 before
 * step-1000), so that the newest steps of a run folder are the ones named
 * last; "" when none. One level down, by names alone (dcpi_probe_at opens no
 * file), writing nothing: at most HINT_ENTRIES entries listed and HINT_PROBES
 * subfolders probed, half from each end of the sorted names, so that a folder
 * of 100,000 steps stays quick to refuse. Names are shown as dcp_key_text
 * writes them (no newline or escape sequence reaches the message). */
#define HINT_PROBES 64
#define HINT_ENTRIES 10000
#define HINT_NAMED 4

/* Names in human order: digit runs compare as numbers (checkpoint-500 before
 * checkpoint-1000, leading zeros aside), the rest byte by byte. */
static int natural_cmp(const char *a, const char *b)
{
    while (*a && *b) {
        if (*a >= '0' && *a <= '9' && *b >= '0' && *b <= '9') {
            while (*a == '0')
                a++;
            while (*b == '0')
                b++;
            size_t na = 0, nb = 0;
            while (a[na] >= '0' && a[na] <= '9')
                na++;
            while (b[nb] >= '0' && b[nb] <= '9')
                nb++;
            if (na != nb)
                return na < nb ? -1 : 1;
            int c = memcmp(a, b, na);
            if (c)
                return c;
            a += na;
            b += nb;
        } else {
            if (*a != *b)
                return (unsigned char)*a < (unsigned char)*b ? -1 : 1;
            a++;
            b++;
        }
    }
    return *a ? 1 : *b ? -1 : 0;
}

static int by_natural(const void *a, const void *b)
{
    int c = natural_cmp(*(char *const *)a, *(char *const *)b);
    return c ? c : strcmp(*(char *const *)a, *(char *const *)b);   /* "step-01" and "step-1": one order */
}

/* printf at *at into buf (cap bytes), *at kept within it. */
__attribute__((format(printf, 4, 5)))
static void put(char *buf, size_t cap, size_t *at, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *at, cap - *at, fmt, ap);
    va_end(ap);
    *at = n < 0 || (size_t)n >= cap - *at ? cap - 1 : *at + (size_t)n;
}

/* The subfolders of the folder fd lists (hidden ones left out), at most
 * HINT_ENTRIES entries looked at (*more set when there were more); NULL
 * with *n 0 when none or out of memory. */
static char **subfolders(int fd, DIR *d, size_t *n, int *more)
{
    char **names = NULL;
    size_t cap = 0, entries = 0;
    struct dirent *de;
    *n = 0;
    *more = 0;
    while ((de = readdir(d))) {
        struct stat st;
        if (de->d_name[0] == '.')   /* ".", ".." and hidden folders: never a save to suggest */
            continue;
        if (entries++ == HINT_ENTRIES) {
            *more = 1;
            break;
        }
        int folder = de->d_type == DT_DIR;   /* a link counts by what it names */
        if (de->d_type == DT_LNK || de->d_type == DT_UNKNOWN)
            folder = fstatat(fd, de->d_name, &st, 0) == 0 && S_ISDIR(st.st_mode);
        if (!folder)
            continue;
        if (*n == cap) {
            size_t ncap = cap ? 2 * cap : 64;   /* (at most HINT_ENTRIES: no overflow) */
            char **grown = realloc(names, ncap * sizeof *names);
            if (!grown)
                break;
            names = grown;
            cap = ncap;
        }
        if (!(names[*n] = strdup(de->d_name)))
            break;
        (*n)++;
    }
    return names;
}

/* Whether the subfolder name of the folder fd (at path) is a checkpoint;
 * its own name judges it too (a staging "tmp-checkpoint-N" is partial). */
static int is_checkpoint_folder(int fd, const char *path, const char *name)
{
    dcp_folder_probe probe;
    char sub_path[PATH_MAX];
    int sub = openat(fd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NONBLOCK);
    if (sub < 0)
        return 0;
    snprintf(sub_path, sizeof sub_path, "%s/%s", path, name);
    int rc = dcpi_probe_at(sub, sub_path, &probe, NULL);
    close(sub);
    return rc == 0 && probe.kind == DCP_FOLDER_CHECKPOINT;
}

static void checkpoints_inside(int folder_fd, const char *path, char *buf, size_t cap)
{
    buf[0] = '\0';
    int fd = openat(folder_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd < 0 ? NULL : fdopendir(fd);
    if (!d) {
        if (fd >= 0)
            close(fd);
        return;
    }
    size_t nf;
    int more;
    char **names = subfolders(fd, d, &nf, &more);
    if (names)
        qsort(names, nf, sizeof *names, by_natural);
    /* the checkpoints among them: all of them when few subfolders (shown: up to HINT_NAMED,
     * else the first two and the last two), else the first two and the last two found
     * probing from each end (half the probes each) */
    size_t hit[HINT_PROBES], nhit = 0, nfront = 0, probed = 0;
    int all = nf <= HINT_PROBES;
    if (all) {
        for (size_t i = 0; i < nf; i++)
            if (is_checkpoint_folder(fd, path, names[i]))
                hit[nhit++] = i;
        probed = nf;
        nfront = nhit <= HINT_NAMED ? nhit : 2;
    } else {
        size_t i = 0, j = nf, back[2], nback = 0;
        for (; i < HINT_PROBES / 2 && nfront < 2; i++)
            if (is_checkpoint_folder(fd, path, names[i]))
                hit[nfront++] = i;
        for (; j > i && nf - j < HINT_PROBES / 2 && nback < 2; j--)
            if (is_checkpoint_folder(fd, path, names[j - 1]))
                back[nback++] = j - 1;
        nhit = nfront;
        while (nback)
            hit[nhit++] = back[--nback];
        probed = i + (nf - j);
    }
    closedir(d);
    /* shown: hit[0..nfront) then, after a gap where some lie between, the last ones */
    size_t nshown = nhit <= HINT_NAMED ? nhit : 4, len = strlen(path), at = 0;
    size_t first_back = nhit - (nshown - nfront);
    int gap = all ? nhit > HINT_NAMED : nshown > nfront && nfront > 0;
    const char *sep = len && path[len - 1] == '/' ? "" : "/";
    char shown[4 * NAME_MAX + 1];   /* a byte at most "\\xHH" */
    if (nhit) {
        put(buf, cap, &at, "; it holds the checkpoint folder%s ", nhit == 1 ? "" : "s");
        for (size_t k = 0; k < nshown; k++) {
            size_t h = hit[k < nfront ? k : first_back + (k - nfront)];
            dcp_key_text(names[h], shown, sizeof shown);
            put(buf, cap, &at, "%s%s/", k == 0 ? "" : k == nfront && gap ? ", ..., " : k + 1 == nshown ? " and " : ", ",
                shown);
        }
        if (more)
            put(buf, cap, &at, " (only %d of its entries were looked at)", HINT_ENTRIES);
        else if (!all)
            put(buf, cap, &at, " (%zu of its %zu subfolders were looked at)", probed, nf);
        else if (gap)
            put(buf, cap, &at, " (%zu in all)", nhit);
        if (nhit == 1) {
            /* a path too long to repeat within the message is not cut short: "that folder" */
            size_t before = at;
            dcp_key_text(names[hit[0]], shown, sizeof shown);
            put(buf, cap, &at, ": open %s%s%s", path, sep, shown);
            if (at == cap - 1) {
                at = before;
                put(buf, cap, &at, ": open that folder");
            }
        } else {
            put(buf, cap, &at, ": open one of them");
        }
    }
    for (size_t k = 0; k < nf; k++)
        free(names[k]);
    free(names);
}

/* Which layout the folder holds, from what is in it. */
static int detect_and_load(dcp_checkpoint *ck, dcp_error *err)
{
    if (ck->rank_view >= 0)   /* DCP_OPEN_RANK: that rank's __R.metadata, whatever else is here */
        return dcpi_load_rank_view(ck, (unsigned)ck->rank_view, err);
    if (has_file(ck->dirfd, ".metadata"))
        return dcpi_load_metadata(ck, ".metadata", err);
    struct stat st;   /* one that is there but no file is damage (never read: a FIFO would block) */
    if (fstatat(ck->dirfd, ".metadata", &st, 0) == 0)
        return dcpi_err(err, EINVAL, "%s/.metadata: not a regular file (%s)", ck->path,
                        S_ISDIR(st.st_mode) ? "a folder" : S_ISFIFO(st.st_mode) ? "a FIFO" : "a device or socket");

    int fd = openat(ck->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return dcpi_err(err, errno, "%s: cannot list the folder: %s", ck->path, strerror(errno));
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return dcpi_err(err, errno, "%s: cannot list the folder: %s", ck->path, strerror(errno));
    }
    int rank_local = 0, safetensors = 0, distcp = 0, rank_files = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t n = strlen(de->d_name);
        if (!dcpi_dirent_regular(dirfd(d), de))
            continue;
        if (n > 11 && strncmp(de->d_name, "__", 2) == 0 && strcmp(de->d_name + n - 9, ".metadata") == 0)
            rank_local = 1;
        else if (n > 12 && strcmp(de->d_name + n - 12, ".safetensors") == 0)
            safetensors = 1;
        else if ((n > 7 && strcmp(de->d_name + n - 7, ".distcp") == 0) || strcmp(de->d_name, ".metadata.tmp") == 0 ||
                 (n > 13 && strcmp(de->d_name + n - 13, ".metadata.tmp") == 0))
            distcp = 1;   /* what a save writes before .metadata */
        else if (dcp_is_rank_file(de->d_name))
            rank_files = 1;   /* torch-checkpointing, verl: rankfiles.c */
    }
    closedir(d);
    if (rank_local)
        return dcpi_load_rank_local(ck, err);
    if (safetensors)
        return dcpi_load_huggingface(ck, err);
    /* Shard files, in-flight names, ...: say that a save did not finish
     * (dcp_probe_folder tells callers the two apart without opening). */
    dcp_folder_probe probe;
    if (distcp && dcpi_probe_at(ck->dirfd, ck->path, &probe, NULL) == 0 && probe.kind == DCP_FOLDER_PARTIAL)
        return dcpi_err(err, ENOENT, "%s: a partial checkpoint: %s", ck->path, probe.reason);
    if (rank_files)
        return dcpi_load_rank_files(ck, err);
    /* the hint gets the room the message leaves it */
    static const char what[] = ": not a checkpoint: no .metadata, __R.metadata or .safetensors files";
    char inside[DCP_ERRMSG_MAX];
    size_t used = strlen(ck->path) + sizeof what - 1;
    inside[0] = '\0';
    if (used + 2 < sizeof inside)
        checkpoints_inside(ck->dirfd, ck->path, inside, sizeof inside - used);
    return dcpi_err(err, ENOENT, "%s%s%s", ck->path, what, inside);
}

int dcp_open(const char *path, unsigned flags, dcp_checkpoint **out, dcp_error *err)
{
    dcp_open_options o = DCP_OPEN_OPTIONS_INIT;
    o.flags = flags;
    return dcp_open_ex(path, &o, out, err);
}

/* A checkpoint served by the catalog, or NULL (any trouble: the caller
 * parses). from carries the .metadata's key and stamp in and out, so that
 * they are computed once per dcp_open. */
static dcp_checkpoint *open_served(const char *path, const char *catalog, dcp_checkpoint *from)
{
    dcp_error err;
    dcp_checkpoint *ck = dcpi_ck_new(path, &err);
    if (!ck)
        return NULL;
    ck->meta = from->meta;
    int rc = dcpi_catalog_load(ck, catalog, parse_folder);
    from->meta = ck->meta;
    if (rc < 0 || dcpi_ck_files_ready(ck, &err) < 0) {
        dcp_close(ck);
        return NULL;
    }
    dcpi_files_note_identity(ck);
    return ck;
}

/* Parse the folder into an empty ck (its files made ready). */
static int load(dcp_checkpoint *ck, dcp_error *err)
{
    /* Megatron-Core writes metadata.json next to its data: which backend */
    if (dcpi_megatron_config(ck, err) < 0 || detect_and_load(ck, err) < 0 || dcpi_ck_files_ready(ck, err) < 0)
        return -1;
    dcpi_megatron_count(ck);
    return 0;
}

/* Whether ck's .metadata is large enough to spill its chunks while parsing:
 * DCP_SPILL_BYTES (bytes; 0 spills every one), else SPILL_AT. */
static int spill_wanted(dcp_checkpoint *ck)
{
    struct stat sb;
    const char *v = getenv("DCP_SPILL_BYTES");
    char *end;
    unsigned long long at = SPILL_AT;
    if (v && *v) {
        errno = 0;
        at = strtoull(v, &end, 10);
        if (errno || *end)
            at = SPILL_AT;
    }
    return fstatat(ck->dirfd, ".metadata", &sb, 0) == 0 && (unsigned long long)sb.st_size >= at;
}

int dcp_open_ex(const char *path, const dcp_open_options *caller, dcp_checkpoint **out, dcp_error *err)
{
    *out = NULL;
    dcp_open_options o;
    const dcp_open_options *opts = &o;
    if (!caller)
        return dcp_open(path, 0, out, err);
    /* At least the first sized layout (0.2), which ends at the field named. */
    if (dcpi_sized_opts(&o, sizeof o, DCPI_OPTS_MIN(dcp_open_options, catalog), caller, "dcp_open_ex",
                        "DCP_OPEN_OPTIONS_INIT", err) < 0)
        return -1;
    if ((opts->flags & DCP_OPEN_RANK) && opts->rank > 100000000u)   /* (as rank-local folders are read) */
        return dcpi_err(err, EINVAL, "%s: rank %u: no job has this many ranks", path, opts->rank);
    dcp_checkpoint *ck = dcpi_ck_new(path, err);
    if (!ck)
        return -1;
    if (opts->flags & DCP_OPEN_RANK)
        ck->rank_view = (long)opts->rank;   /* detect_and_load reads that rank's file alone */
    /* A folded model, or one rank's view, is not the stored one: the catalog neither serves nor keeps it. */
    int fold = (opts->flags & DCP_OPEN_MEGATRON_FOLD) != 0;
    int use_catalog = !fold && ck->rank_view < 0 && (opts->flags & DCP_OPEN_CATALOG) &&
                      has_file(ck->dirfd, ".metadata");
    if (use_catalog) {
        dcp_checkpoint *served = open_served(path, opts->catalog, ck);
        if (served) {
            dcp_close(ck);
            served->from_catalog = 1;
            *out = served;
            return 0;
        }
    }
    /* A .metadata too large to hold as a model (spill_at): its chunks go to
     * scratch files beside the catalog as it is parsed, and the catalog
     * reads them back to store the model. What the spill cannot take parses
     * again in memory; a damaged checkpoint fails as it would in memory,
     * without a second parse of a file that may be gigabytes. */
    char dir[4096];
    if (use_catalog && spill_wanted(ck) && dcpi_catalog_folder(opts->catalog, ck, dir) == 0 &&
        dcpi_spill_begin(ck, dir, err) == 0) {
        if (load(ck, err) == 0)
            goto loaded;
        if (!dcpi_spill_refused(ck)) {
            dcp_close(ck);
            return -1;
        }
        if (getenv("DCP_DEBUG_STREAM"))
            fprintf(stderr, "%s: parsing in memory: %s\n", path, err->msg);
        dcp_close(ck);
        if (!(ck = dcpi_ck_new(path, err)))
            return -1;
    }
    if (load(ck, err) < 0 || (fold && dcpi_megatron_fold(ck, err) < 0)) {
        dcp_close(ck);
        return -1;
    }
loaded:
    dcpi_files_note_identity(ck);
    /* Store what was parsed, then serve it from the catalog like any later
     * open: the model's memory (a million chunks: ~350 MiB) goes
     * now rather than at dcp_close. A failure only costs a later parse. */
    int emptied = 0;
    if (use_catalog && dcpi_catalog_store(ck, opts->catalog) == 0) {
        if (ck->spill) {   /* one large model at a time: the spilled one goes first */
            dcp_checkpoint *empty = dcpi_ck_new(path, err);
            if (!empty) {
                dcp_close(ck);
                return -1;
            }
            empty->meta = ck->meta;
            dcp_close(ck);
            ck = empty;
            emptied = 1;
        }
        dcp_checkpoint *served = open_served(path, opts->catalog, ck);
        if (served) {
            dcp_close(ck);
            ck = served;
        } else if (emptied && load(ck, err) < 0) {   /* (rare: the catalog failed since) */
            dcp_close(ck);
            return -1;
        }
    }
    *out = ck;
    return 0;
}

/* A parse of the folder without the catalog: the catalog's fall-back. */
static int parse_folder(const char *path, dcp_checkpoint **out, dcp_error *err)
{
    return dcp_open(path, 0, out, err);
}

