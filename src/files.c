/* Reading data files: the fd cache, exact reads with many requests in
 * flight, the cached read and prefetch advice of an op. Plan execution
 * (reader.c), the blob decoder, the FUSE daemon and the loaders read through here.
 *
 * File descriptors. A checkpoint can have thousands of data files (one per
 * rank and thread, or one per key), more than the usual RLIMIT_NOFILE of
 * 1024, so fds are a bounded cache rather than "open everything". Each file
 * has a use count (reads in flight); a cached fd is closed only when its
 * count is zero, so no thread ever reads from a closed or reused fd. The
 * cache keeps at most half of RLIMIT_NOFILE open (the rest is the
 * front-end's), and if open(2) still fails with EMFILE/ENFILE the idle older
 * half is closed and the open retried. An fd handed out by dcp_file_fd or
 * dcpi_ck_fd is pinned: it has no release call, so it stays open until
 * dcp_close. All of this is ck->io, this file's (made by dcpi_ck_files_ready,
 * freed at dcp_close through the closer it registers), guarded by ck->lock;
 * only the opens happen under it, the reads do not.
 *
 * A file opened later must be the file that was there when the checkpoint
 * was opened (same device and inode, noted by dcp_open), and one reopened
 * after its fd was closed the file first opened: a checkpoint replaced by
 * rename gives EIO rather than the new files' bytes at the old offsets,
 * mixed with bytes of the old ones. The same holds for a file written to in
 * place (torch's second save into the same folder truncates and rewrites
 * each shard, then renames a new .metadata over the old): size and mtime
 * are noted too, and checked again after the reads of a plan, of a blob,
 * and when dcp_file_fd hands an fd out. A write moves mtime before its
 * bytes land, so bytes read before an unchanged mtime are the old ones.
 *
 * Paths come from metadata and were checked lexically when the model was
 * built (relative, no ".."); symlinks inside the folder are followed because
 * the Hugging Face cache layout is made of them. Files are opened O_NONBLOCK
 * and must be regular files, so a FIFO planted in a folder cannot hang us.
 *
 * Parallel reads. One thread with one request in flight leaves a device (or
 * a network file system) idle between requests and, from the page cache,
 * moves bytes at one core's copy rate. A read of at least 2 pieces is cut
 * into up to dcp_read_threads() pieces of at least PIECE_MIN bytes, read at
 * once by short-lived threads (the caller reads the first): a thread costs
 * tens of microseconds, a piece milliseconds. Process-wide, because the
 * device is: the budget is shared by every thread reading at once, so a
 * read is cut only into the threads left of it (a caller with reader
 * threads of its own, the loader, reads each request whole on each).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/magic.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "files.h"
#include "internal.h"

/* ------------------------------------------------------------ fd cache */

struct dcpi_files {
    size_t nfiles;        /* ck->nfiles when made: the length of every array */
    int *fds;             /* -1 until opened */
    int64_t *sizes;       /* -1 until stat'ed; the checkpoint is immutable */
    uint32_t *users;      /* reads in flight per file: the fd stays open while > 0 */
    uint64_t *last_use;   /* clock of the last acquire, to close the oldest first */
    uint8_t *pinned;      /* handed out to a caller with no release: open until dcp_close */
    uint8_t *seen;        /* opened before: dev, ino, size and mtime hold its identity */
    uint64_t *dev, *ino;
    int64_t *size0;       /* size and mtime when noted: a write changes one or both */
    struct timespec *mtim0;
    size_t nopen;         /* fds open now, pinned included */
    size_t cap;           /* soft bound on nopen */
    uint64_t clock;
};

/* Half of RLIMIT_NOFILE (the rest is the front end's), at least 16. Read at
 * every open, as a daemon's limit may change after the checkpoint opened. */
static size_t fd_cap(void)
{
    struct rlimit rl;
    size_t cap = 512;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        cap = rl.rlim_cur / 2;
    return cap < 16 ? 16 : cap;
}

static void files_free(void *state)
{
    struct dcpi_files *t = state;
    for (size_t i = 0; i < t->nfiles; i++)
        if (t->fds[i] >= 0)
            close(t->fds[i]);
    free(t->fds);
    free(t->sizes);
    free(t->users);
    free(t->last_use);
    free(t->pinned);
    free(t->seen);
    free(t->dev);
    free(t->ino);
    free(t->size0);
    free(t->mtim0);
    free(t);
}

int dcpi_ck_files_ready(dcp_checkpoint *ck, dcp_error *err)
{
    size_t n = ck->nfiles ? ck->nfiles : 1;
    struct dcpi_files *t = calloc(1, sizeof *t);
    if (!t)
        return dcpi_err(err, ENOMEM, "%s: out of memory", ck->path);
    t->fds = malloc(n * sizeof *t->fds);
    t->sizes = malloc(n * sizeof *t->sizes);
    t->users = calloc(n, sizeof *t->users);
    t->last_use = calloc(n, sizeof *t->last_use);
    t->pinned = calloc(n, 1);
    t->seen = calloc(n, 1);
    t->dev = calloc(n, sizeof *t->dev);
    t->ino = calloc(n, sizeof *t->ino);
    t->size0 = calloc(n, sizeof *t->size0);
    t->mtim0 = calloc(n, sizeof *t->mtim0);
    if (t->fds && t->sizes)
        for (size_t i = 0; i < ck->nfiles; i++) {
            t->fds[i] = -1;
            t->sizes[i] = -1;
        }
    t->nfiles = ck->nfiles;
    t->cap = fd_cap();
    if (!t->fds || !t->sizes || !t->users || !t->last_use || !t->pinned || !t->seen || !t->dev || !t->ino ||
        !t->size0 || !t->mtim0) {
        files_free(t);
        return dcpi_err(err, ENOMEM, "%s: out of memory", ck->path);
    }
    if (ck->io || dcpi_ck_on_close(ck, files_free, t, err) < 0) {
        files_free(t);
        return ck->io ? dcpi_err(err, EINVAL, "%s: the data files' state is made twice", ck->path) : -1;
    }
    ck->io = t;
    return 0;
}

/* The data files' state, or NULL with err before dcpi_ck_files_ready. */
static struct dcpi_files *io_of(dcp_checkpoint *ck, dcp_error *err)
{
    if (!ck->io)
        dcpi_err(err, EINVAL, "%s: the data files are not set up (dcpi_ck_files_ready)", ck->path);
    return ck->io;
}

/* Under ck->lock: close the idle (unused, unpinned) fds that are at least as
 * old as the average idle one, i.e. roughly the older half. Returns how many
 * were closed. O(nfiles), and only runs when the cache is full. */
static size_t evict_idle(dcp_checkpoint *ck, struct dcpi_files *t)
{
    uint64_t sum = 0, n = 0;
    for (size_t i = 0; i < ck->nfiles; i++)
        if (t->fds[i] >= 0 && !t->pinned[i] && t->users[i] == 0) {
            sum += t->last_use[i] / 1024;   /* scaled so the sum cannot overflow */
            n++;
        }
    if (!n)
        return 0;
    uint64_t avg = sum / n;
    size_t closed = 0;
    for (size_t i = 0; i < ck->nfiles; i++)
        if (t->fds[i] >= 0 && !t->pinned[i] && t->users[i] == 0 && t->last_use[i] / 1024 <= avg) {
            close(t->fds[i]);
            t->fds[i] = -1;
            closed++;
        }
    t->nopen -= closed;
    return closed;
}

/* The name of the kernel's pseudo-filesystem fd is on, else NULL. Their files
 * are "regular" and of size 0, yet read the reader's own state: a link in a
 * checkpoint folder to /proc/self/mem or /proc/self/environ would serve the
 * reading process's memory (a dcpfs daemon's, to whoever reads the mount). */
static const char *kernel_fs(int fd)
{
    static const struct { long magic; const char *name; } fs[] = {
        {PROC_SUPER_MAGIC, "procfs"}, {SYSFS_MAGIC, "sysfs"}, {DEBUGFS_MAGIC, "debugfs"},
        {TRACEFS_MAGIC, "tracefs"}, {SECURITYFS_MAGIC, "securityfs"}, {CGROUP_SUPER_MAGIC, "cgroupfs"},
        {CGROUP2_SUPER_MAGIC, "cgroup2"}, {BPF_FS_MAGIC, "bpffs"}, {EFIVARFS_MAGIC, "efivarfs"},
    };
    struct statfs sf;
    if (fstatfs(fd, &sf) < 0)
        return NULL;
    for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++)
        if ((long)sf.f_type == fs[i].magic)
            return fs[i].name;
    return NULL;
}

/* Under ck->lock: note st as data file `file`'s identity. */
static void note(struct dcpi_files *t, uint32_t file, const struct stat *st)
{
    t->seen[file] = 1;
    t->dev[file] = (uint64_t)st->st_dev;
    t->ino[file] = (uint64_t)st->st_ino;
    t->size0[file] = (int64_t)st->st_size;
    t->mtim0[file] = st->st_mtim;
}

/* Under ck->lock: is st (the file now) other than the one noted? NULL when
 * it is the same (or none was noted), else why, for the error. */
static const char *changed(const struct dcpi_files *t, uint32_t file, const struct stat *st)
{
    if (!t->seen[file])
        return NULL;
    if (t->dev[file] != (uint64_t)st->st_dev || t->ino[file] != (uint64_t)st->st_ino)
        return "the data file was replaced since it was first read (the checkpoint changed)";
    if (t->size0[file] != (int64_t)st->st_size || t->mtim0[file].tv_sec != st->st_mtim.tv_sec ||
        t->mtim0[file].tv_nsec != st->st_mtim.tv_nsec)
        return "the data file was written to since the checkpoint was opened (saved again in place)";
    return NULL;
}

int dcpi_file_unchanged(dcp_checkpoint *ck, uint32_t file, int fd, const char *key, dcp_error *err)
{
    struct stat st;
    if (fstat(fd, &st) < 0)
        return dcpi_err(err, errno, "%s/%s: %s%scannot stat the data file: %s", ck->path, ck->files[file],
                        key ? key : "", key ? ": " : "", strerror(errno));
    pthread_mutex_lock(&ck->lock);
    const char *why = ck->io && file < ck->io->nfiles ? changed(ck->io, file, &st) : NULL;
    pthread_mutex_unlock(&ck->lock);
    if (why)
        return dcpi_err(err, EIO, "%s/%s: %s%s%s", ck->path, ck->files[file], key ? key : "", key ? ": " : "", why);
    return 0;
}

/* Under ck->lock: open data file `file` into t->fds and record its size. */
static int open_file(dcp_checkpoint *ck, struct dcpi_files *t, uint32_t file, const char *key,
                     dcp_error *err)
{
    const char *rel = ck->files[file];
    const char *k = key ? key : "";
    const char *sep = key ? ": " : "";
    t->cap = fd_cap();
    if (t->nopen >= t->cap)
        evict_idle(ck, t);
    int fd = openat(ck->dirfd, rel, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0 && (errno == EMFILE || errno == ENFILE) && evict_idle(ck, t) > 0)
        fd = openat(ck->dirfd, rel, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        int e = errno;
        if (e == ENOENT)
            return dcpi_err(err, ENOENT, "%s/%s: %s%sthe data file is missing", ck->path, rel, k, sep);
        if (e == EMFILE || e == ENFILE)
            return dcpi_err(err, e, "%s/%s: %s%scannot open the data file: %s (all cached files are in use; raise RLIMIT_NOFILE with ulimit -n)",
                           ck->path, rel, k, sep, strerror(e));
        return dcpi_err(err, e, "%s/%s: %s%scannot open the data file: %s", ck->path, rel, k, sep,
                       strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int e = errno;
        close(fd);
        return dcpi_err(err, e, "%s/%s: %s%scannot stat the data file: %s", ck->path, rel, k, sep,
                       strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return dcpi_err(err, EINVAL, "%s/%s: %s%sthe data file is not a regular file", ck->path, rel,
                       k, sep);
    }
    const char *kfs = kernel_fs(fd);
    if (kfs) {
        close(fd);
        return dcpi_err(err, EINVAL, "%s/%s: %s%sthe data file is a kernel file (%s), not checkpoint data", ck->path,
                        rel, k, sep, kfs);
    }
    const char *why = changed(t, file, &st);
    if (why) {
        close(fd);
        return dcpi_err(err, EIO, "%s/%s: %s%s%s", ck->path, rel, k, sep, why);
    }
    note(t, file, &st);
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
        (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    t->fds[file] = fd;
    if (t->sizes[file] < 0)
        t->sizes[file] = (int64_t)st.st_size;   /* the checkpoint is immutable */
    t->nopen++;
    return 0;
}

void dcpi_files_note_identity(dcp_checkpoint *ck)
{
    struct dcpi_files *t = ck->io;
    pthread_mutex_lock(&ck->lock);
    for (size_t i = 0; t && i < ck->nfiles; i++) {
        struct stat st;
        if (t->seen[i] || fstatat(ck->dirfd, ck->files[i], &st, 0) != 0 || !S_ISREG(st.st_mode))
            continue;   /* missing or odd: the read that needs it reports it */
        note(t, (uint32_t)i, &st);
    }
    pthread_mutex_unlock(&ck->lock);
}

/* Take a use of file's fd (opening it if needed). With pin, it is never
 * closed before dcp_close and needs no release. */
int dcpi_fd_acquire(dcp_checkpoint *ck, uint32_t file, const char *key, int pin, int *fd,
                     uint64_t *size, dcp_error *err)
{
    if (file >= ck->nfiles)
        return dcpi_err(err, EINVAL, "%s: %s%sdata file index %" PRIu32 " out of range (%zu files)",
                       ck->path, key ? key : "", key ? ": " : "", file, ck->nfiles);
    struct dcpi_files *t = io_of(ck, err);
    if (!t)
        return -1;
    if (file >= t->nfiles)   /* a file declared after the state was made */
        return dcpi_err(err, EINVAL, "%s: %s%sdata file index %" PRIu32 " out of range (%zu files)",
                        ck->path, key ? key : "", key ? ": " : "", file, t->nfiles);
    pthread_mutex_lock(&ck->lock);
    if (t->fds[file] < 0 && open_file(ck, t, file, key, err) < 0) {
        pthread_mutex_unlock(&ck->lock);
        return -1;
    }
    if (pin)
        t->pinned[file] = 1;
    else
        t->users[file]++;
    t->last_use[file] = ++t->clock;
    *fd = t->fds[file];
    if (size)
        *size = (uint64_t)t->sizes[file];
    pthread_mutex_unlock(&ck->lock);
    return 0;
}

size_t dcpi_files_open(dcp_checkpoint *ck)
{
    pthread_mutex_lock(&ck->lock);
    size_t n = ck->io ? ck->io->nopen : 0;
    pthread_mutex_unlock(&ck->lock);
    return n;
}

void dcpi_fd_release(dcp_checkpoint *ck, uint32_t file)
{
    pthread_mutex_lock(&ck->lock);
    ck->io->users[file]--;
    pthread_mutex_unlock(&ck->lock);
}

int dcpi_ck_fd(dcp_checkpoint *ck, uint32_t file, int *fd, dcp_error *err)
{
    return dcpi_fd_acquire(ck, file, NULL, 1, fd, NULL, err);
}

int dcp_file_fd(dcp_checkpoint *ck, uint32_t file, int *fd, dcp_error *err)
{
    /* the caller reads it right after: the file must still be the one noted */
    if (dcpi_fd_acquire(ck, file, NULL, 1, fd, NULL, err) < 0)
        return -1;
    return dcpi_file_unchanged(ck, file, *fd, NULL, err);
}

int dcpi_ck_file_size(dcp_checkpoint *ck, uint32_t file, uint64_t *size, dcp_error *err)
{
    if (file < ck->nfiles && ck->io) {
        pthread_mutex_lock(&ck->lock);
        int64_t s = ck->io->sizes[file];
        pthread_mutex_unlock(&ck->lock);
        if (s >= 0) {
            *size = (uint64_t)s;
            return 0;
        }
    }
    int fd;
    if (dcpi_fd_acquire(ck, file, NULL, 0, &fd, size, err) < 0)
        return -1;
    dcpi_fd_release(ck, file);
    return 0;
}

/* ------------------------------------------------------------ preads */

#define PIECE_MIN ((size_t)1 << 20)   /* smaller pieces cost more in threads than they gain */
#define THREADS_MAX 64
#define THREADS_DEFAULT 8

static atomic_uint read_threads;      /* 0: not set yet */

static unsigned threads_now(void)
{
    unsigned n = atomic_load(&read_threads);
    if (n)
        return n;
    n = THREADS_DEFAULT;
    const char *s = getenv("DCP_READ_THREADS");
    if (s && *s) {
        char *end;
        unsigned long v = strtoul(s, &end, 10);
        if (*end == 0 && v >= 1)
            n = v > THREADS_MAX ? THREADS_MAX : (unsigned)v;
    }
    unsigned zero = 0;
    atomic_compare_exchange_strong(&read_threads, &zero, n);
    return atomic_load(&read_threads);
}

unsigned dcp_read_threads(unsigned n)
{
    unsigned old = threads_now();
    if (n)
        atomic_store(&read_threads, n > THREADS_MAX ? THREADS_MAX : n);
    return old;
}

/* Read iov[0..cnt) from off on, until all of it, end of file, or (with
 * RWF_NOWAIT in flags) the first byte not in the page cache; *got says how
 * many bytes arrived. iov is consumed. Returns 0 or an errno. */
static int preadv_loop(int fd, struct iovec *iov, int cnt, uint64_t off, int flags, size_t *got)
{
    size_t done = 0;
    while (cnt > 0) {
        /* Linux moves at most ~2 GiB per call: keep to 1 GiB and few vectors */
        int c = cnt > IOV_MAX ? IOV_MAX : cnt;
        ssize_t n;
        if (c == 1 && !flags) {
            size_t want = iov->iov_len > ((size_t)1 << 30) ? (size_t)1 << 30 : iov->iov_len;
            n = pread(fd, iov->iov_base, want, (off_t)(off + done));
        } else {
            n = preadv2(fd, iov, c, (off_t)(off + done), flags);
        }
        if (n < 0) {
            if (errno == EINTR)
                continue;
            *got = done;
            return flags && (errno == EAGAIN || errno == EOPNOTSUPP || errno == EINVAL) ? 0 : errno;
        }
        if (n == 0)
            break;
        done += (size_t)n;
        size_t left = (size_t)n;
        while (cnt && left >= iov->iov_len) {
            left -= iov->iov_len;
            iov++, cnt--;
        }
        if (cnt) {
            iov->iov_base = (char *)iov->iov_base + left;
            iov->iov_len -= left;
        }
    }
    *got = done;
    return 0;
}

struct piece {
    int fd, flags, cnt;
    struct iovec *iov;
    uint64_t off;
    size_t want, got;
    int err;
};

static void *piece_run(void *arg)
{
    struct piece *p = arg;
    p->err = preadv_loop(p->fd, p->iov, p->cnt, p->off, p->flags, &p->got);
    return NULL;
}

/* Threads reading in this process (callers and their pieces): the
 * dcp_read_threads() budget is shared among them. A caller that already
 * reads on many threads of its own (the loader's I/O threads, a FUSE
 * daemon's workers) then reads each request whole on its own thread, which measured faster than every request in
 * pieces on top (2 GiB evicted into fresh memory, 8 unit readers: 1.5-1.8 s
 * against 1.9-3.0 s, with a third less CPU: pieces of one huge page written
 * by two threads contend for its first fault). */
static atomic_uint reads_in_flight;
static atomic_ulong pieces_started;   /* threads started for pieces (tests) */

void dcpi_read_budget_hold(int n)
{
    if (n >= 0)
        atomic_fetch_add(&reads_in_flight, (unsigned)n);
    else
        atomic_fetch_sub(&reads_in_flight, (unsigned)-n);
}

unsigned long dcpi_read_pieces_started(void)
{
    return atomic_load(&pieces_started);
}

static int preadv_whole(int fd, const struct iovec *iov, int cnt, uint64_t off, int flags, size_t *got)
{
    struct iovec one[8];
    struct iovec *v = cnt <= 8 ? one : malloc((size_t)cnt * sizeof *v);
    if (!v)
        return ENOMEM;
    memcpy(v, iov, (size_t)cnt * sizeof *v);
    int e = preadv_loop(fd, v, cnt, off, flags, got);
    if (v != one)
        free(v);
    return e;
}

static int preadv_split(int fd, const struct iovec *iov, int cnt, uint64_t off, int flags, size_t *got);

int dcpi_preadv_exact(int fd, const struct iovec *iov, int cnt, uint64_t off, int flags, size_t *got)
{
    atomic_fetch_add(&reads_in_flight, 1);
    int e = preadv_split(fd, iov, cnt, off, flags, got);
    atomic_fetch_sub(&reads_in_flight, 1);
    return e;
}

static int preadv_split(int fd, const struct iovec *iov, int cnt, uint64_t off, int flags, size_t *got)
{
    size_t total = 0;
    for (int i = 0; i < cnt; i++)
        total += iov[i].iov_len;
    unsigned busy = atomic_load(&reads_in_flight);   /* this read included */
    unsigned k = threads_now();
    k = busy >= k ? 1 : k - busy + 1;   /* the threads left, and this one */
    if (k > total / PIECE_MIN)
        k = (unsigned)(total / PIECE_MIN);
    if (k < 2)
        return preadv_whole(fd, iov, cnt, off, flags, got);
    /* k pieces of about total/k bytes (whole 64 KiB blocks), each its own
     * slice of the vector: a piece may start and end inside an iovec */
    struct piece pc[THREADS_MAX];
    size_t share = (total / k + 65535) & ~(size_t)65535;
    struct iovec *all = malloc(((size_t)cnt + k) * sizeof *all);
    if (!all)
        return ENOMEM;
    size_t vi = 0, in = 0, pos = 0, used = 0;   /* iov index, bytes used of it, file position */
    unsigned np = 0;
    while (pos < total && np < k) {
        struct piece *p = &pc[np++];
        p->fd = fd, p->flags = flags, p->off = off + pos, p->iov = all + used, p->cnt = 0;
        p->want = total - pos < share || np == k ? total - pos : share;
        p->got = 0, p->err = 0;
        for (size_t need = p->want; need;) {
            size_t take = iov[vi].iov_len - in < need ? iov[vi].iov_len - in : need;
            all[used].iov_base = (char *)iov[vi].iov_base + in;
            all[used].iov_len = take;
            used++, p->cnt++;
            need -= take, in += take;
            if (in == iov[vi].iov_len)
                vi++, in = 0;
        }
        pos += p->want;
    }
    pthread_t th[THREADS_MAX];
    unsigned char started[THREADS_MAX] = {0};
    atomic_fetch_add(&reads_in_flight, np - 1);
    for (unsigned i = 1; i < np; i++)
        if ((started[i] = pthread_create(&th[i], NULL, piece_run, &pc[i]) == 0))
            atomic_fetch_add(&pieces_started, 1);
    piece_run(&pc[0]);
    for (unsigned i = 1; i < np; i++) {
        if (started[i])
            pthread_join(th[i], NULL);
        else
            piece_run(&pc[i]);   /* no thread to be had: read it here */
    }
    atomic_fetch_sub(&reads_in_flight, np - 1);
    free(all);
    /* what arrived is the prefix up to the first piece that fell short */
    size_t done = 0;
    int e = 0;
    for (unsigned i = 0; i < np; i++) {
        done += pc[i].got;
        if (pc[i].err || pc[i].got < pc[i].want) {
            e = pc[i].err;
            break;
        }
    }
    *got = done;
    return e;
}

int dcpi_pread_exact(int fd, void *buf, size_t len, uint64_t off, size_t *got)
{
    struct iovec v = {buf, len};
    return dcpi_preadv_exact(fd, &v, 1, off, 0, got);
}

/* The message for a failed or short read of [off, off+want). */
int dcpi_read_error(dcp_checkpoint *ck, uint32_t file, const char *key, uint64_t off, uint64_t want, int fd,
                    int e, dcp_error *err)
{
    if (e)
        return dcpi_err(err, e, "%s/%s: %s: read error at offset %" PRIu64 ": %s", ck->path,
                       ck->files[file], key, off, strerror(e));
    struct stat st;
    if (fstat(fd, &st) < 0)
        return dcpi_err(err, EIO, "%s/%s: %s: short read at offset %" PRIu64 " (wanted %" PRIu64 " bytes)",
                        ck->path, ck->files[file], key, off, want);
    return dcpi_err(err, EIO, "%s/%s: %s: short read at offset %" PRIu64 " (wanted %" PRIu64
                   " bytes, the file has %lld)", ck->path, ck->files[file], key, off, want, (long long)st.st_size);
}

int dcpi_check_range(dcp_checkpoint *ck, uint32_t file, const char *key, uint64_t off, uint64_t len,
                     dcp_error *err)
{
    uint64_t end;
    if (!dcpi_add_u64(off, len, &end) || end > (uint64_t)INT64_MAX)
        return dcpi_err(err, EOVERFLOW, "%s/%s: %s: read of %" PRIu64 " bytes at offset %" PRIu64
                       " is beyond any file size", ck->path, ck->files[file], key, len, off);
    return 0;
}

int dcpi_pread_full(dcp_checkpoint *ck, uint32_t file, void *buf, size_t len, uint64_t off,
                   const char *key, dcp_error *err)
{
    if (!key)
        key = "";
    int fd;
    if (dcpi_fd_acquire(ck, file, key, 0, &fd, NULL, err) < 0)
        return -1;
    if (dcpi_check_range(ck, file, key, off, len, err) < 0) {
        dcpi_fd_release(ck, file);
        return -1;
    }
    size_t got;
    int e = dcpi_pread_exact(fd, buf, len, off, &got), rc = 0;
    if (e || got < len)
        rc = dcpi_read_error(ck, file, key, off, len, fd, e, err);
    else
        rc = dcpi_file_unchanged(ck, file, fd, key, err);
    dcpi_fd_release(ck, file);
    return rc;
}

/* ------------------------------------------------------------ fetching */

uint64_t dcp_op_fetch_cached(dcp_checkpoint *ck, const dcp_op *op, void *buf)
{
    int fd;
    uint64_t fsize;
    dcp_error e;
    if (op->flags & DCP_OP_DECODED || op->length > SIZE_MAX ||
        dcpi_fd_acquire(ck, op->file, NULL, 0, &fd, &fsize, &e) < 0)
        return 0;
    size_t done = 0;
    if (dcpi_check_range(ck, op->file, "", op->src_offset, op->length, &e) == 0) {
        /* EAGAIN: not cached; EOPNOTSUPP, EINVAL: cannot tell; 0: end of file */
        struct iovec v = {buf, (size_t)op->length};
        (void)dcpi_preadv_exact(fd, &v, 1, op->src_offset, RWF_NOWAIT, &done);
        if (done && dcpi_file_unchanged(ck, op->file, fd, NULL, &e) < 0)
            done = 0;   /* written to since opened: the caller's read says so */
    }
    dcpi_fd_release(ck, op->file);
    return done;
}

/* Is every page of [p, p+n) (p page-aligned) in the page cache? */
static int all_resident(void *p, size_t n, size_t page)
{
    size_t pages = (n + page - 1) / page;
    unsigned char small[512];
    unsigned char *v = pages <= sizeof small ? small : malloc(pages);
    if (!v)
        return 0;
    int ok = mincore(p, n, v) == 0;
    for (size_t i = 0; ok && i < pages; i++)
        ok = v[i] & 1;
    if (v != small)
        free(v);
    return ok;
}

int dcp_op_map_cached(dcp_checkpoint *ck, const dcp_op *op, const void **at, void **base, size_t *len)
{
    *at = NULL;
    *base = NULL;
    *len = 0;
    long pg = sysconf(_SC_PAGESIZE);
    size_t page = pg > 0 ? (size_t)pg : 4096;
    int fd;
    uint64_t fsize, end;
    dcp_error e;
    if (op->flags & DCP_OP_DECODED || op->length == 0 || op->length > SIZE_MAX - page ||
        dcpi_fd_acquire(ck, op->file, NULL, 0, &fd, &fsize, &e) < 0)
        return 0;
    void *p = MAP_FAILED;
    uint64_t from = op->src_offset / page * page;
    size_t lead = (size_t)(op->src_offset - from), n = lead + (size_t)op->length;
    /* read as usual past the end: that read reports the short file */
    /* a file written to since opened is not mapped: the caller's read says so */
    if (dcpi_add_u64(op->src_offset, op->length, &end) && end <= fsize && from <= (uint64_t)INT64_MAX &&
        dcpi_file_unchanged(ck, op->file, fd, NULL, &e) == 0)
        p = mmap(NULL, n, PROT_READ, MAP_SHARED, fd, (off_t)from);
    dcpi_fd_release(ck, op->file);   /* the mapping keeps the file */
    if (p == MAP_FAILED)
        return 0;
    if (!all_resident(p, n, page)) {
        munmap(p, n);
        return 0;
    }
    *at = (const unsigned char *)p + lead;
    *base = p;
    *len = n;
    return 1;
}

void dcp_op_unmap(void *base, size_t len)
{
    if (base)
        munmap(base, len);
}

/* A new O_DIRECT descriptor of data file `file`, if the file system takes
 * it and the file is the one read before (same device, inode, size and
 * mtime); closed by the caller. One per read: no cache to bound, an open is cheap next to a
 * staging-sized read. */
static int open_direct(dcp_checkpoint *ck, uint32_t file)
{
    dcp_error e;
    struct dcpi_files *t = file < ck->nfiles ? io_of(ck, &e) : NULL;
    if (!t || file >= t->nfiles)
        return -1;
    int fd = openat(ck->dirfd, ck->files[file], O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | O_DIRECT);
    if (fd < 0)
        return -1;
    struct stat st;
    int same = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    pthread_mutex_lock(&ck->lock);
    same = same && t->seen[file] && !changed(t, file, &st);
    pthread_mutex_unlock(&ck->lock);
    int fl = same ? fcntl(fd, F_GETFL) : -1;
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Whether an op's bytes can be read with O_DIRECT at all: stored as they are
 * (not decoded), not empty, and ending (`end`) where a block rounded up still
 * fits an off_t. */
static int direct_span(const dcp_op *op, uint64_t *end)
{
    return !(op->flags & DCP_OP_DECODED) && op->length != 0 && op->length <= SIZE_MAX &&
           dcpi_add_u64(op->src_offset, op->length, end) && *end <= (uint64_t)INT64_MAX - DCP_DIRECT_ALIGN;
}

int dcp_op_fetch_direct(dcp_checkpoint *ck, const dcp_op *op, void *buf, size_t cap, size_t *lead)
{
    uint64_t end;
    *lead = (size_t)(op->src_offset % DCP_DIRECT_ALIGN);
    if (!direct_span(op, &end) || (uintptr_t)buf % DCP_DIRECT_ALIGN)
        return 1;
    uint64_t from = op->src_offset - *lead;
    uint64_t to = (end + DCP_DIRECT_ALIGN - 1) / DCP_DIRECT_ALIGN * DCP_DIRECT_ALIGN;
    if (to - from > cap)
        return 1;
    int fd = open_direct(ck, op->file);
    if (fd < 0)
        return 1;
    struct iovec v = {buf, (size_t)(to - from)};
    size_t got = 0;
    dcp_error err;
    int e = dcpi_preadv_exact(fd, &v, 1, from, 0, &got);
    if (!e && dcpi_file_unchanged(ck, op->file, fd, NULL, &err) < 0)
        e = 1;   /* written to during the read: the fallback says so */
    close(fd);
    return e || got < end - from ? 1 : 0;   /* short only at the end of the file, else the fallback says */
}

int dcp_op_fetch_direct_at(dcp_checkpoint *ck, const dcp_op *op, void *dest)
{
    uint64_t end;
    const uint64_t A = DCP_DIRECT_ALIGN;
    if (!direct_span(op, &end) || ((uintptr_t)dest - op->src_offset) % A)
        return 1;
    /* One request: the whole blocks straight into dest, the partial ones at
     * either end into bounce blocks (so nothing outside dest is written),
     * copied from there after. */
    uint64_t from = op->src_offset / A * A;
    uint64_t in0 = (op->src_offset + A - 1) / A * A, in1 = end / A * A;   /* the whole blocks */
    int head = op->src_offset % A != 0, tail = end % A != 0 && (in1 >= in0 || !head);
    unsigned char *d = dest, *bounce = NULL;
    if ((head || tail) && posix_memalign((void **)&bounce, A, 2 * A) != 0)
        return 1;
    struct iovec v[3];
    int n = 0;
    if (head)
        v[n++] = (struct iovec){bounce, (size_t)A};
    if (in1 > in0)
        v[n++] = (struct iovec){d + (in0 - op->src_offset), (size_t)(in1 - in0)};
    if (tail)
        v[n++] = (struct iovec){bounce + A, (size_t)A};
    int fd = open_direct(ck, op->file), rc = 1;
    size_t got = 0;
    if (fd >= 0) {
        dcp_error err;
        (void)dcpi_preadv_exact(fd, v, n, from, 0, &got);
        rc = got < end - from ||   /* short only past the end of the file */
             dcpi_file_unchanged(ck, op->file, fd, NULL, &err) < 0;   /* written to during the read */
        close(fd);
    }
    if (!rc && head)   /* the head block may hold the whole op */
        memcpy(d, bounce + op->src_offset % A, (size_t)((in0 < end ? in0 : end) - op->src_offset));
    if (!rc && tail)
        memcpy(d + (in1 - op->src_offset), bounce + A, (size_t)(end - in1));
    free(bounce);
    return rc;
}

void dcp_op_prefetch(dcp_checkpoint *ck, const dcp_op *op)
{
    int fd;
    uint64_t fsize;
    dcp_error e;
    if (op->flags & DCP_OP_DECODED || op->src_offset > (uint64_t)INT64_MAX ||
        op->length > (uint64_t)INT64_MAX || dcpi_fd_acquire(ck, op->file, NULL, 0, &fd, &fsize, &e) < 0)
        return;
    (void)posix_fadvise(fd, (off_t)op->src_offset, (off_t)op->length, POSIX_FADV_WILLNEED);
    dcpi_fd_release(ck, op->file);
}
