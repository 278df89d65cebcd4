/* The record locator: where a tensor chunk's elements are in its shard file.
 *
 * A chunk's blob is a whole torch.save zip (data.pkl names the storage record,
 * its offset, size, stride and dtype), or, with the SAFETENSORS serialization,
 * a safetensors buffer shared by the file's tensors, or (Hugging Face layout)
 * raw C-contiguous bytes. */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "pickle.h"
#include "safetensors.h"
#include "zip.h"

#define PKL_MAX (64u << 20)            /* a tensor chunk's data.pkl is ~150 bytes */
#define STORAGE_KEY_MAX 100            /* torch writes decimal keys ("0") */

typedef struct loc {
    dcp_checkpoint *ck;
    const dcp_entry *e;
    const dcp_chunk *c;
    size_t chunk;
    dcp_error *err;
    int64_t *stride;            /* the caller's room for the record's strides */
} loc;

__attribute__((format(printf, 3, 4)))
static int loc_fail(loc *l, int code, const char *fmt, ...)
{
    char why[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return dcpi_err(l->err, code, "%s/%s: %s: chunk %zu at offset %llu: %s", l->ck->path,
                    l->ck->files[l->c->blob.file], l->e->key, l->chunk,
                    (unsigned long long)l->c->blob.offset, why);
}

/* The strides go to the caller's array (the caller decides where records live). */
static int64_t *stride_copy(loc *l, const int64_t *s, int nd)
{
    if (nd)
        memcpy(l->stride, s, (size_t)nd * sizeof *s);
    return l->stride;
}

/* Bytes of the chunk's elements, or 0 with an error on overflow. */
static int chunk_bytes(loc *l, dcp_dtype dt, uint64_t *out)
{
    uint64_t n;
    for (int d = 0; d < l->e->ndim; d++)
        if (l->c->sizes[d] < 0)
            return loc_fail(l, EIO, "the chunk's size overflows");
    /* a 0 anywhere: 0 bytes, whatever the other sizes (torch.empty(2**62, 0)) */
    if (!dcpi_shape_numel(l->e->ndim, l->c->sizes, &n) || !dcpi_mul_u64(n, dcp_dtype_size(dt), &n))
        return loc_fail(l, EIO, "the chunk's size overflows");
    *out = n;
    return 0;
}

/* Raw C-contiguous bytes of exactly the chunk (safetensors data). */
static int raw_record(loc *l, uint64_t data_offset, uint64_t data_length, dcp_dtype dt, dcp_record *rec)
{
    const dcp_entry *e = l->e;
    uint64_t need = 0;
    if (dcp_dtype_size(dt) != dcp_dtype_size(e->dtype))
        return loc_fail(l, EIO, "stored dtype %s has another element size than %s", dcp_dtype_name(dt),
                        dcp_dtype_name(e->dtype));
    if (chunk_bytes(l, dt, &need) < 0)
        return -1;
    if (data_length != need)
        return loc_fail(l, EIO, "%" PRIu64 " bytes stored, the chunk needs %" PRIu64, data_length, need);
    /* C order, torch's (a size of 0 counted as 1). They fit when the chunk has
     * elements (its byte count did); an empty chunk's address nothing and
     * stop at INT64_MAX where they would not fit ([0, 2^62, 2^62]). */
    int64_t st[DCPI_MAX_NDIM], s = 1;
    for (int d = e->ndim - 1; d >= 0; d--) {
        st[d] = s;
        if (__builtin_mul_overflow(s, l->c->sizes[d] ? l->c->sizes[d] : 1, &s))
            s = INT64_MAX;
    }
    memset(rec, 0, sizeof *rec);
    rec->data_offset = data_offset;
    rec->data_length = data_length;
    rec->dtype = dt;
    rec->stride = stride_copy(l, st, e->ndim);
    return rec->stride ? 0 : -1;
}

/* ------------------------------------------------- SAFETENSORS-format shards */

/* A parsed safetensors header: every tensor of one buffer, sorted by name.
 * One allocation (offsets instead of pointers) so it can be copied into the
 * arena whole; parsed once per buffer, since each header names all of a
 * file's tensors and re-parsing it per chunk would be quadratic. */
typedef struct st_tensor {
    uint64_t name_off, shape_off;   /* into the pool */
    uint32_t name_len;
    int32_t nd;
    dcp_dtype dt;                   /* DCP_DTYPE_INVALID for an unknown dtype string */
    uint64_t begin, end;            /* data_offsets, checked against the file */
} st_tensor;

struct dcpi_st_index {
    struct dcpi_st_index *next;
    uint32_t file;
    uint64_t offset;                /* of the buffer in the file */
    uint64_t data_start;            /* absolute offset of its byte buffer */
    size_t n;
    st_tensor *t;                   /* n entries, then the pool */
    char *pool;
};

static int st_cmp(const void *a, const void *b, void *pool)
{
    const st_tensor *x = a, *y = b;
    size_t n = x->name_len < y->name_len ? x->name_len : y->name_len;
    int c = memcmp((const char *)pool + x->name_off, (const char *)pool + y->name_off, n);
    return c ? c : (x->name_len > y->name_len) - (x->name_len < y->name_len);
}

/* Parse the header at b->offset of b->file into a malloc'd index (one block). */
static struct dcpi_st_index *st_parse(loc *l, size_t *bytes)
{
    dcp_checkpoint *ck = l->ck;
    const dcp_blob *b = &l->c->blob;
    const char *file = ck->files[b->file];
    uint64_t fsize, n = 0;
    unsigned char hl[8];
    if (dcpi_ck_file_size(ck, b->file, &fsize, l->err) < 0)
        return NULL;
    if (b->offset > fsize || fsize - b->offset < 8) {
        loc_fail(l, EIO, "neither a torch.save archive nor a safetensors buffer (file of %" PRIu64 " bytes)", fsize);
        return NULL;
    }
    if (dcpi_pread_full(ck, b->file, hl, 8, b->offset, l->e->key, l->err) < 0)
        return NULL;
    for (int i = 7; i >= 0; i--)
        n = (n << 8) | hl[i];
    if (n < 2 || n > DCPI_ST_HEADER_MAX || n > fsize - b->offset - 8) {
        loc_fail(l, EIO, "neither a torch.save archive nor a safetensors buffer (header length %" PRIu64 ")", n);
        return NULL;
    }
    char *hdr = malloc(n);
    if (!hdr) {
        dcpi_err(l->err, ENOMEM, "%s/%s: %s: out of memory", ck->path, file, l->e->key);
        return NULL;
    }
    if (dcpi_pread_full(ck, b->file, hdr, n, b->offset + 8, l->e->key, l->err) < 0) {
        free(hdr);
        return NULL;
    }
    json_error_t je;
    json_t *root = json_loadb(hdr, n, 0, &je);
    free(hdr);
    if (!json_is_object(root)) {
        loc_fail(l, EIO, "bad safetensors header: %s", root ? "not a JSON object" : je.text);
        json_decref(root);
        return NULL;
    }
    uint64_t data_start = b->offset + 8 + n, avail = fsize - data_start;
    /* Size the block: entries, then names and shapes. */
    size_t count = 0, pool = 0;
    const char *name;
    json_t *t;
    json_object_foreach(root, name, t) {
        count++;
        pool += strlen(name) + 1 + json_array_size(json_object_get(t, "shape")) * sizeof(int64_t) + 8;
    }
    size_t total = sizeof(struct dcpi_st_index) + count * sizeof(st_tensor) + pool;
    struct dcpi_st_index *ix = calloc(1, total);
    if (!ix) {
        json_decref(root);
        dcpi_err(l->err, ENOMEM, "%s/%s: %s: out of memory", ck->path, file, l->e->key);
        return NULL;
    }
    ix->file = b->file;
    ix->offset = b->offset;
    ix->data_start = data_start;
    ix->t = (st_tensor *)(ix + 1);
    ix->pool = (char *)(ix->t + count);
    size_t pos = 0;
    const char *why = NULL;
    json_object_foreach(root, name, t) {
        if (!strcmp(name, "__metadata__"))
            continue;
        json_t *dts = json_object_get(t, "dtype"), *offs = json_object_get(t, "data_offsets");
        json_t *shape = json_object_get(t, "shape");
        if (!json_is_string(dts) || !json_is_array(offs) || json_array_size(offs) != 2 || !json_is_array(shape) ||
            json_array_size(shape) > DCPI_MAX_NDIM) {
            why = name;
            break;
        }
        json_int_t b0 = json_integer_value(json_array_get(offs, 0)), b1 = json_integer_value(json_array_get(offs, 1));
        if (!json_is_integer(json_array_get(offs, 0)) || !json_is_integer(json_array_get(offs, 1)) || b0 < 0 ||
            b1 < b0 || (uint64_t)b1 > avail) {
            why = name;
            break;
        }
        st_tensor *e = &ix->t[ix->n++];
        size_t nl = strlen(name);
        e->name_off = pos;
        e->name_len = (uint32_t)nl;
        memcpy(ix->pool + pos, name, nl + 1);
        pos += (nl + 8) & ~(size_t)7;
        e->shape_off = pos;
        e->nd = (int32_t)json_array_size(shape);
        for (int d = 0; d < e->nd; d++) {
            json_t *s = json_array_get(shape, (size_t)d);
            int64_t v = json_integer_value(s);
            if (!json_is_integer(s) || v < 0) {
                why = name;
                break;
            }
            memcpy(ix->pool + pos + (size_t)d * sizeof v, &v, sizeof v);
        }
        pos += (size_t)e->nd * sizeof(int64_t);
        e->dt = dcp_dtype_from_safetensors(json_string_value(dts));
        e->begin = (uint64_t)b0;
        e->end = (uint64_t)b1;
        if (why)
            break;
    }
    if (why) {
        loc_fail(l, EIO, "malformed safetensors entry for '%.200s'", why);
        json_decref(root);
        free(ix);
        return NULL;
    }
    json_decref(root);
    qsort_r(ix->t, ix->n, sizeof *ix->t, st_cmp, ix->pool);
    *bytes = sizeof *ix + ix->n * sizeof(st_tensor) + pos;
    return ix;
}

/* The index of the buffer at b: from the checkpoint's list, or parsed and added. */
static const struct dcpi_st_index *st_index(loc *l)
{
    dcp_checkpoint *ck = l->ck;
    const dcp_blob *b = &l->c->blob;
    const struct dcpi_st_index *found = NULL;
    pthread_mutex_lock(&ck->lock);
    for (const struct dcpi_st_index *ix = ck->st_index; ix && !found; ix = ix->next)
        if (ix->file == b->file && ix->offset == b->offset)
            found = ix;
    pthread_mutex_unlock(&ck->lock);
    if (found)
        return found;
    size_t bytes = 0;
    struct dcpi_st_index *tmp = st_parse(l, &bytes);   /* without the lock: it reads */
    if (!tmp)
        return NULL;
    pthread_mutex_lock(&ck->lock);
    for (const struct dcpi_st_index *ix = ck->st_index; ix && !found; ix = ix->next)
        if (ix->file == b->file && ix->offset == b->offset)
            found = ix;   /* another thread won */
    if (!found) {
        /* Copy the used part into the arena and rebase its two inner pointers. */
        size_t head = sizeof *tmp + tmp->n * sizeof(st_tensor), pool = bytes - head;
        struct dcpi_st_index *ix = dcpi_arena_alloc(&ck->arena, bytes);
        if (ix) {
            *ix = *tmp;
            ix->t = (st_tensor *)(ix + 1);
            memcpy(ix->t, tmp->t, tmp->n * sizeof(st_tensor));
            ix->pool = (char *)(ix->t + ix->n);
            memcpy(ix->pool, tmp->pool, pool);
            ix->next = ck->st_index;
            ck->st_index = ix;
            found = ix;
        }
    }
    pthread_mutex_unlock(&ck->lock);
    free(tmp);
    if (!found)
        dcpi_err(l->err, ENOMEM, "%s: %s: out of memory", ck->path, l->e->key);
    return found;
}

/* SAFETENSORS-format .distcp: the blob offset is the start of a safetensors
 * buffer holding the file's tensors by key; the blob length is the tensor's
 * byte count (not the buffer's). */
static int safetensors_record(loc *l, dcp_record *rec)
{
    const struct dcpi_st_index *ix = st_index(l);
    if (!ix)
        return -1;
    const char *key = l->e->key;
    size_t kl = strlen(key), lo = 0, hi = ix->n;
    const st_tensor *t = NULL;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const st_tensor *m = &ix->t[mid];
        size_t n = m->name_len < kl ? m->name_len : kl;
        int c = memcmp(ix->pool + m->name_off, key, n);
        if (!c)
            c = (m->name_len > kl) - (m->name_len < kl);
        if (!c) {
            t = m;
            break;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (!t)
        return loc_fail(l, EIO, "the safetensors buffer has no tensor named by this key");
    if (t->dt == DCP_DTYPE_INVALID)
        return loc_fail(l, EIO, "unknown safetensors dtype");
    int same = t->nd == l->e->ndim;
    for (int d = 0; same && d < t->nd; d++) {
        int64_t v;
        memcpy(&v, ix->pool + t->shape_off + (size_t)d * sizeof v, sizeof v);
        same = v == l->c->sizes[d];
    }
    if (!same)
        return loc_fail(l, EIO, "the stored shape differs from the chunk's sizes");
    if (t->end - t->begin != l->c->blob.length)
        return loc_fail(l, EIO, "the storage entry says %" PRIu64 " bytes, the safetensors entry holds %" PRIu64,
                        l->c->blob.length, t->end - t->begin);
    return raw_record(l, ix->data_start + t->begin, t->end - t->begin, t->dt, rec);
}

/* ------------------------------------------------------- torch.save archives */

/* Tensor subclasses whose values are one plain tensor they wrap, in its
 * dtype and shape: training weights that cast to float8/MXFP8 only when used
 * (torchao, and float8_experimental before it; torchtitan's float8 and MoE
 * trainings save them, FSDP2's DTensor shards included). torch.save writes
 * them as _rebuild_from_type_v2(_rebuild_wrapper_subclass, class, (class,
 * dtype, size, ...), state) with the wrapped tensor in state[field]. Named
 * one by one: another subclass may hold a tensor of the same shape that is
 * not its value (quantized, swizzled). */
static const struct {
    const char *module, *name, *field;
} value_wrappers[] = {
    {"torchao.float8.fsdp_utils", "WeightWithDynamicFloat8CastTensor", "_tensor"},
    {"torchao.float8.fsdp_utils", "WeightWithDelayedFloat8CastTensor", "_tensor"},
    {"torchao.float8.fsdp_utils", "WeightWithStaticFloat8CastTensor", "_tensor"},
    {"float8_experimental.fsdp_utils", "WeightWithDynamicFloat8CastTensor", "_tensor"},
    {"float8_experimental.fsdp_utils", "WeightWithDelayedFloat8CastTensor", "_tensor"},
    {"float8_experimental.fsdp_utils", "WeightWithStaticFloat8CastTensor", "_tensor"},
    {"torchao.prototype.moe_training.tensor", "ScaledGroupedMMTensor", "_data"},
    {"torchao.prototype.moe_training.tensor", "Float8TrainingWeightWrapperTensor", "_data"},
    {"torchao.prototype.moe_training.tensor", "MXFP8TrainingWeightWrapperTensor", "_data"},
};

/* The field of a value wrapper's state holding its tensor, or NULL. */
static const char *value_wrapper_field(const pk_node *ty)
{
    for (size_t i = 0; i < sizeof value_wrappers / sizeof value_wrappers[0]; i++)
        if (pk_is_global(ty, value_wrappers[i].module, value_wrappers[i].name))
            return value_wrappers[i].field;
    return NULL;
}

/* A callable that rebuilds a tensor libdcp does not read, by its global:
 * torch's other rebuilds (_rebuild_qtensor of torch.ao's quantized tensors,
 * sparse, nested) and the reduce functions of tensor libraries' own types
 * (TransformerEngine's Float8Tensor: _make_float8_tensor_in_reduce_ex;
 * torchao's). Other callables (a dict, an int where a tensor belongs) are
 * no tensor record at all. */
static int unread_rebuild(const char *module, const char *name)
{
    return ((!strcmp(module, "torch._utils") || !strcmp(module, "torch._tensor")) &&
            !strncmp(name, "_rebuild_", 9)) ||
           !strncmp(module, "transformer_engine.", 19) || !strncmp(module, "torchao.", 8);
}

/* The _rebuild_tensor_v2/v3 call behind the wrappers torch.save may use:
 * _rebuild_parameter(data, ...), _rebuild_parameter_with_state(data, ...),
 * _rebuild_from_type_v2(func, type, args, state) for a subclass of Tensor
 * rebuilt from a storage (func: that call) and for a value wrapper (its
 * tensor in state). Sets *fn to the rebuild function and *args to its
 * argument tuple; *wrapper (when not NULL) to the outermost value wrapper's
 * _rebuild_wrapper_subclass arguments, or NULL; on failure *unread (when not
 * NULL) to the call it stopped at when that is a well-formed rebuild libdcp
 * does not read (a wrapper subclass that is no value wrapper, torch.ao's
 * _rebuild_qtensor, a library's own reduce function), else NULL. */
static int find_rebuild(const pk_node *n, const pk_node **fn, const pk_node **args, const pk_node **wrapper,
                        const pk_node **unread)
{
    if (wrapper)
        *wrapper = NULL;
    if (unread)
        *unread = NULL;
    for (int depth = 0; depth < 4 && n; depth++) {   /* hostile input may nest or cycle */
        const pk_node *g = pk_call_global(n);
        if (!g)
            return -1;
        const pk_node *a = n->u.call.args;
        const char *m = g->u.global.module, *name = g->u.global.name;
        if (!strcmp(m, "torch._utils") && (!strcmp(name, "_rebuild_tensor_v2") || !strcmp(name, "_rebuild_tensor_v3"))) {
            *fn = g;
            *args = a;
            return 0;
        }
        if (!strcmp(m, "torch._utils") &&
            (!strcmp(name, "_rebuild_parameter") || !strcmp(name, "_rebuild_parameter_with_state"))) {
            n = pk_item(a, 0);
        } else if (!strcmp(m, "torch._tensor") && !strcmp(name, "_rebuild_from_type_v2")) {
            const pk_node *f = pk_item(a, 0), *ty = pk_item(a, 1), *fa = pk_item(a, 2);
            const char *field = value_wrapper_field(ty);
            if (pk_is_global(f, "torch._utils", "_rebuild_wrapper_subclass") && ty && ty->type == PK_GLOBAL &&
                !field) {
                if (unread)
                    *unread = n;
                return -1;
            }
            if (field && pk_is_global(f, "torch._utils", "_rebuild_wrapper_subclass") && fa &&
                fa->type == PK_TUPLE) {
                if (wrapper && !*wrapper)
                    *wrapper = fa;
                n = pk_dict_get(pk_obj_state(pk_item(a, 3)), field);
                continue;
            }
            if (!pk_is_global(f, "torch._utils", "_rebuild_tensor_v2") &&
                !pk_is_global(f, "torch._utils", "_rebuild_tensor_v3"))
                return -1;
            /* Any class: a tensor rebuilt from a storage holds its elements
             * there (a Parameter, a framework's subclass of Tensor). */
            if (!ty || ty->type != PK_GLOBAL || !fa || fa->type != PK_TUPLE)
                return -1;
            *fn = f;
            *args = fa;
            return 0;
        } else {
            if (unread && unread_rebuild(m, name))
                *unread = n;
            return -1;
        }
    }
    return -1;
}

/* What a rebuild find_rebuild does not read is, for a message: a wrapper
 * subclass by its class, another callable by its module and name. */
static void unread_name(const pk_node *n, char *out, size_t cap)
{
    const pk_node *g = pk_call_global(n);
    const pk_node *ty = pk_is_global(g, "torch._tensor", "_rebuild_from_type_v2") ? pk_item(n->u.call.args, 1)
                                                                                  : NULL;
    if (ty && ty->type == PK_GLOBAL)
        snprintf(out, cap, "a %s.%s, a tensor subclass whose stored tensors libdcp does not know to be its values",
                 ty->u.global.module, ty->u.global.name);
    else
        snprintf(out, cap, "%s.%s, a rebuild libdcp does not read: its stored bytes alone are not the values",
                 g->u.global.module, g->u.global.name);
}

static const char *callable_name(const pk_node *n)
{
    const pk_node *g = pk_call_global(n);
    return g ? g->u.global.name : "not a call";
}

static int vec(const pk_node *t, int64_t *out, int *nd)
{
    if (!t || (t->type != PK_TUPLE && t->type != PK_LIST) || pk_len(t) > DCPI_MAX_NDIM)
        return -1;
    for (size_t i = 0; i < pk_len(t); i++)
        if (!pk_int(pk_item(t, i), &out[i]))
            return -1;
    *nd = (int)pk_len(t);
    return 0;
}

/* Read a small record's bytes (byteorder) into buf (cap bytes + NUL). */
static int small_record(loc *l, const dcpi_zip_entry *ze, uint64_t blen, char *buf, size_t cap)
{
    uint64_t start;
    if (ze->size > cap)
        return loc_fail(l, EIO, "%s record of %" PRIu64 " bytes is too large", ze->name, ze->size);
    if (dcpi_zip_data(l->ck, &l->c->blob, l->e->key, ze, blen, &start, l->err) < 0 ||
        dcpi_blob_read(l->ck, &l->c->blob, buf, (size_t)ze->size, start, l->e->key, l->err) < 0)
        return -1;
    buf[ze->size] = 0;
    return 0;
}

int dcpi_torch_is_tensor(const pk_node *n)
{
    const pk_node *fn, *args;
    return find_rebuild(n, &fn, &args, NULL, NULL) == 0;
}

__attribute__((format(printf, 3, 4)))
static int why_fail(char *why, size_t whylen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, whylen, fmt, ap);
    va_end(ap);
    return -1;
}

int dcpi_torch_rebuild_parse(const pk_node *n, dcpi_rebuild *r, char *why, size_t whylen)
{
    const pk_node *fn, *args, *wrapper, *unread;
    memset(r, 0, sizeof *r);
    if (find_rebuild(n, &fn, &args, &wrapper, &unread) < 0) {
        if (!unread)
            return why_fail(why, whylen, "data.pkl does not rebuild a plain tensor (%s)", callable_name(n));
        char what[400];
        unread_name(unread, what, sizeof what);
        why_fail(why, whylen, "data.pkl does not rebuild a plain tensor (%s)", what);
        return -2;
    }
    int v3 = !strcmp(fn->u.global.name, "_rebuild_tensor_v3");
    const pk_node *sto = pk_item(args, 0);
    const pk_node *pid = sto && sto->type == PK_PERSID ? sto->u.persid.pid : NULL;
    const char *tag;
    size_t tagl;
    int64_t snumel;
    int snd;
    const pk_node *cls = pk_item(pid, 1);
    if (!pid || pk_len(pid) < 5 || !pk_str(pk_item(pid, 0), &tag, &tagl) || tagl != 7 || memcmp(tag, "storage", 7) ||
        !cls || cls->type != PK_GLOBAL || !pk_str(pk_item(pid, 2), &r->storage_key, &r->storage_key_len) ||
        !pk_int(pk_item(pid, 4), &snumel) || !pk_int(pk_item(args, 1), &r->storage_offset) ||
        vec(pk_item(args, 2), r->size, &r->ndim) < 0 || vec(pk_item(args, 3), r->stride, &snd) < 0 ||
        r->ndim != snd)
        return why_fail(why, whylen, "malformed _rebuild_tensor arguments in data.pkl");
    r->storage_type = cls->u.global.name;
    const pk_node *meta;
    if (v3) {
        const pk_node *d = pk_item(args, 6);
        r->dtype = d && d->type == PK_GLOBAL && !strcmp(d->u.global.module, "torch")
                       ? dcp_dtype_from_name(d->u.global.name) : DCP_DTYPE_INVALID;
        meta = pk_item(args, 7);
        if (r->dtype == DCP_DTYPE_INVALID)
            return why_fail(why, whylen, "unknown dtype %s in _rebuild_tensor_v3",
                            d && d->type == PK_GLOBAL ? d->u.global.name : "(not a global)");
    } else {
        r->dtype = dcp_dtype_from_storage(cls->u.global.name);
        meta = pk_item(args, 6);
        if (r->dtype == DCP_DTYPE_INVALID)
            return why_fail(why, whylen, "unknown storage type %s", cls->u.global.name);
    }
    size_t esz = dcp_dtype_size(r->dtype);
    /* Typed storages count elements, UntypedStorage (v3) counts bytes. */
    if (snumel < 0 || !dcpi_mul_u64((uint64_t)snumel, strcmp(cls->u.global.name, "UntypedStorage") ? esz : 1,
                                    &r->storage_bytes))
        return why_fail(why, whylen, "bad storage size %" PRId64, snumel);
    if (r->storage_key_len == 0 || r->storage_key_len > STORAGE_KEY_MAX ||
        memchr(r->storage_key, 0, r->storage_key_len) || memchr(r->storage_key, '/', r->storage_key_len))
        return why_fail(why, whylen, "bad storage key in data.pkl");
    if (meta && meta->type == PK_DICT) {
        int64_t v;
        if (pk_int(pk_dict_get(meta, "conj"), &v) && v)
            r->flags |= DCP_RECORD_CONJ;
        if (pk_int(pk_dict_get(meta, "neg"), &v) && v)
            r->flags |= DCP_RECORD_NEG;
    }
    if (wrapper) {  /* the wrapper shows its tensor's dtype and shape */
        const pk_node *ty = pk_item(wrapper, 0), *d = pk_item(wrapper, 1);
        int64_t wsize[DCPI_MAX_NDIM];
        int wnd;
        if (!d || d->type != PK_GLOBAL || strcmp(d->u.global.module, "torch") ||
            dcp_dtype_from_name(d->u.global.name) != r->dtype || vec(pk_item(wrapper, 2), wsize, &wnd) < 0 ||
            wnd != r->ndim || memcmp(wsize, r->size, (size_t)wnd * sizeof *wsize))
            return why_fail(why, whylen, "data.pkl: the %s wrapper's dtype or shape is not that of the tensor it holds",
                            ty && ty->type == PK_GLOBAL ? ty->u.global.name : "tensor subclass");
    }
    return 0;
}

int dcpi_torch_rebuild_check_view(const dcpi_rebuild *r, char *why, size_t whylen)
{
    size_t esz = dcp_dtype_size(r->dtype);
    /* Every element the view addresses must lie inside the storage. */
    if (r->storage_offset < 0)
        return why_fail(why, whylen, "negative storage offset %" PRId64, r->storage_offset);
    uint64_t last = (uint64_t)r->storage_offset;
    int empty = 0;
    for (int d = 0; d < r->ndim; d++) {
        uint64_t span;
        if (r->size[d] < 0)
            return why_fail(why, whylen, "negative size %" PRId64 " in dimension %d", r->size[d], d);
        if (r->stride[d] < 0)
            return why_fail(why, whylen, "negative stride %" PRId64 " in dimension %d", r->stride[d], d);
        if (r->size[d] == 0)
            empty = 1;
        else if (!dcpi_mul_u64((uint64_t)(r->size[d] - 1), (uint64_t)r->stride[d], &span) ||
                 !dcpi_add_u64(last, span, &last))
            return why_fail(why, whylen, "strides overflow");
    }
    if (!empty && last >= r->storage_bytes / esz)
        return why_fail(why, whylen, "the stored view reaches element %" PRIu64 " of a %" PRIu64 "-element storage",
                        last, r->storage_bytes / esz);
    return 0;
}

static int zip_record(loc *l, dcp_record *rec)
{
    dcp_checkpoint *ck = l->ck;
    const dcp_blob *b = &l->c->blob;
    const char *key = l->e->key;
    dcpi_zip z;
    uint64_t blen;
    if (dcpi_blob_size(ck, b, &blen, key, l->err) < 0 || dcpi_zip_open(ck, b, key, &z, l->err) < 0)
        return -1;
    int rc = -1;
    char *pkl = NULL;
    pk_doc *doc = NULL;
    const pk_node *root;
    const dcpi_zip_entry *pe = dcpi_zip_find(&z, "data.pkl");
    uint64_t pstart, dstart;
    if (!pe) {
        loc_fail(l, EIO, "no data.pkl in the torch.save archive");
        goto out;
    }
    if (pe->size > PKL_MAX) {
        loc_fail(l, EIO, "data.pkl of %" PRIu64 " bytes is too large for a tensor chunk", pe->size);
        goto out;
    }
    if (dcpi_zip_data(ck, b, key, pe, blen, &pstart, l->err) < 0)
        goto out;
    pkl = malloc(pe->size ? pe->size : 1);
    if (!pkl) {
        dcpi_err(l->err, ENOMEM, "%s: %s: out of memory", ck->path, key);
        goto out;
    }
    if (dcpi_blob_read(ck, b, pkl, pe->size, pstart, key, l->err) < 0)
        goto out;
    char what[1024];
    snprintf(what, sizeof what, "%s/%s: %s: data.pkl", ck->path, ck->files[b->file], key);
    if (pk_parse(pkl, pe->size, what, &doc, &root, l->err) < 0)
        goto out;
    dcpi_rebuild rb;
    char why[512];
    int parsed = dcpi_torch_rebuild_parse(root, &rb, why, sizeof why);
    if (parsed < 0) {   /* ENOTSUP: an intact record libdcp does not read (dcp_verify_structure) */
        loc_fail(l, parsed == -2 ? ENOTSUP : EIO, "%s", why);
        goto out;
    }
    dcp_dtype dt = rb.dtype;
    int nd = rb.ndim;
    if (dcp_dtype_size(dt) != dcp_dtype_size(l->e->dtype)) {
        loc_fail(l, EIO, "stored dtype %s differs in size from the metadata's %s", dcp_dtype_name(dt),
                 dcp_dtype_name(l->e->dtype));
        goto out;
    }
    if (nd != l->e->ndim || memcmp(rb.size, l->c->sizes, (size_t)nd * sizeof *rb.size)) {
        loc_fail(l, EIO, "stored tensor shape differs from the chunk's sizes");
        goto out;
    }
    char rname[STORAGE_KEY_MAX + 8];
    snprintf(rname, sizeof rname, "data/%.*s", (int)rb.storage_key_len, rb.storage_key);
    const dcpi_zip_entry *de = dcpi_zip_find(&z, rname);
    if (!de) {
        loc_fail(l, EIO, "storage record %s is missing from the archive", rname);
        goto out;
    }
    if (de->size != rb.storage_bytes) {
        loc_fail(l, EIO, "storage record %s holds %" PRIu64 " bytes, data.pkl says %" PRIu64, rname, de->size,
                 rb.storage_bytes);
        goto out;
    }
    if (dcpi_torch_rebuild_check_view(&rb, why, sizeof why) < 0) {
        loc_fail(l, EIO, "%s", why);
        goto out;
    }
    if (dcpi_zip_data(ck, b, key, de, blen, &dstart, l->err) < 0)
        goto out;
    uint32_t flags = rb.flags;
    const dcpi_zip_entry *bo = dcpi_zip_find(&z, "byteorder");
    if (bo) {   /* absent before torch 2.1: the saver's order, little-endian in practice */
        char order[17];
        if (small_record(l, bo, blen, order, 16) < 0)
            goto out;
        if (!strcmp(order, "big")) {
            flags |= DCP_RECORD_BIG_ENDIAN;
        } else if (strcmp(order, "little")) {
            loc_fail(l, EIO, "unknown byteorder '%s'", order);
            goto out;
        }
    }
    memset(rec, 0, sizeof *rec);
    rec->data_length = de->size;
    rec->storage_offset = rb.storage_offset;
    rec->dtype = dt;
    if (b->transforms & DCP_TRANSFORM_ZSTD) {
        flags |= DCP_RECORD_DECODED;
        rec->data_offset = dstart;
    } else {
        rec->data_offset = b->offset + dstart;
    }
    rec->flags = flags;
    rec->stride = stride_copy(l, rb.stride, nd);
    rc = rec->stride ? 0 : -1;
out:
    pk_free(doc);
    free(pkl);
    dcpi_zip_close(&z);
    return rc;
}

int dcpi_locate_record(dcp_checkpoint *ck, const dcp_entry *e, const dcp_chunk *c, size_t chunk, dcp_record *rec,
                       int64_t *stride, dcp_error *err)
{
    loc l = {ck, e, c, chunk, err, stride};
    if (!c->has_blob) {
        char box[256];
        size_t used = 0;
        for (int d = 0; d < e->ndim && used < sizeof box - 24; d++)
            used += (size_t)snprintf(box + used, sizeof box - used, "%s%lld", d ? "," : "", (long long)c->offsets[d]);
        box[used] = 0;
        return dcpi_err(err, ENOENT, "%s: %s: no storage entry for the chunk at offsets [%s]", ck->path, e->key, box);
    }
    if (c->blob.transforms & DCPI_BLOB_RAW)   /* Hugging Face layout: checked at open */
        return raw_record(&l, c->blob.offset, c->blob.length, e->dtype, rec);
    /* Tell a torch.save archive from a safetensors buffer by its first bytes. */
    unsigned char magic[4] = {0};
    uint64_t blen;
    if (dcpi_blob_size(ck, &c->blob, &blen, e->key, err) < 0)
        return -1;
    if (blen >= 4 && dcpi_blob_read(ck, &c->blob, magic, 4, 0, e->key, err) < 0)
        return -1;
    if (!memcmp(magic, "PK\3\4", 4))
        return zip_record(&l, rec);
    if (c->blob.transforms & DCP_TRANSFORM_ZSTD)
        return loc_fail(&l, EIO, "the decoded blob is not a torch.save archive");
    return safetensors_record(&l, rec);
}
