/* The pickle writer both checkpoint writers use: protocol 2 for torch.save's
 * data.pkl, protocol 4 (with FRAMEs) for DCP's .metadata, as CPython's C
 * pickler lays them out: every string, tuple, dict, list, global and object
 * is memoized (BINPUT in protocol 2, MEMOIZE in 4), dict items go in batches
 * of 1000 per MARK ... SETITEMS, lists in batches of 1000 per APPENDS.
 *
 * Output accumulates in a buffer; with a file descriptor sink it is written
 * out (a frame at a time in protocol 4) as it grows, so a .metadata of a
 * million chunks never sits in memory whole. Errors are sticky: every call
 * after the first failure does nothing, and pw_finish reports it. */
#ifndef DCP_PICKLE_WRITE_H
#define DCP_PICKLE_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "internal.h"

#define PW_MAX_DEPTH 64          /* nesting of dicts and lists being batched */

typedef struct pw {
    int proto;                   /* 2 or 4 */
    int fd;                      /* sink, or -1: keep everything in buf */
    const char *what;            /* names the output in errors */
    unsigned char *buf;
    size_t len, cap;
    uint64_t frame_start;        /* protocol 4: absolute offset of the open frame's content */
    uint64_t written;            /* bytes already written to fd */
    uint64_t memo;               /* next memo index */
    dcpi_strmap interned;        /* "s<str>" / "g<mod>\n<name>" -> memo index */
    dcpi_arena arena;            /* the interned keys */
    size_t batch[PW_MAX_DEPTH];  /* items in the open batch of each open container */
    uint64_t mark[PW_MAX_DEPTH]; /* absolute offset of that batch's MARK */
    int depth;
    int failed;
    dcp_error err;
} pw;

/* fd < 0: in memory (pw.buf / pw.len after pw_finish). */
void pw_init(pw *w, int proto, int fd, const char *what);
void pw_free(pw *w);
/* Write STOP and flush. Returns 0, or -1 with the first error in err. */
int pw_finish(pw *w, dcp_error *err);

/* Scalars. */
void pw_none(pw *w);
void pw_bool(pw *w, int v);
void pw_int(pw *w, int64_t v);
void pw_uint(pw *w, uint64_t v);          /* LONG1 past INT64_MAX */
void pw_float(pw *w, double v);           /* BINFLOAT */
/* LONG1 of n little-endian two's complement bytes (a Python int past 64 bits). */
void pw_long_bytes(pw *w, const void *p, size_t n);
/* A str (UTF-8). Memoized; the same text written again with pw_str_shared
 * becomes a memo reference (CPython shares identical interned strings). */
void pw_str(pw *w, const char *s, size_t n);
void pw_str_shared(pw *w, const char *s, size_t n);
void pw_cstr(pw *w, const char *s);       /* pw_str_shared of a C string */
/* A bytes object. Protocol 2 has no bytes opcode: _codecs.encode(latin-1 str, 'latin1'),
 * exactly as CPython does; protocol 4 uses BINBYTES. */
void pw_bytes(pw *w, const void *p, size_t n);
/* A global module.name: GLOBAL in protocol 2, STACK_GLOBAL in 4; memoized and shared. */
void pw_global(pw *w, const char *module, const char *name);

/* Tuples of n items: pw_tuple_begin(n), the items, pw_tuple_end(n). Like
 * CPython: EMPTY_TUPLE, TUPLE1-3 without a MARK, else MARK ... TUPLE. */
void pw_tuple_begin(pw *w, size_t n);
void pw_tuple_end(pw *w, size_t n);
/* Containers: begin, then pw_dict_key before each key (followed by the key
 * and its value) or pw_list_elem before each element, then end. */
void pw_dict_begin(pw *w);
void pw_dict_key(pw *w);                  /* call before writing each key */
void pw_dict_end(pw *w);
void pw_list_begin(pw *w);
void pw_list_elem(pw *w);                 /* call before writing each element */
void pw_list_end(pw *w);

/* Calls: callable and args on the stack, then REDUCE (memoized result). */
void pw_reduce(pw *w);
/* cls on the stack: EMPTY_TUPLE NEWOBJ (memoized). */
void pw_newobj(pw *w);
void pw_build(pw *w);
void pw_binpersid(pw *w);
/* OrderedDict() as torch.save writes backward hooks: GLOBAL collections.OrderedDict, (), REDUCE. */
void pw_ordered_dict(pw *w);
/* Memo references: the index of the object memoized last, and a reference
 * to an earlier one (CPython writes a shared object such as torch.strided once). */
uint64_t pw_last_memo(const pw *w);
void pw_get(pw *w, uint64_t idx);

/* torch vocabulary shared by both writers: a tensor as torch.save pickles
 * it, torch._utils._rebuild_tensor_v2(persid(('storage', torch.<T>Storage,
 * storage_key, 'cpu', numel)), 0, size, contiguous stride, False,
 * OrderedDict()), or _rebuild_tensor_v3 with torch.UntypedStorage (numel in
 * bytes) and the dtype for the dtypes torch.save stores untyped. */
void pw_torch_tensor(pw *w, dcp_dtype dt, int ndim, const int64_t *shape, const char *storage_key);
/* The writers' rule for a tensor's shape: 1 when it has 0 to DCPI_MAX_NDIM
 * dimensions, no size negative, contiguous strides (torch's, an empty
 * dimension counted as 1) that fit int64, and, unless a size is 0 (no
 * element, whatever the others: torch.save writes torch.empty(2**62, 0)),
 * an element count at most INT64_MAX / 16 (its bytes fit int64 for every
 * dtype). A box inside a shape that fits fits too. pw_torch_tensor fails on
 * a shape that does not fit, dcp_ckpt_add_tensor refuses it. */
int pw_tensor_shape_fits(int ndim, const int64_t *shape);
/* 0 when the shape fits, else -1 with err: "DIR: KEY: shape [a,b]: too
 * large (...)" (or "a negative size"; "DIR: shape ..." when key is NULL). */
int pw_tensor_shape_check(const char *dir, const char *key, int ndim, const int64_t *shape, dcp_error *err);
/* torch.Size(v) as the .metadata writer pickles it: REDUCE(torch.Size, (v,)). */
void pw_torch_size(pw *w, const int64_t *v, int n);

/* A value the pickle reader parsed (pickle.h), pickled again as torch.save
 * would: None, bool, int, float, str, bytes, tuples, lists and dicts of
 * them (a torch.save source's plain values becoming DCP bytes items). 0;
 * -1 when it holds anything else (an object torch.load would rebuild); -2
 * when the pickle would pass max bytes (a node the source pickle shares is
 * written each time it is met). */
struct pk_node;
int pw_value(pw *w, const struct pk_node *n, uint64_t max);

#endif
