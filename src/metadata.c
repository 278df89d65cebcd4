/* The .metadata interpreter: a DCP Metadata pickle to the checkpoint model.
 *
 * Recognises both module generations (torch.distributed._shard.checkpoint of
 * 1.13 and torch.distributed.checkpoint of 2.x) by the class paths and fields
 * present; any other class with the Metadata fields (Megatron-Core's
 * MCoreMetadata subclass) is read the same way, its extra fields ignored.
 *
 * The file is parsed as a stream (pk_parse_stream): the batches of items the
 * pickler writes into the two big dicts, state_dict_metadata (key ->
 * TensorStorageMetadata) and storage_data (MetadataIndex -> _StorageInfo),
 * are given to the model as they complete and freed, so the parse holds one
 * batch (1000 items) of the pickle tree, never the file's. Whatever is not
 * taken so (items of another shape) stays in the tree and is read at the
 * end, as before. A pickle that refers back to an object of a freed batch
 * (no PyTorch version does) is parsed again whole.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "pickle.h"

#define METADATA_MAX_BYTES (16ULL << 30)   /* refuse absurd files before allocating */

/* One load: a .metadata, or all __R.metadata files of a rank-local folder
 * (the box index spans the files, so replicas merge in linear time). */
typedef struct interp {
    dcp_checkpoint *ck;
    const char *what;          /* the file being read, "<ckpt>/.metadata", for messages */
    dcp_error *err;
    /* Finding a storage_data item's chunk: its entry by key (ck->keys),
     * then the chunk at its offsets: first the one after the last found
     * (storage_data lists an entry's chunks in the order
     * state_dict_metadata does, rank after rank), else a binary search of
     * the entry's chunks sorted by offsets, made on the first miss. */
    uint32_t *next;            /* per entry: the chunk to try first */
    uint32_t **order;          /* per entry: its chunks sorted by offsets, or NULL */
    size_t nslots;             /* of next and order */
    int saw_new_properties;    /* TensorProperties from torch.distributed.checkpoint.metadata */
    int saw_old_properties;    /* ... from torch.distributed._shard.sharded_tensor.metadata */
    int identity;              /* the global .metadata: its key and stamp come from this read */
    int whole;                 /* parse the whole tree first (no streaming) */
    int sdm_seen;              /* state_dict_metadata items were taken from the stream */
    int merging;               /* reading every __R.metadata of a rank-local folder into one model */
    dcpi_identity *id;         /* the content key of the file being read, or NULL */
} interp;

static const char *class_name(const pk_node *obj)
{
    const pk_node *g = pk_call_global(obj);
    return g ? g->u.global.name : NULL;
}

static const char *class_module(const pk_node *obj)
{
    const pk_node *g = pk_call_global(obj);
    return g ? g->u.global.module : NULL;
}

/* The state dict of a dataclass instance (NEWOBJ + BUILD), or NULL. */
static const pk_node *state_of(const pk_node *obj)
{
    if (!obj || obj->type != PK_CALL || !obj->u.call.state)
        return NULL;
    const pk_node *s = obj->u.call.state;
    if (pk_as_dict(s))
        return pk_as_dict(s);
    /* slots dataclass: (None, {slot: value}) */
    if (s->type == PK_TUPLE && pk_len(s) == 2 && pk_as_dict(pk_item(s, 1)))
        return pk_as_dict(pk_item(s, 1));
    return NULL;
}

/* torch.Size((d0, d1, ...)) or a plain tuple/list of ints. */
static int int_vector(interp *in, const pk_node *n, int64_t *out, int *nd, const char *key, const char *field)
{
    if (n && n->type == PK_CALL && n->u.call.kind == PK_REDUCE) {
        const pk_node *g = pk_call_global(n);
        if (!g || strcmp(g->u.global.name, "Size") != 0 || pk_len(n->u.call.args) != 1)
            return dcpi_err(in->err, EINVAL, "%s: %s: %s is not a torch.Size", in->what, key, field);
        n = pk_item(n->u.call.args, 0);
    }
    if (!n || (n->type != PK_TUPLE && n->type != PK_LIST))
        return dcpi_err(in->err, EINVAL, "%s: %s: %s is not a list of integers", in->what, key, field);
    size_t len = pk_len(n);
    if (len > DCPI_MAX_NDIM)
        return dcpi_err(in->err, EINVAL, "%s: %s: %s has %zu dimensions (at most %d)", in->what, key,
                        field, len, DCPI_MAX_NDIM);
    for (size_t i = 0; i < len; i++)
        if (!pk_int(pk_item(n, i), &out[i]))
            return dcpi_err(in->err, EINVAL, "%s: %s: %s holds a non-integer", in->what, key, field);
    *nd = (int)len;
    return 0;
}

/* A key as text: str as is, int in decimal (1.13 may store non-str keys). */
static int key_text(interp *in, const pk_node *k, char buf[PK_KEY_TEXT_MAX], const char **s, size_t *len)
{
    if (pk_key_text(k, buf, s, len))
        return 0;
    return dcpi_err(in->err, EINVAL, "%s: a state-dict key is neither a string nor an integer", in->what);
}

/* "[a, b, c]" into buf, for messages. */
static const char *vec_text(const int64_t *v, int nd, char *buf, size_t sz)
{
    size_t used = (size_t)snprintf(buf, sz, "[");
    for (int d = 0; d < nd && used < sz; d++)
        used += (size_t)snprintf(buf + used, sz - used, "%s%" PRId64, d ? ", " : "", v[d]);
    if (used < sz)
        snprintf(buf + used, sz - used, "]");
    return buf;
}

/* qsort_r over chunk indexes: by offsets, then by index (first wins). */
static int by_offsets(const void *a, const void *b, void *arg)
{
    const dcp_entry *e = ((void **)arg)[0];
    const dcp_chunk *c = ((void **)arg)[1];
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    int r = dcpi_box_cmp(c[x].offsets, c[y].offsets, e->ndim);
    return r ? r : (x > y) - (x < y);
}

/* Room in the per-entry tables for entry idx. */
static int slots_for(interp *in, size_t idx)
{
    if (idx < in->nslots)
        return 0;
    size_t n = in->nslots ? in->nslots : 1024;
    while (n <= idx)
        n *= 2;
    uint32_t *nx = realloc(in->next, n * sizeof *nx);
    if (nx)
        in->next = nx;
    uint32_t **no = nx ? realloc(in->order, n * sizeof *no) : NULL;
    if (!no)
        return dcpi_err(in->err, ENOMEM, "%s: out of memory", in->what);
    in->order = no;
    memset(in->next + in->nslots, 0, (n - in->nslots) * sizeof *in->next);
    memset(in->order + in->nslots, 0, (n - in->nslots) * sizeof *in->order);
    in->nslots = n;
    return 0;
}

/* The chunks from `first` on were just added to entry idx: drop each whose
 * box an earlier chunk has (a replica: rank-local files each list a
 * replicated tensor; keep the first), failing when the sizes differ. */
static int drop_replicas(interp *in, size_t idx, size_t first, const char *key)
{
    dcp_entry *e = &in->ck->entries[idx];
    dcp_chunk *c = in->ck->priv[idx].chunks;
    size_t n = e->nchunks;
    int nd = e->ndim;
    if (n - first == 0 || n < 2)
        return 0;
    if (first == 0) {   /* one list in increasing order (most): no replica */
        size_t i = 1;
        while (i < n && dcpi_box_cmp(c[i - 1].offsets, c[i].offsets, nd) < 0)
            i++;
        if (i == n)
            return 0;
    }
    if (n > UINT32_MAX)
        return dcpi_err(in->err, EOVERFLOW, "%s: %s: too many chunks", in->what, key);
    uint32_t *ord = malloc(n * sizeof *ord);
    unsigned char *drop = calloc(n, 1);
    if (!ord || !drop) {
        free(ord);
        free(drop);
        return dcpi_err(in->err, ENOMEM, "%s: out of memory", in->what);
    }
    for (size_t i = 0; i < n; i++)
        ord[i] = (uint32_t)i;
    void *arg[2] = {e, c};
    qsort_r(ord, n, sizeof *ord, by_offsets, arg);
    int rc = 0;
    for (size_t i = 1; i < n && rc == 0; i++) {
        const dcp_chunk *prev = &c[ord[i - 1]], *cur = &c[ord[i]];
        if (dcpi_box_cmp(prev->offsets, cur->offsets, nd))
            continue;
        if (nd && memcmp(prev->sizes, cur->sizes, (size_t)nd * sizeof *cur->sizes)) {
            char a[256], b[256], d[256];
            rc = dcpi_err(in->err, EINVAL, "%s: %s: two chunks at offsets %s with different sizes %s and %s",
                          in->what, key, vec_text(cur->offsets, nd, a, sizeof a),
                          vec_text(prev->sizes, nd, b, sizeof b), vec_text(cur->sizes, nd, d, sizeof d));
        }
        drop[ord[i]] = 1;
        ord[i] = ord[i - 1];   /* the kept one, for the next comparison */
        if (in->merging)   /* a box several ranks saved: their values may differ */
            in->ck->priv[idx].replicated = 1;
    }
    if (rc == 0) {
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            if (!drop[i])
                c[k++] = c[i];
        e->nchunks = k;
    }
    free(ord);
    free(drop);
    return rc;
}

/* The chunk of tensor entry idx at offsets off (nd values), or SIZE_MAX. */
static size_t chunk_at(interp *in, size_t idx, const int64_t *off, int nd, dcp_error *err, int *failed)
{
    const dcp_entry *e = &in->ck->entries[idx];
    const dcp_chunk *c = in->ck->priv[idx].chunks;
    size_t n = e->nchunks;
    if (nd != e->ndim || !n)
        return SIZE_MAX;
    if (slots_for(in, idx) < 0) {
        *failed = 1;
        return SIZE_MAX;
    }
    size_t h = in->next[idx];
    if (h < n && !dcpi_box_cmp(c[h].offsets, off, nd)) {
        in->next[idx] = (uint32_t)(h + 1);
        return h;
    }
    if (n <= 8) {
        for (size_t i = 0; i < n; i++)
            if (!dcpi_box_cmp(c[i].offsets, off, nd)) {
                in->next[idx] = (uint32_t)(i + 1);
                return i;
            }
        return SIZE_MAX;
    }
    uint32_t *ord = in->order[idx];
    if (!ord) {
        if (!(ord = malloc(n * sizeof *ord))) {
            *failed = 1;
            dcpi_err(err, ENOMEM, "%s: out of memory", in->what);
            return SIZE_MAX;
        }
        for (size_t i = 0; i < n; i++)
            ord[i] = (uint32_t)i;
        void *arg[2] = {(void *)e, (void *)c};
        qsort_r(ord, n, sizeof *ord, by_offsets, arg);
        in->order[idx] = ord;
    }
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (dcpi_box_cmp(c[ord[mid]].offsets, off, nd) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < n && !dcpi_box_cmp(c[ord[lo]].offsets, off, nd)) {
        in->next[idx] = ord[lo] + 1;
        return ord[lo];
    }
    return SIZE_MAX;
}

static int dtype_of(interp *in, const pk_node *props, const char *key, dcp_dtype *dt)
{
    const pk_node *d = NULL;
    if (props && props->type == PK_CALL) {
        const char *mod = class_module(props);
        if (mod && strstr(mod, "sharded_tensor"))
            in->saw_old_properties = 1;
        else if (mod)
            in->saw_new_properties = 1;
        const pk_node *s = props->u.call.state;
        if (s && (s->type == PK_TUPLE || s->type == PK_LIST) && pk_len(s) >= 1)
            d = pk_item(s, 0);   /* __getstate__: (dtype, layout, requires_grad, memory_format, pin_memory) */
        else if (s && s->type == PK_DICT)
            d = pk_dict_get(s, "dtype");
    }
    if (!d || d->type != PK_GLOBAL || strcmp(d->u.global.module, "torch") != 0)
        return dcpi_err(in->err, EINVAL, "%s: %s: no dtype in TensorProperties", in->what, key);
    *dt = dcp_dtype_from_name(d->u.global.name);
    if (*dt == DCP_DTYPE_INVALID)
        return dcpi_err(in->err, EINVAL, "%s: %s: unsupported dtype torch.%s", in->what, key,
                        d->u.global.name);
    return 0;
}

static int add_tensor(interp *in, const char *key, size_t klen, const pk_node *md)
{
    const pk_node *st = state_of(md);
    int64_t shape[DCPI_MAX_NDIM], off[DCPI_MAX_NDIM], sz[DCPI_MAX_NDIM];
    int nd, cnd, snd;
    dcp_dtype dt;
    size_t idx;
    if (!st)
        return dcpi_err(in->err, EINVAL, "%s: %s: TensorStorageMetadata has no fields", in->what, key);
    if (dtype_of(in, pk_dict_get(st, "properties"), key, &dt) < 0 ||
        int_vector(in, pk_dict_get(st, "size"), shape, &nd, key, "size") < 0)
        return -1;
    if (dcpi_model_entry(in->ck, key, klen, DCP_KIND_TENSOR, &idx, in->err) < 0)
        return -1;
    dcp_entry *e = &in->ck->entries[idx];
    if (in->ck->spill && e->nchunks) {   /* a key listed twice: only the in-memory parse merges */
        dcpi_spill_refuse(in->ck);
        return dcpi_err(in->err, ENOTSUP, "%s: %s: listed twice (parsing it in memory)", in->what, key);
    }
    if (e->shape && e->nchunks) {   /* merging rank-local files: must agree */
        if (e->dtype != dt || e->ndim != nd || memcmp(e->shape, shape, (size_t)nd * sizeof *shape))
            return dcpi_err(in->err, EINVAL, "%s: %s: dtype or shape differs between metadata files",
                            in->what, key);
    } else if (dcpi_model_set_tensor(in->ck, idx, dt, nd, shape, in->err) < 0) {
        return -1;
    }
    size_t first = e->nchunks;
    dcpi_arena_mark boxes = dcpi_arena_here(&in->ck->arena);   /* (spilled, they go) */
    const pk_node *chunks = pk_dict_get(st, "chunks");
    if (chunks && chunks->type == PK_CALL)
        chunks = pk_call_items(chunks);   /* a list subclass */
    if (!chunks || (chunks->type != PK_LIST && chunks->type != PK_TUPLE))
        return dcpi_err(in->err, EINVAL, "%s: %s: chunks is not a list", in->what, key);
    if (dcpi_model_reserve_chunks(in->ck, idx, pk_len(chunks), in->err) < 0)
        return -1;
    for (size_t i = 0; i < pk_len(chunks); i++) {
        const pk_node *cst = state_of(pk_item(chunks, i));
        if (!cst || int_vector(in, pk_dict_get(cst, "offsets"), off, &cnd, key, "chunk offsets") < 0 ||
            int_vector(in, pk_dict_get(cst, "sizes"), sz, &snd, key, "chunk sizes") < 0)
            return cst ? -1 : dcpi_err(in->err, EINVAL, "%s: %s: chunk %zu has no fields", in->what, key, i);
        if (cnd != nd || snd != nd)
            return dcpi_err(in->err, EINVAL, "%s: %s: chunk %zu has %d dimensions, the tensor %d",
                            in->what, key, i, cnd, nd);
        for (int d = 0; d < nd; d++) {
            uint64_t end;
            if (off[d] < 0 || sz[d] < 0 || !dcpi_add_u64((uint64_t)off[d], (uint64_t)sz[d], &end) ||
                end > (uint64_t)shape[d]) {
                char a[256], b[256], c[256];
                return dcpi_err(in->err, EINVAL,
                                "%s: %s: chunk %zu (offsets %s, sizes %s) lies outside the tensor of shape %s",
                                in->what, key, i, vec_text(off, nd, a, sizeof a), vec_text(sz, nd, b, sizeof b),
                                vec_text(shape, nd, c, sizeof c));
            }
        }
        size_t ci;
        if (dcpi_model_add_chunk(in->ck, idx, off, sz, &ci, in->err) < 0)
            return -1;
        if (ci >= UINT32_MAX)
            return dcpi_err(in->err, EOVERFLOW, "%s: %s: too many chunks", in->what, key);
    }
    if (!in->ck->spill) {   /* (a spilled model matches storage items to chunks by their offsets) */
        if (slots_for(in, idx) < 0)
            return -1;
        free(in->order[idx]);   /* (made for the chunks before these) */
        in->order[idx] = NULL;
    }
    if (drop_replicas(in, idx, first, key) < 0)
        return -1;
    if (in->ck->spill) {   /* a model too large to hold: the chunks wait on disk */
        if (dcpi_spill_entry(in->ck, idx, in->err) < 0)
            return -1;
        dcpi_arena_rewind(&in->ck->arena, &boxes);
    }
    return 0;
}

static int add_bytes(interp *in, const char *key, size_t klen)
{
    size_t idx;
    return dcpi_model_entry(in->ck, key, klen, DCP_KIND_BYTES, &idx, in->err);
}

static int transforms_of(interp *in, const pk_node *list, const char *key, uint32_t *out)
{
    *out = 0;
    if (!list || list->type == PK_NONE)
        return 0;
    if (list->type != PK_LIST && list->type != PK_TUPLE)
        return dcpi_err(in->err, EINVAL, "%s: %s: transform_descriptors is not a list", in->what, key);
    for (size_t i = 0; i < pk_len(list); i++) {
        const char *s;
        size_t n;
        if (!pk_str(pk_item(list, i), &s, &n))
            return dcpi_err(in->err, EINVAL, "%s: %s: a transform descriptor is not a string", in->what, key);
        if (n == 13 && !memcmp(s, "stream.zstd/1", 13))
            *out |= DCP_TRANSFORM_ZSTD;
        else
            return dcpi_err(in->err, ENOTSUP, "%s: %s: unsupported transform '%.*s' (only stream.zstd/1)",
                            in->what, key, (int)(n > 200 ? 200 : n), s);
    }
    return 0;
}

/* A _StorageInfo's offset or length: an int from 0 to 2^63-1, else an error
 * that says which field and what is wrong with it. */
static int storage_int(interp *in, const pk_node *sst, const char *field, const char *key, int64_t *out)
{
    const pk_node *n = pk_dict_get(sst, field);
    if (!n)
        return dcpi_err(in->err, EINVAL, "%s: %s: _StorageInfo lacks its %s", in->what, key, field);
    if (n->type == PK_BIGINT || (pk_int(n, out) && *out < 0))
        return dcpi_err(in->err, EINVAL, "%s: %s: _StorageInfo's %s is negative or past 2^63", in->what, key,
                        field);
    if (!pk_int(n, out))
        return dcpi_err(in->err, EINVAL, "%s: %s: _StorageInfo's %s is not an int", in->what, key, field);
    return 0;
}

static int add_storage(interp *in, const pk_node *index, const pk_node *info)
{
    const pk_node *ist = state_of(index), *sst = state_of(info);
    if (!ist || !sst)
        return dcpi_err(in->err, EINVAL, "%s: a storage_data entry is not MetadataIndex -> _StorageInfo", in->what);
    char num[PK_KEY_TEXT_MAX];
    const char *key, *rel;
    size_t klen, rlen;
    if (key_text(in, pk_dict_get(ist, "fqn"), num, &key, &klen) < 0)
        return -1;
    int64_t off[DCPI_MAX_NDIM];
    int nd = 0;
    const pk_node *o = pk_dict_get(ist, "offset");
    if (o && o->type != PK_NONE && int_vector(in, o, off, &nd, key, "storage offset") < 0)
        return -1;
    uint64_t v;
    if (!dcpi_strmap_get(&in->ck->keys, key, klen, &v))
        return 0;   /* an entry no key refers to: unused */
    size_t idx = (size_t)v, ci = 0;
    const dcp_entry *e = &in->ck->entries[idx];
    if (e->kind == DCP_KIND_BYTES) {
        if (nd)
            return 0;   /* a box of a bytes item: unused */
    } else if (!in->ck->spill) {
        int failed = 0;
        if ((ci = chunk_at(in, idx, off, nd, in->err, &failed)) == SIZE_MAX)
            return failed ? -1 : 0;   /* a box no chunk has: unused */
    }
    int64_t boff, blen;
    if (!pk_str(pk_dict_get(sst, "relative_path"), &rel, &rlen))
        return dcpi_err(in->err, EINVAL, "%s: %s: _StorageInfo's relative_path is missing or not a str", in->what,
                        key);
    if (storage_int(in, sst, "offset", key, &boff) < 0 || storage_int(in, sst, "length", key, &blen) < 0)
        return -1;
    /* both below 2^63: their sum fits in 64 bits */
    dcp_blob b = {.offset = (uint64_t)boff, .length = (uint64_t)blen};
    if (transforms_of(in, pk_dict_get(sst, "transform_descriptors"), key, &b.transforms) < 0)
        return -1;
    if (dcpi_model_file(in->ck, rel, rlen, &b.file, in->err) < 0) {
        if (dcpi_check_relpath(rel, rlen, in->err) < 0)   /* the usual reason: name file and key */
            return dcpi_err_prefix(in->err, "%s: %s", in->what, key);
        return -1;
    }
    if (e->kind == DCP_KIND_BYTES) {
        dcp_entry *be = &in->ck->entries[idx];
        if (!be->has_blob) {
            be->blob = b;
            be->has_blob = 1;
        } else if (in->merging) {   /* an item several ranks saved: their values may differ */
            in->ck->priv[idx].replicated = 1;
        }
    } else if (in->ck->spill) {
        return dcpi_spill_blob(in->ck, idx, off, nd, &b, in->err);
    } else if (!in->ck->priv[idx].chunks[ci].has_blob) {
        in->ck->priv[idx].chunks[ci].blob = b;
        in->ck->priv[idx].chunks[ci].has_blob = 1;
    }
    return 0;
}

/* pathlib.PosixPath(parts...) or a str, as text. */
static const char *path_text(interp *in, const pk_node *n)
{
    const char *s;
    size_t len;
    if (pk_str(n, &s, &len))
        return dcpi_arena_strndup(&in->ck->arena, s, len);
    if (!n || n->type != PK_CALL || !n->u.call.args)
        return NULL;
    char buf[4096];
    size_t used = 0;
    for (size_t i = 0; i < pk_len(n->u.call.args); i++) {
        if (!pk_str(pk_item(n->u.call.args, i), &s, &len))
            return NULL;
        int sep = used > 0 && buf[used - 1] != '/';
        if (used + sep + len >= sizeof buf)
            return NULL;
        if (sep)
            buf[used++] = '/';
        memcpy(buf + used, s, len);
        used += len;
    }
    return dcpi_arena_strndup(&in->ck->arena, buf, used);
}

static void fill_info(interp *in, const pk_node *root, const pk_node *st)
{
    dcp_info *info = &in->ck->info;
    const char *mod = class_module(root);
    const pk_node *sm = pk_dict_get(st, "storage_meta");
    const pk_node *ver = pk_dict_get(st, "version");
    const pk_node *pd = pk_dict_get(st, "planner_data");
    /* From class paths and fields present, never a guessed version; the release ranges
     * named are those of the releases' own saves in tests/data/torch-releases. */
    char genbuf[160];
    const char *gen, *vs;
    size_t vl;
    if (mod && !strncmp(mod, "torch.distributed._shard.checkpoint", 35)) {
        gen = "torch 1.13 (torch.distributed._shard.checkpoint)";
    } else if (ver && ver->type != PK_NONE) {
        if (pk_str(ver, &vs, &vl))
            snprintf(genbuf, sizeof genbuf, "torch 2.9+ (version %.*s)", (int)(vl > 64 ? 64 : vl), vs);
        else if (ver->type == PK_FLOAT)
            snprintf(genbuf, sizeof genbuf, "torch 2.9+ (version %g)", ver->u.f);
        else
            snprintf(genbuf, sizeof genbuf, "torch 2.9+ (version field)");
        gen = genbuf;
    } else if (sm && sm->type != PK_NONE) {
        gen = "torch 2.4+ (StorageMeta)";
    } else if (in->saw_new_properties) {
        gen = "torch 2.3+";
    } else if (in->saw_old_properties) {
        gen = "torch 2.0-2.2";
    } else {
        gen = "torch 2.0+";   /* no tensor: nothing tells 2.0-2.2 from 2.3 */
    }
    if (mod && !strncmp(mod, "megatron.", 9)) {
        char buf[256];
        snprintf(buf, sizeof buf, "Megatron-Core %s.%s on %s", mod, class_name(root), gen);
        info->generation = dcpi_model_strdup(in->ck, buf);
        info->megatron = 1;
    } else if (mod && strncmp(mod, "torch.", 6)) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s.%s (a Metadata subclass) on %s", mod, class_name(root), gen);
        info->generation = dcpi_model_strdup(in->ck, buf);
    } else {
        info->generation = dcpi_model_strdup(in->ck, gen);
    }
    info->serialization = "torch_save";
    info->has_planner_data = pk_as_dict(pd) != NULL;
    const char *s;
    size_t len;
    double f;
    if (pk_str(ver, &s, &len)) {
        info->version = dcpi_arena_strndup(&in->ck->arena, s, len);
    } else if (ver && ver->type == PK_FLOAT) {
        char buf[64];
        f = ver->u.f;
        snprintf(buf, sizeof buf, "%g", f);
        info->version = dcpi_model_strdup(in->ck, buf);
    }
    const pk_node *sms = state_of(sm);
    if (sms) {
        info->checkpoint_id = path_text(in, pk_dict_get(sms, "checkpoint_id"));
        if (pk_str(pk_dict_get(sms, "save_id"), &s, &len))
            info->save_id = dcpi_arena_strndup(&in->ck->arena, s, len);
    }
}

/* The 1.12-era schema: per-key storage keys instead of chunks and storage_data. */
static bool pre_113(const pk_node *sdm)
{
    for (size_t i = 0; sdm && i < sdm->u.dict.n; i++) {
        const pk_node *md = sdm->u.dict.vals[i];
        const char *cls = class_name(md);
        if ((cls && (!strcmp(cls, "ShardedTensorStorageMetadata") || !strcmp(cls, "ShardStorageMetadata"))) ||
            pk_dict_get(state_of(md), "storage_key"))
            return true;
    }
    return false;
}

static int pre_113_error(interp *in)
{
    return dcpi_err(in->err, ENOTSUP,
                    "%s: the pre-1.13 checkpoint schema (ShardedTensorStorageMetadata, storage keys) is not supported",
                    in->what);
}

/* One state_dict_metadata item: key -> TensorStorageMetadata or
 * BytesStorageMetadata. */
static int sdm_item(interp *in, const pk_node *k, const pk_node *md)
{
    char num[PK_KEY_TEXT_MAX];
    const char *key;
    size_t klen;
    if (key_text(in, k, num, &key, &klen) < 0)
        return -1;
    const char *cls = class_name(md);
    if (cls && !strcmp(cls, "TensorStorageMetadata"))
        return add_tensor(in, key, klen, md);
    if (cls && !strcmp(cls, "BytesStorageMetadata"))
        return add_bytes(in, key, klen);
    if (cls && (!strcmp(cls, "ShardedTensorStorageMetadata") || !strcmp(cls, "ShardStorageMetadata")))
        return pre_113_error(in);
    return dcpi_err(in->err, EINVAL, "%s: %.*s: unknown storage metadata class %s", in->what,
                    (int)klen, key, cls ? cls : "(not an object)");
}

/* The stream's batches: kv[2i] -> kv[2i+1] going into the dict stack[base].
 * Taken (1) when that dict is the value of the state_dict_metadata or
 * storage_data field of the top object's state: stack[0] the Metadata
 * object, then its state dict (or a slots state: None, the dict), then the
 * MARK of its fields at floor, then field names and values, the dict's name
 * at base - 1. storage_data only after state_dict_metadata, whose boxes its
 * items locate. */
static int on_items(void *ctx, pk_node *const *stack, size_t floor, size_t base, pk_node *const *kv, size_t n)
{
    interp *in = ctx;
    const char *f;
    size_t fl;
    if (floor < 2 || floor > 3 || base <= floor || (base - floor) % 2 != 1 || stack[0]->type != PK_CALL ||
        stack[floor - 1]->type != PK_DICT || !pk_str(stack[base - 1], &f, &fl))
        return 0;
    if (fl == 19 && !memcmp(f, "state_dict_metadata", 19)) {
        for (size_t i = 0; i < n; i++)   /* the pre-1.13 schema: read whole, at the end */
            if (pk_dict_get(state_of(kv[2 * i + 1]), "storage_key"))
                return 0;
        for (size_t i = 0; i < n; i++)
            if (sdm_item(in, kv[2 * i], kv[2 * i + 1]) < 0)
                return -1;
        in->sdm_seen = 1;
        return 1;
    }
    if (fl == 12 && !memcmp(f, "storage_data", 12) && in->sdm_seen) {
        for (size_t i = 0; i < n; i++)
            if (add_storage(in, kv[2 * i], kv[2 * i + 1]) < 0)
                return -1;
        return 1;
    }
    return 0;
}

static void on_bytes(void *ctx, const void *p, size_t n)
{
    interp *in = ctx;
    in->ck->info.metadata_bytes += n;
    dcpi_identity_update(in->id, p, n);
}

/* Megatron-Core's mcore_data (an attribute its save sets on the Metadata):
 * key -> {"nd_reformulated_orig_global_shape": shape or None}. Kept in
 * ck->reform for megatron_fold.c; what is not that shape of ints is left
 * out (the stored view needs none of it). */
static int take_mcore_data(interp *in, const pk_node *md)
{
    dcp_checkpoint *ck = in->ck;
    ck->reform = NULL;
    ck->nreform = 0;
    if (!md || !md->u.dict.n)
        return 0;
    dcpi_reform *r = dcpi_arena_alloc(&ck->arena, md->u.dict.n * sizeof *r);
    if (!r)
        return dcpi_err(in->err, ENOMEM, "%s: out of memory", in->what);
    size_t n = 0;
    for (size_t i = 0; i < md->u.dict.n; i++) {
        const char *key;
        size_t klen;
        const pk_node *v = pk_dict_get(pk_as_dict(md->u.dict.vals[i]), "nd_reformulated_orig_global_shape");
        dcp_error ignored;
        interp quiet = *in;
        quiet.err = &ignored;
        int64_t shape[DCPI_MAX_NDIM];
        int nd;
        if (!pk_str(md->u.dict.keys[i], &key, &klen) || !v || v->type == PK_NONE ||
            int_vector(&quiet, v, shape, &nd, "mcore_data", "nd_reformulated_orig_global_shape") < 0)
            continue;
        r[n].key = dcpi_arena_strndup(&ck->arena, key, klen);
        r[n].shape = nd ? dcpi_arena_memdup(&ck->arena, shape, (size_t)nd * sizeof *shape) : NULL;
        if (!r[n].key || (nd && !r[n].shape))
            return dcpi_err(in->err, ENOMEM, "%s: out of memory", in->what);
        r[n].keylen = klen;
        r[n].ndim = nd;
        n++;
    }
    ck->reform = r;
    ck->nreform = n;
    return 0;
}

static int interpret(interp *in, const pk_node *root)
{
    const pk_node *st = state_of(root);
    const pk_node *sdm = pk_as_dict(pk_dict_get(st, "state_dict_metadata"));
    const pk_node *sd = pk_as_dict(pk_dict_get(st, "storage_data"));
    /* The pre-1.13 schema has no storage_data: the pass over every entry
     * that recognises it is made only then (or for a class of its own below). */
    if (!sd && pre_113(sdm))
        return pre_113_error(in);
    if (!sdm || !sd) {
        const char *name = class_name(root);
        return dcpi_err(in->err, EINVAL, "%s: a pickle, but not DCP metadata (%s%s%s has no state_dict_metadata/storage_data)",
                        in->what, name ? class_module(root) : "the top object", name ? "." : "", name ? name : "");
    }
    for (size_t i = 0; i < sdm->u.dict.n; i++)   /* what the stream did not take */
        if (sdm_item(in, sdm->u.dict.keys[i], sdm->u.dict.vals[i]) < 0)
            return -1;
    for (size_t i = 0; i < sd->u.dict.n; i++)
        if (add_storage(in, sd->u.dict.keys[i], sd->u.dict.vals[i]) < 0)
            return -1;
    if (take_mcore_data(in, pk_as_dict(pk_dict_get(st, "mcore_data"))) < 0)
        return -1;
    fill_info(in, root, st);
    return 0;
}

/* Read and interpret one metadata file of the folder: streamed, or whole
 * (in->whole, or when the stream refers back to what it freed). */
static int load_file(interp *in, const char *relname)
{
    dcp_checkpoint *ck = in->ck;
    dcp_error *err = in->err;
    char what[4096];
    snprintf(what, sizeof what, "%s/%s", ck->path, relname);
    in->what = what;
    int fd = openat(ck->dirfd, relname, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return dcpi_err(err, errno, "%s: cannot open: %s", what, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return dcpi_err(err, EINVAL, "%s: not a regular file", what);
    }
    if ((uint64_t)sb.st_size > METADATA_MAX_BYTES) {
        close(fd);
        return dcpi_err(err, EFBIG, "%s: %lld bytes is too large for a metadata file", what, (long long)sb.st_size);
    }
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    in->id = in->identity ? dcpi_identity_begin(&sb) : NULL;
    pk_stream src = {.fd = fd, .size = (uint64_t)sb.st_size, .bytes = on_bytes,
                     .items = in->whole ? NULL : on_items, .ctx = in};
    pk_doc *doc;
    const pk_node *root;
    int rc = pk_parse_stream(&src, what, &doc, &root, err);
    close(fd);
    if (rc == 0) {
        rc = interpret(in, root);
        pk_free(doc);
    }
    if (rc == 0 && in->identity)
        dcpi_identity_finish(in->id, ck);
    else
        dcpi_identity_free(in->id);
    in->id = NULL;
    if (getenv("DCP_DEBUG_STREAM"))
        fprintf(stderr, "%s: streamed %zu batches; memo: %zu kept (%zu bytes), %zu released\n", what,
                src.batches, src.memo_kept, src.memo_kept_bytes, src.memo_released);
    in->what = NULL;
    return rc;
}

static void interp_init(interp *in, dcp_checkpoint *ck, dcp_error *err)
{
    memset(in, 0, sizeof *in);
    in->ck = ck;
    in->err = err;
}

static void interp_free(interp *in)
{
    for (size_t i = 0; i < in->nslots; i++)
        free(in->order[i]);
    free(in->order);
    free(in->next);
    in->order = NULL;
    in->next = NULL;
    in->nslots = 0;
}

/* DCP_WHOLE_PARSE=1 builds the whole pickle tree first (for comparisons). */
static int whole_parse(void)
{
    const char *v = getenv("DCP_WHOLE_PARSE");
    return v && *v && strcmp(v, "0");
}

/* A stream that refers back to a freed batch: forget what it built and
 * parse whole. */
static int again_whole(interp *in, int rc)
{
    if (rc == 0 || in->whole || in->err->code != PK_ERR_RELEASED)
        return 0;
    if (in->ck->spill) {   /* a spilled parse fails: dcp_open parses again in memory */
        dcpi_spill_refuse(in->ck);
        return 0;
    }
    if (getenv("DCP_DEBUG_STREAM"))
        fprintf(stderr, "parsing whole: %s\n", in->err->msg);
    if (dcpi_model_reset(in->ck, in->err) < 0)
        return 0;
    interp_free(in);
    in->whole = 1;
    in->sdm_seen = in->saw_new_properties = in->saw_old_properties = 0;
    return 1;
}

int dcpi_load_metadata(dcp_checkpoint *ck, const char *relname, dcp_error *err)
{
    interp in;
    interp_init(&in, ck, err);
    in.identity = !strcmp(relname, ".metadata");
    in.whole = whole_parse();
    int rc = load_file(&in, relname);
    if (again_whole(&in, rc))
        rc = load_file(&in, relname);
    interp_free(&in);
    if (rc == 0 && ck->spill)
        rc = dcpi_spill_finish(ck, err);
    if (rc == 0)
        ck->info.layout = "global .metadata";
    return rc;
}

typedef struct rank_file {
    unsigned long rank;
    char name[64];
} rank_file;

static int cmp_rank(const void *a, const void *b)
{
    const rank_file *x = a, *y = b;
    if (x->rank != y->rank)
        return (x->rank > y->rank) - (x->rank < y->rank);
    return strcmp(x->name, y->name);
}

/* "__R.metadata" with R decimal: the rank, or -1. */
static long rank_of(const char *name)
{
    if (strncmp(name, "__", 2) || name[2] < '0' || name[2] > '9')
        return -1;
    unsigned long r = 0;
    const char *p = name + 2;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (r > 100000000)   /* no job has this many ranks; keeps r in range */
            return -1;
        r = r * 10 + (unsigned long)(*p - '0');
    }
    return strcmp(p, ".metadata") ? -1 : (long)r;
}

/* __R.metadata files (use_collectives=False saves), one per rank, each
 * describing only that rank's items: the union of their chunks, a box listed
 * by several ranks (a replica) kept once, from the lowest rank, its entry
 * marked replicated (dcp_entry_replicated): torch's own load gives each rank
 * its own file's, which may hold other values (dcpi_load_rank_view). */
int dcpi_load_rank_local(dcp_checkpoint *ck, dcp_error *err)
{
    int fd = openat(ck->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return dcpi_err(err, e, "%s: cannot list the folder: %s", ck->path, strerror(e));
    }
    rank_file *files = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        long r = rank_of(de->d_name);
        if (r < 0 || strlen(de->d_name) >= sizeof files->name)
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            rank_file *nf = realloc(files, cap * sizeof *nf);
            if (!nf) {
                free(files);
                closedir(d);
                return dcpi_err(err, ENOMEM, "%s: out of memory", ck->path);
            }
            files = nf;
        }
        files[n].rank = (unsigned long)r;
        strcpy(files[n].name, de->d_name);
        n++;
    }
    closedir(d);
    if (n == 0) {
        free(files);
        return dcpi_err(err, ENOENT, "%s: no .metadata and no __R.metadata files", ck->path);
    }
    qsort(files, n, sizeof *files, cmp_rank);
    interp in;
    interp_init(&in, ck, err);
    in.whole = whole_parse();
    in.merging = 1;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = load_file(&in, files[i].name);
    if (again_whole(&in, rc)) {
        rc = 0;
        for (size_t i = 0; i < n && rc == 0; i++)
            rc = load_file(&in, files[i].name);
    }
    interp_free(&in);
    free(files);
    if (rc == 0)
        ck->info.layout = "rank-local __R.metadata";
    return rc;
}

/* One rank's view (DCP_OPEN_RANK): its __R.metadata alone, as torch's
 * FileSystemReader.read_metadata(rank=R) reads it: the model holds the
 * items that rank saved and names only the shard files it lists. */
int dcpi_load_rank_view(dcp_checkpoint *ck, unsigned rank, dcp_error *err)
{
    char name[64], layout[96];
    snprintf(name, sizeof name, "__%u.metadata", rank);
    struct stat sb;
    if (fstatat(ck->dirfd, name, &sb, 0) < 0) {
        int e = errno;
        if (e == ENOENT)
            return dcpi_err(err, ENOENT, "%s/%s: no such file: rank %u saved no rank-local metadata here "
                            "(only a use_collectives=False save writes an __R.metadata per rank)",
                            ck->path, name, rank);
        return dcpi_err(err, e, "%s/%s: cannot open: %s", ck->path, name, strerror(e));
    }
    interp in;
    interp_init(&in, ck, err);
    in.whole = whole_parse();
    int rc = load_file(&in, name);
    if (again_whole(&in, rc))
        rc = load_file(&in, name);
    interp_free(&in);
    if (rc == 0) {
        snprintf(layout, sizeof layout, "rank-local __R.metadata, rank %u's view", rank);
        if (!(ck->info.layout = dcpi_model_strdup(ck, layout)))
            return dcpi_err(err, ENOMEM, "%s: out of memory", ck->path);
        ck->rank_view = (long)rank;
    }
    return rc;
}
