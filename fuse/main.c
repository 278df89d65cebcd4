/* dcpfs: mount PyTorch Distributed Checkpoints read-only with FUSE.
 *
 * main: options, the file-descriptor limit, the session and its loop. The
 * mount is always read-only. Readiness: with -o ready_fd=N one byte is
 * written to fd N once the mounted root answers (a process that waits on a
 * pipe needs no polling), and fd N is closed without a byte if mounting
 * fails. SIGINT/SIGTERM/SIGHUP end the loop and unmount.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "dcpfs.h"

/* ---------------------------------------------------------------- options */

#define OPT(t, p) {t, offsetof(struct dfs_options, p), 1}
enum { KEY_MAX_READ = 1 };
static const struct fuse_opt dfs_optspec[] = {
    OPT("view=%s", view_name),
    OPT("hf_dtype=%s", hf_dtype),
    OPT("hf_config=%s", hf_config),
    OPT("hf_max_shard_size=%s", hf_max_shard),
    OPT("hf_keys=%s", hf_keys),
    OPT("hf_allow_unmapped", hf_allow_unmapped),
    OPT("read=%s", read_name),
    OPT("ready_fd=%d", ready_fd),
    OPT("depth=%d", max_depth),
    OPT("splice_min=%u", splice_min),
    OPT("readahead_kb=%u", readahead_kb),
    OPT("catalog=%s", catalog),
    OPT("verify", verify),
    OPT("no_catalog", no_catalog),
    OPT("megatron_fold", megatron_fold),
    OPT("rank=%s", rank_text),
    OPT("opendir", opendir),
    FUSE_OPT_KEY("max_read=", KEY_MAX_READ),   /* libfuse's; init must repeat it */
    FUSE_OPT_END
};

static int opt_proc(void *data, const char *arg, int key, struct fuse_args *outargs)
{
    (void)outargs;
    struct dfs_options *o = data;
    if (key == FUSE_OPT_KEY_NONOPT && !o->source) {
        o->source = strdup(arg);
        return 0;
    }
    if (key == KEY_MAX_READ)
        o->max_read = (unsigned)strtoul(arg + strlen("max_read="), NULL, 10);
    return 1;   /* keep: the mountpoint and libfuse's own options */
}

static void usage(void)
{
    printf("usage: dcpfs [options] SOURCE MOUNTPOINT\n\n"
           "Mount a PyTorch Distributed Checkpoint (a folder with .metadata), or a folder of\n"
           "them, read-only: every state-dict key is a file holding the global tensor's bytes.\n\n"
           "dcpfs options:\n"
           "    -o view=raw|npy        tensor files as raw bytes (default) or NAME.npy\n"
           "    -o view=hf:RECIPE      each checkpoint as the Hugging Face folder `dcp convert --to hf\n"
           "                           --recipe RECIPE` writes (config.json, safetensors shards)\n"
           "    -o hf_dtype=DTYPE      view=hf: cast floating-point tensors (float32, float16, bfloat16, float64)\n"
           "    -o hf_config=PATH      view=hf: the model's config.json (parameters, copied as is)\n"
           "    -o hf_max_shard_size=SIZE  view=hf: bytes per shard (default 5GB)\n"
           "    -o hf_keys=PATTERN     view=hf: only the source keys PATTERN selects\n"
           "    -o hf_allow_unmapped   view=hf: leave out keys no rule maps (else the checkpoint fails)\n"
           "    -o read=auto|splice|pread  how reads are answered (default auto)\n"
           "    -o splice_min=BYTES    auto: splice when the mean piece is this large (default %u)\n"
           "    -o ready_fd=N          write one byte to fd N once the mount is live\n"
           "    -o depth=N             folder levels scanned below SOURCE (default 8)\n"
           "    -o readahead_kb=N      kernel readahead of the mount (default 1024; 0 = leave it)\n"
           "    -o max_read=BYTES      largest read request (default: half of what a pipe can hold, at most 1 MiB)\n"
           "    -o verify              check each chunk against the digest `dcp verify --record` stored\n"
           "    -o catalog=PATH        the catalog of parsed metadata and digests (default ~/.cache/dcpfs/catalog.sqlite)\n"
           "    -o no_catalog          parse every checkpoint's metadata at open, write no catalog\n"
           "    -o megatron_fold       Megatron-Core's reformulated optimizer states in their original\n"
           "                           shapes (its own load's view; parsed at open, no catalog)\n"
           "    -o rank=R              rank-local checkpoints (__R.metadata, no .metadata) as rank R's\n"
           "                           dcp.load reads them (default: every rank's merged)\n"
           "    -o opendir             answer opendir and releasedir (default: the kernel opens directories itself)\n\n",
           DFS_SPLICE_MIN);
}

/* ------------------------------------------------------------- readiness */

static void *ready_thread(void *p)
{
    struct dfs *fs = p;
    struct stat st;
    /* The root answering through the mount proves the mount is live. */
    int ok = stat(fs->mountpoint, &st) == 0;
    if (ok && fs->opt.readahead_kb) {
        /* Best effort: FUSE's default readahead (128 KiB) caps sequential reads. */
        char path[64], val[32];
        snprintf(path, sizeof path, "/sys/class/bdi/%u:%u/read_ahead_kb", major(st.st_dev), minor(st.st_dev));
        int fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd >= 0) {
            int n = snprintf(val, sizeof val, "%u\n", fs->opt.readahead_kb);
            if (write(fd, val, (size_t)n) < 0)
                dfs_log(LOG_DEBUG, "%s: %s", path, strerror(errno));
            close(fd);
        }
    }
    int fd = __atomic_exchange_n(&fs->opt.ready_fd, -1, __ATOMIC_SEQ_CST);
    if (fd >= 0) {
        if (ok) {
            ssize_t w;
            do
                w = write(fd, "1", 1);
            while (w < 0 && errno == EINTR);
        } else {
            dfs_log(LOG_ERR, "%s: the mount does not answer: %s", fs->mountpoint, strerror(errno));
        }
        close(fd);
    }
    return NULL;
}

/* Called from the init operation: the kernel connection is up. */
void dfs_mounted(struct dfs *fs)
{
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &a, ready_thread, fs) != 0)
        dfs_log(LOG_ERR, "cannot start the readiness thread");
    pthread_attr_destroy(&a);
}

/* Checkpoints can have thousands of shard files, each kept open once read. */
static void raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
            dfs_log(LOG_WARNING, "cannot raise the open file limit: %s", strerror(errno));
    }
}

/* How large libfuse can make the pipes it splices replies through:
 * fs/pipe-max-size, or without limit for a process that may exceed it
 * (CAP_SYS_RESOURCE), which a trial F_SETPIPE_SZ beyond it tells. */
static uint64_t pipe_capacity(void)
{
    uint64_t max = 1 << 20;
    FILE *f = fopen("/proc/sys/fs/pipe-max-size", "r");
    if (f) {
        unsigned long long v;
        if (fscanf(f, "%llu", &v) == 1 && v >= 65536)
            max = v;
        fclose(f);
    }
    int p[2];
    if (max <= (1u << 30) && pipe2(p, O_CLOEXEC) == 0) {
        if (fcntl(p[0], F_SETPIPE_SZ, (int)(2 * max)) >= 0)
            max = UINT64_MAX / 4;
        close(p[0]);
        close(p[1]);
    }
    return max;
}

/* The read request size when -o max_read is not given: half the pipe, so
 * that a reply of that size splices even when it is many pieces (up to a
 * piece per 8 KiB), and at most the kernel's 1 MiB. */
static unsigned default_max_read(uint64_t pipe_max)
{
    unsigned r = 1u << 20;
    while (r > (128u << 10) && (uint64_t)r > pipe_max / 2)
        r /= 2;
    return r;
}

/* "fsname=SOURCE" with libfuse's option escapes for ',' and '\'. */
static char *fsname_opt(const char *source)
{
    size_t n = strlen(source);
    char *o = malloc(2 * n + sizeof "-osubtype=dcpfs,fsname=");
    if (!o)
        return NULL;
    char *p = stpcpy(o, "-osubtype=dcpfs,fsname=");
    for (const char *s = source; *s; s++) {
        if (*s == ',' || *s == '\\')
            *p++ = '\\';
        *p++ = *s;
    }
    *p = '\0';
    return o;
}

static int parse_modes(struct dfs_options *o)
{
    if (!o->view_name || strcmp(o->view_name, "raw") == 0)
        o->view = DFS_VIEW_RAW;
    else if (strcmp(o->view_name, "npy") == 0)
        o->view = DFS_VIEW_NPY;
    else if (strncmp(o->view_name, "hf:", 3) == 0 && o->view_name[3])
        o->view = DFS_VIEW_HF;
    else {
        fprintf(stderr, "dcpfs: -o view=%s: expected raw, npy or hf:RECIPE\n", o->view_name);
        return -1;
    }
    if (o->view != DFS_VIEW_HF && (o->hf_dtype || o->hf_config || o->hf_max_shard || o->hf_keys ||
                                   o->hf_allow_unmapped)) {
        fprintf(stderr, "dcpfs: -o hf_dtype, hf_config, hf_max_shard_size, hf_keys and hf_allow_unmapped go "
                "with -o view=hf:RECIPE\n");
        return -1;
    }
    if (!o->read_name || strcmp(o->read_name, "auto") == 0)
        o->readmode = DFS_READ_AUTO;
    else if (strcmp(o->read_name, "splice") == 0)
        o->readmode = DFS_READ_SPLICE;
    else if (strcmp(o->read_name, "pread") == 0)
        o->readmode = DFS_READ_PREAD;
    else {
        fprintf(stderr, "dcpfs: -o read=%s: expected auto, splice or pread\n", o->read_name);
        return -1;
    }
    o->rank = -1;
    if (o->rank_text) {   /* as dcp --rank: decimal digits only, at most what rank-local folders are read with */
        char *end;
        errno = 0;
        unsigned long r = strtoul(o->rank_text, &end, 10);
        if (!isdigit((unsigned char)o->rank_text[0]) || *end || errno || r > 100000000ul) {
            fprintf(stderr, "dcpfs: -o rank=%s: a rank is a decimal number from 0 (the R of a rank-local save's "
                            "__R.metadata)\n", o->rank_text);
            return -1;
        }
        o->rank = (long)r;
    }
    if (o->max_depth < 0 || o->max_depth > 64) {
        fprintf(stderr, "dcpfs: -o depth=%d: expected 0 to 64\n", o->max_depth);
        return -1;
    }
    return 0;
}

/* A path that stays valid after the daemon changes to "/": a relative one
 * made absolute (not resolved: a missing file is the export's error). */
/* Two common mistakes, said before anything is opened: a SOURCE that is a
 * file (a checkpoint's .metadata or a shard instead of its folder; a single
 * .pt or .safetensors file, which dcp reads but dcpfs does not mount), and a
 * MOUNTPOINT that is not a folder (the kernel would mount over a file: a
 * root that answers nothing but EIO). A missing MOUNTPOINT is libfuse's
 * "bad mount point" already, from fuse_parse_cmdline. */
static int check_paths(const char *source, const char *mountpoint)
{
    struct stat st;
    if (stat(source, &st) < 0) {
        fprintf(stderr, "dcpfs: %s: %s\n", source, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        /* a file of a checkpoint folder (a .safetensors file too: dcp reads
         * one alone, dcpfs mounts folders only): name the folder to mount */
        const char *dir, *slash = strrchr(source, '/'), *base = slash ? slash + 1 : source;
        int dirlen;
        size_t n = strlen(base);
        int part = dcp_is_part_of_checkpoint(source, &dir, &dirlen) ||
                   (n > 12 && !strcmp(base + n - 12, ".safetensors"));
        fprintf(stderr, "dcpfs: %s: a file, not a folder: SOURCE is a checkpoint folder (the one that holds "
                        ".metadata, __R.metadata or .safetensors files) or a folder of them%s%.*s%s\n",
                source, part ? "; mount " : "", part ? dirlen : 0, dir, part ? " instead" : "");
        return -1;
    }
    if (stat(mountpoint, &st) < 0) {
        fprintf(stderr, "dcpfs: mount point %s: %s\n", mountpoint, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        fprintf(stderr, "dcpfs: mount point %s: not a folder (a mount point is an existing folder)\n", mountpoint);
        return -1;
    }
    return 0;
}

static char *absolute(const char *path)
{
    char cwd[4096];
    if (path[0] == '/' || !getcwd(cwd, sizeof cwd))
        return strdup(path);
    char *p = malloc(strlen(cwd) + strlen(path) + 2);
    if (p)
        sprintf(p, "%s/%s", cwd, path);
    return p;
}

/* A ':'-separated list of folders, the relative ones made absolute (the
 * recipe is looked up again when a checkpoint is opened, from "/").
 * malloc'd; NULL on ENOMEM. */
static char *absolute_dirs(const char *dirs)
{
    char cwd[4096];
    size_t n = strlen(dirs), extra = getcwd(cwd, sizeof cwd) ? strlen(cwd) + 1 : 0, parts = 1;
    for (const char *c = dirs; *c; c++)
        parts += *c == ':';
    char *out = malloc(n + parts * extra + 1), *o = out;
    if (!out)
        return NULL;
    for (const char *d = dirs;; d++) {
        const char *end = strchr(d, ':');
        size_t len = end ? (size_t)(end - d) : strlen(d);
        if (len && d[0] != '/' && extra)
            o += sprintf(o, "%s/", cwd);
        memcpy(o, d, len);
        o += len;
        if (!end)
            break;
        *o++ = ':';
        d = end;
    }
    *o = '\0';
    return out;
}

/* view=hf: the export's options, checked (the recipe loaded, the config
 * parsed) so that a bad one fails the mount with the export's message. */
static int hf_options(struct dfs *fs)
{
    struct dfs_options *o = &fs->opt;
    dcp_export_options *x = &fs->hf;
    *x = (dcp_export_options)DCP_EXPORT_OPTIONS_INIT;
    x->dtype = DCP_DTYPE_INVALID;
    x->recipe = o->view_name + 3;
    x->recipe_dirs = getenv("DCP_RECIPE_PATH");   /* as dcp convert: searched first */
    if (x->recipe_dirs && !(x->recipe_dirs = o->hf_recipe_dirs = absolute_dirs(x->recipe_dirs))) {
        fprintf(stderr, "dcpfs: out of memory\n");
        return -1;
    }
    x->keys = o->hf_keys;
    x->flags = o->hf_allow_unmapped ? DCP_EXPORT_ALLOW_UNMAPPED : 0;
    if (o->hf_dtype && (x->dtype = dcp_dtype_from_name(o->hf_dtype)) != DCP_FLOAT32 && x->dtype != DCP_FLOAT16 &&
        x->dtype != DCP_BFLOAT16 && x->dtype != DCP_FLOAT64) {
        fprintf(stderr, "dcpfs: -o hf_dtype=%s: expected float32, float16, bfloat16 or float64\n", o->hf_dtype);
        return -1;
    }
    if (o->hf_max_shard && (dcp_parse_size(o->hf_max_shard, &x->max_shard_size) < 0 || !x->max_shard_size)) {
        fprintf(stderr, "dcpfs: -o hf_max_shard_size=%s: expected a size (e.g. 5GB, 512MiB)\n", o->hf_max_shard);
        return -1;
    }
    if (o->hf_config) {
        char *p = absolute(o->hf_config);
        if (!p) {
            fprintf(stderr, "dcpfs: out of memory\n");
            return -1;
        }
        free(o->hf_config);
        x->config = o->hf_config = p;
    }
    if (strchr(x->recipe, '/') || (strlen(x->recipe) > 5 && !strcmp(x->recipe + strlen(x->recipe) - 5, ".json"))) {
        char *p = absolute(x->recipe);   /* a recipe file */
        if (!p) {
            fprintf(stderr, "dcpfs: out of memory\n");
            return -1;
        }
        o->hf_recipe = p;
        x->recipe = p;
    }
    dcp_error err;
    if (dcp_export_check(x, &err) < 0) {
        fprintf(stderr, "dcpfs: %s\n", err.msg);
        return -1;
    }
    return 0;
}

int main(int argc, char *argv[])
{
    struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
    struct fuse_cmdline_opts cmd;
    struct fuse_loop_config *cfg = NULL;
    struct fuse_session *se = NULL;
    static struct dfs fs;
    int ret = 1;
    char err[DCP_ERRMSG_MAX + 64];

    memset(&cmd, 0, sizeof cmd);
    fs.opt.ready_fd = -1;
    fs.opt.max_depth = 8;
    fs.opt.splice_min = DFS_SPLICE_MIN;
    fs.opt.readahead_kb = 1024;
    fs.srcfd = -1;
    pthread_rwlock_init(&fs.lock, NULL);
    pthread_mutex_init(&fs.scan_lock, NULL);
    pthread_mutex_init(&fs.list_lock, NULL);
    pthread_mutex_init(&fs.alloc_lock, NULL);
    pthread_mutex_init(&fs.dh_lock, NULL);

    if (fuse_opt_parse(&args, &fs.opt, dfs_optspec, opt_proc) < 0)
        goto out0;
    if (fuse_parse_cmdline(&args, &cmd) != 0)
        goto out0;
    if (cmd.show_help) {
        usage();
        fuse_cmdline_help();
        fuse_lowlevel_help();
        ret = 0;
        goto out0;
    }
    if (cmd.show_version) {
        printf("dcpfs version %s (libdcp %s)\n", PACKAGE_VERSION, DCP_VERSION_STRING);
        printf("FUSE library version %s\n", fuse_pkgversion());
        fuse_lowlevel_version();
        ret = 0;
        goto out0;
    }
    if (!fs.opt.source || !cmd.mountpoint) {
        fprintf(stderr, "usage: %s [options] SOURCE MOUNTPOINT (see %s --help)\n", argv[0], argv[0]);
        goto out0;
    }
    if (parse_modes(&fs.opt) < 0 || (fs.opt.view == DFS_VIEW_HF && hf_options(&fs) < 0))
        goto out0;
    if (fs.opt.catalog) {
        /* Opened when a checkpoint is, in folder mode after the daemon
         * went to "/": a relative path is the starting directory's. */
        char *p = absolute(fs.opt.catalog);
        if (!p) {
            fprintf(stderr, "dcpfs: out of memory\n");
            goto out0;
        }
        free(fs.opt.catalog);
        fs.opt.catalog = p;
    }
    if (fs.opt.ready_fd >= 0 && fcntl(fs.opt.ready_fd, F_SETFD, FD_CLOEXEC) < 0) {
        fprintf(stderr, "dcpfs: -o ready_fd=%d: %s\n", fs.opt.ready_fd, strerror(errno));
        goto out0;
    }
    dfs_log_debug(cmd.debug);
    fs.pipe_max = pipe_capacity();
    fs.mountpoint = cmd.mountpoint;
    raise_nofile();

    if (check_paths(fs.opt.source, cmd.mountpoint) < 0)
        goto out0;
    fs.source = realpath(fs.opt.source, NULL);
    if (!fs.source || (fs.srcfd = open(fs.source, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
        fprintf(stderr, "dcpfs: %s: %s\n", fs.opt.source, strerror(errno));
        goto out0;
    }
    if (dfs_read_init() < 0) {
        fprintf(stderr, "dcpfs: out of memory\n");
        goto out0;
    }
    if (dfs_source_init(&fs, err, sizeof err) < 0) {
        if (err[0])
            fprintf(stderr, "dcpfs: %s\n", err);
        goto out1;
    }
    if (dfs_verify_open(&fs) < 0)
        goto out1;

    char *fsname = fsname_opt(fs.source);
    if (!fsname || fuse_opt_add_arg(&args, fsname) < 0 || fuse_opt_add_arg(&args, "-oro,default_permissions") < 0) {
        free(fsname);
        fprintf(stderr, "dcpfs: out of memory\n");
        goto out1;
    }
    free(fsname);
    if (!fs.opt.max_read) {
        char mr[48];
        fs.opt.max_read = default_max_read(fs.pipe_max);
        snprintf(mr, sizeof mr, "-omax_read=%u", fs.opt.max_read);
        if (fuse_opt_add_arg(&args, mr) < 0) {
            fprintf(stderr, "dcpfs: out of memory\n");
            goto out1;
        }
    }
    dfs_log(LOG_DEBUG, "pipes hold %llu bytes: read requests of at most %u bytes",
            (unsigned long long)fs.pipe_max, fs.opt.max_read);
    se = fuse_session_new(&args, &dfs_ops, sizeof dfs_ops, &fs);
    if (!se)
        goto out1;
    fs.se = se;
    if (fuse_set_signal_handlers(se) != 0)
        goto out2;
    if (fuse_session_mount(se, cmd.mountpoint) != 0) {
        /* libfuse said why on the line above ("failed to open /dev/fuse:
         * Permission denied", "fusermount3: ..."); say what failed. */
        fprintf(stderr, "dcpfs: %s: could not mount %s there (the reason: libfuse's line above; a user other than "
                        "root needs read and write access to /dev/fuse, and fusermount3 installed setuid root)\n",
                cmd.mountpoint, fs.opt.source);
        goto out3;
    }
    if (fuse_daemonize(cmd.foreground) != 0)
        goto out4;
    if (!cmd.foreground) {
        dfs_log_to_syslog();
    }
    if (!cmd.clone_fd) {
        /* loop.c: names and attributes answered by the receiving thread; with -s, everything */
        unsigned workers = cmd.max_threads > 0 && cmd.max_threads <= 100000 ? (unsigned)cmd.max_threads : 10;
        ret = dfs_loop(&fs, se, cmd.singlethread ? 0 : workers);
    } else {
        cfg = fuse_loop_cfg_create();
        if (!cfg)
            goto out4;
        fuse_loop_cfg_set_clone_fd(cfg, (unsigned)cmd.clone_fd);
        if (cmd.max_idle_threads != UINT_MAX)
            fuse_loop_cfg_set_idle_threads(cfg, cmd.max_idle_threads);
        if (cmd.max_threads > 0 && cmd.max_threads <= 100000)
            fuse_loop_cfg_set_max_threads(cfg, cmd.max_threads);
        ret = fuse_session_loop_mt(se, cfg);
        fuse_loop_cfg_destroy(cfg);
    }
    ret = ret < 0;   /* > 0: ended by a signal, a clean unmount */
out4:
    fuse_session_unmount(se);
out3:
    fuse_remove_signal_handlers(se);
out2:
    fuse_session_destroy(se);
out1:
    dfs_read_fini();
    dfs_close_dirs(&fs);
    dfs_free_all(&fs);
    dcp_catalog_close(fs.catalog);
out0:;   /* a label takes a statement, not a declaration, before C23 */
    int rfd = __atomic_exchange_n(&fs.opt.ready_fd, -1, __ATOMIC_SEQ_CST);
    if (rfd >= 0)
        close(rfd);   /* EOF without a byte: the mount failed */
    if (fs.srcfd >= 0)
        close(fs.srcfd);
    free(fs.source);
    free(fs.opt.source);
    free(fs.opt.view_name);
    free(fs.opt.rank_text);
    free(fs.opt.hf_dtype);
    free(fs.opt.hf_config);
    free(fs.opt.hf_max_shard);
    free(fs.opt.hf_keys);
    free(fs.opt.hf_recipe);
    free(fs.opt.hf_recipe_dirs);
    free(fs.opt.read_name);
    free(fs.opt.catalog);
    free(cmd.mountpoint);
    fuse_opt_free_args(&args);
    return ret;
}
