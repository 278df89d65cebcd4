/* torch.save zip writer (see zip_write.h). The byte layout follows
 * PyTorchStreamWriter::writeRecord + miniz's mz_zip_writer_add_mem_ex_v2 with
 * MZ_ZIP_FLAG_WRITE_ZIP64, checked against files torch 2.13 writes:
 *   local header: version 0, flags 0x0808 (0x0800 for an empty record: no
 *   descriptor), method 0, time/date 0, CRC and sizes 0; extras: a zip64 one
 *   (usize, 0[, header offset]) when the record or its offset reaches 4 GiB,
 *   then 'FB' + 'Z' padding so the data starts at a multiple of 64;
 *   data descriptor PK\7\8 crc + 4-byte sizes (8-byte with the zip64 extra);
 *   central entries without padding; zip64 EOCD (made by 0x031e, needs 45),
 *   locator, classic EOCD with fields clamped to 0xFFFF/0xFFFFFFFF. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>
#include <zlib.h>
#ifdef HAVE_LIBDEFLATE
#include <libdeflate.h>
#endif

#include "zip_write.h"

#define OUT_BUF (1u << 20)      /* gather small records into writes of up to 1 MiB (one per rank file) */
#define DIRECT_MIN (64u << 10)  /* pieces this large go straight to the file, not through buf */
#define KERNEL_MIN (64u << 10)  /* shorter as-is runs are read and written, not copied in the kernel */
#define PAGE_ALIGN 4096u
#ifndef THREAD_MIN
#define THREAD_MIN (4u << 20)  /* records this large get their CRC computed beside the copy */
#endif
#define U32MAX 0xFFFFFFFFu

ssize_t (*zw_copy_file_range)(int, loff_t *, int, loff_t *, size_t, unsigned) = copy_file_range;

/* ---------------------------------------------------------------- output */

int zw_out_init(zw_out *o, int fd, uint64_t pos, const char *what, dcp_error *err)
{
    memset(o, 0, sizeof *o);
    o->fd = fd;
    o->pos = pos;
    o->what = what;
    o->cap = fd < 0 ? 4096 : OUT_BUF;
    o->buf = malloc(o->cap);
    if (!o->buf)
        return dcpi_err(err, ENOMEM, "%s: out of memory", what);
    return 0;
}

static int write_all(zw_out *o, const void *p, size_t n, dcp_error *err)
{
    const char *c = p;
    uint64_t off = o->pos - o->len;
    while (n) {
        ssize_t r = pwrite(o->fd, c, n, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return dcpi_err(err, r < 0 ? errno : EIO, "%s: write failed at offset %llu: %s", o->what,
                            (unsigned long long)off, r < 0 ? strerror(errno) : "no progress");
        c += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

int zw_out_flush(zw_out *o, dcp_error *err)
{
    if (!o->len || o->fd < 0)   /* fd < 0: an archive built in memory */
        return 0;
    if (write_all(o, o->buf, o->len, err) < 0)
        return -1;
    o->len = 0;
    return 0;
}

int zw_out_write(zw_out *o, const void *p, size_t n, dcp_error *err)
{
    if (o->fd < 0 && n > o->cap - o->len) {   /* in memory: grow */
        size_t nc = o->cap;
        while (nc - o->len < n) {
            if (nc > SIZE_MAX / 2)
                return dcpi_err(err, ENOMEM, "%s: out of memory", o->what);
            nc *= 2;
        }
        unsigned char *nb = realloc(o->buf, nc);
        if (!nb)
            return dcpi_err(err, ENOMEM, "%s: out of memory", o->what);
        o->buf = nb;
        o->cap = nc;
    }
    if (o->fd >= 0 && (n > o->cap - o->len || n >= DIRECT_MIN)) {
        if (zw_out_flush(o, err) < 0)
            return -1;
        if (n >= DIRECT_MIN) {   /* large: straight to the file, no copy into buf */
            o->pos += n;
            o->len = n;          /* write_all writes at pos - len */
            int rc = write_all(o, p, n, err);
            o->len = 0;
            return rc;
        }
    }
    memcpy(o->buf + o->len, p, n);
    o->len += n;
    o->pos += n;
    return 0;
}

void zw_out_free(zw_out *o)
{
    free(o->buf);
    o->buf = NULL;
    o->len = o->cap = 0;
}

/* ---------------------------------------------------------------- helpers */

static unsigned char *le16(unsigned char *p, uint64_t v) { p[0] = (unsigned char)v; p[1] = (unsigned char)(v >> 8); return p + 2; }
static unsigned char *le32(unsigned char *p, uint64_t v) { for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i)); return p + 4; }
static unsigned char *le64(unsigned char *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i)); return p + 8; }

/* libstdc++'s std::hash<std::string> (_Hash_bytes, seed 0xc70f6907) and
 * c10::hash_combine: what PyTorchStreamWriter folds into serialization_id. */
static uint64_t shift_mix(uint64_t v) { return v ^ (v >> 47); }
static uint64_t std_hash(const char *s, size_t len)
{
    const uint64_t mul = (0xc6a4a793ull << 32) + 0x5bd1e995ull;
    uint64_t h = 0xc70f6907ull ^ (len * mul);
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t d;
        memcpy(&d, s + i, 8);
        h ^= shift_mix(d * mul) * mul;
        h *= mul;
    }
    if (len & 7) {
        uint64_t d = 0;
        for (size_t j = len; j > i; j--)
            d = (d << 8) + (unsigned char)s[j - 1];
        h ^= d;
        h *= mul;
    }
    h = shift_mix(h) * mul;
    return shift_mix(h);
}
static uint64_t hash_combine(uint64_t seed, uint64_t v) { return seed ^ (v + 0x9e3779b9ull + (seed << 6) + (seed >> 2)); }

uint32_t zw_crc32(uint32_t crc, const void *p, size_t n)
{
#ifdef HAVE_LIBDEFLATE
    return libdeflate_crc32(crc, p, n);
#else
    const unsigned char *b = p;
    while (n) {
        uInt k = n > (1u << 30) ? (1u << 30) : (uInt)n;
        crc = (uint32_t)crc32(crc, b, k);
        b += k;
        n -= k;
    }
    return crc;
#endif
}

/* ---------------------------------------------------------------- archive */

int zw_begin(zw *z, zw_out *out, const char *root, dcp_error *err)
{
    memset(z, 0, sizeof *z);
    z->out = out;
    z->base = out->pos;
    if (strlen(root) + 1 > sizeof z->root)
        return dcpi_err(err, ENAMETOOLONG, "%s: archive name too long", out->what);
    strcpy(z->root, root);
    return 0;
}

static uint64_t cursor(const zw *z) { return z->out->pos - z->base; }

int zw_record_begin(zw *z, const char *name, uint64_t size, dcp_error *err)
{
    if (z->open)
        return dcpi_err(err, EINVAL, "%s: record %s opened inside another", z->out->what, name);
    if (z->n == z->cap) {
        size_t nc = z->cap ? z->cap * 2 : 16;
        zw_entry *ne = realloc(z->e, nc * sizeof *ne);
        if (!ne)
            return dcpi_err(err, ENOMEM, "%s: out of memory", z->out->what);
        z->e = ne;
        z->cap = nc;
    }
    size_t rl = strlen(z->root), nl = strlen(name);
    if (rl + 1 + nl > 0xFFFF)
        return dcpi_err(err, ENAMETOOLONG, "%s: record name too long", z->out->what);
    char *full = malloc(rl + nl + 2);
    if (!full)
        return dcpi_err(err, ENOMEM, "%s: out of memory", z->out->what);
    memcpy(full, z->root, rl);
    full[rl] = '/';
    memcpy(full + rl + 1, name, nl + 1);
    size_t fl = rl + 1 + nl;
    uint64_t cur = cursor(z);
    int big = size >= U32MAX, far = cur >= U32MAX;

    /* getPadding(): where the data would start, then pad it to 64. */
    uint64_t start = cur + 30 + fl + 4;
    size_t z64 = 0;
    if (big || far)
        z64 = 4 + (big ? 16 : 0) + (far ? 8 : 0);
    start += z64;
    size_t pad = (size_t)((ZW_ALIGN - start % ZW_ALIGN) % ZW_ALIGN);

    unsigned char hdr[30 + 32 + 4 + ZW_ALIGN], *p = hdr;
    p = le32(p, 0x04034b50);
    p = le16(p, 0);                               /* version needed */
    p = le16(p, size ? 0x0808 : 0x0800);          /* descriptor follows; UTF-8 names */
    p = le16(p, 0);                               /* stored */
    p = le16(p, 0);
    p = le16(p, 0);                               /* time, date */
    p = le32(p, 0);
    p = le32(p, 0);
    p = le32(p, 0);                               /* crc, sizes: in the descriptor */
    p = le16(p, fl);
    p = le16(p, z64 + 4 + pad);
    int rc = zw_out_write(z->out, hdr, (size_t)(p - hdr), err);
    rc = rc < 0 ? rc : zw_out_write(z->out, full, fl, err);
    p = hdr;
    if (z64) {
        p = le16(p, 0x0001);
        p = le16(p, z64 - 4);
        if (big) {
            p = le64(p, size);
            p = le64(p, 0);                       /* compressed size: not known yet */
        }
        if (far)
            p = le64(p, cur);
    }
    p = le16(p, 0x4246);                          /* "FB" */
    p = le16(p, pad);
    memset(p, 'Z', pad);
    p += pad;
    rc = rc < 0 ? rc : zw_out_write(z->out, hdr, (size_t)(p - hdr), err);
    if (rc < 0) {
        free(full);
        return -1;
    }
    z->e[z->n++] = (zw_entry){.name = full, .offset = cur, .size = size, .crc = 0};
    z->open = 1;
    z->rec_size = size;
    z->rec_done = 0;
    z->rec_crc = 0;
    return 0;
}

int zw_record_data(zw *z, const void *p, size_t n, dcp_error *err)
{
    if (!z->open || n > z->rec_size - z->rec_done)
        return dcpi_err(err, EINVAL, "%s: %s: more data than the record's size", z->out->what,
                        z->n ? z->e[z->n - 1].name : "?");
    if (!z->no_crc)
        z->rec_crc = zw_crc32(z->rec_crc, p, n);
    z->rec_done += n;
    return zw_out_write(z->out, p, n, err);
}

int zw_record_end(zw *z, dcp_error *err)
{
    if (!z->open || z->n == 0)
        return dcpi_err(err, EINVAL, "%s: no record open", z->out->what);
    zw_entry *e = &z->e[z->n - 1];
    if (z->rec_done != z->rec_size)
        return dcpi_err(err, EINVAL, "%s: %s: %llu of %llu bytes written", z->out->what, e->name,
                        (unsigned long long)z->rec_done, (unsigned long long)z->rec_size);
    z->open = 0;
    e->crc = z->rec_crc;
    const char *short_name = e->name + strlen(z->root) + 1;
    z->name_hash = hash_combine(z->name_hash, std_hash(short_name, strlen(short_name)));
    z->crc_hash = hash_combine(z->crc_hash, e->crc);
    if (!e->size)
        return 0;
    unsigned char d[24], *p = d;
    p = le32(p, 0x08074b50);
    p = le32(p, e->crc);
    if (e->size >= U32MAX || e->offset >= U32MAX) {
        p = le64(p, e->size);
        p = le64(p, e->size);
    } else {
        p = le32(p, e->size);
        p = le32(p, e->size);
    }
    return zw_out_write(z->out, d, (size_t)(p - d), err);
}

int zw_record(zw *z, const char *name, const void *data, uint64_t size, dcp_error *err)
{
    if (zw_record_begin(z, name, size, err) < 0)
        return -1;
    if (size && zw_record_data(z, data, (size_t)size, err) < 0)
        return -1;
    return zw_record_end(z, err);
}

int zw_torch_prologue(zw *z, const void *pkl, size_t pkl_len, dcp_error *err)
{
    if (zw_record(z, "data.pkl", pkl, pkl_len, err) < 0 || zw_record(z, ".format_version", "1", 1, err) < 0 ||
        zw_record(z, ".storage_alignment", "64", 2, err) < 0 || zw_record(z, "byteorder", "little", 6, err) < 0)
        return -1;
    return 0;
}

int zw_finish(zw *z, uint64_t *len, dcp_error *err)
{
    if (zw_record(z, "version", "3\n", 2, err) < 0)
        return -1;
    /* 20 digits of combined name hashes, 20 of combined CRCs. */
    char sid[41];
    snprintf(sid, sizeof sid, "%020llu%020llu", (unsigned long long)z->name_hash, (unsigned long long)z->crc_hash);
    if (zw_record(z, ".data/serialization_id", sid, 40, err) < 0)
        return -1;

    uint64_t cd_start = cursor(z);
    for (size_t i = 0; i < z->n; i++) {
        const zw_entry *e = &z->e[i];
        int big = e->size >= U32MAX, far = e->offset >= U32MAX;
        size_t fl = strlen(e->name);
        unsigned char h[46 + 28], *p = h;
        p = le32(p, 0x02014b50);
        p = le16(p, 0);
        p = le16(p, 0);                           /* made by, needed */
        p = le16(p, e->size ? 0x0808 : 0x0800);
        p = le16(p, 0);
        p = le16(p, 0);
        p = le16(p, 0);
        p = le32(p, e->crc);
        p = le32(p, big ? U32MAX : e->size);
        p = le32(p, big ? U32MAX : e->size);
        p = le16(p, fl);
        size_t xl = (big || far) ? 4 + (big ? 16 : 0) + (far ? 8 : 0) : 0;
        p = le16(p, xl);
        p = le16(p, 0);                           /* comment */
        p = le16(p, 0);                           /* disk */
        p = le16(p, 0);                           /* internal attributes */
        p = le32(p, 0);                           /* external attributes */
        p = le32(p, far ? U32MAX : e->offset);
        if (zw_out_write(z->out, h, (size_t)(p - h), err) < 0 || zw_out_write(z->out, e->name, fl, err) < 0)
            return -1;
        if (xl) {
            p = h;
            p = le16(p, 0x0001);
            p = le16(p, xl - 4);
            if (big) {
                p = le64(p, e->size);
                p = le64(p, e->size);
            }
            if (far)
                p = le64(p, e->offset);
            if (zw_out_write(z->out, h, (size_t)(p - h), err) < 0)
                return -1;
        }
    }
    uint64_t cd_end = cursor(z), cd_size = cd_end - cd_start;
    unsigned char t[56 + 20 + 22], *p = t;
    p = le32(p, 0x06064b50);                      /* zip64 end of central directory */
    p = le64(p, 44);
    p = le16(p, 0x031e);
    p = le16(p, 0x002d);
    p = le32(p, 0);
    p = le32(p, 0);
    p = le64(p, z->n);
    p = le64(p, z->n);
    p = le64(p, cd_size);
    p = le64(p, cd_start);
    p = le32(p, 0x07064b50);                      /* zip64 locator */
    p = le32(p, 0);
    p = le64(p, cd_end);
    p = le32(p, 1);
    p = le32(p, 0x06054b50);                      /* end of central directory */
    p = le16(p, 0);
    p = le16(p, 0);
    p = le16(p, z->n > 0xFFFF ? 0xFFFF : z->n);
    p = le16(p, z->n > 0xFFFF ? 0xFFFF : z->n);
    p = le32(p, cd_size >= U32MAX ? U32MAX : cd_size);
    p = le32(p, cd_start >= U32MAX ? U32MAX : cd_start);
    p = le16(p, 0);
    if (zw_out_write(z->out, t, (size_t)(p - t), err) < 0)
        return -1;
    if (len)
        *len = cursor(z);
    return 0;
}

void zw_free(zw *z)
{
    for (size_t i = 0; i < z->n; i++)
        free(z->e[i].name);
    free(z->e);
    z->e = NULL;
    z->n = z->cap = 0;
}

/* In-kernel copy of up to n bytes at foff of fd to the output's position;
 * *copied gets how many. Fewer than n only when the kernel cannot copy
 * between these files (EXDEV across filesystems before Linux 5.19, ENOSYS,
 * EINVAL/EOPNOTSUPP on some filesystems): then o->no_kernel_copy is set and
 * the caller reads and writes the rest. -1 on a real error. */
static int out_copy(zw_out *o, int fd, uint64_t foff, uint64_t n, uint64_t *copied, dcp_error *err)
{
    *copied = 0;
    if (zw_out_flush(o, err) < 0)
        return -1;
    loff_t in = (loff_t)foff, out = (loff_t)o->pos;
    while (*copied < n) {
        uint64_t want = n - *copied > (1ull << 30) ? (1ull << 30) : n - *copied;
        ssize_t r = zw_copy_file_range(fd, &in, o->fd, &out, (size_t)want, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EXDEV || errno == ENOSYS || errno == EINVAL || errno == EOPNOTSUPP)) {
            o->no_kernel_copy = 1;
            break;
        }
        if (r <= 0)
            return dcpi_err(err, r < 0 ? errno : EIO, "%s: copy failed at offset %llu: %s", o->what,
                            (unsigned long long)out, r < 0 ? strerror(errno) : "the source ends early");
        *copied += (uint64_t)r;
        o->pos += (uint64_t)r;
    }
    return 0;
}

/* Fold bytes [off, off+n) of item tag into the open record's CRC, reading them again. */
static int crc_of(zw *z, const dcp_source *src, uint64_t tag, uint64_t off, uint64_t n, void *piece,
                  size_t piece_len, dcp_error *err)
{
    for (uint64_t end = off + n; off < end;) {
        size_t k = end - off < piece_len ? (size_t)(end - off) : piece_len;
        if (src->fill(src->ctx, tag, off, piece, k, err) < 0)
            return -1;
        z->rec_crc = zw_crc32(z->rec_crc, piece, k);
        off += k;
    }
    return 0;
}

/* A run whose CRC is not needed or already known, at off of item tag: in the
 * kernel when source and output share their offset within a page (else
 * copy_file_range splits every page copy in two and is slower than
 * read+write), or read and written through piece without computing a CRC.
 * The record's CRC then absorbs the run's recorded one. */
static int copy_run(zw_out *o, zw *z, const dcp_source *src, uint64_t tag, uint64_t off, const dcp_run *run,
                    void *piece, size_t piece_len, dcp_error *err)
{
    uint64_t n = 0;
    if (!o->no_kernel_copy && run->offset % PAGE_ALIGN == o->pos % PAGE_ALIGN &&
        out_copy(o, run->fd, run->offset, run->length, &n, err) < 0)
        return -1;
    /* The kernel gave up part way (n < length): the recorded CRC no longer
     * serves; CRC what it copied, and the rest as it is written. */
    int compute = z && !z->no_crc && n && n < run->length;
    if (compute && crc_of(z, src, tag, off, n, piece, piece_len, err) < 0)
        return -1;
    for (uint64_t done = n; done < run->length;) {
        size_t k = run->length - done < piece_len ? (size_t)(run->length - done) : piece_len;
        if (src->fill(src->ctx, tag, off + done, piece, k, err) < 0 || zw_out_write(o, piece, k, err) < 0)
            return -1;
        if (compute)
            z->rec_crc = zw_crc32(z->rec_crc, piece, k);
        done += k;
    }
    if (!z)
        return 0;
    z->rec_done += run->length;
    if (!z->no_crc && !compute)
        z->rec_crc = (uint32_t)crc32_combine64(z->rec_crc, run->crc, (z_off64_t)run->length);
    return 0;
}

/* The CRC of a record's pieces computed on a second thread while the next
 * piece is read and this one written: piece is split in halves, one being
 * filled while the CRC thread reads the other. At most one piece is handed
 * over at a time; the caller waits for the thread before handing the next,
 * so a half is never refilled while its CRC is being computed. */
typedef struct crc_worker {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    const unsigned char *job;      /* piece handed over, NULL when idle */
    size_t job_len;
    int quit;
    uint32_t crc;                  /* running CRC (the record's while the thread has it) */
} crc_worker;

static void *crc_main(void *arg)
{
    crc_worker *w = arg;
    pthread_mutex_lock(&w->lock);
    for (;;) {
        while (!w->job && !w->quit)
            pthread_cond_wait(&w->cond, &w->lock);
        if (!w->job)
            break;
        const unsigned char *p = w->job;
        size_t n = w->job_len;
        uint32_t crc = w->crc;
        pthread_mutex_unlock(&w->lock);
        crc = zw_crc32(crc, p, n);
        pthread_mutex_lock(&w->lock);
        w->crc = crc;
        w->job = NULL;
        pthread_cond_broadcast(&w->cond);
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

static int crc_worker_start(crc_worker *w, uint32_t crc)
{
    memset(w, 0, sizeof *w);
    w->crc = crc;
    if (pthread_mutex_init(&w->lock, NULL))
        return -1;
    if (pthread_cond_init(&w->cond, NULL)) {
        pthread_mutex_destroy(&w->lock);
        return -1;
    }
    if (pthread_create(&w->thread, NULL, crc_main, w)) {
        pthread_cond_destroy(&w->cond);
        pthread_mutex_destroy(&w->lock);
        return -1;
    }
    return 0;
}

/* Wait until the thread is idle; its CRC is then the record's. */
static uint32_t crc_worker_wait(crc_worker *w)
{
    pthread_mutex_lock(&w->lock);
    while (w->job)
        pthread_cond_wait(&w->cond, &w->lock);
    uint32_t crc = w->crc;
    pthread_mutex_unlock(&w->lock);
    return crc;
}

/* Hand over the next piece (the thread is idle), starting from crc. */
static void crc_worker_post(crc_worker *w, uint32_t crc, const void *p, size_t n)
{
    pthread_mutex_lock(&w->lock);
    w->crc = crc;
    w->job = p;
    w->job_len = n;
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
}

static uint32_t crc_worker_stop(crc_worker *w)
{
    uint32_t crc = crc_worker_wait(w);
    pthread_mutex_lock(&w->lock);
    w->quit = 1;
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
    pthread_join(w->thread, NULL);
    pthread_cond_destroy(&w->cond);
    pthread_mutex_destroy(&w->lock);
    return crc;
}

int zw_pump(zw_out *o, zw *z, const dcp_source *src, uint64_t tag, uint64_t len, void *piece, size_t piece_len,
            uint64_t *done, uint64_t total, dcp_progress_fn progress, void *pctx, dcp_error *err)
{
    int need_crc = z && !z->no_crc;
    /* A large record whose CRC is computed: on a second thread, pieces of
     * half the buffer (a multiple of 16 still). */
    crc_worker cw;
    int async = need_crc && len >= THREAD_MIN && piece_len >= 2 * 4096 && crc_worker_start(&cw, z->rec_crc) == 0;
    int posted = 0;                /* the thread holds the record's CRC */
    size_t half = async ? piece_len / 2 / 4096 * 4096 : piece_len;
    unsigned k = 0;
    int rc = 0;
    for (uint64_t off = 0; off < len && rc == 0;) {
        uint64_t n = 0;
        /* Runs stored as is whose CRC is not needed, or recorded by the
         * source, go without computing one; the rest is read once into piece
         * for the CRC and the write. */
        dcp_run run;
        if (src->range && o->fd >= 0) {
            int r = src->range(src->ctx, tag, off, len - off, &run, err);
            if (r < 0) {
                rc = -1;
                break;
            }
            if (r == 1 && run.length >= KERNEL_MIN && run.length <= len - off && (!need_crc || run.has_crc)) {
                if (posted) {
                    z->rec_crc = crc_worker_wait(&cw);
                    posted = 0;
                }
                if (copy_run(o, z, src, tag, off, &run, piece, piece_len, err) < 0) {
                    rc = -1;
                    break;
                }
                n = run.length;
            }
        }
        if (n == 0 && async) {
            unsigned char *buf = (unsigned char *)piece + (k++ & 1) * half;
            n = len - off < half ? len - off : half;
            /* the other half may still be with the CRC thread: fill this one meanwhile */
            if (src->fill(src->ctx, tag, off, buf, (size_t)n, err) < 0) {
                rc = -1;
                break;
            }
            uint32_t crc = posted ? crc_worker_wait(&cw) : z->rec_crc;
            crc_worker_post(&cw, crc, buf, (size_t)n);
            posted = 1;
            if (zw_out_write(o, buf, (size_t)n, err) < 0) {
                rc = -1;
                break;
            }
            z->rec_done += n;
        } else if (n == 0) {
            n = len - off < piece_len ? len - off : piece_len;
            if (src->fill(src->ctx, tag, off, piece, (size_t)n, err) < 0 ||
                (z ? zw_record_data(z, piece, (size_t)n, err) : zw_out_write(o, piece, (size_t)n, err)) < 0) {
                rc = -1;
                break;
            }
        }
        off += n;
        if (done)
            *done += n;
        if (progress)
            progress(pctx, done ? *done : off, total);
    }
    if (async) {
        uint32_t crc = crc_worker_stop(&cw);
        if (posted)
            z->rec_crc = crc;
    }
    return rc;
}
