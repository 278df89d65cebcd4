/* Synthetic checkpoints for tests and benchmarks: N keys of one shape and
 * dtype, sharded over R ranks, contents a pure function of (seed, key, byte
 * offset) so a test can compute any key's checksum without the writer:
 *
 *   G = 0x9E3779B97F4A7C15, mix(z) = the splitmix64 finaliser
 *   base(k)    = mix(seed + k*G)
 *   word(k, j) = mix(base(k) + (j+1)*G)
 *   byte b of key k's C-order image = (word(k, b/8) >> 8*(b%8)) & 0xff
 *   (bool tensors keep only the lowest bit)
 *
 * All arithmetic modulo 2^64. Data goes through the DCP writer: one
 * sequential stream of large writes per rank file. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "atomic.h"
#include "dcp_write.h"
#include "internal.h"
#include "sized_opts.h"
#include "zip_write.h"
#include "pickle_write.h"

#define G 0x9E3779B97F4A7C15ull

static inline uint64_t mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void dcp_synth_fill(uint64_t seed, uint64_t key, dcp_dtype dt, uint64_t off, void *buf, size_t len)
{
    uint64_t base = mix(seed + key * G);
    unsigned char *p = buf;
    size_t i = 0;
    uint64_t j = off / 8;
    /* Head: up to the next word boundary. */
    if (off % 8) {
        uint64_t w = mix(base + (j + 1) * G);
        for (unsigned b = (unsigned)(off % 8); b < 8 && i < len; b++)
            p[i++] = (unsigned char)(w >> (8 * b));
        j++;
    }
    for (; i + 8 <= len; i += 8, j++) {
        uint64_t w = mix(base + (j + 1) * G);
        memcpy(p + i, &w, 8);   /* little-endian hosts: the byte order of the formula */
    }
    if (i < len) {
        uint64_t w = mix(base + (j + 1) * G);
        for (unsigned b = 0; i < len; b++)
            p[i++] = (unsigned char)(w >> (8 * b));
    }
    if (dt == DCP_BOOL)
        for (size_t k = 0; k < len; k++)
            p[k] &= 1;
}

/* One chunk's bytes: runs of its C-order image that are contiguous in the
 * global image as well. */
typedef struct box {
    uint64_t seed, key;
    dcp_dtype dt;
    int nd;
    const int64_t *shape, *off, *size;
    int split;            /* dimensions [0, split) are stepped; [split, nd) form one run */
    uint64_t run;         /* bytes per run */
    volatile sig_atomic_t *cancel;
} box;

static void box_init(box *b)
{
    size_t esz = dcp_dtype_size(b->dt);
    uint64_t run = esz;
    int d = b->nd - 1;
    for (int i = 0; i < b->nd; i++)
        if (b->size[i] == 0) {   /* no byte (its other sizes may be up to INT64_MAX): nothing to step */
            b->split = 0;
            b->run = 0;
            return;
        }
    for (; d >= 0; d--) {
        run *= (uint64_t)b->size[d];
        if (b->size[d] != b->shape[d])
            break;
    }
    b->split = d < 0 ? 0 : d;
    b->run = run;
}

static int box_fill(void *ctx, uint64_t tag, uint64_t off, void *buf, size_t len, dcp_error *err)
{
    (void)tag;
    box *b = ctx;
    if (b->cancel && *b->cancel)   /* a large key: stopped between its pieces */
        return dcpi_err(err, ECANCELED, "interrupted");
    size_t esz = dcp_dtype_size(b->dt);
    unsigned char *p = buf;
    while (len) {
        uint64_t r = off / b->run, in = off % b->run;
        /* Global element index of the run's first element. */
        uint64_t g = 0, stride = 1;
        for (int d = b->nd - 1; d >= 0; d--) {
            uint64_t idx;
            if (d > b->split) {
                idx = 0;
            } else if (d == b->split) {
                idx = (uint64_t)b->off[d];
            } else {
                idx = (uint64_t)b->off[d] + r % (uint64_t)b->size[d];
                r /= (uint64_t)b->size[d];
            }
            g += idx * stride;
            stride *= (uint64_t)b->shape[d];
        }
        uint64_t n = b->run - in < len ? b->run - in : len;
        dcp_synth_fill(b->seed, b->key, b->dt, g * esz + in, p, (size_t)n);
        p += n;
        off += n;
        len -= (size_t)n;
    }
    return 0;
}

/* torch.chunk of extent n into k parts: part i is [i*c, min(n, (i+1)*c)), c = ceil(n/k).
 * Without overflow for any n >= 0 (a dimension beside a 0 may be huge). */
static void chunk_range(int64_t n, int k, int i, int64_t *start, int64_t *len)
{
    int64_t c = n / k + (n % k != 0);
    int64_t s = c && i <= n / c ? c * i : n;
    *start = s;
    *len = n - s < c ? n - s : c;
}

static int grid_rows(int ranks)
{
    int pr = 1;
    for (int i = 1; (int64_t)i * i <= ranks; i++)
        if (ranks % i == 0)
            pr = i;
    return pr;
}

typedef struct part {
    int rank;
    int64_t off[8], size[8];
} part;

/* The boxes each rank holds of one key (before splitting by chunks_per_key). */
static size_t rank_parts(const dcp_synth_options *o, uint64_t key, part *parts)
{
    size_t n = 0;
    int nd = o->ndim, R = o->ranks;
    dcp_shard sh = o->shard;
    if (nd == 0 || sh == DCP_SHARD_REPLICATED) {
        /* Every rank holds it; the one that writes it varies by key so
         * replicated data spreads over the files (dedup_save_plans). */
        for (int r = 0; r < (nd == 0 && sh != DCP_SHARD_REPLICATED ? 1 : R); r++) {
            part *p = &parts[n++];
            p->rank = (int)((key + (uint64_t)r) % (uint64_t)R);
            memcpy(p->size, o->shape, sizeof p->size);
            memset(p->off, 0, sizeof p->off);
        }
        return n;
    }
    if (sh == DCP_SHARD_BLOCKS && nd < 2)
        sh = DCP_SHARD_ROWS;
    int pr = sh == DCP_SHARD_BLOCKS ? grid_rows(R) : R, pc = sh == DCP_SHARD_BLOCKS ? R / pr : 1;
    int dim = sh == DCP_SHARD_COLS && nd >= 2 ? 1 : 0;
    for (int r = 0; r < R; r++) {
        part p = {.rank = r};
        memcpy(p.size, o->shape, sizeof p.size);
        memset(p.off, 0, sizeof p.off);
        if (sh == DCP_SHARD_BLOCKS) {
            chunk_range(o->shape[0], pr, r / pc, &p.off[0], &p.size[0]);
            chunk_range(o->shape[1], pc, r % pc, &p.off[1], &p.size[1]);
        } else {
            chunk_range(o->shape[dim], R, r, &p.off[dim], &p.size[dim]);
        }
        int empty = 0;
        for (int d = 0; d < nd; d++)
            empty |= p.size[d] == 0;
        if (!empty)
            parts[n++] = p;
    }
    if (n == 0) {   /* an empty tensor still gets one (empty) chunk */
        parts[0] = (part){.rank = (int)(key % (uint64_t)R)};
        memcpy(parts[0].size, o->shape, sizeof parts[0].size);
        n = 1;
    }
    return n;
}

/* The chunks each key is written as (the same for every key): each rank's
 * part cut into chunks_per_key along dimension 0, empty cuts left out (an
 * empty part keeps one); the parts of a replicated or 0-d key are one box,
 * written once. parts: room for o->ranks. */
static uint64_t key_chunks(const dcp_synth_options *o, part *parts)
{
    size_t np = rank_parts(o, 0, parts);
    if (o->ndim == 0)
        return 1;
    if (o->shard == DCP_SHARD_REPLICATED)
        np = 1;
    uint64_t n = 0;
    for (size_t i = 0; i < np; i++) {
        int64_t rows = parts[i].size[0], s, cut;
        chunk_range(rows, o->chunks_per_key, 0, &s, &cut);
        n += cut ? (uint64_t)(rows / cut + (rows % cut != 0)) : 1;   /* ceil(rows / cut) nonempty cuts */
    }
    return n;
}

/* A bytes item: torch.save(i), as PyTorch's planner stores a non-tensor value. */
static int bytes_blob(uint64_t i, zw_out *o, dcp_error *err)
{
    pw p;
    pw_init(&p, 2, -1, "synth");
    pw_uint(&p, i);
    zw z;
    int rc = pw_finish(&p, err);
    if (rc == 0 && zw_out_init(o, -1, 0, "synth bytes item", err) == 0) {
        zw_begin(&z, o, "archive", err);
        rc = zw_torch_prologue(&z, p.buf, p.len, err);
        if (rc == 0)
            rc = zw_finish(&z, NULL, err);
        zw_free(&z);
    } else {
        rc = -1;
    }
    pw_free(&p);
    return rc;
}

static int mem_fill(void *ctx, uint64_t tag, uint64_t off, void *buf, size_t len, dcp_error *err)
{
    (void)tag;
    (void)err;
    memcpy(buf, (const unsigned char *)ctx + off, len);
    return 0;
}

/* The caller asked to stop (its cancel flag, set by a signal handler). */
static int canceled(const dcp_synth_options *o, const char *dir, dcp_error *err)
{
    return o->cancel && *o->cancel ? dcpi_err(err, ECANCELED, "%s: interrupted", dir) : 0;
}

int dcp_synth_checkpoint(const char *dir, const dcp_synth_options *caller, dcp_error *err)
{
    dcp_synth_options so;
    const dcp_synth_options *o = &so;
    /* At least the first sized layout (0.2), which ends at the field named. */
    if (!caller)
        return dcpi_err(err, EINVAL, "%s: dcp_synth_checkpoint: no options", dir);
    if (dcpi_sized_opts(&so, sizeof so, DCPI_OPTS_MIN(dcp_synth_options, progress_ctx), caller,
                        "dcp_synth_checkpoint", "DCP_SYNTH_OPTIONS_INIT", err) < 0)
        return -1;
    if (o->ranks < 1 || o->ranks > 65536 || o->ndim < 0 || o->ndim > 8 || !dcp_dtype_name(o->dtype) ||
        o->chunks_per_key < 1 || o->chunks_per_key > 1 << 20)
        return dcpi_err(err, EINVAL, "%s: bad synth options (ranks 1..65536, up to 8 dimensions, chunks per key >= 1)",
                        dir);
    /* The writer's rule (dcp_ckpt_add_tensor's), before anything is created:
     * every chunk is a box inside the shape, so none is refused later. */
    if (pw_tensor_shape_check(dir, NULL, o->ndim, o->shape, err) < 0)
        return -1;
    uint64_t numel = 0, kbytes, total;
    dcpi_shape_numel(o->ndim, o->shape, &numel);   /* fits: pw_tensor_shape_fits (0 with a 0 anywhere) */
    if (!dcpi_mul_u64(numel, dcp_dtype_size(o->dtype), &kbytes) || !dcpi_mul_u64(kbytes, o->nkeys, &total))
        return dcpi_err(err, EINVAL, "%s: checkpoint too large", dir);

    part *parts = malloc((size_t)o->ranks * sizeof *parts);
    if (!parts)
        return dcpi_err(err, ENOMEM, "%s: out of memory", dir);
    /* Every chunk costs memory and a file record however small its tensor:
     * bounded before anything is written (zero-size keys wrote forever). */
    uint64_t kc = key_chunks(o, parts), nchunks;
    if (!dcpi_mul_u64(o->nkeys, kc, &nchunks) || !dcpi_add_u64(nchunks, o->bytes_items, &nchunks) ||
        nchunks > DCP_SYNTH_CHUNKS_MAX) {
        free(parts);
        return dcpi_err(err, EINVAL, "%s: too many chunks: %" PRIu64 " keys of %" PRIu64 " chunk%s each and %" PRIu64
                        " bytes items, past the limit of %llu in all (DCP_SYNTH_CHUNKS_MAX; dcp-synth(1), Limits)",
                        dir, o->nkeys, kc, kc == 1 ? "" : "s", o->bytes_items, DCP_SYNTH_CHUNKS_MAX);
    }

    dcp_ckpt_writer *w;
    dcp_ckpt_options wo = DCP_CKPT_OPTIONS_INIT;
    wo.flags = DCP_WRITE_NO_SYNC | (o->crc ? 0 : DCP_WRITE_NO_CRC);
    if (dcp_ckpt_create(dir, &wo, &w, err) < 0) {
        free(parts);
        return -1;
    }
    int rc = 0;
    char key[64];
    for (uint64_t b = 0; b < o->bytes_items && rc == 0; b++) {
        zw_out blob = {.fd = -1};
        snprintf(key, sizeof key, "extra.%" PRIu64, b);
        rc = canceled(o, dir, err);
        if (rc == 0)
            rc = bytes_blob(b, &blob, err);
        dcp_source src = {.fill = mem_fill, .ctx = blob.buf};
        if (rc == 0)
            rc = dcp_ckpt_add_bytes(w, key, (int)(b % (uint64_t)o->ranks), blob.len, &src, 0, err);
        zw_out_free(&blob);
    }
    for (uint64_t k = 0; k < o->nkeys && rc == 0; k++) {
        snprintf(key, sizeof key, "model.layers.%" PRIu64 ".weight", k);
        rc = canceled(o, dir, err);
        if (rc == 0)
            rc = dcp_ckpt_add_tensor(w, key, o->dtype, o->ndim, o->shape, err);
        size_t np = rc == 0 ? rank_parts(o, k, parts) : 0;
        for (size_t i = 0; i < np && rc == 0; i++) {
            int cpk = o->ndim ? o->chunks_per_key : 1;
            for (int c = 0; c < cpk && rc == 0; c++) {
                part q = parts[i];
                if (o->ndim) {
                    int64_t s, l;
                    chunk_range(parts[i].size[0], cpk, c, &s, &l);
                    if (l == 0 && !(c == 0 && parts[i].size[0] == 0))
                        continue;
                    q.off[0] = parts[i].off[0] + s;
                    q.size[0] = l;
                }
                box b = {.seed = o->seed, .key = k, .dt = o->dtype, .nd = o->ndim, .shape = o->shape,
                         .off = q.off, .size = q.size, .cancel = o->cancel};
                box_init(&b);
                dcp_source src = {.fill = box_fill, .ctx = &b};
                rc = dcp_ckpt_add_chunk(w, key, q.rank, q.off, q.size, &src, 0, NULL, err);
            }
        }
        if (o->progress)
            o->progress(o->progress_ctx, dcp_ckpt_bytes(w), total);
    }
    free(parts);
    if (rc == 0)
        rc = canceled(o, dir, err);
    if (rc == 0)
        rc = dcpw_ckpt_finish(w, o->cancel, err);   /* a signal before .metadata is in place stops it too */
    /* A failure leaves nothing that looks like a checkpoint, and nothing of
     * someone else's is touched: the rank files this writer created go, and
     * dir too when it made the folder. */
    if (rc < 0)
        dcpw_ckpt_discard(w, dir);
    else
        dcp_ckpt_free(w);
    return rc;
}
