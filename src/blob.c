/* Blobs: the byte range of a shard file one _StorageInfo names, decoded when
 * it carries a stream transform (zstd). Decoded blobs are kept in a small
 * LRU cache in the checkpoint; callers always get copies. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "internal.h"

#define DECODED_MAX (8ULL << 30)   /* refuse to inflate a blob beyond this */

static int decode(dcp_checkpoint *ck, const dcp_blob *b, const char *key, void **out, uint64_t *outlen,
                  dcp_error *err)
{
    const char *file = ck->files[b->file];
    if (b->length > DECODED_MAX)
        return dcpi_err(err, EFBIG, "%s/%s: %s: compressed blob too large", ck->path, file, key);
    void *src = malloc(b->length ? b->length : 1);
    if (!src)
        return dcpi_err(err, ENOMEM, "%s/%s: %s: out of memory", ck->path, file, key);
    if (dcpi_pread_full(ck, b->file, src, b->length, b->offset, key, err) < 0) {
        free(src);
        return -1;
    }
    ZSTD_DStream *ds = ZSTD_createDStream();
    unsigned long long hint = ZSTD_getFrameContentSize(src, b->length);
    size_t cap = (hint != ZSTD_CONTENTSIZE_UNKNOWN && hint != ZSTD_CONTENTSIZE_ERROR && hint <= DECODED_MAX)
                     ? (size_t)hint + 1 : (size_t)b->length * 4 + 4096;
    unsigned char *dst = malloc(cap);
    if (!ds || !dst) {
        free(src);
        free(dst);
        ZSTD_freeDStream(ds);
        return dcpi_err(err, ENOMEM, "%s/%s: %s: out of memory", ck->path, file, key);
    }
    ZSTD_inBuffer in = {src, b->length, 0};
    ZSTD_outBuffer o = {dst, cap, 0};
    size_t rc = 1;
    while (in.pos < in.size || rc != 0) {
        if (o.pos == o.size) {
            if (cap >= DECODED_MAX) {
                rc = (size_t)-1;
                break;
            }
            size_t ncap = cap * 2 > DECODED_MAX ? DECODED_MAX : cap * 2;
            unsigned char *nd = realloc(dst, ncap);
            if (!nd) {
                free(src);
                free(dst);
                ZSTD_freeDStream(ds);
                return dcpi_err(err, ENOMEM, "%s/%s: %s: out of memory", ck->path, file, key);
            }
            dst = nd;
            cap = ncap;
            o.dst = dst;
            o.size = cap;
        }
        size_t before_in = in.pos, before_out = o.pos;
        rc = ZSTD_decompressStream(ds, &o, &in);
        if (ZSTD_isError(rc))
            break;
        if (in.pos == in.size && rc != 0 && before_in == in.pos && before_out == o.pos) {
            rc = (size_t)-2;   /* input ended inside a frame */
            break;
        }
    }
    free(src);
    ZSTD_freeDStream(ds);
    if (rc != 0) {
        free(dst);
        return dcpi_err(err, EIO, "%s/%s: %s: corrupt zstd blob at offset %llu: %s", ck->path, file, key,
                        (unsigned long long)b->offset,
                        rc == (size_t)-1 ? "decodes beyond the size limit"
                        : rc == (size_t)-2 ? "truncated stream" : ZSTD_getErrorName(rc));
    }
    *out = dst;
    *outlen = o.pos;
    return 0;
}

/* Find or load the decoded blob; returns the cache slot with ck->lock held. */
static dcpi_decoded *cached(dcp_checkpoint *ck, const dcp_blob *b, const char *key, dcp_error *err)
{
    pthread_mutex_lock(&ck->lock);
    for (int i = 0; i < DCPI_DECODED_CACHE; i++) {
        dcpi_decoded *d = &ck->decoded[i];
        if (d->data && d->file == b->file && d->offset == b->offset) {
            d->last_use = ++ck->decode_clock;
            return d;
        }
    }
    pthread_mutex_unlock(&ck->lock);
    void *data = NULL;
    uint64_t len = 0;
    if (decode(ck, b, key, &data, &len, err) < 0)
        return NULL;
    pthread_mutex_lock(&ck->lock);
    dcpi_decoded *victim = &ck->decoded[0];
    for (int i = 0; i < DCPI_DECODED_CACHE; i++) {
        dcpi_decoded *d = &ck->decoded[i];
        if (d->data && d->file == b->file && d->offset == b->offset) {   /* another thread won */
            free(data);
            d->last_use = ++ck->decode_clock;
            return d;
        }
        if (!d->data || d->last_use < victim->last_use)
            victim = d;
    }
    free(victim->data);
    victim->data = data;
    victim->len = len;
    victim->file = b->file;
    victim->offset = b->offset;
    victim->last_use = ++ck->decode_clock;
    return victim;
}

int dcpi_blob_read(dcp_checkpoint *ck, const dcp_blob *b, void *buf, size_t len, uint64_t off,
                   const char *key, dcp_error *err)
{
    if (!(b->transforms & DCP_TRANSFORM_ZSTD)) {
        if (off > b->length || b->length - off < len)
            return dcpi_err(err, EIO, "%s/%s: %s: read of %zu bytes at %llu runs past the blob (%llu bytes)",
                            ck->path, ck->files[b->file], key, len, (unsigned long long)off,
                            (unsigned long long)b->length);
        return dcpi_pread_full(ck, b->file, buf, len, b->offset + off, key, err);
    }
    dcpi_decoded *d = cached(ck, b, key, err);
    if (!d)
        return -1;
    int rc = 0;
    if (off > d->len || d->len - off < len)
        rc = dcpi_err(err, EIO, "%s/%s: %s: read of %zu bytes at %llu runs past the decoded blob (%llu bytes)",
                      ck->path, ck->files[b->file], key, len, (unsigned long long)off,
                      (unsigned long long)d->len);
    else
        memcpy(buf, (const char *)d->data + off, len);
    pthread_mutex_unlock(&ck->lock);
    return rc;
}

int dcpi_blob_size(dcp_checkpoint *ck, const dcp_blob *b, uint64_t *size, const char *key, dcp_error *err)
{
    if (!(b->transforms & DCP_TRANSFORM_ZSTD)) {
        *size = b->length;
        return 0;
    }
    dcpi_decoded *d = cached(ck, b, key, err);
    if (!d)
        return -1;
    *size = d->len;
    pthread_mutex_unlock(&ck->lock);
    return 0;
}
