/* Running the global plan on one rank.
 *
 * An I/O thread reads this rank's units in order: straight into the
 * destination when this rank needs the whole unit contiguously in one host
 * buffer, otherwise into a staging buffer of the read pool. A unit nobody
 * else needs is placed by the I/O thread itself. The main thread alone calls
 * MPI: it walks the units this rank takes part in, in the global order, and
 * posts the sends and broadcasts of units it read and the receives of units
 * it needs (straight into the destination when possible, otherwise into the
 * receive pool), completing the oldest transfers when it runs out of
 * buffers. Every rank posts in the same global order and only ever waits for
 * its oldest transfer, which depends on earlier transfers only: no deadlock.
 *
 * With DCP_LOAD_SHM the read pool is one MPI shared-memory window per node:
 * a reader sends each node peer needing a unit a token naming the staging
 * slot, the peer copies its fragments straight out of the slot into its
 * destination and answers with an empty message on a tag of that slot; the
 * slot is reused once every answer is in. One read, one copy per rank, no
 * packing or message payload.
 *
 * With device IPC (ipc.c: every destination CUDA memory) the same hand-off
 * runs in device memory: the reader copies the unit from its pinned host
 * slot into the device slot of the same index (one host-to-device copy per
 * unit, posted before the unit's MPI sends to other nodes and waited for
 * after them), sends the tokens, and places its own fragments device to
 * device from that slot; a peer copies its fragments device to device out
 * of the reader's slot, mapped by IPC, waits for its copies and answers.
 *
 * A failed read or copy is recorded and the protocol goes on (with whatever
 * bytes the buffer holds), so no peer waits forever; the caller agrees on
 * the error afterwards.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "load.h"

enum { ROLE_READ = 1, ROLE_RECV = 2, ROLE_SHM = 3 };
enum { TAG_DATA = 0, TAG_READY = 1, TAG_DONE = 2 };   /* TAG_DONE + slot */

struct pend {
    size_t unit;
    int role;
    int slot;                  /* staging slot, -1 when direct */
    unsigned char *buf;
    const dcp_gfrag *frags;    /* receiver: this rank's fragments */
    size_t nfrags;
    int token;                 /* shm: the reader's staging slot, sent as a token */
    int reader;
    MPI_Request *reqs;         /* this ring slot's block of the request pool */
    size_t nreq;
    int done;
};

struct exec {
    MPI_Comm comm;
    const MPI_Comm *groups;    /* per broadcast group of the plan */
    dcp_checkpoint *ck;
    const dcp_greqs *r;
    const dcp_gplan *g;
    ldi_dest *dest;
    dcp_load_stats *st;
    int me;
    unsigned wr, wv;           /* buffers in the read pool and in the receive pool */
    size_t rsize, vsize;       /* their sizes */
    unsigned char **bufs;      /* wr + wv: read pool then receive pool */
    unsigned char *busy;       /* per buffer */
    MPI_Win win;               /* the node's read pools, when the plan has shm deliveries */
    int have_win;
    unsigned char *pool;       /* this rank's part of it: the read pool */
    unsigned char **peer_pool; /* per node rank: the read pool of that rank, mapped here */
    const int *node_rank;
    const ldi_ipc *ipc;        /* device IPC: shm deliveries go device to device */

    /* this rank's reads, in order; shared with the I/O thread under lock */
    size_t *reads;
    size_t nreads;
    struct ready {
        unsigned char *buf;
        int slot;
        int state;             /* 0 not read, 1 ready for the main thread, 2 finished by the I/O thread */
    } *ready;
    size_t io_next;            /* next read for the I/O threads */
    int direct;                /* reads bypass the page cache (DCP_LOAD_DIRECT) */
    int map;                   /* cached units for CUDA destinations mapped (DCP_LOAD_MAP, mapped.c) */
    ldi_map *maps;             /* per read slot: the mapping its unit came from, until released */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int threaded;
    int io_failed;
    dcp_error io_err;
    double io_seconds, io_place_seconds;
    uint64_t io_bytes, io_reads, io_local;
    double deliver_seconds, place_seconds;   /* the main thread's */

    /* main thread: transfers in flight, a ring in posting order */
    struct pend *pend;
    size_t head, npend, pcap;  /* pcap: the most in flight */
    MPI_Request *reqpool;      /* pcap blocks of maxreq requests, allocated up front */
    MPI_Status *stat;          /* maxreq statuses, never read (MPICH's MPI_Testall declares it
                                  written, so MPI_STATUSES_IGNORE fails -Werror=stringop-overflow) */
    size_t maxreq;
    int *span_len;             /* room for the most spans of a delivery this rank sends */
    MPI_Aint *span_disp;
    int failed;
    dcp_error *err;
};

/* ------------------------------------------------------------ helpers */

static const dcp_gfrag *my_frags(const struct exec *x, const dcp_gunit *u, size_t *n)
{
    return dcp_gunit_frags(x->g, u, x->me, n);
}

/* Do these fragments fill [0, total) of the rank's buffer for the unit and
 * land contiguously in one host destination, untransformed? Then the unit's
 * bytes can go straight there; *dest is where byte 0 goes. */
static int direct_target(const struct exec *x, const dcp_gfrag *f, size_t n, uint64_t total,
                         unsigned char **dest)
{
    if (!n)
        return 0;
    uint32_t req = x->g->gops[f[0].gop].req;
    const dcp_greq *q = &x->r->v[req];
    if (q->mem != DCP_LOAD_HOST || f[0].img != 0)
        return 0;
    uint64_t img = 0, pos = dcp_gfrag_dest(x->g, &f[0]), start = pos;
    for (size_t i = 0; i < n; i++) {
        const dcp_op *op = &x->g->gops[f[i].gop].op;
        if (x->g->gops[f[i].gop].req != req || op->flags & (DCP_OP_BSWAP | DCP_OP_CONJ | DCP_OP_NEG) ||
            (op->dest_stride != op->elem_size && f[i].len != op->elem_size) || f[i].img != img ||
            dcp_gfrag_dest(x->g, &f[i]) != pos)
            return 0;
        img += f[i].len;
        pos += f[i].len;
    }
    if (img != total)
        return 0;
    *dest = (unsigned char *)q->dest + start;
    return 1;
}

/* Node peers copy this unit out of the reader's staging slot. */
static int has_shm(const struct exec *x, const dcp_gunit *u)
{
    for (size_t i = 0; i < u->ndlv; i++)
        if (x->g->dlvs[u->dlv0 + i].kind == DCP_GDLV_SHM)
            return 1;
    return 0;
}

/* Where this rank reads unit u: straight into its destination (1, *dest
 * set), or into a staging slot (0). */
static int read_direct(const struct exec *x, const dcp_gunit *u, unsigned char **dest)
{
    size_t n;
    const dcp_gfrag *f = my_frags(x, u, &n);
    if (has_shm(x, u) || !direct_target(x, f, n, u->len, dest))
        return 0;
    /* with O_DIRECT, only a destination that agrees with the file modulo
     * the block size takes the whole blocks straight in
     * (dcp_gunit_read_direct_at); others are read into staging */
    return !x->direct || ((uintptr_t)*dest - dcp_gunit_op(x->g, u).src_offset) % DCP_DIRECT_ALIGN == 0;
}

static int all_host(const struct exec *x, const dcp_gfrag *f, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (x->r->v[x->g->gops[f[i].gop].req].mem != DCP_LOAD_HOST)
            return 0;
    return 1;
}

/* A unit this rank reads that nobody else needs, all host: the I/O thread
 * finishes it alone. */
static int io_only(const struct exec *x, const dcp_gunit *u)
{
    size_t n;
    const dcp_gfrag *f = my_frags(x, u, &n);
    return u->ndlv == 0 && n == u->nfrag && all_host(x, f, n);
}

static void fail(struct exec *x, const dcp_error *e)
{
    if (!x->failed && x->err) {
        *x->err = *e;
        x->failed = 1;
    }
}

/* May unit u come from a mapping of the page cache (DCP_LOAD_MAP)? Only
 * when nothing but the device reads it: this rank's fragments CUDA memory,
 * copied as stored, and node peers served from device staging. The CPU
 * touching a mapped page of a shard truncated meanwhile would take SIGBUS;
 * the device copies from pages the registration pinned. */
static int mappable(const struct exec *x, const dcp_gunit *u)
{
    if (!x->map)
        return 0;
    for (size_t i = 0; i < u->ndlv; i++)
        if (x->g->dlvs[u->dlv0 + i].kind != DCP_GDLV_SHM || !x->ipc)
            return 0;
    size_t n;
    const dcp_gfrag *f = my_frags(x, u, &n);
    for (size_t i = 0; i < n; i++) {
        const dcp_gop *go = &x->g->gops[f[i].gop];
        if (x->r->v[go->req].mem != DCP_LOAD_CUDA || go->op.flags & (DCP_OP_BSWAP | DCP_OP_CONJ | DCP_OP_NEG))
            return 0;
    }
    return n > 0 || u->ndlv > 0;
}

/* ------------------------------------------------------------ the I/O side */

static int free_slot(struct exec *x, unsigned from, unsigned to)
{
    for (unsigned i = from; i < to; i++)
        if (!x->busy[i])
            return (int)i;
    return -1;
}

/* Test hook: DCPLOAD_TEST_READ_DELAY_MS=N sleeps N ms before each unit
 * read, so that a test can strike mid-load (tests/load-faults.sh). */
static void test_read_delay(void)
{
    const char *s = getenv("DCPLOAD_TEST_READ_DELAY_MS");
    int ms = s && atoi(s) > 0 ? atoi(s) : 0;
    if (ms > 0)
        nanosleep(&(struct timespec){ms / 1000, (long)(ms % 1000) * 1000000L}, NULL);
}

/* Read unit k of this rank's reads into buf: the cached bytes first, the
 * next unit advised when some are missing (dcp_gunit_read); or with direct
 * the rest with O_DIRECT, straight into its destination (not staged: buf
 * agrees with the file, read_direct) or into a staging slot, the unit's
 * first byte at *at (its offset within a block). */
static int fetch_unit(struct exec *x, size_t k, unsigned char *buf, int staged, unsigned char **at, dcp_error *e)
{
    test_read_delay();
    const dcp_gunit *u = &x->g->units[x->reads[k]];
    const dcp_gunit *next = k + 1 < x->nreads ? &x->g->units[x->reads[k + 1]] : NULL;
    *at = buf;
    if (!x->direct)
        return dcp_gunit_read(x->ck, x->g, u, next, buf, e);
    if (!staged)
        return dcp_gunit_read_direct_at(x->ck, x->g, u, buf, e);
    size_t lead = 0;
    int rc = dcp_gunit_read_direct(x->ck, x->g, u, buf, x->rsize, &lead, e);
    *at = buf + lead;
    return rc;
}

/* Read unit k of this rank's reads into its target. Called with the lock
 * held when a read slot is needed and free; drops the lock while reading. */
static void io_unit(struct exec *x, size_t k)
{
    const dcp_gunit *u = &x->g->units[x->reads[k]];
    size_t n;
    const dcp_gfrag *f = my_frags(x, u, &n);
    unsigned char *buf;
    int slot = -1;
    if (!read_direct(x, u, &buf)) {
        slot = free_slot(x, 0, x->wr);   /* the caller made sure there is one */
        if (slot < 0) {   /* unreachable; keep the protocol going, flag the rank */
            ldi_err(&x->io_err, EIO, "dcp_load: no free staging buffer");
            x->io_failed = 1;
            slot = 0;
        }
        x->busy[slot] = 1;
        buf = x->bufs[slot];
    }
    int failed = x->io_failed;
    if (x->threaded)
        pthread_mutex_unlock(&x->lock);

    double t0 = ldi_now();
    dcp_error e = {0};
    int rc = 0;
    const unsigned char *mapped;
    if (failed) {
        /* after a failure keep the protocol going, skip the reads */
    } else if (slot >= 0 && mappable(x, u) &&
               ldi_map_unit(x->ck, x->g, u, ldi_dest_ops(x->dest), &x->maps[slot], &mapped)) {
        buf = (unsigned char *)mapped;   /* only the device reads it (mappable) */
    } else {
        rc = fetch_unit(x, k, buf, slot >= 0, &buf, &e);
    }
    double t1 = ldi_now();
    int finished = 0;
    if (rc == 0 && !failed && io_only(x, u)) {
        if (slot >= 0)
            rc = ldi_dest_place(x->dest, x->g, x->r, f, n, buf, 0, -1, &e);
        finished = 1;
    } else if (io_only(x, u)) {
        finished = 1;
    }
    double t2 = ldi_now();

    if (x->threaded)
        pthread_mutex_lock(&x->lock);
    x->io_seconds += t1 - t0;
    x->io_place_seconds += t2 - t1;
    if (!failed) {
        x->io_bytes += u->len;
        x->io_reads++;
    }
    if (finished)
        for (size_t i = 0; i < n; i++)
            x->io_local += f[i].len;
    if (rc < 0 && !x->io_failed) {
        x->io_failed = 1;
        x->io_err = e;
    }
    if (finished) {
        if (slot >= 0)
            x->busy[slot] = 0;
        x->ready[k].state = 2;
    } else {
        x->ready[k].buf = buf;
        x->ready[k].slot = slot;
        x->ready[k].state = 1;
    }
    if (x->threaded)
        pthread_cond_broadcast(&x->cond);
}

/* Does unit k need a staging slot? */
static int needs_slot(struct exec *x, size_t k)
{
    unsigned char *buf;
    return !read_direct(x, &x->g->units[x->reads[k]], &buf);
}

/* How many I/O threads read units at once: dcp_read_threads(), each unit
 * whole on its thread (files.c splits a read only into the threads left of
 * that budget). Measured on 2 GiB evicted into fresh memory on the 2-CPU VM:
 * 8 unit readers 1.5-1.8 s; 2 readers each splitting its unit into 8 pieces
 * (the default before) 1.9-3.0 s, with half as much CPU again (pieces of one
 * huge page written by two threads contend for its first fault), and one
 * unit's read waits for its slowest piece. DCPLOAD_IO_THREADS overrides. */
#define IO_THREADS_MAX 64
static unsigned io_threads(size_t nreads)
{
    unsigned n = dcp_read_threads(0);
    const char *s = getenv("DCPLOAD_IO_THREADS");
    if (s && atoi(s) > 0)
        n = (unsigned)atoi(s);
    if (n > IO_THREADS_MAX)
        n = IO_THREADS_MAX;
    if (n > nreads)
        n = nreads ? (unsigned)nreads : 1;
    return n;
}

static void *io_thread(void *arg)
{
    struct exec *x = arg;
    pthread_mutex_lock(&x->lock);
    while (x->io_next < x->nreads) {
        size_t k = x->io_next;
        if (needs_slot(x, k) && free_slot(x, 0, x->wr) < 0) {
            pthread_cond_wait(&x->cond, &x->lock);
            continue;
        }
        x->io_next++;
        io_unit(x, k);
    }
    pthread_mutex_unlock(&x->lock);
    return NULL;
}

/* Fresh destination pages are faulted in (zeroed, and on a VM often backed
 * by the host first) by whatever writes them first: with O_DIRECT the
 * reading thread, before its request reaches the device. Under direct this
 * thread faults in, ahead of the readers, the destinations of the units
 * read straight into them (MADV_POPULATE_WRITE: pages already there are
 * left as they are), so that the zeroing runs beside the reads on a CPU the
 * readers leave idle. Units a reader has begun are skipped. Measured on
 * 2 GiB evicted into fresh memory (2-CPU VM, interleaved runs, whole
 * dcpload processes): 0.87-1.05x eight parallel cats with it, 0.80-0.93x
 * without. Buffered reads fault theirs in while copying out of the page
 * cache, with no gain measured from it. */
static void *fault_thread(void *arg)
{
#ifdef MADV_POPULATE_WRITE
    struct exec *x = arg;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    for (size_t k = 0; k < x->nreads; k++) {
        pthread_mutex_lock(&x->lock);
        int skip = k < x->io_next, stop = x->io_failed;
        pthread_mutex_unlock(&x->lock);
        unsigned char *d;
        const dcp_gunit *u = &x->g->units[x->reads[k]];
        if (stop)
            break;
        if (skip || !read_direct(x, u, &d))
            continue;
        uintptr_t a = ((uintptr_t)d + page - 1) & ~(page - 1), b = ((uintptr_t)d + u->len) & ~(page - 1);
        if (b > a && madvise((void *)a, b - a, MADV_POPULATE_WRITE) != 0 && errno == EINVAL)
            break;   /* a kernel before 5.14 */
    }
#else
    (void)arg;
#endif
    return NULL;
}

/* ------------------------------------------------------------ the MPI side */

/* A staging slot is free again. CUDA copies out of a read slot are waited
 * for here (the I/O thread reuses it without asking); those out of a
 * receive slot only when as_receiver takes the slot again, so they overlap
 * the following transfers. */
static void release(struct exec *x, int slot)
{
    if (slot < 0)
        return;
    if ((unsigned)slot < x->wr) {
        dcp_error e;
        double t0 = ldi_now();
        if (ldi_dest_fence(x->dest, slot, &e) < 0)
            fail(x, &e);
        if (x->maps)   /* the copies out of it are done */
            ldi_map_release(ldi_dest_ops(x->dest), &x->maps[slot]);
        x->place_seconds += ldi_now() - t0;
        if (x->have_win)
            MPI_Win_sync(x->win);   /* the peers' copies out of it before the next read into it */
    }
    if (x->threaded)
        pthread_mutex_lock(&x->lock);
    x->busy[slot] = 0;
    if (x->threaded) {
        pthread_cond_broadcast(&x->cond);
        pthread_mutex_unlock(&x->lock);
    }
}

/* After the transfers of pending entry p are done. */
static void finish(struct exec *x, struct pend *p)
{
    dcp_error e;
    double t0 = ldi_now();
    if (p->role == ROLE_RECV && p->slot >= 0) {
        if (ldi_dest_place(x->dest, x->g, x->r, p->frags, p->nfrags, p->buf, 0, p->slot, &e) < 0)
            fail(x, &e);
    } else if (p->role == ROLE_SHM && x->ipc) {
        /* the token names the reader's device slot, mapped here by IPC:
         * copy out device to device, wait for the copies, then answer */
        int t = p->token;
        const unsigned char *pool = x->ipc->peer[x->node_rank[p->reader]];
        if (t < 0 || (unsigned)t >= x->ipc->nslots || !pool) {
            ldi_err(&e, EIO, "dcp_load: bad device staging token %d from rank %d", t, p->reader);
            fail(x, &e);
            t = t < 0 || (unsigned)t >= x->ipc->nslots ? 0 : t;
        } else if (ldi_dest_place(x->dest, x->g, x->r, p->frags, p->nfrags, pool + (size_t)t * x->ipc->slot_bytes,
                                  1, -1, &e) < 0) {
            fail(x, &e);
        }
        x->place_seconds += ldi_now() - t0;
        t0 = ldi_now();
        MPI_Send(NULL, 0, MPI_BYTE, p->reader, TAG_DONE + t, x->comm);
        x->deliver_seconds += ldi_now() - t0;
        return;
    } else if (p->role == ROLE_SHM) {
        /* the token names the reader's slot; copy out, then tell it the
         * slot is free (its receive is posted: the empty send completes) */
        /* every rank's read pool in the window has wr = nstaging slots of
         * rsize = staging bytes (options are the same on every rank) */
        int t = p->token;
        if (t < 0 || (unsigned)t >= x->wr || !x->peer_pool) {
            ldi_err(&e, EIO, "dcp_load: bad staging token %d from rank %d", t, p->reader);
            fail(x, &e);
            t = t < 0 || (unsigned)t >= x->wr ? 0 : t;
        } else {
            MPI_Win_sync(x->win);   /* the reader's bytes (synced before its token) are visible */
            const unsigned char *src = x->peer_pool[x->node_rank[p->reader]] + (size_t)t * x->rsize;
            if (ldi_dest_place(x->dest, x->g, x->r, p->frags, p->nfrags, src, 0, -1, &e) < 0)
                fail(x, &e);
            MPI_Win_sync(x->win);   /* our reads done before the answer lets the reader reuse the slot */
        }
        x->place_seconds += ldi_now() - t0;
        t0 = ldi_now();
        MPI_Send(NULL, 0, MPI_BYTE, p->reader, TAG_DONE + t, x->comm);
        x->deliver_seconds += ldi_now() - t0;
        return;
    }
    x->place_seconds += ldi_now() - t0;
    release(x, p->slot);
}

static void wait_oldest(struct exec *x)
{
    struct pend *p = &x->pend[x->head];
    if (!p->done) {
        double t0 = ldi_now();
        ldi_wait((int)p->nreq, p->reqs, MPI_STATUSES_IGNORE);
        x->deliver_seconds += ldi_now() - t0;
        finish(x, p);
    }
    x->head = (x->head + 1) % x->pcap;
    x->npend--;
}

/* Complete whatever has arrived, without blocking. */
static void progress(struct exec *x)
{
    for (size_t i = 0; i < x->npend; i++) {
        struct pend *p = &x->pend[(x->head + i) % x->pcap];
        int done = 0;
        if (p->done)
            continue;
        double t0 = ldi_now();
        MPI_Testall((int)p->nreq, p->reqs, &done, x->stat);
        x->deliver_seconds += ldi_now() - t0;
        if (done) {
            finish(x, p);
            p->done = 1;
        }
    }
    while (x->npend && x->pend[x->head].done)
        wait_oldest(x);
}

/* A new transfer entry; its request block holds maxreq requests. */
static struct pend *push(struct exec *x)
{
    while (x->npend >= x->pcap)
        wait_oldest(x);
    size_t slot = (x->head + x->npend++) % x->pcap;
    struct pend *p = &x->pend[slot];
    memset(p, 0, sizeof *p);
    p->reqs = x->reqpool + slot * x->maxreq;
    return p;
}

static int group_root(const dcp_gplan *g, const dcp_ggroup *gr, int rank)
{
    const int *r = g->group_ranks + gr->rank0;
    for (size_t i = 0; i < gr->n; i++)
        if (r[i] == rank)
            return (int)i;
    return -1;
}

/* Without an I/O thread: read this rank's units up to k here, in order. */
static void inline_io(struct exec *x, size_t k)
{
    while (x->io_next <= k && x->io_next < x->nreads) {
        size_t j = x->io_next;
        if (needs_slot(x, j) && free_slot(x, 0, x->wr) < 0 && x->npend) {
            wait_oldest(x);   /* read slots are held by pending sends only */
            continue;
        }
        x->io_next++;
        io_unit(x, j);
    }
}

/* Post delivery d of the unit in pending entry p. */
static void post_delivery(struct exec *x, struct pend *p, const dcp_gdlv *d)
{
    const dcp_gspan *s = x->g->spans + d->cov0;
    if (d->kind == DCP_GDLV_SHM) {
        /* the answer's receive first, then the token */
        MPI_Irecv(NULL, 0, MPI_BYTE, d->peer, TAG_DONE + p->slot, x->comm, &p->reqs[p->nreq++]);
        MPI_Isend(&p->token, 1, MPI_INT, d->peer, TAG_READY, x->comm, &p->reqs[p->nreq++]);
        x->st->bytes_sent += d->bytes;
        return;
    }
    if (d->kind == DCP_GDLV_P2P) {
        ldi_isend_spans(p->buf, s, d->ncov, d->peer, x->comm, x->span_len, x->span_disp, &p->reqs[p->nreq++]);
        x->st->bytes_sent += d->bytes;
    } else {
        const dcp_ggroup *gr = &x->g->groups[d->group];
        ldi_ibcast_spans(p->buf, s, d->ncov, group_root(x->g, gr, x->me), x->groups[d->group], x->span_len,
                         x->span_disp, &p->reqs[p->nreq++]);
        x->st->bytes_sent += d->bytes * (gr->n - 1);
        x->st->broadcasts++;
    }
    x->st->messages++;
}

/* Unit ui, read by this rank as reads[k]: send it on. */
static int as_reader(struct exec *x, size_t ui, size_t k)
{
    const dcp_gunit *u = &x->g->units[ui];
    /* wait for the I/O side */
    for (;;) {
        if (x->threaded)
            pthread_mutex_lock(&x->lock);
        int state = x->ready[k].state;
        if (x->threaded)
            pthread_mutex_unlock(&x->lock);
        if (state)
            break;
        if (!x->threaded) {
            inline_io(x, k);
            continue;
        }
        if (x->npend) {
            wait_oldest(x);   /* frees buffers the I/O thread may wait for */
            continue;
        }
        pthread_mutex_lock(&x->lock);
        while (!x->ready[k].state)
            pthread_cond_wait(&x->cond, &x->lock);
        pthread_mutex_unlock(&x->lock);
    }
    struct ready *rd = &x->ready[k];
    struct pend *p = push(x);
    p->unit = ui;
    p->role = ROLE_READ;
    p->slot = rd->slot;
    p->buf = rd->buf;
    p->token = rd->slot;
    const dcp_gdlv *dl = x->g->dlvs + u->dlv0;
    double t0 = ldi_now();
    /* device IPC: the unit to its device slot (a shm unit always has a read
     * slot, and a rank reading one always has a pool) */
    const unsigned char *dev = NULL;
    if (has_shm(x, u) && x->ipc) {
        dcp_error e;
        if (!x->ipc->pool || p->slot < 0) {
            ldi_err(&e, EIO, "dcp_load: no device staging for unit %zu", ui);
            fail(x, &e);
        } else {
            dev = x->ipc->pool + (size_t)p->slot * x->ipc->slot_bytes;
            if (ldi_dest_stage(x->dest, (void *)dev, p->buf, (size_t)u->len, p->slot, &e) < 0)
                fail(x, &e);
            x->st->bytes_staged += u->len;
        }
    }
    if (has_shm(x, u) && x->have_win)
        MPI_Win_sync(x->win);   /* the slot's bytes (read by the I/O thread) before the tokens */
    if (dev) {
        /* messages to other nodes from the host slot while the copy runs;
         * the tokens once the device slot holds the unit */
        for (size_t i = 0; i < u->ndlv; i++)
            if (dl[i].kind != DCP_GDLV_SHM)
                post_delivery(x, p, &dl[i]);
        dcp_error e;
        double tf = ldi_now();
        if (ldi_dest_fence(x->dest, p->slot, &e) < 0)
            fail(x, &e);
        x->place_seconds += ldi_now() - tf;
        for (size_t i = 0; i < u->ndlv; i++)
            if (dl[i].kind == DCP_GDLV_SHM)
                post_delivery(x, p, &dl[i]);
    } else {
        for (size_t i = 0; i < u->ndlv; i++)
            post_delivery(x, p, &dl[i]);
    }
    x->deliver_seconds += ldi_now() - t0;
    /* this rank's own share, unless it was read in place: from the device
     * slot when the unit is there */
    size_t n;
    const dcp_gfrag *f = my_frags(x, u, &n);
    if (n) {
        for (size_t i = 0; i < n; i++)
            x->st->bytes_local += f[i].len;
        if (p->slot >= 0) {
            dcp_error e;
            t0 = ldi_now();
            if (ldi_dest_place(x->dest, x->g, x->r, f, n, dev ? dev : p->buf, dev != NULL, p->slot, &e) < 0)
                fail(x, &e);
            x->place_seconds += ldi_now() - t0;
        }
    }
    return 0;
}

/* The delivery of unit u that reaches this rank, or NULL. */
static const dcp_gdlv *my_delivery(const struct exec *x, const dcp_gunit *u)
{
    for (size_t i = 0; i < u->ndlv; i++) {
        const dcp_gdlv *c = &x->g->dlvs[u->dlv0 + i];
        if (c->kind != DCP_GDLV_BCAST ? c->peer == x->me
                                 : group_root(x->g, &x->g->groups[c->group], x->me) >= 0)
            return c;
    }
    return NULL;
}

/* Does this rank receive unit u into a staging slot (not straight into its
 * destination, nor out of a node peer's slot)? *bytes: the image size. */
static int recv_staged(const struct exec *x, const dcp_gunit *u, uint64_t *bytes)
{
    size_t n;
    const dcp_gfrag *f = my_frags(x, u, &n);
    const dcp_gdlv *d = u->reader != x->me && n ? my_delivery(x, u) : NULL;
    unsigned char *buf;
    if (!d || d->kind == DCP_GDLV_SHM || direct_target(x, f, n, d->bytes, &buf))
        return 0;
    *bytes = d->bytes;
    return 1;
}

/* Unit ui, needed by this rank from another reader. */
static int as_receiver(struct exec *x, size_t ui)
{
    const dcp_gunit *u = &x->g->units[ui];
    const dcp_gdlv *d = my_delivery(x, u);
    if (!d)
        return 0;   /* cannot happen: every receiving rank has a delivery */
    size_t n;
    const dcp_gfrag *f = my_frags(x, u, &n);
    if (d->kind == DCP_GDLV_SHM) {   /* a token now, a copy out of the reader's slot when it arrives */
        struct pend *p = push(x);
        p->unit = ui;
        p->role = ROLE_SHM;
        p->slot = -1;
        p->frags = f;
        p->nfrags = n;
        p->reader = u->reader;
        p->token = -1;
        double t0 = ldi_now();
        MPI_Irecv(&p->token, 1, MPI_INT, u->reader, TAG_READY, x->comm, &p->reqs[p->nreq++]);
        x->deliver_seconds += ldi_now() - t0;
        x->st->bytes_received += d->bytes;
        if (x->ipc)
            x->st->bytes_ipc += d->bytes;
        else
            x->st->bytes_shm += d->bytes;
        return 0;
    }
    unsigned char *buf;
    int slot = -1;
    if (!direct_target(x, f, n, d->bytes, &buf)) {
        /* receive slots are held by pending receives only: waiting frees one */
        while ((slot = free_slot(x, x->wr, x->wr + x->wv)) < 0 && x->npend)
            wait_oldest(x);
        dcp_error e;
        double t0 = ldi_now();
        if (ldi_dest_fence(x->dest, slot, &e) < 0)   /* its last CUDA copies (see release) */
            fail(x, &e);
        x->place_seconds += ldi_now() - t0;
        x->busy[slot] = 1;
        buf = x->bufs[slot];
    }
    struct pend *p = push(x);
    p->unit = ui;
    p->role = ROLE_RECV;
    p->slot = slot;
    p->buf = buf;
    p->frags = f;
    p->nfrags = n;
    double t0 = ldi_now();
    if (d->kind == DCP_GDLV_P2P) {
        MPI_Irecv(buf, (int)d->bytes, MPI_BYTE, u->reader, 0, x->comm, &p->reqs[p->nreq++]);
    } else {
        const dcp_ggroup *gr = &x->g->groups[d->group];
        MPI_Ibcast(buf, (int)d->bytes, MPI_BYTE, group_root(x->g, gr, u->reader), x->groups[d->group],
                   &p->reqs[p->nreq++]);
    }
    x->deliver_seconds += ldi_now() - t0;
    x->st->bytes_received += d->bytes;
    return 0;
}

/* ------------------------------------------------------------ entry */

/* The read pool as this rank's part of a shared window on the node, and
 * where every node peer's part is mapped here. The window stays in a
 * passive-target epoch (lock_all) for the call: MPI_Win_sync orders the
 * reader's bytes before its token and a peer's copies before its answer. */
static int shared_pool(struct exec *x, MPI_Comm node, dcp_error *err)
{
    int nlocal = 1;
    MPI_Comm_size(node, &nlocal);
    MPI_Info info;
    MPI_Info_create(&info);
    MPI_Info_set(info, "alloc_shared_noncontig", "true");   /* each part near its rank */
    unsigned char *base = NULL;
    MPI_Win_allocate_shared((MPI_Aint)x->wr * (MPI_Aint)x->rsize, 1, info, node, &base, &x->win);
    MPI_Info_free(&info);
    MPI_Win_lock_all(MPI_MODE_NOCHECK, x->win);
    x->have_win = 1;
    x->pool = base;
    x->peer_pool = calloc((size_t)nlocal, sizeof *x->peer_pool);
    if (!x->peer_pool || !x->bufs)
        return ldi_err(err, ENOMEM, "dcp_load: out of memory");
    for (int i = 0; i < nlocal; i++) {
        MPI_Aint size;
        int disp;
        void *p = NULL;
        MPI_Win_shared_query(x->win, i, &size, &disp, &p);
        x->peer_pool[i] = p;
    }
    for (unsigned i = 0; i < x->wr; i++)
        x->bufs[i] = base + (size_t)i * x->rsize;
    if (x->dest)
        ldi_staging_register(x->dest, base, (size_t)x->wr * x->rsize);
    return 0;
}

int ldi_execute(MPI_Comm comm, dcp_checkpoint *ck, const dcp_greqs *reqs, const dcp_gplan *g,
                const ldi_exec_opts *o, dcp_load_stats *st, dcp_error *err)
{
    struct exec x;
    memset(&x, 0, sizeof x);
    x.comm = comm;
    x.groups = o->groups;
    x.ck = ck;
    x.r = reqs;
    x.g = g;
    x.st = st;
    x.me = g->me;
    x.err = err;
    int rc = 0, provided = MPI_THREAD_SINGLE, started = 0;
    MPI_Query_thread(&provided);
    /* not with a host shared-memory window: node peers copy from a slot's start */
    x.direct = o->direct && !(g->has_shm && !o->ipc);
    x.map = o->map && !(g->has_shm && !o->ipc);

    int need_cuda = 0;
    for (size_t i = reqs->first[x.me]; i < reqs->first[x.me + 1]; i++)
        need_cuda |= reqs->v[i].mem == DCP_LOAD_CUDA;
    /* this rank's reads, in global order (units are sorted by it) */
    for (size_t i = 0; i < g->nunits; i++)
        x.nreads += g->units[i].reader == x.me;
    /* staging buffers by need: no more than this rank's staged reads and
     * receives, no larger than the largest of them. Shared read pools are
     * nstaging buffers of the staging size on every rank, as peers address
     * them by slot. */
    size_t staged_reads = 0, staged_recvs = 0;
    uint64_t rmax = 0, vmax = 0, bytes;
    unsigned char *direct;
    for (size_t i = 0; i < g->nunits; i++) {
        const dcp_gunit *u = &g->units[i];
        if (u->reader == x.me && !read_direct(&x, u, &direct)) {
            staged_reads++;
            rmax = u->len > rmax ? u->len : rmax;
        } else if (recv_staged(&x, u, &bytes)) {
            staged_recvs++;
            vmax = bytes > vmax ? bytes : vmax;
        }
    }
    x.wr = staged_reads < o->nstaging ? (unsigned)staged_reads : o->nstaging;
    x.wv = staged_recvs < o->nstaging ? (unsigned)staged_recvs : o->nstaging;
    x.rsize = rmax < o->staging_bytes ? (size_t)rmax : o->staging_bytes;
    x.vsize = vmax < o->staging_bytes ? (size_t)vmax : o->staging_bytes;
    if (g->has_shm) {
        x.wr = o->nstaging;
        x.rsize = o->staging_bytes;
    }
    if (x.direct)   /* whole blocks around a unit: its start's offset within one, and the tail's */
        x.rsize = (x.rsize + DCP_DIRECT_ALIGN - 1) / DCP_DIRECT_ALIGN * DCP_DIRECT_ALIGN + 2 * DCP_DIRECT_ALIGN;
    x.reads = malloc((x.nreads ? x.nreads : 1) * sizeof *x.reads);
    x.ready = calloc(x.nreads ? x.nreads : 1, sizeof *x.ready);
    x.bufs = calloc((size_t)x.wr + x.wv + 1, sizeof *x.bufs);
    x.busy = calloc((size_t)x.wr + x.wv + 1, 1);
    if (x.map)
        x.maps = calloc((size_t)x.wr + 1, sizeof *x.maps);
    /* transfers in flight, at most, and the requests one unit may need */
    x.pcap = 4 * (size_t)o->nstaging + 8;
    /* one request per delivery (a receiver has one), two for a shm hand-off */
    x.maxreq = 1;
    size_t maxspans = 1;
    for (size_t i = 0; i < g->nunits; i++) {
        const dcp_gunit *u = &g->units[i];
        size_t nr = 0;
        for (size_t k = 0; k < u->ndlv; k++) {
            const dcp_gdlv *d = &g->dlvs[u->dlv0 + k];
            nr += d->kind == DCP_GDLV_SHM ? 2 : 1;
            if (u->reader == x.me && d->ncov > maxspans)
                maxspans = d->ncov;
        }
        if (u->reader == x.me && nr > x.maxreq)
            x.maxreq = nr;
    }
    x.span_len = malloc(maxspans * sizeof *x.span_len);
    x.span_disp = malloc(maxspans * sizeof *x.span_disp);
    x.pend = calloc(x.pcap, sizeof *x.pend);
    x.reqpool = calloc(x.pcap * x.maxreq, sizeof *x.reqpool);
    x.stat = calloc(x.maxreq, sizeof *x.stat);
    if (!x.reads || !x.ready || !x.bufs || !x.busy || (x.map && !x.maps) || !x.pend || !x.reqpool || !x.stat ||
        !x.span_len || !x.span_disp) {
        ldi_err(err, ENOMEM, "dcp_load: out of memory");
        x.failed = 1;
    }
    if (!x.failed && ldi_dest_open(need_cuda, o->device, (int)(x.wr + x.wv), &x.dest, err) < 0)
        x.failed = 1;
    /* the read pool in node shared memory: collective on the node, so every
     * rank allocates, also one that already failed */
    x.node_rank = o->node_rank;
    x.ipc = o->ipc;
    if (g->has_shm && !x.ipc && shared_pool(&x, o->node, err) < 0)
        x.failed = 1;
    for (unsigned i = x.have_win ? x.wr : 0; i < x.wr + x.wv && !x.failed; i++) {
        size_t size = i < x.wr ? x.rsize : x.vsize;
        if (!(x.bufs[i] = ldi_staging_alloc(x.dest, size ? size : 1))) {
            ldi_err(err, ENOMEM, "dcp_load: cannot allocate %u staging buffers of %zu bytes", x.wr + x.wv, size);
            x.failed = 1;
        }
    }
    /* zero regions with parts no chunk covers, before any placement */
    for (size_t i = reqs->first[x.me]; i < reqs->first[x.me + 1] && !x.failed; i++)
        if (g->zero[i] && ldi_dest_zero(x.dest, &reqs->v[i], err) < 0)
            x.failed = 1;
    /* resources are agreed before the first transfer: a rank that cannot run
     * must not leave the others waiting */
    if ((rc = ldi_agree(comm, x.failed ? -1 : 0, err)) < 0)
        goto out;   /* agreed: the caller's agreement keeps this message */
    size_t k = 0;
    for (size_t i = 0; i < g->nunits; i++)
        if (g->units[i].reader == x.me)
            x.reads[k++] = i;

    x.threaded = provided >= MPI_THREAD_FUNNELED;
    pthread_t th[IO_THREADS_MAX + 1];
    if (x.threaded) {
        pthread_mutex_init(&x.lock, NULL);
        pthread_cond_init(&x.cond, NULL);
        unsigned want = io_threads(x.nreads);
        while ((unsigned)started < want && pthread_create(&th[started], NULL, io_thread, &x) == 0)
            started++;
        if (!started)
            x.threaded = 0;
        else if (x.direct && pthread_create(&th[started], NULL, fault_thread, &x) == 0)
            started++;   /* O_DIRECT readers fault their destinations in before each request */
    }

    /* walk the units in the global order */
    k = 0;
    for (size_t i = 0; i < g->nunits; i++) {
        const dcp_gunit *u = &g->units[i];
        if (u->reader == x.me) {
            size_t mine = k++;
            if (!io_only(&x, u))
                as_reader(&x, i, mine);
            else if (!x.threaded)
                inline_io(&x, mine);
        } else {
            size_t n;
            my_frags(&x, u, &n);
            if (n)
                as_receiver(&x, i);
        }
        progress(&x);
    }
    while (x.npend)
        wait_oldest(&x);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    dcp_error e;
    if (ldi_dest_finish(x.dest, &e) < 0)
        fail(&x, &e);
    if (x.io_failed)
        fail(&x, &x.io_err);
    st->bytes_read += x.io_bytes;
    st->reads += x.io_reads;
    st->bytes_local += x.io_local;
    st->seconds_read += x.io_seconds;
    st->seconds_place += x.place_seconds + x.io_place_seconds;
    st->seconds_deliver += x.deliver_seconds;
    rc = x.failed ? -1 : 0;
    if (x.threaded) {
        pthread_mutex_destroy(&x.lock);
        pthread_cond_destroy(&x.cond);
    }
out:
    if (x.maps) {   /* every copy is done (ldi_dest_finish) or none was queued (agreed failure) */
        for (unsigned i = 0; i < x.wr; i++)
            ldi_map_release(ldi_dest_ops(x.dest), &x.maps[i]);
        free(x.maps);
    }
    if (x.bufs)
        for (unsigned i = x.have_win ? x.wr : 0; i < x.wr + x.wv; i++)
            ldi_staging_free(x.dest, x.bufs[i]);
    if (x.have_win) {
        if (x.dest)
            ldi_staging_unregister(x.dest, x.pool);
        MPI_Win_unlock_all(x.win);
        MPI_Win_free(&x.win);
    }
    free(x.peer_pool);
    ldi_dest_close(x.dest);
    free(x.bufs);
    free(x.busy);
    free(x.reads);
    free(x.ready);
    free(x.pend);
    free(x.reqpool);
    free(x.stat);
    free(x.span_len);
    free(x.span_disp);
    return rc;
}
