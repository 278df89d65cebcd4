/* The bulk hasher of dcp verify: XXH3-64 of every wanted blob, file by file
 * in offset order, with reading and hashing overlapped.
 *
 * The reads are planned first, from the blobs' offsets and lengths and the
 * files' sizes alone: a window of up to WINDOW bytes starting at a blob holds
 * every following blob that fits in it; a larger blob is read in WINDOW
 * pieces. A reader thread then reads the pieces in order into a ring of
 * RING buffers (large sequential preads, the kernel told the access is
 * sequential) while the calling thread hashes the pieces already read; when
 * the hasher catches up it reads the next free piece itself instead of
 * waiting. So with a second CPU the rate is that of reading alone (or
 * better: both threads read), not of reading and hashing in turn; on a busy
 * machine the low-priority reader yields and the hasher does it all. 
 *
 * Progress: progress(ctx, 0, total) when hashing starts, so that callers can
 * time the hashing alone; progress(ctx, hashed, hashed) at the end, the bytes
 * actually hashed (fewer than total when a blob could not be read).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <xxhash.h>

#include "integrity.h"

#define WINDOW (256u << 10)          /* one read: sequential, and small enough to hash from L2 */
#define RING 16                      /* buffers: the reader runs up to RING - 1 pieces ahead */
#define PROGRESS_STEP (64u << 20)    /* report progress every this many bytes */

/* One read of the plan. */
typedef struct piece {
    uint32_t file;
    uint64_t off;
    size_t len;
} piece;

/* Where a wanted blob's bytes are: pieces [first, first + count); a blob of
 * one piece starts at skip in it. */
typedef struct place {
    size_t first, count, skip;
} place;

typedef struct plan {
    piece *p;
    size_t n, cap;
} plan;

typedef struct ring {
    dcp_checkpoint *ck;
    const plan *pl;
    unsigned char *buf[RING];
    size_t ready[RING];          /* piece + 1 read into each buffer (0: none) */
    int status[RING];            /* errno of that read (0: read whole) */
    unsigned char busy[RING];    /* a read into the buffer is under way: it is not claimed again */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    size_t claimed;              /* pieces taken for reading so far, in order */
    size_t released;             /* pieces before this one are no longer needed */
    /* each reader's open file (0: the reader thread, 1: the hasher) */
    int fd[2];
    uint32_t fd_file[2];
} ring;

static int add_piece(plan *pl, uint32_t file, uint64_t off, size_t len)
{
    if (pl->n == pl->cap) {
        size_t cap = pl->cap ? 2 * pl->cap : 256;
        piece *g = realloc(pl->p, cap * sizeof *g);
        if (!g)
            return -1;
        pl->p = g;
        pl->cap = cap;
    }
    pl->p[pl->n++] = (piece){file, off, len};
    return 0;
}

/* Plan the reads of every wanted blob (refs sorted by file and offset). A
 * blob that cannot be read (missing file, past its end) gets rerr now. */
static int make_plan(dcp_checkpoint *ck, dcpi_blobref *r, size_t n, plan *pl, place *at)
{
    for (size_t lo = 0, hi; lo < n; lo = hi) {
        for (hi = lo; hi < n && r[hi].file == r[lo].file; hi++)
            ;
        struct stat sb;
        int e = fstatat(ck->dirfd, ck->files[r[lo].file], &sb, 0) < 0 ? errno : !S_ISREG(sb.st_mode) ? EISDIR : 0;
        uint64_t size = e ? 0 : (uint64_t)sb.st_size, ws = 0, we = 0;
        int have = 0;
        for (size_t i = lo; i < hi; i++) {
            dcpi_blobref *b = &r[i];
            if (!b->want)
                continue;
            if (e) {
                b->rerr = e;
            } else if (b->offset > size || b->length > size - b->offset) {
                b->rerr = DCPI_PAST_END;
            } else if (b->length <= WINDOW) {
                if (!have || b->offset < ws || b->offset + b->length > we) {
                    size_t len = size - b->offset < WINDOW ? (size_t)(size - b->offset) : WINDOW;
                    if (add_piece(pl, b->file, b->offset, len) < 0)
                        return -1;
                    ws = b->offset;
                    we = b->offset + len;
                    have = 1;
                }
                at[i] = (place){pl->n - 1, 1, (size_t)(b->offset - ws)};
            } else {
                at[i] = (place){pl->n, 0, 0};
                for (uint64_t off = 0; off < b->length; off += WINDOW) {
                    size_t len = b->length - off < WINDOW ? (size_t)(b->length - off) : WINDOW;
                    if (add_piece(pl, b->file, b->offset + off, len) < 0)
                        return -1;
                    at[i].count++;
                }
                have = 0;   /* the next small blob starts a window of its own */
            }
        }
    }
    return 0;
}

static int pread_all(int fd, unsigned char *buf, size_t len, uint64_t off)
{
    while (len) {
        ssize_t r = pread(fd, buf, len, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return r < 0 ? errno : DCPI_PAST_END;   /* the file shrank since the plan */
        buf += r;
        len -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

/* Read piece i into its buffer, as reader `who`. */
static int read_piece(ring *g, int who, size_t i, unsigned char *buf)
{
    const piece *p = &g->pl->p[i];
    if (g->fd[who] < 0 || g->fd_file[who] != p->file) {
        if (g->fd[who] >= 0)
            close(g->fd[who]);
        g->fd[who] = openat(g->ck->dirfd, g->ck->files[p->file], O_RDONLY | O_CLOEXEC);
        g->fd_file[who] = p->file;
        if (g->fd[who] < 0)
            return errno;
        posix_fadvise(g->fd[who], 0, 0, POSIX_FADV_SEQUENTIAL);
    }
    return pread_all(g->fd[who], buf, p->len, p->off);
}

/* Under g->lock: claim the next piece and read it, if a buffer is free. A
 * buffer is not free while a read into it is under way, even when its piece
 * was released meanwhile (the pieces of a blob that failed are skipped while
 * the other thread may still be reading one of them). */
static int read_next(ring *g, int who)
{
    size_t i = g->claimed;
    if (i >= g->pl->n || i - g->released >= RING || g->busy[i % RING])
        return 0;
    g->claimed++;
    g->busy[i % RING] = 1;
    pthread_mutex_unlock(&g->lock);
    int st = read_piece(g, who, i, g->buf[i % RING]);
    pthread_mutex_lock(&g->lock);
    g->status[i % RING] = st;
    g->ready[i % RING] = i + 1;
    g->busy[i % RING] = 0;
    pthread_cond_broadcast(&g->cond);
    return 1;
}

/* The reader thread: read ahead while buffers are free. It runs at the
 * lowest priority: on an idle CPU it reads in parallel with the hasher, and
 * on a busy machine it yields, so that the hasher reads its pieces itself
 * and hashes them while they are in its cache (two threads trading pieces
 * on a saturated CPU cost more than one doing it all). */
static void *reader(void *arg)
{
    ring *g = arg;
    setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19);   /* this thread only (Linux) */
    pthread_mutex_lock(&g->lock);
    while (g->claimed < g->pl->n)
        if (!read_next(g, 0))
            pthread_cond_wait(&g->cond, &g->lock);
    pthread_mutex_unlock(&g->lock);
    return NULL;
}

/* The hasher: piece i, read. Rather than wait for the reader thread, it
 * reads the next pieces itself while a buffer is free, so it never idles
 * while there is reading to do (and runs alone without a reader thread). */
static const unsigned char *take_piece(ring *g, size_t i, int *status)
{
    pthread_mutex_lock(&g->lock);
    while (g->ready[i % RING] != i + 1)
        if (!read_next(g, 1))
            pthread_cond_wait(&g->cond, &g->lock);   /* the reader thread is reading piece i */
    *status = g->status[i % RING];
    pthread_mutex_unlock(&g->lock);
    return g->buf[i % RING];
}

/* Pieces before upto are no longer needed: their buffers may be refilled
 * (pieces never claimed, those of a blob that failed, are skipped). */
static void release_until(ring *g, size_t upto)
{
    pthread_mutex_lock(&g->lock);
    if (upto > g->released) {
        g->released = upto;
        if (g->claimed < upto)
            g->claimed = upto;
        pthread_cond_broadcast(&g->cond);
    }
    pthread_mutex_unlock(&g->lock);
}

struct progress {
    dcp_progress_fn fn;
    void *ctx;
    uint64_t done, total, last;
};

static void advance(struct progress *p, uint64_t n)
{
    p->done += n;
    if (p->fn && (p->done - p->last >= PROGRESS_STEP || p->done == p->total)) {
        p->last = p->done;
        p->fn(p->ctx, p->done, p->total);
    }
}

int dcpi_hash_blobs(dcp_checkpoint *ck, dcpi_blobref *r, size_t n, dcp_progress_fn progress, void *pctx,
                    dcp_error *err)
{
    struct progress pg = {progress, pctx, 0, 0, 0};
    uint64_t hashed = 0;
    for (size_t i = 0; i < n; i++)
        pg.total += r[i].want ? r[i].length : 0;
    plan pl = {0};
    place *at = calloc(n ? n : 1, sizeof *at);
    ring g = {.ck = ck, .pl = &pl, .fd = {-1, -1}};
    XXH3_state_t *st = XXH3_createState();
    int rc = at && st ? 0 : -1;
    for (int b = 0; rc == 0 && b < RING; b++)
        if (!(g.buf[b] = malloc(WINDOW)))
            rc = -1;
    if (rc == 0)
        rc = make_plan(ck, r, n, &pl, at);
    if (rc < 0) {
        for (int b = 0; b < RING; b++)
            free(g.buf[b]);
        free(at);
        free(pl.p);
        XXH3_freeState(st);
        return dcpi_err(err, ENOMEM, "%s: out of memory", ck->path);
    }
    pthread_mutex_init(&g.lock, NULL);
    pthread_cond_init(&g.cond, NULL);
    if (progress && pg.total)
        progress(pctx, 0, pg.total);
    pthread_t th;
    int threaded = pl.n > 1 && pthread_create(&th, NULL, reader, &g) == 0;   /* else the hasher reads alone */
    size_t held = SIZE_MAX;   /* the piece taken for the previous small blob */
    const unsigned char *hbuf = NULL;
    int hstatus = 0;
    for (size_t i = 0; i < n; i++) {
        dcpi_blobref *b = &r[i];
        if (!b->want)
            continue;
        if (b->rerr) {   /* found by the plan: nothing to read */
            advance(&pg, b->length);
            continue;
        }
        const place *a = &at[i];
        int status = 0;
        if (a->count == 1) {
            if (held != a->first) {   /* small blobs share their window: one take per window */
                release_until(&g, a->first);
                hbuf = take_piece(&g, a->first, &hstatus);
                held = a->first;
            }
            if (!(b->rerr = hstatus))
                b->xxh3 = XXH3_64bits(hbuf + a->skip, (size_t)b->length);
        } else {
            held = SIZE_MAX;
            release_until(&g, a->first);
            XXH3_64bits_reset(st);
            for (size_t k = 0; k < a->count && !b->rerr; k++) {
                const unsigned char *buf = take_piece(&g, a->first + k, &status);
                if (!(b->rerr = status))
                    XXH3_64bits_update(st, buf, pl.p[a->first + k].len);
                release_until(&g, a->first + k + 1);
            }
            if (!b->rerr)
                b->xxh3 = XXH3_64bits_digest(st);
        }
        if (!b->rerr)
            hashed += b->length;
        advance(&pg, b->length);
    }
    release_until(&g, pl.n);   /* the reader thread may be waiting for a buffer: it ends */
    if (threaded)
        pthread_join(th, NULL);
    /* the end: the bytes hashed, fewer than planned when a blob could not be read */
    if (progress && pg.total && (pg.last != pg.done || hashed != pg.total))
        progress(pctx, hashed, hashed);
    for (int who = 0; who < 2; who++)
        if (g.fd[who] >= 0)
            close(g.fd[who]);
    pthread_cond_destroy(&g.cond);
    pthread_mutex_destroy(&g.lock);
    for (int b = 0; b < RING; b++)
        free(g.buf[b]);
    free(at);
    free(pl.p);
    XXH3_freeState(st);
    return 0;
}
