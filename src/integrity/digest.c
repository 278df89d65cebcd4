/* Content digests: XXH3-64 of each blob's stored bytes, XXH3-128 of each
 * entry's global value whatever its layout (dcp digest), and the identity
 * of a checkpoint (what the catalog's records are tied to). */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "integrity.h"

#define HASH_PIECE (8u << 20)        /* dcp_blob_digest's reads (the bulk hasher: hashing.c) */
#define VALUE_PIECE (16u << 20)      /* dcp_value_digest's planned pieces */

int dcp_blob_digest(dcp_checkpoint *ck, const dcp_blob *b, uint64_t *xxh3, dcp_error *err)
{
    XXH3_state_t *st = XXH3_createState();
    size_t piece = b->length < HASH_PIECE ? (size_t)b->length : HASH_PIECE;
    void *buf = malloc(piece ? piece : 1);
    int rc = 0;
    if (!st || !buf) {
        rc = dcpi_err(err, ENOMEM, "%s: out of memory", ck->path);
        goto out;
    }
    XXH3_64bits_reset(st);
    /* The stored bytes, as they are in the file (not decoded); a held
     * blob's, as the checkpoint holds them. */
    for (uint64_t off = 0; off < b->length; off += piece) {
        size_t n = b->length - off < piece ? (size_t)(b->length - off) : piece;
        if ((b->transforms & DCP_TRANSFORM_MEMORY ? dcpi_blob_read(ck, b, buf, n, off, "(digest)", err)
                                                  : dcpi_pread_full(ck, b->file, buf, n, b->offset + off, "(digest)",
                                                                    err)) < 0) {
            rc = -1;
            goto out;
        }
        XXH3_64bits_update(st, buf, n);
    }
    *xxh3 = XXH3_64bits_digest(st);
out:
    free(buf);
    XXH3_freeState(st);
    return rc;
}

static int is_floating(dcp_dtype dt)
{
    switch (dt) {
    case DCP_FLOAT8_E4M3FNUZ: case DCP_FLOAT8_E5M2FNUZ: case DCP_FLOAT8_E8M0FNU: case DCP_FLOAT4_E2M1FN_X2:
        return 1;
    default:
        return dcpi_castable(dt);
    }
}


int dcp_value_digest(dcp_checkpoint *ck, const dcp_entry *e, unsigned char digest[16], dcp_error *err)
{
    return dcp_value_digest_as(ck, e, DCP_DTYPE_INVALID, digest, NULL, err);
}

int dcp_value_digest_as(dcp_checkpoint *ck, const dcp_entry *e, dcp_dtype as, unsigned char digest[16],
                        int *cast, dcp_error *err)
{
    if (as != DCP_DTYPE_INVALID && as != DCP_BFLOAT16 && as != DCP_FLOAT16 && as != DCP_FLOAT32 &&
        as != DCP_FLOAT64)
        return dcpi_err(err, EINVAL, "%s: %s: cannot cast to %s: only to bfloat16, float16, float32 or float64",
                        ck->path, e->key, dcp_dtype_name(as) ? dcp_dtype_name(as) : "an invalid dtype");
    int do_cast = as != DCP_DTYPE_INVALID && e->kind == DCP_KIND_TENSOR && e->dtype != as && is_floating(e->dtype);
    if (do_cast && !dcpi_castable(e->dtype))
        return dcpi_err(err, EINVAL, "%s: %s: casting %s to %s is not supported", ck->path, e->key,
                        dcp_dtype_name(e->dtype), dcp_dtype_name(as));
    if (cast)
        *cast = do_cast;
    uint64_t total;
    if (dcp_entry_nbytes(ck, e, &total, err) < 0)
        return -1;
    uint64_t esz = e->kind == DCP_KIND_TENSOR ? dcp_dtype_size(e->dtype) : 1;
    if (esz == 0)
        esz = 1;
    /* a cast piece holds at most 2 output bytes per input byte (float8 ->
     * float16) or 8 (float8 -> float64): its input is cut to keep the
     * output within VALUE_PIECE too */
    uint64_t osz = do_cast ? dcp_dtype_size(as) : esz;
    uint64_t piece = do_cast && osz > esz ? VALUE_PIECE / (osz / esz) : VALUE_PIECE;
    uint64_t step = piece - piece % esz;
    if (step == 0)
        step = esz;   /* an element larger than a piece: one element a step */
    size_t cap = total < step ? (size_t)(total ? total : 1) : (size_t)step;
    size_t ocap = do_cast ? (size_t)(cap / esz * osz) + 1 : 0;
    XXH3_state_t *st = XXH3_createState();
    void *buf = malloc(cap), *obuf = do_cast ? malloc(ocap) : NULL;
    dcp_plan plan;
    dcp_plan_init(&plan);
    int rc = 0;
    if (!st || !buf || (do_cast && !obuf)) {
        rc = dcpi_err(err, ENOMEM, "%s: %s: out of memory for a %zu-byte piece", ck->path, e->key, cap);
        goto out;
    }
    XXH3_128bits_reset(st);
    /* the C-order image in pieces: the planner assembles each from whatever
     * chunks hold it, so every layout of the same values hashes alike */
    for (uint64_t off = 0; off < total; off += step) {
        uint64_t n = total - off < step ? total - off : step;
        if (dcp_plan_bytes(ck, e, off, n, &plan, err) < 0 || dcp_plan_execute(ck, &plan, buf, err) < 0) {
            rc = -1;
            goto out;
        }
        if (do_cast) {
            size_t nel = (size_t)(plan.nbytes / esz);
            dcpi_cast(buf, e->dtype, obuf, as, nel);
            XXH3_128bits_update(st, obuf, nel * (size_t)osz);
        } else {
            XXH3_128bits_update(st, buf, (size_t)plan.nbytes);
        }
    }
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(st));
    memcpy(digest, c.digest, 16);
out:
    dcp_plan_free(&plan);
    free(buf);
    free(obuf);
    XXH3_freeState(st);
    return rc;
}

static int by_place(const void *x, const void *y)
{
    const dcpi_blobref *a = x, *b = y;
    if (a->file != b->file)
        return a->file < b->file ? -1 : 1;
    if (a->offset != b->offset)
        return a->offset < b->offset ? -1 : 1;
    return (a->length > b->length) - (a->length < b->length);
}

int dcpi_collect_blobs(dcp_checkpoint *ck, dcpi_blobref **out, size_t *nout, dcp_error *err)
{
    size_t n = 0, nentries = dcp_num_entries(ck);
    for (size_t i = 0; i < nentries; i++) {
        const dcp_entry *e;
        if (dcp_get_entry(ck, i, &e, err) < 0)
            return -1;
        n += e->kind == DCP_KIND_BYTES ? 1 : e->nchunks;
    }
    dcpi_blobref *r = malloc((n ? n : 1) * sizeof *r);
    if (!r)
        return dcpi_err(err, ENOMEM, "%s: out of memory", ck->path);
    size_t m = 0;
    for (size_t i = 0; i < nentries; i++) {
        const dcp_entry *e = dcp_entry_at(ck, i);
        if (e->kind == DCP_KIND_BYTES) {
            if (e->has_blob && !(e->blob.transforms & DCP_TRANSFORM_MEMORY))   /* stored bytes only */
                r[m++] = (dcpi_blobref){.file = e->blob.file, .offset = e->blob.offset, .length = e->blob.length,
                                        .entry = i, .want = 1};
            continue;
        }
        const dcp_chunk *c;
        if (dcp_entry_chunks(ck, e, &c, err) < 0) {
            free(r);
            return -1;
        }
        for (size_t j = 0; j < e->nchunks; j++)
            if (c[j].has_blob)
                r[m++] = (dcpi_blobref){.file = c[j].blob.file, .offset = c[j].blob.offset,
                                        .length = c[j].blob.length, .entry = i, .want = 1};
        dcp_release_chunks(ck, e);
    }
    /* qsort is not stable: keep the first entry's index for a shared range
     * (SAFETENSORS shards give every chunk of a file the same blob). */
    qsort(r, m, sizeof *r, by_place);
    size_t k = 0;
    for (size_t i = 0; i < m; i++) {
        if (k && r[k - 1].file == r[i].file && r[k - 1].offset == r[i].offset && r[k - 1].length == r[i].length) {
            if (r[i].entry < r[k - 1].entry)
                r[k - 1].entry = r[i].entry;
            continue;
        }
        r[k++] = r[i];
    }
    *out = r;
    *nout = k;
    return 0;
}

/* Hash one file's (name, size, mtime) and, for metadata files, content. */
static int add_file(dcp_checkpoint *ck, XXH3_state_t *st, const char *name, int content, dcp_error *err)
{
    struct stat sb;
    if (fstatat(ck->dirfd, name, &sb, 0) < 0) {
        if (content)
            return dcpi_err(err, errno, "%s/%s: %s", ck->path, name, strerror(errno));
        /* a shard file missing: an identity no record was made for, so that
         * dcp verify still checks the other files (the structure check names
         * this one) */
        uint64_t gone[2] = {UINT64_MAX, (uint64_t)errno};
        XXH3_128bits_update(st, name, strlen(name) + 1);
        XXH3_128bits_update(st, gone, sizeof gone);
        return 0;
    }
    XXH3_128bits_update(st, name, strlen(name) + 1);
    uint64_t v[2] = {(uint64_t)sb.st_size, content ? (uint64_t)sb.st_mtim.tv_sec * 1000000000u + (uint64_t)sb.st_mtim.tv_nsec : 0};
    XXH3_128bits_update(st, v, sizeof v);
    if (!content)
        return 0;
    int fd = openat(ck->dirfd, name, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return dcpi_err(err, errno, "%s/%s: %s", ck->path, name, strerror(errno));
    char *buf = malloc(HASH_PIECE);
    ssize_t r = 0;
    while (buf && (r = read(fd, buf, HASH_PIECE)) > 0)
        XXH3_128bits_update(st, buf, (size_t)r);
    free(buf);
    close(fd);
    return r < 0 || !buf ? dcpi_err(err, EIO, "%s/%s: read failed", ck->path, name) : 0;
}

/* Metadata files (content, size, mtime) and every data file's size; computed
 * once per open checkpoint. */
static int compute_identity(dcp_checkpoint *ck, char id[33], dcp_error *err)
{
    XXH3_state_t *st = XXH3_createState();
    if (!st)
        return dcpi_err(err, ENOMEM, "%s: out of memory", ck->path);
    XXH3_128bits_reset(st);
    int rc = 0;
    struct stat sb;
    if (fstatat(ck->dirfd, ".metadata", &sb, 0) == 0)
        rc = add_file(ck, st, ".metadata", 1, err);
    for (size_t f = 0; f < ck->nfiles && rc == 0; f++) {
        size_t n = strlen(ck->files[f]);
        /* rank-local __R.metadata files are not data files; safetensors headers are */
        rc = add_file(ck, st, ck->files[f], n > 12 && !strcmp(ck->files[f] + n - 12, ".safetensors"), err);
    }
    if (rc == 0 && ck->rank_view >= 0) {   /* one rank's view (DCP_OPEN_RANK): its file alone */
        char name[64];
        snprintf(name, sizeof name, "__%ld.metadata", ck->rank_view);
        rc = add_file(ck, st, name, 1, err);
    } else if (rc == 0 && !strcmp(ck->info.layout ? ck->info.layout : "", "rank-local __R.metadata")) {
        for (int r = 0; rc == 0; r++) {
            char name[64];
            snprintf(name, sizeof name, "__%d.metadata", r);
            if (fstatat(ck->dirfd, name, &sb, 0) < 0)
                break;
            rc = add_file(ck, st, name, 1, err);
        }
    }
    if (rc == 0) {
        XXH128_hash_t h = XXH3_128bits_digest(st);
        snprintf(id, 33, "%016llx%016llx", (unsigned long long)h.high64, (unsigned long long)h.low64);
    }
    XXH3_freeState(st);
    return rc;
}

/* ck->digest: the digest identity, computed once per open checkpoint.
 * Not the model's key (ck->meta, internal.h says why the two differ).
 * Arena-owned, set under ck->lock. */
struct dcpi_digest_state {
    char identity[33];
};

int dcp_checkpoint_identity(dcp_checkpoint *ck, char id[33], dcp_error *err)
{
    pthread_mutex_lock(&ck->lock);
    int known = ck->digest != NULL;
    if (known)
        memcpy(id, ck->digest->identity, 33);
    pthread_mutex_unlock(&ck->lock);
    if (known)
        return 0;
    if (compute_identity(ck, id, err) < 0)
        return -1;
    pthread_mutex_lock(&ck->lock);
    if (!ck->digest) {
        struct dcpi_digest_state *d = dcpi_arena_alloc(&ck->arena, sizeof *d);
        if (d) {   /* else computed again next time */
            memcpy(d->identity, id, 33);
            ck->digest = d;
        }
    }
    pthread_mutex_unlock(&ck->lock);
    return 0;
}
