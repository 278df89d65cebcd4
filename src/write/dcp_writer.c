/* The DCP writer: shard files and .metadata as torch 2.13's FileSystemWriter
 * writes them (see dcp_write.h). Data is written as chunks arrive, each a
 * standalone torch.save archive appended to its rank's __R_0.distcp; the
 * model (keys, chunk boxes, where each blob went) stays in memory and becomes
 * the protocol-4 .metadata pickle at the end, streamed to .metadata.tmp and
 * renamed, so a reader never sees a half-written checkpoint. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "atomic.h"
#include "dcp_write.h"
#include "internal.h"
#include "keypaths.h"
#include "sized_opts.h"
#include "pickle_write.h"
#include "zip_write.h"

#define PIECE (1u << 20)              /* bytes at a time: stays in L2 between read, CRC and write */
#define MAX_RANKS (1 << 20)
#define META_MOD "torch.distributed.checkpoint.metadata"

typedef struct wchunk {
    const int64_t *offsets, *sizes;   /* arena */
    uint32_t rank;
    uint64_t offset, length;          /* the blob in __rank_0.distcp */
} wchunk;

typedef struct wkey {
    const char *key;                  /* arena */
    dcp_kind kind;
    dcp_dtype dt;
    int ndim;
    const int64_t *shape;
    wchunk *chunks;                   /* bytes items: one, sizes/offsets NULL */
    size_t n, cap;
    const dcp_path_part *path;        /* arena; NULL: (key,) */
    size_t npath;
} wkey;

typedef struct rankfile {
    int fd;                           /* -1 until the rank writes */
    zw_out out;
    char name[32];
    char what[64];
} rankfile;

struct dcp_ckpt_writer {
    char *dir;
    char *checkpoint_id;
    int dirfd;
    unsigned flags;
    dcpi_arena arena;
    wkey *keys;
    size_t nkeys, cap;
    dcpi_strmap index;                /* key -> keys[] index */
    dcpi_strmap seen;                 /* key \0 offsets -> 1: written chunks */
    rankfile *ranks;
    size_t nranks;
    unsigned char *piece;
    uint64_t bytes;
    int created;                      /* dcp_ckpt_create made the folder */
    int finished;
};

/* 1 (err filled) when the folder holds anything or cannot be listed, 0 when empty. */
static int folder_not_empty(int dirfd, const char *dir, dcp_error *err)
{
    int fd = dup(dirfd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        dcpi_err(err, e, "%s: cannot list the checkpoint folder: %s", dir, strerror(e));
        return 1;
    }
    rewinddir(d);
    struct dirent *de;
    const char *found = NULL;
    char name[256];
    while ((de = readdir(d))) {
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
            snprintf(name, sizeof name, "%s", de->d_name);
            found = name;
            break;
        }
    }
    closedir(d);
    if (found)
        dcpi_err(err, ENOTEMPTY, "%s: the folder is not empty (it holds %s): a checkpoint is written only into "
                 "a new or empty folder", dir, found);
    return found != NULL;
}

int dcp_ckpt_create(const char *dir, const dcp_ckpt_options *caller, dcp_ckpt_writer **out, dcp_error *err)
{
    *out = NULL;
    dcp_ckpt_options o = DCP_CKPT_OPTIONS_INIT;
    const dcp_ckpt_options *opts = &o;
    /* At least the first sized layout (0.2), which ends at the field named. */
    if (caller && dcpi_sized_opts(&o, sizeof o, DCPI_OPTS_MIN(dcp_ckpt_options, checkpoint_id), caller,
                                  "dcp_ckpt_create", "DCP_CKPT_OPTIONS_INIT",
                                  err) < 0)
        return -1;
    int existed = 0;
    if (mkdir(dir, 0777) < 0) {
        if (errno != EEXIST)
            return dcpi_err(err, errno, "%s: cannot create the checkpoint folder: %s", dir, strerror(errno));
        existed = 1;
    }
    dcp_ckpt_writer *w = calloc(1, sizeof *w);
    if (!w) {
        if (!existed)
            rmdir(dir);
        return dcpi_err(err, ENOMEM, "%s: out of memory", dir);
    }
    w->dirfd = -1;
    w->created = !existed;
    dcpi_arena_init(&w->arena);
    dcpi_strmap_init(&w->index);
    dcpi_strmap_init(&w->seen);
    w->flags = opts->flags;
    w->dir = strdup(dir);
    w->checkpoint_id = strdup(opts->checkpoint_id ? opts->checkpoint_id : dir);
    w->piece = aligned_alloc(4096, PIECE);
    w->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (!w->dir || !w->checkpoint_id || !w->piece || w->dirfd < 0) {
        int e = w->dirfd < 0 && w->dir && w->piece ? errno : ENOMEM;
        dcpw_ckpt_discard(w, dir);
        if (e == ENOTDIR)   /* DST names a file: say so, and what DST must be */
            return dcpi_err(err, ENOTDIR, "%s: already exists and is not a folder: a checkpoint is written only into "
                            "a new or empty folder", dir);
        return dcpi_err(err, e, "%s: cannot open the checkpoint folder: %s", dir, strerror(e));
    }
    struct stat st;
    if (fstatat(w->dirfd, ".metadata", &st, 0) == 0) {
        dcpw_ckpt_discard(w, dir);
        return dcpi_err(err, EEXIST, "%s: already holds a checkpoint (.metadata exists)", dir);
    }
    /* An existing folder must be empty: never write into someone's files
     * (a rank-local checkpoint, a Hugging Face folder, a save in progress). */
    if (existed && folder_not_empty(w->dirfd, dir, err)) {
        dcpw_ckpt_discard(w, dir);
        return -1;
    }
    *out = w;
    return 0;
}

uint64_t dcp_ckpt_bytes(const dcp_ckpt_writer *w) { return w->bytes; }

static int check_key(dcp_ckpt_writer *w, const char *key, dcp_error *err)
{
    size_t n = strlen(key);
    uint64_t v;
    if (n == 0)
        return dcpi_err(err, EINVAL, "%s: an empty key", w->dir);
    if (dcpi_strmap_get(&w->index, key, n, &v))
        return dcpi_err(err, EEXIST, "%s: %s: key declared twice", w->dir, key);
    return 0;
}

static int new_key(dcp_ckpt_writer *w, const char *key, dcp_kind kind, wkey **out, dcp_error *err)
{
    if (check_key(w, key, err) < 0)
        return -1;
    if (w->nkeys == w->cap) {
        size_t nc = w->cap ? w->cap * 2 : 256;
        wkey *nk = realloc(w->keys, nc * sizeof *nk);
        if (!nk)
            return dcpi_err(err, ENOMEM, "%s: out of memory", w->dir);
        w->keys = nk;
        w->cap = nc;
    }
    wkey *k = &w->keys[w->nkeys];
    memset(k, 0, sizeof *k);
    k->kind = kind;
    k->key = dcpi_arena_strndup(&w->arena, key, strlen(key));
    if (!k->key || dcpi_strmap_put(&w->index, k->key, strlen(k->key), w->nkeys) < 0)
        return dcpi_err(err, ENOMEM, "%s: out of memory", w->dir);
    w->nkeys++;
    *out = k;
    return 0;
}

int dcp_ckpt_add_tensor(dcp_ckpt_writer *w, const char *key, dcp_dtype dt, int ndim, const int64_t *shape,
                          dcp_error *err)
{
    if (!dcp_dtype_name(dt) || ndim < 0 || ndim > DCPI_MAX_NDIM)
        return dcpi_err(err, EINVAL, "%s: %s: bad dtype or number of dimensions", w->dir, key);
    if (pw_tensor_shape_check(w->dir, key, ndim, shape, err) < 0)   /* the rule its chunks' pickles follow */
        return -1;
    wkey *k;
    if (new_key(w, key, DCP_KIND_TENSOR, &k, err) < 0)
        return -1;
    k->dt = dt;
    k->ndim = ndim;
    k->shape = ndim ? dcpi_arena_memdup(&w->arena, shape, (size_t)ndim * sizeof *shape) : NULL;
    if (ndim && !k->shape)
        return dcpi_err(err, ENOMEM, "%s: out of memory", w->dir);
    return 0;
}

static int rank_file(dcp_ckpt_writer *w, int rank, rankfile **out, dcp_error *err)
{
    if (rank < 0 || rank >= MAX_RANKS)
        return dcpi_err(err, EINVAL, "%s: rank %d out of range", w->dir, rank);
    if ((size_t)rank >= w->nranks) {
        size_t nn = (size_t)rank + 1;
        rankfile *nr = realloc(w->ranks, nn * sizeof *nr);
        if (!nr)
            return dcpi_err(err, ENOMEM, "%s: out of memory", w->dir);
        for (size_t i = 0; i < w->nranks; i++)   /* each output names its file by the moved array */
            nr[i].out.what = nr[i].what;
        for (size_t i = w->nranks; i < nn; i++) {
            memset(&nr[i], 0, sizeof nr[i]);
            nr[i].fd = -1;
        }
        w->ranks = nr;
        w->nranks = nn;
    }
    rankfile *r = &w->ranks[rank];
    if (r->fd < 0) {
        snprintf(r->name, sizeof r->name, "__%d_0.distcp", rank);
        snprintf(r->what, sizeof r->what, "%s", r->name);
        int fd = openat(w->dirfd, r->name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0)
            return dcpi_err(err, errno, "%s/%s: cannot create: %s", w->dir, r->name, strerror(errno));
        if (zw_out_init(&r->out, fd, 0, r->what, err) < 0) {
            close(fd);
            unlinkat(w->dirfd, r->name, 0);
            return -1;
        }
        r->fd = fd;
    }
    *out = r;
    return 0;
}

static int add_chunk_record(dcp_ckpt_writer *w, wkey *k, wchunk *c, dcp_error *err)
{
    if (k->n == k->cap) {
        size_t nc = k->cap ? k->cap * 2 : 1;
        wchunk *n = realloc(k->chunks, nc * sizeof *n);
        if (!n)
            return dcpi_err(err, ENOMEM, "%s: out of memory", w->dir);
        k->chunks = n;
        k->cap = nc;
    }
    k->chunks[k->n++] = *c;
    return 0;
}

int dcp_ckpt_add_chunk(dcp_ckpt_writer *w, const char *key, int rank, const int64_t *offsets, const int64_t *sizes,
                         const dcp_source *src, uint64_t tag, int *written, dcp_error *err)
{
    uint64_t idx;
    if (written)
        *written = 0;
    if (!dcpi_strmap_get(&w->index, key, strlen(key), &idx) || w->keys[idx].kind != DCP_KIND_TENSOR)
        return dcpi_err(err, EINVAL, "%s: %s: chunk of an undeclared tensor", w->dir, key);
    wkey *k = &w->keys[idx];
    uint64_t numel = 0;
    for (int d = 0; d < k->ndim; d++) {
        uint64_t end;
        if (offsets[d] < 0 || sizes[d] < 0 || !dcpi_add_u64((uint64_t)offsets[d], (uint64_t)sizes[d], &end) ||
            end > (uint64_t)k->shape[d])
            return dcpi_err(err, EINVAL, "%s: %s: chunk outside the tensor's shape in dimension %d", w->dir, key, d);
    }
    dcpi_shape_numel(k->ndim, sizes, &numel);   /* a box of a shape that fits: fits (0 with a 0 anywhere) */
    /* (key, offsets) identifies a chunk: a second one is a replica. */
    size_t kl = strlen(key), sl = kl + 1 + (size_t)k->ndim * sizeof(int64_t);
    char *sk = dcpi_arena_alloc(&w->arena, sl);
    if (!sk)
        return dcpi_err(err, ENOMEM, "%s: out of memory", w->dir);
    memcpy(sk, key, kl + 1);
    if (k->ndim)
        memcpy(sk + kl + 1, offsets, (size_t)k->ndim * sizeof(int64_t));
    uint64_t dummy;
    if (dcpi_strmap_get(&w->seen, sk, sl, &dummy))
        return 0;
    if (dcpi_strmap_put(&w->seen, sk, sl, 1) < 0)
        return dcpi_err(err, ENOMEM, "%s: out of memory", w->dir);

    rankfile *r;
    if (rank_file(w, rank, &r, err) < 0)
        return -1;
    wchunk c = {.rank = (uint32_t)rank, .offset = r->out.pos};
    c.offsets = k->ndim ? dcpi_arena_memdup(&w->arena, offsets, (size_t)k->ndim * sizeof *offsets) : NULL;
    c.sizes = k->ndim ? dcpi_arena_memdup(&w->arena, sizes, (size_t)k->ndim * sizeof *sizes) : NULL;
    if (k->ndim && (!c.offsets || !c.sizes))
        return dcpi_err(err, ENOMEM, "%s: out of memory", w->dir);

    /* The chunk as torch.save(chunk_tensor, stream) writes it. */
    pw p;
    pw_init(&p, 2, -1, key);
    pw_torch_tensor(&p, k->dt, k->ndim, sizes, "0");
    zw z;
    int rc = pw_finish(&p, err);
    if (rc == 0) {
        zw_begin(&z, &r->out, "archive", err);
        z.no_crc = !!(w->flags & DCP_WRITE_NO_CRC);
        uint64_t nbytes = numel * dcp_dtype_size(k->dt);
        rc = zw_torch_prologue(&z, p.buf, p.len, err);
        if (rc == 0)
            rc = zw_record_begin(&z, "data/0", nbytes, err);
        if (rc == 0 && zw_pump(&r->out, &z, src, tag, nbytes, w->piece, PIECE, &w->bytes, 0, NULL, NULL, err) < 0)
            rc = dcpi_err_prefix(err, "%s: %s", w->dir, key);
        if (rc == 0)
            rc = zw_record_end(&z, err);
        if (rc == 0)
            rc = zw_finish(&z, &c.length, err);
        zw_free(&z);
    }
    pw_free(&p);
    if (rc < 0)
        return -1;
    if (written)
        *written = 1;
    return add_chunk_record(w, k, &c, err);
}

int dcp_ckpt_add_bytes(dcp_ckpt_writer *w, const char *key, int rank, uint64_t len, const dcp_source *src,
                       uint64_t tag, dcp_error *err)
{
    wkey *k;
    rankfile *r;
    if (new_key(w, key, DCP_KIND_BYTES, &k, err) < 0 || rank_file(w, rank, &r, err) < 0)
        return -1;
    wchunk c = {.rank = (uint32_t)rank, .offset = r->out.pos, .length = len};
    if (zw_pump(&r->out, NULL, src, tag, len, w->piece, PIECE, &w->bytes, 0, NULL, NULL, err) < 0)
        return dcpi_err_prefix(err, "%s: %s", w->dir, key);
    return add_chunk_record(w, k, &c, err);
}

int dcp_ckpt_set_path(dcp_ckpt_writer *w, const char *key, const dcp_path_part *parts, size_t n, dcp_error *err)
{
    uint64_t idx;
    size_t kl = strlen(key);
    if (!dcpi_strmap_get(&w->index, key, kl, &idx))
        return dcpi_err(err, EINVAL, "%s: %s: path of an undeclared key", w->dir, key);
    if (n == 0 || n > 4096)
        return dcpi_err(err, EINVAL, "%s: %s: a path of %zu parts", w->dir, key, n);
    if (!dcpw_path_spells(key, kl, parts, n))
        return dcpi_err(err, EINVAL, "%s: %s: the path does not spell the key", w->dir, key);
    dcp_path_part *copy = dcpi_arena_alloc(&w->arena, n * sizeof *copy);
    if (!copy)
        return dcpi_err(err, ENOMEM, "%s: out of memory", w->dir);
    for (size_t i = 0; i < n; i++) {
        copy[i] = parts[i];
        if (parts[i].str && !(copy[i].str = dcpi_arena_strndup(&w->arena, parts[i].str, parts[i].len)))
            return dcpi_err(err, ENOMEM, "%s: out of memory", w->dir);
    }
    w->keys[idx].path = copy;
    w->keys[idx].npath = n;
    return 0;
}

/* ---------------------------------------------------------------- finish */

static int check_coverage(dcp_ckpt_writer *w, dcp_error *err)
{
    for (size_t i = 0; i < w->nkeys; i++) {
        const wkey *k = &w->keys[i];
        if (k->kind != DCP_KIND_TENSOR)
            continue;
        uint64_t numel = 0, sum = 0;
        dcpi_shape_numel(k->ndim, k->shape, &numel);   /* fits: pw_tensor_shape_fits */
        if (k->n == 0)
            return dcpi_err(err, EINVAL, "%s: %s: a tensor without chunks", w->dir, k->key);
        for (size_t c = 0; c < k->n; c++) {
            uint64_t v = 0;
            dcpi_shape_numel(k->ndim, k->chunks[c].sizes, &v);
            sum += v;
        }
        /* Boxes lie inside the shape and are distinct; volumes adding up to
         * numel then means no gaps unless boxes overlap (not checked). */
        if (sum != numel && numel != 0)
            return dcpi_err(err, EINVAL, "%s: %s: chunks hold %" PRIu64 " elements, the tensor has %" PRIu64,
                            w->dir, k->key, sum, numel);
    }
    return 0;
}

static void uuid4(char out[37])
{
    unsigned char b[16];
    size_t got = 0;
    while (got < sizeof b) {
        ssize_t r = getrandom(b + got, sizeof b - got, 0);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    for (size_t i = got; i < sizeof b; i++)   /* no entropy: still a well-formed id */
        b[i] = (unsigned char)(rand() & 0xff);
    b[6] = (unsigned char)((b[6] & 0x0f) | 0x40);
    b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);
    snprintf(out, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
             b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

static void field(pw *p, const char *name) { pw_dict_key(p); pw_cstr(p, name); }

static void write_metadata(dcp_ckpt_writer *w, pw *p)
{
    int have_layout = 0, have_memfmt = 0;
    uint64_t layout_memo = 0, memfmt_memo = 0;
    pw_global(p, META_MOD, "Metadata");
    pw_newobj(p);
    pw_dict_begin(p);

    field(p, "state_dict_metadata");
    pw_dict_begin(p);
    for (size_t i = 0; i < w->nkeys; i++) {
        const wkey *k = &w->keys[i];
        pw_dict_key(p);
        pw_cstr(p, k->key);
        if (k->kind == DCP_KIND_BYTES) {
            pw_global(p, META_MOD, "BytesStorageMetadata");
            pw_newobj(p);
            continue;
        }
        pw_global(p, META_MOD, "TensorStorageMetadata");
        pw_newobj(p);
        pw_dict_begin(p);
        field(p, "properties");
        pw_global(p, META_MOD, "TensorProperties");
        pw_newobj(p);
        pw_tuple_begin(p, 5);
        pw_global(p, "torch", dcp_dtype_name(k->dt));
        if (have_layout) {
            pw_get(p, layout_memo);
        } else {
            pw_global(p, "torch.serialization", "_get_layout");
            pw_tuple_begin(p, 1);
            pw_cstr(p, "torch.strided");
            pw_tuple_end(p, 1);
            pw_reduce(p);
            layout_memo = pw_last_memo(p);
            have_layout = 1;
        }
        pw_bool(p, 0);                               /* requires_grad */
        if (have_memfmt) {
            pw_get(p, memfmt_memo);
        } else {
            pw_global(p, META_MOD, "_MEM_FORMAT_ENCODING");
            pw_tuple_begin(p, 1);
            pw_int(p, 0);                            /* TORCH_CONTIGUOUS_FORMAT */
            pw_tuple_end(p, 1);
            pw_reduce(p);
            memfmt_memo = pw_last_memo(p);
            have_memfmt = 1;
        }
        pw_bool(p, 0);                               /* pin_memory */
        pw_tuple_end(p, 5);
        pw_build(p);
        field(p, "size");
        pw_torch_size(p, k->shape, k->ndim);
        field(p, "chunks");
        pw_list_begin(p);
        for (size_t c = 0; c < k->n; c++) {
            pw_list_elem(p);
            pw_global(p, META_MOD, "ChunkStorageMetadata");
            pw_newobj(p);
            pw_dict_begin(p);
            field(p, "offsets");
            pw_torch_size(p, k->chunks[c].offsets, k->ndim);
            field(p, "sizes");
            pw_torch_size(p, k->chunks[c].sizes, k->ndim);
            pw_dict_end(p);
            pw_build(p);
        }
        pw_list_end(p);
        pw_dict_end(p);
        pw_build(p);
    }
    pw_dict_end(p);

    /* planner_data: each key's path in the nesting it was flattened from;
     * (key,) for a key given without one. */
    field(p, "planner_data");
    pw_dict_begin(p);
    for (size_t i = 0; i < w->nkeys; i++) {
        const wkey *k = &w->keys[i];
        pw_dict_key(p);
        pw_cstr(p, k->key);
        if (!k->npath) {
            pw_tuple_begin(p, 1);
            pw_cstr(p, k->key);
            pw_tuple_end(p, 1);
            continue;
        }
        pw_tuple_begin(p, k->npath);
        for (size_t j = 0; j < k->npath; j++) {
            if (k->path[j].str)
                pw_str_shared(p, k->path[j].str, k->path[j].len);
            else
                pw_int(p, k->path[j].index);
        }
        pw_tuple_end(p, k->npath);
    }
    pw_dict_end(p);

    field(p, "storage_data");
    pw_dict_begin(p);
    for (size_t i = 0; i < w->nkeys; i++) {
        const wkey *k = &w->keys[i];
        for (size_t c = 0; c < k->n; c++) {
            const wchunk *ch = &k->chunks[c];
            pw_dict_key(p);
            pw_global(p, META_MOD, "MetadataIndex");
            pw_newobj(p);
            pw_dict_begin(p);
            field(p, "fqn");
            pw_cstr(p, k->key);
            field(p, "index");
            if (k->kind == DCP_KIND_TENSOR) {
                pw_int(p, (int64_t)c);
                field(p, "offset");
                pw_torch_size(p, ch->offsets, k->ndim);
            } else {
                pw_none(p);
            }
            pw_dict_end(p);
            pw_build(p);
            pw_global(p, "torch.distributed.checkpoint.filesystem", "_StorageInfo");
            pw_newobj(p);
            pw_dict_begin(p);
            field(p, "relative_path");
            pw_cstr(p, w->ranks[ch->rank].name);
            field(p, "offset");
            pw_uint(p, ch->offset);
            field(p, "length");
            pw_uint(p, ch->length);
            pw_dict_end(p);
            pw_build(p);
        }
    }
    pw_dict_end(p);

    field(p, "storage_meta");
    pw_global(p, META_MOD, "StorageMeta");
    pw_newobj(p);
    pw_dict_begin(p);
    field(p, "checkpoint_id");
    pw_global(p, "pathlib", "PosixPath");
    pw_tuple_begin(p, 1);
    pw_cstr(p, w->checkpoint_id);
    pw_tuple_end(p, 1);
    pw_reduce(p);
    field(p, "save_id");
    char id[37];
    uuid4(id);
    pw_cstr(p, id);
    field(p, "load_id");
    pw_none(p);
    field(p, "modules");
    pw_list_begin(p);
    pw_list_end(p);
    pw_dict_end(p);
    pw_build(p);

    field(p, "version");
    pw_cstr(p, "1.0.0");
    pw_dict_end(p);
    pw_build(p);
}

int dcp_ckpt_finish(dcp_ckpt_writer *w, dcp_error *err)
{
    return dcpw_ckpt_finish(w, NULL, err);
}

int dcpw_ckpt_finish(dcp_ckpt_writer *w, volatile sig_atomic_t *cancel, dcp_error *err)
{
    if (w->finished)
        return dcpi_err(err, EINVAL, "%s: finished twice", w->dir);
    if (check_coverage(w, err) < 0)
        return -1;
    int sync = !(w->flags & DCP_WRITE_NO_SYNC);
    for (size_t r = 0; r < w->nranks; r++) {
        rankfile *f = &w->ranks[r];
        if (f->fd < 0)
            continue;
        if (zw_out_flush(&f->out, err) < 0)
            return dcpi_err_prefix(err, "%s", w->dir);
        if (sync && fsync(f->fd) < 0)
            return dcpi_err(err, errno, "%s/%s: fsync: %s", w->dir, f->name, strerror(errno));
    }
    int fd = openat(w->dirfd, ".metadata.tmp", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0)
        return dcpi_err(err, errno, "%s/.metadata.tmp: cannot create: %s", w->dir, strerror(errno));
    char what[4096];
    snprintf(what, sizeof what, "%s/.metadata.tmp", w->dir);
    pw p;
    pw_init(&p, 4, fd, what);
    write_metadata(w, &p);
    int rc = pw_finish(&p, err);
    pw_free(&p);
    if (rc == 0 && sync && fsync(fd) < 0)
        rc = dcpi_err(err, errno, "%s: fsync: %s", what, strerror(errno));
    if (close(fd) < 0 && rc == 0)
        rc = dcpi_err(err, errno, "%s: close: %s", what, strerror(errno));
    /* The last moment to stop: once .metadata is in place the checkpoint is
     * complete, and a signal that came while it was written is honoured. */
    if (rc == 0 && cancel && *cancel)
        rc = dcpi_err(err, ECANCELED, "%s: interrupted", w->dir);
    if (rc == 0 && renameat(w->dirfd, ".metadata.tmp", w->dirfd, ".metadata") < 0)
        rc = dcpi_err(err, errno, "%s/.metadata: rename: %s", w->dir, strerror(errno));
    if (rc == 0 && sync)
        fsync(w->dirfd);   /* best effort: the rename reaches the disk */
    if (rc < 0)
        unlinkat(w->dirfd, ".metadata.tmp", 0);
    else
        w->finished = 1;
    return rc;
}

void dcp_ckpt_free(dcp_ckpt_writer *w)
{
    if (!w)
        return;
    for (size_t r = 0; r < w->nranks; r++) {
        if (w->ranks[r].fd >= 0) {
            zw_out_flush(&w->ranks[r].out, NULL);
            close(w->ranks[r].fd);
        }
        zw_out_free(&w->ranks[r].out);
    }
    free(w->ranks);
    for (size_t i = 0; i < w->nkeys; i++)
        free(w->keys[i].chunks);
    free(w->keys);
    dcpi_strmap_free(&w->index);
    dcpi_strmap_free(&w->seen);
    dcpi_arena_free(&w->arena);
    if (w->dirfd >= 0)
        close(w->dirfd);
    free(w->piece);
    free(w->dir);
    free(w->checkpoint_id);
    free(w);
}

void dcpw_ckpt_discard(dcp_ckpt_writer *w, const char *dir)
{
    if (!w)
        return;
    if (!w->finished) {
        /* Each rank file was created with O_EXCL and its fd is still open. */
        for (size_t r = 0; r < w->nranks; r++)
            if (w->ranks[r].fd >= 0)
                unlinkat(w->dirfd, w->ranks[r].name, 0);
        /* rmdir: a folder someone filled meanwhile stays, with their files. */
        if (w->created)
            rmdir(dir);
    }
    dcp_ckpt_free(w);
}
