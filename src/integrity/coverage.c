/* Structural verification: chunks tile each tensor exactly once, records lie
 * inside their blobs and files, every shard file is there and long enough. */
#include <errno.h>
#include <stdint.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcp_integrity.h"
#include "internal.h"

typedef struct report {
    dcp_problem_fn fn;
    void *ctx;
    uint64_t n;
} report;

__attribute__((format(printf, 2, 3)))
static void problem(report *r, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    r->n++;
    if (r->fn)
        r->fn(r->ctx, msg);
}

/* Blobs past the end of their file: a file cut short puts every blob after
 * the cut there, thousands of lines for one problem. The first one of each
 * file is kept and reported at the end with a count of the others. */
typedef struct past_end {
    char **first;       /* per file: the first blob's message, NULL when none */
    uint64_t *count;    /* per file */
} past_end;

__attribute__((format(printf, 3, 4)))
static void note_past_end(past_end *p, size_t file, const char *fmt, ...)
{
    if (p->count[file]++)
        return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    p->first[file] = strdup(msg);   /* NULL (no memory): the count alone is reported */
}

static void report_past_end(past_end *p, const dcp_checkpoint *ck, report *r)
{
    for (size_t f = 0; f < ck->nfiles; f++) {
        if (!p->count[f])
            continue;
        if (p->count[f] == 1 && p->first[f])
            problem(r, "%s", p->first[f]);
        else if (p->first[f])
            problem(r, "%s (and %llu more chunks or bytes items of the file)", p->first[f],
                    (unsigned long long)(p->count[f] - 1));
        else
            problem(r, "%s/%s: %llu chunks or bytes items end past the file", ck->path, ck->files[f],
                    (unsigned long long)p->count[f]);
        free(p->first[f]);
    }
}

/* "0:4,8:2": each dimension's start and count, as the loader's messages say them */
static void box_text(const dcp_entry *e, const dcp_chunk *c, char *buf, size_t n)
{
    size_t used = 0;
    buf[0] = 0;
    for (int d = 0; d < e->ndim && used + 48 < n; d++)
        used += (size_t)snprintf(buf + used, n - used, "%s%lld:%lld", d ? "," : "", (long long)c->offsets[d],
                                 (long long)c->sizes[d]);
}

struct named {
    const dcp_checkpoint *ck;
    const dcp_entry *e;
    const dcp_chunk *chunks;
    report *r;
    unsigned n;
};

/* A problem line for an overlapping pair; the first 16 are enough. */
static int name_overlap(void *ctx, size_t i, size_t j)
{
    struct named *x = ctx;
    char a[256], b[256];
    box_text(x->e, &x->chunks[i], a, sizeof a);
    box_text(x->e, &x->chunks[j], b, sizeof b);
    problem(x->r, "%s: %s: chunks [%s] and [%s] (start:count) overlap", x->ck->path, x->e->key, a, b);
    return ++x->n >= 16;
}

/* Chunks must be pairwise disjoint and their volumes must add up to numel.
 * An intact tensor is confirmed by dcpi_chunks_tile in linear time; only a broken
 * one is swept (along the dimension with the most distinct chunk starts) to
 * name the overlapping pairs. */
static int check_tiling(const dcp_checkpoint *ck, const dcp_entry *e, const dcp_chunk *chunks, report *r)
{
    uint64_t numel = dcp_entry_numel(e), vol = 0;
    size_t n = e->nchunks;
    for (size_t i = 0; i < n; i++) {
        uint64_t v = 0;
        dcpi_shape_numel(e->ndim, chunks[i].sizes, &v);   /* <= numel: chunks lie inside the tensor */
        vol += v;
    }
    if (e->ndim == 0) {
        if (n == 0)
            problem(r, "%s: %s: no chunk holds this 0-d tensor", ck->path, e->key);
        else if (n > 1)
            problem(r, "%s: %s: %zu chunks overlap (a 0-d tensor has one)", ck->path, e->key, n);
        return 0;
    }
    size_t *idx = malloc((n ? n : 1) * sizeof *idx);
    if (!idx)
        return -1;
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t v = 0;
        dcpi_shape_numel(e->ndim, chunks[i].sizes, &v);
        if (v)
            idx[m++] = i;
    }
    int exact = vol == numel ? dcpi_chunks_tile(e, chunks, idx, m) : 0;
    if (exact != 0) {
        free(idx);
        return exact < 0 ? -1 : 0;
    }
    /* Not an exact tiling: name the overlaps (the first 16). */
    struct named nm = {ck, e, chunks, r, 0};
    int64_t found = dcpi_chunk_overlaps(e, chunks, idx, m, name_overlap, &nm);
    uint64_t overlaps_found = found > 0 ? (uint64_t)found : 0;
    free(idx);
    if (!overlaps_found && vol < numel)
        problem(r, "%s: %s: chunks cover %llu of %llu elements (a gap)", ck->path, e->key,
                (unsigned long long)vol, (unsigned long long)numel);
    else if (!overlaps_found && vol > numel)
        problem(r, "%s: %s: chunks cover %llu elements, the tensor has %llu (overlap)", ck->path, e->key,
                (unsigned long long)vol, (unsigned long long)numel);
    return 0;
}

int dcp_verify_structure(dcp_checkpoint *ck, dcp_problem_fn fn, void *ctx, uint64_t *nproblems, dcp_error *err)
{
    report r = {fn, ctx, 0};
    char *missing = calloc(ck->nfiles ? ck->nfiles : 1, 1);
    uint64_t *sizes = calloc(ck->nfiles ? ck->nfiles : 1, sizeof *sizes);
    past_end past = {calloc(ck->nfiles ? ck->nfiles : 1, sizeof *past.first),
                     calloc(ck->nfiles ? ck->nfiles : 1, sizeof *past.count)};
    int rc = -1;
    if (!missing || !sizes || !past.first || !past.count) {
        dcpi_err(err, ENOMEM, "%s: out of memory", ck->path);
        goto out;
    }
    for (size_t f = 0; f < ck->nfiles; f++) {
        dcp_error fe;
        if (dcpi_ck_file_size(ck, (uint32_t)f, &sizes[f], &fe) < 0) {
            missing[f] = 1;
            problem(&r, "%s", fe.msg);   /* names the file and why ("the data file is missing") */
        }
    }
    for (size_t i = 0; i < dcp_num_entries(ck); i++) {
        const dcp_entry *e;
        const dcp_chunk *chunks;
        if (dcp_get_entry(ck, i, &e, err) < 0)
            goto out;
        if (e->kind == DCP_KIND_BYTES) {
            if (!e->has_blob)
                problem(&r, "%s: %s: no storage entry for this bytes item", ck->path, e->key);
            else if (!(e->blob.transforms & DCP_TRANSFORM_MEMORY) && !missing[e->blob.file] &&
                     e->blob.offset + e->blob.length > sizes[e->blob.file])
                note_past_end(&past, e->blob.file, "%s/%s: %s: blob at offset %llu length %llu ends past the file (%llu bytes)", ck->path,
                        ck->files[e->blob.file], e->key, (unsigned long long)e->blob.offset,
                        (unsigned long long)e->blob.length, (unsigned long long)sizes[e->blob.file]);
            continue;
        }
        if (dcp_entry_chunks(ck, e, &chunks, err) < 0)
            goto out;
        if (check_tiling(ck, e, chunks, &r) < 0) {
            dcp_release_chunks(ck, e);
            dcpi_err(err, ENOMEM, "%s: out of memory", ck->path);
            goto out;
        }
        for (size_t c = 0; c < e->nchunks; c++) {
            const dcp_chunk *ch = &chunks[c];
            char box[256];
            box_text(e, ch, box, sizeof box);
            if (!ch->has_blob) {
                problem(&r, "%s: %s: chunk [%s] (start:count) has no storage entry", ck->path, e->key, box);
                continue;
            }
            if (missing[ch->blob.file])
                continue;
            if (ch->blob.offset + ch->blob.length > sizes[ch->blob.file]) {
                note_past_end(&past, ch->blob.file, "%s/%s: %s: chunk [%s] (start:count) at offset %llu length %llu ends past the file (%llu bytes)",
                        ck->path, ck->files[ch->blob.file], e->key, box, (unsigned long long)ch->blob.offset,
                        (unsigned long long)ch->blob.length, (unsigned long long)sizes[ch->blob.file]);
                continue;
            }
            /* from the shard itself: a served model's records may come from the catalog */
            dcp_record rec;
            const dcp_record *rp;
            int64_t stride[DCPI_MAX_NDIM];
            dcp_error re;
            /* ENOTSUP: a tensor libdcp does not read (an NF4 weight, a
             * quantized tensor); its archive and data.pkl are intact */
            if ((ck->lazy ? dcpi_locate_record(ck, e, ch, c, &rec, stride, &re) < 0
                          : dcp_chunk_record(ck, e, c, &rp, &re) < 0) && re.code != ENOTSUP)
                problem(&r, "%s", re.msg);
        }
        dcp_release_chunks(ck, e);
    }
    report_past_end(&past, ck, &r);
    *nproblems = r.n;
    rc = 0;
out:
    if (rc < 0 && past.first && past.count)
        for (size_t f = 0; f < ck->nfiles; f++)
            free(past.first[f]);
    free(past.first);
    free(past.count);
    free(missing);
    free(sizes);
    return rc;
}
