/* dcpfs: nodes, the inode map, and the key tree of one checkpoint.
 *
 * Inode numbers are a 64-bit hash (xxh3) of the mount-relative path, chained
 * component by component, so the same SOURCE mounts with the same inode
 * numbers every time. A hash that is taken (or 0/1, which FUSE reserves) is
 * rehashed with the next seed (nodes are made as they are looked up, so that
 * rare case depends on the order of lookups).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "dcpfs.h"
#include "names.h"

#define ROOT_PHASH 0x646370667321ULL   /* "dcpfs!" */

/* ------------------------------------------------------------------ nodes */

static struct dfs_node *node_new(struct dfs *fs, struct dfs_node *parent, const char *name, size_t namelen,
                                 enum dfs_ntype type, struct dfs_ckpt *ck)
{
    struct dfs_node *n = calloc(1, sizeof *n + namelen + 1);
    if (!n)
        return NULL;
    n->name = (char *)(n + 1);
    memcpy(n->name, name, namelen);
    n->name[namelen] = '\0';
    n->parent = parent;
    n->type = type;
    n->ck = ck;
    n->gen = ck ? ck->gen : 0;
    atomic_init(&n->size, -1);
    n->phash = parent ? XXH3_64bits_withSeed(name, namelen, parent->phash) : ROOT_PHASH;
    pthread_mutex_lock(&fs->alloc_lock);
    /* Another save of SOURCE (single-checkpoint mode): its keys chain from
     * another hash than the first's, so they never take the inode numbers of
     * the old ones, which are freed while the new ones live. */
    if (!parent && fs->root)
        n->phash = XXH3_64bits_withSeed(&n->phash, sizeof n->phash, ++fs->saves);
    struct dfs_node **list = ck ? &ck->nodes : &fs->all;
    n->all_next = *list;
    *list = n;
    fs->nnodes++;
    pthread_mutex_unlock(&fs->alloc_lock);
    return n;
}

struct dfs_node *dfs_node_new(struct dfs *fs, struct dfs_node *parent, const char *name,
                              size_t namelen, enum dfs_ntype type)
{
    return node_new(fs, parent, name, namelen, type, parent ? parent->ck : NULL);
}

struct dfs_node *dfs_ckpt_root_new(struct dfs *fs, struct dfs_node *parent, const char *name, struct dfs_ckpt *ck)
{
    struct dfs_node *n = node_new(fs, parent, name, strlen(name), DFS_N_CKPT, ck);
    if (n)
        ck->root = n;
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
    return n->type == DFS_N_SCANDIR || n->type == DFS_N_CKPT || n->type == DFS_N_DIR || n->type == DFS_N_PARTDIR ||
           n->type == DFS_N_PARTIAL;
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
    /* A checkpoint's keys chain from the inode number its root got: those of
     * a save under the same name as one still alive (its root's number taken)
     * never take the old keys' numbers, which are freed before the new. */
    if (n->type == DFS_N_CKPT && n != fs->root)
        n->phash = ino;
    size_t j = slot_of(ino, m->cap);
    while (m->slots[j])
        j = (j + 1) & (m->cap - 1);
    m->slots[j] = n;
    m->count++;
    return 0;
}

/* Take n out of the map (caller holds fs->lock for writing); a node that is
 * not there (never inserted, or a root another stands in for) is left. The
 * entries after it move back into the hole, so probes still find them. */
static void map_remove(struct dfs *fs, const struct dfs_node *n)
{
    struct dfs_inomap *m = fs->map;
    if (!m || !m->cap || !n->ino)
        return;
    size_t mask = m->cap - 1, j = slot_of(n->ino, m->cap);
    while (m->slots[j] && m->slots[j] != n)
        j = (j + 1) & mask;
    if (!m->slots[j])
        return;
    m->slots[j] = NULL;
    m->count--;
    for (size_t k = (j + 1) & mask; m->slots[k]; k = (k + 1) & mask) {
        size_t home = slot_of(m->slots[k]->ino, m->cap);
        if (((k - home) & mask) >= ((k - j) & mask)) {   /* the hole lies on its probe path */
            m->slots[j] = m->slots[k];
            m->slots[k] = NULL;
            j = k;
        }
    }
}

void dfs_map_swap_root(struct dfs *fs, struct dfs_node *root)
{
    struct dfs_inomap *m = fs->map;
    size_t j = slot_of(FUSE_ROOT_ID, m->cap);
    while (m->slots[j]->ino != FUSE_ROOT_ID)
        j = (j + 1) & (m->cap - 1);
    m->slots[j] = root;
    root->ino = FUSE_ROOT_ID;
    fs->root = root;
}

/* ------------------------------------------------------------- key trees */

/* The node named name in dir, made by a lookup or a listing (caller holds
 * fs->lock). The inode map finds it: the probe follows dfs_map_insert's
 * sequence (the path hash, then rehashes of it while taken by others). */
static struct dfs_node *find_node(struct dfs *fs, const struct dfs_node *dir, const char *name, size_t len)
{
    uint64_t phash = XXH3_64bits_withSeed(name, len, dir->phash), ino = phash;
    for (uint64_t seed = 1;; ino = XXH3_64bits_withSeed(&phash, sizeof phash, seed++)) {
        if (ino <= FUSE_ROOT_ID)
            continue;
        struct dfs_node *n = dfs_map_get(fs, ino);
        if (!n)
            return NULL;
        if (n->parent == dir && n->gen == dir->ck->gen && strncmp(n->name, name, len) == 0 && n->name[len] == '\0')
            return n;
    }
}

/* The key prefix of a key-tree directory: its path below the checkpoint root,
 * decoded, joined with '.' ("" for the root). malloc'd; NULL on ENOMEM or a
 * name that does not decode (none does: names are made by encoding). */
static char *dir_prefix(const struct dfs_node *dir)
{
    size_t len = 0, depth = 0;
    for (const struct dfs_node *d = dir; d->type == DFS_N_DIR; d = d->parent, depth++)
        len += strlen(d->name) + 1;   /* decoding never lengthens a name */
    const struct dfs_node **chain = malloc((depth ? depth : 1) * sizeof *chain);
    char *p = malloc(len + 1), comp[DFS_NAME_MAX + 1];
    if (!p || !chain) {
        free(p);
        free(chain);
        return NULL;
    }
    size_t i = depth, used = 0;
    for (const struct dfs_node *d = dir; d->type == DFS_N_DIR; d = d->parent)
        chain[--i] = d;
    for (i = 0; i < depth; i++) {
        int n = dfs_name_decode(chain[i]->name, comp, sizeof comp);
        if (n < 0) {
            free(p);
            free(chain);
            return NULL;
        }
        if (i)
            p[used++] = '.';
        memcpy(p + used, comp, (size_t)n);
        used += (size_t)n;
    }
    p[used] = '\0';
    free(chain);
    return p;
}

/* One child of a directory, as the model's keys show it. */
struct kid {
    const char *comp;        /* the key component (not NUL-terminated) */
    size_t len;
    const dcp_entry *leaf;   /* the entry whose key ends with this component */
    int dir;                 /* some key goes on below it */
    int as_dir;              /* the node to be is that directory (else leaf's file) */
    /* the node to be, prepared outside fs->lock */
    const char *name;        /* its encoded name (and suffix) */
    size_t name_at;          /* list_dir: where name is in the names being gathered (they move) */
    char *npy_hdr;
    uint32_t npy_hdr_len;
    int64_t size;
};

static int oom(dcp_error *err)
{
    err->code = ENOMEM;
    snprintf(err->msg, sizeof err->msg, "out of memory");
    return -1;
}

/* Is there a key that starts with prefix? */
static int has_prefix(dcp_checkpoint *c, const char *prefix, dcp_error *err)
{
    const dcp_entry *e;
    if (dcp_seek(c, prefix, &e, err) < 0)
        return -1;
    return e && strncmp(e->key, prefix, strlen(prefix)) == 0;
}

/* The children of the directory whose keys start with pre ("" or "a.b."):
 * one seek per child (a directory's keys are skipped in one go, since
 * "a.b.x" < "a.b/" sorts every key below "a.b." before "a.b/"). 1 when
 * there are more than max (0: no limit). */
static int collect(dcp_checkpoint *c, const char *pre, size_t max, struct kid **out, size_t *nout, dcp_error *err)
{
    size_t plen = strlen(pre), n = 0, cap = 0, fcap = plen + 256;
    struct kid *k = NULL;
    char *from = malloc(fcap);
    int rc = from ? 0 : oom(err);
    if (from)
        memcpy(from, pre, plen + 1);
    while (rc == 0) {
        const dcp_entry *e;
        if (dcp_seek(c, from, &e, err) < 0) {
            rc = -1;
            break;
        }
        if (!e || strncmp(e->key, pre, plen) != 0)
            break;
        if (max && n == max) {
            rc = 1;
            break;
        }
        const char *rest = e->key + plen, *dot = strchr(rest, '.');
        size_t clen = dot ? (size_t)(dot - rest) : strlen(rest);
        if (n == cap) {
            struct kid *g = realloc(k, (cap = cap ? 2 * cap : 16) * sizeof *g);
            if (!g) {
                rc = oom(err);
                break;
            }
            k = g;
        }
        k[n++] = (struct kid){.comp = rest, .len = clen, .leaf = dot ? NULL : e, .dir = dot != NULL};
        /* next: the key right after this one, or after every key below this component */
        size_t need = dot ? plen + clen + 2 : strlen(e->key) + 2;
        if (need > fcap) {
            char *g = realloc(from, fcap = 2 * need);
            if (!g) {
                rc = oom(err);
                break;
            }
            from = g;
        }
        if (dot) {
            memcpy(from + plen, rest, clen);
            memcpy(from + plen + clen, "/", 2);   /* '/' = '.' + 1 */
        } else {
            memcpy(from, e->key, need - 2);
            memcpy(from + need - 2, "\x01", 2);
        }
    }
    free(from);
    if (rc != 0) {
        free(k);
        return rc;
    }
    *out = k;
    *nout = n;
    return 0;
}

static int by_comp(const void *a, const void *b)
{
    const struct kid *x = a, *y = b;
    int c = memcmp(x->comp, y->comp, x->len < y->len ? x->len : y->len);
    return c ? c : (x->len > y->len) - (x->len < y->len);
}

/* Name a child into name (DFS_NAME_MAX + 1 bytes) and prepare its node's
 * data (npy header, size). 1 when it cannot be shown (too long once
 * encoded), -errno on failure. */
static int prepare_kid(struct dfs *fs, struct dfs_ckpt *ck, struct kid *k, int is_dir, char *name)
{
    int n = dfs_name_encode(k->comp, k->len, name, DFS_NAME_MAX + 1);
    k->name = name;
    if (n < 0)
        return 1;
    if (is_dir)
        return 0;
    const dcp_entry *e = k->leaf;
    int npy = fs->opt.view == DFS_VIEW_NPY && e->kind == DCP_KIND_TENSOR;
    const char *suffix = npy ? DFS_NPY_SUFFIX : k->dir ? DFS_COLLIDE_SUFFIX : "";
    size_t sl = strlen(suffix);
    if ((size_t)n + sl > DFS_NAME_MAX)
        return 1;
    memcpy(name + n, suffix, sl + 1);
    if (npy && dfs_npy_header(e, &k->npy_hdr, &k->npy_hdr_len) < 0)
        return -ENOMEM;
    uint64_t nbytes;
    dcp_error err;
    k->size = -1;
    if (dcp_entry_nbytes(ck->ck, e, &nbytes, &err) == 0 && nbytes <= (uint64_t)INT64_MAX - k->npy_hdr_len)
        k->size = (int64_t)(nbytes + k->npy_hdr_len);
    return 0;
}

/* The node of a prepared child, found or made and put in the inode map
 * (caller holds fs->lock for writing). Takes k->npy_hdr. */
static struct dfs_node *place_kid(struct dfs *fs, struct dfs_node *dir, struct kid *k, int is_dir, int *rc)
{
    size_t len = strlen(k->name);
    struct dfs_node *n = find_node(fs, dir, k->name, len);
    if (n)
        return n;
    n = dfs_node_new(fs, dir, k->name, len, is_dir ? DFS_N_DIR : DFS_N_ENTRY);
    if (!n || (*rc = dfs_map_insert(fs, n)) < 0) {
        *rc = -ENOMEM;
        return NULL;
    }
    if (!is_dir) {
        n->entry = k->leaf;
        n->npy_hdr = k->npy_hdr;
        n->npy_hdr_len = k->npy_hdr_len;
        k->npy_hdr = NULL;
        atomic_store(&n->size, k->size);
    }
    return n;
}

static void log_hidden(struct dfs_ckpt *ck, const char *pre, const struct kid *k, int is_dir)
{
    dfs_log(LOG_WARNING, "%s: %s%.*s%s: not shown: %s longer than %d bytes once encoded", ck->path, pre,
            (int)k->len, k->comp, is_dir ? ".*" : "", is_dir ? "a key component is" : "its file name is",
            DFS_NAME_MAX);
}

/* dir's children become kids (sorted here; the old array freed), dir listed. */
static void install_kids(struct dfs *fs, struct dfs_node *dir, struct dfs_node **kids, size_t nkids, size_t kcap,
                         size_t nsub)
{
    struct dfs_node tmp = {0};
    tmp.kids = kids;
    tmp.nkids = nkids;
    dfs_sort_kids(&tmp);
    pthread_rwlock_wrlock(&fs->lock);
    struct dfs_node **old = dir->kids;
    dir->kids = kids;
    dir->nkids = nkids;
    dir->kcap = kcap;
    dir->nsubdirs = nsub;
    atomic_store(&dir->listed, 1);
    pthread_rwlock_unlock(&fs->lock);
    free(old);
}

/* List dir (a checkpoint root or a key-tree directory) from the model and
 * publish its children; extra (the root's plain files) is called before
 * publication to add more. With max, give up (1) past max children.
 * Serialised by fs->list_lock. */
static int list_dir(struct dfs *fs, struct dfs_node *dir, size_t max,
                    int (*extra)(struct dfs *, struct dfs_node *, struct dfs_node ***, size_t *, size_t *))
{
    struct dfs_ckpt *ck = dir->ck;
    dcp_error err;
    char *prefix = dir->type == DFS_N_DIR ? dir_prefix(dir) : strdup("");
    char *pre = prefix ? malloc(strlen(prefix) + 2) : NULL;
    if (!pre) {
        free(prefix);
        return -ENOMEM;
    }
    strcpy(pre, prefix);
    if (dir->type == DFS_N_DIR)
        strcat(pre, ".");   /* the root's keys have no prefix; "%" (an empty component) has "." */
    free(prefix);
    struct kid *k = NULL;
    size_t nk = 0, m = 0;
    int rc = collect(ck->ck, pre, max, &k, &nk, &err);
    if (rc != 0) {
        if (rc < 0)
            dfs_log(LOG_ERR, "%s", err.msg);
        free(pre);
        return rc > 0 ? 1 : err.code == ENOMEM ? -ENOMEM : -EIO;
    }
    /* A component may come twice (a key "a.b" and keys below "a.b."), not
     * always side by side: sort and merge. */
    qsort(k, nk, sizeof *k, by_comp);
    for (size_t i = 0; i < nk; i++) {
        if (m && by_comp(&k[m - 1], &k[i]) == 0) {
            k[m - 1].dir |= k[i].dir;
            if (k[i].leaf)
                k[m - 1].leaf = k[i].leaf;
            continue;
        }
        k[m++] = k[i];
    }
    /* Each component makes a directory, a file, or both (the file then has
     * a suffix); named and prepared outside fs->lock. */
    size_t ns = 0, nused = 0, ncap = 0;
    struct kid *spec = malloc((2 * m + 1) * sizeof *spec);
    char *names = NULL, name[DFS_NAME_MAX + 1];   /* every name, one after the other */
    rc = spec ? 0 : -ENOMEM;
    for (size_t i = 0; rc == 0 && i < m; i++) {
        for (int as_dir = 1; as_dir >= 0 && rc == 0; as_dir--) {
            if (as_dir ? !k[i].dir : !k[i].leaf)
                continue;
            struct kid *x = &spec[ns];
            *x = k[i];
            x->as_dir = as_dir;
            x->npy_hdr = NULL;
            int r = prepare_kid(fs, ck, x, as_dir, name);
            size_t len = r == 0 ? strlen(name) + 1 : 0;
            if (r == 0 && nused + len > ncap) {
                char *g = realloc(names, ncap = 2 * (nused + len) + 4096);
                if (!g)
                    r = -ENOMEM;
                else
                    names = g;
            }
            if (r < 0) {
                free(x->npy_hdr);
                rc = r;
            } else if (r > 0) {
                log_hidden(ck, pre, x, as_dir);
            } else {
                memcpy(names + nused, name, len);
                x->name_at = nused;   /* names may move until every one is in */
                nused += len;
                ns++;
            }
        }
    }
    for (size_t i = 0; rc == 0 && i < ns; i++)
        spec[i].name = names + spec[i].name_at;
    struct dfs_node **kids = NULL;
    size_t nkids = 0, kcap = ns + 1, nsub = 0;
    if (rc == 0 && !(kids = malloc(kcap * sizeof *kids)))
        rc = -ENOMEM;
    if (rc == 0) {
        pthread_rwlock_wrlock(&fs->lock);
        for (size_t i = 0; rc == 0 && i < ns; i++) {
            struct dfs_node *n = place_kid(fs, dir, &spec[i], spec[i].as_dir, &rc);
            if (n) {
                kids[nkids++] = n;
                nsub += spec[i].as_dir;
            }
        }
        pthread_rwlock_unlock(&fs->lock);
    }
    if (rc == 0 && extra)
        rc = extra(fs, dir, &kids, &nkids, &kcap);
    if (rc == 0) {
        install_kids(fs, dir, kids, nkids, kcap, nsub);
        kids = NULL;
    }
    for (size_t i = 0; spec && i < ns; i++)
        free(spec[i].npy_hdr);
    free(names);
    free(kids);
    free(spec);
    free(k);
    free(pre);
    return rc;
}

int dfs_dir_list(struct dfs *fs, struct dfs_node *dir, size_t max)
{
    pthread_mutex_lock(&fs->list_lock);
    int rc = atomic_load(&dir->listed) ? 0 : list_dir(fs, dir, max, NULL);
    pthread_mutex_unlock(&fs->list_lock);
    return rc;
}

void dfs_dir_list_if_small(struct dfs *fs, struct dfs_node *dir)
{
    if (atomic_load(&dir->listed) || atomic_load(&dir->large) || pthread_mutex_trylock(&fs->list_lock) != 0)
        return;
    if (!atomic_load(&dir->listed) && list_dir(fs, dir, DFS_LIST_ON_LOOKUP, NULL) == 1)
        atomic_store(&dir->large, 1);
    pthread_mutex_unlock(&fs->list_lock);
}

struct dfs_node *dfs_dir_lookup(struct dfs *fs, struct dfs_node *dir, const char *name, int *rc)
{
    *rc = 0;
    if (dir->type != DFS_N_DIR)
        return NULL;
    /* name = an encoded component and maybe a suffix (encoded names hold no '.') */
    const char *dot = strchr(name, '.');
    size_t blen = dot ? (size_t)(dot - name) : strlen(name);
    char base[DFS_NAME_MAX + 1], comp[DFS_NAME_MAX + 1], again[DFS_NAME_MAX + 1];
    if ((dot && strcmp(dot, DFS_NPY_SUFFIX) && strcmp(dot, DFS_COLLIDE_SUFFIX)) || blen > DFS_NAME_MAX)
        return NULL;
    memcpy(base, name, blen);
    base[blen] = '\0';
    int clen = dfs_name_decode(base, comp, sizeof comp);
    if (clen < 0 || dfs_name_encode(comp, (size_t)clen, again, sizeof again) < 0 || strcmp(again, base))
        return NULL;   /* no key component encodes to it */
    char *prefix = dir_prefix(dir);
    size_t plen = prefix ? strlen(prefix) : 0, klen = plen + 1 + (size_t)clen;
    char *key = prefix ? malloc(klen + 2) : NULL;
    if (!key) {
        free(prefix);
        *rc = -ENOMEM;
        return NULL;
    }
    memcpy(key, prefix, plen);
    key[plen] = '.';
    memcpy(key + plen + 1, comp, (size_t)clen);
    memcpy(key + klen, ".", 2);
    free(prefix);
    dcp_checkpoint *c = dir->ck->ck;
    dcp_error err;
    struct kid k = {.comp = key + plen + 1, .len = (size_t)clen};
    char kname[DFS_NAME_MAX + 1];
    struct dfs_node *n = NULL;
    const dcp_entry *e = NULL;
    int isdir = has_prefix(c, key, &err);   /* keys go on below "<key>." */
    key[klen] = '\0';
    if (isdir < 0 || ((dot || !isdir) && dcp_seek(c, key, &e, &err) < 0)) {
        dfs_log(LOG_ERR, "%s", err.msg);
        *rc = err.code == ENOMEM ? -ENOMEM : -EIO;
    } else if (!dot && isdir) {
        pthread_rwlock_wrlock(&fs->lock);
        n = prepare_kid(fs, dir->ck, &k, 1, kname) == 0 ? place_kid(fs, dir, &k, 1, rc) : NULL;
        pthread_rwlock_unlock(&fs->lock);
    } else if (e && !strcmp(e->key, key)) {
        /* the one name its file has: NAME.npy, NAME.data beside a directory, or NAME */
        k.leaf = e;
        k.dir = isdir;
        int r = prepare_kid(fs, dir->ck, &k, 0, kname);
        if (r < 0) {
            *rc = r;
        } else if (r == 0 && !strcmp(k.name, name)) {
            pthread_rwlock_wrlock(&fs->lock);
            n = place_kid(fs, dir, &k, 0, rc);
            pthread_rwlock_unlock(&fs->lock);
        }
        free(k.npy_hdr);
    }
    free(key);
    return n;
}

/* ------------------------------------------------------------ the root */

static int is_data_name(const char *name, struct dfs_ckpt *ck)
{
    size_t n = strlen(name);
    if (n > 7 && strcmp(name + n - 7, ".distcp") == 0)
        return 1;
    if (n > 12 && strcmp(name + n - 12, ".safetensors") == 0)
        return 1;
    if (n > 11 && strncmp(name, "__", 2) == 0 && strcmp(name + n - 9, ".metadata") == 0)
        return 1;
    /* torch-checkpointing, verl: every rank's file, used or not (step_1.pt), in
     * such a folder only: beside a .metadata a model_0.pt is the user's */
    const dcp_info *in = ck->ck ? dcp_get_info(ck->ck) : NULL;
    if (in && in->layout && strcmp(in->layout, "per-rank torch.save files") == 0 && dcp_is_rank_file(name))
        return 1;
    for (size_t i = 0; i < ck->nfiles; i++)
        if (strcmp(dcp_file_name(ck->ck, (uint32_t)i), name) == 0)
            return 1;
    return 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp((*(struct dfs_node *const *)a)->name, (*(struct dfs_node *const *)b)->name);
}

int dfs_push_kid(struct dfs *fs, struct dfs_node *n, struct dfs_node ***kids, size_t *nkids, size_t *kcap)
{
    if (*nkids == *kcap) {
        struct dfs_node **g = realloc(*kids, (*kcap = 2 * *kcap + 4) * sizeof *g);
        if (!g)
            return -ENOMEM;
        *kids = g;
    }
    pthread_rwlock_wrlock(&fs->lock);
    int rc = dfs_map_insert(fs, n);
    pthread_rwlock_unlock(&fs->lock);
    if (rc == 0)
        (*kids)[(*nkids)++] = n;
    return rc;
}

/* Plain files beside the data (Megatron's metadata.json and common.pt, a
 * Hugging Face config.json): shown as they are, unless a key takes the name.
 * Adds to the root's listing before it is published. */
static int add_passthrough(struct dfs *fs, struct dfs_node *root, struct dfs_node ***kids, size_t *nkids,
                           size_t *kcap)
{
    struct dfs_ckpt *ck = root->ck;
    int fd = open(ck->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return 0;
    }
    size_t nkeys = *nkids;   /* the key tree's names, sorted for the checks below */
    qsort(*kids, nkeys, sizeof **kids, by_name);
    int rc = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        struct stat st;
        if (de->d_name[0] == '.' || is_data_name(de->d_name, ck))
            continue;
        if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode))
            continue;
        struct dfs_node probe = {.name = de->d_name}, *pp = &probe;
        if (bsearch(&pp, *kids, nkeys, sizeof **kids, by_name)) {
            dfs_log(LOG_WARNING, "%s/%s: not shown: a key has the same name", ck->path, de->d_name);
            continue;
        }
        struct dfs_node *n = dfs_node_new(fs, root, de->d_name, strlen(de->d_name), DFS_N_PASSTHRU);
        if (!n || !(n->pst = malloc(sizeof *n->pst))) {
            rc = -ENOMEM;
            break;
        }
        *n->pst = st;
        atomic_store(&n->size, (int64_t)st.st_size);
        if ((rc = dfs_push_kid(fs, n, kids, nkids, kcap)) < 0)
            break;
    }
    closedir(d);
    return rc;
}

/* The root's extra files: plain files beside the data, then the virtual
 * safetensors file of all tensors (fuse/stview.c). */
static int add_root_files(struct dfs *fs, struct dfs_node *root, struct dfs_node ***kids, size_t *nkids,
                          size_t *kcap)
{
    int rc = add_passthrough(fs, root, kids, nkids, kcap);
    if (rc < 0)
        return rc;
    struct dfs_node *n = dfs_stview_new(fs, root);
    return n ? dfs_push_kid(fs, n, kids, nkids, kcap) : -ENOMEM;
}

/* A checkpoint root listing only the files `files` adds (view=hf: no key
 * tree). Serialised by fs->list_lock. */
static int list_files(struct dfs *fs, struct dfs_node *dir,
                      int (*files)(struct dfs *, struct dfs_node *, struct dfs_node ***, size_t *, size_t *))
{
    struct dfs_node **kids = NULL;
    size_t nkids = 0, kcap = 0;
    int rc = files(fs, dir, &kids, &nkids, &kcap);
    if (rc == 0) {
        install_kids(fs, dir, kids, nkids, kcap, 0);
        kids = NULL;
    }
    free(kids);
    return rc;
}

/* ------------------------------------------------------------ checkpoints */

static struct dfs_ckpt *ckpt_new(struct dfs *fs, const char *path, const struct stat *meta_st, int partial)
{
    struct dfs_ckpt *ck = calloc(1, sizeof *ck);
    if (!ck || !(ck->path = strdup(path))) {
        free(ck);
        return NULL;
    }
    if (meta_st)
        ck->meta_st = *meta_st;
    ck->partial = partial;
    pthread_mutex_init(&ck->lock, NULL);
    atomic_init(&ck->state, 0);
    atomic_init(&ck->refs, 1);   /* its name's */
    pthread_mutex_lock(&fs->alloc_lock);
    ck->next = fs->ckpts;
    fs->ckpts = ck;
    fs->nckpts += !partial;
    pthread_mutex_unlock(&fs->alloc_lock);
    return ck;
}

struct dfs_ckpt *dfs_ckpt_new(struct dfs *fs, const char *path, const struct stat *meta_st)
{
    return ckpt_new(fs, path, meta_st, 0);
}

struct dfs_node *dfs_partial_new(struct dfs *fs, struct dfs_node *partdir, const char *name, const char *path)
{
    struct dfs_ckpt *ck = ckpt_new(fs, path, NULL, 1);
    struct dfs_node *n = ck ? node_new(fs, partdir, name, strlen(name), DFS_N_PARTIAL, ck) : NULL;
    if (n)
        ck->root = n;
    else if (ck)
        dfs_ckpt_unref(fs, ck, 1);   /* nothing else knows it */
    return n;
}

const struct stat *dfs_ckpt_built(struct dfs_ckpt *ck)
{
    return atomic_load(&ck->state) == 1 ? &ck->open_st : &ck->meta_st;
}

static int open_and_list(struct dfs *fs, struct dfs_ckpt *ck)
{
    /* What the open reads is this .metadata or a later one: a later one
     * differs from it, so a save between this stat and the read is seen as
     * one (dfs_scan_recheck makes a new node), never missed. */
    char *mp = malloc(strlen(ck->path) + sizeof "/__0.metadata");
    if (!mp)
        return -ENOMEM;
    strcpy(stpcpy(mp, ck->path), "/.metadata");
    struct stat st;
    int global = stat(mp, &ck->open_st) == 0;
    if (!global)
        ck->open_st = ck->meta_st;
    /* -o rank=R: a rank-local save (every rank wrote __R.metadata, rank 0
     * too, and no .metadata) is read as rank R's dcp.load reads it; other
     * layouts have no per-rank view and open as they are. */
    strcpy(stpcpy(mp, ck->path), "/__0.metadata");
    int rank_view = fs->opt.rank >= 0 && !global && stat(mp, &st) == 0;
    free(mp);
    dcp_error err;
    dcp_open_options oo = DCP_OPEN_OPTIONS_INIT;
    oo.flags = (fs->opt.no_catalog ? 0 : DCP_OPEN_CATALOG) | (fs->opt.megatron_fold ? DCP_OPEN_MEGATRON_FOLD : 0) |
               (rank_view ? DCP_OPEN_RANK : 0);
    oo.rank = rank_view ? (unsigned)fs->opt.rank : 0;
    oo.catalog = fs->opt.catalog;
    if (dcp_open_ex(ck->path, &oo, &ck->ck, &err) < 0) {
        dfs_log(LOG_ERR, "%s", err.msg);
        return -EIO;
    }
    /* every mount and every checkpoint opened says it: noise but with -d */
    dfs_log(LOG_DEBUG, "%s: %s", ck->path, dcp_from_catalog(ck->ck) ? "model served from the catalog" : "model parsed");
#ifdef __GLIBC__
    /* A first open parsed .metadata (a million chunks: ~1 GB at its peak)
     * and freed it: give that memory back to the system now. */
    if (!dcp_from_catalog(ck->ck))
        malloc_trim(0);
#endif
    ck->nfiles = dcp_num_files(ck->ck);
    ck->file_sizes = malloc((ck->nfiles ? ck->nfiles : 1) * sizeof *ck->file_sizes);
    if (!ck->file_sizes)
        return -ENOMEM;
    for (size_t i = 0; i < ck->nfiles; i++)
        atomic_init(&ck->file_sizes[i], -1);
    /* The root is listed now (its plain files must not clash with keys);
     * every other directory when it is first listed or looked into. */
    pthread_mutex_lock(&fs->list_lock);
    int rc = fs->opt.view == DFS_VIEW_HF ? list_files(fs, ck->root, dfs_hfview_add_files)
                                         : list_dir(fs, ck->root, 0, add_root_files);
    pthread_mutex_unlock(&fs->list_lock);
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
    if (ck->ck) {   /* a failed listing after a good open: start over (the nodes it made are
                     * not reused: they belong to the model being closed) */
        ck->gen++;
        dfs_verify_free(ck);
        dcp_hf_view_free(ck->hf);
        ck->hf = NULL;
        dcp_close(ck->ck);
        ck->ck = NULL;
        free(ck->file_sizes);
        ck->file_sizes = NULL;
    }
    rc = open_and_list(fs, ck);
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

/* ------------------------------------------------------------ lifetimes */

/* Free a list of nodes (linked by all_next); how many there were. */
static size_t free_nodes(struct dfs_node *n)
{
    size_t count = 0;
    while (n) {
        struct dfs_node *next = n->all_next;
        if (n->vops && n->vops->destroy)
            n->vops->destroy(n);
        free(n->kids);
        free(n->npy_hdr);
        free(n->pst);
        free(n->why);
        dfs_scan_free(n->scan);
        free(n);
        n = next;
        count++;
    }
    return count;
}

static void ckpt_free(struct dfs_ckpt *ck)
{
    free_nodes(ck->nodes);
    dfs_verify_free(ck);
    dcp_hf_view_free(ck->hf);
    dcp_close(ck->ck);
    free(ck->file_sizes);
    free(ck->path);
    pthread_mutex_destroy(&ck->lock);
    free(ck);
}

int dfs_ckpt_get(struct dfs_ckpt *ck)
{
    if (!ck)
        return 1;
    long r = atomic_load(&ck->refs);
    while (r > 0)
        if (atomic_compare_exchange_weak(&ck->refs, &r, r + 1))
            return 1;
    return 0;
}

void dfs_ckpt_ref(struct dfs_ckpt *ck, long n)
{
    if (ck)
        atomic_fetch_add(&ck->refs, n);
}

void dfs_ckpt_unref(struct dfs *fs, struct dfs_ckpt *ck, long n)
{
    if (!ck || n <= 0 || atomic_fetch_sub(&ck->refs, n) != n)
        return;
    /* The last reference (the name's is gone): nothing can take another
     * (dfs_ckpt_get), and requests find its nodes in the map until they
     * leave it here. */
    pthread_rwlock_wrlock(&fs->lock);
    for (struct dfs_node *k = ck->nodes; k; k = k->all_next)
        map_remove(fs, k);
    pthread_rwlock_unlock(&fs->lock);
    size_t count = 0;
    pthread_mutex_lock(&fs->alloc_lock);
    for (struct dfs_ckpt **p = &fs->ckpts; *p; p = &(*p)->next)
        if (*p == ck) {
            *p = ck->next;
            break;
        }
    for (struct dfs_node *k = ck->nodes; k; k = k->all_next)
        count++;
    fs->nnodes -= count;
    size_t left = ck->partial ? fs->nckpts : --fs->nckpts;
    pthread_mutex_unlock(&fs->alloc_lock);
    if (ck->partial)
        dfs_log(LOG_DEBUG, "%s: no longer listed in %s, and nothing refers to it any more: its node is freed",
                ck->path, DFS_PARTIAL_NAME);
    else
        dfs_log(LOG_INFO, "%s: the checkpoint saved there before is closed: nothing refers to it any more "
                "(%zu checkpoints open)", ck->path, left);
    ckpt_free(ck);
}

void dfs_ckpt_retire(struct dfs *fs, struct dfs_ckpt *ck)
{
    atomic_store(&ck->retired, 1);
    dfs_notify_retired(fs, ck);   /* while its name's reference keeps it */
    dfs_ckpt_unref(fs, ck, 1);
}

/* ------------------------------------------------------------------ unmount */

void dfs_free_all(struct dfs *fs)
{
    free_nodes(fs->all);
    fs->all = NULL;
    struct dfs_ckpt *ck = fs->ckpts;
    while (ck) {
        struct dfs_ckpt *next = ck->next;
        ckpt_free(ck);
        ck = next;
    }
    fs->ckpts = NULL;
    if (fs->map) {
        free(fs->map->slots);
        free(fs->map);
        fs->map = NULL;
    }
}
