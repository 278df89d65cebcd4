/* The pickle virtual machine: opcodes of protocols 2-5 to a tree of pk_node,
 * executing nothing. Globals are names; REDUCE/NEWOBJ/BUILD are recorded as
 * PK_CALL nodes for the interpreters (metadata.c, torchsave.c) to recognise.
 *
 * Input is a buffer in memory (pk_parse) or a file read in pieces
 * (pk_parse_stream): the VM sees a window [buf, end) of the input at file
 * offset off0 and asks need() for more. In stream mode the batches of items
 * a consumer takes (pk_stream.items) are freed at once: every MARK notes the
 * arena and memo positions, and a consumed SETITEMS rewinds the arena to its
 * MARK's; the memo then keeps copies of the scalars, strings and globals
 * made since (an index map, the memo window restarting empty) and releases
 * the rest.
 */
#include <inttypes.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "pickle.h"

#define PK_MAX_MARKS 32768   /* nested MARKs; CPython nests them as deep as the data */
#define SMALL_INTS 1024      /* offsets, sizes, memo-free ints: most of a big .metadata */
#define SLAB_MAX 1024        /* nodes per slab once a pickle proves big */
#define READ_PIECE (1u << 20)  /* stream mode: bytes read at once */
#define KEEP_STR_MAX 4096    /* stream mode: longer memoized strings are released */

struct pk_doc {
    dcpi_arena arena;
    dcpi_arena kept;        /* stream mode: memo entries kept across consumed batches */
};

/* Stream mode: what a MARK notes for a consumed batch to go back to. */
typedef struct smark {
    dcpi_arena_mark arena;
} smark;

typedef struct kept_slot {
    uint64_t idx1;          /* memo index + 1; 0: empty */
    pk_node *n;
} kept_slot;

/* PK_CALL nodes carry one more field than the others: the items SETITEMS or
 * APPENDS gave the object (OrderedDict(), defaultdict). Keeping it out of
 * pk_node keeps every other node at 40 bytes. */
typedef struct call_ext {
    pk_node n;              /* first: a call_ext * is a pk_node * */
    pk_node *items;
} call_ext;

typedef struct vm {
    const unsigned char *p, *end, *buf;   /* the window [buf, end) of the input */
    uint64_t off0;        /* input offset of buf[0] */
    uint64_t total;       /* input size */
    pk_stream *src;       /* stream mode, else NULL */
    unsigned char *sbuf;  /* stream mode: the window's allocation */
    size_t scap_bytes;
    smark *smarks;        /* stream mode: parallel to marks (mcap) */
    uint64_t memo_base;   /* memo[i] is index memo_base + i; below: kept */
    kept_slot *kept;
    size_t kcap, kcount;
    const char *what;
    dcp_error *err;
    pk_doc *doc;
    pk_node **stack;
    size_t sp, scap;
    size_t *marks;
    size_t nmarks, mcap;
    pk_node **memo;       /* [0, memo_len) initialised; NULL = undefined */
    size_t memo_len, memo_cap;
    size_t memo_next;     /* MEMOIZE index */
    pk_node *slab;        /* nodes are carved from arena slabs: no per-node header */
    size_t slab_left, slab_size;
    /* Immutable values are shared: most of a big .metadata is small ints. */
    pk_node *none, *yes, *no, *empty_tuple;
    pk_node **small_ints; /* 0..SMALL_INTS-1 */
} vm;

static uint64_t pos(const vm *m) { return m->off0 + (uint64_t)(m->p - m->buf); }
static uint64_t remaining(const vm *m) { return m->total - pos(m); }

static int fail(vm *m, const char *fmt, const char *detail)
{
    return dcpi_err(m->err, EINVAL, "%s: %s%s at offset %llu", m->what, fmt, detail ? detail : "",
                    (unsigned long long)pos(m));
}

static pk_node *node(vm *m, pk_type t)
{
    if (!m->slab_left) {
        /* Small pickles (a data.pkl) get small slabs; big ones 40 KB ones. */
        size_t n = m->slab_size ? m->slab_size * 2 : 32;
        if (n > SLAB_MAX)
            n = SLAB_MAX;
        if (!(m->slab = dcpi_arena_alloc(&m->doc->arena, n * sizeof *m->slab)))
            return NULL;
        m->slab_left = m->slab_size = n;
    }
    pk_node *n = m->slab++;
    m->slab_left--;
    n->type = t;
    return n;
}

static int push(vm *m, pk_node *n)
{
    if (!n)
        return dcpi_err(m->err, ENOMEM, "%s: out of memory", m->what);
    if (m->sp == m->scap) {
        size_t nc = m->scap ? m->scap * 2 : 64;
        pk_node **ns = realloc(m->stack, nc * sizeof *ns);
        if (!ns)
            return dcpi_err(m->err, ENOMEM, "%s: out of memory", m->what);
        m->stack = ns;
        m->scap = nc;
    }
    m->stack[m->sp++] = n;
    return 0;
}

static pk_node *pop(vm *m)
{
    size_t floor = m->nmarks ? m->marks[m->nmarks - 1] : 0;
    if (m->sp <= floor) {
        fail(m, "stack underflow", NULL);
        return NULL;
    }
    return m->stack[--m->sp];
}

static pk_node *top(vm *m)
{
    size_t floor = m->nmarks ? m->marks[m->nmarks - 1] : 0;
    if (m->sp <= floor) {
        fail(m, "stack underflow", NULL);
        return NULL;
    }
    return m->stack[m->sp - 1];
}

/* Stream mode: read from the file until [p, p + n) is in the window
 * (n <= remaining(m), checked by need). The window keeps [p, end) and grows
 * only for an item larger than a piece. */
static int refill(vm *m, size_t n)
{
    pk_stream *s = m->src;
    size_t keep = (size_t)(m->end - m->p);
    size_t want = n > READ_PIECE ? n : READ_PIECE;
    m->off0 = pos(m);
    if (want > m->scap_bytes) {
        unsigned char *nb = malloc(want);
        if (!nb)
            return dcpi_err(m->err, ENOMEM, "%s: out of memory for %zu bytes", m->what, want);
        if (keep)
            memcpy(nb, m->p, keep);
        free(m->sbuf);
        m->sbuf = nb;
        m->scap_bytes = want;
    } else if (keep) {
        memmove(m->sbuf, m->p, keep);
    }
    m->buf = m->p = m->sbuf;
    m->end = m->sbuf + keep;
    while ((size_t)(m->end - m->p) < n) {
        uint64_t at = m->off0 + (uint64_t)(m->end - m->buf);
        size_t room = m->scap_bytes - (size_t)(m->end - m->buf);
        if (room > m->total - at)
            room = (size_t)(m->total - at);
        ssize_t r = pread(s->fd, m->sbuf + (m->end - m->buf), room, (off_t)at);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            int e = r < 0 ? errno : EIO;
            return dcpi_err(m->err, e, "%s: read failed at offset %llu: %s", m->what, (unsigned long long)at,
                            r < 0 ? strerror(e) : "the file shrank while being read");
        }
        if (s->bytes)
            s->bytes(s->ctx, m->end, (size_t)r);
        m->end += r;
    }
    return 0;
}

static int need(vm *m, size_t n)
{
    if ((size_t)(m->end - m->p) >= n)
        return 0;
    if (n > remaining(m))
        return dcpi_err(m->err, EINVAL, "%s: truncated pickle (needs %zu more bytes at offset %llu)",
                        m->what, n, (unsigned long long)pos(m));
    return m->src ? refill(m, n) : fail(m, "truncated pickle", NULL);
}

static uint64_t rd_le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* Items above the topmost mark; pops the mark. */
static int pop_mark(vm *m, size_t *first)
{
    if (!m->nmarks)
        return fail(m, "no MARK on the stack", NULL);
    *first = m->marks[--m->nmarks];
    return 0;
}

/* Make room for `more` items: exactly, for a container built in one opcode
 * (most of them), doubling for containers that keep growing. */
static int seq_reserve(vm *m, pk_node *seq, size_t more)
{
    size_t need = seq->u.seq.n + more;
    if (need <= seq->u.seq.cap)
        return 0;
    size_t nc = seq->u.seq.n ? (seq->u.seq.cap * 2 > need ? seq->u.seq.cap * 2 : need) : need;
    pk_node **ni = dcpi_arena_alloc(&m->doc->arena, nc * sizeof *ni);
    if (!ni)
        return dcpi_err(m->err, ENOMEM, "%s: out of memory", m->what);
    if (seq->u.seq.n)
        memcpy(ni, seq->u.seq.items, seq->u.seq.n * sizeof *ni);
    seq->u.seq.items = ni;
    seq->u.seq.cap = nc;
    return 0;
}

static int seq_append(vm *m, pk_node *seq, pk_node *item)
{
    if (seq->u.seq.n == seq->u.seq.cap) {
        size_t nc = seq->u.seq.cap ? seq->u.seq.cap * 2 : 4;
        pk_node **ni = dcpi_arena_alloc(&m->doc->arena, nc * sizeof *ni);
        if (!ni)
            return dcpi_err(m->err, ENOMEM, "%s: out of memory", m->what);
        if (seq->u.seq.n)
            memcpy(ni, seq->u.seq.items, seq->u.seq.n * sizeof *ni);
        seq->u.seq.items = ni;
        seq->u.seq.cap = nc;
    }
    seq->u.seq.items[seq->u.seq.n++] = item;
    return 0;
}

/* Room for `more` items, exact for a dict filled by one SETITEMS (most). */
static int dict_reserve(vm *m, pk_node *d, size_t more)
{
    size_t need = d->u.dict.n + more;
    if (need <= d->u.dict.cap)
        return 0;
    size_t nc = d->u.dict.n ? (d->u.dict.cap * 2 > need ? d->u.dict.cap * 2 : need) : need;
    pk_node **nk = dcpi_arena_alloc(&m->doc->arena, 2 * nc * sizeof *nk);
    if (!nk)
        return dcpi_err(m->err, ENOMEM, "%s: out of memory", m->what);
    pk_node **nv = nk + nc;
    if (d->u.dict.n) {
        memcpy(nk, d->u.dict.keys, d->u.dict.n * sizeof *nk);
        memcpy(nv, d->u.dict.vals, d->u.dict.n * sizeof *nv);
    }
    d->u.dict.keys = nk;
    d->u.dict.vals = nv;
    d->u.dict.cap = nc;
    return 0;
}

static int dict_set(vm *m, pk_node *d, pk_node *k, pk_node *v)
{
    if (d->u.dict.n == d->u.dict.cap && dict_reserve(m, d, d->u.dict.cap ? d->u.dict.cap : 4) < 0)
        return -1;
    /* A duplicate key is appended; pk_dict_get searches from the end, so the
     * later value wins, as in Python. */
    d->u.dict.keys[d->u.dict.n] = k;
    d->u.dict.vals[d->u.dict.n] = v;
    d->u.dict.n++;
    return 0;
}

static pk_node *make_str(vm *m, pk_type t, const unsigned char *p, size_t n, uint64_t at)
{
    pk_node *s = node(m, t);
    if (!s)
        return NULL;
    s->u.s.p = dcpi_arena_strndup(&m->doc->arena, (const char *)p, n);
    s->u.s.len = n;
    s->u.s.at = at;
    return s->u.s.p ? s : NULL;
}

static int memo_put(vm *m, uint64_t idx, pk_node *n)
{
    /* Memo indexes come from the file: a writer numbers them densely (one per
     * PUT opcode), so an index beyond the input size (+ any BINPUT index) is
     * hostile. */
    if (idx > m->total + 256)
        return fail(m, "memo index out of range", NULL);
    if (idx < m->memo_base)   /* (stream mode) redefined after its batch went */
        return dcpi_err(m->err, PK_ERR_RELEASED, "%s: memo index %llu redefined after a streamed batch",
                        m->what, (unsigned long long)idx);
    idx -= m->memo_base;
    if (m->src && idx < m->memo_len && m->memo[idx])   /* a redefinition: not streamed */
        return dcpi_err(m->err, PK_ERR_RELEASED, "%s: memo index %llu redefined", m->what,
                        (unsigned long long)(idx + m->memo_base));
    if (idx >= m->memo_len) {
        if (idx >= m->memo_cap) {
            size_t nc = m->memo_cap ? m->memo_cap * 2 : 64;
            while (nc <= idx)
                nc *= 2;
            pk_node **nm = realloc(m->memo, nc * sizeof *nm);
            if (!nm)
                return dcpi_err(m->err, ENOMEM, "%s: out of memory", m->what);
            m->memo = nm;
            m->memo_cap = nc;
        }
        /* Only the gap is cleared: untouched capacity costs no memory. */
        memset(m->memo + m->memo_len, 0, (idx - m->memo_len) * sizeof *m->memo);
        m->memo_len = idx + 1;
    }
    m->memo[idx] = n;
    return 0;
}

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

static kept_slot *kept_slot_of(kept_slot *t, size_t cap, uint64_t idx)
{
    size_t mask = cap - 1, h = (size_t)mix64(idx) & mask;
    while (t[h].idx1 && t[h].idx1 != idx + 1)
        h = (h + 1) & mask;
    return &t[h];
}

static int kept_put(vm *m, uint64_t idx, pk_node *n)
{
    if ((m->kcount + 1) * 4 > m->kcap * 3) {
        size_t nc = m->kcap ? m->kcap * 2 : 256;
        kept_slot *nt = calloc(nc, sizeof *nt);
        if (!nt)
            return dcpi_err(m->err, ENOMEM, "%s: out of memory", m->what);
        for (size_t i = 0; i < m->kcap; i++)
            if (m->kept[i].idx1)
                *kept_slot_of(nt, nc, m->kept[i].idx1 - 1) = m->kept[i];
        free(m->kept);
        m->kept = nt;
        m->kcap = nc;
    }
    kept_slot *sl = kept_slot_of(m->kept, m->kcap, idx);
    if (!sl->idx1)
        m->kcount++;
    sl->idx1 = idx + 1;
    sl->n = n;
    return 0;
}

static int memo_get(vm *m, uint64_t idx)
{
    if (idx < m->memo_base) {
        kept_slot *sl = m->kcap ? kept_slot_of(m->kept, m->kcap, idx) : NULL;
        if (sl && sl->idx1)
            return push(m, sl->n);
        return dcpi_err(m->err, PK_ERR_RELEASED,
                        "%s: memo index %llu refers back to an object of a streamed batch that was released",
                        m->what, (unsigned long long)idx);
    }
    idx -= m->memo_base;
    if (idx >= m->memo_len || !m->memo[idx])
        return fail(m, "memo index not defined", NULL);
    return push(m, m->memo[idx]);
}

static int int_node(vm *m, int64_t v)
{
    if (v >= 0 && v < SMALL_INTS) {
        if (!m->small_ints && !(m->small_ints = calloc(SMALL_INTS, sizeof *m->small_ints)))
            return push(m, NULL);
        pk_node **slot = &m->small_ints[v];
        if (!*slot && (*slot = node(m, PK_INT)))
            (*slot)->u.i = v;
        return push(m, *slot);
    }
    pk_node *n = node(m, PK_INT);
    if (n)
        n->u.i = v;
    return push(m, n);
}

/* LONG1/LONG4: little-endian two's complement of n bytes; PK_INT when the
 * value fits int64 (also from a non-minimal encoding), else PK_BIGINT. */
static int long_node(vm *m, const unsigned char *p, size_t n)
{
    bool fits = n <= 8;
    if (!fits) {
        unsigned char fill = (p[7] & 0x80) ? 0xff : 0;
        fits = true;
        for (size_t i = 8; i < n && fits; i++)
            fits = p[i] == fill;
    }
    if (fits) {
        int k = n < 8 ? (int)n : 8;
        uint64_t v = k ? rd_le(p, k) : 0;
        if (k && k < 8 && (p[k - 1] & 0x80))
            v |= ~0ULL << (8 * k);
        return int_node(m, (int64_t)v);
    }
    return push(m, make_str(m, PK_BIGINT, p, n, PK_AT_NONE));
}

static int global_node(vm *m, const char *mod, size_t ml, const char *name, size_t nl)
{
    pk_node *g = node(m, PK_GLOBAL);
    if (!g)
        return push(m, NULL);
    g->u.global.module = dcpi_arena_strndup(&m->doc->arena, mod, ml);
    g->u.global.name = dcpi_arena_strndup(&m->doc->arena, name, nl);
    return push(m, g->u.global.module && g->u.global.name ? g : NULL);
}

static int make_call(vm *m, pk_call_kind kind, pk_node *callable, pk_node *args)
{
    call_ext *c = dcpi_arena_alloc(&m->doc->arena, sizeof *c);
    if (c) {
        c->n.type = PK_CALL;
        c->n.u.call.kind = kind;
        c->n.u.call.callable = callable;
        c->n.u.call.args = args;
    }
    return push(m, c ? &c->n : NULL);
}

/* The container SETITEM(S) (want PK_DICT) or APPEND(S) (want PK_LIST) fills:
 * the object itself, or the items of an object built by REDUCE/NEWOBJ. */
static pk_node *target(vm *m, pk_node *obj, pk_type want, const char *opname)
{
    if (obj->type == want)
        return obj;
    if (obj->type == PK_CALL) {
        call_ext *c = (call_ext *)obj;
        if (!c->items && !(c->items = node(m, want))) {
            dcpi_err(m->err, ENOMEM, "%s: out of memory", m->what);
            return NULL;
        }
        if (c->items->type == want)
            return c->items;
    }
    fail(m, opname, want == PK_DICT ? " on something that is not a dict or an object" :
                                      " to something that is not a list or an object");
    return NULL;
}

/* Opcodes that exist but that no DCP or torch.save pickle uses. */
static const char *opcode_name(unsigned char op)
{
    switch (op) {
    case 'F': return "FLOAT (text)";
    case 'S': return "STRING (text)";
    case 'V': return "UNICODE (text)";
    case 'i': return "INST";
    case 'o': return "OBJ";
    case 0x82: case 0x83: case 0x84: return "EXT1/EXT2/EXT4 (copyreg extension registry)";
    case 0x96: return "BYTEARRAY8 (protocol-5 buffer)";
    case 0x97: return "NEXT_BUFFER (protocol-5 out-of-band buffer)";
    case 0x98: return "READONLY_BUFFER (protocol-5 out-of-band buffer)";
    default: return NULL;
    }
}

/* The length of the text line starting `from` bytes past p, read into the
 * window (which keeps everything from p on). */
static int line_at(vm *m, size_t from, size_t *n)
{
    for (;;) {
        size_t have = (size_t)(m->end - m->p);
        const unsigned char *nl = have > from ? memchr(m->p + from, '\n', have - from) : NULL;
        if (nl) {
            *n = (size_t)(nl - (m->p + from));
            return 0;
        }
        if (have >= remaining(m))
            return dcpi_err(m->err, EINVAL, "%s: truncated pickle (unterminated line at offset %llu)",
                            m->what, (unsigned long long)pos(m));
        uint64_t more = (uint64_t)have + (have > READ_PIECE ? have : READ_PIECE);
        if (need(m, (size_t)(more < remaining(m) ? more : remaining(m))) < 0)
            return -1;
    }
}

/* A text line ending in '\n' (GLOBAL, INT, LONG, PUT, GET, PERSID). */
static int line(vm *m, const char **s, size_t *n)
{
    if (line_at(m, 0, n) < 0)
        return -1;
    *s = (const char *)m->p;
    m->p += *n + 1;
    return 0;
}

static int parse_decimal(vm *m, const char *s, size_t n, int64_t *out)
{
    char buf[32];
    while (n && (s[n - 1] == 'L' || s[n - 1] == '\r'))
        n--;
    if (n == 0 || n >= sizeof buf)
        return fail(m, "bad decimal in a text opcode", NULL);
    memcpy(buf, s, n);
    buf[n] = 0;
    char *end;
    errno = 0;
    long long v = strtoll(buf, &end, 10);
    if (*end || errno)
        return fail(m, "bad decimal in a text opcode", NULL);
    *out = v;
    return 0;
}

static bool keepable_leaf(const pk_node *n)
{
    switch (n->type) {
    case PK_NONE: case PK_BOOL: case PK_INT: case PK_FLOAT: case PK_GLOBAL:
        return true;
    case PK_STR: case PK_BYTES: case PK_BIGINT:
        return n->u.s.len <= KEEP_STR_MAX;
    default:
        return false;
    }
}

/* A copy of a leaf in the kept arena (the shared ones as they are). */
static pk_node *copy_leaf(vm *m, const pk_node *n)
{
    if (n->type == PK_NONE)
        return m->none;
    if (n->type == PK_BOOL)
        return n->u.b ? m->yes : m->no;
    if (n->type == PK_INT && n->u.i >= 0 && n->u.i < SMALL_INTS)
        return m->small_ints[n->u.i];
    size_t extra = 0;
    if (n->type == PK_STR || n->type == PK_BYTES || n->type == PK_BIGINT)
        extra = n->u.s.len + 1;
    else if (n->type == PK_GLOBAL)
        extra = strlen(n->u.global.module) + strlen(n->u.global.name) + 2;
    pk_node *c = dcpi_arena_alloc(&m->doc->kept, sizeof *c + extra);
    if (!c)
        return NULL;
    *c = *n;
    char *text = (char *)(c + 1);
    if (n->type == PK_STR || n->type == PK_BYTES || n->type == PK_BIGINT) {
        memcpy(text, n->u.s.p, n->u.s.len);
        text[n->u.s.len] = 0;
        c->u.s.p = text;
    } else if (n->type == PK_GLOBAL) {
        size_t ml = strlen(n->u.global.module);
        memcpy(text, n->u.global.module, ml + 1);
        strcpy(text + ml + 1, n->u.global.name);
        c->u.global.module = text;
        c->u.global.name = text + ml + 1;
    }
    m->src->memo_kept_bytes += sizeof *c + extra;
    return c;
}

/* Stream mode: a copy, in the kept arena, of a memo entry later batches may
 * refer back to: a scalar, a string, a global, or a call of a global on a
 * few of those and nothing else (PyTorch's torch.strided and memory
 * formats: _get_layout('torch.strided') made once, referred to by every
 * TensorProperties). NULL when it is released, or on a failure (m->err set,
 * *failed = 1). Tuples and objects with state (every chunk's offsets and
 * sizes) are released. */
static pk_node *keep_copy(vm *m, const pk_node *n, int *failed)
{
    pk_node *c = NULL;
    if (keepable_leaf(n)) {
        c = copy_leaf(m, n);
    } else if (n->type == PK_CALL && pk_call_global(n) && !n->u.call.state && !pk_call_items(n) &&
               n->u.call.args && n->u.call.args->type == PK_TUPLE && n->u.call.args->u.seq.n <= 4) {
        const pk_node *args = n->u.call.args;
        for (size_t i = 0; i < args->u.seq.n; i++)
            if (!keepable_leaf(args->u.seq.items[i]))
                return NULL;
        call_ext *ce = dcpi_arena_alloc(&m->doc->kept, sizeof *ce);
        pk_node *t = args->u.seq.n ? dcpi_arena_alloc(&m->doc->kept, sizeof *t) : m->empty_tuple;
        pk_node **items = args->u.seq.n ? dcpi_arena_alloc(&m->doc->kept, args->u.seq.n * sizeof *items) : NULL;
        pk_node *callable = copy_leaf(m, n->u.call.callable);
        if (ce && t && (items || !args->u.seq.n) && callable) {
            ce->n = *n;
            ce->n.u.call.callable = callable;
            ce->n.u.call.args = t;
            ce->items = NULL;
            if (args->u.seq.n) {
                t->type = PK_TUPLE;
                t->u.seq.items = items;
                t->u.seq.n = t->u.seq.cap = args->u.seq.n;
                for (size_t i = 0; i < args->u.seq.n && ce; i++)
                    if (!(items[i] = copy_leaf(m, args->u.seq.items[i])))
                        ce = NULL;
            }
            m->src->memo_kept_bytes += sizeof *ce + sizeof *t + args->u.seq.n * sizeof *items;
            c = ce ? &ce->n : NULL;
        }
        if (!c) {
            *failed = 1;
            dcpi_err(m->err, ENOMEM, "%s: out of memory", m->what);
            return NULL;
        }
        return c;
    } else {
        return NULL;
    }
    if (!c) {
        *failed = 1;
        dcpi_err(m->err, ENOMEM, "%s: out of memory", m->what);
    }
    return c;
}

/* Stream mode: the consumer took the batch opened by the MARK noted in mk.
 * Every memo entry of the window is kept as a copy or released, even one
 * made before that MARK: it may lie in a batch of an enclosing MARK that a
 * later rewind frees (the Metadata object and its dicts, which nothing
 * refers back to, are released so). The window restarts empty and the arena
 * goes back to the MARK. */
static int release_batch(vm *m, const smark *mk)
{
    for (size_t i = 0; i < m->memo_len; i++) {
        pk_node *n = m->memo[i];
        uint64_t idx = m->memo_base + i;
        if (!n)
            continue;
        int failed = 0;
        pk_node *c = keep_copy(m, n, &failed);
        if (failed)
            return -1;
        if (!c) {
            m->src->memo_released++;
            continue;
        }
        if (kept_put(m, idx, c) < 0)
            return -1;
        m->src->memo_kept++;
    }
    m->memo_base += m->memo_len;
    if (m->memo_next > m->memo_base)
        m->memo_base = m->memo_next;
    m->memo_len = 0;
    dcpi_arena_rewind(&m->doc->arena, &mk->arena);
    m->slab_left = 0;   /* (its slab may be gone) */
    m->src->batches++;
    return 0;
}

static int run(vm *m, pk_node **root)
{
    for (;;) {
        if (need(m, 1) < 0)
            return -1;
        unsigned char op = *m->p++;
        size_t first = 0;
        pk_node *a, *b, *c;
        uint64_t n;
        switch (op) {
        case 0x80: /* PROTO */
            if (need(m, 1) < 0)
                return -1;
            if (m->p[0] > 5)
                return fail(m, "unsupported pickle protocol", NULL);
            m->p++;
            break;
        case 0x95: /* FRAME: read sequentially; its length must fit the input */
            if (need(m, 8) < 0)
                return -1;
            n = rd_le(m->p, 8);
            m->p += 8;
            if (n > remaining(m))   /* (its bytes are read as the opcodes need them) */
                return dcpi_err(m->err, EINVAL, "%s: truncated pickle (a %llu-byte frame with %llu bytes left)",
                                m->what, (unsigned long long)n, (unsigned long long)remaining(m));
            break;
        case '.': /* STOP */
            if (!(a = pop(m)))
                return -1;
            *root = a;
            return 0;
        case '(': /* MARK */
            if (m->nmarks == m->mcap) {
                size_t nc = m->mcap ? m->mcap * 2 : 16;
                size_t *nm = realloc(m->marks, nc * sizeof *nm);
                if (!nm)
                    return dcpi_err(m->err, ENOMEM, "%s: out of memory", m->what);
                m->marks = nm;
                if (m->src) {
                    smark *ns = realloc(m->smarks, nc * sizeof *ns);
                    if (!ns)
                        return dcpi_err(m->err, ENOMEM, "%s: out of memory", m->what);
                    m->smarks = ns;
                }
                m->mcap = nc;
            }
            if (m->nmarks >= PK_MAX_MARKS)
                return fail(m, "too many nested MARKs", NULL);
            if (m->src) {
                m->smarks[m->nmarks].arena = dcpi_arena_here(&m->doc->arena);
            }
            m->marks[m->nmarks++] = m->sp;
            break;
        case '0': /* POP */
            if (m->nmarks && m->marks[m->nmarks - 1] == m->sp) {
                m->nmarks--;   /* POP of a bare MARK, as CPython does */
                break;
            }
            if (!pop(m))
                return -1;
            break;
        case '1': /* POP_MARK */
            if (pop_mark(m, &first) < 0)
                return -1;
            m->sp = first;
            break;
        case '2': /* DUP */
            if (!(a = top(m)) || push(m, a) < 0)
                return -1;
            break;
        case 0x94: /* MEMOIZE */
            if (!(a = top(m)) || memo_put(m, m->memo_next++, a) < 0)
                return -1;
            break;
        case 'q': /* BINPUT */
            if (need(m, 1) < 0 || !(a = top(m)) || memo_put(m, *m->p++, a) < 0)
                return -1;
            break;
        case 'r': /* LONG_BINPUT */
            if (need(m, 4) < 0 || !(a = top(m)))
                return -1;
            n = rd_le(m->p, 4);
            m->p += 4;
            if (memo_put(m, n, a) < 0)
                return -1;
            break;
        case 'p': { /* PUT (text) */
            const char *s; size_t l; int64_t v;
            if (line(m, &s, &l) < 0 || parse_decimal(m, s, l, &v) < 0)
                return -1;
            if (v < 0)
                return fail(m, "negative memo index", NULL);
            if (!(a = top(m)) || memo_put(m, (size_t)v, a) < 0)
                return -1;
            break;
        }
        case 'h': /* BINGET */
            if (need(m, 1) < 0 || memo_get(m, *m->p++) < 0)
                return -1;
            break;
        case 'j': /* LONG_BINGET */
            if (need(m, 4) < 0)
                return -1;
            n = rd_le(m->p, 4);
            m->p += 4;
            if (memo_get(m, n) < 0)
                return -1;
            break;
        case 'g': { /* GET (text) */
            const char *s; size_t l; int64_t v;
            if (line(m, &s, &l) < 0 || parse_decimal(m, s, l, &v) < 0)
                return -1;
            if (v < 0)
                return fail(m, "negative memo index", NULL);
            if (memo_get(m, (size_t)v) < 0)
                return -1;
            break;
        }
        case 'N': /* NONE */
            if (push(m, m->none) < 0)
                return -1;
            break;
        case 0x88: case 0x89: /* NEWTRUE, NEWFALSE */
            if (push(m, op == 0x88 ? m->yes : m->no) < 0)
                return -1;
            break;
        case 'K': /* BININT1 */
            if (need(m, 1) < 0 || int_node(m, *m->p++) < 0)
                return -1;
            break;
        case 'M': /* BININT2 */
            if (need(m, 2) < 0 || int_node(m, (int64_t)rd_le(m->p, 2)) < 0)
                return -1;
            m->p += 2;
            break;
        case 'J': /* BININT */
            if (need(m, 4) < 0 || int_node(m, (int32_t)(uint32_t)rd_le(m->p, 4)) < 0)
                return -1;
            m->p += 4;
            break;
        case 'I': case 'L': { /* INT, LONG (text) */
            const char *s; size_t l; int64_t v;
            if (line(m, &s, &l) < 0)
                return -1;
            if (op == 'I' && l == 2 && s[0] == '0' && (s[1] == '0' || s[1] == '1')) {
                if (push(m, s[1] == '1' ? m->yes : m->no) < 0)   /* protocol 0's True/False */
                    return -1;
            } else if (parse_decimal(m, s, l, &v) < 0 || int_node(m, v) < 0) {
                return -1;
            }
            break;
        }
        case 0x8a: /* LONG1 */
            if (need(m, 1) < 0)
                return -1;
            n = *m->p++;
            if (need(m, n) < 0 || long_node(m, m->p, n) < 0)
                return -1;
            m->p += n;
            break;
        case 0x8b: /* LONG4 */
            if (need(m, 4) < 0)
                return -1;
            n = rd_le(m->p, 4);
            m->p += 4;
            if (n > 0x7fffffff || need(m, n) < 0 || long_node(m, m->p, n) < 0)
                return n > 0x7fffffff ? fail(m, "negative LONG4 length", NULL) : -1;
            m->p += n;
            break;
        case 'G': { /* BINFLOAT: big-endian double */
            if (need(m, 8) < 0)
                return -1;
            uint64_t bits = 0;
            for (int i = 0; i < 8; i++)
                bits = (bits << 8) | m->p[i];
            m->p += 8;
            if (!(a = node(m, PK_FLOAT)))
                return push(m, NULL);
            memcpy(&a->u.f, &bits, sizeof bits);
            if (push(m, a) < 0)
                return -1;
            break;
        }
        case 0x8c: case 'U': case 'C': /* SHORT_BINUNICODE, SHORT_BINSTRING, SHORT_BINBYTES */
            if (need(m, 1) < 0)
                return -1;
            n = *m->p++;
            goto sized;
        case 'X': case 'T': case 'B': /* BINUNICODE, BINSTRING, BINBYTES */
            if (need(m, 4) < 0)
                return -1;
            n = rd_le(m->p, 4);
            m->p += 4;
            goto sized;
        case 0x8d: case 0x8e: /* BINUNICODE8, BINBYTES8 */
            if (need(m, 8) < 0)
                return -1;
            n = rd_le(m->p, 8);
            m->p += 8;
        sized:
            if (n > remaining(m))
                return dcpi_err(m->err, EINVAL, "%s: truncated pickle (a %llu-byte string with %llu bytes left at offset %llu)",
                                m->what, (unsigned long long)n, (unsigned long long)remaining(m),
                                (unsigned long long)pos(m));
            if (need(m, n) < 0)
                return -1;
            if (push(m, make_str(m, (op == 'C' || op == 'B' || op == 0x8e) ? PK_BYTES : PK_STR, m->p, n, pos(m))) < 0)
                return -1;
            m->p += n;
            break;
        case ')': /* EMPTY_TUPLE: immutable, so one node serves all */
            if (!m->empty_tuple)
                m->empty_tuple = node(m, PK_TUPLE);
            if (push(m, m->empty_tuple) < 0)
                return -1;
            break;
        case 0x85: case 0x86: case 0x87: { /* TUPLE1..3 */
            size_t k = (size_t)(op - 0x84);
            size_t floor = m->nmarks ? m->marks[m->nmarks - 1] : 0;
            if (m->sp < floor + k)
                return fail(m, "stack underflow", NULL);
            if (!(a = node(m, PK_TUPLE)))
                return push(m, NULL);
            if (seq_reserve(m, a, k) < 0)
                return -1;
            for (size_t i = m->sp - k; i < m->sp; i++)
                if (seq_append(m, a, m->stack[i]) < 0)
                    return -1;
            m->sp -= k;
            if (push(m, a) < 0)
                return -1;
            break;
        }
        case 't': case 'l': case 0x91: /* TUPLE, LIST, FROZENSET */
            if (pop_mark(m, &first) < 0)
                return -1;
            if (!(a = node(m, op == 't' ? PK_TUPLE : op == 'l' ? PK_LIST : PK_FROZENSET)))
                return push(m, NULL);
            if (seq_reserve(m, a, m->sp - first) < 0)
                return -1;
            for (size_t i = first; i < m->sp; i++)
                if (seq_append(m, a, m->stack[i]) < 0)
                    return -1;
            m->sp = first;
            if (push(m, a) < 0)
                return -1;
            break;
        case ']': /* EMPTY_LIST */
            if (push(m, node(m, PK_LIST)) < 0)
                return -1;
            break;
        case 0x8f: /* EMPTY_SET */
            if (push(m, node(m, PK_SET)) < 0)
                return -1;
            break;
        case 'a': /* APPEND */
            if (!(b = pop(m)) || !(a = top(m)) || !(a = target(m, a, PK_LIST, "APPEND")) ||
                seq_append(m, a, b) < 0)
                return -1;
            break;
        case 'e': case 0x90: /* APPENDS, ADDITEMS */
            if (pop_mark(m, &first) < 0)
                return -1;
            if (first == 0 || (m->nmarks && first <= m->marks[m->nmarks - 1]))
                return fail(m, "stack underflow", NULL);
            a = m->stack[first - 1];
            if (op == 0x90 && a->type != PK_SET)
                return fail(m, "ADDITEMS to a non-set", NULL);
            if (op == 'e' && !(a = target(m, a, PK_LIST, "APPENDS")))
                return -1;
            if (seq_reserve(m, a, m->sp - first) < 0)
                return -1;
            for (size_t i = first; i < m->sp; i++)
                if (seq_append(m, a, m->stack[i]) < 0)
                    return -1;
            m->sp = first;
            break;
        case '}': /* EMPTY_DICT */
            if (push(m, node(m, PK_DICT)) < 0)
                return -1;
            break;
        case 'd': /* DICT */
            if (pop_mark(m, &first) < 0)
                return -1;
            if ((m->sp - first) % 2)
                return fail(m, "odd number of items for DICT", NULL);
            if (!(a = node(m, PK_DICT)))
                return push(m, NULL);
            for (size_t i = first; i < m->sp; i += 2)
                if (dict_set(m, a, m->stack[i], m->stack[i + 1]) < 0)
                    return -1;
            m->sp = first;
            if (push(m, a) < 0)
                return -1;
            break;
        case 's': /* SETITEM */
            if (!(c = pop(m)) || !(b = pop(m)) || !(a = top(m)))
                return -1;
            if (m->src && m->src->items && a->type == PK_DICT) {
                /* (b and c are still there, just above the top) */
                int r = m->src->items(m->src->ctx, m->stack, m->nmarks ? m->marks[m->nmarks - 1] : 0,
                                      m->sp - 1, m->stack + m->sp, 1);
                if (r < 0)
                    return -1;
                if (r > 0)
                    break;
            }
            if (!(a = target(m, a, PK_DICT, "SETITEM")) || dict_set(m, a, b, c) < 0)
                return -1;
            break;
        case 'u': /* SETITEMS */
            if (pop_mark(m, &first) < 0)
                return -1;
            if (first == 0 || (m->nmarks && first <= m->marks[m->nmarks - 1]))
                return fail(m, "stack underflow", NULL);
            if ((m->sp - first) % 2)
                return fail(m, "odd number of items for SETITEMS", NULL);
            if (m->src && m->src->items && m->stack[first - 1]->type == PK_DICT) {
                int r = m->src->items(m->src->ctx, m->stack, m->nmarks ? m->marks[m->nmarks - 1] : 0,
                                      first - 1, m->stack + first, (m->sp - first) / 2);
                if (r < 0)
                    return -1;
                if (r > 0) {
                    m->sp = first;
                    if (release_batch(m, &m->smarks[m->nmarks]) < 0)
                        return -1;
                    break;
                }
            }
            if (!(a = target(m, m->stack[first - 1], PK_DICT, "SETITEMS")))
                return -1;
            if (dict_reserve(m, a, (m->sp - first) / 2) < 0)
                return -1;
            for (size_t i = first; i < m->sp; i += 2)
                if (dict_set(m, a, m->stack[i], m->stack[i + 1]) < 0)
                    return -1;
            m->sp = first;
            break;
        case 'c': { /* GLOBAL "module\nname\n" (both lines in the window at once) */
            size_t ml, nl;
            if (line_at(m, 0, &ml) < 0 || line_at(m, ml + 1, &nl) < 0)
                return -1;
            const char *mod = (const char *)m->p, *name = mod + ml + 1;
            m->p += ml + 1 + nl + 1;
            if (global_node(m, mod, ml, name, nl) < 0)
                return -1;
            break;
        }
        case 0x93: /* STACK_GLOBAL */
            if (!(b = pop(m)) || !(a = pop(m)))
                return -1;
            if (a->type != PK_STR || b->type != PK_STR)
                return fail(m, "STACK_GLOBAL needs two strings", NULL);
            if (global_node(m, a->u.s.p, a->u.s.len, b->u.s.p, b->u.s.len) < 0)
                return -1;
            break;
        case 'R': /* REDUCE */
            if (!(b = pop(m)) || !(a = pop(m)))
                return -1;
            if (b->type != PK_TUPLE)
                return fail(m, "REDUCE arguments are not a tuple", NULL);
            /* collections.OrderedDict() is plain data: a dict that SETITEMS
             * fills (torch.save(model.state_dict()) writes one). */
            if (b->u.seq.n == 0 && pk_is_global(a, "collections", "OrderedDict")) {
                if (push(m, node(m, PK_DICT)) < 0)
                    return -1;
                break;
            }
            if (make_call(m, PK_REDUCE, a, b) < 0)
                return -1;
            break;
        case 0x81: /* NEWOBJ */
            if (!(b = pop(m)) || !(a = pop(m)))
                return -1;
            if (b->type != PK_TUPLE)
                return fail(m, "NEWOBJ arguments are not a tuple", NULL);
            if (make_call(m, PK_NEWOBJ, a, b) < 0)
                return -1;
            break;
        case 0x92: /* NEWOBJ_EX: cls, args, kwargs (kwargs kept nowhere: never executed) */
            if (!(c = pop(m)) || !(b = pop(m)) || !(a = pop(m)))
                return -1;
            if (b->type != PK_TUPLE || c->type != PK_DICT)
                return fail(m, "bad NEWOBJ_EX arguments", NULL);
            if (make_call(m, PK_NEWOBJ, a, b) < 0)
                return -1;
            break;
        case 'b': /* BUILD */
            if (!(b = pop(m)) || !(a = top(m)))
                return -1;
            if (a->type == PK_DICT)
                break;   /* attributes of a dict subclass (a state_dict's _metadata): dropped */
            if (a->type != PK_CALL)
                return fail(m, "BUILD on something that is not an object", NULL);
            a->u.call.state = b;
            break;
        case 'Q': /* BINPERSID */
            if (!(a = pop(m)))
                return -1;
            if (!(b = node(m, PK_PERSID)))
                return push(m, NULL);
            b->u.persid.pid = a;
            if (push(m, b) < 0)
                return -1;
            break;
        case 'P': { /* PERSID (text) */
            const char *s; size_t l;
            if (line(m, &s, &l) < 0)
                return -1;
            if (!(b = node(m, PK_PERSID)))
                return push(m, NULL);
            b->u.persid.pid = make_str(m, PK_STR, (const unsigned char *)s, l, PK_AT_NONE);
            if (!b->u.persid.pid || push(m, b) < 0)
                return push(m, NULL);
            break;
        }
        default: {
            char what[96];
            const char *name = opcode_name(op);
            if (name)
                snprintf(what, sizeof what, " 0x%02x (%s)", op, name);
            else
                snprintf(what, sizeof what, " 0x%02x", op);
            m->p--;
            return fail(m, name ? "unsupported opcode" : "unknown opcode", what);
        }
        }
    }
}

/* Run the VM over m (input set up by the caller) into a new doc. */
static int parse(vm *m, pk_doc **doc, const pk_node **root)
{
    pk_doc *d = calloc(1, sizeof *d);
    if (!d)
        return dcpi_err(m->err, ENOMEM, "%s: out of memory", m->what);
    dcpi_arena_init(&d->arena);
    dcpi_arena_init(&d->kept);
    m->doc = d;
    pk_node *r = NULL;
    int rc = 0;
    if ((m->none = node(m, PK_NONE)) && (m->yes = node(m, PK_BOOL)) && (m->no = node(m, PK_BOOL)) &&
        (m->empty_tuple = node(m, PK_TUPLE))) {
        m->yes->u.b = true;
    } else {
        rc = dcpi_err(m->err, ENOMEM, "%s: out of memory", m->what);
    }
    if (rc == 0 && m->src) {
        /* Shared small ints are made before any MARK: no batch frees them. */
        pk_node *si = dcpi_arena_alloc(&d->arena, SMALL_INTS * sizeof *si);
        m->small_ints = calloc(SMALL_INTS, sizeof *m->small_ints);
        if (!si || !m->small_ints) {
            rc = dcpi_err(m->err, ENOMEM, "%s: out of memory", m->what);
        } else {
            for (int i = 0; i < SMALL_INTS; i++) {
                si[i].type = PK_INT;
                si[i].u.i = i;
                m->small_ints[i] = &si[i];
            }
        }
    }
    if (rc == 0)
        rc = run(m, &r);
    free(m->stack);
    free(m->marks);
    free(m->smarks);
    free(m->memo);
    free(m->small_ints);
    free(m->kept);
    if (rc < 0) {
        pk_free(d);
        return -1;
    }
    *doc = d;
    *root = r;
    return 0;
}

int pk_parse(const void *data, size_t len, const char *what, pk_doc **doc, const pk_node **root,
             dcp_error *err)
{
    *doc = NULL;
    *root = NULL;
    const unsigned char *p = data;
    if (len == 0)
        return dcpi_err(err, EINVAL, "%s: empty file, not a pickle", what);
    if (p[0] != 0x80 || len < 2 || p[1] < 2 || p[1] > 5)
        return dcpi_err(err, EINVAL, "%s: is not a pickle (protocol 2 to 5)", what);
    vm m = {.p = p, .end = p + len, .buf = p, .total = len, .what = what, .err = err};
    return parse(&m, doc, root);
}

int pk_parse_stream(pk_stream *s, const char *what, pk_doc **doc, const pk_node **root, dcp_error *err)
{
    *doc = NULL;
    *root = NULL;
    if (s->size == 0)
        return dcpi_err(err, EINVAL, "%s: empty file, not a pickle", what);
    vm m = {.total = s->size, .what = what, .err = err, .src = s};
    int rc = need(&m, 2);
    if (rc == 0 && (m.p[0] != 0x80 || m.p[1] < 2 || m.p[1] > 5))
        rc = dcpi_err(err, EINVAL, "%s: is not a pickle (protocol 2 to 5)", what);
    if (rc == 0)
        rc = parse(&m, doc, root);
    /* The rest of the file after STOP, for the byte observer. */
    while (rc == 0 && s->bytes && m.off0 + (uint64_t)(m.end - m.buf) < m.total) {
        m.p = m.end;
        if ((rc = need(&m, (size_t)(remaining(&m) < READ_PIECE ? remaining(&m) : READ_PIECE))) < 0) {
            pk_free(*doc);
            *doc = NULL;
            *root = NULL;
        }
    }
    free(m.sbuf);
    return rc;
}

void pk_free(pk_doc *doc)
{
    if (!doc)
        return;
    dcpi_arena_free(&doc->arena);
    dcpi_arena_free(&doc->kept);
    free(doc);
}

/* ---------------------------------------------------------------- helpers */

bool pk_is_global(const pk_node *n, const char *module, const char *name)
{
    return n && n->type == PK_GLOBAL && strcmp(n->u.global.module, module) == 0 &&
           strcmp(n->u.global.name, name) == 0;
}

const pk_node *pk_call_global(const pk_node *n)
{
    if (!n || n->type != PK_CALL || !n->u.call.callable || n->u.call.callable->type != PK_GLOBAL)
        return NULL;
    return n->u.call.callable;
}

const pk_node *pk_call_items(const pk_node *n)
{
    return n && n->type == PK_CALL ? ((const call_ext *)n)->items : NULL;
}

const pk_node *pk_as_dict(const pk_node *n)
{
    if (n && n->type == PK_DICT)
        return n;
    const pk_node *it = pk_call_items(n);
    return it && it->type == PK_DICT ? it : NULL;
}

/* The state an object was given by BUILD: a dict, or the dict of a
 * (dict, slots) pair as torch's _rebuild_from_type_v2 and __getstate__ of
 * __slots__ classes hand it. */
const pk_node *pk_obj_state(const pk_node *st)
{
    if (!st)
        return NULL;
    if (st->type == PK_DICT)
        return st;
    if (st->type == PK_TUPLE)
        for (size_t i = 0; i < pk_len(st); i++) {
            const pk_node *d = pk_item(st, i);
            if (d && d->type == PK_DICT && d->u.dict.n)
                return d;
        }
    return NULL;
}

const pk_node *pk_dict_get(const pk_node *dict, const char *key)
{
    if (!dict || dict->type != PK_DICT)
        return NULL;
    size_t kl = strlen(key);
    /* The last duplicate wins, as in Python. */
    for (size_t i = dict->u.dict.n; i-- > 0;) {
        const pk_node *k = dict->u.dict.keys[i];
        if (k->type == PK_STR && k->u.s.len == kl && memcmp(k->u.s.p, key, kl) == 0)
            return dict->u.dict.vals[i];
    }
    return NULL;
}

bool pk_key_text(const pk_node *k, char buf[PK_KEY_TEXT_MAX], const char **s, size_t *len)
{
    if (pk_str(k, s, len))
        return true;
    if (!k || (k->type != PK_INT && k->type != PK_BOOL))
        return false;
    if (k->type == PK_BOOL)
        *len = (size_t)snprintf(buf, PK_KEY_TEXT_MAX, "%s", k->u.b ? "True" : "False");
    else
        *len = (size_t)snprintf(buf, PK_KEY_TEXT_MAX, "%" PRId64, k->u.i);
    *s = buf;
    return true;
}

bool pk_int(const pk_node *n, int64_t *out)
{
    if (!n)
        return false;
    if (n->type == PK_INT) {
        *out = n->u.i;
        return true;
    }
    if (n->type == PK_BOOL) {
        *out = n->u.b;
        return true;
    }
    return false;
}

bool pk_str(const pk_node *n, const char **p, size_t *len)
{
    if (!n || n->type != PK_STR)
        return false;
    *p = n->u.s.p;
    if (len)
        *len = n->u.s.len;
    return true;
}

size_t pk_len(const pk_node *n)
{
    if (!n)
        return 0;
    switch (n->type) {
    case PK_TUPLE: case PK_LIST: case PK_SET: case PK_FROZENSET:
        return n->u.seq.n;
    case PK_DICT:
        return n->u.dict.n;
    default:
        return 0;
    }
}

const pk_node *pk_item(const pk_node *n, size_t i)
{
    if (!n || i >= pk_len(n) || n->type == PK_DICT)
        return NULL;
    return n->u.seq.items[i];
}

/* Protocol 2 has no bytes opcode: torch.save pickles bytes as
 * _codecs.encode('<latin-1 text>', 'latin1'). The text node of such a call,
 * else NULL. */
const pk_node *pk_latin1_text(const pk_node *n)
{
    const pk_node *g = pk_call_global(n), *t;
    const char *enc;
    if (!g || strcmp(g->u.global.module, "_codecs") || strcmp(g->u.global.name, "encode") ||
        pk_len(n->u.call.args) != 2 || !(t = pk_item(n->u.call.args, 0)) || t->type != PK_STR ||
        !pk_str(pk_item(n->u.call.args, 1), &enc, NULL) || (strcmp(enc, "latin1") && strcmp(enc, "latin-1")))
        return NULL;
    return t;
}

int pk_bytes_copy(const pk_node *n, unsigned char **out, size_t *len)
{
    const char *s;
    size_t sl;
    if (n && n->type == PK_BYTES) {
        *out = malloc(n->u.s.len ? n->u.s.len : 1);
        if (!*out)
            return -1;
        memcpy(*out, n->u.s.p, n->u.s.len);
        *len = n->u.s.len;
        return 0;
    }
    const pk_node *t = pk_latin1_text(n);
    if (!t)
        return 1;
    s = t->u.s.p;
    sl = t->u.s.len;
    unsigned char *b = malloc(sl ? sl : 1), *q = b;
    if (!b)
        return -1;
    for (size_t i = 0; i < sl; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x80) {
            *q++ = c;
        } else if ((c & 0xe0) == 0xc0 && c <= 0xc3 && i + 1 < sl) {
            *q++ = (unsigned char)(((c & 0x03) << 6) | ((unsigned char)s[++i] & 0x3f));
        } else {
            free(b);
            return 1;   /* not latin-1 text */
        }
    }
    *out = b;
    *len = (size_t)(q - b);
    return 0;
}
