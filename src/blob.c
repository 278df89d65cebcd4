/* Blobs: the byte range of a shard file one _StorageInfo names, decoded when
 * it carries a stream transform (zstd; latin-1 text, for bytes a torch.save
 * file pickles at protocol 2), or bytes the checkpoint holds in memory (a
 * torch.save file's plain values, pickled). Decoded blobs are kept in a
 * small LRU cache in the checkpoint; callers always get copies. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zstd.h>

#include "internal.h"

#define DECODED_MAX (8ULL << 30)   /* refuse to inflate a blob beyond this */
#define FIRST_ALLOC (64u << 20)     /* trust a frame's claimed content size this far */
#define IN_STEP (1u << 20)          /* compressed bytes read at a time */

/* The decoded size limit: DECODED_MAX, or half the physical memory if less. */
static uint64_t decoded_limit(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    uint64_t lim = DECODED_MAX;
    if (pages > 0 && psz > 0 && (uint64_t)pages * (uint64_t)psz / 2 < lim)
        lim = (uint64_t)pages * (uint64_t)psz / 2;
    return lim;
}

/* Decompress a whole zstd blob (one or more frames, content size optional),
 * reading the compressed bytes a piece at a time. */
static int decode(dcp_checkpoint *ck, const dcp_blob *b, const char *key, void **out, uint64_t *outlen,
                  dcp_error *err)
{
    const char *file = ck->files[b->file];
    const uint64_t limit = decoded_limit();
    size_t istep = b->length < IN_STEP ? (size_t)b->length : IN_STEP;
    unsigned char *ibuf = malloc(istep ? istep : 1), *dst = NULL;
    ZSTD_DStream *ds = ZSTD_createDStream();
    const char *why = NULL;   /* a corrupt stream (EIO), unless code says otherwise */
    int code = EIO;
    if (!ibuf || !ds) {
        free(ibuf);
        ZSTD_freeDStream(ds);
        return dcpi_err(err, ENOMEM, "%s/%s: %s: out of memory", ck->path, file, key);
    }
    ZSTD_inBuffer in = {ibuf, 0, 0};
    ZSTD_outBuffer o = {NULL, 0, 0};
    uint64_t done_in = 0;
    size_t rc = 1;   /* nonzero while a frame is incomplete */
    int failed = 0;
    for (;;) {
        if (in.pos == in.size && done_in < b->length) {
            size_t n = b->length - done_in < istep ? (size_t)(b->length - done_in) : istep;
            if (dcpi_pread_full(ck, b->file, ibuf, n, b->offset + done_in, key, err) < 0) {
                failed = 1;
                break;
            }
            if (done_in == 0) {   /* size the output from the first frame's header */
                unsigned long long hint = ZSTD_getFrameContentSize(ibuf, n);
                uint64_t cap = hint == ZSTD_CONTENTSIZE_UNKNOWN || hint == ZSTD_CONTENTSIZE_ERROR
                                   ? b->length * 4 + 4096 : (uint64_t)hint + 1;
                if (cap > FIRST_ALLOC)
                    cap = FIRST_ALLOC;
                if (cap > limit)
                    cap = limit;
                if (!(dst = malloc((size_t)cap))) {
                    why = "out of memory";
                    code = ENOMEM;
                    break;
                }
                o.dst = dst;
                o.size = (size_t)cap;
            }
            done_in += n;
            in.size = n;
            in.pos = 0;
        }
        if (in.pos == in.size && done_in == b->length && (rc == 0 || !dst))
            break;   /* all input used and the last frame complete (or no input at all) */
        if (o.pos == o.size) {
            if (o.size >= limit) {
                why = "decodes beyond the size limit";
                code = EFBIG;
                break;
            }
            uint64_t ncap = (uint64_t)o.size * 2 > limit ? limit : (uint64_t)o.size * 2;
            unsigned char *nd = realloc(dst, (size_t)ncap);
            if (!nd) {
                why = "out of memory";
                code = ENOMEM;
                break;
            }
            dst = nd;
            o.dst = dst;
            o.size = (size_t)ncap;
        }
        size_t before_in = in.pos, before_out = o.pos;
        rc = ZSTD_decompressStream(ds, &o, &in);
        if (ZSTD_isError(rc)) {
            why = ZSTD_getErrorName(rc);
            break;
        }
        if (in.pos == in.size && done_in == b->length && rc != 0 && before_in == in.pos && before_out == o.pos) {
            why = "truncated stream";   /* input ended inside a frame */
            break;
        }
    }
    free(ibuf);
    ZSTD_freeDStream(ds);
    if (!failed && !why && (!dst || rc != 0))
        why = "empty blob";
    if (failed || why) {
        free(dst);
        if (failed)
            return -1;
        if (code == ENOMEM)
            return dcpi_err(err, ENOMEM, "%s/%s: %s: out of memory decoding the zstd blob at offset %llu",
                            ck->path, file, key, (unsigned long long)b->offset);
        if (code == EFBIG)
            return dcpi_err(err, EFBIG, "%s/%s: %s: the zstd blob at offset %llu decodes to more than %llu bytes",
                            ck->path, file, key, (unsigned long long)b->offset, (unsigned long long)limit);
        return dcpi_err(err, EIO, "%s/%s: %s: corrupt zstd blob at offset %llu: %s", ck->path, file, key,
                        (unsigned long long)b->offset, why);
    }
    if (o.size - o.pos > 4096) {   /* give back the unused estimate: the cache keeps it */
        unsigned char *nd = realloc(dst, o.pos ? o.pos : 1);
        if (nd)
            dst = nd;
    }
    *out = dst;
    *outlen = o.pos;
    return 0;
}

/* A blob of latin-1 text as pickle's BINUNICODE holds it (UTF-8: a byte
 * >= 0x80 as two bytes, C2 or C3 then a continuation): the bytes it spells. */
static int decode_latin1(dcp_checkpoint *ck, const dcp_blob *b, const char *key, void **out, uint64_t *outlen,
                         dcp_error *err)
{
    if (b->length > decoded_limit() || b->length > SIZE_MAX - 1)
        return dcpi_err(err, EFBIG, "%s/%s: %s: a latin-1 blob of %llu bytes is too large", ck->path,
                        ck->files[b->file], key, (unsigned long long)b->length);
    unsigned char *buf = malloc(b->length ? (size_t)b->length : 1);
    if (!buf)
        return dcpi_err(err, ENOMEM, "%s: %s: out of memory", ck->path, key);
    if (dcpi_pread_full(ck, b->file, buf, (size_t)b->length, b->offset, key, err) < 0) {
        free(buf);
        return -1;
    }
    size_t o = 0;
    for (size_t i = 0; i < (size_t)b->length; i++) {   /* in place: the output is never longer */
        if (buf[i] < 0x80) {
            buf[o++] = buf[i];
        } else if ((buf[i] == 0xc2 || buf[i] == 0xc3) && i + 1 < (size_t)b->length && (buf[i + 1] & 0xc0) == 0x80) {
            buf[o++] = (unsigned char)((buf[i] & 0x03) << 6 | (buf[i + 1] & 0x3f));
            i++;
        } else {
            free(buf);
            return dcpi_err(err, EIO, "%s/%s: %s: the pickled bytes at offset %llu are not latin-1 text (the file "
                            "changed?)", ck->path, ck->files[b->file], key, (unsigned long long)(b->offset + i));
        }
    }
    *out = buf;
    *outlen = o;
    return 0;
}

/* One decoded (zstd or latin-1) blob. */
typedef struct dcpi_decoded {
    uint32_t file;
    uint64_t offset;
    void *data;
    uint64_t len;
    uint64_t last_use;
} dcpi_decoded;

/* ck->blobs: the last few decoded blobs, so that a plan's many ops into one
 * compressed blob decode it once; and the blobs held in memory
 * (DCP_TRANSFORM_MEMORY: offset indexes mem). Made on first use, under
 * ck->lock. */
struct dcpi_blobcache {
    dcpi_decoded slot[DCPI_DECODED_CACHE];
    uint64_t clock;
    unsigned char **mem;
    uint64_t *memlen;
    size_t nmem, memcap;
};

static void blobcache_free(void *state)
{
    struct dcpi_blobcache *c = state;
    for (int i = 0; i < DCPI_DECODED_CACHE; i++)
        free(c->slot[i].data);
    for (size_t i = 0; i < c->nmem; i++)
        free(c->mem[i]);
    free(c->mem);
    free(c->memlen);
    free(c);
}

/* Under ck->lock: ck->blobs, made if needed; NULL with err. */
static struct dcpi_blobcache *blobs_of(dcp_checkpoint *ck, dcp_error *err)
{
    if (ck->blobs)
        return ck->blobs;
    struct dcpi_blobcache *c = calloc(1, sizeof *c);
    if (!c) {
        dcpi_err(err, ENOMEM, "%s: out of memory", ck->path);
        return NULL;
    }
    if (dcpi_ck_on_close(ck, blobcache_free, c, err) < 0) {
        free(c);
        return NULL;
    }
    return ck->blobs = c;
}

int dcpi_blob_cached(dcp_checkpoint *ck)
{
    int n = 0;
    pthread_mutex_lock(&ck->lock);
    for (int i = 0; ck->blobs && i < DCPI_DECODED_CACHE; i++)
        n += ck->blobs->slot[i].data != NULL;
    pthread_mutex_unlock(&ck->lock);
    return n;
}

/* Find or load the decoded blob; returns the cache slot with ck->lock held. */
static dcpi_decoded *cached(dcp_checkpoint *ck, const dcp_blob *b, const char *key, dcp_error *err)
{
    pthread_mutex_lock(&ck->lock);
    struct dcpi_blobcache *c = blobs_of(ck, err);
    if (!c) {
        pthread_mutex_unlock(&ck->lock);
        return NULL;
    }
    for (int i = 0; i < DCPI_DECODED_CACHE; i++) {
        dcpi_decoded *d = &c->slot[i];
        if (d->data && d->file == b->file && d->offset == b->offset) {
            d->last_use = ++c->clock;
            return d;
        }
    }
    pthread_mutex_unlock(&ck->lock);
    void *data = NULL;
    uint64_t len = 0;
    if ((b->transforms & DCP_TRANSFORM_LATIN1 ? decode_latin1(ck, b, key, &data, &len, err)
                                               : decode(ck, b, key, &data, &len, err)) < 0)
        return NULL;
    pthread_mutex_lock(&ck->lock);   /* c stays: it is freed only by dcp_close */
    dcpi_decoded *victim = &c->slot[0];
    for (int i = 0; i < DCPI_DECODED_CACHE; i++) {
        dcpi_decoded *d = &c->slot[i];
        if (d->data && d->file == b->file && d->offset == b->offset) {   /* another thread won */
            free(data);
            d->last_use = ++c->clock;
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
    victim->last_use = ++c->clock;
    return victim;
}

int dcpi_blob_hold(dcp_checkpoint *ck, void *data, uint64_t len, dcp_blob *out, dcp_error *err)
{
    pthread_mutex_lock(&ck->lock);
    struct dcpi_blobcache *c = blobs_of(ck, err);
    int rc = c ? 0 : -1;
    if (c && c->nmem == c->memcap) {
        size_t nc = c->memcap ? c->memcap * 2 : 16;
        unsigned char **nm = realloc(c->mem, nc * sizeof *nm);
        if (nm)
            c->mem = nm;
        uint64_t *nl = nm ? realloc(c->memlen, nc * sizeof *nl) : NULL;
        if (nl)
            c->memlen = nl;
        if (nm && nl)
            c->memcap = nc;
        else
            rc = dcpi_err(err, ENOMEM, "%s: out of memory", ck->path);
    }
    if (rc == 0) {
        *out = (dcp_blob){.file = 0, .transforms = DCP_TRANSFORM_MEMORY, .offset = c->nmem, .length = len};
        c->mem[c->nmem] = data;
        c->memlen[c->nmem++] = len;
    }
    pthread_mutex_unlock(&ck->lock);
    if (rc < 0)
        free(data);
    return rc;
}

/* Under ck->lock: the bytes of a held blob; NULL with err. */
static const unsigned char *held(dcp_checkpoint *ck, const dcp_blob *b, const char *key, dcp_error *err)
{
    struct dcpi_blobcache *c = ck->blobs;
    if (!c || b->offset >= c->nmem || c->memlen[b->offset] != b->length) {
        dcpi_err(err, EINVAL, "%s: %s: no such in-memory blob (%llu)", ck->path, key,
                 (unsigned long long)b->offset);
        return NULL;
    }
    return c->mem[b->offset];
}

int dcpi_blob_read(dcp_checkpoint *ck, const dcp_blob *b, void *buf, size_t len, uint64_t off,
                   const char *key, dcp_error *err)
{
    if (b->transforms & DCP_TRANSFORM_MEMORY) {
        pthread_mutex_lock(&ck->lock);
        const unsigned char *m = held(ck, b, key, err);
        int rc = m ? 0 : -1;
        if (m && (off > b->length || b->length - off < len))
            rc = dcpi_err(err, EIO, "%s: %s: read of %zu bytes at %llu runs past the value (%llu bytes)", ck->path,
                          key, len, (unsigned long long)off, (unsigned long long)b->length);
        else if (m)
            memcpy(buf, m + off, len);
        pthread_mutex_unlock(&ck->lock);
        return rc;
    }
    if (!(b->transforms & DCPI_BLOB_ENCODED)) {
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
    if (!(b->transforms & DCPI_BLOB_ENCODED)) {   /* a held blob's length is its size */
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
