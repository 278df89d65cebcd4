/* dcpfs: the read-only FUSE filesystem over libdcp. Shared types of the daemon.
 *
 * The mount is a tree of nodes. Those of a checkpoint are freed with it when
 * it is retired (saved again: another node took its name; removed; or the
 * scan folder holding it left its parent's listing, scan.c empty_scandir)
 * and nothing refers to it any more (Lifetime, below); so is a .partial
 * folder's node of a partial subfolder, which has a checkpoint object of its
 * own (never opened), once that subfolder left .partial (complete, or gone);
 * all others (scan folders, their .partial folders and plain files) live
 * until unmount.
 * Three kinds of directory exist (and, in folder mode, the .partial folder
 * of a scan folder, listing its step folders whose save did not finish):
 *   - scan directories: real folders of SOURCE in folder mode, rescanned
 *     (cheap mtime check) on lookup and readdir; short kernel cache timeouts;
 *   - checkpoint roots: a folder with .metadata; opened lazily on first
 *     lookup/readdir, then its key tree is published under it; a new
 *     .metadata under the same name (saved again) makes a new root node;
 *   - key-tree directories: immutable once published; cached for the life of
 *     the mount.
 * Files are checkpoint entries (tensors, bytes items), passthrough files
 * (the extra files of a Megatron folder) and virtual files (the safetensors
 * view of a whole checkpoint, stview.c).
 *
 * Key trees are not held whole: a checkpoint's root is listed when it is
 * opened, and every other key-tree directory when it is first listed
 * (opendir); a lookup of one name in a directory not listed yet creates just
 * that node, answered by a key lookup in the model (the catalog, for a model
 * it serves). So a stat of one deep key costs a few key lookups, and memory
 * grows with what is looked at, not with the checkpoint.
 *
 * Locking: fs.lock (rwlock) guards the inode map and the child arrays of all
 * directories. A key-tree directory's children are published once, when it
 * is listed, and never change after; nodes a lookup made earlier are reused
 * (found in the inode map by their path hash).
 *
 * Lifetime: a checkpoint's refs count what may still use its nodes: its
 * name (until it is retired: saved again, removed, or its scan folder gone;
 * a partial folder's node's until it leaves .partial, scan.c), the kernel's lookup counts of its nodes (a
 * LOOKUP or READDIRPLUS entry adds one, FORGET takes its count back), open
 * files and directory handles, and each request while it runs. References
 * are found under fs->lock (read) in the inode map or the children of a
 * scan folder (or of its .partial), and never taken once the count reached
 * 0: whoever drops the last one takes the nodes out of the map under
 * fs->lock (write) and frees them. A node pointer obtained with a reference stays valid until that
 * reference is dropped, so reads need no lock at all. The kernel is told to
 * drop its entries of a retired checkpoint, its folders' too (notify.c), so
 * that their FORGETs come without memory pressure.
 */
#ifndef DCPFS_H
#define DCPFS_H

#define FUSE_USE_VERSION 312

#include <fuse_lowlevel.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/stat.h>
#include <syslog.h>

#include "dcp.h"
#include "dcp_integrity.h"
#include "dcp_export.h" /* the Hugging Face view (-o view=hf:NAME) */
#include "dcp_file.h"   /* dcp_st_view_*: the virtual model.safetensors */

/* The errno a failed libdcp call on a value is answered with: ENOMEM, and
 * ENOTSUP (an intact record libdcp does not read: an NF4 or quantized weight;
 * `cat` says "Operation not supported"), as they are; anything else EIO.
 * The log line says why. */
#define DFS_REPLY_ERRNO(code) ((code) == ENOMEM || (code) == ENOTSUP ? (code) : EIO)

#define DFS_TIMEOUT_FOREVER (365.0 * 24 * 3600)   /* "life of the mount": checkpoints are immutable */
#define DFS_TIMEOUT_SCAN 1.0                      /* scan folders change as training writes */

/* ------------------------------------------------------------------ options */

enum dfs_view {
    DFS_VIEW_RAW = 0,
    DFS_VIEW_NPY = 1,
    DFS_VIEW_HF = 2        /* each checkpoint as the Hugging Face folder dcp convert --to hf writes (hfview.c) */
};
enum dfs_readmode { DFS_READ_AUTO = 0, DFS_READ_SPLICE = 1, DFS_READ_PREAD = 2 };
/* -o read=auto splices a plan whose pieces average at least this: below it,
 * a splice call per piece costs more than copying through preadv
 * (bench/bench-fuse.sh; 4 KiB pieces lose, 8 KiB break even, 16 KiB win). */
#define DFS_SPLICE_MIN 8192

struct dfs_options {
    char *source;           /* SOURCE as given */
    char *view_name;        /* -o view=raw|npy|hf:RECIPE */
    char *hf_dtype;         /* -o hf_dtype=DTYPE: view=hf casts floating-point tensors (dcp convert --dtype) */
    char *hf_config;        /* -o hf_config=PATH: the model's config.json (--config) */
    char *hf_max_shard;     /* -o hf_max_shard_size=SIZE (--max-shard-size) */
    char *hf_keys;          /* -o hf_keys=PATTERN (--keys) */
    int hf_allow_unmapped;  /* -o hf_allow_unmapped (--allow-unmapped) */
    char *hf_recipe;        /* view=hf:FILE: the recipe file's absolute path */
    char *hf_recipe_dirs;   /* view=hf: $DCP_RECIPE_PATH, its relative folders made absolute */
    char *read_name;        /* -o read=auto|splice|pread */
    int ready_fd;           /* -o ready_fd=N: one byte written when the mount is live */
    int max_depth;          /* -o depth=N: folder levels scanned below SOURCE */
    unsigned splice_min;    /* -o splice_min=N: auto mode splices when the mean piece is >= N bytes */
    unsigned max_read;      /* -o max_read=N (libfuse's, remembered for init) */
    unsigned readahead_kb;  /* -o readahead_kb=N: set on the mount's bdi (0: leave the kernel's) */
    int show_help, show_version;
    enum dfs_view view;
    enum dfs_readmode readmode;
    char *catalog;          /* -o catalog=PATH: parsed metadata and recorded digests */
    int no_catalog;         /* -o no_catalog: parse .metadata on every open, write no catalog */
    int megatron_fold;      /* -o megatron_fold: DCP_OPEN_MEGATRON_FOLD (original shapes) */
    char *rank_text;        /* -o rank=R, as given */
    long rank;              /* R, or -1: rank-local checkpoints as rank R's dcp.load reads them (DCP_OPEN_RANK) */
    int verify;             /* -o verify: check each chunk's recorded digest before serving it */
    int opendir;            /* -o opendir: answer opendir/releasedir (else ENOSYS, where the kernel allows it) */
};

/* -------------------------------------------------------------------- nodes */

enum dfs_ntype {
    DFS_N_SCANDIR = 1,   /* a real folder of SOURCE (folder mode) */
    DFS_N_CKPT,          /* a checkpoint's root folder */
    DFS_N_DIR,           /* a directory of a key tree */
    DFS_N_ENTRY,         /* a tensor or bytes item */
    DFS_N_PASSTHRU,      /* a plain file of the checkpoint folder (Megatron metadata.json, common.pt),
                          * or of a scan folder (ck NULL: latest_checkpointed_iteration.txt) */
    DFS_N_VIRTUAL,       /* a computed file: the safetensors view of a checkpoint */
    DFS_N_PARTDIR,       /* DFS_PARTIAL_NAME in a scan folder: its subfolders whose save did not finish */
    DFS_N_PARTIAL        /* one of those (a directory that answers EIO, logged, with the reason) */
};
/* Where a scan folder lists its partial checkpoints (dcp_probe_folder): a
 * dot-name, so `ls` hides them and nothing takes them for checkpoints. */
#define DFS_PARTIAL_NAME ".partial"
#define DFS_PARTIAL_XATTR "user.dcp.partial"
/* An entry's dcp digest (XXH3-128 of its value, hex), computed on request:
 * it reads the whole value, so a worker answers it (loop.c). */
#define DFS_DIGEST_XATTR "user.dcp.xxh3_128"

struct dfs_node;
struct dfs_ckpt;

/* What a file served from entries holds: hdr[0..hdr_len) then the segments
 * back to back, each a byte range of an entry's flat image (its offset is in
 * the file, ascending, no holes; dcp_st_view_tensor is that triple). A
 * tensor file is one segment after its (npy) header. */
struct dfs_layout {
    const unsigned char *hdr;
    uint64_t hdr_len;
    const dcp_st_view_tensor *segs;
    size_t nsegs;
    uint64_t size;
};

/* A computed file. Called without locks from any thread. */
struct dfs_vfile_ops {
    /* The file's layout, computed on the first call; 0 or -errno (logged).
     * A file with a read op gives its size only (no header, no segments). */
    int (*layout)(struct dfs_node *n, struct dfs_layout *out);
    /* Optional: bytes [off, off + len) into buf (*got: how many; the file's
     * end clamps them), with the calling thread's plan and staging buffer
     * (read.c); 0 or -errno (logged). */
    int (*read)(struct dfs_node *n, uint64_t off, void *buf, size_t len, size_t *got, dcp_plan *plan,
                void *stage, size_t stage_len);
    void (*destroy)(struct dfs_node *n);
};

struct dfs_node {
    uint64_t ino;              /* the FUSE inode: hash of the mount-relative path */
    uint64_t phash;            /* the unperturbed path hash children chain from */
    struct dfs_node *parent;
    char *name;                /* the encoded name in the parent */
    enum dfs_ntype type;
    unsigned gen;              /* ck->gen when made: nodes of an abandoned listing are never reused */
    struct dfs_ckpt *ck;       /* owning checkpoint (NULL for scan folders) */
    struct dfs_node *all_next; /* every node (of ck, else of the mount), for freeing */

    /* directories: children sorted by name (strcmp) */
    struct dfs_node **kids;
    size_t nkids, kcap;
    size_t nsubdirs;
    _Atomic int listed;        /* DFS_N_DIR: kids hold every child (else only lookups made nodes) */
    _Atomic int large;         /* DFS_N_DIR: a lookup's listing gave up (more than DFS_LIST_ON_LOOKUP
                                * children): not tried again on later lookups */

    /* DFS_N_ENTRY */
    const dcp_entry *entry;
    char *npy_hdr;             /* view=npy tensors: the .npy header */
    uint32_t npy_hdr_len;
    _Atomic int64_t size;      /* file size (entry: header + data), -1 until known */

    /* DFS_N_SCANDIR */
    struct dfs_scan *scan;

    /* DFS_N_PARTIAL: why it is partial (the probe's reason) */
    char *why;

    /* DFS_N_PASSTHRU: stat of the file at scan time */
    struct stat *pst;

    /* DFS_N_VIRTUAL */
    const struct dfs_vfile_ops *vops;
    void *vdata;
};

/* One checkpoint folder of the mount. */
struct dfs_ckpt {
    char *path;                /* absolute or as given: passed to dcp_open */
    struct stat meta_st;       /* stat of .metadata: times, owner */
    struct stat open_st;       /* stat of .metadata just before the open that made ck (state 1): a
                                * later .metadata is another save (dfs_ckpt_built) */
    pthread_mutex_t lock;      /* serialises opening */
    _Atomic int state;         /* 0 not opened, 1 open, -1 last open failed */
    struct timespec failed_mtime;  /* .metadata mtime when the last open failed */
    off_t failed_size;
    dcp_checkpoint *ck;
    struct dfs_node *root;
    _Atomic int64_t *file_sizes;   /* per data file, -1 until fstat'ed (splice checks) */
    size_t nfiles;
    struct dfs_verified *verified; /* -o verify: blobs checked so far (verify.c) */
    dcp_hf_view *hf;           /* view=hf: the export's layout (hfview.c) */
    unsigned gen;              /* bumped when a checkpoint whose listing failed is opened again */
    _Atomic long refs;         /* what may use its nodes (dfs.h, Lifetime); it is freed when this
                                * drops to 0 once retired */
    _Atomic int retired;       /* saved again, removed or its scan folder gone: no longer reachable
                                * by name */
    int partial;               /* only holds a DFS_N_PARTIAL node (root): never opened, not counted
                                * in nckpts, retired when its folder leaves .partial */
    struct dfs_ckpt *retire_next;  /* scan.c: retired while fs->lock was held */
    struct dfs_node *nodes;    /* its nodes (all_next), root included */
    struct dfs_ckpt *next;
};

/* ----------------------------------------------------------- the filesystem */

struct dfs_dh;   /* ops.c: an open directory */

struct dfs {
    struct dfs_options opt;
    dcp_export_options hf;     /* view=hf: the export's options (main.c) */
    char *source;              /* realpath of SOURCE */
    int srcfd;                 /* O_DIRECTORY of SOURCE */
    int folder_mode;           /* SOURCE is a folder of checkpoints */
    struct dfs_node *root;
    pthread_rwlock_t lock;     /* inode map, children of scan folders and checkpoint roots */
    pthread_mutex_t scan_lock; /* serialises rescans and checkpoint publication */
    pthread_mutex_t list_lock; /* serialises listings of key-tree directories */
    struct dfs_inomap *map;
    pthread_mutex_t alloc_lock; /* guards all, nnodes and ckpts */
    struct dfs_node *all;      /* every node outside checkpoints, for freeing at unmount */
    size_t nnodes;             /* nodes alive (statfs's f_files) */
    struct dfs_ckpt *ckpts;
    size_t nckpts;             /* checkpoints alive */
    unsigned saves;            /* single-checkpoint mode: saves seen (a new root's path hash) */
    int splice_ok;             /* the kernel connection accepted splice writes */
    int no_opendir;            /* opendir answers ENOSYS: the kernel opens directories itself, with
                                * their listings cached (readdir works from the node) */
    uint64_t pipe_max;         /* bytes libfuse's splice pipes can hold (fs/pipe-max-size, or more) */
    struct fuse_session *se;
    const char *mountpoint;
    struct dcp_catalog *catalog;   /* -o verify: where recorded digests are */
    pthread_mutex_t dh_lock;   /* guards open_dirs */
    struct dfs_dh *open_dirs;  /* opendir handles (freed at unmount if never released) */
    struct dfs_notifier *notifier; /* notify.c: entries the kernel is told to drop (NULL: none) */
};

/* tree.c: nodes, the inode map and key trees */
/* A new node (not yet in the inode map) of parent's checkpoint; its name is
 * copied. NULL on ENOMEM. */
struct dfs_node *dfs_node_new(struct dfs *fs, struct dfs_node *parent, const char *name,
                              size_t namelen, enum dfs_ntype type);
/* The root node of checkpoint ck (its parent a scan folder, or NULL). */
struct dfs_node *dfs_ckpt_root_new(struct dfs *fs, struct dfs_node *parent, const char *name, struct dfs_ckpt *ck);
/* A node of .partial (partdir) for the partial subfolder name, at path (for
 * log lines), in its own checkpoint object (ck->partial) with its name's
 * reference: dfs_ckpt_retire once it left partdir's children frees it when
 * nothing refers to it any more. NULL on ENOMEM. */
struct dfs_node *dfs_partial_new(struct dfs *fs, struct dfs_node *partdir, const char *name, const char *path);
/* Checkpoint references (dfs.h, Lifetime); ck may be NULL (a node of no
 * checkpoint: never freed). dfs_ckpt_get: a reference to ck found in the
 * inode map or a listing under fs->lock (either way), 0 when ck is being
 * freed (then it is not to be used). dfs_ckpt_ref: another one, by a holder
 * of one. dfs_ckpt_unref drops n, freeing ck at its last (not under
 * fs->lock). A checkpoint is made with one, its name's: dfs_ckpt_retire
 * drops it once its root left its parent's children (saved again). */
int dfs_ckpt_get(struct dfs_ckpt *ck);
void dfs_ckpt_ref(struct dfs_ckpt *ck, long n);
void dfs_ckpt_unref(struct dfs *fs, struct dfs_ckpt *ck, long n);
void dfs_ckpt_retire(struct dfs *fs, struct dfs_ckpt *ck);
/* Single-checkpoint mode: the root (inode 1) of another save of SOURCE stands
 * in for the current one in the inode map (caller holds fs->lock for writing). */
void dfs_map_swap_root(struct dfs *fs, struct dfs_node *root);
/* Append a child to a directory that is not visible yet (or under fs->lock). */
int dfs_add_kid(struct dfs_node *dir, struct dfs_node *kid);
/* Insert a node into the inode map (caller holds fs->lock for writing). Picks
 * the path hash, or a perturbed one on a collision, and sets n->ino. */
int dfs_map_insert(struct dfs *fs, struct dfs_node *n);
/* Node for an inode, or NULL (caller holds fs->lock). */
struct dfs_node *dfs_map_get(struct dfs *fs, uint64_t ino);
/* Child by name (caller holds fs->lock for directories that can change). */
struct dfs_node *dfs_child(const struct dfs_node *dir, const char *name);
void dfs_sort_kids(struct dfs_node *dir);
/* Append n to a listing being built (published later), after making its
 * inode reachable: 0 or -errno. */
int dfs_push_kid(struct dfs *fs, struct dfs_node *n, struct dfs_node ***kids, size_t *nkids, size_t *kcap);
int dfs_is_dir(const struct dfs_node *n);
/* Open a checkpoint root if it is not open yet, and publish its listing.
 * Returns 0 or -errno (EIO when the checkpoint cannot be read, logged). */
int dfs_ckpt_ensure(struct dfs *fs, struct dfs_ckpt *ck);
/* A key-tree directory: list it once (0 or -errno; with max, 1 when it has
 * more children than that and was left unlisted), or look up one name in it
 * before it is listed (the node, or NULL with *rc 0 when there is none, or
 * -errno). */
#define DFS_LIST_ON_LOOKUP 16   /* a directory looked up is listed when this small (exact st_nlink) */
int dfs_dir_list(struct dfs *fs, struct dfs_node *dir, size_t max);
/* On a lookup: list dir if it is small, unless it was found large before or
 * another listing is under way (a lookup never waits for one). */
void dfs_dir_list_if_small(struct dfs *fs, struct dfs_node *dir);
struct dfs_node *dfs_dir_lookup(struct dfs *fs, struct dfs_node *dir, const char *name, int *rc);
struct dfs_ckpt *dfs_ckpt_new(struct dfs *fs, const char *path, const struct stat *meta_st);
/* The .metadata a checkpoint node stands for: the one stat'ed just before it
 * was opened, else the one its folder's probe found. */
const struct stat *dfs_ckpt_built(struct dfs_ckpt *ck);
void dfs_free_all(struct dfs *fs);

/* scan.c: SOURCE and folders of checkpoints */
struct dfs_scan;
/* Decide the mode and make the root; -1 with a message in errbuf (empty when
 * already logged). */
int dfs_source_init(struct dfs *fs, char *errbuf, size_t errlen);
const struct stat *dfs_scan_stat(const struct dfs_scan *s);
/* Changes whenever the folder's listing does (a checkpoint appearing in a
 * pending subfolder leaves the folder's mtime as it is): its getattr adds it
 * to the mtime, which is what tells the kernel that its cached listing is stale. */
unsigned dfs_scan_version(const struct dfs_scan *s);
int dfs_scan_refresh(struct dfs *fs, struct dfs_node *dir);  /* rescan if the folder changed */
/* Before a lookup of name in scan folder dir (name NULL: a listing, every
 * checkpoint of dir): a checkpoint saved again (or removed) since its node
 * was made gets a new node (another inode) in its place; the old one is
 * retired, its model kept while anything refers to it. 0 or -errno. */
int dfs_scan_recheck(struct dfs *fs, struct dfs_node *dir, const char *name);
/* Single-checkpoint mode: when SOURCE's .metadata is another save, the root
 * (inode 1) becomes a new checkpoint's, the old one retired. 0 or -errno. */
int dfs_single_recheck(struct dfs *fs);
/* A scan folder's plain file n (DFS_N_PASSTHRU without a checkpoint): its
 * stat now into *st and/or an fd open for reading into *fd; 0 or -errno. */
int dfs_scan_file(struct dfs *fs, const struct dfs_node *n, struct stat *st, int *fd);
void dfs_scan_free(struct dfs_scan *s);
/* Does this folder hold a checkpoint (.metadata)? Fills *st with its stat. */
int dfs_has_metadata(int dirfd, const char *rel, struct stat *st);

/* npy.c */
int dfs_npy_header(const dcp_entry *e, char **hdr, uint32_t *len);
const char *dfs_npy_descr(dcp_dtype dt, char *tmp, size_t tmplen);

/* stview.c: the safetensors file of all a checkpoint's tensors */
#define DFS_STVIEW_NAME "all.safetensors"
/* A new (not yet laid out) view file for a checkpoint root being listed, or NULL. */
struct dfs_node *dfs_stview_new(struct dfs *fs, struct dfs_node *root);

/* hfview.c: view=hf, a checkpoint root holding the files of its Hugging Face
 * export. Lay the export out (dcp_hf_view_build, into ck->hf) and add a node
 * per file to the root's listing being built: 0 or -errno (the export's
 * error logged). */
int dfs_hfview_add_files(struct dfs *fs, struct dfs_node *root, struct dfs_node ***kids, size_t *nkids,
                         size_t *kcap);

/* read.c */
void dfs_read_entry(fuse_req_t req, struct dfs *fs, struct dfs_node *n, size_t size, off_t off);
void dfs_read_fd(fuse_req_t req, struct dfs *fs, int fd, uint64_t fsize, size_t size, off_t off);
/* A plain file opened for reading (path relative to dirfd, or absolute): the
 * fd, or -errno (-ENOENT when it is no longer a regular file). */
int dfs_open_regular(int dirfd, const char *path);
void dfs_read_virtual(fuse_req_t req, struct dfs *fs, struct dfs_node *n, size_t size, off_t off);
int dfs_entry_size(struct dfs_node *n, uint64_t *size);
int dfs_read_init(void);
void dfs_read_fini(void);   /* frees the calling thread's buffers */

/* ops.c */
extern const struct fuse_lowlevel_ops dfs_ops;
/* Free the directory handles the kernel did not release before the session
 * ended (a directory still open at unmount). */
void dfs_close_dirs(struct dfs *fs);
void dfs_stat(struct dfs *fs, const struct dfs_node *n, struct stat *st);

/* loop.c: receive requests until unmount, answering names and attributes on
 * this thread and the rest (reads) on up to max_threads workers (none: all
 * on this thread, -s), with the notifier (below) running meanwhile. 0, or
 * -errno when receiving failed. */
int dfs_loop(struct dfs *fs, struct fuse_session *se, unsigned max_threads);

/* notify.c: the kernel told to drop its entries of retired checkpoints, by
 * a thread of its own (the kernel may wait there for a request). dfs_loop
 * starts it, and stops it when no request is received any more, before the
 * session is unmounted: it answers requests until a notification in flight
 * is written. Without it (not started: libfuse's loops, -s or clone_fd,
 * may drop a request read as the session ends) the others do nothing. */
struct dfs_notifier;
int dfs_notify_start(struct dfs *fs, struct fuse_session *se);
void dfs_notify_stop(struct dfs *fs);
/* This thread answers a lookup of parent/name (0, NULL: done): a checkpoint
 * retired meanwhile keeps that entry (the reply replaces it). */
void dfs_notify_lookup(fuse_ino_t parent, const char *name);
/* ck was retired (with a reference still held): its folders' entries and
 * its name's. */
void dfs_notify_retired(struct dfs *fs, struct dfs_ckpt *ck);
/* A lookup of name in dir, a retired checkpoint's folder, was answered:
 * that entry, once the kernel installed it. */
void dfs_notify_looked_up(struct dfs *fs, const struct dfs_node *dir, const char *name);
/* An open file or directory of node n was released (its reference still
 * held): if its checkpoint is retired, the entries from n up to its root. */
void dfs_notify_released(struct dfs *fs, const struct dfs_node *n);

/* main.c: logging (stderr in the foreground, syslog otherwise) */
/* log.c: a line to stderr, or to syslog after dfs_log_to_syslog (the daemon
 * detached); LOG_DEBUG lines only after dfs_log_debug(1). */
void dfs_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void dfs_log_debug(int on);
void dfs_log_to_syslog(void);
/* main.c: called from the init operation once the kernel connection is up (readiness). */
void dfs_mounted(struct dfs *fs);

/* -o verify (verify.c): 0 when every blob the plan reads matches its recorded
 * digest (or has none), -EIO (logged with key and file) when one does not. */
int dfs_verify_open(struct dfs *fs);
int dfs_verify_plan(struct dfs *fs, struct dfs_ckpt *ck, const dcp_entry *e, const dcp_plan *plan);
void dfs_verify_free(struct dfs_ckpt *ck);

#endif
