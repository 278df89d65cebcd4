/* dcpfs: serving read requests.
 *
 * A file served from entries (a tensor or bytes item's file, the safetensors
 * view) is a header then byte ranges of entries (struct dfs_layout). A read
 * of [off, off+size) plans exactly the bytes of each entry it covers (widened
 * to whole elements) with dcp_plan_bytes; nothing else is read and no tensor
 * is ever held whole. Each entry's part of the reply is served one of two ways:
 *   - splice: when every op of the plan is a contiguous, untransformed run of
 *     a shard file, (fd, offset, length) pieces that libfuse splices from the
 *     page cache to /dev/fuse (no copy through this process);
 *   - pread: the plan is executed into one per-thread buffer (strided chunks,
 *     byte swapping, zstd, zero fill, or many small pieces).
 * -o read=auto (the default) splices when the mean piece is at least
 * -o splice_min bytes; bench/bench-fuse.sh measures both on row- and
 * column-sharded tensors to set that threshold.
 *
 * Every failure is logged (the message names the file and the key) and
 * answered with EIO (ENOMEM and ENOTSUP stay as they are: DFS_REPLY_ERRNO).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dcpfs.h"

struct rctx {
    dcp_plan plan;
    char *buf;
    size_t cap;
    char *stage;              /* view=hf: source elements staged for a cast */
    size_t stage_cap;
    struct fuse_bufvec *bv;
    size_t bvcap;
    size_t *order;
    size_t ordercap;
};

static pthread_key_t ctx_key;

static void ctx_free(void *p)
{
    struct rctx *c = p;
    dcp_plan_free(&c->plan);
    free(c->buf);
    free(c->stage);
    free(c->bv);
    free(c->order);
    free(c);
}

int dfs_read_init(void)
{
    return pthread_key_create(&ctx_key, ctx_free) == 0 ? 0 : -1;
}

void dfs_read_fini(void)
{
    struct rctx *c = pthread_getspecific(ctx_key);
    if (c) {
        ctx_free(c);
        pthread_setspecific(ctx_key, NULL);
    }
}

static struct rctx *ctx(void)
{
    struct rctx *c = pthread_getspecific(ctx_key);
    if (!c) {
        c = calloc(1, sizeof *c);
        if (!c)
            return NULL;
        dcp_plan_init(&c->plan);
        pthread_setspecific(ctx_key, c);
    }
    return c;
}

static int ctx_buf(struct rctx *c, size_t n)
{
    if (n <= c->cap)
        return 0;
    char *b = realloc(c->buf, n);
    if (!b)
        return -1;
    c->buf = b;
    c->cap = n;
    return 0;
}

static int ctx_bv(struct rctx *c, size_t n)
{
    if (n <= c->bvcap)
        return 0;
    struct fuse_bufvec *b = realloc(c->bv, sizeof *b + n * sizeof b->buf[0]);
    if (!b)
        return -1;
    c->bv = b;
    c->bvcap = n;
    return 0;
}

static void reply_log(const dcp_error *err, const char *key)
{
    if (key && !strstr(err->msg, key))
        dfs_log(LOG_ERR, "%s (reading %s)", err->msg, key);
    else
        dfs_log(LOG_ERR, "%s", err->msg);
}

int dfs_entry_size(struct dfs_node *n, uint64_t *size)
{
    int64_t s = atomic_load(&n->size);
    if (s >= 0) {
        *size = (uint64_t)s;
        return 0;
    }
    dcp_error err;
    uint64_t nb;
    if (dcp_entry_nbytes(n->ck->ck, n->entry, &nb, &err) < 0) {
        /* A zstd bytes item: its size is known only once decoded. */
        void *buf;
        if (dcp_read_entry(n->ck->ck, n->entry, &buf, &nb, &err) < 0) {
            dfs_log(LOG_ERR, "%s", err.msg);
            return -EIO;
        }
        free(buf);
    }
    if (nb > (uint64_t)INT64_MAX - n->npy_hdr_len)
        return -EFBIG;
    atomic_store(&n->size, (int64_t)(nb + n->npy_hdr_len));
    *size = nb + n->npy_hdr_len;
    return 0;
}

/* Size of shard file `file` (fstat once; checkpoints are immutable). */
static int shard_size(struct dfs_ckpt *ck, uint32_t file, int fd, uint64_t *size)
{
    int64_t s = atomic_load(&ck->file_sizes[file]);
    if (s < 0) {
        struct stat st;
        if (fstat(fd, &st) < 0)
            return -1;
        s = st.st_size;
        atomic_store(&ck->file_sizes[file], s);
    }
    *size = (uint64_t)s;
    return 0;
}

/* qsort has no context argument: the plan being sorted is per thread. */
static __thread const dcp_plan *tl_plan;
static int cmp_dest(const void *a, const void *b)
{
    uint64_t x = tl_plan->ops[*(const size_t *)a].dest_offset;
    uint64_t y = tl_plan->ops[*(const size_t *)b].dest_offset;
    return x < y ? -1 : x > y;
}

/* Can the plan be answered with fd pieces? Fills c->order with the op indices
 * in destination order. */
static int plan_spliceable(struct rctx *c, const dcp_plan *p)
{
    if (p->zero_fill || p->nops == 0)
        return 0;
    if (p->nops > c->ordercap) {
        size_t *o = realloc(c->order, p->nops * sizeof *o);
        if (!o)
            return 0;
        c->order = o;
        c->ordercap = p->nops;
    }
    int sorted = 1;
    for (size_t i = 0; i < p->nops; i++) {
        const dcp_op *op = &p->ops[i];
        if (op->flags || op->dest_stride != op->elem_size)
            return 0;
        c->order[i] = i;
        if (i && op->dest_offset < p->ops[i - 1].dest_offset)
            sorted = 0;
    }
    if (!sorted) {
        tl_plan = p;
        qsort(c->order, p->nops, sizeof *c->order, cmp_dest);
    }
    uint64_t at = 0;
    for (size_t i = 0; i < p->nops; i++) {
        const dcp_op *op = &p->ops[c->order[i]];
        if (op->dest_offset != at)
            return 0;
        at += op->length;
    }
    return at == p->nbytes;
}

/* ------------------------------------------------------- composite replies
 *
 * A reply is assembled in reply order as a fuse_bufvec of memory pieces
 * (header bytes, executed plans: all inside the per-thread buffer, which
 * mirrors the reply byte for byte) and fd pieces (spliceable runs of shard
 * files). The buffer is [slack][reply][16 bytes slack], the reply starting
 * at a multiple of 64 (the kernel's copies into a buffer 16 bytes past a
 * cache line run several times slower on some CPUs). A plan is widened to
 * whole elements, so its first bytes may land up to 15 bytes before its
 * place (saved and restored) and its last ones up to 15 after (overwritten
 * by what follows). */
struct reply {
    struct rctx *c;
    unsigned char *base;      /* reply byte i is base[i] */
    size_t len;               /* reply bytes */
    size_t k;                 /* pieces in c->bv */
    size_t nfd;               /* of which fd pieces */
    uint64_t slots;           /* pipe slots of the pieces (piece_slots) */
};

static size_t page_size(void)
{
    static size_t ps;
    if (!ps) {
        long p = sysconf(_SC_PAGESIZE);
        ps = p > 0 ? (size_t)p : 4096;
    }
    return ps;
}

/* Pipe slots a piece takes: one per page it touches (the page cache pages
 * are spliced one by one; a memory piece is copied into whole pages too). */
static uint64_t piece_slots(uint64_t pos, uint64_t size)
{
    uint64_t ps = page_size();
    return size ? (pos % ps + size + ps - 1) / ps : 0;
}

/* Does a reply of `len` bytes in `pieces` pieces taking `slots` pipe slots
 * fit libfuse's pipe? libfuse wants room for one page per piece plus two
 * plus the bytes (fuse_send_data_iov), and the pages must really fit, the
 * reply header taking a slot of its own. Otherwise libfuse would copy the
 * pieces into a fresh buffer itself. */
static int pipe_fits(const struct dfs *fs, size_t pieces, uint64_t slots, size_t len)
{
    uint64_t ps = page_size();
    return ps * (pieces + 2) + 16 + len <= fs->pipe_max && (slots + 1) * ps <= fs->pipe_max;
}

static int add_mem(struct reply *r, size_t at, size_t n)
{
    if (!n)
        return 0;
    struct fuse_bufvec *bv = r->c->bv;
    if (r->k) {
        struct fuse_buf *last = &bv->buf[r->k - 1];
        if (!(last->flags & FUSE_BUF_IS_FD) && (unsigned char *)last->mem + last->size == r->base + at) {
            r->slots -= piece_slots((uintptr_t)last->mem, last->size);
            last->size += n;
            r->slots += piece_slots((uintptr_t)last->mem, last->size);
            return 0;
        }
    }
    r->slots += piece_slots((uintptr_t)(r->base + at), n);
    if (ctx_bv(r->c, r->k + 1) < 0)
        return -ENOMEM;
    r->c->bv->buf[r->k++] = (struct fuse_buf){.size = n, .mem = r->base + at};
    return 0;
}

static int add_fd(struct reply *r, int fd, off_t pos, size_t n)
{
    struct fuse_bufvec *bv = r->c->bv;
    if (r->k) {
        struct fuse_buf *last = &bv->buf[r->k - 1];
        if ((last->flags & FUSE_BUF_IS_FD) && last->fd == fd && last->pos + (off_t)last->size == pos) {
            r->slots -= piece_slots((uint64_t)last->pos, last->size);
            last->size += n;
            r->slots += piece_slots((uint64_t)last->pos, last->size);
            return 0;
        }
    }
    r->slots += piece_slots((uint64_t)pos, n);
    if (ctx_bv(r->c, r->k + 1) < 0)
        return -ENOMEM;
    r->c->bv->buf[r->k++] = (struct fuse_buf){
        .size = n, .flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK, .fd = fd, .pos = pos};
    r->nfd++;
    return 0;
}

/* The plan's bytes [skip, skip+len) as fd pieces at reply offset `at`.
 * c->order holds the ops in destination order (plan_spliceable). */
static int splice_plan(struct reply *r, struct dfs_ckpt *ck, const char *key, uint64_t skip, uint64_t len)
{
    struct rctx *c = r->c;
    const dcp_plan *p = &c->plan;
    dcp_error err;
    uint64_t at = 0, end = skip + len;
    for (size_t i = 0; i < p->nops && at < end; i++) {
        const dcp_op *op = &p->ops[c->order[i]];
        uint64_t o0 = at, o1 = at + op->length;
        at = o1;
        if (o1 <= skip)
            continue;
        uint64_t from = o0 < skip ? skip - o0 : 0;
        uint64_t to = o1 > end ? op->length - (o1 - end) : op->length;
        int fd;
        uint64_t fsz = 0;
        if (dcp_file_fd(ck->ck, op->file, &fd, &err) < 0) {
            reply_log(&err, key);
            return -DFS_REPLY_ERRNO(err.code);
        }
        if (shard_size(ck, op->file, fd, &fsz) < 0 || op->src_offset + op->length > fsz) {
            dfs_log(LOG_ERR, "%s/%s: %s: the file ends before the chunk's bytes (needs %llu bytes, has %llu)",
                    ck->path, dcp_file_name(ck->ck, op->file), key,
                    (unsigned long long)(op->src_offset + op->length), (unsigned long long)fsz);
            return -EIO;
        }
        int rc = add_fd(r, fd, (off_t)(op->src_offset + from), (size_t)(to - from));
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Should this plan be answered with fd pieces? */
static int want_splice(struct dfs *fs, struct reply *r, const dcp_plan *p)
{
    if (!fs->splice_ok || fs->opt.readmode == DFS_READ_PREAD || !plan_spliceable(r->c, p))
        return 0;
    if (fs->opt.readmode == DFS_READ_SPLICE)
        return 1;
    /* auto: pieces large enough to be worth it, and a reply libfuse can
     * really splice (one more piece allowed for what may follow; the plan
     * may hold a little more than this request needs). */
    if (p->nbytes / p->nops < fs->opt.splice_min)
        return 0;
    uint64_t slots = r->slots + 1;
    for (size_t i = 0; i < p->nops; i++)
        slots += piece_slots(p->ops[i].src_offset, p->ops[i].length);
    return pipe_fits(fs, r->k + p->nops + 1, slots, r->len);
}

/* Reply bytes [at, at+(b-a)) are bytes [a, b) of segment s. */
static int add_segment(struct reply *r, struct dfs *fs, struct dfs_ckpt *ck, const dcp_st_view_tensor *s,
                       uint64_t a, uint64_t b, size_t at)
{
    const dcp_entry *e = s->entry;
    struct rctx *c = r->c;
    uint64_t esz = e->kind == DCP_KIND_TENSOR ? dcp_dtype_size(e->dtype) : 1;
    if (esz == 0 || esz > 16)
        esz = 1;
    /* The planner takes whole elements; the extra bytes are trimmed. */
    uint64_t a0 = a - a % esz;
    uint64_t a1 = b % esz ? b + (esz - b % esz) : b;
    if (a1 > s->length)
        a1 = s->length;
    dcp_error err;
    if (dcp_plan_bytes(ck->ck, e, a0, a1 - a0, &c->plan, &err) < 0) {
        reply_log(&err, e->key);
        return -DFS_REPLY_ERRNO(err.code);
    }
    if (c->plan.nbytes < b - a0) {
        dfs_log(LOG_ERR, "%s: %s: the planner gave %llu bytes at %llu, %llu expected", ck->path, e->key,
                (unsigned long long)c->plan.nbytes, (unsigned long long)a0, (unsigned long long)(b - a0));
        return -EIO;
    }
    int rc = dfs_verify_plan(fs, ck, e, &c->plan);
    if (rc < 0)
        return rc;
    if (want_splice(fs, r, &c->plan))
        return splice_plan(r, ck, e->key, a - a0, b - a);
    unsigned char keep[16];
    size_t lead = (size_t)(a - a0);
    unsigned char *dst = r->base + at - lead;
    if (lead)
        memcpy(keep, dst, lead);
    if (dcp_plan_execute(ck->ck, &c->plan, dst, &err) < 0) {
        reply_log(&err, e->key);
        return -DFS_REPLY_ERRNO(err.code);
    }
    if (lead)
        memcpy(dst, keep, lead);
    return add_mem(r, at, (size_t)(b - a));
}

/* The fd pieces read into the buffer: the reply becomes one memory piece. */
static int read_fd_pieces(struct reply *r)
{
    struct fuse_bufvec *bv = r->c->bv;
    size_t at = 0;
    for (size_t i = 0; i < r->k; i++) {
        struct fuse_buf *b = &bv->buf[i];
        size_t got = 0;
        while ((b->flags & FUSE_BUF_IS_FD) && got < b->size) {
            ssize_t n = pread(b->fd, r->base + at + got, b->size - got, b->pos + (off_t)got);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0) {
                dfs_log(LOG_ERR, "reading a shard file at %lld: %s", (long long)(b->pos + (off_t)got),
                        n < 0 ? strerror(errno) : "unexpected end of file");
                return -EIO;
            }
            got += (size_t)n;
        }
        at += b->size;
    }
    return 0;
}

/* Just before a splice reply: does every fd piece still lie inside its file?
 * libfuse answers a splice that meets the end of the file with the shorter
 * count, which a reader takes for the end of the tensor (O_DIRECT, or a
 * page the cache lacks): a shard truncated since the mount must give EIO, as
 * the pread path does (read_fd_pieces). One fstat per piece; a truncation
 * between this check and the splice still gives a short reply. */
static int fd_pieces_present(struct reply *r)
{
    const struct fuse_bufvec *bv = r->c->bv;
    for (size_t i = 0; i < r->k; i++) {
        const struct fuse_buf *b = &bv->buf[i];
        struct stat st;
        if (!(b->flags & FUSE_BUF_IS_FD))
            continue;
        if (fstat(b->fd, &st) < 0 || (uint64_t)st.st_size < (uint64_t)b->pos + b->size) {
            dfs_log(LOG_ERR, "a shard file ends before the chunk's bytes (needs %llu bytes, has %lld): changed since the mount",
                    (unsigned long long)b->pos + b->size, (long long)st.st_size);
            return -EIO;
        }
    }
    return 0;
}

/* Answer a read of [off, off+size) of a file laid out as `lay`. */
static void read_layout(fuse_req_t req, struct dfs *fs, struct dfs_ckpt *ck, const struct dfs_layout *lay,
                        size_t size, off_t off)
{
    if (off < 0 || (uint64_t)off >= lay->size || size == 0) {
        fuse_reply_buf(req, NULL, 0);
        return;
    }
    uint64_t start = (uint64_t)off;
    uint64_t end = lay->size - start < size ? lay->size : start + size;
    struct rctx *c = ctx();
    if (!c || ctx_buf(c, 144 + (size_t)(end - start)) < 0 || ctx_bv(c, 4) < 0) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    unsigned char *base = (unsigned char *)(((uintptr_t)c->buf + 16 + 63) & ~(uintptr_t)63);
    struct reply r = {.c = c, .base = base, .len = (size_t)(end - start)};
    uint64_t pos = start;
    int rc = 0;
    if (pos < lay->hdr_len) {
        size_t n = (size_t)((end < lay->hdr_len ? end : lay->hdr_len) - pos);
        memcpy(r.base, lay->hdr + pos, n);
        rc = add_mem(&r, 0, n);
        pos += n;
    }
    for (size_t i = dcp_st_view_find(lay->segs, lay->nsegs, pos); rc == 0 && i < lay->nsegs && pos < end; i++) {
        const dcp_st_view_tensor *s = &lay->segs[i];
        if (s->offset > pos) {
            dfs_log(LOG_ERR, "%s: a hole before %s in a virtual file's layout", ck->path, s->entry->key);
            rc = -EIO;
            break;
        }
        uint64_t a = pos - s->offset;
        uint64_t b = (end < s->offset + s->length ? end : s->offset + s->length) - s->offset;
        if (b > a)
            rc = add_segment(&r, fs, ck, s, a, b, (size_t)(pos - start));
        pos += b - a;
    }
    if (rc == 0 && pos != end) {
        dfs_log(LOG_ERR, "%s: a virtual file's layout ends before its size", ck->path);
        rc = -EIO;
    }
    if (rc < 0) {
        fuse_reply_err(req, -rc);
        return;
    }
    if (r.nfd == 0) {
        fuse_reply_buf(req, (char *)r.base, r.len);
        return;
    }
    if (fs->opt.readmode == DFS_READ_SPLICE || pipe_fits(fs, r.k, r.slots, r.len)) {
        if ((rc = fd_pieces_present(&r)) < 0) {
            fuse_reply_err(req, -rc);
            return;
        }
        c->bv->count = r.k;
        c->bv->idx = 0;
        c->bv->off = 0;
        fuse_reply_data(req, c->bv, FUSE_BUF_SPLICE_MOVE);
        return;
    }
    /* auto, and the pieces outgrew the pipe: read them here. */
    rc = read_fd_pieces(&r);
    if (rc < 0)
        fuse_reply_err(req, -rc);
    else
        fuse_reply_buf(req, (char *)r.base, r.len);
}

void dfs_read_entry(fuse_req_t req, struct dfs *fs, struct dfs_node *n, size_t size, off_t off)
{
    uint64_t fsize;
    int rc = dfs_entry_size(n, &fsize);
    if (rc < 0) {
        fuse_reply_err(req, -rc);
        return;
    }
    dcp_st_view_tensor seg = {.entry = n->entry, .offset = n->npy_hdr_len, .length = fsize - n->npy_hdr_len};
    struct dfs_layout lay = {.hdr = (const unsigned char *)n->npy_hdr, .hdr_len = n->npy_hdr_len,
                             .segs = &seg, .nsegs = 1, .size = fsize};
    read_layout(req, fs, n->ck, &lay, size, off);
}

int dfs_open_regular(int dirfd, const char *path)
{
    /* O_NONBLOCK: a FIFO put in the file's place must not hang a worker
     * (regular files ignore it) */
    int fd = openat(dirfd, path, O_RDONLY | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return -ENOENT;   /* no longer the file that was listed */
    }
    return fd;
}

void dfs_read_fd(fuse_req_t req, struct dfs *fs, int fd, uint64_t fsize, size_t size, off_t off)
{
    if (off < 0 || (uint64_t)off >= fsize || size == 0) {
        fuse_reply_buf(req, NULL, 0);
        return;
    }
    if (fsize - (uint64_t)off < size)
        size = (size_t)(fsize - (uint64_t)off);
    if (fs->splice_ok && fs->opt.readmode != DFS_READ_PREAD) {
        struct fuse_bufvec bv = FUSE_BUFVEC_INIT(size);
        bv.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
        bv.buf[0].fd = fd;
        bv.buf[0].pos = off;
        fuse_reply_data(req, &bv, FUSE_BUF_SPLICE_MOVE);
        return;
    }
    struct rctx *c = ctx();
    if (!c || ctx_buf(c, size) < 0) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    size_t got = 0;
    while (got < size) {
        ssize_t r = pread(fd, c->buf + got, size - got, off + (off_t)got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            fuse_reply_err(req, EIO);
            return;
        }
        if (r == 0)
            break;
        got += (size_t)r;
    }
    fuse_reply_buf(req, c->buf, got);
}

/* A computed file that renders its bytes itself (view=hf): into the
 * per-thread buffer, through a staging buffer twice the request (a cast to
 * a dtype half as wide reads the source in one plan). */
static void read_rendered(fuse_req_t req, struct dfs_node *n, size_t size, off_t off)
{
    struct rctx *c = ctx();
    size_t stage = 2 * size + 64;
    if (!c || ctx_buf(c, size ? size : 1) < 0) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    if (stage > c->stage_cap) {
        char *g = realloc(c->stage, stage);
        if (!g) {
            fuse_reply_err(req, ENOMEM);
            return;
        }
        c->stage = g;
        c->stage_cap = stage;
    }
    size_t got = 0;
    int rc = off < 0 ? 0 : n->vops->read(n, (uint64_t)off, c->buf, size, &got, &c->plan, c->stage, c->stage_cap);
    if (rc < 0)
        fuse_reply_err(req, -rc);
    else
        fuse_reply_buf(req, c->buf, got);
}

void dfs_read_virtual(fuse_req_t req, struct dfs *fs, struct dfs_node *n, size_t size, off_t off)
{
    if (n->vops && n->vops->read) {
        read_rendered(req, n, size, off);
        return;
    }
    struct dfs_layout lay;
    int rc = n->vops ? n->vops->layout(n, &lay) : -EIO;
    if (rc < 0)
        fuse_reply_err(req, -rc);
    else
        read_layout(req, fs, n->ck, &lay, size, off);
}
