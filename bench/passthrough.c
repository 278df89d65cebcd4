/* bench/passthrough: the baseline of bench/bench-fuse.sh, a minimal read-only
 * libfuse low-level passthrough of one flat folder (a checkpoint's shard
 * files). It answers reads either the way libfuse's passthrough_ll does,
 * with an (fd, offset) buffer that libfuse splices (-o read=splice, the
 * default; libfuse copies through a fresh buffer when the reply does not fit
 * its pipe), or with pread into a reused per-thread buffer (-o read=pread),
 * and uses the same settings as dcpfs (multi-threaded, keep_cache, long
 * timeouts, max_read), so the comparison measures dcpfs's own work against
 * the better of the two.
 *
 * usage: passthrough [-f] [-s] [-o ready_fd=N,read=splice|pread,max_read=N] SOURCE MOUNTPOINT
 */
#define FUSE_USE_VERSION 312

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct file {
    char *name;
    int fd;
    struct stat st;
};

static struct {
    char *source;
    int ready_fd;
    char *read;           /* "splice" (default) or "pread" */
    unsigned max_read;    /* libfuse's -o max_read, repeated in init */
    pthread_key_t buf_key;
    const char *mnt;
    struct file *files;   /* inode i+2 is files[i] */
    size_t nfiles;
    struct stat root;
} P = {.ready_fd = -1};

#define MAX_REQ (1u << 20)
enum { KEY_READY = 1, KEY_READ, KEY_MAX_READ };
static const struct fuse_opt opts[] = {
    FUSE_OPT_KEY("ready_fd=", KEY_READY), FUSE_OPT_KEY("read=", KEY_READ), FUSE_OPT_KEY("max_read=", KEY_MAX_READ),
    FUSE_OPT_END};

static int opt_proc(void *data, const char *arg, int key, struct fuse_args *out)
{
    (void)data;
    (void)out;
    switch (key) {
    case FUSE_OPT_KEY_NONOPT:
        if (P.source)
            return 1;
        P.source = strdup(arg);
        return 0;
    case KEY_READY:
        P.ready_fd = atoi(strchr(arg, '=') + 1);
        return 0;
    case KEY_READ:
        P.read = strdup(strchr(arg, '=') + 1);
        return 0;
    case KEY_MAX_READ:
        P.max_read = (unsigned)strtoul(strchr(arg, '=') + 1, NULL, 10);
        return 1;   /* libfuse's mount option too */
    }
    return 1;
}

static int fill(fuse_ino_t ino, struct stat *st)
{
    if (ino == FUSE_ROOT_ID) {
        *st = P.root;
    } else if (ino >= 2 && ino - 2 < P.nfiles) {
        *st = P.files[ino - 2].st;
    } else {
        return -1;
    }
    st->st_ino = ino;
    return 0;
}

static void *ready(void *arg)
{
    (void)arg;
    struct stat st;
    if (stat(P.mnt, &st) == 0 && P.ready_fd >= 0)
        if (write(P.ready_fd, "1", 1) < 0)
            perror("ready_fd");
    if (P.ready_fd >= 0)
        close(P.ready_fd);
    return NULL;
}

static void pt_init(void *u, struct fuse_conn_info *conn)
{
    (void)u;
    if ((conn->capable & FUSE_CAP_SPLICE_WRITE) && strcmp(P.read, "pread") != 0)
        conn->want |= FUSE_CAP_SPLICE_WRITE;
    conn->max_background = 64;
    conn->congestion_threshold = 48;
    if (P.max_read)
        conn->max_read = P.max_read;
    pthread_t t;
    pthread_create(&t, NULL, ready, NULL);
    pthread_detach(t);
}

static void pt_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    struct fuse_entry_param e;
    memset(&e, 0, sizeof e);
    e.attr_timeout = e.entry_timeout = 86400;
    if (parent == FUSE_ROOT_ID)
        for (size_t i = 0; i < P.nfiles; i++)
            if (strcmp(P.files[i].name, name) == 0) {
                e.ino = i + 2;
                fill(e.ino, &e.attr);
                break;
            }
    fuse_reply_entry(req, &e);
}

static void pt_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    (void)fi;
    struct stat st;
    if (fill(ino, &st) < 0)
        fuse_reply_err(req, ENOENT);
    else
        fuse_reply_attr(req, &st, 86400);
}

static void pt_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    if (ino < 2 || ino - 2 >= P.nfiles) {
        fuse_reply_err(req, EISDIR);
        return;
    }
    fi->keep_cache = 1;
    fuse_reply_open(req, fi);
}

static void pt_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
    (void)fi;
    if (strcmp(P.read, "pread") == 0) {
        /* One page-aligned buffer per thread, reused. */
        char *buf = pthread_getspecific(P.buf_key);
        if (!buf && posix_memalign((void **)&buf, 4096, MAX_REQ) == 0)
            pthread_setspecific(P.buf_key, buf);
        if (!buf || size > MAX_REQ) {
            fuse_reply_err(req, buf ? EINVAL : ENOMEM);
            return;
        }
        ssize_t n = pread(P.files[ino - 2].fd, buf, size, off);
        if (n < 0)
            fuse_reply_err(req, errno);
        else
            fuse_reply_buf(req, buf, (size_t)n);
        return;
    }
    struct fuse_bufvec bv = FUSE_BUFVEC_INIT(size);
    bv.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
    bv.buf[0].fd = P.files[ino - 2].fd;
    bv.buf[0].pos = off;
    fuse_reply_data(req, &bv, 0);
}

static void pt_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
    (void)fi;
    if (ino != FUSE_ROOT_ID) {
        fuse_reply_err(req, ENOTDIR);
        return;
    }
    char *buf = malloc(size);
    size_t used = 0;
    for (size_t i = (size_t)off; buf && i < P.nfiles; i++) {
        struct stat st;
        fill(i + 2, &st);
        size_t n = fuse_add_direntry(req, buf + used, size - used, P.files[i].name, &st, (off_t)i + 1);
        if (n > size - used)
            break;
        used += n;
    }
    fuse_reply_buf(req, buf, used);
    free(buf);
}

static const struct fuse_lowlevel_ops ops = {
    .init = pt_init, .lookup = pt_lookup, .getattr = pt_getattr, .open = pt_open,
    .read = pt_read, .readdir = pt_readdir,
};

int main(int argc, char *argv[])
{
    struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
    struct fuse_cmdline_opts o;
    if (fuse_opt_parse(&args, NULL, opts, opt_proc) < 0 || fuse_parse_cmdline(&args, &o) != 0)
        return 1;
    if (!P.source || !o.mountpoint) {
        fprintf(stderr, "usage: %s [-f] [-s] [-o ready_fd=N] SOURCE MOUNTPOINT\n", argv[0]);
        return 1;
    }
    P.mnt = o.mountpoint;
    if (!P.read)
        P.read = strdup("splice");
    if (strcmp(P.read, "splice") != 0 && strcmp(P.read, "pread") != 0) {
        fprintf(stderr, "%s: -o read=%s: expected splice or pread\n", argv[0], P.read);
        return 1;
    }
    if (pthread_key_create(&P.buf_key, free) != 0)
        return 1;
    DIR *d = opendir(P.source);
    if (!d || stat(P.source, &P.root) < 0) {
        perror(P.source);
        return 1;
    }
    struct dirent *de;
    while ((de = readdir(d))) {
        struct file f = {0};
        if (de->d_name[0] == '.' && (!de->d_name[1] || (de->d_name[1] == '.' && !de->d_name[2])))
            continue;
        f.fd = openat(dirfd(d), de->d_name, O_RDONLY | O_CLOEXEC);
        if (f.fd < 0 || fstat(f.fd, &f.st) < 0 || !S_ISREG(f.st.st_mode)) {
            if (f.fd >= 0)
                close(f.fd);
            continue;
        }
        f.name = strdup(de->d_name);
        struct file *g = realloc(P.files, (P.nfiles + 1) * sizeof *g);
        if (!g || !f.name)
            return 1;
        P.files = g;
        P.files[P.nfiles++] = f;
    }
    closedir(d);
    fuse_opt_add_arg(&args, "-oro");
    struct fuse_session *se = fuse_session_new(&args, &ops, sizeof ops, NULL);
    if (!se || fuse_set_signal_handlers(se) != 0 || fuse_session_mount(se, o.mountpoint) != 0)
        return 1;
    fuse_daemonize(o.foreground);
    int ret;
    if (o.singlethread) {
        ret = fuse_session_loop(se);
    } else {
        struct fuse_loop_config *cfg = fuse_loop_cfg_create();
        ret = fuse_session_loop_mt(se, cfg);
        fuse_loop_cfg_destroy(cfg);
    }
    fuse_session_unmount(se);
    fuse_remove_signal_handlers(se);
    fuse_session_destroy(se);
    for (size_t i = 0; i < P.nfiles; i++) {
        close(P.files[i].fd);
        free(P.files[i].name);
    }
    free(P.files);
    free(P.source);
    free(P.read);
    free(o.mountpoint);
    fuse_opt_free_args(&args);
    return ret < 0;
}
