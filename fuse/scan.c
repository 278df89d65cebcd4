/* dcpfs: SOURCE, either one checkpoint or a folder of them.
 *
 * In folder mode every real folder below SOURCE (up to -o depth=N levels)
 * that holds a `.metadata`, or the files of another layout dcp_open reads
 * (rank-local __R.metadata, safetensors, per-rank torch.save files) and no
 * checkpoint in its subfolders, appears at its relative path as a
 * checkpoint, and a folder appears as a plain directory when some
 * checkpoint lies below it.
 * Folders with neither (a save still being written, an empty run) are not
 * shown; they are remembered as "pending" and probed again.
 *
 * A scan folder is rescanned on lookup and readdir: a full listing when its
 * mtime/ctime changed (or were too recent to trust: a change within the same
 * clock tick is invisible), otherwise only its pending subfolders are probed
 * (one fstatat each), because a .metadata appearing in a subfolder does not
 * touch the parent's mtime. Symbolic links and dot-folders are not followed.
 *
 * A checkpoint saved again under the same name (torch renames a new
 * .metadata over the old one after rewriting the shards in place, and the
 * parent's mtime stays as it is) is found by its .metadata's identity (the
 * other layouts: their folder's, ckpt_mark), at
 * each lookup of its name and each listing (dfs_scan_recheck): a new
 * node, with another inode, takes its place. The old node and its model
 * stay for the handles open on them and the kernel's entries of them, and
 * are freed after the last (publish retires it: dcpfs.h, Lifetime); libdcp
 * fails their reads of shards written to since (EIO). A single checkpoint
 * (SOURCE) saved again gets a new root the same way (dfs_single_recheck),
 * and so does a scan folder a checkpoint was saved straight into, or whose
 * own files are one once the checkpoints below it are gone (became_ckpt):
 * the folder is that checkpoint now, as a new mount shows it.
 *
 * The plain files of a scan folder (Megatron-LM's
 * latest_checkpointed_iteration.txt, a run's config) appear as they are,
 * dot-files aside. Unlike a checkpoint's they change in place (the tracker
 * file is rewritten at every save): their attributes are taken afresh at
 * each stat (dfs_scan_file) and kept a second, their pages are not kept.
 *
 * A subfolder whose save did not finish (dcp_probe_folder: shard files
 * without .metadata, a .metadata.tmp, a Megatron torch_dist folder (common.pt) without
 * metadata.json, a tmp-/tmp_/.tmp staging folder) is never shown as a
 * checkpoint: it stays pending (probed again, and shown once complete) and is
 * listed in the scan folder's ".partial" folder (hidden from a plain `ls`)
 * as a directory that answers EIO, with a log line and the
 * user.dcp.partial attribute giving the reason. Each such node has a
 * checkpoint object of its own (never opened), retired when its folder
 * leaves .partial (complete, removed, or its scan folder gone): the kernel is
 * told to drop the name, and the node is freed once nothing refers to it
 * (dcpfs.h, Lifetime), so a mount beside a long run does not grow a node a
 * save.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dcpfs.h"

struct dfs_scan {
    char *rel;               /* path relative to SOURCE ("." for SOURCE itself) */
    int depth;               /* 0 for SOURCE */
    int scanned, racy;
    int gone;                /* emptied (empty_scandir): its folder left, it lists nothing more */
    struct stat st;          /* of the folder at the last scan (getattr uses it) */
    char **pending;          /* subfolders with no checkpoint below yet */
    size_t npending;
    unsigned version;        /* bumped whenever the listing changes (dfs_scan_version) */
    /* subfolders the last refresh found partial: names and log lines */
    char **pnames, **pwhy;
    size_t npartial;
    struct dfs_node *partdir;  /* the .partial node, made for the first partial subfolder */
};

enum { FOUND_NONE = 0, FOUND_CKPT, FOUND_FOLDER, FOUND_PARTIAL };

static void clear_partial(struct dfs_scan *s)
{
    for (size_t i = 0; i < s->npartial; i++) {
        free(s->pnames[i]);
        free(s->pwhy[i]);
    }
    free(s->pnames);
    free(s->pwhy);
    s->pnames = s->pwhy = NULL;
    s->npartial = 0;
}

void dfs_scan_free(struct dfs_scan *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->npending; i++)
        free(s->pending[i]);
    free(s->pending);
    clear_partial(s);
    free(s->rel);
    free(s);
}

const struct stat *dfs_scan_stat(const struct dfs_scan *s)
{
    return &s->st;
}

unsigned dfs_scan_version(const struct dfs_scan *s)
{
    return __atomic_load_n(&s->version, __ATOMIC_RELAXED);
}

static char *join(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (strcmp(a, ".") == 0)
        return strdup(b);
    char *p = malloc(la + lb + 2);
    if (p) {
        memcpy(p, a, la);
        p[la] = '/';
        memcpy(p + la + 1, b, lb + 1);
    }
    return p;
}

/* SOURCE/rel (SOURCE itself for "."), malloc'd; NULL on ENOMEM. */
static char *abs_path(const struct dfs *fs, const char *rel)
{
    if (strcmp(rel, ".") == 0)
        return strdup(fs->source);
    char *path = malloc(strlen(fs->source) + strlen(rel) + 2);
    if (path)
        sprintf(path, "%s/%s", fs->source, rel);
    return path;
}

int dfs_has_metadata(int dirfd, const char *rel, struct stat *st)
{
    char *p = join(rel, ".metadata");
    if (!p)
        return 0;
    int ok = fstatat(dirfd, p, st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st->st_mode);
    free(p);
    return ok;
}

/* What tells a new save of the checkpoint in folder rel: its .metadata (torch
 * renames a new one over the old), else, for the layouts with none, the
 * folder itself, whose mtime and ctime move when a file in it is created,
 * renamed or removed (a chmod or a stray file costs one more open, never a
 * wrong byte). 0 when neither can be found. */
static int ckpt_mark(int dirfd, const char *rel, struct stat *st)
{
    if (dfs_has_metadata(dirfd, rel, st))
        return 1;
    return fstatat(dirfd, rel, st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st->st_mode);
}

static DIR *open_rel(int srcfd, const char *rel)
{
    int fd = openat(srcfd, rel, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    DIR *d = fdopendir(fd);
    if (!d)
        close(fd);
    return d;
}

static int is_subdir(DIR *d, const struct dirent *de)
{
    if (de->d_name[0] == '.')
        return 0;   /* ".", "..", hidden folders */
    if (de->d_type == DT_DIR)
        return 1;
    if (de->d_type != DT_UNKNOWN)
        return 0;
    struct stat st;
    return fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
}

static int is_plain_file(DIR *d, const struct dirent *de, struct stat *st)
{
    if (de->d_name[0] == '.' || (de->d_type != DT_REG && de->d_type != DT_UNKNOWN))
        return 0;
    return fstatat(dirfd(d), de->d_name, st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st->st_mode);
}

int dfs_scan_file(struct dfs *fs, const struct dfs_node *n, struct stat *st, int *fd)
{
    char *rel = join(n->parent->scan->rel, n->name);
    if (!rel)
        return -ENOMEM;
    int rc = 0;
    if (st && fstatat(fs->srcfd, rel, st, AT_SYMLINK_NOFOLLOW) < 0)
        rc = -errno;
    else if (st && !S_ISREG(st->st_mode))
        rc = -ENOENT;   /* replaced by a folder: the next scan shows it */
    if (rc == 0 && fd && (*fd = dfs_open_regular(fs->srcfd, rel)) < 0)
        rc = *fd;
    free(rel);
    return rc;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n > m && strcmp(s + n - m, suffix) == 0;
}

/* What dcp_probe_folder says of the folder rel (DCP_FOLDER_*; -1 on ENOMEM,
 * NOT_CHECKPOINT when it cannot be listed); for a partial one *why (if why
 * is not NULL) then gets a malloc'd log line "PATH: a partial checkpoint: REASON". */
static int folder_kind(const struct dfs *fs, const char *rel, char **why)
{
    char *path = abs_path(fs, rel);
    if (!path)
        return -1;
    dcp_folder_probe p;
    int kind = dcp_probe_folder(path, &p, NULL) == 0 ? (int)p.kind : DCP_FOLDER_NOT_CHECKPOINT;
    if (kind == DCP_FOLDER_PARTIAL && why) {
        int len = snprintf(NULL, 0, "%s: a partial checkpoint: %s", path, p.reason);
        if (len < 0 || !(*why = malloc((size_t)len + 1)))
            kind = -1;
        else
            snprintf(*why, (size_t)len + 1, "%s: a partial checkpoint: %s", path, p.reason);
    }
    free(path);
    return kind;
}

static int is_partial(const struct dfs *fs, const char *rel, char **why)
{
    int kind = folder_kind(fs, rel, why);
    return kind < 0 ? -1 : kind == DCP_FOLDER_PARTIAL;
}

static int classify(struct dfs *fs, const char *rel, int depth, struct stat *meta, char **why);

/* What the folder rel (depth levels below SOURCE), whose folder_kind is
 * kind, holds; a partial checkpoint below counts for its folders (they are
 * shown, with .partial). *meta: what tells a new save of a checkpoint
 * (ckpt_mark). */
static int classify_kind(struct dfs *fs, const char *rel, int depth, int kind, struct stat *meta)
{
    if (kind < 0)
        return -ENOMEM;
    if (kind == DCP_FOLDER_PARTIAL)
        return FOUND_PARTIAL;
    if (dfs_has_metadata(fs->srcfd, rel, meta))
        return FOUND_CKPT;
    int found = FOUND_NONE;
    DIR *d = depth < fs->opt.max_depth ? open_rel(fs->srcfd, rel) : NULL;
    struct dirent *de;
    while (d && found == FOUND_NONE && (de = readdir(d))) {
        if (ends_with(de->d_name, ".distcp"))
            break;   /* a checkpoint's (or one still being written): nothing below it counts */
        if (!is_subdir(d, de))
            continue;
        char *sub = join(rel, de->d_name);
        struct stat st;
        if (sub && classify(fs, sub, depth + 1, &st, NULL) > FOUND_NONE)
            found = FOUND_FOLDER;
        free(sub);
    }
    if (d)
        closedir(d);
    /* The other layouts dcp_open reads (rank-local __R.metadata,
     * safetensors, per-rank torch.save files): a checkpoint, unless
     * checkpoints lie in its subfolders (a run folder with its final
     * model.safetensors beside its step folders stays a folder). */
    if (found == FOUND_NONE && kind == DCP_FOLDER_CHECKPOINT && ckpt_mark(fs->srcfd, rel, meta))
        return FOUND_CKPT;
    return found;
}

/* classify_kind of the folder rel; *why as folder_kind gives it. */
static int classify(struct dfs *fs, const char *rel, int depth, struct stat *meta, char **why)
{
    return classify_kind(fs, rel, depth, folder_kind(fs, rel, why), meta);
}

static struct dfs_node *make_scandir(struct dfs *fs, struct dfs_node *parent, const char *name,
                                     const char *rel, int depth)
{
    struct dfs_node *n = dfs_node_new(fs, parent, name, strlen(name), DFS_N_SCANDIR);
    if (!n)
        return NULL;
    n->scan = calloc(1, sizeof *n->scan);
    if (!n->scan || !(n->scan->rel = strdup(rel)))
        return NULL;
    n->scan->depth = depth;
    if (fstatat(fs->srcfd, rel, &n->scan->st, AT_SYMLINK_NOFOLLOW) < 0)
        fstat(fs->srcfd, &n->scan->st);
    return n;
}

static struct dfs_node *make_ckpt(struct dfs *fs, struct dfs_node *parent, const char *name,
                                  const char *rel, const struct stat *meta)
{
    char *path = abs_path(fs, rel);
    if (!path)
        return NULL;
    struct dfs_ckpt *ck = dfs_ckpt_new(fs, path, meta);
    free(path);
    return ck ? dfs_ckpt_root_new(fs, parent, name, ck) : NULL;
}

/* A node for the plain file `name` of dir (st: its stat now). */
static struct dfs_node *make_file(struct dfs *fs, struct dfs_node *dir, const char *name, const struct stat *st,
                                  int *rc)
{
    struct dfs_node *n = dfs_node_new(fs, dir, name, strlen(name), DFS_N_PASSTHRU);
    if (!n || !(n->pst = malloc(sizeof *n->pst))) {
        *rc = -ENOMEM;
        return NULL;
    }
    *n->pst = *st;   /* what a stat shows while the file cannot be found */
    atomic_store(&n->size, (int64_t)st->st_size);
    return n;
}

/* Add a pending name to the scan state. */
static int add_pending(struct dfs_scan *s, const char *name)
{
    char **p = realloc(s->pending, (s->npending + 1) * sizeof *p);
    if (!p)
        return -ENOMEM;
    s->pending = p;
    if (!(p[s->npending] = strdup(name)))
        return -ENOMEM;
    s->npending++;
    return 0;
}

/* Remember a partial subfolder for the .partial listing (takes why). */
static int add_partial(struct dfs_scan *s, const char *name, char *why)
{
    char **pn = realloc(s->pnames, (s->npartial + 1) * sizeof *pn);
    if (pn)
        s->pnames = pn;
    char **pw = pn ? realloc(s->pwhy, (s->npartial + 1) * sizeof *pw) : NULL;
    if (pw)
        s->pwhy = pw;
    char *nm = pw ? strdup(name) : NULL;
    if (!nm) {
        free(why);
        return -ENOMEM;
    }
    s->pnames[s->npartial] = nm;
    s->pwhy[s->npartial] = why;
    s->npartial++;
    return 0;
}

/* A node for subfolder `name` of dir, or NULL (pending or failure). */
static struct dfs_node *probe(struct dfs *fs, struct dfs_node *dir, const char *name, int *rc)
{
    struct dfs_scan *s = dir->scan;
    char *rel = join(s->rel, name);
    if (!rel) {
        *rc = -ENOMEM;
        return NULL;
    }
    struct stat meta;
    struct dfs_node *n = NULL;
    char *why = NULL;
    switch (classify(fs, rel, s->depth + 1, &meta, &why)) {
    case FOUND_PARTIAL:   /* pending too: probed again until it is complete */
        dfs_log(LOG_DEBUG, "%s", why);
        *rc = add_pending(s, name);
        if (*rc == 0)
            *rc = add_partial(s, name, why);
        else
            free(why);
        free(rel);
        return NULL;
    case FOUND_CKPT:
        n = make_ckpt(fs, dir, name, rel, &meta);
        break;
    case FOUND_FOLDER:
        n = make_scandir(fs, dir, name, rel, s->depth + 1);
        break;
    case FOUND_NONE:
        *rc = add_pending(s, name);
        free(rel);
        return NULL;
    default:
        *rc = -ENOMEM;
        free(rel);
        return NULL;
    }
    if (!n)
        *rc = -ENOMEM;
    free(rel);
    return n;
}

static int same_time(const struct timespec *a, const struct timespec *b)
{
    return a->tv_sec == b->tv_sec && a->tv_nsec == b->tv_nsec;
}

/* Is .metadata st (now) the one was, of the save a node stands for? */
static int same_save(const struct stat *st, const struct stat *was)
{
    return st->st_dev == was->st_dev && st->st_ino == was->st_ino && st->st_size == was->st_size &&
           same_time(&st->st_mtim, &was->st_mtim) && same_time(&st->st_ctim, &was->st_ctim);
}

/* Was checkpoint k of dir saved again (or removed) since its node was made?
 * Its .metadata is compared with the one the node stands for (dfs_ckpt_built):
 * a save under the same folder name (torch renames a new .metadata over the
 * old one; rm -rf and a new save; a folder renamed into place) gives another
 * inode, size, mtime or ctime (a freed inode number may come back, and cp -a
 * keeps mtime; nobody sets ctime), while the parent folder's mtime may stay
 * as it is. A chmod or a hard link of .metadata moves ctime too: that
 * checkpoint is opened once more, which costs a parse, never a wrong byte.
 * Then the folder is probed again for a new node: the old one's model must
 * not be served over the new shard files. */
static int ckpt_changed(struct dfs *fs, const struct dfs_node *dir, const struct dfs_node *k)
{
    char *rel = join(dir->scan->rel, k->name);
    struct stat st;
    int has = rel && ckpt_mark(fs->srcfd, rel, &st);
    free(rel);
    if (!rel)
        return 0;   /* out of memory: keep the node, the next lookup checks again */
    int changed = !has || !same_save(&st, dfs_ckpt_built(k->ck));
    if (changed)
        dfs_log(LOG_INFO, "%s: %s: the folder is read anew", k->ck->path,
                !has ? "gone" : S_ISDIR(st.st_mode) ? "its files changed" : ".metadata changed");
    return changed;
}

/* Does scan folder k show a checkpoint below it (its last listing)? */
static int shows_ckpt(const struct dfs_node *k)
{
    for (size_t i = 0; i < k->nkids; i++)
        if (k->kids[i]->type == DFS_N_CKPT || k->kids[i]->type == DFS_N_SCANDIR)
            return 1;
    return k->scan->npartial != 0;   /* a save below still being written */
}

/* Is scan folder k a checkpoint now, as a new mount would show it? Either a
 * checkpoint was saved straight into it (a .metadata there: classify looks
 * for it before subfolders), or its last listing showed nothing below it and
 * its own files are another layout dcp_open reads (a run folder's final
 * model.safetensors once its step folders are removed). Then it is probed
 * again and the checkpoints below it are no longer shown. Checked where
 * ckpt_changed is, with scan_lock held (k's kids change only under it); the
 * second case costs a folder listing, so only a folder listed since its
 * checkpoints left is looked at. */
static int became_ckpt(struct dfs *fs, const struct dfs_node *k)
{
    struct stat st;
    const char *why = NULL;
    if (dfs_has_metadata(fs->srcfd, k->scan->rel, &st))
        why = "a checkpoint was saved into the folder";
    else if (k->scan->scanned && !shows_ckpt(k) && folder_kind(fs, k->scan->rel, NULL) == DCP_FOLDER_CHECKPOINT &&
             classify_kind(fs, k->scan->rel, k->scan->depth, DCP_FOLDER_CHECKPOINT, &st) == FOUND_CKPT)
        why = "no checkpoint below the folder any more, and its own files are one";
    if (!why)
        return 0;
    dfs_log(LOG_INFO, "%s/%s: %s: it is read as one", fs->source, k->scan->rel, why);
    return 1;
}

/* Does node k of scan folder dir no longer show what its folder holds (a
 * checkpoint saved again or gone, a scan folder gone or now a checkpoint)?
 * Then it is probed again. With scan_lock held. */
static int stale(struct dfs *fs, const struct dfs_node *dir, const struct dfs_node *k)
{
    return k->type == DFS_N_CKPT      ? ckpt_changed(fs, dir, k)
           : k->type == DFS_N_SCANDIR ? k->scan->gone || became_ckpt(fs, k)
                                      : 0;
}

/* Retire (or, shown: 0, drop unshown) each checkpoint of a list linked
 * through retire_next, made under fs->lock; called once it is released. */
static void retire_list(struct dfs *fs, struct dfs_ckpt *ck, int shown)
{
    while (ck) {
        struct dfs_ckpt *next = ck->retire_next;
        if (shown)
            dfs_ckpt_retire(fs, ck);
        else
            dfs_ckpt_unref(fs, ck, 1);   /* nothing else knows it */
        ck = next;
    }
}

static int empty_scandir(struct dfs *fs, struct dfs_node *dir);
static int partial_kids(struct dfs *fs, struct dfs_node *dir, struct dfs_node ***kids, size_t *n, size_t *cap);

/* Replace dir's children with kids[0..n) (sorted here); new nodes go into the
 * map, and the checkpoints whose roots are no longer among them are retired
 * (their names' references dropped once fs->lock is released); a scan folder
 * no longer among them is emptied (empty_scandir). */
static int publish(struct dfs *fs, struct dfs_node *dir, struct dfs_node **kids, size_t n, size_t cap)
{
    struct dfs_node tmp = {0};
    tmp.kids = kids;
    tmp.nkids = n;
    dfs_sort_kids(&tmp);
    size_t nsub = 0;
    for (size_t i = 0; i < n; i++)
        nsub += dfs_is_dir(kids[i]);
    int rc = 0;
    pthread_rwlock_wrlock(&fs->lock);
    for (size_t i = 0; i < n && rc == 0; i++)
        if (kids[i]->ino == 0)
            rc = dfs_map_insert(fs, kids[i]);
    if (dir->scan && (n != dir->nkids || (n && memcmp(kids, dir->kids, n * sizeof *kids))))
        __atomic_add_fetch(&dir->scan->version, 1, __ATOMIC_RELAXED);
    struct dfs_node **old = dir->kids;
    size_t nold = dir->nkids, nleft = 0;
    struct dfs_ckpt *gone = NULL;
    for (size_t i = 0; i < nold; i++) {
        struct dfs_node *k = old[i];
        if (dfs_child(&tmp, k->name) == k)   /* tmp: the new children */
            continue;
        if (k->type == DFS_N_CKPT) {
            k->ck->retire_next = gone;
            gone = k->ck;
        } else if (k->type == DFS_N_SCANDIR && old != kids) {
            old[nleft++] = k;   /* emptied below; old is this function's now */
        }
    }
    dir->kids = kids;
    dir->nkids = n;
    dir->kcap = cap;
    dir->nsubdirs = nsub;
    pthread_rwlock_unlock(&fs->lock);
    retire_list(fs, gone, 1);
    for (size_t i = 0; i < nleft; i++)
        if (empty_scandir(fs, old[i]) < 0)
            dfs_log(LOG_WARNING, "%s: out of memory: its .partial listing is kept", old[i]->scan->rel);
    if (old != kids)
        free(old);
    return rc;
}

/* A scan folder that left its parent's listing (removed, renamed, or now a
 * plain file) keeps its node until unmount, like every scan folder (the
 * kernel may still hold it), but not what lies below it: its checkpoints
 * are retired, its .partial nodes too, and its scan folders emptied in turn
 * (at most -o depth levels), so that a run deleting old step folders
 * (Hugging Face's save_total_limit: checkpoint-N/ holding DCP folders) does
 * not keep their models open until unmount. So is a scan folder found gone
 * by its own refresh. From then on it lists nothing, as a removed folder
 * does, even when a folder of its name comes back (that one gets a node of
 * its own): a process working in it would otherwise open the new folder's
 * checkpoints under a node no listing retires again. Called with scan_lock
 * held; -ENOMEM when its .partial nodes could not be retired. */
static int empty_scandir(struct dfs *fs, struct dfs_node *dir)
{
    struct dfs_scan *s = dir->scan;
    struct dfs_node **none = NULL;
    size_t nn = 0, nc = 0;
    for (size_t i = 0; i < s->npending; i++)
        free(s->pending[i]);
    s->npending = 0;
    clear_partial(s);
    int rc = partial_kids(fs, dir, &none, &nn, &nc);
    free(none);
    publish(fs, dir, NULL, 0, 0);   /* cannot fail: nothing to insert */
    s->gone = strcmp(s->rel, ".") != 0;   /* SOURCE's is refreshed as long as the mount lasts */
    return rc;
}

/* The .partial folder's children from s->pnames/pwhy (nodes of the last
 * listing reused when name and reason are the same), published under
 * fs->lock; the folder itself goes into *kids when there is any. Each child
 * has a checkpoint object of its own (dfs_partial_new): one that left the
 * listing is retired once fs->lock is released (the kernel told to drop its
 * name), and freed when nothing refers to it any more (dcpfs.h, Lifetime). */
static int partial_kids(struct dfs *fs, struct dfs_node *dir, struct dfs_node ***kids, size_t *n, size_t *cap)
{
    struct dfs_scan *s = dir->scan;
    if (!s->npartial && (!s->partdir || !s->partdir->nkids))
        return 0;
    if (!s->partdir && !(s->partdir = dfs_node_new(fs, dir, DFS_PARTIAL_NAME, strlen(DFS_PARTIAL_NAME), DFS_N_PARTDIR)))
        return -ENOMEM;
    struct dfs_node *pd = s->partdir;
    struct dfs_node **pk = malloc((s->npartial ? s->npartial : 1) * sizeof *pk);
    if (!pk)
        return -ENOMEM;
    size_t m = 0;
    int rc = 0;
    for (size_t i = 0; i < s->npartial && rc == 0; i++) {
        struct dfs_node *old = dfs_child(pd, s->pnames[i]);   /* pd's kids change only under scan_lock */
        if (old && old->why && strcmp(old->why, s->pwhy[i]) == 0) {
            pk[m++] = old;
            continue;
        }
        char *rel = join(s->rel, s->pnames[i]), *path = rel ? abs_path(fs, rel) : NULL;
        struct stat *st = path ? calloc(1, sizeof *st) : NULL;
        struct dfs_node *k = st ? dfs_partial_new(fs, pd, s->pnames[i], path) : NULL;
        if (k) {
            if (fstatat(fs->srcfd, rel, st, AT_SYMLINK_NOFOLLOW) < 0)
                *st = s->st;
            k->pst = st;
            k->why = s->pwhy[i];   /* the node owns it now */
            s->pwhy[i] = NULL;
            pk[m++] = k;
        } else {
            free(st);
            rc = -ENOMEM;
        }
        free(rel);
        free(path);
    }
    /* New nodes (not in the map yet) that are not published: nothing else
     * knows them, they go at once (unshown); those that left: gone */
    struct dfs_ckpt *unshown = NULL, *gone = NULL;
    if (rc < 0) {
        for (size_t i = 0; i < m; i++)
            if (pk[i]->ino == 0)
                dfs_ckpt_unref(fs, pk[i]->ck, 1);
        free(pk);
        return rc;
    }
    struct dfs_node tmp = {0};
    tmp.kids = pk;
    tmp.nkids = m;
    dfs_sort_kids(&tmp);
    pthread_rwlock_wrlock(&fs->lock);
    if (pd->ino == 0)
        rc = dfs_map_insert(fs, pd);
    size_t kept = 0;
    for (size_t i = 0; i < m; i++) {
        if (pk[i]->ino == 0 && (rc < 0 || (rc = dfs_map_insert(fs, pk[i])) < 0)) {
            pk[i]->ck->retire_next = unshown;
            unshown = pk[i]->ck;
            continue;
        }
        pk[kept++] = pk[i];
    }
    tmp.nkids = kept;
    if (kept != pd->nkids || (kept && memcmp(pk, pd->kids, kept * sizeof *pk)))
        __atomic_add_fetch(&s->version, 1, __ATOMIC_RELAXED);   /* .partial's mtime moves with its parent's */
    struct dfs_node **old = pd->kids;
    for (size_t i = 0; i < pd->nkids; i++)
        if (dfs_child(&tmp, old[i]->name) != old[i]) {   /* tmp: the new children */
            old[i]->ck->retire_next = gone;
            gone = old[i]->ck;
        }
    pd->kids = pk;
    pd->nkids = kept;
    pd->kcap = m;
    pd->nsubdirs = kept;
    pthread_rwlock_unlock(&fs->lock);
    free(old);
    retire_list(fs, unshown, 0);
    retire_list(fs, gone, 1);
    if (rc < 0 || !kept)
        return rc;
    if (*n == *cap) {
        struct dfs_node **g = realloc(*kids, (2 * *cap + 4) * sizeof *g);
        if (!g)
            return -ENOMEM;
        *kids = g;
        *cap = 2 * *cap + 4;
    }
    (*kids)[(*n)++] = pd;
    return 0;
}

int dfs_scan_refresh(struct dfs *fs, struct dfs_node *dir)
{
    struct dfs_scan *s = dir->scan;
    if (!s)
        return 0;
    pthread_mutex_lock(&fs->scan_lock);
    struct stat st;
    int rc = 0;
    if (s->gone)
        goto out;
    int gone = strcmp(s->rel, ".") == 0 ? fstat(fs->srcfd, &st) < 0
                                        : fstatat(fs->srcfd, s->rel, &st, AT_SYMLINK_NOFOLLOW) < 0;
    if (gone || !S_ISDIR(st.st_mode)) {
        rc = empty_scandir(fs, dir);   /* its partial subfolders leave .partial too */
        goto out;
    }
    int unchanged = s->scanned && !s->racy && same_time(&st.st_mtim, &s->st.st_mtim) &&
                    same_time(&st.st_ctim, &s->st.st_ctim) && st.st_ino == s->st.st_ino;
    /* Kids are only changed under scan_lock, which we hold: reading them is safe. */
    size_t cap = dir->nkids + 8, n = 0;
    struct dfs_node **kids = malloc(cap * sizeof *kids);
    if (!kids) {
        rc = -ENOMEM;
        goto out;
    }
    if (unchanged) {
        if (s->npending == 0) {
            free(kids);
            goto out;
        }
        for (size_t i = 0; i < dir->nkids; i++)   /* .partial is made again below */
            if (dir->kids[i] != s->partdir)
                kids[n++] = dir->kids[i];
        clear_partial(s);
        char **pending = s->pending;
        size_t npending = s->npending;
        s->pending = NULL;
        s->npending = 0;
        for (size_t i = 0; i < npending; i++) {
            struct dfs_node *k = rc == 0 ? probe(fs, dir, pending[i], &rc) : NULL;
            if (k) {
                if (n == cap) {
                    struct dfs_node **g = realloc(kids, 2 * cap * sizeof *g);
                    if (!g) {
                        rc = -ENOMEM;
                        free(pending[i]);
                        continue;
                    }
                    kids = g;
                    cap *= 2;
                }
                kids[n++] = k;
            }
            free(pending[i]);
        }
        free(pending);
    } else {
        DIR *d = open_rel(fs->srcfd, s->rel);
        for (size_t i = 0; i < s->npending; i++)
            free(s->pending[i]);
        s->npending = 0;
        clear_partial(s);
        struct dirent *de;
        while (d && rc == 0 && (de = readdir(d))) {
            struct stat fst;
            struct dfs_node *k = dfs_child(dir, de->d_name);
            if (is_subdir(d, de)) {
                if (!k || k->type == DFS_N_PASSTHRU || stale(fs, dir, k))
                    k = probe(fs, dir, de->d_name, &rc);
            } else if (is_plain_file(d, de, &fst)) {
                if (!k || k->type != DFS_N_PASSTHRU)
                    k = make_file(fs, dir, de->d_name, &fst, &rc);
            } else {
                continue;
            }
            if (!k)
                continue;
            if (n == cap) {
                struct dfs_node **g = realloc(kids, 2 * cap * sizeof *g);
                if (!g) {
                    rc = -ENOMEM;
                    break;
                }
                kids = g;
                cap *= 2;
            }
            kids[n++] = k;
        }
        if (d)
            closedir(d);
    }
    if (rc == 0)
        rc = partial_kids(fs, dir, &kids, &n, &cap);
    int prc = publish(fs, dir, kids, n, cap);
    if (rc == 0)
        rc = prc;
    s->scanned = 1;
    s->st = st;
    /* A change in the same clock tick as this scan would leave mtime as it is:
     * do not trust an mtime younger than two seconds. */
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    s->racy = now.tv_sec - st.st_mtim.tv_sec < 2 || now.tv_sec - st.st_ctim.tv_sec < 2;
out:
    pthread_mutex_unlock(&fs->scan_lock);
    return rc;
}

int dfs_scan_recheck(struct dfs *fs, struct dfs_node *dir, const char *name)
{
    if (!dir->scan)
        return 0;
    pthread_mutex_lock(&fs->scan_lock);
    /* Kids are only changed under scan_lock, which we hold: reading them is safe. */
    size_t n = 0;
    int rc = 0, moved = 0;
    struct dfs_node **kids = malloc((dir->nkids + 1) * sizeof *kids);
    if (!kids) {
        rc = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < dir->nkids; i++) {
        struct dfs_node *k = dir->kids[i];
        if (rc < 0 || (name && strcmp(k->name, name)) || !stale(fs, dir, k)) {
            kids[n++] = k;
            continue;
        }
        /* The new node takes the old one's place (a scan folder that left
         * is emptied by publish); none while the new save is partial
         * (pending: probed again by the next refresh); a probe that failed
         * keeps the old one. */
        struct dfs_node *nk = probe(fs, dir, k->name, &rc);
        if (nk || rc < 0)
            kids[n++] = nk ? nk : k;
        moved = 1;
    }
    if (moved) {
        int prc = publish(fs, dir, kids, n, dir->nkids + 1);
        if (rc == 0)
            rc = prc;
    } else {
        free(kids);
    }
out:
    pthread_mutex_unlock(&fs->scan_lock);
    return rc;
}

int dfs_single_recheck(struct dfs *fs)
{
    struct stat st;
    /* Only a checkpoint with .metadata: the other layouts are opened from
     * many files, none of which tells a new save. By path: SOURCE removed
     * and saved again is another folder. */
    if (!dfs_has_metadata(AT_FDCWD, fs->source, &st))
        return 0;
    pthread_mutex_lock(&fs->scan_lock);
    struct dfs_ckpt *old = fs->root->ck;   /* fs->root changes only under scan_lock */
    if (same_save(&st, dfs_ckpt_built(old)) || is_partial(fs, ".", NULL)) {
        pthread_mutex_unlock(&fs->scan_lock);
        return 0;   /* the same save, or a new one not finished: the next request looks again */
    }
    struct dfs_ckpt *ck = dfs_ckpt_new(fs, fs->source, &st);
    struct dfs_node *root = ck ? dfs_ckpt_root_new(fs, NULL, "", ck) : NULL;
    if (!root) {
        if (ck)
            dfs_ckpt_retire(fs, ck);
        pthread_mutex_unlock(&fs->scan_lock);
        return -ENOMEM;
    }
    dfs_log(LOG_INFO, "%s: .metadata changed: the checkpoint is read anew", fs->source);
    pthread_rwlock_wrlock(&fs->lock);
    dfs_map_swap_root(fs, root);
    pthread_rwlock_unlock(&fs->lock);
    pthread_mutex_unlock(&fs->scan_lock);
    dfs_ckpt_retire(fs, old);
    return 0;
}

/* A regular file, or a link to one: a folder or a dangling link whose name
 * ends in .safetensors is not a checkpoint's file. */
static int regular(int dirfd, const struct dirent *de)
{
    struct stat st;
    if (de->d_type == DT_REG)
        return 1;
    return (de->d_type == DT_LNK || de->d_type == DT_UNKNOWN) && fstatat(dirfd, de->d_name, &st, 0) == 0 &&
           S_ISREG(st.st_mode);
}

/* SOURCE is one checkpoint when it has .metadata, or the files of another
 * layout libdcp reads (rank-local metadata, safetensors, per-rank torch.save
 * files of DTensors, or bare .distcp files, for which dcp_open explains what
 * is missing). */
static int source_is_checkpoint(struct dfs *fs, struct stat *meta)
{
    if (dfs_has_metadata(fs->srcfd, ".", meta))
        return 1;
    DIR *d = open_rel(fs->srcfd, ".");
    if (!d)
        return 0;
    int yes = 0;
    struct dirent *de;
    while (!yes && (de = readdir(d))) {
        const char *nm = de->d_name;
        if ((ends_with(nm, ".distcp") || ends_with(nm, ".safetensors") ||
             (strncmp(nm, "__", 2) == 0 && ends_with(nm, ".metadata")) || dcp_is_rank_file(nm)) &&
            regular(dirfd(d), de))
            yes = 1;
    }
    closedir(d);
    if (yes && fstat(fs->srcfd, meta) < 0)
        return 0;
    return yes;
}

int dfs_source_init(struct dfs *fs, char *errbuf, size_t errlen)
{
    struct stat meta;
    if (source_is_checkpoint(fs, &meta)) {
        char *why = NULL;
        if (is_partial(fs, ".", &why) > 0) {   /* never served as if complete */
            snprintf(errbuf, errlen, "%s", why);
            free(why);
            return -1;
        }
        fs->folder_mode = 0;
        struct dfs_ckpt *ck = dfs_ckpt_new(fs, fs->source, &meta);
        struct dfs_node *root = ck ? dfs_ckpt_root_new(fs, NULL, "", ck) : NULL;
        if (!root) {
            snprintf(errbuf, errlen, "out of memory");
            return -1;
        }
        fs->root = root;
        dfs_map_insert(fs, root);
        /* Open now, so a checkpoint that cannot be read fails the mount with its reason. */
        if (dfs_ckpt_ensure(fs, ck) < 0) {
            errbuf[0] = '\0';   /* dfs_ckpt_ensure logged why */
            return -1;
        }
        return 0;
    }
    fs->folder_mode = 1;
    /* One catalog serves every checkpoint below SOURCE, and each open checks
     * only its own folder: a catalog inside one would be written by the
     * others' opens. Then none uses it (parsed at each open). */
    dcp_error cerr;
    if (!fs->opt.no_catalog && dcp_catalog_check_folder(fs->opt.catalog, fs->source, &cerr) < 0) {
        dfs_log(LOG_WARNING, "%s: not used", cerr.msg);
        fs->opt.no_catalog = 1;
    }
    struct dfs_node *root = make_scandir(fs, NULL, "", ".", 0);
    if (!root) {
        snprintf(errbuf, errlen, "out of memory");
        return -1;
    }
    fs->root = root;
    dfs_map_insert(fs, root);
    if (dfs_scan_refresh(fs, root) < 0) {
        snprintf(errbuf, errlen, "%s: cannot scan the folder", fs->source);
        return -1;
    }
    /* Mounted anyway (a save may come), but a mistyped SOURCE should not pass
     * silently: nothing below it but plain files is said once. */
    size_t found = 0;
    for (size_t i = 0; i < root->nkids; i++)
        found += root->kids[i]->type != DFS_N_PASSTHRU;
    if (!found)
        dfs_log(LOG_WARNING, "%s: no checkpoint below it yet (no .metadata, __R.metadata or .safetensors files within "
                             "%d folder levels): mounted, and checkpoints saved there later appear",
                fs->source, fs->opt.max_depth);
    return 0;
}
