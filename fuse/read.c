/* dcpfs: serving read requests.
 *
 * A read of [off, off+size) of a tensor file plans exactly those bytes
 * (widened to whole elements) with dcp_plan_bytes; nothing else is read and
 * no tensor is ever held whole. The reply is built one of two ways:
 *   - splice: when every op of the plan is a contiguous, untransformed run of
 *     a shard file, the reply is a fuse_bufvec of (fd, offset, length) pieces
 *     and libfuse splices them from the page cache to /dev/fuse (no copy
 *     through this process);
 *   - pread: the plan is executed into one per-thread buffer (strided chunks,
 *     byte swapping, zstd, zero fill, or many small pieces).
 * -o read=auto (the default) splices when the mean piece is at least
 * -o splice_min bytes; bench/bench-fuse.sh measures both on row- and
 * column-sharded tensors to set that threshold.
 *
 * Every failure is logged (the message names the file and the key) and
 * answered with EIO (ENOMEM stays ENOMEM).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dcpfs.h"

struct rctx {
    dcp_plan plan;
    char *buf;
    size_t cap;
    struct fuse_bufvec *bv;
    size_t bvcap;
    size_t *order;
    size_t ordercap;
};

static pthread_key_t ctx_key;

#define PAGE_SLOTS(n) ((n) * 4096u)

static void ctx_free(void *p)
{
    struct rctx *c = p;
    dcp_plan_free(&c->plan);
    free(c->buf);
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

static int reply_err(fuse_req_t req, const dcp_error *err, const char *key)
{
    if (key && !strstr(err->msg, key))
        dfs_log(LOG_ERR, "%s (reading %s)", err->msg, key);
    else
        dfs_log(LOG_ERR, "%s", err->msg);
    return fuse_reply_err(req, err->code == ENOMEM ? ENOMEM : EIO);
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

/* Reply with header bytes hdr[0..hl) then plan bytes [skip, skip+len) as fd pieces. */
static int reply_splice(fuse_req_t req, struct rctx *c, struct dfs_node *n, const char *hdr, size_t hl,
                        uint64_t skip, uint64_t len)
{
    const dcp_plan *p = &c->plan;
    dcp_error err;
    if (ctx_bv(c, p->nops + 1) < 0)
        return fuse_reply_err(req, ENOMEM);
    struct fuse_bufvec *bv = c->bv;
    size_t k = 0;
    if (hl) {
        bv->buf[k++] = (struct fuse_buf){.size = hl, .mem = (void *)hdr};
    }
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
        if (dcp_file_fd(n->ck->ck, op->file, &fd, &err) < 0)
            return reply_err(req, &err, n->entry->key);
        if (shard_size(n->ck, op->file, fd, &fsz) < 0 || op->src_offset + op->length > fsz) {
            dfs_log(LOG_ERR, "%s/%s: %s: the file ends before the chunk's bytes (needs %llu bytes, has %llu)",
                    n->ck->path, dcp_file_name(n->ck->ck, op->file), n->entry->key,
                    (unsigned long long)(op->src_offset + op->length), (unsigned long long)fsz);
            return fuse_reply_err(req, EIO);
        }
        off_t pos = (off_t)(op->src_offset + from);
        size_t sz = (size_t)(to - from);
        /* Merge with the previous piece when it continues in the same file. */
        if (k && (bv->buf[k - 1].flags & FUSE_BUF_IS_FD) && bv->buf[k - 1].fd == fd &&
            bv->buf[k - 1].pos + (off_t)bv->buf[k - 1].size == pos) {
            bv->buf[k - 1].size += sz;
            continue;
        }
        bv->buf[k++] = (struct fuse_buf){
            .size = sz, .flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK, .fd = fd, .pos = pos};
    }
    bv->count = k;
    bv->idx = 0;
    bv->off = 0;
    return fuse_reply_data(req, bv, FUSE_BUF_SPLICE_MOVE);
}

void dfs_read_entry(fuse_req_t req, struct dfs *fs, struct dfs_node *n, size_t size, off_t off)
{
    uint64_t fsize;
    int rc = dfs_entry_size(n, &fsize);
    if (rc < 0) {
        fuse_reply_err(req, -rc);
        return;
    }
    if (off < 0 || (uint64_t)off >= fsize || size == 0) {
        fuse_reply_buf(req, NULL, 0);
        return;
    }
    uint64_t start = (uint64_t)off;
    uint64_t end = fsize - start < size ? fsize : start + size;
    uint64_t hdr = n->npy_hdr_len;
    size_t hl = start < hdr ? (size_t)((end < hdr ? end : hdr) - start) : 0;
    struct rctx *c = ctx();
    if (!c) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    if (end <= hdr) {
        fuse_reply_buf(req, n->npy_hdr + start, hl);
        return;
    }
    const dcp_entry *e = n->entry;
    uint64_t d0 = start > hdr ? start - hdr : 0, d1 = end - hdr, total = fsize - hdr;
    uint64_t esz = e->kind == DCP_KIND_TENSOR ? dcp_dtype_size(e->dtype) : 1;
    if (esz == 0 || esz > 16)
        esz = 1;
    /* The planner takes whole elements; trim the extra bytes from the reply. */
    uint64_t a0 = d0 - d0 % esz;
    uint64_t a1 = d1 % esz ? d1 + (esz - d1 % esz) : d1;
    if (a1 > total)
        a1 = total;
    dcp_error err;
    if (dcp_plan_bytes(n->ck->ck, e, a0, a1 - a0, &c->plan, &err) < 0) {
        reply_err(req, &err, e->key);
        return;
    }
    int vrc = dfs_verify_plan(fs, n->ck, e, &c->plan);
    if (vrc < 0) {
        fuse_reply_err(req, -vrc);
        return;
    }
    const char *h = hl ? n->npy_hdr + start : NULL;
    /* libfuse splices only when the reply fits its pipe (one slot per page
     * touched, at most fs/pipe-max-size); otherwise it would pread into a
     * fresh buffer itself, so answer such requests from our buffer instead. */
    uint64_t pipe_need = (uint64_t)PAGE_SLOTS(c->plan.nops + 2) + 16 + hl + (d1 - d0);
    if (fs->splice_ok && fs->opt.readmode != DFS_READ_PREAD && plan_spliceable(c, &c->plan) &&
        (fs->opt.readmode == DFS_READ_SPLICE ||
         (c->plan.nbytes / c->plan.nops >= fs->opt.splice_min && pipe_need <= fs->pipe_max))) {
        reply_splice(req, c, n, h, hl, d0 - a0, d1 - d0);
        return;
    }
    /* One buffer: [16 bytes slack][header part][data], the data executed at
     * base + hl - (d0 - a0) so the reply starts at base. */
    if (ctx_buf(c, 32 + hl + (size_t)(a1 - a0)) < 0) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    char *base = c->buf + 16;
    if (hl)
        memcpy(base, h, hl);
    char *dst = base + hl - (d0 - a0);
    if (c->plan.zero_fill)
        memset(dst, 0, (size_t)c->plan.nbytes);
    if (dcp_plan_execute(n->ck->ck, &c->plan, dst, &err) < 0) {
        reply_err(req, &err, e->key);
        return;
    }
    fuse_reply_buf(req, base, hl + (size_t)(d1 - d0));
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

void dfs_read_virtual(fuse_req_t req, struct dfs_node *n, size_t size, off_t off)
{
    uint64_t fsize;
    if (!n->vops || n->vops->size(n, &fsize) < 0) {
        fuse_reply_err(req, EIO);
        return;
    }
    if (off < 0 || (uint64_t)off >= fsize || size == 0) {
        fuse_reply_buf(req, NULL, 0);
        return;
    }
    if (fsize - (uint64_t)off < size)
        size = (size_t)(fsize - (uint64_t)off);
    struct rctx *c = ctx();
    if (!c || ctx_buf(c, size) < 0) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    int rc = n->vops->read(n, c->buf, size, (uint64_t)off);
    if (rc < 0)
        fuse_reply_err(req, -rc);
    else
        fuse_reply_buf(req, c->buf, size);
}
