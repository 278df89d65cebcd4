/* The CRC-32s of torch.save records: every chunk and bytes item of a DCP
 * shard is a torch.save archive, whose zip records each carry the CRC-32
 * of their data (torch's save.compute_crc32, on by default; 0 when off).
 * Neither torch.load nor the readers here check them; dcp verify --crc
 * does, so that a changed byte is found without recorded digests or an
 * integrity.json. Blobs that are not archives (safetensors, or broken: the
 * structure check names those) are skipped. Reads only. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "integrity.h"
#include "write/zip_write.h"
#include "zip.h"

#define PIECE (4u << 20)
#define PROGRESS_STEP (64u << 20)

struct crc_pass {
    dcp_checkpoint *ck;
    dcp_problem_fn fn;
    void *ctx;
    dcp_progress_fn progress;
    void *pctx;
    uint64_t done, total, last;
    uint64_t *checked, *nocrc, *nproblems;
    unsigned char *buf;
};

__attribute__((format(printf, 2, 3)))
static void report(struct crc_pass *p, const char *fmt, ...)
{
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ++*p->nproblems;
    if (p->fn)
        p->fn(p->ctx, msg);
}

static void advance(struct crc_pass *p, uint64_t n)
{
    p->done += n;
    if (p->progress && p->done - p->last >= PROGRESS_STEP) {
        p->last = p->done;
        p->progress(p->pctx, p->done, p->total);
    }
}

/* Every record of blob b (of entry key), when it is an archive. */
static void check_blob(struct crc_pass *p, const dcp_blob *b, const char *key)
{
    dcp_checkpoint *ck = p->ck;
    uint64_t size, len;
    dcp_error e;
    dcpi_zip z;
    /* a file missing or too short: the structure check names it */
    if (dcpi_ck_file_size(ck, b->file, &size, &e) < 0 || b->offset > size || b->length > size - b->offset ||
        dcpi_blob_size(ck, b, &len, key, &e) < 0 || dcpi_zip_open(ck, b, key, &z, &e) < 0)
        return;
    uint64_t claimed = 0;   /* records that overlap would read the same bytes over and over */
    for (size_t i = 0; i < z.n; i++) {
        const dcpi_zip_entry *ze = &z.entries[i];
        if (ze->size > len - claimed) {
            report(p, "%s/%s: %s%storch.save archive at offset %" PRIu64 ": its records hold more bytes than "
                      "the archive (%" PRIu64 "): they overlap, not checked further",
                   ck->path, ck->files[b->file], key, *key ? ": " : "", b->offset, len);
            break;
        }
        claimed += ze->size;
        char name[512];
        dcp_key_text(ze->name, name, sizeof name);
        uint64_t data;
        if (dcpi_zip_data(ck, b, key, ze, len, &data, &e) < 0) {
            report(p, "%s: record %s", e.msg, name);
            continue;
        }
        if (ze->size && !ze->crc) {   /* saved with compute_crc32=False */
            ++*p->nocrc;
            continue;
        }
        uint32_t crc = 0;
        int ok = 1;
        for (uint64_t off = 0; off < ze->size && ok; off += PIECE) {
            size_t n = ze->size - off < PIECE ? (size_t)(ze->size - off) : PIECE;
            if (dcpi_blob_read(ck, b, p->buf, n, data + off, key, &e) < 0) {
                report(p, "%s: record %s", e.msg, name);
                ok = 0;
                break;
            }
            crc = zw_crc32(crc, p->buf, n);
            advance(p, n);
        }
        if (!ok)
            continue;
        ++*p->checked;
        if (crc != ze->crc)
            report(p, "%s/%s: %s%srecord %s of the torch.save archive at offset %" PRIu64 ": CRC-32 %08" PRIx32
                      ", the archive records %08" PRIx32, ck->path, ck->files[b->file], key, *key ? ": " : "", name,
                   b->offset, crc, ze->crc);
    }
    dcpi_zip_close(&z);
}

static int same_blob(const dcp_blob *a, const dcp_blob *b)
{
    return a->file == b->file && a->offset == b->offset && a->length == b->length && a->transforms == b->transforms;
}

int dcp_verify_crc(dcp_checkpoint *ck, dcp_problem_fn fn, void *ctx, dcp_progress_fn progress, void *pctx,
                   uint64_t *checked, uint64_t *nocrc, uint64_t *nproblems, dcp_error *err)
{
    *checked = *nocrc = *nproblems = 0;
    struct crc_pass p = {ck, fn, ctx, progress, pctx, 0, 0, 0, checked, nocrc, nproblems, malloc(PIECE)};
    if (!p.buf)
        return dcpi_err(err, ENOMEM, "%s: out of memory", ck->path);
    uint64_t size;
    dcp_error e;
    if (dcpi_ck_is_file(ck) && dcpi_ck_file_size(ck, 0, &size, &e) == 0) {
        /* a torch.save file: one archive, its records those of every tensor and of data.pkl */
        dcp_blob whole = {.file = 0, .offset = 0, .length = size};
        p.total = size;
        if (progress)
            progress(pctx, 0, p.total);
        check_blob(&p, &whole, "");
        if (progress)
            progress(pctx, p.done, p.done);
        free(p.buf);
        return 0;
    }
    size_t nentries = dcp_num_entries(ck);
    for (int pass = 0; pass < 2; pass++) {   /* the total first, for the progress */
        if (pass == 1 && progress)
            progress(pctx, 0, p.total);
        for (size_t i = 0; i < nentries; i++) {
            const dcp_entry *e;
            const dcp_chunk *c;
            if (dcp_get_entry(ck, i, &e, err) < 0)
                goto fail;
            if (e->kind == DCP_KIND_BYTES) {
                if (e->has_blob && !(e->blob.transforms & DCP_TRANSFORM_MEMORY)) {
                    if (pass)
                        check_blob(&p, &e->blob, e->key);
                    else
                        p.total += e->blob.length;
                }
                continue;
            }
            if (dcp_entry_chunks(ck, e, &c, err) < 0)
                goto fail;
            const dcp_blob *prev = NULL;   /* safetensors chunks share their file's blob */
            for (size_t j = 0; j < e->nchunks; j++) {
                if (!c[j].has_blob || (c[j].blob.transforms & DCP_TRANSFORM_MEMORY) ||
                    (prev && same_blob(prev, &c[j].blob)))
                    continue;
                prev = &c[j].blob;
                if (pass)
                    check_blob(&p, &c[j].blob, e->key);
                else
                    p.total += c[j].blob.length;
            }
            dcp_release_chunks(ck, e);
        }
    }
    if (progress)
        progress(pctx, p.done, p.done);
    free(p.buf);
    return 0;
fail:
    free(p.buf);
    return -1;
}
