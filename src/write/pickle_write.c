/* The pickle writer (see pickle_write.h): CPython's opcode choices for the
 * objects torch.save's data.pkl and DCP's .metadata hold, memoized like the C
 * pickler, framed in protocol 4, streamed to a file descriptor when given.
 *
 * Positions that must survive flushes (the open frame, each open batch's
 * MARK) are kept as absolute output offsets: buffer index = offset - written. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pickle_write.h"
#include "pickle.h"

#define FRAME_TARGET (64u * 1024)     /* CPython's _FRAME_SIZE_TARGET */
#define FRAME_MIN 4                   /* smaller frames are left unframed */
#define FLUSH_AT (1u << 20)           /* write out complete frames past this */
#define BATCH 1000                    /* CPython's _BATCHSIZE */

static void fail(pw *w, int code, const char *why)
{
    if (!w->failed) {
        w->failed = 1;
        dcpi_err(&w->err, code, "%s: %s", w->what ? w->what : "pickle", why);
    }
}

static int reserve(pw *w, size_t n)
{
    if (w->failed)
        return -1;
    if (n <= w->cap - w->len)
        return 0;
    size_t need;
    if (__builtin_add_overflow(w->len, n, &need)) {
        fail(w, EOVERFLOW, "pickle too large");
        return -1;
    }
    size_t nc = w->cap ? w->cap : 4096;
    while (nc < need) {
        if (nc > SIZE_MAX / 2) {
            fail(w, ENOMEM, "out of memory");
            return -1;
        }
        nc *= 2;
    }
    unsigned char *nb = realloc(w->buf, nc);
    if (!nb) {
        fail(w, ENOMEM, "out of memory");
        return -1;
    }
    w->buf = nb;
    w->cap = nc;
    return 0;
}

static void put(pw *w, const void *p, size_t n)
{
    if (reserve(w, n) < 0)
        return;
    memcpy(w->buf + w->len, p, n);
    w->len += n;
}

static void op(pw *w, unsigned char c) { put(w, &c, 1); }

static void op_le(pw *w, unsigned char c, uint64_t v, int bytes)
{
    unsigned char b[9];
    b[0] = c;
    for (int i = 0; i < bytes; i++)
        b[1 + i] = (unsigned char)(v >> (8 * i));
    put(w, b, (size_t)bytes + 1);
}

static uint64_t abs_pos(const pw *w) { return w->written + w->len; }

/* ---------------------------------------------------------------- frames */

/* Protocol 4: frame_start is the absolute offset of the open frame's content;
 * its 9-byte FRAME header is reserved just before it. */
static void frame_open(pw *w)
{
    unsigned char hdr[9] = {0x95};
    put(w, hdr, sizeof hdr);
    w->frame_start = (size_t)abs_pos(w);
}

static void flush_upto(pw *w, uint64_t upto)
{
    if (w->fd < 0 || w->failed || upto <= w->written)
        return;
    size_t n = (size_t)(upto - w->written), done = 0;
    while (done < n) {
        ssize_t r = write(w->fd, w->buf + done, n - done);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            fail(w, r < 0 ? errno : EIO, r < 0 ? strerror(errno) : "short write");
            return;
        }
        done += (size_t)r;
    }
    memmove(w->buf, w->buf + n, w->len - n);
    w->len -= n;
    w->written += n;
}

/* Close the open frame: fill its header, or drop the header of a tiny one. */
static void frame_commit(pw *w)
{
    if (w->failed)
        return;
    uint64_t start = w->frame_start, n = abs_pos(w) - start;
    size_t hdr = (size_t)(start - 9 - w->written);
    if (n >= FRAME_MIN) {
        for (int i = 0; i < 8; i++)
            w->buf[hdr + 1 + i] = (unsigned char)(n >> (8 * i));
    } else {
        memmove(w->buf + hdr, w->buf + hdr + 9, w->len - hdr - 9);
        w->len -= 9;
    }
}

/* Before each object: start a new frame when the open one is big enough, and
 * write out what is complete when the buffer has grown. */
static void boundary(pw *w)
{
    if (w->failed || w->proto < 4)
        goto maybe_flush;
    if (abs_pos(w) - w->frame_start >= FRAME_TARGET) {
        frame_commit(w);
        frame_open(w);
    }
maybe_flush:
    if (w->fd >= 0 && w->len >= FLUSH_AT) {
        /* Protocol 4: everything before the open frame's header is final.
         * Protocol 2: everything (a one-item batch whose MARK was written
         * out keeps it and ends with SETITEMS/APPENDS: same object). */
        flush_upto(w, w->proto >= 4 ? w->frame_start - 9 : abs_pos(w));
    }
}

/* ---------------------------------------------------------------- memo */

static void memoize(pw *w)
{
    if (w->proto >= 4)
        op(w, 0x94);                          /* MEMOIZE */
    else if (w->memo < 256)
        op_le(w, 'q', w->memo, 1);            /* BINPUT */
    else
        op_le(w, 'r', w->memo, 4);            /* LONG_BINPUT */
    w->memo++;
}

static void memo_get(pw *w, uint64_t idx)
{
    if (idx < 256)
        op_le(w, 'h', idx, 1);                /* BINGET */
    else
        op_le(w, 'j', idx, 4);                /* LONG_BINGET */
}

/* Look up or remember an interned object; 1 when it was written before. */
static int interned(pw *w, char tag, const char *a, size_t an, const char *b, size_t bn, uint64_t *idx, int put_it)
{
    char stack[256], *k = stack;
    size_t kn = 1 + an + (b ? 1 + bn : 0);
    if (kn > sizeof stack && !(k = malloc(kn))) {
        fail(w, ENOMEM, "out of memory");
        return 0;
    }
    k[0] = tag;
    memcpy(k + 1, a, an);
    if (b) {
        k[1 + an] = '\n';
        memcpy(k + 2 + an, b, bn);
    }
    int found = dcpi_strmap_get(&w->interned, k, kn, idx);
    if (!found && put_it) {
        char *kk = dcpi_arena_memdup(&w->arena, k, kn);
        if (!kk || dcpi_strmap_put(&w->interned, kk, kn, *idx) < 0)
            fail(w, ENOMEM, "out of memory");
    }
    if (k != stack)
        free(k);
    return found;
}

/* ---------------------------------------------------------------- public */

void pw_init(pw *w, int proto, int fd, const char *what)
{
    memset(w, 0, sizeof *w);
    w->proto = proto;
    w->fd = fd;
    w->what = what;
    dcpi_strmap_init(&w->interned);
    dcpi_arena_init(&w->arena);
    op_le(w, 0x80, (uint64_t)proto, 1);       /* PROTO */
    if (proto >= 4)
        frame_open(w);
}

void pw_free(pw *w)
{
    free(w->buf);
    dcpi_strmap_free(&w->interned);
    dcpi_arena_free(&w->arena);
    memset(w, 0, sizeof *w);
    w->fd = -1;
}

int pw_finish(pw *w, dcp_error *err)
{
    if (!w->failed && w->depth != 0)
        fail(w, EINVAL, "unbalanced containers");
    op(w, '.');                               /* STOP */
    if (w->proto >= 4)
        frame_commit(w);
    if (w->fd >= 0)
        flush_upto(w, abs_pos(w));
    if (w->failed) {
        if (err)
            *err = w->err;
        return -1;
    }
    return 0;
}

void pw_none(pw *w) { boundary(w); op(w, 'N'); }
void pw_bool(pw *w, int v) { boundary(w); op(w, v ? 0x88 : 0x89); }

void pw_int(pw *w, int64_t v)
{
    boundary(w);
    if (v >= 0 && v < 256) {
        op_le(w, 'K', (uint64_t)v, 1);        /* BININT1 */
    } else if (v >= 0 && v < 65536) {
        op_le(w, 'M', (uint64_t)v, 2);        /* BININT2 */
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
        op_le(w, 'J', (uint64_t)(uint32_t)(int32_t)v, 4);   /* BININT */
    } else {
        /* LONG1: the shortest little-endian two's complement (pickle.encode_long). */
        unsigned char b[10];
        int n = 8;
        while (n > 1 && ((v < 0 && (uint8_t)(v >> (8 * (n - 1))) == 0xff && ((v >> (8 * (n - 2))) & 0x80)) ||
                         (v >= 0 && (uint8_t)(v >> (8 * (n - 1))) == 0 && !((v >> (8 * (n - 2))) & 0x80))))
            n--;
        b[0] = 0x8a;
        b[1] = (unsigned char)n;
        for (int i = 0; i < n; i++)
            b[2 + i] = (unsigned char)((uint64_t)v >> (8 * i));
        put(w, b, (size_t)n + 2);
    }
}

void pw_uint(pw *w, uint64_t v)
{
    if (v <= INT64_MAX) {
        pw_int(w, (int64_t)v);
        return;
    }
    boundary(w);
    unsigned char b[11] = {0x8a, 9};
    for (int i = 0; i < 8; i++)
        b[2 + i] = (unsigned char)(v >> (8 * i));
    b[10] = 0;                                /* sign byte: positive */
    put(w, b, sizeof b);
}

void pw_float(pw *w, double v)
{
    boundary(w);
    uint64_t u;
    memcpy(&u, &v, 8);
    unsigned char b[9] = {'G'};
    for (int i = 0; i < 8; i++)
        b[1 + i] = (unsigned char)(u >> (8 * (7 - i)));   /* big-endian */
    put(w, b, sizeof b);
}

void pw_long_bytes(pw *w, const void *p, size_t n)
{
    boundary(w);
    if (n < 256)
        op_le(w, 0x8a, n, 1);                 /* LONG1 */
    else if (n <= INT32_MAX)
        op_le(w, 0x8b, n, 4);                 /* LONG4 */
    else {
        fail(w, EOVERFLOW, "integer too long");
        return;
    }
    put(w, p, n);
}

static void str_raw(pw *w, const char *s, size_t n)
{
    if (w->proto >= 4 && n < 256)
        op_le(w, 0x8c, n, 1);                 /* SHORT_BINUNICODE */
    else if (n <= UINT32_MAX)
        op_le(w, 'X', n, 4);                  /* BINUNICODE */
    else if (w->proto >= 4)
        op_le(w, 0x8d, n, 8);                 /* BINUNICODE8 */
    else {
        fail(w, EOVERFLOW, "string too long for protocol 2");
        return;
    }
    put(w, s, n);
    memoize(w);
}

void pw_str(pw *w, const char *s, size_t n)
{
    boundary(w);
    str_raw(w, s, n);
}

void pw_str_shared(pw *w, const char *s, size_t n)
{
    boundary(w);
    uint64_t idx = w->memo;
    if (interned(w, 's', s, n, NULL, 0, &idx, 0)) {
        memo_get(w, idx);
        return;
    }
    idx = w->memo;
    str_raw(w, s, n);
    interned(w, 's', s, n, NULL, 0, &idx, 1);
}

void pw_cstr(pw *w, const char *s) { pw_str_shared(w, s, strlen(s)); }

void pw_global(pw *w, const char *module, const char *name)
{
    boundary(w);
    size_t mn = strlen(module), nn = strlen(name);
    uint64_t idx = 0;
    if (interned(w, 'g', module, mn, name, nn, &idx, 0)) {
        memo_get(w, idx);
        return;
    }
    if (w->proto >= 4) {
        pw_str_shared(w, module, mn);
        pw_str_shared(w, name, nn);
        op(w, 0x93);                          /* STACK_GLOBAL */
    } else {
        op(w, 'c');                           /* GLOBAL */
        put(w, module, mn);
        op(w, '\n');
        put(w, name, nn);
        op(w, '\n');
    }
    idx = w->memo;
    memoize(w);
    interned(w, 'g', module, mn, name, nn, &idx, 1);
}

void pw_bytes(pw *w, const void *p, size_t n)
{
    boundary(w);
    if (w->proto >= 4) {
        if (n < 256)
            op_le(w, 'C', n, 1);              /* SHORT_BINBYTES */
        else if (n <= UINT32_MAX)
            op_le(w, 'B', n, 4);              /* BINBYTES */
        else
            op_le(w, 0x8e, n, 8);             /* BINBYTES8 */
        put(w, p, n);
        memoize(w);
        return;
    }
    /* Protocol 2: _codecs.encode(<the bytes as latin-1 text>, 'latin1'). */
    pw_global(w, "_codecs", "encode");
    const unsigned char *b = p;
    size_t u = n;
    for (size_t i = 0; i < n; i++)
        u += b[i] >> 7;                       /* bytes >= 0x80 take two UTF-8 bytes */
    if (u > UINT32_MAX) {
        fail(w, EOVERFLOW, "bytes object too long for protocol 2");
        return;
    }
    op_le(w, 'X', u, 4);
    if (reserve(w, u) < 0)
        return;
    unsigned char *q = w->buf + w->len;
    for (size_t i = 0; i < n; i++) {
        if (b[i] < 0x80) {
            *q++ = b[i];
        } else {
            *q++ = (unsigned char)(0xc0 | (b[i] >> 6));
            *q++ = (unsigned char)(0x80 | (b[i] & 0x3f));
        }
    }
    w->len += u;
    memoize(w);
    pw_cstr(w, "latin1");
    op(w, 0x86);                              /* TUPLE2 */
    memoize(w);
    op(w, 'R');
    memoize(w);
}

void pw_tuple_begin(pw *w, size_t n)
{
    boundary(w);
    if (n > 3)
        op(w, '(');
}

void pw_tuple_end(pw *w, size_t n)
{
    if (n == 0) {
        op(w, ')');                           /* EMPTY_TUPLE: never memoized */
        return;
    }
    op(w, n == 1 ? 0x85 : n == 2 ? 0x86 : n == 3 ? 0x87 : 't');
    memoize(w);
}

static void container_begin(pw *w, unsigned char empty_op)
{
    boundary(w);
    op(w, empty_op);
    memoize(w);
    if (w->depth >= PW_MAX_DEPTH) {
        fail(w, EINVAL, "containers nested too deeply");
        return;
    }
    w->batch[w->depth++] = 0;
}

/* End the open batch of the innermost container: a batch of one item drops
 * its MARK (when still buffered and inside the open frame) and uses the
 * single-item opcode, as CPython does. */
static void batch_close(pw *w, unsigned char one, unsigned char many)
{
    size_t *cnt = &w->batch[w->depth - 1];
    if (*cnt == 0)
        return;
    uint64_t mark = w->mark[w->depth - 1];
    uint64_t floor = w->proto >= 4 ? w->frame_start : w->written;
    if (*cnt == 1 && mark >= floor && mark >= w->written && !w->failed) {
        size_t i = (size_t)(mark - w->written);
        memmove(w->buf + i, w->buf + i + 1, w->len - i - 1);
        w->len--;
        op(w, one);
    } else {
        op(w, many);
    }
    *cnt = 0;
}

static void item_begin(pw *w, unsigned char one, unsigned char many)
{
    if (w->failed || w->depth == 0)
        return;
    size_t *cnt = &w->batch[w->depth - 1];
    if (*cnt == BATCH)
        batch_close(w, one, many);
    if (*cnt == 0) {
        boundary(w);
        w->mark[w->depth - 1] = abs_pos(w);
        op(w, '(');
    }
    (*cnt)++;
}

static void container_end(pw *w, unsigned char one, unsigned char many)
{
    if (w->failed || w->depth == 0)
        return;
    batch_close(w, one, many);
    w->depth--;
}

void pw_dict_begin(pw *w) { container_begin(w, '}'); }
void pw_dict_key(pw *w) { item_begin(w, 's', 'u'); }
void pw_dict_end(pw *w) { container_end(w, 's', 'u'); }
void pw_list_begin(pw *w) { container_begin(w, ']'); }
void pw_list_elem(pw *w) { item_begin(w, 'a', 'e'); }
void pw_list_end(pw *w) { container_end(w, 'a', 'e'); }

void pw_reduce(pw *w)
{
    op(w, 'R');
    memoize(w);
}

void pw_newobj(pw *w)
{
    op(w, ')');
    op(w, 0x81);                              /* NEWOBJ */
    memoize(w);
}

void pw_build(pw *w) { op(w, 'b'); }
void pw_binpersid(pw *w) { op(w, 'Q'); }

void pw_ordered_dict(pw *w)
{
    pw_global(w, "collections", "OrderedDict");
    op(w, ')');
    pw_reduce(w);
}

uint64_t pw_last_memo(const pw *w) { return w->memo ? w->memo - 1 : 0; }

void pw_get(pw *w, uint64_t idx)
{
    boundary(w);
    memo_get(w, idx);
}

static void int_tuple(pw *w, const int64_t *v, int n)
{
    pw_tuple_begin(w, (size_t)n);
    for (int i = 0; i < n; i++)
        pw_int(w, v[i]);
    pw_tuple_end(w, (size_t)n);
}

int pw_tensor_shape_fits(int ndim, const int64_t *shape)
{
    /* Contiguous strides, with torch's max(size, 1) for empty dimensions,
     * fit int64 (torch's own rule: torch.save writes torch.empty(2**62, 0)
     * and torch.empty(0, 2**62), not torch.empty(0, 2**62, 2**62)); a shape
     * with a 0 holds no element, so that is all it needs. Else its element
     * count is at most INT64_MAX / 16 (its bytes fit int64 for every dtype;
     * so does every leading or trailing block of it). */
    int64_t s = 1;
    uint64_t numel;
    int empty = 0;
    if (ndim < 0 || ndim > DCPI_MAX_NDIM)
        return 0;
    for (int d = ndim - 1; d >= 0; d--) {
        if (shape[d] < 0 || __builtin_mul_overflow(s, shape[d] > 1 ? shape[d] : 1, &s))
            return 0;
        empty |= shape[d] == 0;
    }
    return empty || (dcpi_shape_numel(ndim, shape, &numel) && numel <= INT64_MAX / 16);
}

int pw_tensor_shape_check(const char *dir, const char *key, int ndim, const int64_t *shape, dcp_error *err)
{
    if (pw_tensor_shape_fits(ndim, shape))
        return 0;
    if (ndim < 0 || ndim > DCPI_MAX_NDIM)
        return dcpi_err(err, EINVAL, "%s%s%s: %d dimensions (at most %d)", dir, key ? ": " : "", key ? key : "",
                        ndim, DCPI_MAX_NDIM);
    char shp[DCPI_MAX_NDIM * 21 + 1];
    size_t used = 0;
    int negative = 0;
    for (int d = 0; d < ndim; d++) {
        used += (size_t)snprintf(shp + used, sizeof shp - used, "%s%" PRId64, d ? "," : "", shape[d]);
        negative |= shape[d] < 0;
    }
    shp[used] = 0;
    return dcpi_err(err, EINVAL, "%s%s%s: shape [%s]: %s", dir, key ? ": " : "", key ? key : "", shp,
                    negative ? "a negative size" : "too large (its strides or element count overflow)");
}

void pw_torch_tensor(pw *w, dcp_dtype dt, int ndim, const int64_t *shape, const char *storage_key)
{
    const char *storage = dcp_dtype_storage(dt);
    uint64_t numel = 1;
    int64_t stride[DCPI_MAX_NDIM];
    if (ndim < 0 || ndim > DCPI_MAX_NDIM || !dcp_dtype_name(dt)) {
        fail(w, EINVAL, "bad tensor dtype or rank");
        return;
    }
    if (!pw_tensor_shape_fits(ndim, shape)) {
        fail(w, EOVERFLOW, "tensor shape too large (its strides or element count overflow)");
        return;
    }
    int64_t s = 1;   /* no overflow: pw_tensor_shape_fits */
    for (int d = ndim - 1; d >= 0; d--) {
        stride[d] = s;
        s *= shape[d] > 1 ? shape[d] : 1;
    }
    dcpi_shape_numel(ndim, shape, &numel);   /* fits: 0 with a 0 anywhere */
    pw_global(w, "torch._utils", storage ? "_rebuild_tensor_v2" : "_rebuild_tensor_v3");
    size_t nargs = storage ? 6 : 7;
    pw_tuple_begin(w, nargs);
    pw_tuple_begin(w, 5);
    pw_cstr(w, "storage");
    if (storage)
        pw_global(w, "torch", storage);
    else
        pw_global(w, "torch.storage", "UntypedStorage");
    pw_str(w, storage_key, strlen(storage_key));
    pw_cstr(w, "cpu");
    pw_uint(w, storage ? numel : numel * dcp_dtype_size(dt));
    pw_tuple_end(w, 5);
    pw_binpersid(w);
    pw_int(w, 0);
    int_tuple(w, shape, ndim);
    int_tuple(w, stride, ndim);
    pw_bool(w, 0);
    pw_ordered_dict(w);
    if (!storage)
        pw_global(w, "torch", dcp_dtype_name(dt));
    pw_tuple_end(w, nargs);
    pw_reduce(w);
}

void pw_torch_size(pw *w, const int64_t *v, int n)
{
    pw_global(w, "torch", "Size");
    pw_tuple_begin(w, 1);
    int_tuple(w, v, n);
    pw_tuple_end(w, 1);
    pw_reduce(w);
}

/* ---------------------------------------------------------------- parsed values */

#define PW_VALUE_DEPTH 64

static int value_at(pw *p, const pk_node *n, int depth, uint64_t max)
{
    if (!n || depth > PW_VALUE_DEPTH)
        return -1;
    /* A node the pickle shares (memo) is written each time it is met: a
     * hostile pickle's list of the same list twice, 64 deep, would never
     * end without this bound on what has been written. */
    if (p->written + p->len > max)
        return -2;
    int rc;
    switch (n->type) {
    case PK_NONE: pw_none(p); return 0;
    case PK_BOOL: pw_bool(p, n->u.b); return 0;
    case PK_INT: pw_int(p, n->u.i); return 0;
    case PK_BIGINT: pw_long_bytes(p, n->u.s.p, n->u.s.len); return 0;
    case PK_FLOAT: pw_float(p, n->u.f); return 0;
    case PK_STR: pw_str(p, n->u.s.p, n->u.s.len); return 0;
    case PK_BYTES: pw_bytes(p, n->u.s.p, n->u.s.len); return 0;
    case PK_TUPLE:
        pw_tuple_begin(p, n->u.seq.n);
        for (size_t i = 0; i < n->u.seq.n; i++)
            if ((rc = value_at(p, n->u.seq.items[i], depth + 1, max)) < 0)
                return rc;
        pw_tuple_end(p, n->u.seq.n);
        return 0;
    case PK_LIST:
        pw_list_begin(p);
        for (size_t i = 0; i < n->u.seq.n; i++) {
            pw_list_elem(p);
            if ((rc = value_at(p, n->u.seq.items[i], depth + 1, max)) < 0)
                return rc;
        }
        pw_list_end(p);
        return 0;
    case PK_DICT:
        pw_dict_begin(p);
        for (size_t i = 0; i < n->u.dict.n; i++) {
            pw_dict_key(p);
            if ((rc = value_at(p, n->u.dict.keys[i], depth + 1, max)) < 0 ||
                (rc = value_at(p, n->u.dict.vals[i], depth + 1, max)) < 0)
                return rc;
        }
        pw_dict_end(p);
        return 0;
    default: {
        /* A bytes object of a protocol-2 pickle: _codecs.encode(text, 'latin1'). */
        unsigned char *b;
        size_t bl;
        if (pk_bytes_copy(n, &b, &bl) != 0)
            return -1;
        pw_bytes(p, b, bl);
        free(b);
        return 0;
    }
    }
}

int pw_value(pw *p, const pk_node *n, uint64_t max)
{
    int rc = value_at(p, n, 0, max);
    return rc == 0 && p->written + p->len > max ? -2 : rc;
}
