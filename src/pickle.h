/* A pickle reader that builds plain data and never executes anything.
 *
 * Protocols 2 to 5, the opcodes PyTorch's .metadata and torch.save's data.pkl
 * use. Globals become PK_GLOBAL nodes naming (module, name); REDUCE, NEWOBJ
 * and BUILD become PK_CALL nodes holding callable, args and state. The
 * interpretation of PyTorch classes lives in metadata.c and torchsave.c.
 *
 * Nodes may be shared (the memo) and, from hostile input, may form cycles:
 * walkers must bound their depth. The parser itself never recurses; the
 * number of nodes is bounded by the input size (at most two per opcode) and
 * all of them live in one arena owned by the pk_doc.
 */
#ifndef DCP_PICKLE_H
#define DCP_PICKLE_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "dcp.h"

typedef enum pk_type {
    PK_NONE, PK_BOOL, PK_INT, PK_BIGINT, PK_FLOAT, PK_STR, PK_BYTES,
    PK_TUPLE, PK_LIST, PK_DICT, PK_SET, PK_FROZENSET,
    PK_GLOBAL, PK_CALL, PK_PERSID
} pk_type;

typedef enum pk_call_kind { PK_REDUCE, PK_NEWOBJ } pk_call_kind;

typedef struct pk_node pk_node;
struct pk_node {
    pk_type type;
    union {
        bool b;
        int64_t i;                        /* PK_INT */
        double f;                         /* PK_FLOAT */
        struct {
            const char *p;                /* PK_STR (UTF-8), PK_BYTES, PK_BIGINT (little-endian */
            size_t len;                   /* two's complement) */
            uint64_t at;                  /* where the same bytes lie in the pickle: the payload */
        } s;                              /* of a BIN* opcode, else PK_AT_NONE */
        struct { pk_node **items; size_t n, cap; } seq;  /* TUPLE, LIST, SET, FROZENSET */
        struct { pk_node **keys, **vals; size_t n, cap; } dict;   /* insertion order */
        struct { const char *module, *name; } global;
        struct {
            pk_call_kind kind;
            pk_node *callable;            /* usually a PK_GLOBAL */
            pk_node *args;                /* a PK_TUPLE */
            pk_node *state;               /* BUILD argument, or NULL */
        } call;
        struct { pk_node *pid; } persid;  /* BINPERSID / PERSID argument */
    } u;
};

#define PK_AT_NONE UINT64_MAX

typedef struct pk_doc pk_doc;

/* Parse one pickle (up to STOP). `what` names the source for error messages
 * ("ckpt/.metadata"). The returned root is owned by *doc. */
int pk_parse(const void *data, size_t len, const char *what,
             pk_doc **doc, const pk_node **root, dcp_error *err);
void pk_free(pk_doc *doc);

/* A pickle read from a file as a stream, in bounded memory.
 *
 * The file is read in 1 MiB pieces; `bytes` (may be NULL) sees every byte of
 * the file once, in order, to its end (a content hash). `items` is offered
 * the key/value pairs of every SETITEMS (or SETITEM) into a plain dict, kv[2i]
 * and kv[2i+1], with the stack below them before they are added: stack[base]
 * is the dict, stack[0..base) what is under it, stack[floor..base) what lies
 * above the enclosing MARK (floor 0 without one). Returning 1 consumes them: they
 * are not added, and every node made since the batch's MARK is freed (a
 * SETITEM has none: its nodes are kept). Memo
 * entries made meanwhile are kept when they are scalars, strings or globals
 * (copied: what later entries refer back to: classes, dtypes, field names,
 * keys, file names) and released otherwise; a later reference to a released
 * one fails with PK_ERR_RELEASED in err->code (the caller may parse again
 * without consuming). 0 adds them as pk_parse does; -1 fails the parse
 * (err filled by the callback).
 *
 * Memory: the tree of what was not consumed, the kept memo and the largest
 * batch. The limits of pk_parse hold, checked against the file's size before
 * anything is read or allocated. */
#define PK_ERR_RELEASED 0x7e57   /* err->code when a released memo entry is referred to */
typedef struct pk_stream {
    int fd;
    uint64_t size;                                       /* bytes to parse: [0, size) */
    void (*bytes)(void *ctx, const void *p, size_t n);
    int (*items)(void *ctx, pk_node *const *stack, size_t floor, size_t base, pk_node *const *kv, size_t n);
    void *ctx;
    /* out: memo entries kept (count, bytes) and released at consumed batches */
    size_t memo_kept, memo_kept_bytes, memo_released, batches;
} pk_stream;

int pk_parse_stream(pk_stream *s, const char *what, pk_doc **doc, const pk_node **root, dcp_error *err);

/* Items given to an object by SETITEM(S) or APPEND(S) after its REDUCE or
 * NEWOBJ (OrderedDict(), defaultdict, list subclasses): a PK_DICT or PK_LIST,
 * or NULL when none were given. Accepts any node. */
const pk_node *pk_call_items(const pk_node *n);
/* n itself when it is a PK_DICT, the items dict of a dict-like object
 * (OrderedDict() + SETITEMS), else NULL. */
const pk_node *pk_as_dict(const pk_node *n);

/* Helpers for interpreters. All accept NULL and return false/NULL. */
bool pk_is_global(const pk_node *n, const char *module, const char *name);
/* The callable of a PK_CALL when it is a PK_GLOBAL, else NULL. */
const pk_node *pk_call_global(const pk_node *n);
/* dict lookup by string key */
const pk_node *pk_dict_get(const pk_node *dict, const char *key);
/* The state an object was given by BUILD: a dict, or the first non-empty
 * dict of a (dict, slots) pair as torch's _rebuild_from_type_v2 and the
 * __getstate__ of __slots__ classes hand it; else NULL. */
const pk_node *pk_obj_state(const pk_node *st);
bool pk_int(const pk_node *n, int64_t *out);           /* PK_INT or PK_BOOL */
bool pk_str(const pk_node *n, const char **p, size_t *len);
/* A dict key as Python's str() names it in a state-dict path: a str as it is,
 * an int in decimal, a bool as True or False (into buf). false for any other. */
#define PK_KEY_TEXT_MAX 24
bool pk_key_text(const pk_node *k, char buf[PK_KEY_TEXT_MAX], const char **s, size_t *len);
size_t pk_len(const pk_node *n);                       /* seq/dict length, 0 otherwise */
const pk_node *pk_item(const pk_node *n, size_t i);    /* seq item */
/* Protocol 2 has no bytes opcode: torch.save pickles bytes as
 * _codecs.encode('<latin-1 text>', 'latin1'). The text node of such a call,
 * else NULL. */
const pk_node *pk_latin1_text(const pk_node *n);
/* A bytes object as a pickle holds it: BINBYTES, or protocol 2's latin-1
 * call. 0 with a malloc'd copy of its bytes; 1 when n is not one; -1 out
 * of memory. */
int pk_bytes_copy(const pk_node *n, unsigned char **out, size_t *len);

#endif
