/* dcpfs: the request loop.
 *
 * libfuse's multi-threaded loop keeps every idle thread blocked in read() on
 * /dev/fuse, and the kernel hands each request to the thread that has waited
 * longest: a sequential walk (ls -R, find) has every request answered by a
 * different, cold thread, each a wake-up on some other CPU. Walking a
 * 1M-chunk checkpoint that way took twice the wall time and four times the
 * daemon's CPU of a single thread.
 *
 * So one thread receives every request and answers the ones about names and
 * attributes itself (lookups, listings, getattr, xattrs: in memory or one
 * catalog query, done in microseconds), and hands the rest to a pool of
 * worker threads made as they are needed (up to max_threads): reads, which
 * wait for storage and are what many readers do at once, and any request on
 * a folder that may have to be scanned or a checkpoint not opened yet (the
 * first open parses .metadata: seconds), so those never hold up the others.
 * With -s (no workers) it answers every request itself.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dcpfs.h"

/* The head of every request (the kernel's struct fuse_in_header, which
 * libfuse does not install): 40 bytes, the request's arguments follow. */
struct in_header {
    uint32_t len;
    uint32_t opcode;
    uint64_t unique;
    uint64_t nodeid;
    uint32_t uid, gid, pid;
    uint16_t total_extlen, padding;
};
_Static_assert(sizeof(struct in_header) == 40, "struct fuse_in_header is 40 bytes");
#define GETXATTR_IN 8   /* struct fuse_getxattr_in (size, padding) before the name */

enum {
    OP_LOOKUP = 1,
    OP_FORGET = 2,
    OP_GETATTR = 3,
    OP_OPEN = 14,
    OP_STATFS = 17,
    OP_RELEASE = 18,
    OP_GETXATTR = 22,
    OP_LISTXATTR = 23,
    OP_OPENDIR = 27,
    OP_READDIR = 28,
    OP_RELEASEDIR = 29,
    OP_INTERRUPT = 36,
    OP_BATCH_FORGET = 42,
    OP_READDIRPLUS = 44,
};

struct job {
    struct fuse_buf buf;
    struct job *next;
};

struct pool {
    struct fuse_session *se;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct job *head, *tail;  /* requests waiting for a worker */
    struct job *free;         /* jobs (and their buffers) to use again */
    size_t nfree;
    unsigned nthreads, idle, max;
    int stop;
    pthread_t *tids;
};

#define POOL_KEEP 8   /* request buffers kept for reuse (libfuse's are ~1 MiB each) */

static void *worker(void *arg)
{
    struct pool *p = arg;
    pthread_mutex_lock(&p->lock);
    for (;;) {
        while (!p->head && !p->stop) {
            p->idle++;
            pthread_cond_wait(&p->cond, &p->lock);
            p->idle--;
        }
        struct job *j = p->head;
        if (!j)
            break;   /* stopping, and nothing left to answer */
        p->head = j->next;
        if (!p->head)
            p->tail = NULL;
        pthread_mutex_unlock(&p->lock);
        fuse_session_process_buf(p->se, &j->buf);
        pthread_mutex_lock(&p->lock);
        if (p->nfree < POOL_KEEP) {
            j->next = p->free;
            p->free = j;
            p->nfree++;
        } else {
            free(j->buf.mem);
            free(j);
        }
    }
    pthread_mutex_unlock(&p->lock);
    dfs_read_fini();
    return NULL;
}

/* Queue the request in *buf for a worker (a new thread when none is idle
 * and there may be more); *buf gets an unused buffer back. -1 when neither
 * a job nor a thread can be had (the caller answers it itself). */
static int hand_off(struct pool *p, struct fuse_buf *buf)
{
    pthread_mutex_lock(&p->lock);
    struct job *j = p->free;
    if (j) {
        p->free = j->next;
        p->nfree--;
    } else if (!(j = calloc(1, sizeof *j))) {
        pthread_mutex_unlock(&p->lock);
        return -1;
    }
    if (p->idle == 0 && p->nthreads < p->max &&
        pthread_create(&p->tids[p->nthreads], NULL, worker, p) == 0)
        p->nthreads++;
    if (p->nthreads == 0) {   /* no thread to answer it */
        j->next = p->free;
        p->free = j;
        p->nfree++;
        pthread_mutex_unlock(&p->lock);
        return -1;
    }
    struct fuse_buf spare = j->buf;   /* a reused job's buffer becomes the receiver's */
    j->buf = *buf;
    *buf = spare;
    buf->size = 0;
    buf->flags = 0;
    j->next = NULL;
    if (p->tail)
        p->tail->next = j;
    else
        p->head = j;
    p->tail = j;
    pthread_cond_signal(&p->cond);
    pthread_mutex_unlock(&p->lock);
    return 0;
}

/* Is the request's NUL-terminated name argument, `skip` bytes past the
 * header, `name`? */
static int names(const struct fuse_buf *buf, size_t skip, const char *name)
{
    size_t at = sizeof(struct in_header) + skip, n = strlen(name) + 1;
    return buf->size >= at + n && memcmp((const char *)buf->mem + at, name, n) == 0;
}

/* May the receiving thread answer this request itself? Only names and
 * attributes of what is already in memory (or one catalog query away):
 * not the digest attribute (it reads the whole value: seconds for a large
 * tensor, during which no other request of the mount would be received),
 * nor a lookup of all.safetensors (its first one lays the file out), nor
 * anything about .partial (it rescans its folder). */
static int answer_here(struct dfs *fs, const struct fuse_buf *buf)
{
    if ((buf->flags & FUSE_BUF_IS_FD) || buf->size < sizeof(struct in_header))
        return 0;
    const struct in_header *in = buf->mem;
    if ((in->opcode == OP_GETXATTR && names(buf, GETXATTR_IN, DFS_DIGEST_XATTR)) ||
        (in->opcode == OP_LOOKUP && names(buf, 0, DFS_STVIEW_NAME)))
        return 0;
    switch (in->opcode) {
    case OP_FORGET:
    case OP_BATCH_FORGET:
    case OP_INTERRUPT:
    case OP_STATFS:
    case OP_RELEASEDIR:
        return 1;
    case OP_LOOKUP:
    case OP_GETATTR:
    case OP_OPEN:
    case OP_RELEASE:
    case OP_GETXATTR:
    case OP_LISTXATTR:
    case OP_OPENDIR:
    case OP_READDIR:
    case OP_READDIRPLUS:
        break;
    default:
        return 0;   /* reads, and anything rare */
    }
    /* The node is looked at under fs->lock: an old save's may be freed. */
    pthread_rwlock_rdlock(&fs->lock);
    const struct dfs_node *n = dfs_map_get(fs, in->nodeid);
    int here = 1;   /* no node: answered with ENOENT */
    switch (n ? n->type : DFS_N_ENTRY) {
    case DFS_N_SCANDIR:
    case DFS_N_PARTDIR:
        here = 0;   /* may rescan a folder */
        break;
    case DFS_N_CKPT:
        /* else: opened (parsed) first; a single checkpoint's root may be saved again */
        here = n->parent && atomic_load(&n->ck->state) == 1;
        break;
    case DFS_N_PASSTHRU:
        here = in->opcode != OP_OPEN && in->opcode != OP_RELEASE;   /* open(2), close(2) of a real file */
        break;
    case DFS_N_VIRTUAL:
        here = 0;   /* its first stat lays it out */
        break;
    default:
        break;
    }
    pthread_rwlock_unlock(&fs->lock);
    return here;
}

/* The signals that end the session (libfuse's handlers end it). */
static void ending_signals(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGHUP);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGTERM);
}

int dfs_loop(struct dfs *fs, struct fuse_session *se, unsigned max_threads)
{
    struct pool p = {.se = se, .max = max_threads};
    p.tids = calloc(p.max ? p.max : 1, sizeof *p.tids);
    if (!p.tids)
        return -ENOMEM;
    /* The signals that end the session are taken only while this thread
     * waits for a request (ppoll), never while it reads one: libfuse drops
     * a request read after the session exited, and nothing would answer it
     * (a notification waiting for it would never be written). Threads made
     * from here on (workers, the notifier, libdcp's) inherit them blocked. */
    sigset_t ending, waiting;
    ending_signals(&ending);
    pthread_sigmask(SIG_BLOCK, &ending, &waiting);
    sigset_t restore = waiting;
    sigdelset(&waiting, SIGHUP);
    sigdelset(&waiting, SIGINT);
    sigdelset(&waiting, SIGTERM);
    /* Non-blocking: a request poll saw may be withdrawn (its caller killed)
     * before it is read, and a blocked read would not see the signals. */
    int fd = fuse_session_fd(se);
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
        fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    if (dfs_notify_start(fs, se) < 0)
        dfs_log(LOG_WARNING, "no thread to tell the kernel of checkpoints saved again: their entries are kept "
                             "until memory runs short");
    pthread_mutex_init(&p.lock, NULL);
    pthread_cond_init(&p.cond, NULL);
    struct fuse_buf buf = {.mem = NULL};
    int res = 0;
    while (!fuse_session_exited(se)) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (ppoll(&pfd, 1, NULL, &waiting) < 0) {
            if (errno == EINTR)
                continue;   /* a signal: the loop condition says whether it ended the session */
            res = -errno;
            break;
        }
        if (fuse_session_exited(se))
            break;   /* the request stays for dfs_notify_stop or the kernel's abort */
        res = fuse_session_receive_buf(se, &buf);
        if (res == -EINTR || res == -EAGAIN)
            continue;
        /* The kernel tears the connection down at unmount; a read that was
         * being handed a request at that moment gets ECONNABORTED, not ENODEV.
         * Either way the mount is gone and the session ended cleanly. */
        if (res == -ECONNABORTED || res == -ENODEV) {
            res = 0;
            break;
        }
        if (res <= 0)
            break;
        if (!p.max || answer_here(fs, &buf) || hand_off(&p, &buf) < 0)
            fuse_session_process_buf(se, &buf);
    }
    free(buf.mem);
    pthread_mutex_lock(&p.lock);
    p.stop = 1;
    pthread_cond_broadcast(&p.cond);
    pthread_mutex_unlock(&p.lock);
    for (unsigned i = 0; i < p.nthreads; i++)
        pthread_join(p.tids[i], NULL);
    for (struct job *j = p.free, *next; j; j = next) {
        next = j->next;
        free(j->buf.mem);
        free(j);
    }
    free(p.tids);
    pthread_cond_destroy(&p.cond);
    pthread_mutex_destroy(&p.lock);
    dfs_notify_stop(fs);   /* answers requests until a notification in flight is taken */
    if (fl >= 0)
        fcntl(fd, F_SETFL, fl);
    pthread_sigmask(SIG_SETMASK, &restore, NULL);
    fuse_session_reset(se);
    return res < 0 && res != -EINTR ? res : 0;
}
