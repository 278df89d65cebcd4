/* dcpfs: telling the kernel to let go of the entries of a checkpoint saved
 * again, so that its model is freed when nothing uses it any more.
 *
 * The kernel keeps a dentry it no longer uses (and its inode, and so its
 * lookup count: dcpfs.h, Lifetime) while it is hashed and not timed out,
 * and a checkpoint's entries never time out. A checkpoint saved again drops
 * out of the dcache with its name (a LOOKUP gives another inode) only where
 * nothing below it is in use: the dentries of a file open then, and of its
 * folders, stay hashed after the file is closed, until memory runs short.
 * So dcpfs invalidates them (FUSE_NOTIFY_INVAL_ENTRY): when a checkpoint is
 * retired, the names of its folders, innermost first, then its name in its
 * folder (its root's in single-checkpoint mode; a partial folder's node,
 * retired when it leaves .partial: its name there), unless a lookup of that
 * name retired it (the reply replaces the entry); when a file or directory
 * handle of a retired one is released, the path from it up to its
 * checkpoint's root. An invalidated dentry is unhashed even while in use
 * (a process's working directory), and freed at its last use, its inode
 * with it (FORGET); so is an entry looked up in a retired checkpoint's
 * folder afterwards (from such a working directory), once given.
 *
 * The kernel takes the parent directory's inode lock to invalidate, which a
 * LOOKUP or READDIR in that directory holds while it waits for dcpfs: so the
 * notifications are never written from a request, nor with a dcpfs lock
 * held, but by this thread, from a queue that requests only add to. At the
 * end of the session (a signal, an unmount) a notification may be blocked on
 * such a request: dfs_loop reads no request once the session ended (it
 * takes the signals only while waiting), and dfs_notify_stop answers the
 * ones that come until the notification is written; then the fd can be
 * closed (a write in flight would keep the connection from being aborted).
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dcpfs.h"

/* Queued notifications; more are dropped (the kernel then frees those
 * entries under memory pressure, as without notifications). */
#define NOTIFY_QUEUE_MAX 65536   /* a retired checkpoint's folders (notes of some 64 bytes) */
/* dfs_notify_stop reads requests into this (libfuse's own buffer: 256 pages
 * and a header page; the kernel refuses a buffer smaller than a request). */
#define DRAIN_BUF ((size_t)(2u << 20))

struct note {
    struct note *next;
    fuse_ino_t parent;
    size_t len;
    char name[];
};

struct dfs_notifier {
    struct fuse_session *se;
    pthread_t tid;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct note *head, *tail;
    size_t queued;
    int stop;     /* the session ends: nothing more is written */
    int done;     /* the thread has returned */
    int full;     /* the queue overflowed (said once) */
};

static void *notifier(void *arg)
{
    struct dfs_notifier *q = arg;
    pthread_mutex_lock(&q->lock);
    for (;;) {
        while (!q->head && !q->stop)
            pthread_cond_wait(&q->cond, &q->lock);
        if (q->stop)
            break;
        struct note *n = q->head;
        q->head = n->next;
        if (!q->head)
            q->tail = NULL;
        q->queued--;
        pthread_mutex_unlock(&q->lock);
        /* No lock held: the kernel may wait here for a request in n->parent. */
        int rc = fuse_lowlevel_notify_inval_entry(q->se, n->parent, n->name, n->len);
        if (rc < 0 && rc != -ENOENT)   /* ENOENT: the kernel has no such entry (any more) */
            dfs_log(LOG_DEBUG, "invalidating entry %s of inode %#llx: %s", n->name, (unsigned long long)n->parent,
                    strerror(-rc));
        free(n);
        pthread_mutex_lock(&q->lock);
        if (rc == -ENOSYS || rc == -ENODEV || rc == -ENOTCONN || rc == -EBADF)
            q->stop = 1;   /* no kernel support, or no connection: nothing more to tell */
    }
    q->done = 1;
    pthread_cond_broadcast(&q->cond);
    pthread_mutex_unlock(&q->lock);
    return NULL;
}

int dfs_notify_start(struct dfs *fs, struct fuse_session *se)
{
    struct dfs_notifier *q = calloc(1, sizeof *q);
    if (!q)
        return -ENOMEM;
    q->se = se;
    pthread_mutex_init(&q->lock, NULL);
    pthread_cond_init(&q->cond, NULL);
    int rc = pthread_create(&q->tid, NULL, notifier, q);
    if (rc != 0) {
        pthread_cond_destroy(&q->cond);
        pthread_mutex_destroy(&q->lock);
        free(q);
        return -rc;
    }
    fs->notifier = q;
    return 0;
}

/* The lookup this thread is answering. Its reply gives the kernel the new
 * save's entry for that name, and the kernel, revalidating, drops the old
 * one itself: invalidating the name then would hit the new entry, and leave
 * what is in use below it (a file being opened) cached, unreachable by any
 * later notification, until memory runs short. */
static _Thread_local struct {
    fuse_ino_t parent;
    const char *name;
} answering;

void dfs_notify_lookup(fuse_ino_t parent, const char *name)
{
    answering.parent = parent;
    answering.name = name;
}

/* Queue parent/name; never blocks on the kernel. */
static void queue_note(struct dfs *fs, fuse_ino_t parent, const char *name)
{
    struct dfs_notifier *q = fs->notifier;
    if (!q || !parent)
        return;
    size_t len = strlen(name);
    struct note *n = malloc(sizeof *n + len + 1);
    if (!n)
        return;   /* only the kernel's memory pressure frees it then */
    n->next = NULL;
    n->parent = parent;
    n->len = len;
    memcpy(n->name, name, len + 1);
    pthread_mutex_lock(&q->lock);
    if (q->stop || q->queued >= NOTIFY_QUEUE_MAX) {
        if (!q->stop && !q->full) {
            q->full = 1;
            dfs_log(LOG_WARNING, "more than %d entries to invalidate at once: the kernel keeps the others "
                                 "until memory runs short",
                    NOTIFY_QUEUE_MAX);
        }
        pthread_mutex_unlock(&q->lock);
        free(n);
        return;
    }
    if (q->tail)
        q->tail->next = n;
    else
        q->head = n;
    q->tail = n;
    q->queued++;
    pthread_cond_signal(&q->cond);
    pthread_mutex_unlock(&q->lock);
}

/* The same, unless this thread answers a lookup of that name. */
static void queue_entry(struct dfs *fs, fuse_ino_t parent, const char *name)
{
    if (answering.name && answering.parent == parent && !strcmp(answering.name, name))
        return;
    queue_note(fs, parent, name);
}

void dfs_notify_retired(struct dfs *fs, struct dfs_ckpt *ck)
{
    struct dfs_node *root = ck->root;
    if (!fs->notifier || !root)
        return;
    /* Its folders first, innermost first (ck->nodes is newest first, and a
     * node is made after its parent): one that is in use (a working
     * directory, or above one) is unhashed and freed at its last use, which
     * no release tells dcpfs of; unused ones go with their folder's name. */
    pthread_rwlock_rdlock(&fs->lock);   /* inode numbers are given under it */
    pthread_mutex_lock(&fs->alloc_lock);
    for (const struct dfs_node *m = ck->nodes; m; m = m->all_next)
        if (m->type == DFS_N_DIR && m != root && m->ino && m->parent->ino && (root->parent || m->parent != root))
            queue_entry(fs, m->parent->ino, m->name);
    pthread_mutex_unlock(&fs->alloc_lock);
    pthread_rwlock_unlock(&fs->lock);
    if (root->parent) {   /* its name in its scan folder (now maybe the new save's: looked up again) */
        queue_entry(fs, root->parent->ino, root->name);
        return;
    }
    /* SOURCE saved again: the old root's names under the mount's root */
    pthread_rwlock_rdlock(&fs->lock);
    for (size_t i = 0; i < root->nkids; i++)
        queue_entry(fs, FUSE_ROOT_ID, root->kids[i]->name);
    pthread_rwlock_unlock(&fs->lock);
}

/* Entries a working directory in a retired checkpoint looks up would be
 * cached for the life of the mount (a zero timeout does not make the kernel
 * drop them), each keeping its folder's dentry, and so the checkpoint: each
 * is invalidated once given (positive or negative). The kernel holds dir's
 * lock from before the lookup until the entry is in place, and the notifier
 * takes it: so the notification finds the entry. */
void dfs_notify_looked_up(struct dfs *fs, const struct dfs_node *dir, const char *name)
{
    if (fs->notifier && dir->ck && atomic_load(&dir->ck->retired))
        queue_note(fs, dir->ino, name);
}

void dfs_notify_released(struct dfs *fs, const struct dfs_node *n)
{
    if (!fs->notifier || !n->ck || !atomic_load(&n->ck->retired))
        return;
    /* Innermost first; the root's own name was invalidated when it was
     * retired (a folder checkpoint's), or is the mount's root. Names under
     * a single checkpoint's old root are the mount root's: those the new
     * save has too were looked up again, or invalidated at retirement. */
    for (const struct dfs_node *m = n; m != n->ck->root && m->parent; m = m->parent)
        if (m->parent->parent || m->parent->type != DFS_N_CKPT)
            queue_entry(fs, m->parent->ino, m->name);
}

/* Answer one request if there is one (the notifier may wait for it), or
 * wait a little for the notifier; 1 when one was answered. */
static int drain_one(struct dfs_notifier *q, int fd, void *buf)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r = fd >= 0 && buf ? poll(&p, 1, 50) : -1;
    if (r == 0)
        return 0;   /* 50 ms without a request */
    if (r == 1 && (p.revents & POLLIN)) {
        ssize_t got = read(fd, buf, DRAIN_BUF);
        if (got > 0) {
            struct fuse_buf fb = {.size = (size_t)got, .mem = buf};
            fuse_session_process_buf(q->se, &fb);
            return 1;
        }
    }
    /* No request after all, or the connection is gone (the write ends soon) */
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_nsec += 50 * 1000000L;
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&q->lock);
    if (!q->done)
        pthread_cond_timedwait(&q->cond, &q->lock, &t);
    pthread_mutex_unlock(&q->lock);
    return 0;
}

void dfs_notify_stop(struct dfs *fs)
{
    struct dfs_notifier *q = fs->notifier;
    if (!q)
        return;
    pthread_mutex_lock(&q->lock);
    q->stop = 1;
    pthread_cond_broadcast(&q->cond);
    int done = q->done;
    pthread_mutex_unlock(&q->lock);
    if (!done) {
        /* A notification in flight: answer what the kernel asks meanwhile
         * (not through libfuse's receive, which drops a request read once
         * the session has exited); dfs_loop made the fd non-blocking. */
        int fd = fuse_session_fd(q->se);
        void *buf = malloc(DRAIN_BUF);
        unsigned long answered = 0;
        struct timespec t0, now;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        int said = 0;
        for (;;) {
            pthread_mutex_lock(&q->lock);
            done = q->done;
            pthread_mutex_unlock(&q->lock);
            if (done)
                break;
            answered += (unsigned long)drain_one(q, fd, buf);
            clock_gettime(CLOCK_MONOTONIC, &now);
            if (!said && now.tv_sec - t0.tv_sec >= 10) {
                /* Not expected (dfs_loop reads no request after the session ended): say what it waits for */
                said = 1;
                dfs_log(LOG_WARNING, "the session ended while the kernel was told of a checkpoint saved again, "
                                     "and a request it waits for has not come here for 10 s: dcpfs exits once "
                                     "it does (or `umount -f` aborts the mount)");
            }
        }
        free(buf);
        if (answered)
            dfs_log(LOG_INFO, "the session ended while the kernel was told of a checkpoint saved again: "
                              "%lu requests answered until it took the notification", answered);
    }
    pthread_join(q->tid, NULL);
    for (struct note *n = q->head, *next; n; n = next) {
        next = n->next;
        free(n);
    }
    pthread_cond_destroy(&q->cond);
    pthread_mutex_destroy(&q->lock);
    free(q);
    fs->notifier = NULL;
}
