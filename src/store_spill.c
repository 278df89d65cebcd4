/* The spill store (store.h): a parsed model whose chunks wait in scratch
 * files, so that the first parse of a very large .metadata holds the
 * entries in memory but not their chunks (10 million chunks are ~1.3 GiB as
 * an in-memory model, ~100 MiB so).
 *
 * While .metadata is parsed (metadata.c), each tensor entry's chunk boxes
 * go to the box file as soon as the entry is complete (its
 * state_dict_metadata item), and each storage_data item's blob and offsets
 * to a log, in the order they come; after the parse the log is sorted into
 * the slot file, each entry's slots together, in a few sequential passes
 * (a window of SLOT_WINDOW bytes of the slot file a pass: the items come
 * rank after rank, so written one by one they would cost a system call
 * each, ~13 s for 10M). Which chunk a slot
 * belongs to is settled when the entry is read back, by its offsets: the
 * k-th slot usually holds the k-th chunk (storage_data lists an entry's
 * chunks in the order state_dict_metadata does, rank after rank), else a
 * search of the entry's chunks sorted by offsets finds it. Memory: the
 * entries, and 24 bytes an entry; nothing a chunk.
 *
 * Afterwards the model serves its chunks as sets read back an entry at a
 * time (model.c's bounded cache): to the catalog storing it (open.c), or to
 * any reader when the catalog could not take it. The entries are the
 * in-memory store's. The scratch files are unlinked from the start (in the
 * catalog's folder: never the checkpoint's) and go with the model.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "store.h"

#define BOX_BUFFER (1u << 20)   /* box and log writes, batched */
#define SLOT_WINDOW (64u << 20) /* of the slot file, assembled in memory a pass */

typedef struct spill_entry {
    uint64_t boxes;            /* offset of the entry's boxes in the box file */
    uint64_t first;            /* how many chunks the entries before it have */
    uint32_t used;             /* slots written */
    uint32_t spilled;
} spill_entry;

/* A blob's slot: where it lies, then the chunk's offsets (ndim values). */
typedef struct spill_slot {
    uint32_t file, transforms;
    uint64_t offset, length;
} spill_slot;

/* A log record: an item's slot, where it goes in the slot file, and its length. */
typedef struct spill_logrec {
    uint64_t dest;
    uint32_t len, pad;
} spill_logrec;

/* A file written in order through a buffer. */
typedef struct spill_out {
    int fd;
    unsigned char *buf;
    size_t buffered;
    uint64_t end;              /* bytes written and buffered */
} spill_out;

struct dcpi_spill {
    spill_out box, log;
    int slotfd;
    spill_entry *e;            /* per entry index */
    size_t ecap;
    uint64_t nchunks;
    int refused;               /* the spill could not take this parse: dcp_open parses in memory */
};

static int scratch_file(const char *dir, dcp_error *err)
{
    int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd >= 0)
        return fd;
    char tmpl[PATH_MAX];   /* a file system without O_TMPFILE */
    if (snprintf(tmpl, sizeof tmpl, "%s/.dcp-spill-XXXXXX", dir) >= (int)sizeof tmpl)
        return dcpi_err(err, ENAMETOOLONG, "%s: path too long for a scratch file", dir);
    if ((fd = mkostemp(tmpl, O_CLOEXEC)) < 0)
        return dcpi_err(err, errno, "%s: cannot make a scratch file: %s", dir, strerror(errno));
    unlink(tmpl);
    return fd;
}

static void spill_free(struct dcpi_spill *s)
{
    if (!s)
        return;
    if (s->box.fd >= 0)
        close(s->box.fd);
    if (s->log.fd >= 0)
        close(s->log.fd);
    if (s->slotfd >= 0)
        close(s->slotfd);
    free(s->box.buf);
    free(s->log.buf);
    free(s->e);
    free(s);
}

int dcpi_spill_begin(dcp_checkpoint *ck, const char *dir, dcp_error *err)
{
    struct dcpi_spill *s = calloc(1, sizeof *s);
    if (!s)
        return dcpi_err(err, ENOMEM, "%s: out of memory", ck->path);
    s->box.fd = s->log.fd = s->slotfd = -1;
    if (!(s->box.buf = malloc(BOX_BUFFER)) || !(s->log.buf = malloc(BOX_BUFFER))) {
        spill_free(s);
        return dcpi_err(err, ENOMEM, "%s: out of memory", ck->path);
    }
    if ((s->box.fd = scratch_file(dir, err)) < 0 || (s->log.fd = scratch_file(dir, err)) < 0 ||
        (s->slotfd = scratch_file(dir, err)) < 0) {
        spill_free(s);
        return -1;
    }
    ck->spill = s;
    ck->store = &dcpi_store_spill;
    return 0;
}

static int write_full(int fd, const void *p, size_t n, uint64_t off, const dcp_checkpoint *ck, dcp_error *err)
{
    const unsigned char *c = p;
    while (n) {
        ssize_t w = pwrite(fd, c, n, (off_t)off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return dcpi_err(err, w < 0 ? errno : EIO, "%s: writing the scratch file of a large model: %s", ck->path,
                            w < 0 ? strerror(errno) : "short write");
        c += w;
        n -= (size_t)w;
        off += (uint64_t)w;
    }
    return 0;
}

static int read_full(int fd, void *p, size_t n, uint64_t off, const dcp_checkpoint *ck, const char *key,
                     dcp_error *err)
{
    unsigned char *c = p;
    while (n) {
        ssize_t r = pread(fd, c, n, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return dcpi_err(err, r < 0 ? errno : EIO, "%s: %s: reading the scratch file of a large model: %s",
                            ck->path, key, r < 0 ? strerror(errno) : "short read");
        c += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

static int flush(const dcp_checkpoint *ck, spill_out *o, dcp_error *err)
{
    if (!o->buffered)
        return 0;
    int rc = write_full(o->fd, o->buf, o->buffered, o->end - o->buffered, ck, err);
    o->buffered = 0;
    return rc;
}

static int put(const dcp_checkpoint *ck, spill_out *o, const void *p, size_t n, dcp_error *err)
{
    const unsigned char *c = p;
    while (n) {
        if (o->buffered == BOX_BUFFER && flush(ck, o, err) < 0)
            return -1;
        size_t k = BOX_BUFFER - o->buffered < n ? BOX_BUFFER - o->buffered : n;
        memcpy(o->buf + o->buffered, c, k);
        o->buffered += k;
        o->end += k;
        c += k;
        n -= k;
    }
    return 0;
}

static int add_entry(dcp_checkpoint *ck, size_t idx, dcp_error *err)
{
    struct dcpi_spill *s = ck->spill;
    const dcp_entry *e = &ck->entries[idx];
    struct dcpi_entry_priv *p = &ck->priv[idx];
    size_t n = e->nchunks, nd = (size_t)e->ndim;
    if (idx >= s->ecap) {
        size_t cap = s->ecap ? s->ecap : 1024;
        while (cap <= idx)
            cap *= 2;
        spill_entry *ne = realloc(s->e, cap * sizeof *ne);
        if (!ne)
            return dcpi_err(err, ENOMEM, "%s: out of memory", ck->path);
        memset(ne + s->ecap, 0, (cap - s->ecap) * sizeof *ne);
        s->e = ne;
        s->ecap = cap;
    }
    spill_entry *se = &s->e[idx];
    if (se->spilled)   /* a key listed twice: only the in-memory parse merges */
        return dcpi_err(err, ENOTSUP, "%s: %s: listed twice in the metadata", ck->path, e->key);
    if (n > UINT32_MAX || s->nchunks + n < s->nchunks)
        return dcpi_err(err, EOVERFLOW, "%s: %s: too many chunks", ck->path, e->key);
    se->boxes = s->box.end;
    se->first = s->nchunks;
    se->spilled = 1;
    for (size_t c = 0; c < n; c++)
        if (put(ck, &s->box, p->chunks[c].offsets, nd * sizeof(int64_t), err) < 0 ||
            put(ck, &s->box, p->chunks[c].sizes, nd * sizeof(int64_t), err) < 0)
            return -1;
    s->nchunks += n;
    free(p->chunks);   /* (their boxes: the loader rewinds its arena) */
    p->chunks = NULL;
    p->chunk_cap = 0;
    return 0;
}

/* Where entry se's slots begin: each chunk before it has one of
 * sizeof(spill_slot) bytes and 8 a dimension, 16 a dimension in the box
 * file, so the offset follows from the two counts. */
static uint64_t slots_at(const spill_entry *se) { return se->first * sizeof(spill_slot) + se->boxes / 2; }

static int add_blob(dcp_checkpoint *ck, size_t idx, const int64_t *off, int nd, const dcp_blob *b, dcp_error *err)
{
    struct dcpi_spill *s = ck->spill;
    const dcp_entry *e = &ck->entries[idx];
    if (idx >= s->ecap || !s->e[idx].spilled || nd != e->ndim || !e->nchunks)
        return 0;   /* a box no chunk has: unused */
    spill_entry *se = &s->e[idx];
    if (se->used == e->nchunks)   /* more items than chunks: only hostile files */
        return dcpi_err(err, ENOTSUP, "%s: %s: more storage items than chunks", ck->path, e->key);
    spill_slot sl = {.file = b->file, .transforms = b->transforms, .offset = b->offset, .length = b->length};
    size_t len = sizeof sl + (size_t)nd * sizeof *off;
    spill_logrec lr = {.dest = slots_at(se) + se->used * len, .len = (uint32_t)len};
    if (put(ck, &s->log, &lr, sizeof lr, err) < 0 || put(ck, &s->log, &sl, sizeof sl, err) < 0 ||
        put(ck, &s->log, off, (size_t)nd * sizeof *off, err) < 0)
        return -1;
    se->used++;
    return 0;
}

/* The log into the slot file: a pass over the log a window of the slot
 * file, each window assembled in memory and written at once. */
static int sort_log(dcp_checkpoint *ck, dcp_error *err)
{
    struct dcpi_spill *s = ck->spill;
    uint64_t total = s->nchunks * sizeof(spill_slot) + s->box.end / 2;   /* the slot file's size */
    size_t wsize = total < SLOT_WINDOW ? (size_t)total : SLOT_WINDOW;
    unsigned char *win = malloc(wsize ? wsize : 1), *in = s->log.buf;   /* (the log is flushed) */
    if (!win)
        return dcpi_err(err, ENOMEM, "%s: out of memory", ck->path);
    int rc = 0;
    for (uint64_t w = 0; rc == 0 && w < total; w += wsize) {
        uint64_t wend = total - w < wsize ? total : w + wsize;
        memset(win, 0, (size_t)(wend - w));
        size_t have = 0, at = 0;   /* bytes in `in`, and the next record's place */
        uint64_t pos = 0;          /* of in[0] in the log */
        while (rc == 0) {
            if (have - at < sizeof(spill_logrec) + sizeof(spill_slot) + DCPI_MAX_NDIM * sizeof(int64_t) &&
                pos + have < s->log.end) {   /* refill: keep the tail, read on */
                memmove(in, in + at, have - at);
                pos += at;
                have -= at;
                at = 0;
                size_t want = BOX_BUFFER - have;
                if (want > s->log.end - pos - have)
                    want = (size_t)(s->log.end - pos - have);
                if ((rc = read_full(s->log.fd, in + have, want, pos + have, ck, "(slots)", err)) < 0)
                    break;
                have += want;
            }
            if (at == have)
                break;
            spill_logrec lr;
            if (have - at < sizeof lr) {
                rc = dcpi_err(err, EIO, "%s: a damaged scratch file", ck->path);
                break;
            }
            memcpy(&lr, in + at, sizeof lr);
            if (lr.len > have - at - sizeof lr || lr.dest > total || lr.len > total - lr.dest) {
                rc = dcpi_err(err, EIO, "%s: a damaged scratch file", ck->path);
                break;
            }
            if (lr.dest >= w && lr.dest + lr.len <= wend)
                memcpy(win + (lr.dest - w), in + at + sizeof lr, lr.len);
            at += sizeof lr + lr.len;
        }
        if (rc == 0)
            rc = write_full(s->slotfd, win, (size_t)(wend - w), w, ck, err);
    }
    free(win);
    return rc;
}

/* Every failure of the spill's own (a scratch file, memory, what only the
 * in-memory parse can take) marks the parse refused; the checkpoint's own
 * errors (a damaged pickle, a chunk outside its tensor) are the same in
 * memory, so dcp_open reports those without parsing again. */
int dcpi_spill_entry(dcp_checkpoint *ck, size_t idx, dcp_error *err)
{
    int rc = add_entry(ck, idx, err);
    ck->spill->refused |= rc < 0;
    return rc;
}

int dcpi_spill_blob(dcp_checkpoint *ck, size_t idx, const int64_t *off, int nd, const dcp_blob *b, dcp_error *err)
{
    int rc = add_blob(ck, idx, off, nd, b, err);
    ck->spill->refused |= rc < 0;
    return rc;
}

void dcpi_spill_refuse(dcp_checkpoint *ck)
{
    if (ck->spill)
        ck->spill->refused = 1;
}

int dcpi_spill_refused(const dcp_checkpoint *ck)
{
    return ck->spill && ck->spill->refused;
}

int dcpi_spill_finish(dcp_checkpoint *ck, dcp_error *err)
{
    struct dcpi_spill *s = ck->spill;
    s->refused = 1;   /* (until it has finished) */
    if (flush(ck, &s->box, err) < 0 || flush(ck, &s->log, err) < 0 || sort_log(ck, err) < 0)
        return -1;
    close(s->log.fd);   /* what the parse needed and reading back does not */
    s->log.fd = -1;
    free(s->box.buf);
    free(s->log.buf);
    s->box.buf = s->log.buf = NULL;
    s->refused = 0;
    return 0;
}

static int by_offsets(const void *a, const void *b, void *arg)
{
    const dcpi_chunkset *set = ((void **)arg)[0];
    int nd = *(const int *)((void **)arg)[1];
    return dcpi_box_cmp(set->chunks[*(const uint32_t *)a].offsets, set->chunks[*(const uint32_t *)b].offsets, nd);
}

/* The chunk of set (n chunks) at offsets off, or SIZE_MAX; *order is made
 * on first use (n indexes sorted by offsets). */
static size_t chunk_at(dcpi_chunkset *set, size_t n, size_t nd, const int64_t *off, uint32_t **order)
{
    if (!*order) {
        if (!(*order = malloc(n * sizeof **order)))
            return SIZE_MAX - 1;
        for (size_t i = 0; i < n; i++)
            (*order)[i] = (uint32_t)i;
        int ndim = (int)nd;
        void *arg[2] = {set, &ndim};
        qsort_r(*order, n, sizeof **order, by_offsets, arg);
    }
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (dcpi_box_cmp(set->chunks[(*order)[mid]].offsets, off, (int)nd) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && !dcpi_box_cmp(set->chunks[(*order)[lo]].offsets, off, (int)nd) ? (*order)[lo] : SIZE_MAX;
}

/* The store's chunks: entry idx's boxes and slots, read back and matched. */
static int spill_chunks(dcp_checkpoint *ck, size_t idx, dcpi_chunkset **out, dcp_error *err)
{
    struct dcpi_spill *s = ck->spill;
    const dcp_entry *e = &ck->entries[idx];
    size_t n = e->nchunks, nd = (size_t)e->ndim;
    *out = NULL;
    if (idx >= s->ecap || !s->e[idx].spilled)
        return dcpi_err(err, EIO, "%s: %s: the chunks of a large model were not kept", ck->path, e->key);
    const spill_entry *se = &s->e[idx];
    size_t len = sizeof(spill_slot) + nd * sizeof(int64_t), used = se->used;
    dcpi_chunkset *set = dcpi_chunkset_new(idx, n, nd);
    unsigned char *slots = malloc(used ? used * len : 1);
    uint32_t *order = NULL;
    if (!set || !slots) {
        free(set);
        free(slots);
        return dcpi_err(err, ENOMEM, "%s: %s: out of memory", ck->path, e->key);
    }
    int64_t *dims = (int64_t *)(set->records + n);
    int rc = read_full(s->box.fd, dims, 2 * n * nd * sizeof *dims, se->boxes, ck, e->key, err);
    if (rc == 0)
        rc = read_full(s->slotfd, slots, used * len, slots_at(se), ck, e->key, err);
    for (size_t c = 0; c < n; c++) {
        set->chunks[c].offsets = dims + 2 * c * nd;
        set->chunks[c].sizes = set->chunks[c].offsets + nd;
    }
    for (size_t k = 0; rc == 0 && k < used; k++) {
        spill_slot sl;
        const int64_t *off = (const int64_t *)(slots + k * len + sizeof sl);
        memcpy(&sl, slots + k * len, sizeof sl);
        size_t c = !dcpi_box_cmp(set->chunks[k].offsets, off, (int)nd) ? k : chunk_at(set, n, nd, off, &order);
        if (c == SIZE_MAX - 1)
            rc = dcpi_err(err, ENOMEM, "%s: %s: out of memory", ck->path, e->key);
        else if (c == SIZE_MAX || set->chunks[c].has_blob)
            continue;   /* a box no chunk has, or a second blob for one: the first wins */
        else if (sl.file >= ck->nfiles)
            rc = dcpi_err(err, EIO, "%s: %s: a damaged scratch file", ck->path, e->key);
        else {
            set->chunks[c].blob =
                (dcp_blob){.file = sl.file, .transforms = sl.transforms, .offset = sl.offset, .length = sl.length};
            set->chunks[c].has_blob = 1;
        }
    }
    free(order);
    free(slots);
    if (rc < 0) {
        free(set);
        return -1;
    }
    *out = set;
    return 0;
}
static void spill_close(dcp_checkpoint *ck)
{
    spill_free(ck->spill);
    ck->spill = NULL;
}

const dcpi_store dcpi_store_spill = {
    .name = "spill",
    .all = dcpi_mem_all,
    .find = dcpi_mem_find,
    .chunks = spill_chunks,
    .drop = NULL,
    .close = spill_close,
};
