/* The .metadata interpreter: a DCP Metadata pickle to the checkpoint model.
 *
 * Recognises both module generations (torch.distributed._shard.checkpoint of
 * 1.13 and torch.distributed.checkpoint of 2.x) by the class paths and fields
 * present; any other class with the Metadata fields (Megatron-Core's
 * MCoreMetadata subclass) is read the same way, its extra fields ignored.
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

typedef struct interp {
    dcp_checkpoint *ck;
    const char *what;          /* "<ckpt>/.metadata" for messages */
    dcp_error *err;
    dcpi_strmap boxes;         /* key \0 offsets -> entry<<32 | chunk (tensors), key \0 -> entry (bytes) */
    dcpi_arena scratch;        /* composite keys, freed after the file */
    int saw_new_properties;    /* TensorProperties from torch.distributed.checkpoint.metadata */
    int saw_old_properties;
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
    if (s->type == PK_DICT)
        return s;
    /* slots dataclass: (None, {slot: value}) */
    if (s->type == PK_TUPLE && pk_len(s) == 2 && pk_item(s, 1)->type == PK_DICT)
        return pk_item(s, 1);
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
static int key_text(interp *in, const pk_node *k, char *buf, size_t bufsz, const char **s, size_t *len)
{
    int64_t v;
    if (pk_str(k, s, len))
        return 0;
    if (pk_int(k, &v)) {
        *len = (size_t)snprintf(buf, bufsz, "%" PRId64, v);
        *s = buf;
        return 0;
    }
    return dcpi_err(in->err, EINVAL, "%s: a state-dict key is neither a string nor an integer", in->what);
}

static int composite(interp *in, const char *key, size_t klen, const int64_t *off, int nd,
                     const char **out, size_t *olen)
{
    size_t n = klen + 1 + (size_t)nd * sizeof(int64_t);
    char *c = dcpi_arena_alloc(&in->scratch, n);
    if (!c)
        return dcpi_err(in->err, ENOMEM, "%s: out of memory", in->what);
    memcpy(c, key, klen);
    c[klen] = 0;
    if (nd)
        memcpy(c + klen + 1, off, (size_t)nd * sizeof(int64_t));
    *out = c;
    *olen = n;
    return 0;
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
    if (e->shape && e->nchunks) {   /* merging rank-local files: must agree */
        if (e->dtype != dt || e->ndim != nd || memcmp(e->shape, shape, (size_t)nd * sizeof *shape))
            return dcpi_err(in->err, EINVAL, "%s: %s: dtype or shape differs between metadata files",
                            in->what, key);
    } else if (dcpi_model_set_tensor(in->ck, idx, dt, nd, shape, in->err) < 0) {
        return -1;
    }
    const pk_node *chunks = pk_dict_get(st, "chunks");
    if (!chunks || chunks->type != PK_LIST)
        return dcpi_err(in->err, EINVAL, "%s: %s: chunks is not a list", in->what, key);
    for (size_t i = 0; i < pk_len(chunks); i++) {
        const pk_node *cst = state_of(pk_item(chunks, i));
        if (!cst || int_vector(in, pk_dict_get(cst, "offsets"), off, &cnd, key, "chunk offsets") < 0 ||
            int_vector(in, pk_dict_get(cst, "sizes"), sz, &snd, key, "chunk sizes") < 0)
            return cst ? -1 : dcpi_err(in->err, EINVAL, "%s: %s: chunk %zu has no fields", in->what, key, i);
        if (cnd != nd || snd != nd)
            return dcpi_err(in->err, EINVAL, "%s: %s: chunk %zu has %d dimensions, the tensor %d",
                            in->what, key, i, cnd, nd);
        const char *ck_key;
        size_t ck_len;
        if (composite(in, key, klen, off, nd, &ck_key, &ck_len) < 0)
            return -1;
        /* Identical boxes are replicas (rank-local merge): keep the first. */
        size_t ci = SIZE_MAX;
        for (size_t j = 0; j < e->nchunks; j++)
            if (!memcmp(e->chunks[j].offsets, off, (size_t)nd * sizeof *off) &&
                !memcmp(e->chunks[j].sizes, sz, (size_t)nd * sizeof *sz)) {
                ci = j;
                break;
            }
        if (ci == SIZE_MAX && dcpi_model_add_chunk(in->ck, idx, off, sz, &ci, in->err) < 0)
            return -1;
        if (dcpi_strmap_put(&in->boxes, ck_key, ck_len, ((uint64_t)idx << 32) | ci) < 0)
            return dcpi_err(in->err, ENOMEM, "%s: out of memory", in->what);
    }
    return 0;
}

static int add_bytes(interp *in, const char *key, size_t klen)
{
    size_t idx;
    const char *ck_key = NULL;
    size_t ck_len = 0;
    if (dcpi_model_entry(in->ck, key, klen, DCP_KIND_BYTES, &idx, in->err) < 0 ||
        composite(in, key, klen, NULL, 0, &ck_key, &ck_len) < 0)
        return -1;
    if (dcpi_strmap_put(&in->boxes, ck_key, ck_len, (uint64_t)idx << 32) < 0)
        return dcpi_err(in->err, ENOMEM, "%s: out of memory", in->what);
    return 0;
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

static int add_storage(interp *in, const pk_node *index, const pk_node *info)
{
    const pk_node *ist = state_of(index), *sst = state_of(info);
    if (!ist || !sst)
        return dcpi_err(in->err, EINVAL, "%s: a storage_data entry is not MetadataIndex -> _StorageInfo", in->what);
    char num[32];
    const char *key, *rel;
    size_t klen, rlen;
    if (key_text(in, pk_dict_get(ist, "fqn"), num, sizeof num, &key, &klen) < 0)
        return -1;
    int64_t off[DCPI_MAX_NDIM];
    int nd = 0;
    const pk_node *o = pk_dict_get(ist, "offset");
    if (o && o->type != PK_NONE && int_vector(in, o, off, &nd, key, "storage offset") < 0)
        return -1;
    const char *ck_key;
    size_t ck_len;
    uint64_t v;
    if (composite(in, key, klen, off, nd, &ck_key, &ck_len) < 0)
        return -1;
    if (!dcpi_strmap_get(&in->boxes, ck_key, ck_len, &v))
        return 0;   /* an entry no key refers to: unused */
    int64_t boff, blen;
    if (!pk_str(pk_dict_get(sst, "relative_path"), &rel, &rlen) ||
        !pk_int(pk_dict_get(sst, "offset"), &boff) || !pk_int(pk_dict_get(sst, "length"), &blen))
        return dcpi_err(in->err, EINVAL, "%s: %s: _StorageInfo lacks relative_path, offset or length",
                        in->what, key);
    if (boff < 0 || blen < 0 || (uint64_t)boff > UINT64_MAX - (uint64_t)blen)
        return dcpi_err(in->err, EINVAL, "%s: %s: negative or overflowing storage offset/length", in->what, key);
    dcp_blob b = {.offset = (uint64_t)boff, .length = (uint64_t)blen};
    if (transforms_of(in, pk_dict_get(sst, "transform_descriptors"), key, &b.transforms) < 0)
        return -1;
    if (dcpi_model_file(in->ck, rel, rlen, &b.file, in->err) < 0)
        return dcpi_err_prefix(in->err, "%s", key);
    size_t idx = (size_t)(v >> 32), ci = (size_t)(v & 0xffffffffu);
    dcp_entry *e = &in->ck->entries[idx];
    if (e->kind == DCP_KIND_BYTES) {
        if (!e->has_blob) {
            e->blob = b;
            e->has_blob = 1;
        }
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
    const char *gen;
    if (mod && !strncmp(mod, "torch.distributed._shard.checkpoint", 35))
        gen = "torch 1.13 (torch.distributed._shard.checkpoint)";
    else if (ver && ver->type != PK_NONE)
        gen = "torch 2.8+ (torch.distributed.checkpoint, Metadata.version)";
    else if (sm && sm->type != PK_NONE)
        gen = "torch 2.4+ (torch.distributed.checkpoint, StorageMeta)";
    else if (in->saw_new_properties)
        gen = "torch 2.3+ (torch.distributed.checkpoint)";
    else
        gen = "torch 2.0-2.2 (torch.distributed.checkpoint)";
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
        info->generation = gen;
    }
    info->serialization = "torch_save";
    info->has_planner_data = pd && pd->type == PK_DICT;
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

static int interpret(interp *in, const pk_node *root)
{
    const pk_node *st = state_of(root);
    const pk_node *sdm = pk_dict_get(st, "state_dict_metadata");
    const pk_node *sd = pk_dict_get(st, "storage_data");
    if (!st || !sdm || sdm->type != PK_DICT || !sd || sd->type != PK_DICT) {
        const char *name = class_name(root);
        return dcpi_err(in->err, EINVAL, "%s: a pickle, but not DCP metadata (%s%s%s has no state_dict_metadata/storage_data)",
                        in->what, name ? class_module(root) : "the top object", name ? "." : "", name ? name : "");
    }
    for (size_t i = 0; i < sdm->u.dict.n; i++) {
        char num[32];
        const char *key;
        size_t klen;
        const pk_node *md = sdm->u.dict.vals[i];
        if (key_text(in, sdm->u.dict.keys[i], num, sizeof num, &key, &klen) < 0)
            return -1;
        const char *cls = class_name(md);
        if (cls && !strcmp(cls, "TensorStorageMetadata")) {
            if (add_tensor(in, key, klen, md) < 0)
                return -1;
        } else if (cls && !strcmp(cls, "BytesStorageMetadata")) {
            if (add_bytes(in, key, klen) < 0)
                return -1;
        } else if (cls && (!strcmp(cls, "ShardedTensorStorageMetadata") || pk_dict_get(state_of(md), "storage_key"))) {
            return dcpi_err(in->err, ENOTSUP,
                            "%s: the pre-1.13 checkpoint schema (ShardedTensorStorageMetadata, storage keys) is not supported",
                            in->what);
        } else {
            return dcpi_err(in->err, EINVAL, "%s: %.*s: unknown storage metadata class %s", in->what,
                            (int)klen, key, cls ? cls : "(not an object)");
        }
    }
    for (size_t i = 0; i < sd->u.dict.n; i++)
        if (add_storage(in, sd->u.dict.keys[i], sd->u.dict.vals[i]) < 0)
            return -1;
    fill_info(in, root, st);
    return 0;
}

static int load_file(dcp_checkpoint *ck, const char *relname, dcp_error *err)
{
    char what[4096];
    snprintf(what, sizeof what, "%s/%s", ck->path, relname);
    int fd = openat(ck->dirfd, relname, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
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
    size_t size = (size_t)sb.st_size;
    unsigned char *buf = malloc(size ? size : 1);
    if (!buf) {
        close(fd);
        return dcpi_err(err, ENOMEM, "%s: out of memory for %zu bytes", what, size);
    }
    size_t got = 0;
    while (got < size) {
        ssize_t r = pread(fd, buf + got, size - got, (off_t)got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            int e = r < 0 ? errno : EIO;
            free(buf);
            close(fd);
            return dcpi_err(err, e, "%s: read failed: %s", what, r < 0 ? strerror(e) : "file shrank");
        }
        got += (size_t)r;
    }
    close(fd);
    ck->info.metadata_bytes += size;

    pk_doc *doc;
    const pk_node *root;
    interp in = {.ck = ck, .what = what, .err = err};
    dcpi_strmap_init(&in.boxes);
    dcpi_arena_init(&in.scratch);
    int rc = pk_parse(buf, size, what, &doc, &root, err);
    free(buf);
    if (rc == 0) {
        rc = interpret(&in, root);
        pk_free(doc);
    }
    dcpi_strmap_free(&in.boxes);
    dcpi_arena_free(&in.scratch);
    return rc;
}

int dcpi_load_metadata(dcp_checkpoint *ck, const char *relname, dcp_error *err)
{
    if (load_file(ck, relname, err) < 0)
        return -1;
    ck->info.layout = "global .metadata";
    return 0;
}

static int cmp_rank(const void *a, const void *b)
{
    long ra = *(const long *)a, rb = *(const long *)b;
    return (ra > rb) - (ra < rb);
}

/* __R.metadata files, one per rank, each describing only that rank's items. */
int dcpi_load_rank_local(dcp_checkpoint *ck, dcp_error *err)
{
    int fd = openat(ck->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0)
            close(fd);
        return dcpi_err(err, errno, "%s: cannot list the folder: %s", ck->path, strerror(errno));
    }
    long *ranks = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        char *end;
        if (strncmp(de->d_name, "__", 2) || de->d_name[2] < '0' || de->d_name[2] > '9')
            continue;
        long r = strtol(de->d_name + 2, &end, 10);
        if (strcmp(end, ".metadata") || r < 0)
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            long *nr = realloc(ranks, cap * sizeof *nr);
            if (!nr) {
                free(ranks);
                closedir(d);
                return dcpi_err(err, ENOMEM, "%s: out of memory", ck->path);
            }
            ranks = nr;
        }
        ranks[n++] = r;
    }
    closedir(d);
    qsort(ranks, n, sizeof *ranks, cmp_rank);
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        char name[64];
        snprintf(name, sizeof name, "__%ld.metadata", ranks[i]);
        rc = load_file(ck, name, err);
    }
    free(ranks);
    if (rc == 0 && n == 0)
        rc = dcpi_err(err, ENOENT, "%s: no __R.metadata files", ck->path);
    if (rc == 0)
        ck->info.layout = "rank-local __R.metadata";
    return rc;
}
