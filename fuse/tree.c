/* dcpfs: nodes, the inode map, and the key tree of one checkpoint.
 *
 * Inode numbers are a 64-bit hash (xxh3) of the mount-relative path, chained
 * component by component, so the same SOURCE mounts with the same inode
 * numbers every time. A hash that is taken (or 0/1, which FUSE reserves) is
 * rehashed with the next seed; the tree is built in metadata order, so even
 * that rare case is repeatable.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "dcpfs.h"
#include "names.h"

#define ROOT_PHASH 0x646370667321ULL   /* "dcpfs!" */

/* ------------------------------------------------------------------ nodes */

struct dfs_node *dfs_node_new(struct dfs *fs, struct dfs_node *parent, const char *name,
                              size_t namelen, enum dfs_ntype type)
{
    struct dfs_node *n = calloc(1, sizeof *n + namelen + 1);
    if (!n)
        return NULL;
    n->name = (char *)(n + 1);
    memcpy(n->name, name, namelen);
    n->name[namelen] = '\0';
    n->parent = parent;
    n->type = type;
    n->ck = parent ? parent->ck : NULL;
    atomic_init(&n->size, -1);
    n->phash = parent ? XXH3_64bits_withSeed(name, namelen, parent->phash) : ROOT_PHASH;
    pthread_mutex_lock(&fs->alloc_lock);
    n->all_next = fs->all;
    fs->all = n;
    fs->nnodes++;
    pthread_mutex_unlock(&fs->alloc_lock);
    return n;
}

int dfs_add_kid(struct dfs_node *dir, struct dfs_node *kid)
{
    if (dir->nkids == dir->kcap) {
        size_t cap = dir->kcap ? 2 * dir->kcap : 4;
        struct dfs_node **k = realloc(dir->kids, cap * sizeof *k);
        if (!k)
            return -ENOMEM;
        dir->kids = k;
        dir->kcap = cap;
    }
    dir->kids[dir->nkids++] = kid;
    if (dfs_is_dir(kid))
        dir->nsubdirs++;
    return 0;
}

int dfs_is_dir(const struct dfs_node *n)
{
    return n->type == DFS_N_SCANDIR || n->type == DFS_N_CKPT || n->type == DFS_N_DIR;
}

static int cmp_kid(const void *a, const void *b)
{
    return strcmp((*(struct dfs_node *const *)a)->name, (*(struct dfs_node *const *)b)->name);
}

void dfs_sort_kids(struct dfs_node *dir)
{
    if (dir->nkids > 1)
        qsort(dir->kids, dir->nkids, sizeof *dir->kids, cmp_kid);
}

struct dfs_node *dfs_child(const struct dfs_node *dir, const char *name)
{
    size_t lo = 0, hi = dir->nkids;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name, dir->kids[mid]->name);
        if (c == 0)
            return dir->kids[mid];
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

/* -------------------------------------------------------------- inode map */

/* Open addressing, linear probing, load <= 1/2. Never shrinks. */
struct dfs_inomap {
    struct dfs_node **slots;
    size_t cap, count;
};

static size_t slot_of(uint64_t ino, size_t cap)
{
    return (size_t)(XXH3_64bits(&ino, sizeof ino) & (cap - 1));
}

static int map_grow(struct dfs_inomap *m)
{
    size_t cap = m->cap ? 2 * m->cap : 1024;
    struct dfs_node **s = calloc(cap, sizeof *s);
    if (!s)
        return -ENOMEM;
    for (size_t i = 0; i < m->cap; i++) {
        struct dfs_node *n = m->slots[i];
        if (!n)
            continue;
        size_t j = slot_of(n->ino, cap);
        while (s[j])
            j = (j + 1) & (cap - 1);
        s[j] = n;
    }
    free(m->slots);
    m->slots = s;
    m->cap = cap;
    return 0;
}

struct dfs_node *dfs_map_get(struct dfs *fs, uint64_t ino)
{
    struct dfs_inomap *m = fs->map;
    if (!m || !m->cap)
        return NULL;
    for (size_t j = slot_of(ino, m->cap);; j = (j + 1) & (m->cap - 1)) {
        struct dfs_node *n = m->slots[j];
        if (!n)
            return NULL;
        if (n->ino == ino)
            return n;
    }
}

int dfs_map_insert(struct dfs *fs, struct dfs_node *n)
{
    if (!fs->map) {
        fs->map = calloc(1, sizeof *fs->map);
        if (!fs->map)
            return -ENOMEM;
    }
    struct dfs_inomap *m = fs->map;
    if (2 * (m->count + 1) > m->cap && map_grow(m) < 0)
        return -ENOMEM;
    uint64_t ino = n->phash;
    if (n == fs->root) {
        ino = FUSE_ROOT_ID;
    } else {
        /* Collision check: 0 and 1 are reserved, and a path hash must not be taken. */
        for (uint64_t seed = 1; ino <= FUSE_ROOT_ID || dfs_map_get(fs, ino); seed++)
            ino = XXH3_64bits_withSeed(&n->phash, sizeof n->phash, seed);
    }
    n->ino = ino;
    size_t j = slot_of(ino, m->cap);
    while (m->slots[j])
        j = (j + 1) & (m->cap - 1);
    m->slots[j] = n;
    m->count++;
    return 0;
}

/* ------------------------------------------------------------- key trees */

/* Directories of the tree being built: (parent, name) -> node. */
struct dirset {
    struct dfs_node **slots;
    size_t cap, count;
};

static uint64_t dir_hash(const struct dfs_node *parent, const char *name, size_t len)
{
    return XXH3_64bits_withSeed(name, len, (uint64_t)(uintptr_t)parent);
}

static struct dfs_node *dirset_get(struct dirset *d, const struct dfs_node *parent, const char *name, size_t len)
{
    if (!d->cap)
        return NULL;
    for (size_t j = dir_hash(parent, name, len) & (d->cap - 1);; j = (j + 1) & (d->cap - 1)) {
        struct dfs_node *n = d->slots[j];
        if (!n)
            return NULL;
        if (n->parent == parent && strncmp(n->name, name, len) == 0 && n->name[len] == '\0')
            return n;
    }
}

static int dirset_put(struct dirset *d, struct dfs_node *n)
{
    if (2 * (d->count + 1) > d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 256;
        struct dfs_node **s = calloc(cap, sizeof *s);
        if (!s)
            return -ENOMEM;
        for (size_t i = 0; i < d->cap; i++) {
            struct dfs_node *o = d->slots[i];
            if (!o)
                continue;
            size_t j = dir_hash(o->parent, o->name, strlen(o->name)) & (cap - 1);
            while (s[j])
                j = (j + 1) & (cap - 1);
            s[j] = o;
        }
        free(d->slots);
        d->slots = s;
        d->cap = cap;
    }
    size_t j = dir_hash(n->parent, n->name, strlen(n->name)) & (d->cap - 1);
    while (d->slots[j])
        j = (j + 1) & (d->cap - 1);
    d->slots[j] = n;
    d->count++;
    return 0;
}

/* The directory that holds key's last component, creating directories as
 * needed; last and lastlen receive the last component. NULL with *rc set on failure
 * (rc = 1: the key cannot be shown). */
static struct dfs_node *walk_dirs(struct dfs *fs, struct dirset *ds, struct dfs_node *root,
                                  const char *key, const char **last, size_t *lastlen, int *rc)
{
    char enc[DFS_NAME_MAX + 1];
    struct dfs_node *dir = root;
    const char *p = key;
    for (;;) {
        const char *dot = strchr(p, '.');
        if (!dot) {
            *last = p;
            *lastlen = strlen(p);
            return dir;
        }
        int n = dfs_name_encode(p, (size_t)(dot - p), enc, sizeof enc);
        if (n < 0) {
            *rc = 1;
            return NULL;
        }
        struct dfs_node *d = dirset_get(ds, dir, enc, (size_t)n);
        if (!d) {
            d = dfs_node_new(fs, dir, enc, (size_t)n, DFS_N_DIR);
            if (!d || dirset_put(ds, d) < 0 || dfs_add_kid(dir, d) < 0) {
                *rc = -ENOMEM;
                return NULL;
            }
        }
        dir = d;
        p = dot + 1;
    }
}

static int add_entry_file(struct dfs *fs, struct dirset *ds, struct dfs_node *dir, const dcp_entry *e,
                          const char *last, size_t lastlen)
{
    char name[DFS_NAME_MAX + 1];
    int n = dfs_name_encode(last, lastlen, name, sizeof name);
    if (n < 0)
        return 1;
    int npy = fs->opt.view == DFS_VIEW_NPY && e->kind == DCP_KIND_TENSOR;
    const char *suffix = npy ? DFS_NPY_SUFFIX : dirset_get(ds, dir, name, (size_t)n) ? DFS_COLLIDE_SUFFIX : "";
    size_t sl = strlen(suffix);
    if ((size_t)n + sl > DFS_NAME_MAX)
        return 1;
    memcpy(name + n, suffix, sl + 1);
    struct dfs_node *f = dfs_node_new(fs, dir, name, (size_t)n + sl, DFS_N_ENTRY);
    if (!f)
        return -ENOMEM;
    f->entry = e;
    if (npy && dfs_npy_header(e, &f->npy_hdr, &f->npy_hdr_len) < 0)
        return -ENOMEM;
    uint64_t nbytes;
    dcp_error err;
    if (dcp_entry_nbytes(f->ck->ck, e, &nbytes, &err) == 0 && nbytes <= (uint64_t)INT64_MAX - f->npy_hdr_len)
        atomic_store(&f->size, (int64_t)(nbytes + f->npy_hdr_len));
    return dfs_add_kid(dir, f);
}

static int is_data_name(const char *name, struct dfs_ckpt *ck)
{
    size_t n = strlen(name);
    if (n > 7 && strcmp(name + n - 7, ".distcp") == 0)
        return 1;
    if (n > 12 && strcmp(name + n - 12, ".safetensors") == 0)
        return 1;
    if (n > 11 && strncmp(name, "__", 2) == 0 && strcmp(name + n - 9, ".metadata") == 0)
        return 1;
    for (size_t i = 0; i < ck->nfiles; i++)
        if (strcmp(dcp_file_name(ck->ck, (uint32_t)i), name) == 0)
            return 1;
    return 0;
}

/* Plain files beside the data (Megatron's metadata.json and common.pt, a
 * Hugging Face config.json): shown as they are, unless a key takes the name. */
static int add_passthrough(struct dfs *fs, struct dfs_ckpt *ck, struct dfs_node *root)
{
    int fd = open(ck->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return 0;
    }
    dfs_sort_kids(root);
    struct dfs_node keys = *root;   /* the key tree's names only, sorted */
    int rc = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        struct stat st;
        if (de->d_name[0] == '.' || is_data_name(de->d_name, ck))
            continue;
        if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode))
            continue;
        keys.kids = root->kids;     /* dfs_add_kid may have moved the array */
        if (dfs_child(&keys, de->d_name)) {
            dfs_log(LOG_WARNING, "%s/%s: not shown: a key has the same name", ck->path, de->d_name);
            continue;
        }
        struct dfs_node *n = dfs_node_new(fs, root, de->d_name, strlen(de->d_name), DFS_N_PASSTHRU);
        if (!n) {
            rc = -ENOMEM;
            break;
        }
        n->pst = st;
        atomic_store(&n->size, (int64_t)st.st_size);
        if ((rc = dfs_add_kid(root, n)) < 0)
            break;
    }
    closedir(d);
    return rc;
}

static void sort_tree(struct dfs_node *dir)
{
    dfs_sort_kids(dir);
    for (size_t i = 0; i < dir->nkids; i++)
        if (dir->kids[i]->type == DFS_N_DIR)
            sort_tree(dir->kids[i]);
}

static int publish_tree(struct dfs *fs, struct dfs_node *dir)
{
    for (size_t i = 0; i < dir->nkids; i++) {
        int rc = dfs_map_insert(fs, dir->kids[i]);
        if (rc < 0)
            return rc;
    }
    for (size_t i = 0; i < dir->nkids; i++)
        if (dir->kids[i]->type == DFS_N_DIR) {
            int rc = publish_tree(fs, dir->kids[i]);
            if (rc < 0)
                return rc;
        }
    return 0;
}

/* Build the key tree into `shadow` (a stand-in for ck->root with the same
 * path hash, invisible to other threads). */
static int build_tree(struct dfs *fs, struct dfs_ckpt *ck, struct dfs_node *shadow)
{
    dcp_checkpoint *c = ck->ck;
    size_t n = dcp_num_entries(c);
    struct dfs_node **parents = calloc(n ? n : 1, sizeof *parents);
    struct dirset ds = {0};
    int rc = parents ? 0 : -ENOMEM;
    /* Directories first, so a key that is also a prefix finds its directory. */
    for (size_t i = 0; rc == 0 && i < n; i++) {
        const dcp_entry *e = dcp_entry_at(c, i);
        const char *last;
        size_t lastlen;
        int r = 0;
        parents[i] = walk_dirs(fs, &ds, shadow, e->key, &last, &lastlen, &r);
        if (r < 0)
            rc = r;
        else if (r > 0)
            dfs_log(LOG_WARNING, "%s: %s: not shown: a key component is longer than %d bytes once encoded",
                    ck->path, e->key, DFS_NAME_MAX);
    }
    for (size_t i = 0; rc == 0 && i < n; i++) {
        if (!parents[i])
            continue;
        const dcp_entry *e = dcp_entry_at(c, i);
        const char *last = strrchr(e->key, '.');
        last = last ? last + 1 : e->key;
        int r = add_entry_file(fs, &ds, parents[i], e, last, strlen(last));
        if (r < 0)
            rc = r;
        else if (r > 0)
            dfs_log(LOG_WARNING, "%s: %s: not shown: its file name is longer than %d bytes",
                    ck->path, e->key, DFS_NAME_MAX);
    }
    if (rc == 0)
        rc = add_passthrough(fs, ck, shadow);
    if (rc == 0)
        rc = dfs_stview_add(fs, shadow);
    if (rc == 0)
        sort_tree(shadow);
    free(ds.slots);
    free(parents);
    return rc;
}

/* ------------------------------------------------------------ checkpoints */

struct dfs_ckpt *dfs_ckpt_new(struct dfs *fs, const char *path, const struct stat *meta_st)
{
    struct dfs_ckpt *ck = calloc(1, sizeof *ck);
    if (!ck || !(ck->path = strdup(path))) {
        free(ck);
        return NULL;
    }
    if (meta_st)
        ck->meta_st = *meta_st;
    pthread_mutex_init(&ck->lock, NULL);
    atomic_init(&ck->state, 0);
    pthread_mutex_lock(&fs->alloc_lock);
    ck->next = fs->ckpts;
    fs->ckpts = ck;
    pthread_mutex_unlock(&fs->alloc_lock);
    return ck;
}

static int open_and_build(struct dfs *fs, struct dfs_ckpt *ck)
{
    dcp_error err;
    dcp_open_options oo = {.flags = fs->opt.no_catalog ? 0 : DCP_OPEN_CATALOG, .catalog = fs->opt.catalog};
    if (dcp_open_ex(ck->path, &oo, &ck->ck, &err) < 0) {
        dfs_log(LOG_ERR, "%s", err.msg);
        return -EIO;
    }
    ck->nfiles = dcp_num_files(ck->ck);
    ck->file_sizes = malloc((ck->nfiles ? ck->nfiles : 1) * sizeof *ck->file_sizes);
    if (!ck->file_sizes)
        return -ENOMEM;
    for (size_t i = 0; i < ck->nfiles; i++)
        atomic_init(&ck->file_sizes[i], -1);

    struct dfs_node *root = ck->root;
    struct dfs_node shadow = *root;
    shadow.kids = NULL;
    shadow.nkids = shadow.kcap = shadow.nsubdirs = 0;
    /* Children are created with parent = &shadow; re-parent them to the real root below. */
    int rc = build_tree(fs, ck, &shadow);
    for (size_t i = 0; i < shadow.nkids; i++)
        shadow.kids[i]->parent = root;
    if (rc < 0) {
        free(shadow.kids);
        return rc;
    }
    pthread_rwlock_wrlock(&fs->lock);
    struct dfs_node **old = root->kids;
    root->kids = shadow.kids;
    root->nkids = shadow.nkids;
    root->kcap = shadow.kcap;
    root->nsubdirs = shadow.nsubdirs;
    rc = publish_tree(fs, root);
    pthread_rwlock_unlock(&fs->lock);
    free(old);
    return rc;
}

int dfs_ckpt_ensure(struct dfs *fs, struct dfs_ckpt *ck)
{
    if (atomic_load(&ck->state) == 1)
        return 0;
    pthread_mutex_lock(&ck->lock);
    int rc = 0;
    if (atomic_load(&ck->state) == 1)
        goto out;
    if (atomic_load(&ck->state) == -1) {
        /* Retry only when .metadata changed (a save that was still writing it). */
        struct stat st;
        char *p = malloc(strlen(ck->path) + sizeof "/.metadata");
        int same = 0;
        if (p) {
            strcpy(stpcpy(p, ck->path), "/.metadata");
            same = stat(p, &st) == 0 && st.st_size == ck->failed_size &&
                   st.st_mtim.tv_sec == ck->failed_mtime.tv_sec &&
                   st.st_mtim.tv_nsec == ck->failed_mtime.tv_nsec;
            free(p);
        }
        if (same) {
            rc = -EIO;
            goto out;
        }
    }
    if (ck->ck) {   /* a failed build after a good open: start over */
        dfs_verify_free(ck);
        dcp_close(ck->ck);
        ck->ck = NULL;
        free(ck->file_sizes);
        ck->file_sizes = NULL;
    }
    rc = open_and_build(fs, ck);
    if (rc == 0) {
        atomic_store(&ck->state, 1);
    } else {
        struct stat st;
        char *p = malloc(strlen(ck->path) + sizeof "/.metadata");
        if (p) {
            strcpy(stpcpy(p, ck->path), "/.metadata");
            if (stat(p, &st) == 0) {
                ck->failed_size = st.st_size;
                ck->failed_mtime = st.st_mtim;
            }
            free(p);
        }
        atomic_store(&ck->state, -1);
        if (rc != -ENOMEM)
            rc = -EIO;
    }
out:
    pthread_mutex_unlock(&ck->lock);
    return rc;
}

/* ------------------------------------------------------------------ unmount */

void dfs_free_all(struct dfs *fs)
{
    struct dfs_node *n = fs->all;
    while (n) {
        struct dfs_node *next = n->all_next;
        if (n->vops && n->vops->destroy)
            n->vops->destroy(n);
        free(n->kids);
        free(n->npy_hdr);
        dfs_scan_free(n->scan);
        free(n);
        n = next;
    }
    fs->all = NULL;
    struct dfs_ckpt *ck = fs->ckpts;
    while (ck) {
        struct dfs_ckpt *next = ck->next;
        dfs_verify_free(ck);
        dcp_close(ck->ck);
        free(ck->file_sizes);
        free(ck->path);
        pthread_mutex_destroy(&ck->lock);
        free(ck);
        ck = next;
    }
    fs->ckpts = NULL;
    if (fs->map) {
        free(fs->map->slots);
        free(fs->map);
        fs->map = NULL;
    }
}
