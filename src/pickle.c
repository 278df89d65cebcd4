/* The pickle virtual machine: opcodes of protocols 2-5 to a tree of pk_node,
 * executing nothing. Globals are names; REDUCE/NEWOBJ/BUILD are recorded as
 * PK_CALL nodes for the interpreters (metadata.c, torchsave.c) to recognise.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "pickle.h"

#define PK_MAX_MARKS 32768   /* nested MARKs; CPython nests them as deep as the data */
#define SMALL_INTS 1024      /* offsets, sizes, memo-free ints: most of a big .metadata */
#define SLAB_MAX 1024        /* nodes per slab once a pickle proves big */

struct pk_doc {
    dcpi_arena arena;
};

/* PK_CALL nodes carry one more field than the others: the items SETITEMS or
 * APPENDS gave the object (OrderedDict(), defaultdict). Keeping it out of
 * pk_node keeps every other node at 40 bytes. */
typedef struct call_ext {
    pk_node n;              /* first: a call_ext * is a pk_node * */
    pk_node *items;
} call_ext;

typedef struct vm {
    const unsigned char *p, *end, *start;
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

static int fail(vm *m, const char *fmt, const char *detail)
{
    return dcpi_err(m->err, EINVAL, "%s: %s%s at offset %zu", m->what, fmt, detail ? detail : "",
                    (size_t)(m->p - m->start));
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

static int need(vm *m, size_t n)
{
    if ((size_t)(m->end - m->p) < n)
        return dcpi_err(m->err, EINVAL, "%s: truncated pickle (needs %zu more bytes at offset %zu)",
                        m->what, n, (size_t)(m->p - m->start));
    return 0;
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

static pk_node *make_str(vm *m, pk_type t, const unsigned char *p, size_t n)
{
    pk_node *s = node(m, t);
    if (!s)
        return NULL;
    s->u.s.p = dcpi_arena_strndup(&m->doc->arena, (const char *)p, n);
    s->u.s.len = n;
    return s->u.s.p ? s : NULL;
}

static int memo_put(vm *m, uint64_t idx, pk_node *n)
{
    /* Memo indexes come from the file: a writer numbers them densely (one per
     * PUT opcode), so an index beyond the input size (+ any BINPUT index) is
     * hostile. */
    if (idx > (uint64_t)(m->end - m->start) + 256)
        return fail(m, "memo index out of range", NULL);
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

static int memo_get(vm *m, uint64_t idx)
{
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
    return push(m, make_str(m, PK_BIGINT, p, n));
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

/* A text line ending in '\n' (GLOBAL, INT, LONG, PUT, GET, PERSID). */
static int line(vm *m, const char **s, size_t *n)
{
    const unsigned char *nl = memchr(m->p, '\n', (size_t)(m->end - m->p));
    if (!nl)
        return dcpi_err(m->err, EINVAL, "%s: truncated pickle (unterminated line at offset %zu)",
                        m->what, (size_t)(m->p - m->start));
    *s = (const char *)m->p;
    *n = (size_t)(nl - m->p);
    m->p = nl + 1;
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

static int run(vm *m, pk_node **root)
{
    for (;;) {
        if (need(m, 1) < 0)
            return -1;
        unsigned char op = *m->p++;
        size_t first;
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
            if (need(m, n) < 0)
                return -1;
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
                m->mcap = nc;
            }
            if (m->nmarks >= PK_MAX_MARKS)
                return fail(m, "too many nested MARKs", NULL);
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
            if (n > (uint64_t)(m->end - m->p))
                return dcpi_err(m->err, EINVAL, "%s: truncated pickle (a %llu-byte string with %zu bytes left at offset %zu)",
                                m->what, (unsigned long long)n, (size_t)(m->end - m->p), (size_t)(m->p - m->start));
            if (push(m, make_str(m, (op == 'C' || op == 'B' || op == 0x8e) ? PK_BYTES : PK_STR, m->p, n)) < 0)
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
            if (!(c = pop(m)) || !(b = pop(m)) || !(a = top(m)) || !(a = target(m, a, PK_DICT, "SETITEM")) ||
                dict_set(m, a, b, c) < 0)
                return -1;
            break;
        case 'u': /* SETITEMS */
            if (pop_mark(m, &first) < 0)
                return -1;
            if (first == 0 || (m->nmarks && first <= m->marks[m->nmarks - 1]))
                return fail(m, "stack underflow", NULL);
            if ((m->sp - first) % 2)
                return fail(m, "odd number of items for SETITEMS", NULL);
            if (!(a = target(m, m->stack[first - 1], PK_DICT, "SETITEMS")))
                return -1;
            if (dict_reserve(m, a, (m->sp - first) / 2) < 0)
                return -1;
            for (size_t i = first; i < m->sp; i += 2)
                if (dict_set(m, a, m->stack[i], m->stack[i + 1]) < 0)
                    return -1;
            m->sp = first;
            break;
        case 'c': { /* GLOBAL "module\nname\n" */
            const char *mod, *name; size_t ml, nl;
            if (line(m, &mod, &ml) < 0 || line(m, &name, &nl) < 0 || global_node(m, mod, ml, name, nl) < 0)
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
            b->u.persid.pid = make_str(m, PK_STR, (const unsigned char *)s, l);
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
    pk_doc *d = calloc(1, sizeof *d);
    if (!d)
        return dcpi_err(err, ENOMEM, "%s: out of memory", what);
    dcpi_arena_init(&d->arena);
    vm m = {.p = p, .end = p + len, .start = p, .what = what, .err = err, .doc = d};
    pk_node *r = NULL;
    int rc;
    if ((m.none = node(&m, PK_NONE)) && (m.yes = node(&m, PK_BOOL)) && (m.no = node(&m, PK_BOOL))) {
        m.yes->u.b = true;
        rc = run(&m, &r);
    } else {
        rc = dcpi_err(err, ENOMEM, "%s: out of memory", what);
    }
    free(m.stack);
    free(m.marks);
    free(m.memo);
    free(m.small_ints);
    if (rc < 0) {
        pk_free(d);
        return -1;
    }
    *doc = d;
    *root = r;
    return 0;
}

void pk_free(pk_doc *doc)
{
    if (!doc)
        return;
    dcpi_arena_free(&doc->arena);
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
