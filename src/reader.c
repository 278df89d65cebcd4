/* The reader: the execution of read plans (dcp_plan_execute): ops sorted
 * by file and offset, adjacent direct ops in one vectored read straight
 * into the region buffer, strided and transformed ones through a bounce
 * buffer and placed (dcp_op_place); dcp_op_fetch, an op read whole (from
 * a decoded blob or the file). Reading the files is files.c's. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "files.h"
#include "internal.h"

/* ------------------------------------------------------------ placing */

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define SIGN_BYTE(unit) 0
#else
#define SIGN_BYTE(unit) ((unit) - 1)
#endif

static void bswap_elem(unsigned char *q, size_t esz, size_t u)
{
    for (size_t k = 0; k + u <= esz; k += u) {
        if (u == 2) {
            uint16_t v; memcpy(&v, q + k, 2); v = __builtin_bswap16(v); memcpy(q + k, &v, 2);
        } else if (u == 4) {
            uint32_t v; memcpy(&v, q + k, 4); v = __builtin_bswap32(v); memcpy(q + k, &v, 4);
        } else if (u == 8) {
            uint64_t v; memcpy(&v, q + k, 8); v = __builtin_bswap64(v); memcpy(q + k, &v, 8);
        } else {
            for (size_t a = k, b = k + u - 1; a < b; a++, b--) {
                unsigned char t = q[a]; q[a] = q[b]; q[b] = t;
            }
        }
    }
}

static int is_complex(dcp_dtype dt)
{
    return dt == DCP_COMPLEX128 || dt == DCP_COMPLEX64 || dt == DCP_COMPLEX32;
}

static int is_float(dcp_dtype dt)
{
    return dt == DCP_FLOAT64 || dt == DCP_FLOAT32 || dt == DCP_FLOAT16 || dt == DCP_BFLOAT16;
}

static int is_int(dcp_dtype dt)
{
    switch (dt) {
    case DCP_INT64: case DCP_INT32: case DCP_INT16: case DCP_INT8:
    case DCP_UINT64: case DCP_UINT32: case DCP_UINT16: case DCP_UINT8:
        return 1;
    default:
        return 0;
    }
}

/* Two's complement negation of one integer element in host order. */
static void neg_int(unsigned char *q, size_t esz)
{
    switch (esz) {
    case 1: q[0] = (unsigned char)(0u - q[0]); break;
    case 2: { uint16_t v; memcpy(&v, q, 2); v = (uint16_t)(0u - v); memcpy(q, &v, 2); break; }
    case 4: { uint32_t v; memcpy(&v, q, 4); v = 0u - v; memcpy(q, &v, 4); break; }
    case 8: { uint64_t v; memcpy(&v, q, 8); v = 0u - v; memcpy(q, &v, 8); break; }
    }
}

/* Apply an op's flags to n elements at p, stride bytes apart. Byte swapping
 * comes first so the arithmetic sees host-order values; negating an IEEE
 * value (or a complex half) is flipping its sign bit. */
static void fix_elems(unsigned char *p, uint64_t n, uint64_t stride, size_t esz, uint32_t flags,
                      dcp_dtype dt)
{
    size_t u = dcp_dtype_swap_unit(dt);
    int bswap = (flags & DCP_OP_BSWAP) && u > 1 && esz % u == 0;
    int cplx = is_complex(dt) && esz % 2 == 0;
    int conj = (flags & DCP_OP_CONJ) && cplx;
    int neg = (flags & DCP_OP_NEG) && (cplx || is_float(dt) || is_int(dt));
    if (!bswap && !conj && !neg)
        return;
    size_t half = esz / 2;
    for (uint64_t i = 0; i < n; i++, p += stride) {
        if (bswap)
            bswap_elem(p, esz, u);
        if (conj)
            p[half + SIGN_BYTE(half)] ^= 0x80;
        if (neg) {
            if (cplx) {
                p[SIGN_BYTE(half)] ^= 0x80;
                p[half + SIGN_BYTE(half)] ^= 0x80;
            } else if (is_float(dt)) {
                p[SIGN_BYTE(esz)] ^= 0x80;
            } else {
                neg_int(p, esz);
            }
        }
    }
}

void dcp_op_place(const dcp_op *op, const void *src, void *region, dcp_dtype dtype)
{
    size_t esz = op->elem_size;
    if (!esz)
        return;
    uint64_t n = op->length / esz, stride = op->dest_stride;
    unsigned char *d = (unsigned char *)region + op->dest_offset;
    const unsigned char *s = src;
    if (stride == esz || n == 1) {
        memcpy(d, s, (size_t)op->length);
        stride = esz;
    } else {
        /* fixed-size copies so the compiler emits plain loads and stores */
        switch (esz) {
        case 1: for (uint64_t i = 0; i < n; i++) d[i * stride] = s[i]; break;
        case 2: for (uint64_t i = 0; i < n; i++) memcpy(d + i * stride, s + 2 * i, 2); break;
        case 4: for (uint64_t i = 0; i < n; i++) memcpy(d + i * stride, s + 4 * i, 4); break;
        case 8: for (uint64_t i = 0; i < n; i++) memcpy(d + i * stride, s + 8 * i, 8); break;
        case 16: for (uint64_t i = 0; i < n; i++) memcpy(d + i * stride, s + 16 * i, 16); break;
        default: for (uint64_t i = 0; i < n; i++) memcpy(d + i * stride, s + esz * i, esz); break;
        }
    }
    if (op->flags & (DCP_OP_BSWAP | DCP_OP_CONJ | DCP_OP_NEG))
        fix_elems(d, n, stride, esz, op->flags, dtype);
}

/* ------------------------------------------------------------ fetching */

static const char *op_key(const dcp_entry *e) { return e && e->key ? e->key : ""; }

int dcp_op_fetch(dcp_checkpoint *ck, const dcp_entry *e, const dcp_op *op, void *buf, dcp_error *err)
{
    if (op->length > SIZE_MAX)
        return dcpi_err(err, EOVERFLOW, "%s: %s: read of %" PRIu64 " bytes is too large", ck->path,
                       op_key(e), op->length);
    if (op->flags & DCP_OP_DECODED)
        return dcpi_blob_read(ck, &op->blob, buf, (size_t)op->length, op->src_offset, op_key(e), err);
    return dcpi_pread_full(ck, op->file, buf, (size_t)op->length, op->src_offset, op_key(e), err);
}

/* ------------------------------------------------------------ executing */

/* The bounce buffer for strided and flagged ops: one per thread, grown up to
 * BOUNCE_MAX and kept for the thread's next plan (freed at thread exit). */
#define BOUNCE_MAX ((size_t)4 << 20)

struct bounce {
    unsigned char *buf;
    size_t cap;
};

static pthread_key_t bounce_key;
static pthread_once_t bounce_once = PTHREAD_ONCE_INIT;
static int bounce_key_ok;

static void bounce_free(void *p)
{
    struct bounce *b = p;
    free(b->buf);
    free(b);
}

static void bounce_init(void) { bounce_key_ok = pthread_key_create(&bounce_key, bounce_free) == 0; }

/* A buffer of at least min(want, BOUNCE_MAX) bytes, or NULL. *heap is set
 * when the caller must free it (no thread key available). */
static unsigned char *bounce_get(size_t want, size_t *cap, int *heap)
{
    if (want > BOUNCE_MAX)
        want = BOUNCE_MAX;
    if (want < 4096)
        want = 4096;
    *heap = 0;
    pthread_once(&bounce_once, bounce_init);
    struct bounce *b = bounce_key_ok ? pthread_getspecific(bounce_key) : NULL;
    if (bounce_key_ok && !b) {
        b = calloc(1, sizeof *b);
        if (b && pthread_setspecific(bounce_key, b) != 0) {
            free(b);
            b = NULL;
        }
    }
    if (!b) {
        *heap = 1;
        *cap = want;
        return malloc(want);
    }
    if (b->cap < want) {
        free(b->buf);
        b->buf = malloc(want);
        b->cap = b->buf ? want : 0;
    }
    *cap = b->cap;
    return b->buf;
}

static int is_direct(const dcp_op *op)
{
    return op->flags == 0 && (op->dest_stride == op->elem_size || op->length == op->elem_size);
}

static int op_cmp(const void *pa, const void *pb)
{
    const dcp_op *a = *(const dcp_op *const *)pa, *b = *(const dcp_op *const *)pb;
    int da = !!(a->flags & DCP_OP_DECODED), db = !!(b->flags & DCP_OP_DECODED);
    if (da != db)
        return da - db;
    if (a->file != b->file)
        return a->file < b->file ? -1 : 1;
    if (da && a->blob.offset != b->blob.offset)
        return a->blob.offset < b->blob.offset ? -1 : 1;
    if (a->src_offset != b->src_offset)
        return a->src_offset < b->src_offset ? -1 : 1;
    return 0;
}

struct exec {
    dcp_checkpoint *ck;
    const dcp_plan *plan;
    unsigned char *dest;
    const char *key;
    unsigned char *bounce;
    size_t bounce_cap;
    int bounce_heap;
    size_t bounce_want;
    dcp_error *err;
};

static int need_bounce(struct exec *x)
{
    if (x->bounce)
        return 0;
    x->bounce = bounce_get(x->bounce_want, &x->bounce_cap, &x->bounce_heap);
    if (!x->bounce)
        return dcpi_err(x->err, ENOMEM, "%s: %s: out of memory for the read buffer", x->ck->path, x->key);
    return 0;
}

/* Direct ops ord[0..n), adjacent in the file, read straight into dest (in
 * pieces on several threads when large: dcpi_preadv_exact). */
#define IOV_BATCH 512

static int read_direct(struct exec *x, int fd, const dcp_op *const *ord, size_t n)
{
    struct iovec iov[IOV_BATCH];
    uint64_t off = ord[0]->src_offset, total = 0;
    for (size_t k = 0; k < n; k++) {
        iov[k].iov_base = x->dest + ord[k]->dest_offset;
        iov[k].iov_len = (size_t)ord[k]->length;
        total += ord[k]->length;
    }
    if (dcpi_check_range(x->ck, ord[0]->file, x->key, off, total, x->err) < 0)
        return -1;
    size_t done = 0;
    int e = dcpi_preadv_exact(fd, iov, (int)n, off, 0, &done);
    if (done == total)
        return 0;
    /* name the op the read stopped in */
    size_t k = 0;
    for (uint64_t acc = 0; k + 1 < n && acc + ord[k]->length <= done; k++)
        acc += ord[k]->length;
    return dcpi_read_error(x->ck, ord[k]->file, x->key, ord[k]->src_offset, ord[k]->length, fd, e, x->err);
}

/* How many of ord[0..n) (adjacent in the bounce buffer) are the columns of
 * one matrix in the destination: same length and stride, each one element
 * right of the previous. A chunk stored transposed reads as such columns. */
static size_t columns(const dcp_op *const *ord, size_t n)
{
    const dcp_op *a = ord[0];
    uint64_t esz = a->elem_size;
    if (a->length <= esz || a->dest_stride <= esz)
        return 1;
    size_t m = 1;
    while (m < n && ord[m]->length == a->length && ord[m]->dest_stride == a->dest_stride &&
           ord[m]->flags == a->flags && ord[m]->elem_size == esz &&
           ord[m]->dest_offset == a->dest_offset + m * esz && (m + 1) * esz <= a->dest_stride)
        m++;
    return m;
}

/* Place m such columns by tiles, so that neither side is walked at a large
 * stride for long (the cache-friendly transpose). */
#define TILE 16
static void place_columns(const dcp_op *const *ord, size_t m, const unsigned char *src,
                          unsigned char *region, dcp_dtype dt)
{
    const dcp_op *a = ord[0];
    size_t esz = a->elem_size, rows = (size_t)(a->length / esz), ds = (size_t)a->dest_stride;
    unsigned char *d = region + a->dest_offset;
#define TRANSPOSE(SZ)                                                                       \
    for (size_t r0 = 0; r0 < rows; r0 += TILE)                                                \
        for (size_t c0 = 0; c0 < m; c0 += TILE) {                                             \
            size_t r1 = r0 + TILE < rows ? r0 + TILE : rows, c1 = c0 + TILE < m ? c0 + TILE : m; \
            for (size_t r = r0; r < r1; r++)                                                  \
                for (size_t c = c0; c < c1; c++)                                              \
                    memcpy(d + r * ds + c * (SZ), src + (c * rows + r) * (SZ), (SZ));        \
        }
    switch (esz) {
    case 1: TRANSPOSE(1) break;
    case 2: TRANSPOSE(2) break;
    case 4: TRANSPOSE(4) break;
    case 8: TRANSPOSE(8) break;
    case 16: TRANSPOSE(16) break;
    default: TRANSPOSE(esz) break;
    }
#undef TRANSPOSE
    if (a->flags & (DCP_OP_BSWAP | DCP_OP_CONJ | DCP_OP_NEG))
        for (size_t c = 0; c < m; c++)
            fix_elems(region + ord[c]->dest_offset, rows, ds, esz, a->flags, dt);
}

/* Ops ord[0..n), adjacent in the file and together at most the bounce
 * buffer, read with one pread and placed one by one. */
static int read_bounced(struct exec *x, int fd, const dcp_op *const *ord, size_t n)
{
    uint64_t off = ord[0]->src_offset, total = 0;
    for (size_t k = 0; k < n; k++)
        total += ord[k]->length;
    if (dcpi_check_range(x->ck, ord[0]->file, x->key, off, total, x->err) < 0)
        return -1;
    size_t got;
    int e = dcpi_pread_exact(fd, x->bounce, (size_t)total, off, &got);
    if (e || got < total) {
        size_t k = 0;
        for (uint64_t acc = 0; k + 1 < n && acc + ord[k]->length <= got; k++)
            acc += ord[k]->length;
        return dcpi_read_error(x->ck, ord[k]->file, x->key, ord[k]->src_offset, ord[k]->length, fd, e, x->err);
    }
    size_t pos = 0;
    for (size_t k = 0; k < n;) {
        size_t m = columns(ord + k, n - k);
        if (m >= 4) {
            place_columns(ord + k, m, x->bounce + pos, x->dest, x->plan->dtype);
            pos += m * (size_t)ord[k]->length;
            k += m;
        } else {
            dcp_op_place(ord[k], x->bounce + pos, x->dest, x->plan->dtype);
            pos += (size_t)ord[k]->length;
            k++;
        }
    }
    return 0;
}

/* One op larger than the bounce buffer, in pieces of whole elements. The
 * source is the file (fd >= 0) or the decoded blob (fd < 0). */
static int read_pieces(struct exec *x, int fd, const dcp_op *op)
{
    uint64_t esz = op->elem_size;
    uint64_t piece = x->bounce_cap / esz * esz;
    for (uint64_t done = 0; done < op->length; done += piece) {
        dcp_op sub = *op;
        sub.src_offset = op->src_offset + done;
        sub.length = op->length - done < piece ? op->length - done : piece;
        sub.dest_offset = op->dest_offset + done / esz * op->dest_stride;
        if (fd < 0) {
            if (dcpi_blob_read(x->ck, &op->blob, x->bounce, (size_t)sub.length, sub.src_offset, x->key,
                               x->err) < 0)
                return -1;
            dcp_op_place(&sub, x->bounce, x->dest, x->plan->dtype);
        } else if (read_bounced(x, fd, (const dcp_op *const[]){&sub}, 1) < 0) {
            return -1;
        }
    }
    return 0;
}

/* Ops ord[0..n) of one data file, sorted by offset. */
static int run_file(struct exec *x, const dcp_op *const *ord, size_t n)
{
    uint32_t file = ord[0]->file;
    int fd;
    if (dcpi_fd_acquire(x->ck, file, x->key, 0, &fd, NULL, x->err) < 0)
        return -1;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0;) {
        const dcp_op *op = ord[i];
        size_t j = i + 1;
        if (is_direct(op)) {
            while (j < n && j - i < IOV_BATCH && is_direct(ord[j]) &&
                   ord[j - 1]->src_offset + ord[j - 1]->length == ord[j]->src_offset)
                j++;
            rc = read_direct(x, fd, ord + i, j - i);
        } else if ((rc = need_bounce(x)) == 0) {
            if (op->length > x->bounce_cap) {
                rc = read_pieces(x, fd, op);
            } else {
                uint64_t total = op->length;
                while (j < n && !is_direct(ord[j]) &&
                       ord[j - 1]->src_offset + ord[j - 1]->length == ord[j]->src_offset &&
                       total + ord[j]->length <= x->bounce_cap)
                    total += ord[j++]->length;
                rc = read_bounced(x, fd, ord + i, j - i);
            }
        }
        i = j;
    }
    if (rc == 0)   /* the bytes read are the model's only while the file is the one noted */
        rc = dcpi_file_unchanged(x->ck, file, fd, x->key, x->err);
    dcpi_fd_release(x->ck, file);
    return rc;
}

/* One op whose source is a decoded (zstd) blob. */
static int run_decoded(struct exec *x, const dcp_op *op)
{
    if (op->flags == DCP_OP_DECODED && (op->dest_stride == op->elem_size || op->length == op->elem_size))
        return dcpi_blob_read(x->ck, &op->blob, x->dest + op->dest_offset, (size_t)op->length,
                              op->src_offset, x->key, x->err);
    if (need_bounce(x) < 0)
        return -1;
    return read_pieces(x, -1, op);
}

int dcp_plan_execute(dcp_checkpoint *ck, const dcp_plan *plan, void *dest, dcp_error *err)
{
    struct exec x = {
        .ck = ck, .plan = plan, .dest = dest, .err = err,
        .key = plan->entry && plan->entry->key ? plan->entry->key : "",
    };
    if (plan->nbytes > SIZE_MAX)
        return dcpi_err(err, EOVERFLOW, "%s: %s: region too large", ck->path, x.key);
    if (plan->zero_fill && plan->nbytes)
        memset(dest, 0, (size_t)plan->nbytes);
    size_t n = plan->nops;
    if (!n)
        return 0;

    /* Order by (decoded, file, offset) in a private index; plans from the
     * planner are usually sorted already. */
    const dcp_op *small[64];
    const dcp_op **ord = small;
    if (n > 64) {
        if (n > SIZE_MAX / sizeof *ord || !(ord = malloc(n * sizeof *ord)))
            return dcpi_err(err, ENOMEM, "%s: %s: out of memory", ck->path, x.key);
    }
    int sorted = 1;
    uint64_t bounced = 0;
    for (size_t i = 0; i < n; i++) {
        ord[i] = &plan->ops[i];
        if (i && sorted && op_cmp(&ord[i - 1], &ord[i]) > 0)
            sorted = 0;
        if (!is_direct(ord[i]) && bounced < BOUNCE_MAX)
            bounced += ord[i]->length;   /* adjacent bounced ops are batched */
    }
    x.bounce_want = bounced < BOUNCE_MAX ? (size_t)bounced : BOUNCE_MAX;
    if (!sorted)
        qsort(ord, n, sizeof *ord, op_cmp);

    int rc = 0;
    for (size_t i = 0; i < n && rc == 0;) {
        if (ord[i]->flags & DCP_OP_DECODED) {
            rc = run_decoded(&x, ord[i]);
            i++;
            continue;
        }
        size_t j = i + 1;
        while (j < n && ord[j]->file == ord[i]->file && !(ord[j]->flags & DCP_OP_DECODED))
            j++;
        rc = run_file(&x, ord + i, j - i);
        i = j;
    }
    if (x.bounce_heap)
        free(x.bounce);
    if (ord != small)
        free(ord);
    return rc;
}

int dcp_read_entry(dcp_checkpoint *ck, const dcp_entry *e, void **buf, uint64_t *len, dcp_error *err)
{
    *buf = NULL;
    *len = 0;
    /* the whole image: planning clamps the range to the entry's size */
    dcp_plan plan;
    dcp_plan_init(&plan);
    if (dcp_plan_bytes(ck, e, 0, UINT64_MAX, &plan, err) < 0) {
        dcp_plan_free(&plan);   /* a failed plan keeps its allocation */
        return -1;
    }
    uint64_t n = plan.nbytes;
    /* Refuse what cannot fit in memory rather than letting overcommit and
     * the zero fill take the process down. */
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    uint64_t phys = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : UINT64_MAX;
    void *b = NULL;
    if (n > SIZE_MAX || n > phys)
        dcpi_err(err, EFBIG, "%s: %s: %" PRIu64 " bytes is more than this machine's memory; read it in pieces",
                 ck->path, e->key, n);
    else if (!(b = malloc(n ? (size_t)n : 1)))
        dcpi_err(err, ENOMEM, "%s: %s: out of memory for %" PRIu64 " bytes", ck->path, e->key, n);
    else if (dcp_plan_execute(ck, &plan, b, err) < 0) {
        free(b);
        b = NULL;
    }
    dcp_plan_free(&plan);
    if (!b)
        return -1;
    *buf = b;
    *len = n;
    return 0;
}
