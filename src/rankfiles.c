/* Per-rank torch.save files of DTensors: torch-checkpointing folders and
 * verl's FSDP checkpoints, read as one global checkpoint.
 *
 * meta-pytorch's torch-checkpointing (torchtitan's successor to DCP) writes,
 * per item and rank, `<item>_<rank>.pt`: torch.save of the item's value as
 * that rank holds it (a state dict of DTensors, a number, ...), and, when an
 * item has a resharder, a `metadata.pkl` of its own classes that this reader
 * does not need. verl's FSDP checkpoint manager writes
 * `<item>_world_size_<W>_rank_<R>.pt` the same way. Nothing global exists:
 * each rank's pickle carries, per DTensor, the global shape, stride and dtype
 * (DTensorSpec.tensor_meta), the placements (Shard(dim), Replicate, ...) and
 * the DeviceMesh with this rank's coordinate on it (_coordinate_on_dim; the
 * mesh's shape from _layout, or from the `mesh` tensor of older torch).
 *
 * From that this loader computes each rank's piece as torch does
 * (compute_local_shape_and_global_offset: per mesh dimension left to right,
 * torch.chunk's sizes, ceil(n/k), the last ones smaller or empty;
 * _StridedShard's split_factor pieces each cut again, so that a rank may hold
 * several runs of indexes of a dimension: one box per combination of runs)
 * and makes each box of the rank's local tensor a chunk whose record is its
 * storage in the zip, located now (strides, storage offset, byte order), so
 * the planner never parses again. The same box from several ranks (Replicate) is kept once;
 * the boxes of a tensor must cover it exactly. A plain tensor is taken from
 * the lowest rank holding it. An item without any tensor is a bytes item:
 * the lowest rank's file, a torch.save blob as DCP stores bytes items. Other
 * non-tensor values inside a dict of tensors are left out. Partial
 * placements (a pending reduction) are refused. FSDP1's sharded state dicts
 * (verl with FSDP1) hold ShardedTensors instead: each local shard names its
 * own offsets and sizes (ShardMetadata), which become the boxes.
 *
 * Nothing is executed: data.pkl is read by pickle.c into a tree of calls and
 * interpreted here; every shape, stride, size and offset is checked.
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
#include "zip.h"

#define RF_PKL_MAX (1ull << 30)   /* data.pkl of one rank file (a state dict: ~1 KiB a DTensor) */
#define RF_MAX_DEPTH 64           /* nesting of dicts in an item */
#define RF_MAX_RANKS (1u << 20)
#define RF_MAX_ITEMS 4096

/* ------------------------------------------------------------ file names */

/* Decimal without leading zeros (but "0"), at most 9 digits: 0, or -1. */
static int dec(const char *s, size_t n, uint32_t *out)
{
    if (n == 0 || n > 9 || (n > 1 && s[0] == '0'))
        return -1;
    uint32_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (uint32_t)(s[i] - '0');
    }
    *out = v;
    return 0;
}

/* Split a rank file's name: the item's length, the rank, and the world
 * size verl writes in the name (0 for torch-checkpointing). 0, or -1 when
 * the name is not one of a rank file. */
static int split_name(const char *name, size_t *item_len, uint32_t *rank, uint32_t *world)
{
    size_t n = strlen(name);
    if (n < 6 || strcmp(name + n - 3, ".pt"))
        return -1;
    n -= 3;
    size_t u = n;
    while (u > 0 && name[u - 1] != '_')
        u--;
    if (u < 2 || dec(name + u, n - u, rank) < 0)
        return -1;
    /* verl: <item>_world_size_<W>_rank_<R>.pt */
    static const char rk[] = "_rank_", ws[] = "_world_size_";
    if (u >= sizeof rk && !memcmp(name + u - (sizeof rk - 1), rk, sizeof rk - 1)) {
        size_t wend = u - (sizeof rk - 1), w = wend;
        while (w > 0 && name[w - 1] != '_')
            w--;
        if (w >= sizeof ws && dec(name + w, wend - w, world) == 0 && *world > 0 &&
            !memcmp(name + w - (sizeof ws - 1), ws, sizeof ws - 1) && w - (sizeof ws - 1) > 0) {
            *item_len = w - (sizeof ws - 1);
            return 0;
        }
    }
    *world = 0;
    *item_len = u - 1;
    return 0;
}

int dcp_is_rank_file(const char *name)
{
    if (!name)
        return 0;
    size_t il;
    uint32_t r, w;
    return split_name(name, &il, &r, &w) == 0;
}

/* ------------------------------------------------------------ the loader */

typedef struct rf_item {
    char *name;              /* the item (the keys' first part) */
    uint32_t world;          /* verl's W, or 0 */
    uint32_t nranks;         /* files found; ranks 0..nranks-1 once checked */
    char **files;            /* by rank (NULL where missing) */
    size_t ntensors;         /* tensor entries made from it */
} rf_item;

typedef struct rf_pend {     /* a chunk's record, set once every chunk is added */
    size_t idx, ci;
    dcp_record rec;
} rf_pend;

typedef struct rf_entry {    /* per entry of the model: where it came from */
    int dtensor;             /* 1 DTensor, 2 plain tensor */
    uint32_t first_file;     /* the scratch file index that set its shape */
    uint32_t last_file;      /* 1 + the scratch file index that named it last */
    size_t item;             /* the item whose files hold it */
    uint64_t covered;        /* elements of its distinct boxes */
} rf_entry;

typedef struct rf {
    dcp_checkpoint *ck;      /* the model being built */
    dcp_checkpoint *rd;      /* a scratch model over the same folder: reads the rank files */
    dcp_error *err;
    rf_item *items;
    size_t nitems;
    rf_pend *pend;
    size_t npend, pend_cap;
    rf_entry *ents;
    size_t ents_cap;
    dcpi_strmap boxes;       /* entry + box -> 1: the distinct boxes */
    int verl;
    uint64_t pkl_bytes;
    /* the file being read */
    const char *file;        /* its name */
    uint32_t rfile;          /* its index in rd */
    dcpi_zip z;
    dcp_blob whole;
    uint64_t flen;
    uint32_t rec_flags;      /* byteorder */
    uint32_t rank;
    size_t cur_item;         /* its item's index */
    uint64_t visits, visit_cap;   /* values walked in it, and the bound: a pickle's memo
                                     may share one dict under many keys */
} rf;

__attribute__((format(printf, 3, 4)))
static int fail(rf *R, const char *key, const char *fmt, ...)
{
    char why[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    if (key)
        return dcpi_err(R->err, EIO, "%s/%s: %s: %s", R->ck->path, R->file, key, why);
    return dcpi_err(R->err, EIO, "%s/%s: %s", R->ck->path, R->file, why);
}

static int oom(rf *R)
{
    return dcpi_err(R->err, ENOMEM, "%s: out of memory", R->ck->path);
}

static void box_text(char *buf, size_t cap, const int64_t *v, int nd)
{
    size_t used = 0;
    buf[0] = 0;
    for (int d = 0; d < nd && used + 24 < cap; d++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%" PRId64, d ? ", " : "", v[d]);
}

static const pk_node *call_state(const pk_node *n)
{
    return n && n->type == PK_CALL ? pk_obj_state(n->u.call.state) : NULL;
}

static int global_is(const pk_node *g, const char *module_prefix, const char *name)
{
    return g && g->type == PK_GLOBAL && !strncmp(g->u.global.module, module_prefix, strlen(module_prefix)) &&
           !strcmp(g->u.global.name, name);
}

/* The _rebuild_from_type_v2 call of a DTensor (maybe inside a Parameter's
 * rebuild), or NULL. */
static const pk_node *dtensor_call(const pk_node *n)
{
    for (int depth = 0; depth < 4 && n; depth++) {
        const pk_node *g = pk_call_global(n);
        if (!g)
            return NULL;
        if (pk_is_global(g, "torch._utils", "_rebuild_parameter") ||
            pk_is_global(g, "torch._utils", "_rebuild_parameter_with_state")) {
            n = pk_item(n->u.call.args, 0);
            continue;
        }
        if (pk_is_global(g, "torch._tensor", "_rebuild_from_type_v2") &&
            global_is(pk_item(n->u.call.args, 1), "torch.distributed", "DTensor"))
            return n;
        return NULL;
    }
    return NULL;
}

/* The _rebuild_from_type_v2 call of a ShardedTensor (FSDP1's sharded state
 * dict: local shards with their offsets), or NULL. */
static const pk_node *sharded_call(const pk_node *n)
{
    const pk_node *g = pk_call_global(n);
    if (g && pk_is_global(g, "torch._tensor", "_rebuild_from_type_v2") &&
        global_is(pk_item(n->u.call.args, 1), "torch.distributed._shard", "ShardedTensor"))
        return n;
    return NULL;
}

/* A tuple/list of ints (torch.Size(...) is a REDUCE of one). */
static int int_vec(const pk_node *t, int64_t *out, int *nd)
{
    if (t && t->type == PK_CALL && pk_is_global(pk_call_global(t), "torch", "Size"))
        t = pk_item(t->u.call.args, 0);
    if (!t || (t->type != PK_TUPLE && t->type != PK_LIST) || pk_len(t) > DCPI_MAX_NDIM)
        return -1;
    for (size_t i = 0; i < pk_len(t); i++)
        if (!pk_int(pk_item(t, i), &out[i]))
            return -1;
    *nd = (int)pk_len(t);
    return 0;
}

/* The mesh's shape and this rank's coordinate on it. 1 when the rank is not
 * part of the mesh (no coordinate), 0, or -1. */
static int mesh_of(rf *R, const char *key, const pk_node *mesh, int64_t *shape, int64_t *coord, int *mnd)
{
    const pk_node *ms = call_state(mesh);
    if (!ms || !global_is(pk_call_global(mesh), "torch.distributed", "DeviceMesh"))
        return fail(R, key, "the DTensor's mesh is not a pickled DeviceMesh");
    int nd = -1;
    const pk_node *layout = call_state(pk_dict_get(ms, "_layout"));
    if (layout) {   /* torch >= 2.9: _MeshLayout(axes=(_FlatLayout(shape, stride), ...)) */
        const pk_node *axes = pk_dict_get(layout, "axes");
        if (!axes || axes->type != PK_TUPLE || pk_len(axes) > DCPI_MAX_NDIM)
            return fail(R, key, "the DeviceMesh's _layout has no axes");
        nd = (int)pk_len(axes);
        for (int i = 0; i < nd; i++) {
            int64_t s[DCPI_MAX_NDIM];
            int sn;
            const pk_node *ax = call_state(pk_item(axes, (size_t)i));
            if (int_vec(pk_dict_get(ax, "shape"), s, &sn) < 0)
                return fail(R, key, "axis %d of the DeviceMesh's _layout has no shape of integers", i);
            uint64_t p = 1;
            for (int j = 0; j < sn; j++)
                if (s[j] <= 0 || !dcpi_mul_u64(p, (uint64_t)s[j], &p) || p > RF_MAX_RANKS)
                    return fail(R, key, "axis %d of the DeviceMesh has a bad size", i);
            shape[i] = (int64_t)p;
        }
    } else {        /* older torch: the mesh tensor of global ranks */
        const pk_node *mt = pk_dict_get(ms, "mesh");
        dcpi_rebuild rb;
        char why[256];
        if (!mt || dcpi_torch_rebuild_parse(mt, &rb, why, sizeof why) < 0)
            return fail(R, key, "the DeviceMesh has neither _layout nor a mesh tensor");
        nd = rb.ndim;
        for (int i = 0; i < nd; i++) {
            if (rb.size[i] <= 0 || rb.size[i] > RF_MAX_RANKS)
                return fail(R, key, "dimension %d of the DeviceMesh has a bad size %" PRId64, i, rb.size[i]);
            shape[i] = rb.size[i];
        }
    }
    if (nd < 1)
        return fail(R, key, "the DeviceMesh has no dimensions");
    int64_t rank;
    if (pk_int(pk_dict_get(ms, "_rank"), &rank) && rank != (int64_t)R->rank)
        return fail(R, key, "the DeviceMesh says rank %" PRId64 ", the file's name rank %u", rank, R->rank);
    const pk_node *c = pk_dict_get(ms, "_coordinate_on_dim");
    if (!c || c->type == PK_NONE)
        return 1;
    int cn;
    if (int_vec(c, coord, &cn) < 0 || cn != nd)
        return fail(R, key, "the DeviceMesh's _coordinate_on_dim is not %d integers", nd);
    for (int i = 0; i < nd; i++)
        if (coord[i] < 0 || coord[i] >= shape[i])
            return fail(R, key, "coordinate %" PRId64 " lies outside mesh dimension %d of size %" PRId64,
                        coord[i], i, shape[i]);
    *mnd = nd;
    return 0;
}

/* torch's Shard.local_shard_size_and_offset: torch.chunk's split of cur
 * elements into n, piece c. */
static void shard_piece(int64_t cur, int64_t n, int64_t c, int64_t *size, int64_t *off)
{
    int64_t full = cur / n + (cur % n != 0);   /* no overflow: cur >= 0, n >= 1 */
    /* full * c < cur + n: fits, cur < 2^59 (checked), n <= 2^20 */
    int64_t start = full * c, end = start + full;
    if (end > cur)
        end = cur;
    *size = end > start ? end - start : 0;
    *off = start < cur ? start : cur;
}

/* Make entry key (created with the DTensor's global shape and dtype, or
 * checked against them) and its index. */
static int tensor_entry(rf *R, const char *key, size_t klen, int kind, dcp_dtype dt, int nd,
                        const int64_t *shape, size_t *idx)
{
    dcp_checkpoint *ck = R->ck;
    if (dcpi_model_entry(ck, key, klen, DCP_KIND_TENSOR, idx, R->err) < 0)
        return dcpi_err_prefix(R->err, "%s/%s", ck->path, R->file);
    if (*idx >= R->ents_cap) {
        size_t ncap = R->ents_cap ? R->ents_cap * 2 : 64;
        while (ncap <= *idx)
            ncap *= 2;
        rf_entry *ne = realloc(R->ents, ncap * sizeof *ne);
        if (!ne)
            return oom(R);
        memset(ne + R->ents_cap, 0, (ncap - R->ents_cap) * sizeof *ne);
        R->ents = ne;
        R->ents_cap = ncap;
    }
    rf_entry *re = &R->ents[*idx];
    if (!re->dtensor) {
        if (dcpi_model_set_tensor(ck, *idx, dt, nd, shape, R->err) < 0)
            return dcpi_err_prefix(R->err, "%s/%s", ck->path, R->file);
        re->dtensor = kind;
        re->first_file = R->rfile;
        re->last_file = R->rfile + 1;
        re->item = R->cur_item;
        return 0;
    }
    const dcp_entry *e = &ck->entries[*idx];
    const char *other = R->rd->files[re->first_file];
    if (re->item != R->cur_item)
        return fail(R, key, "also a key of item %s (%s): item names and keys collide", R->items[re->item].name,
                    other);
    if (re->last_file == R->rfile + 1)
        return fail(R, key, "the key appears twice in the file");
    re->last_file = R->rfile + 1;
    if (re->dtensor != kind)
        return fail(R, key, "a %s here, a %s in %s", kind == 1 ? "DTensor" : "plain tensor",
                    kind == 1 ? "plain tensor" : "DTensor", other);
    if (kind == 1 && (e->ndim != nd || memcmp(e->shape, shape, (size_t)nd * sizeof *shape))) {
        char a[512], b[512];
        box_text(a, sizeof a, shape, nd);
        box_text(b, sizeof b, e->shape, e->ndim);
        return fail(R, key, "global shape [%s] differs from [%s] in %s", a, b, other);
    }
    if (kind == 1 && e->dtype != dt)
        return fail(R, key, "dtype %s differs from %s in %s", dcp_dtype_name(dt), dcp_dtype_name(e->dtype), other);
    return 0;
}

/* The local tensor rb of entry idx: its shape (lsize, what the placements
 * give this rank), dtype, storage record and view checked; the record's data
 * start and length. */
static int local_record(rf *R, const char *key, size_t idx, const dcpi_rebuild *rb, const int64_t *lsize,
                        uint64_t *dstart, uint64_t *dlen)
{
    dcp_checkpoint *ck = R->ck;
    int nd = ck->entries[idx].ndim;
    char why[512];
    if (rb->ndim != nd || memcmp(rb->size, lsize, (size_t)nd * sizeof *lsize)) {
        char a[512], b[512];
        box_text(a, sizeof a, rb->size, rb->ndim);
        box_text(b, sizeof b, lsize, nd);
        return fail(R, key, "the local tensor's shape [%s] is not the [%s] its placements give this rank", a, b);
    }
    if (dcp_dtype_size(rb->dtype) != dcp_dtype_size(ck->entries[idx].dtype))
        return fail(R, key, "the local tensor's dtype %s differs from the DTensor's %s", dcp_dtype_name(rb->dtype),
                    dcp_dtype_name(ck->entries[idx].dtype));
    char rname[128];
    snprintf(rname, sizeof rname, "data/%.*s", (int)rb->storage_key_len, rb->storage_key);
    const dcpi_zip_entry *de = dcpi_zip_find(&R->z, rname);
    if (!de)
        return fail(R, key, "storage record %s is missing from the archive", rname);
    if (de->size != rb->storage_bytes)
        return fail(R, key, "storage record %s holds %" PRIu64 " bytes, data.pkl says %" PRIu64, rname, de->size,
                    rb->storage_bytes);
    if (dcpi_torch_rebuild_check_view(rb, why, sizeof why) < 0)
        return fail(R, key, "%s", why);
    *dlen = de->size;
    return dcpi_zip_data(R->rd, &R->whole, key, de, R->flen, dstart, R->err);
}

/* A chunk of entry idx: the box (off, size) of the local tensor rb whose
 * element 0 is storage element soff, unless the same box is there already. */
static int add_box(rf *R, size_t idx, const dcpi_rebuild *rb, uint64_t dstart, uint64_t dlen, const int64_t *off,
                   const int64_t *size, int64_t soff)
{
    dcp_checkpoint *ck = R->ck;
    int nd = ck->entries[idx].ndim;
    /* An empty box (torch.chunk's last pieces) holds nothing: no chunk, but
     * for an empty tensor, which keeps its first. */
    uint64_t vol = 0, numel = dcp_entry_numel(&ck->entries[idx]);
    dcpi_shape_numel(nd, size, &vol);   /* <= the entry's element count, checked by the model */
    if (vol == 0 && (numel || ck->entries[idx].nchunks))
        return 0;
    /* Replicate: the same box from several ranks is kept once. */
    size_t bl = sizeof idx + 2 * (size_t)nd * sizeof(int64_t);
    char *bk = dcpi_arena_alloc(&ck->arena, bl);
    if (!bk)
        return oom(R);
    memcpy(bk, &idx, sizeof idx);
    memcpy(bk + sizeof idx, off, (size_t)nd * sizeof *off);
    memcpy(bk + sizeof idx + (size_t)nd * sizeof *off, size, (size_t)nd * sizeof *size);
    uint64_t seen;
    if (dcpi_strmap_get(&R->boxes, bk, bl, &seen))
        return 0;
    if (dcpi_strmap_put(&R->boxes, bk, bl, 1) < 0)
        return oom(R);
    if (!dcpi_add_u64(R->ents[idx].covered, vol, &R->ents[idx].covered))
        R->ents[idx].covered = UINT64_MAX;

    uint32_t file;
    size_t ci;
    if (dcpi_model_file(ck, R->file, strlen(R->file), &file, R->err) < 0 ||
        dcpi_model_add_chunk(ck, idx, off, size, &ci, R->err) < 0)
        return -1;
    dcp_chunk *c = &ck->priv[idx].chunks[ci];
    c->blob = (dcp_blob){.file = file, .offset = dstart, .length = dlen};
    c->has_blob = 1;
    int64_t *st = dcpi_arena_memdup(&ck->arena, rb->stride, (size_t)(nd ? nd : 1) * sizeof *rb->stride);
    if (!st)
        return oom(R);
    if (R->npend == R->pend_cap) {
        size_t ncap = R->pend_cap ? R->pend_cap * 2 : 64;
        rf_pend *np = realloc(R->pend, ncap * sizeof *np);
        if (!np)
            return oom(R);
        R->pend = np;
        R->pend_cap = ncap;
    }
    R->pend[R->npend++] = (rf_pend){
        .idx = idx, .ci = ci,
        .rec = {.data_offset = dstart, .data_length = dlen, .storage_offset = soff,
                .stride = st, .dtype = rb->dtype, .flags = R->rec_flags | rb->flags}};
    return 0;
}

/* Which global indexes of one tensor dimension a rank holds, in the order of
 * its local tensor: runs of consecutive indexes. Shard keeps one run;
 * _StridedShard (FSDP2 over tensor parallel) makes up to split_factor. */
#define RF_MAX_RUNS 64
#define RF_MAX_BOXES 4096          /* chunks of one rank's DTensor */
typedef struct rf_runs {
    int n;
    int64_t start[RF_MAX_RUNS], len[RF_MAX_RUNS];
} rf_runs;

static int64_t runs_total(const rf_runs *r)
{
    int64_t t = 0;
    for (int k = 0; k < r->n; k++)
        t += r->len[k];   /* <= the dimension's size */
    return t;
}

/* Append local positions [a, b) of r to out, joining runs that continue. */
static int runs_select(const rf_runs *r, int64_t a, int64_t b, rf_runs *out)
{
    int64_t p = 0;
    for (int k = 0; k < r->n && p < b; p += r->len[k], k++) {
        int64_t lo = a > p ? a : p, hi = b < p + r->len[k] ? b : p + r->len[k];
        if (lo >= hi)
            continue;
        int64_t s = r->start[k] + (lo - p);
        if (out->n && out->start[out->n - 1] + out->len[out->n - 1] == s) {
            out->len[out->n - 1] += hi - lo;
            continue;
        }
        if (out->n == RF_MAX_RUNS)
            return -1;
        out->start[out->n] = s;
        out->len[out->n++] = hi - lo;
    }
    return 0;
}

/* torch's _StridedShard.local_shard_size_and_offset: the cur positions in
 * split_factor torch.chunk pieces, each cut in n by torch.chunk; piece c of
 * every one, in order. */
static int strided_piece(const rf_runs *r, int64_t sf, int64_t n, int64_t c, rf_runs *out)
{
    int64_t cur = runs_total(r);
    int64_t first = cur / sf + (cur % sf != 0);
    out->n = 0;
    for (int64_t s = 0; s < sf && first * s < cur; s++) {   /* first * s < 2 * cur: no overflow */
        int64_t fs = first * s, fe = fs + first < cur ? fs + first : cur, flen = fe - fs;
        int64_t ps, po;
        shard_piece(flen, n, c, &ps, &po);
        if (ps && runs_select(r, fs + po, fs + po + ps, out) < 0)
            return -1;
    }
    return 0;
}

static int dtensor(rf *R, const char *key, size_t klen, const pk_node *call)
{
    const pk_node *args = call->u.call.args;
    const pk_node *st = pk_obj_state(pk_item(args, 3));
    const pk_node *lt = pk_dict_get(st, "_local_tensor"), *spec = pk_dict_get(st, "_spec");
    const pk_node *ss = call_state(spec);
    if (!lt || !ss)
        return fail(R, key, "a DTensor without _local_tensor and _spec");
    dcpi_rebuild rb;
    char why[512];
    if (dcpi_torch_rebuild_parse(lt, &rb, why, sizeof why) < 0)
        return fail(R, key, "the local tensor: %s", why);

    /* The global shape and dtype: TensorMeta(shape, stride, dtype), else the
     * wrapper's (DTensor, dtype, size, stride, ...). */
    int64_t shape[DCPI_MAX_NDIM];
    int nd;
    const pk_node *dtn;
    const pk_node *tm = pk_dict_get(ss, "tensor_meta");
    if (tm && tm->type == PK_CALL && pk_len(tm->u.call.args) >= 3) {
        if (int_vec(pk_item(tm->u.call.args, 0), shape, &nd) < 0)
            return fail(R, key, "the DTensor's tensor_meta has no shape of integers");
        dtn = pk_item(tm->u.call.args, 2);
    } else {
        const pk_node *wa = pk_item(args, 2);
        if (int_vec(pk_item(wa, 2), shape, &nd) < 0)
            return fail(R, key, "the DTensor has neither tensor_meta nor a size");
        dtn = pk_item(wa, 1);
    }
    dcp_dtype dt = dtn && dtn->type == PK_GLOBAL && !strcmp(dtn->u.global.module, "torch")
                       ? dcp_dtype_from_name(dtn->u.global.name) : DCP_DTYPE_INVALID;
    if (dt == DCP_DTYPE_INVALID)
        return fail(R, key, "the DTensor's dtype is not a torch dtype");
    /* The model bounds the element count, but not a dimension beside an
     * empty one; the pieces' arithmetic needs room. A DTensor with no element
     * (torch.empty(2**62, 0) distributed) has none to place: its pieces are
     * not computed, every rank's is empty, and it is one empty chunk. */
    int empty = 0;
    for (int d = 0; d < nd; d++)
        empty |= shape[d] == 0;
    for (int d = 0; d < nd && !empty; d++)
        if (shape[d] > (INT64_MAX >> 4))
            return fail(R, key, "dimension %d of the global shape (%" PRId64 ") is too large", d, shape[d]);

    int64_t mshape[DCPI_MAX_NDIM], coord[DCPI_MAX_NDIM];
    int mnd = 0;
    int r = mesh_of(R, key, pk_dict_get(ss, "mesh"), mshape, coord, &mnd);
    if (r < 0)
        return -1;
    const pk_node *pl = pk_dict_get(ss, "placements");
    if (!pl || (pl->type != PK_TUPLE && pl->type != PK_LIST))
        return fail(R, key, "the DTensor has no placements");
    if (r == 0 && pk_len(pl) != (size_t)mnd)
        return fail(R, key, "%zu placements for a %d-dimensional mesh", pk_len(pl), mnd);

    size_t idx;
    if (tensor_entry(R, key, klen, 1, dt, nd, shape, &idx) < 0)
        return -1;
    /* The shape is the model's now, each dimension under 2^59 elements
     * unless it is empty. */
    rf_runs *runs = malloc((size_t)(nd ? nd : 1) * sizeof *runs), tmp;
    if (!runs)
        return oom(R);
    for (int d = 0; d < nd; d++) {
        runs[d].n = 1;
        runs[d].start[0] = 0;
        runs[d].len[0] = shape[d];
    }
    int rc = -1;
    /* Per mesh dimension, left to right, as compute_local_shape_and_global_offset. */
    for (size_t i = 0; i < pk_len(pl); i++) {
        const pk_node *p = pk_item(pl, i);
        const pk_node *g = pk_call_global(p);
        const char *pn = g ? g->u.global.name : "(not an object)";
        if (g && !strcmp(pn, "Replicate"))
            continue;
        if (g && strstr(pn, "Partial")) {   /* Partial, _MaskPartial, _NormPartial... */
            fail(R, key, "placement %zu is %s: a pending reduction over the mesh, whose shards are not the tensor's values (reduce it, e.g. full_tensor(), before saving)",
                 i, pn);
            goto out;
        }
        int strided = g && !strcmp(pn, "_StridedShard");
        if (!g || (strcmp(pn, "Shard") && !strided)) {
            fail(R, key, "placement %zu is %s, which this reader does not support (Shard, _StridedShard and Replicate only)",
                 i, pn);
            goto out;
        }
        const pk_node *ps = call_state(p);
        int64_t dim, sf = 1;
        if (!pk_int(pk_dict_get(ps, "dim"), &dim) && !pk_int(pk_item(p->u.call.args, 0), &dim)) {
            fail(R, key, "placement %zu (%s) has no dim", i, pn);
            goto out;
        }
        if (dim < 0 || dim >= nd) {
            fail(R, key, "placement %zu shards dimension %" PRId64 " of a %d-dimensional tensor", i, dim, nd);
            goto out;
        }
        if (strided && ((!pk_int(pk_dict_get(ps, "split_factor"), &sf) && !pk_int(pk_dict_get(ps, "sf"), &sf)) ||
                        sf < 1 || sf > RF_MAX_RANKS)) {
            fail(R, key, "placement %zu (_StridedShard) has no split_factor from 1 to %u", i, RF_MAX_RANKS);
            goto out;
        }
        if (r == 1 || empty)
            continue;
        if (strided) {
            if (strided_piece(&runs[dim], sf, mshape[i], coord[i], &tmp) < 0) {
                fail(R, key, "placement %zu (_StridedShard) leaves more than %d pieces of dimension %" PRId64, i,
                     RF_MAX_RUNS, dim);
                goto out;
            }
        } else {
            int64_t s, o;
            shard_piece(runs_total(&runs[dim]), mshape[i], coord[i], &s, &o);
            tmp.n = 0;
            (void)runs_select(&runs[dim], o, o + s, &tmp);   /* fewer runs than before: fits */
        }
        runs[dim] = tmp;
    }
    if (r == 1) {   /* the rank is not part of the mesh: it holds nothing */
        rc = 0;
        goto out;
    }
    int64_t lsize[DCPI_MAX_NDIM] = {0};
    uint64_t nboxes = 1, lnumel = 1;
    /* An empty DTensor's local tensor must be empty too (of whatever shape:
     * its pieces were not computed); its one box is the whole. */
    if (empty && (rb.ndim != nd || !dcpi_shape_numel(nd, rb.size, &lnumel) || lnumel)) {
        fail(R, key, "the DTensor has no element, its local tensor has");
        goto out;
    }
    for (int d = 0; d < nd; d++) {
        lsize[d] = empty ? rb.size[d] : runs_total(&runs[d]);
        nboxes *= (uint64_t)(runs[d].n ? runs[d].n : 1);
        if (nboxes > RF_MAX_BOXES) {
            fail(R, key, "the placements cut this rank's piece in more than %d boxes", RF_MAX_BOXES);
            goto out;
        }
    }
    uint64_t dstart, dlen;
    if (local_record(R, key, idx, &rb, lsize, &dstart, &dlen) < 0)
        goto out;
    /* One chunk per combination of runs, its storage offset moved to its
     * first element (inside the storage: the whole view was checked). */
    int k[DCPI_MAX_NDIM] = {0};
    int64_t pos[DCPI_MAX_NDIM] = {0};   /* local position of run k[d] */
    for (uint64_t b = 0; b < nboxes; b++) {
        int64_t off[DCPI_MAX_NDIM], size[DCPI_MAX_NDIM], soff = rb.storage_offset;
        for (int d = 0; d < nd; d++) {
            off[d] = runs[d].n ? runs[d].start[k[d]] : 0;
            size[d] = runs[d].n ? runs[d].len[k[d]] : 0;
            soff += pos[d] * rb.stride[d];
        }
        if (add_box(R, idx, &rb, dstart, dlen, off, size, soff) < 0)
            goto out;
        for (int d = nd - 1; d >= 0; d--) {   /* the next combination, last dimension fastest */
            if (runs[d].n && k[d] + 1 < runs[d].n) {
                pos[d] += runs[d].len[k[d]];
                k[d]++;
                break;
            }
            k[d] = 0;
            pos[d] = 0;
        }
    }
    rc = 0;
out:
    free(runs);
    return rc;
}

/* A ShardedTensor: _rebuild_wrapper_subclass's (ShardedTensor, dtype, size,
 * ...) gives the global shape and dtype, the state (__getstate__: local
 * shards, metadata, process group, spec, rrefs) the rank's shards, each
 * Shard(tensor, ShardMetadata(shard_offsets, shard_sizes, placement)). */
static int sharded(rf *R, const char *key, size_t klen, const pk_node *call)
{
    const pk_node *args = call->u.call.args, *wa = pk_item(args, 2);
    int64_t shape[DCPI_MAX_NDIM];
    int nd;
    if (int_vec(pk_item(wa, 2), shape, &nd) < 0)
        return fail(R, key, "the ShardedTensor has no size");
    const pk_node *dtn = pk_item(wa, 1);
    dcp_dtype dt = dtn && dtn->type == PK_GLOBAL && !strcmp(dtn->u.global.module, "torch")
                       ? dcp_dtype_from_name(dtn->u.global.name) : DCP_DTYPE_INVALID;
    if (dt == DCP_DTYPE_INVALID)
        return fail(R, key, "the ShardedTensor's dtype is not a torch dtype");
    const pk_node *st = pk_item(args, 3), *shards = pk_item(st, 0);
    if (!shards || (shards->type != PK_LIST && shards->type != PK_TUPLE))
        return fail(R, key, "the ShardedTensor has no list of local shards");
    size_t idx;
    if (tensor_entry(R, key, klen, 1, dt, nd, shape, &idx) < 0)
        return -1;
    for (size_t i = 0; i < pk_len(shards); i++) {
        const pk_node *ss = call_state(pk_item(shards, i));
        const pk_node *ms = call_state(pk_dict_get(ss, "metadata"));
        int64_t off[DCPI_MAX_NDIM], size[DCPI_MAX_NDIM];
        int on, sn;
        if (!ms || int_vec(pk_dict_get(ms, "shard_offsets"), off, &on) < 0 ||
            int_vec(pk_dict_get(ms, "shard_sizes"), size, &sn) < 0 || on != nd || sn != nd)
            return fail(R, key, "local shard %zu has no ShardMetadata of %d offsets and sizes", i, nd);
        dcpi_rebuild rb;
        char why[512];
        if (dcpi_torch_rebuild_parse(pk_dict_get(ss, "tensor"), &rb, why, sizeof why) < 0)
            return fail(R, key, "local shard %zu: %s", i, why);
        uint64_t dstart, dlen;
        if (local_record(R, key, idx, &rb, size, &dstart, &dlen) < 0 ||
            add_box(R, idx, &rb, dstart, dlen, off, size, rb.storage_offset) < 0)
            return -1;
    }
    return 0;
}

/* A plain tensor: one chunk over the whole, from the lowest rank holding it. */
static int plain_tensor(rf *R, const char *key, size_t klen, const pk_node *n)
{
    dcpi_rebuild rb;
    char why[512];
    if (dcpi_torch_rebuild_parse(n, &rb, why, sizeof why) < 0)
        return fail(R, key, "%s", why);
    size_t idx;
    if (tensor_entry(R, key, klen, 2, rb.dtype, rb.ndim, rb.size, &idx) < 0)
        return -1;
    if (R->ck->entries[idx].nchunks)
        return 0;
    int64_t zero[DCPI_MAX_NDIM] = {0};
    uint64_t dstart, dlen;
    if (local_record(R, key, idx, &rb, rb.size, &dstart, &dlen) < 0)
        return -1;
    return add_box(R, idx, &rb, dstart, dlen, zero, rb.size, rb.storage_offset);
}

static int walk(rf *R, rf_item *it, const pk_node *n, char *key, size_t klen, int depth)
{
    if (depth > RF_MAX_DEPTH)
        return fail(R, key, "values nested too deeply");
    if (++R->visits > R->visit_cap)
        return fail(R, key, "more values than data.pkl has bytes: dicts shared under many keys");
    const pk_node *call = dtensor_call(n);
    if (call) {
        it->ntensors++;
        return dtensor(R, key, klen, call);
    }
    if ((call = sharded_call(n))) {
        it->ntensors++;
        return sharded(R, key, klen, call);
    }
    if (dcpi_torch_is_tensor(n)) {
        it->ntensors++;
        return plain_tensor(R, key, klen, n);
    }
    const pk_node *d = pk_as_dict(n);
    if (!d)
        return 0;   /* not a tensor: left out (an item without tensors is a bytes item) */
    for (size_t i = 0; i < d->u.dict.n; i++) {
        const pk_node *k = d->u.dict.keys[i];
        char part[PK_KEY_TEXT_MAX];
        const char *ks;
        size_t kl;
        if (!pk_key_text(k, part, &ks, &kl))
            continue;   /* a key DCP could not name either */
        if (memchr(ks, 0, kl))
            return fail(R, key, "a dict key holds a NUL byte");
        char *sub = malloc(klen + 1 + kl + 1);
        if (!sub)
            return oom(R);
        memcpy(sub, key, klen);
        sub[klen] = '.';
        memcpy(sub + klen + 1, ks, kl);
        sub[klen + 1 + kl] = 0;
        int rc = walk(R, it, d->u.dict.vals[i], sub, klen + 1 + kl, depth + 1);
        free(sub);
        if (rc < 0)
            return -1;
    }
    return 0;
}

/* Read one rank file's data.pkl and add what it holds. */
static int read_file(rf *R, rf_item *it, uint32_t rank)
{
    dcp_checkpoint *rd = R->rd;
    uint64_t v;
    const char *name = it->files[rank];
    if (!dcpi_strmap_get(&rd->file_index, name, strlen(name), &v))
        return dcpi_err(R->err, EIO, "%s/%s: not among the files", R->ck->path, name);
    R->file = name;
    R->rfile = (uint32_t)v;
    R->rank = rank;
    R->rec_flags = 0;
    if (dcpi_ck_file_size(rd, R->rfile, &R->flen, R->err) < 0)
        return -1;
    R->whole = (dcp_blob){.file = R->rfile, .offset = 0, .length = R->flen};
    if (dcpi_zip_open(rd, &R->whole, "rank file", &R->z, R->err) < 0)
        return -1;
    int rc = -1;
    char *pkl = NULL;
    pk_doc *doc = NULL;
    const pk_node *root;
    const dcpi_zip_entry *pe = dcpi_zip_find(&R->z, "data.pkl"), *bo = dcpi_zip_find(&R->z, "byteorder");
    uint64_t pstart;
    if (!pe) {
        fail(R, NULL, "no data.pkl: not a torch.save file");
        goto out;
    }
    if (pe->size > RF_PKL_MAX || pe->size > R->flen) {
        fail(R, NULL, "data.pkl of %" PRIu64 " bytes is too large", pe->size);
        goto out;
    }
    if (bo) {
        char order[17] = {0};
        uint64_t ostart;
        if (bo->size > 16) {
            fail(R, NULL, "byteorder record of %" PRIu64 " bytes", bo->size);
            goto out;
        }
        if (dcpi_zip_data(rd, &R->whole, "byteorder", bo, R->flen, &ostart, R->err) < 0 ||
            dcpi_blob_read(rd, &R->whole, order, (size_t)bo->size, ostart, "byteorder", R->err) < 0)
            goto out;
        if (!strcmp(order, "big")) {
            R->rec_flags |= DCP_RECORD_BIG_ENDIAN;
        } else if (strcmp(order, "little")) {
            fail(R, NULL, "unknown byteorder '%s'", order);
            goto out;
        }
    }
    if (dcpi_zip_data(rd, &R->whole, "data.pkl", pe, R->flen, &pstart, R->err) < 0)
        goto out;
    if (!(pkl = malloc(pe->size ? (size_t)pe->size : 1))) {
        oom(R);
        goto out;
    }
    char what[4200];
    snprintf(what, sizeof what, "%s/%s: data.pkl", R->ck->path, name);
    if (dcpi_blob_read(rd, &R->whole, pkl, (size_t)pe->size, pstart, "data.pkl", R->err) < 0 ||
        pk_parse(pkl, (size_t)pe->size, what, &doc, &root, R->err) < 0)
        goto out;
    R->pkl_bytes += pe->size;
    R->visits = 0;
    R->visit_cap = 2 * pe->size + 64;   /* a value takes at least one opcode byte */
    char *key = strdup(it->name);
    if (!key) {
        oom(R);
        goto out;
    }
    rc = walk(R, it, root, key, strlen(key), 0);
    free(key);
out:
    pk_free(doc);
    free(pkl);
    dcpi_zip_close(&R->z);
    memset(&R->z, 0, sizeof R->z);
    return rc;
}

static int item_cmp(const void *a, const void *b)
{
    return strcmp(((const rf_item *)a)->name, ((const rf_item *)b)->name);
}

/* The folder's rank files, grouped by item, each item's ranks 0..N-1. */
static int list_items(rf *R)
{
    dcp_checkpoint *ck = R->ck;
    int fd = openat(ck->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd < 0 ? NULL : fdopendir(fd);
    if (!d) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return dcpi_err(R->err, e, "%s: cannot list the folder: %s", ck->path, strerror(e));
    }
    size_t cap = 0;
    int rc = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t il;
        uint32_t rank, world;
        struct stat sb;
        if (split_name(de->d_name, &il, &rank, &world) < 0)
            continue;
        if (fstatat(ck->dirfd, de->d_name, &sb, 0) < 0 || !S_ISREG(sb.st_mode))
            continue;
        if (rank >= RF_MAX_RANKS) {
            rc = dcpi_err(R->err, EINVAL, "%s/%s: rank %u: more than %u ranks", ck->path, de->d_name, rank,
                          RF_MAX_RANKS);
            break;
        }
        if (world)
            R->verl = 1;
        rf_item *it = NULL;
        for (size_t i = 0; i < R->nitems; i++)
            if (strlen(R->items[i].name) == il && !memcmp(R->items[i].name, de->d_name, il) &&
                R->items[i].world == world)
                it = &R->items[i];
        if (!it) {
            if (R->nitems == RF_MAX_ITEMS) {
                rc = dcpi_err(R->err, EINVAL, "%s: more than %d items of rank files", ck->path, RF_MAX_ITEMS);
                break;
            }
            if (R->nitems == cap) {
                size_t ncap = cap ? cap * 2 : 8;
                rf_item *ni = realloc(R->items, ncap * sizeof *ni);
                if (!ni) {
                    rc = oom(R);
                    break;
                }
                R->items = ni;
                cap = ncap;
            }
            it = &R->items[R->nitems++];
            memset(it, 0, sizeof *it);
            it->world = world;
            if (!(it->name = strndup(de->d_name, il))) {
                rc = oom(R);
                break;
            }
        }
        if (rank >= it->nranks) {
            char **nf = realloc(it->files, ((size_t)rank + 1) * sizeof *nf);
            if (!nf) {
                rc = oom(R);
                break;
            }
            memset(nf + it->nranks, 0, ((size_t)rank + 1 - it->nranks) * sizeof *nf);
            it->files = nf;
            it->nranks = rank + 1;
        }
        if (!it->files[rank] && !(it->files[rank] = strdup(de->d_name))) {
            rc = oom(R);
            break;
        }
    }
    closedir(d);
    if (rc < 0)
        return -1;
    if (!R->nitems)
        return dcpi_err(R->err, ENOENT, "%s: not a checkpoint: no rank files", ck->path);
    qsort(R->items, R->nitems, sizeof *R->items, item_cmp);
    for (size_t i = 0; i < R->nitems; i++) {
        rf_item *it = &R->items[i];
        if (!it->files[0])
            return dcpi_err(R->err, ENOENT,
                            "%s: not a checkpoint: %s looks like a rank file, but there is no rank 0 of item %s",
                            ck->path, it->files[it->nranks - 1], it->name);
        for (uint32_t r = 0; r < it->nranks; r++)
            if (!it->files[r])
                return dcpi_err(R->err, ENOENT,
                                "%s: item %s: rank %u's file is missing (ranks up to %u are there): an incomplete save",
                                ck->path, it->name, r, it->nranks - 1);
        if (it->world && it->nranks != it->world)
            return dcpi_err(R->err, ENOENT, "%s: item %s: %u rank files of world size %u: an incomplete save",
                            ck->path, it->name, it->nranks, it->world);
    }
    /* Every rank saves every item. */
    for (size_t i = 1; i < R->nitems; i++)
        if (R->items[i].nranks != R->items[0].nranks)
            return dcpi_err(R->err, ENOENT, "%s: item %s has %u rank files, item %s %u: an incomplete save",
                            ck->path, R->items[0].name, R->items[0].nranks, R->items[i].name,
                            R->items[i].nranks);
    return 0;
}

int dcpi_load_rank_files(dcp_checkpoint *ck, dcp_error *err)
{
    rf R = {.ck = ck, .err = err};
    dcpi_strmap_init(&R.boxes);
    int rc = -1;
    if (list_items(&R) < 0)
        goto out;
    /* A scratch model over the same folder reads the files (their zips and
     * pickles); ck gets only the files its chunks and items use. */
    if (!(R.rd = dcpi_ck_new(ck->path, err)))
        goto out;
    for (size_t i = 0; i < R.nitems; i++)
        for (uint32_t r = 0; r < R.items[i].nranks; r++) {
            uint32_t f;
            if (dcpi_model_file(R.rd, R.items[i].files[r], strlen(R.items[i].files[r]), &f, err) < 0)
                goto out;
        }
    if (dcpi_ck_files_ready(R.rd, err) < 0)
        goto out;
    for (size_t i = 0; i < R.nitems; i++) {
        rf_item *it = &R.items[i];
        R.cur_item = i;
        for (uint32_t r = 0; r < it->nranks; r++)
            if (read_file(&R, it, r) < 0)
                goto out;
        if (!it->ntensors) {   /* no tensors: the lowest rank's file as a bytes item */
            size_t idx;
            uint32_t f;
            uint64_t len;
            R.file = it->files[0];
            uint64_t v;
            if (!dcpi_strmap_get(&R.rd->file_index, R.file, strlen(R.file), &v) ||
                dcpi_ck_file_size(R.rd, (uint32_t)v, &len, err) < 0 ||
                dcpi_model_file(ck, R.file, strlen(R.file), &f, err) < 0 ||
                dcpi_model_entry(ck, it->name, strlen(it->name), DCP_KIND_BYTES, &idx, err) < 0)
                goto out;
            ck->entries[idx].blob = (dcp_blob){.file = f, .offset = 0, .length = len};
            ck->entries[idx].has_blob = 1;
        }
    }
    /* Every DTensor covered exactly by its distinct boxes. */
    for (size_t i = 0; i < ck->nentries && i < R.ents_cap; i++) {
        const dcp_entry *e = &ck->entries[i];
        if (e->kind != DCP_KIND_TENSOR || R.ents[i].dtensor != 1)
            continue;
        uint64_t numel = dcp_entry_numel(e);
        if (R.ents[i].covered != numel) {
            dcpi_err(err, EIO,
                     "%s: %s: the ranks' shards hold %" PRIu64 " of its %" PRIu64
                     " elements (%s): a rank file is missing, or the placements disagree",
                     ck->path, e->key, R.ents[i].covered, numel,
                     R.ents[i].covered < numel ? "some are missing" : "some overlap");
            goto out;
        }
    }
    /* The records, located above, now that every entry's chunks are there. */
    for (size_t i = 0; i < R.npend; i++) {
        struct dcpi_entry_priv *p = &ck->priv[R.pend[i].idx];
        if (!p->records && !(p->records = calloc(ck->entries[R.pend[i].idx].nchunks, sizeof *p->records))) {
            oom(&R);
            goto out;
        }
        p->records[R.pend[i].ci].rec = R.pend[i].rec;
        p->records[R.pend[i].ci].state = 1;
    }
    ck->info.generation = R.verl ? "verl FSDP checkpoint (<item>_world_size_W_rank_R.pt files of DTensors)"
                                 : "torch-checkpointing (<item>_<rank>.pt files of DTensors)";
    ck->info.serialization = "torch_save";
    ck->info.layout = "per-rank torch.save files";
    ck->info.metadata_bytes = R.pkl_bytes;
    rc = 0;
out:
    if (R.rd)
        dcp_close(R.rd);
    for (size_t i = 0; i < R.nitems; i++) {
        for (uint32_t r = 0; r < R.items[i].nranks; r++)
            free(R.items[i].files[r]);
        free(R.items[i].files);
        free(R.items[i].name);
    }
    free(R.items);
    free(R.pend);
    free(R.ents);
    dcpi_strmap_free(&R.boxes);
    return rc;
}
