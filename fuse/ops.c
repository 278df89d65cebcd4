/* dcpfs: the FUSE low-level operations.
 *
 * Everything inside a checkpoint is immutable, so entries, attributes and
 * negative lookups there are cached by the kernel for the life of the mount,
 * directory listings are cached (cache_readdir) and file data is kept
 * (keep_cache). Scan folders (folder mode) change as training writes new
 * checkpoints: they get one-second timeouts and are rescanned on lookup,
 * getattr and a listing from offset 0; where the kernel opens directories
 * itself (no opendir) it caches their listings too, and lists one again when
 * its attributes (at most a second old) show that its mtime moved, which
 * dfs_stat makes it do whenever the scan's listing changed. In
 * single-checkpoint mode the root's names are kept a second too, as a
 * checkpoint's in a scan folder, so a save of SOURCE is seen (a new root).
 *
 * Every request holds a reference to the checkpoint of its node while it runs
 * (get_node, put_node); an entry given to the kernel, an open file and a
 * directory handle hold one until FORGET, release and releasedir (dcpfs.h,
 * Lifetime).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "dcp_integrity.h"
#include "dcpfs.h"
#include "names.h"

#define FS(req) ((struct dfs *)fuse_req_userdata(req))

struct dfs_dh {
    struct dfs_dh *prev, *next;  /* fs->open_dirs */
    struct dfs_node *node;
    struct dfs_node **kids;     /* snapshot at opendir: offsets stay stable */
    size_t nkids;
    size_t base;                /* kids[0] is child number base (0 but without opendir) */
};

/* The node of ino, with a reference to its checkpoint (put_node drops it);
 * NULL when there is none. */
static struct dfs_node *get_node(struct dfs *fs, fuse_ino_t ino)
{
    if (ino == FUSE_ROOT_ID && !fs->folder_mode)
        dfs_single_recheck(fs);   /* out of memory: the old root, checked again next time */
    pthread_rwlock_rdlock(&fs->lock);
    struct dfs_node *n = dfs_map_get(fs, ino);
    if (n && !dfs_ckpt_get(n->ck))
        n = NULL;   /* being freed: the kernel forgot it */
    pthread_rwlock_unlock(&fs->lock);
    return n;
}

static void put_node(struct dfs *fs, struct dfs_node *n)
{
    if (n)
        dfs_ckpt_unref(fs, n->ck, 1);
}

/* Drop count references to the checkpoint of ino, which they keep alive
 * (forget, release: released, an open file's, after which the kernel is
 * told to drop its entries of a retired checkpoint's node). */
static void unref_ino(struct dfs *fs, fuse_ino_t ino, uint64_t count, int released)
{
    pthread_rwlock_rdlock(&fs->lock);
    struct dfs_node *n = dfs_map_get(fs, ino);
    struct dfs_ckpt *ck = n ? n->ck : NULL;
    pthread_rwlock_unlock(&fs->lock);
    if (n && released)
        dfs_notify_released(fs, n);   /* the reference dropped below keeps n */
    dfs_ckpt_unref(fs, ck, (long)count);
}

/* References to the checkpoints of dir's children kids[0..n) other than dir's
 * own (a scan folder's checkpoints), taken (caller holds fs->lock, or them)
 * or dropped. */
static void ref_kids(struct dfs *fs, const struct dfs_node *dir, struct dfs_node *const *kids, size_t n, int take)
{
    for (size_t i = 0; i < n; i++)
        if (kids[i]->ck != dir->ck) {
            if (take)
                dfs_ckpt_ref(kids[i]->ck, 1);
            else
                dfs_ckpt_unref(fs, kids[i]->ck, 1);
        }
}

/* Bring a directory's children up to date: rescan a scan folder, open a
 * checkpoint; list a key-tree directory when it is to be listed. */
static int prepare_dir(struct dfs *fs, struct dfs_node *n, int listing)
{
    if (n->type == DFS_N_SCANDIR) {
        /* A listing checks every checkpoint's .metadata (one stat each): it
         * gives each name's inode (readdirplus), and a name listed again
         * within its second would otherwise never be looked up again. */
        int rc = dfs_scan_refresh(fs, n);
        return rc < 0 || !listing ? rc : dfs_scan_recheck(fs, n, NULL);
    }
    if (n->type == DFS_N_PARTDIR)
        return dfs_scan_refresh(fs, n->parent);
    if (n->type == DFS_N_PARTIAL) {   /* never read as a checkpoint */
        dfs_log(LOG_ERR, "%s", n->why ? n->why : "a partial checkpoint");
        return -EIO;
    }
    if (n->type == DFS_N_CKPT)
        return dfs_ckpt_ensure(fs, n->ck);
    if (listing && !atomic_load(&n->listed))
        return dfs_dir_list(fs, n, 0);
    return 0;
}

/* The directory node ino, ready to list; replies with the error and returns
 * NULL when it is missing, not a directory, or cannot be prepared. */
static struct dfs_node *ready_dir(fuse_req_t req, struct dfs *fs, fuse_ino_t ino, int listing)
{
    struct dfs_node *n = get_node(fs, ino);
    if (!n) {
        fuse_reply_err(req, ENOENT);
        return NULL;
    }
    int rc = dfs_is_dir(n) ? prepare_dir(fs, n, listing) : -ENOTDIR;
    if (rc < 0) {
        fuse_reply_err(req, -rc);
        put_node(fs, n);
        return NULL;
    }
    return n;   /* with a reference (put_node) */
}

void dfs_stat(struct dfs *fs, const struct dfs_node *n, struct stat *st)
{
    memset(st, 0, sizeof *st);
    const struct stat *src = NULL;
    struct stat now;
    if (n->type == DFS_N_PASSTHRU && !n->ck && dfs_scan_file(fs, n, &now, NULL) == 0)
        src = &now;   /* a scan folder's file changes in place */
    else if (n->type == DFS_N_PASSTHRU || n->type == DFS_N_PARTIAL)
        src = n->pst;
    else if (n->type == DFS_N_SCANDIR)
        src = dfs_scan_stat(n->scan);
    else if (n->type == DFS_N_PARTDIR)
        src = dfs_scan_stat(n->parent->scan);
    else if (n->ck)
        src = &n->ck->meta_st;     /* the checkpoint's time: when .metadata was written */
    if (src) {
        st->st_uid = src->st_uid;
        st->st_gid = src->st_gid;
        st->st_atim = src->st_mtim;
        st->st_mtim = src->st_mtim;
        st->st_ctim = src->st_ctim;
        if (n->type == DFS_N_SCANDIR || n->type == DFS_N_PARTDIR) {   /* a listing the kernel cached is stale when this moves */
            const struct dfs_scan *sc = n->type == DFS_N_SCANDIR ? n->scan : n->parent->scan;
            long ns = st->st_mtim.tv_nsec + (long)(dfs_scan_version(sc) % 1000000000u);
            st->st_mtim.tv_sec += ns / 1000000000;
            st->st_mtim.tv_nsec = ns % 1000000000;
        }
    }
    st->st_ino = n->ino;
    st->st_blksize = 1 << 20;   /* cp and friends size their buffers from it */
    if (dfs_is_dir(n)) {
        /* glibc sizes a directory's getdents buffer from it (32 KiB to
         * 1 MiB), and the kernel allocates and maps that much for each
         * listing request: 1 MiB made ls -R of 100,000 directories spend
         * 10 s of system time there. A page, as ext4 says: 32 KiB. */
        st->st_blksize = 4096;
        st->st_mode = S_IFDIR | 0555;
        /* 1 = "unknown" to find(1), for a checkpoint not opened yet or a directory not listed yet */
        int known = n->type == DFS_N_CKPT ? atomic_load(&n->ck->state) == 1
                    : n->type == DFS_N_DIR ? atomic_load(&n->listed) : 1;
        st->st_nlink = known ? 2 + n->nsubdirs : 1;
        return;
    }
    st->st_mode = S_IFREG | 0444;
    st->st_nlink = 1;
    uint64_t size = 0;
    if (n->type == DFS_N_ENTRY) {
        if (dfs_entry_size((struct dfs_node *)n, &size) < 0)
            size = 0;
    } else if (n->type == DFS_N_VIRTUAL) {
        struct dfs_layout lay;
        size = n->vops && n->vops->layout((struct dfs_node *)n, &lay) == 0 ? lay.size : 0;
    } else {
        size = src ? (uint64_t)src->st_size : 0;
    }
    st->st_size = (off_t)size;
    st->st_blocks = (blkcnt_t)((size + 511) / 512);
}

/* Scan folders, their .partial folders and files, and what these list change
 * as training writes; so does the root of a single checkpoint (saved again). */
static int changing(const struct dfs_node *n)
{
    return n->type == DFS_N_SCANDIR || n->type == DFS_N_PARTDIR || n->type == DFS_N_PARTIAL ||
           (n->type == DFS_N_PASSTHRU && !n->ck) || (n->type == DFS_N_CKPT && !n->parent);
}

static double attr_timeout(const struct dfs_node *n)
{
    return changing(n) ? DFS_TIMEOUT_SCAN : DFS_TIMEOUT_FOREVER;
}

static double entry_timeout(const struct dfs_node *dir)
{
    return changing(dir) ? DFS_TIMEOUT_SCAN : DFS_TIMEOUT_FOREVER;
}

/* A virtual file is laid out on its first lookup or stat: 0, or -errno when
 * that fails (the file then answers EIO rather than looking empty). */
static int prepare_file(struct dfs_node *n)
{
    struct dfs_layout lay;
    if (n->type != DFS_N_VIRTUAL)
        return 0;
    return n->vops ? n->vops->layout(n, &lay) : -EIO;
}

static void fill_entry(struct dfs *fs, const struct dfs_node *dir, const struct dfs_node *n,
                       struct fuse_entry_param *e)
{
    memset(e, 0, sizeof *e);
    e->ino = n->ino;
    e->generation = 1;
    dfs_stat(fs, n, &e->attr);
    e->attr_timeout = attr_timeout(n);
    e->entry_timeout = entry_timeout(dir);
}

/* ------------------------------------------------------------- lifecycle */


static void op_init(void *userdata, struct fuse_conn_info *conn)
{
    struct dfs *fs = userdata;
    if ((conn->capable & FUSE_CAP_SPLICE_WRITE) && fs->opt.readmode != DFS_READ_PREAD) {
        conn->want |= FUSE_CAP_SPLICE_WRITE;
        fs->splice_ok = 1;
    }
    /* Always READDIRPLUS, not only for the first request of a listing
     * (readdirplus_auto): every name listed comes with its entry, so a walk
     * into the directories of a large one needs no LOOKUP of each (100,000
     * of them for `ls -R` of 100,000 keys). */
    if (conn->capable & FUSE_CAP_READDIRPLUS)
        conn->want |= FUSE_CAP_READDIRPLUS;
    conn->want &= ~FUSE_CAP_READDIRPLUS_AUTO;
    /* Directories are opened by the kernel alone, their listings cached
     * (two requests fewer for every directory a walk enters). */
    if ((conn->capable & FUSE_CAP_NO_OPENDIR_SUPPORT) && !fs->opt.opendir) {
        conn->want |= FUSE_CAP_NO_OPENDIR_SUPPORT;
        fs->no_opendir = 1;
    }
    if (conn->capable & FUSE_CAP_ASYNC_READ)
        conn->want |= FUSE_CAP_ASYNC_READ;
    if (conn->capable & FUSE_CAP_PARALLEL_DIROPS)
        conn->want |= FUSE_CAP_PARALLEL_DIROPS;
    /* Nothing changes under us: no need to drop cached pages on a new mtime. */
    conn->want &= ~FUSE_CAP_AUTO_INVAL_DATA;
    /* Let the kernel keep many readahead requests in flight across threads. */
    conn->max_background = 64;
    conn->congestion_threshold = 48;
    conn->time_gran = 1;
    if (fs->opt.max_read)
        conn->max_read = fs->opt.max_read;
    dfs_mounted(fs);
}

/* ----------------------------------------------------------------- lookup */

static void lookup_in(fuse_req_t req, struct dfs *fs, struct dfs_node *dir, const char *name);

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    struct dfs *fs = FS(req);
    /* No name is longer (statfs says so): the kernel passes up to 1024
     * bytes, and a disk filesystem answers ENAMETOOLONG, not ENOENT. */
    if (strlen(name) > DFS_NAME_MAX) {
        fuse_reply_err(req, ENAMETOOLONG);
        return;
    }
    dfs_notify_lookup(parent, name);   /* a save retired here keeps this entry: the reply replaces it */
    struct dfs_node *dir = ready_dir(req, fs, parent, 0);
    if (dir) {
        lookup_in(req, fs, dir, name);
        dfs_notify_looked_up(fs, dir, name);   /* in a retired checkpoint (a working directory there) */
        put_node(fs, dir);
    }
    dfs_notify_lookup(0, NULL);
}

/* The entry a lookup replies with holds a reference to its checkpoint, the
 * kernel's (FORGET gives it back). */
static void lookup_in(fuse_req_t req, struct dfs *fs, struct dfs_node *dir, const char *name)
{
    /* A checkpoint saved again under this name is another node with another
     * inode: the kernel, revalidating its dentry (a scan folder's entries
     * are kept a second), drops the old one with everything cached below
     * it (entries, attributes, pages kept by keep_cache), so nothing of the
     * old save is served for the new one. */
    if (dir->type == DFS_N_SCANDIR) {
        int rc = dfs_scan_recheck(fs, dir, name);
        if (rc < 0) {
            fuse_reply_err(req, -rc);
            return;
        }
    }
    pthread_rwlock_rdlock(&fs->lock);
    struct dfs_node *n = dfs_child(dir, name);
    if (n && !dfs_ckpt_get(n->ck))
        n = NULL;   /* never: a child is alive while it is one */
    int listed = dir->type != DFS_N_DIR || atomic_load(&dir->listed);
    pthread_rwlock_unlock(&fs->lock);
    struct fuse_entry_param e;
    if (!n && !listed) {   /* one name of a key-tree directory not listed yet */
        int rc;
        n = dfs_dir_lookup(fs, dir, name, &rc);
        if (rc < 0) {
            fuse_reply_err(req, -rc);
            return;
        }
        if (n)
            dfs_ckpt_ref(n->ck, 1);   /* dir's checkpoint, which dir's reference holds */
    }
    if (!n) {
        memset(&e, 0, sizeof e);
        e.entry_timeout = entry_timeout(dir);   /* a negative entry, cached too */
        fuse_reply_entry(req, &e);
        return;
    }
    /* A scan folder's attributes say whether the kernel's cached listing of
     * it is stale (dfs_scan_version): rescan it before giving them. */
    int rc = n->type == DFS_N_SCANDIR ? dfs_scan_refresh(fs, n) : n->type == DFS_N_PARTDIR ? 0 : prepare_file(n);
    if (rc < 0) {
        fuse_reply_err(req, -rc);
        put_node(fs, n);
        return;
    }
    /* A small key-tree directory is listed now, so that its st_nlink is
     * exact; a large one stays "unknown" (1) until it is listed, and so
     * does one met while another listing runs (a lookup never waits). */
    if (n->type == DFS_N_DIR)
        dfs_dir_list_if_small(fs, n);
    fill_entry(fs, dir, n, &e);
    if (fuse_reply_entry(req, &e) != 0)   /* interrupted: the kernel did not take it */
        put_node(fs, n);
}

static void op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
    unref_ino(FS(req), ino, nlookup, 0);
    fuse_reply_none(req);
}

static void op_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets)
{
    for (size_t i = 0; i < count; i++)
        unref_ino(FS(req), forgets[i].ino, forgets[i].nlookup, 0);
    fuse_reply_none(req);
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    (void)fi;
    struct dfs *fs = FS(req);
    struct dfs_node *n = get_node(fs, ino);
    if (!n) {
        fuse_reply_err(req, ENOENT);
        return;
    }
    int rc = n->type == DFS_N_SCANDIR   ? dfs_scan_refresh(fs, n)
             : n->type == DFS_N_PARTDIR ? dfs_scan_refresh(fs, n->parent)
                                        : prepare_file(n);
    if (rc < 0) {
        fuse_reply_err(req, -rc);
    } else {
        struct stat st;
        dfs_stat(fs, n, &st);
        fuse_reply_attr(req, &st, attr_timeout(n));
    }
    put_node(fs, n);
}

/* ------------------------------------------------------------------ files */

static void node_open(fuse_req_t req, struct dfs *fs, struct dfs_node *n, struct fuse_file_info *fi)
{
    if (dfs_is_dir(n)) {
        fuse_reply_err(req, EISDIR);
        return;
    }
    if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC)) {
        fuse_reply_err(req, EROFS);
        return;
    }
    /* No per-open allocation (a release the kernel never sends after an
     * unmount would leak it): fi->fh is a passthrough file's fd + 1, else 0. */
    int fd = -1;
    if (n->type == DFS_N_PASSTHRU && !n->ck) {
        int e = dfs_scan_file(fs, n, NULL, &fd);
        if (e < 0) {
            fuse_reply_err(req, -e);
            return;
        }
    } else if (n->type == DFS_N_PASSTHRU) {
        char *p = malloc(strlen(n->ck->path) + strlen(n->name) + 2);
        fd = -ENOMEM;
        if (p) {
            sprintf(p, "%s/%s", n->ck->path, n->name);
            fd = dfs_open_regular(AT_FDCWD, p);
            free(p);
        }
        if (fd < 0) {
            fuse_reply_err(req, -fd);
            return;
        }
    }
    fi->fh = (uint64_t)(fd + 1);
    fi->keep_cache = n->type != DFS_N_PASSTHRU || n->ck;   /* a scan folder's file: read it afresh */
    fi->noflush = 1;
    dfs_ckpt_ref(n->ck, 1);   /* the open file's, until release */
    if (fuse_reply_open(req, fi) == -ENOENT) {   /* interrupted: the kernel will not release it */
        if (fd >= 0)
            close(fd);
        dfs_ckpt_unref(fs, n->ck, 1);
    }
}

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    struct dfs *fs = FS(req);
    struct dfs_node *n = get_node(fs, ino);
    if (!n) {
        fuse_reply_err(req, ENOENT);
        return;
    }
    node_open(req, fs, n, fi);
    put_node(fs, n);
}

static void node_read(fuse_req_t req, struct dfs *fs, struct dfs_node *n, size_t size, off_t off, struct fuse_file_info *fi)
{
    switch (n->type) {
    case DFS_N_ENTRY:
        dfs_read_entry(req, fs, n, size, off);
        break;
    case DFS_N_PASSTHRU: {
        struct stat now;   /* a scan folder's file: its size now */
        int fd = (int)fi->fh - 1;
        dfs_read_fd(req, fs, fd, !n->ck && fstat(fd, &now) == 0 ? (uint64_t)now.st_size : (uint64_t)n->pst->st_size,
                    size, off);
        break;
    }
    case DFS_N_VIRTUAL:
        dfs_read_virtual(req, fs, n, size, off);
        break;
    default:
        fuse_reply_err(req, EISDIR);
    }
}

static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
    struct dfs *fs = FS(req);
    struct dfs_node *n = get_node(fs, ino);
    if (!n) {
        fuse_reply_err(req, ENOENT);
        return;
    }
    node_read(req, fs, n, size, off, fi);
    put_node(fs, n);
}

static void op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    if (fi->fh)
        close((int)fi->fh - 1);
    unref_ino(FS(req), ino, 1, 1);   /* the open file's: the old save's files stay readable until here */
    fuse_reply_err(req, 0);
}

/* ------------------------------------------------------------ directories */

/* Unlink a directory handle from fs->open_dirs and free it. */
static void close_dir(struct dfs *fs, struct dfs_dh *d)
{
    pthread_mutex_lock(&fs->dh_lock);
    if (d->prev)
        d->prev->next = d->next;
    else
        fs->open_dirs = d->next;
    if (d->next)
        d->next->prev = d->prev;
    pthread_mutex_unlock(&fs->dh_lock);
    ref_kids(fs, d->node, d->kids, d->nkids, 0);
    dfs_notify_released(fs, d->node);
    dfs_ckpt_unref(fs, d->node->ck, 1);
    free(d->kids);
    free(d);
}

static void opendir_node(fuse_req_t req, struct dfs *fs, struct dfs_node *n, struct fuse_file_info *fi);

/* A directory handle holds references to its node's checkpoint and to those
 * of the children it lists (close_dir drops them). */
static void op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    struct dfs *fs = FS(req);
    struct dfs_node *n = ready_dir(req, fs, ino, 1);
    if (!n)
        return;
    opendir_node(req, fs, n, fi);
    put_node(fs, n);
}

static void opendir_node(fuse_req_t req, struct dfs *fs, struct dfs_node *n, struct fuse_file_info *fi)
{
    if (fs->no_opendir) {   /* from now on the kernel opens directories itself (with fi->fh 0) */
        fuse_reply_err(req, ENOSYS);
        return;
    }
    struct dfs_dh *d = calloc(1, sizeof *d);
    if (!d) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    d->node = n;
    pthread_rwlock_rdlock(&fs->lock);
    d->nkids = n->nkids;
    d->kids = malloc((n->nkids ? n->nkids : 1) * sizeof *d->kids);
    if (d->kids && n->nkids)
        memcpy(d->kids, n->kids, n->nkids * sizeof *d->kids);
    if (d->kids)
        ref_kids(fs, n, d->kids, d->nkids, 1);
    pthread_rwlock_unlock(&fs->lock);
    if (!d->kids) {
        free(d);
        fuse_reply_err(req, ENOMEM);
        return;
    }
    dfs_ckpt_ref(n->ck, 1);
    fi->fh = (uint64_t)(uintptr_t)d;
    if (!changing(n)) {
        fi->cache_readdir = 1;   /* a checkpoint's listing never changes */
        fi->keep_cache = 1;
    }
    pthread_mutex_lock(&fs->dh_lock);
    d->next = fs->open_dirs;
    if (d->next)
        d->next->prev = d;
    fs->open_dirs = d;
    pthread_mutex_unlock(&fs->dh_lock);
    if (fuse_reply_open(req, fi) == -ENOENT)   /* interrupted: the kernel will not release it */
        close_dir(fs, d);
}

/* Without an opendir handle, the children of node from offset off (a
 * key-tree directory's never change once listed; a scan folder's are
 * rescanned at offset 0): as many as a reply of size bytes can hold, copied
 * under fs->lock into d. */
static int node_kids(struct dfs *fs, fuse_ino_t ino, size_t size, off_t off, struct dfs_dh *d)
{
    struct dfs_node *n = get_node(fs, ino);
    if (!n)
        return -ENOENT;
    int rc = !dfs_is_dir(n) ? -ENOTDIR : off == 0 || !changing(n) ? prepare_dir(fs, n, 1) : 0;
    size_t from = off > 2 ? (size_t)off - 2 : 0, most = size / 24 + 1, take = 0;   /* an entry takes >= 24 bytes */
    if (rc == 0) {
        pthread_rwlock_rdlock(&fs->lock);
        size_t avail = from < n->nkids ? n->nkids - from : 0;
        take = avail < most ? avail : most;
        d->kids = malloc((take ? take : 1) * sizeof *d->kids);
        if (d->kids && take)
            memcpy(d->kids, n->kids + from, take * sizeof *d->kids);
        if (d->kids)
            ref_kids(fs, n, d->kids, take, 1);
        pthread_rwlock_unlock(&fs->lock);
        rc = d->kids ? 0 : -ENOMEM;
    }
    if (rc < 0) {
        put_node(fs, n);
        return rc;
    }
    d->node = n;   /* with the reference: unref_tmp drops it */
    d->base = from;
    d->nkids = from + take;   /* offsets as in the whole listing */
    return 0;
}

/* The references node_kids took. */
static void unref_tmp(struct dfs *fs, struct dfs_dh *d)
{
    ref_kids(fs, d->node, d->kids, d->nkids - d->base, 0);
    put_node(fs, d->node);
    free(d->kids);
}

/* Does a readdirplus entry for n give the kernel its node (a lookup)? Without
 * attributes (and e.ino 0) the kernel looks the file up when it is used:
 * listing a checkpoint does not lay out its virtual file, a scan folder is
 * rescanned by its lookup, and a node retired since the listing was taken
 * (an opendir handle's: a checkpoint saved again, a folder that left
 * .partial) is not given: its name was invalidated already (notify.c), so
 * the kernel would keep that entry, and the node, until memory runs short. */
static int plus_entry(const struct dfs_node *n)
{
    return n->type != DFS_N_VIRTUAL && n->type != DFS_N_SCANDIR && n->type != DFS_N_PARTDIR &&
           !(n->ck && atomic_load(&n->ck->retired));
}

static void do_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi,
                       int plus)
{
    struct dfs *fs = FS(req);
    struct dfs_dh *d = (struct dfs_dh *)(uintptr_t)fi->fh, tmp = {0};
    if (!d) {
        int rc = node_kids(fs, ino, size, off, &tmp);
        if (rc < 0) {
            fuse_reply_err(req, -rc);
            return;
        }
        d = &tmp;
    }
    /* The nodes given (plus_entry, decided once: a node may be retired
     * meanwhile), each with the kernel's reference; an entry takes >= 24 bytes. */
    size_t most = size / 24 + 1, ngiven = 0;
    char *buf = malloc(size ? size : 1);
    struct dfs_node **given = plus ? malloc(most * sizeof *given) : NULL;
    if (!buf || (plus && !given)) {
        free(buf);
        if (d == &tmp)
            unref_tmp(fs, &tmp);
        fuse_reply_err(req, ENOMEM);
        return;
    }
    size_t used = 0, first = off < 0 ? 0 : (size_t)off, i;
    for (i = first; i < d->nkids + 2; i++) {
        struct dfs_node *n;
        const char *name;
        struct fuse_entry_param e;
        int give = 0;
        memset(&e, 0, sizeof e);
        if (i < 2) {
            n = i == 0 || !d->node->parent ? d->node : d->node->parent;
            name = i == 0 ? "." : "..";
            e.attr.st_ino = n->ino;
            e.attr.st_mode = S_IFDIR;
        } else {
            n = d->kids[i - 2 - d->base];
            name = n->name;
            give = plus && ngiven < most && plus_entry(n);
            if (give)
                fill_entry(fs, d->node, n, &e);
            else {
                e.attr.st_ino = n->ino;
                e.attr.st_mode = dfs_is_dir(n) ? S_IFDIR : S_IFREG;
            }
        }
        size_t need = plus ? fuse_add_direntry_plus(req, buf + used, size - used, name, &e, (off_t)i + 1)
                           : fuse_add_direntry(req, buf + used, size - used, name, &e.attr, (off_t)i + 1);
        if (need > size - used)
            break;
        used += need;
        if (give) {
            dfs_ckpt_ref(n->ck, 1);   /* the kernel's, as a lookup's */
            given[ngiven++] = n;
        }
    }
    if (fuse_reply_buf(req, buf, used) != 0)   /* interrupted: the kernel took none */
        for (size_t j = 0; j < ngiven; j++)
            dfs_ckpt_unref(fs, given[j]->ck, 1);
    free(given);
    free(buf);
    if (d == &tmp)
        unref_tmp(fs, &tmp);
}

static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
    do_readdir(req, ino, size, off, fi, 0);
}

static void op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
    do_readdir(req, ino, size, off, fi, 1);
}

static void op_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    (void)ino;
    struct dfs_dh *d = (struct dfs_dh *)(uintptr_t)fi->fh;
    if (d)
        close_dir(FS(req), d);
    fuse_reply_err(req, 0);
}

void dfs_close_dirs(struct dfs *fs)
{
    while (fs->open_dirs)
        close_dir(fs, fs->open_dirs);
}

static void op_statfs(fuse_req_t req, fuse_ino_t ino)
{
    (void)ino;
    struct dfs *fs = FS(req);
    struct statvfs sv;
    memset(&sv, 0, sizeof sv);
    sv.f_bsize = 1 << 20;
    sv.f_frsize = 512;
    pthread_mutex_lock(&fs->alloc_lock);
    sv.f_files = fs->nnodes;
    pthread_mutex_unlock(&fs->alloc_lock);
    sv.f_namemax = DFS_NAME_MAX;
    sv.f_flag = ST_RDONLY;
    fuse_reply_statfs(req, &sv);
}

/* ----------------------------------------------------------------- xattrs */


/* Builds "name\0value\0..." of a node's attributes into a malloc'd buffer. */
struct xlist {
    char *buf;
    size_t len, cap;
};

static int xl_add(struct xlist *x, const char *name, const char *value)
{
    size_t a = strlen(name) + 1, b = strlen(value) + 1;
    if (x->len + a + b > x->cap) {
        size_t cap = (x->len + a + b) * 2;
        char *p = realloc(x->buf, cap);
        if (!p)
            return -1;
        x->buf = p;
        x->cap = cap;
    }
    memcpy(x->buf + x->len, name, a);
    memcpy(x->buf + x->len + a, value, b);
    x->len += a + b;
    return 0;
}

static int node_xattrs(const struct dfs_node *n, struct xlist *x)
{
    char tmp[64];
    if (n->type == DFS_N_ENTRY) {
        const dcp_entry *e = n->entry;
        if (xl_add(x, "user.dcp.key", e->key) < 0 ||
            xl_add(x, "user.dcp.kind", e->kind == DCP_KIND_TENSOR ? "tensor" : "bytes") < 0)
            return -1;
        if (e->kind != DCP_KIND_TENSOR)
            return 0;
        const char *dt = dcp_dtype_name(e->dtype);
        size_t cap = 3 + (size_t)e->ndim * 22;
        char *shape = malloc(cap);
        if (!shape)
            return -1;
        size_t k = (size_t)snprintf(shape, cap, "[");
        for (int d = 0; d < e->ndim; d++)
            k += (size_t)snprintf(shape + k, cap - k, "%s%" PRId64, d ? "," : "", e->shape[d]);
        snprintf(shape + k, cap - k, "]");
        snprintf(tmp, sizeof tmp, "%zu", e->nchunks);
        int rc = xl_add(x, "user.dcp.dtype", dt ? dt : "unknown") < 0 || xl_add(x, "user.dcp.shape", shape) < 0 ||
                 xl_add(x, "user.dcp.chunks", tmp) < 0;
        free(shape);
        return rc ? -1 : 0;
    }
    if (n->type == DFS_N_PARTIAL)
        return xl_add(x, DFS_PARTIAL_XATTR, n->why ? n->why : "") < 0 ? -1 : 0;
    if (n->type == DFS_N_CKPT && atomic_load(&n->ck->state) == 1) {
        const dcp_info *in = dcp_get_info(n->ck->ck);
        if (in->generation && xl_add(x, "user.dcp.generation", in->generation) < 0)
            return -1;
        if (in->serialization && xl_add(x, "user.dcp.serialization", in->serialization) < 0)
            return -1;
        if (in->layout && xl_add(x, "user.dcp.layout", in->layout) < 0)
            return -1;
    }
    return 0;
}

static void node_getxattr(fuse_req_t req, struct dfs_node *n, const char *name, size_t size)
{
    if (n->type == DFS_N_ENTRY && strcmp(name, DFS_DIGEST_XATTR) == 0) {
        /* computed when asked: it reads the whole value (dcp digest's digest) */
        unsigned char d[16];
        char hex[33];
        dcp_error err;
        if (dcp_value_digest(n->ck->ck, n->entry, d, &err) < 0) {
            dfs_log(LOG_ERR, "%s", err.msg);
            fuse_reply_err(req, DFS_REPLY_ERRNO(err.code));
            return;
        }
        for (int k = 0; k < 16; k++)
            snprintf(hex + 2 * k, 3, "%02x", d[k]);
        if (size == 0)
            fuse_reply_xattr(req, 32);
        else if (size < 32)
            fuse_reply_err(req, ERANGE);
        else
            fuse_reply_buf(req, hex, 32);
        return;
    }
    struct xlist x = {0};
    if (node_xattrs(n, &x) < 0) {
        free(x.buf);
        fuse_reply_err(req, ENOMEM);
        return;
    }
    for (size_t i = 0; i < x.len;) {
        const char *k = x.buf + i, *v = k + strlen(k) + 1;
        size_t vl = strlen(v);
        if (strcmp(k, name) == 0) {
            if (size == 0)
                fuse_reply_xattr(req, vl);
            else if (size < vl)
                fuse_reply_err(req, ERANGE);
            else
                fuse_reply_buf(req, v, vl);
            free(x.buf);
            return;
        }
        i = (size_t)(v - x.buf) + vl + 1;
    }
    free(x.buf);
    fuse_reply_err(req, ENODATA);
}

static void op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
    struct dfs *fs = FS(req);
    struct dfs_node *n = get_node(fs, ino);
    if (!n) {
        fuse_reply_err(req, ENOENT);
        return;
    }
    node_getxattr(req, n, name, size);
    put_node(fs, n);
}

static void node_listxattr(fuse_req_t req, struct dfs_node *n, size_t size)
{
    struct xlist x = {0};
    if (node_xattrs(n, &x) < 0 || (n->type == DFS_N_ENTRY && xl_add(&x, DFS_DIGEST_XATTR, "") < 0)) {
        free(x.buf);
        fuse_reply_err(req, ENOMEM);
        return;
    }
    /* Keep the names only, in place. */
    size_t out = 0;
    for (size_t i = 0; i < x.len;) {
        const char *k = x.buf + i, *v = k + strlen(k) + 1;
        size_t kl = strlen(k) + 1;
        memmove(x.buf + out, k, kl);
        out += kl;
        i = (size_t)(v - x.buf) + strlen(v) + 1;
    }
    if (size == 0)
        fuse_reply_xattr(req, out);
    else if (size < out)
        fuse_reply_err(req, ERANGE);
    else
        fuse_reply_buf(req, x.buf, out);
    free(x.buf);
}

static void op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
    struct dfs *fs = FS(req);
    struct dfs_node *n = get_node(fs, ino);
    if (!n) {
        fuse_reply_err(req, ENOENT);
        return;
    }
    node_listxattr(req, n, size);
    put_node(fs, n);
}

const struct fuse_lowlevel_ops dfs_ops = {
    .init = op_init,
    .lookup = op_lookup,
    .forget = op_forget,
    .forget_multi = op_forget_multi,
    .getattr = op_getattr,
    .open = op_open,
    .read = op_read,
    .release = op_release,
    .opendir = op_opendir,
    .readdir = op_readdir,
    .readdirplus = op_readdirplus,
    .releasedir = op_releasedir,
    .statfs = op_statfs,
    .getxattr = op_getxattr,
    .listxattr = op_listxattr,
};
