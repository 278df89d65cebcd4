/* torch.save archives: find records through the central directory (local
 * headers carry zero sizes), resolving zip64 fields. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "pickle.h"
#include "zip.h"

#define CD_MAX_ENTRIES 1000000u
#define CD_MAX_BYTES (64u << 20)

static uint64_t le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* key "": a whole file (dcp_open_file), named by its path alone */
static int bad(dcp_checkpoint *ck, const dcp_blob *b, const char *key, const char *why, dcp_error *err)
{
    return dcpi_err(err, EIO, "%s/%s: %s%scorrupt torch.save archive at offset %llu: %s", ck->path,
                    ck->files[b->file], key, *key ? ": " : "", (unsigned long long)b->offset, why);
}

int dcpi_zip_open(dcp_checkpoint *ck, const dcp_blob *b, const char *key, dcpi_zip *z, dcp_error *err)
{
    memset(z, 0, sizeof *z);
    uint64_t len;
    if (dcpi_blob_size(ck, b, &len, key, err) < 0)
        return -1;
    if (len < 22)
        return bad(ck, b, key, "too short for a zip archive", err);
    /* torch writes no comment, so the EOCD is the last 22 bytes; allow a short comment. */
    unsigned char tail[22 + 1024 + 20];
    size_t tl = len < sizeof tail ? (size_t)len : sizeof tail;
    if (dcpi_blob_read(ck, b, tail, tl, len - tl, key, err) < 0)
        return -1;
    ssize_t eocd = -1;
    for (ssize_t i = (ssize_t)tl - 22; i >= 0; i--)   /* its comment must end the blob */
        if (!memcmp(tail + i, "PK\5\6", 4) && (size_t)i + 22 + le(tail + i + 20, 2) == tl) {
            eocd = i;
            break;
        }
    if (eocd < 0)
        return bad(ck, b, key, "no end-of-central-directory record", err);
    uint64_t count = le(tail + eocd + 10, 2), cd_size = le(tail + eocd + 12, 4), cd_off = le(tail + eocd + 16, 4);
    uint64_t eocd_abs = len - tl + (uint64_t)eocd;
    if (eocd >= 20 && !memcmp(tail + eocd - 20, "PK\6\7", 4)) {
        uint64_t z64 = le(tail + eocd - 20 + 8, 8);
        unsigned char r[56];
        if (z64 > len || len - z64 < sizeof r)
            return bad(ck, b, key, "zip64 end record outside the archive", err);
        if (dcpi_blob_read(ck, b, r, sizeof r, z64, key, err) < 0)
            return -1;
        if (memcmp(r, "PK\6\6", 4))
            return bad(ck, b, key, "bad zip64 end record", err);
        count = le(r + 32, 8);
        cd_size = le(r + 40, 8);
        cd_off = le(r + 48, 8);
        eocd_abs = z64;
    }
    if (count == 0 || count > CD_MAX_ENTRIES || cd_size > CD_MAX_BYTES || cd_off > eocd_abs ||
        cd_size > eocd_abs - cd_off || cd_size < count * 46)
        return bad(ck, b, key, "central directory size or offset out of range", err);
    unsigned char *cd = malloc(cd_size);
    z->entries = calloc(count, sizeof *z->entries);
    z->names = malloc(cd_size);   /* names are shorter than the directory that holds them */
    if (!cd || !z->entries || !z->names) {
        free(cd);
        dcpi_zip_close(z);
        return dcpi_err(err, ENOMEM, "%s: %s: out of memory", ck->path, key);
    }
    if (dcpi_blob_read(ck, b, cd, cd_size, cd_off, key, err) < 0) {
        free(cd);
        dcpi_zip_close(z);
        return -1;
    }
    size_t pos = 0, npos = 0;
    const char *why = NULL;
    for (uint64_t i = 0; i < count && !why; i++) {
        if (cd_size - pos < 46 || memcmp(cd + pos, "PK\1\2", 4)) {
            why = "bad central directory entry";
            break;
        }
        const unsigned char *h = cd + pos;
        dcpi_zip_entry *e = &z->entries[i];
        uint64_t nl = le(h + 28, 2), xl = le(h + 30, 2), cl = le(h + 32, 2);
        if (cd_size - pos - 46 < nl + xl + cl) {
            why = "central directory entry runs past the directory";
            break;
        }
        e->flags = (uint16_t)le(h + 8, 2);
        e->method = (uint16_t)le(h + 10, 2);
        e->crc = (uint32_t)le(h + 16, 4);
        uint64_t csize = le(h + 20, 4), usize = le(h + 24, 4), loff = le(h + 42, 4);
        /* zip64 extra: only the fields that were 0xFFFFFFFF, in order usize, csize, offset. */
        const unsigned char *x = h + 46 + nl, *xe = x + xl;
        while (xe - x >= 4) {
            uint64_t id = le(x, 2), sz = le(x + 2, 2);
            if ((uint64_t)(xe - x - 4) < sz)
                break;
            if (id == 1) {
                const unsigned char *f = x + 4, *fe = f + sz;
                if (usize == 0xffffffffu && fe - f >= 8) { usize = le(f, 8); f += 8; }
                if (csize == 0xffffffffu && fe - f >= 8) { csize = le(f, 8); f += 8; }
                if (loff == 0xffffffffu && fe - f >= 8) { loff = le(f, 8); f += 8; }
            }
            x += 4 + sz;
        }
        if (e->method != 0)
            why = "compressed record (torch.save stores records uncompressed)";
        else if (e->flags & 1)
            why = "encrypted record";
        else if (csize != usize)
            why = "stored record with different compressed and uncompressed sizes";
        else if (loff >= len || usize > len)
            why = "record outside the archive";
        e->size = usize;
        e->local_offset = loff;
        memcpy(z->names + npos, h + 46, nl);
        z->names[npos + nl] = 0;
        e->name = z->names + npos;
        e->name_len = nl;
        npos += nl + 1;
        pos += 46 + nl + xl + cl;
        z->n++;
    }
    free(cd);
    if (why) {
        dcpi_zip_close(z);
        return bad(ck, b, key, why, err);
    }
    const char *slash = memchr(z->entries[0].name, '/', z->entries[0].name_len);
    z->root_len = slash ? (size_t)(slash - z->entries[0].name) + 1 : 0;
    return 0;
}

void dcpi_zip_close(dcpi_zip *z)
{
    free(z->entries);
    free(z->names);
    memset(z, 0, sizeof *z);
}

const dcpi_zip_entry *dcpi_zip_find(const dcpi_zip *z, const char *name)
{
    size_t nl = strlen(name);
    for (size_t i = 0; i < z->n; i++) {
        const dcpi_zip_entry *e = &z->entries[i];
        if (e->name_len == z->root_len + nl && !memcmp(e->name, z->entries[0].name, z->root_len) &&
            !memcmp(e->name + z->root_len, name, nl))
            return e;
    }
    return NULL;
}

int dcpi_zip_data(dcp_checkpoint *ck, const dcp_blob *b, const char *key, const dcpi_zip_entry *ze,
                  uint64_t blob_len, uint64_t *data_offset, dcp_error *err)
{
    unsigned char h[30];
    if (ze->local_offset > blob_len || blob_len - ze->local_offset < sizeof h)
        return bad(ck, b, key, "local header outside the archive", err);
    if (dcpi_blob_read(ck, b, h, sizeof h, ze->local_offset, key, err) < 0)
        return -1;
    if (memcmp(h, "PK\3\4", 4))
        return bad(ck, b, key, "bad local header signature", err);
    uint64_t start = ze->local_offset + 30 + le(h + 26, 2) + le(h + 28, 2);
    if (start > blob_len || blob_len - start < ze->size)
        return bad(ck, b, key, "record data runs past the archive", err);
    *data_offset = start;
    return 0;
}

int dcpi_zip_pickle(dcp_checkpoint *ck, const dcp_blob *b, const char *key, uint64_t max, char **buf,
                    struct pk_doc **doc, const struct pk_node **root, dcp_error *err)
{
    dcpi_zip z;
    const dcpi_zip_entry *ze = NULL;
    uint64_t len, off;
    *buf = NULL;
    *doc = NULL;
    int rc = dcpi_blob_size(ck, b, &len, key, err);
    if (rc == 0)
        rc = dcpi_zip_open(ck, b, key, &z, err);
    if (rc < 0)
        return -1;
    if (!(ze = dcpi_zip_find(&z, "data.pkl")))
        rc = bad(ck, b, key, "no data.pkl record", err);
    else if (ze->size > max)
        rc = bad(ck, b, key, "data.pkl is too large", err);
    if (rc == 0)
        rc = dcpi_zip_data(ck, b, key, ze, len, &off, err);
    if (rc == 0 && !(*buf = malloc(ze->size ? (size_t)ze->size : 1)))
        rc = dcpi_err(err, ENOMEM, "%s: %s: out of memory", ck->path, key);
    if (rc == 0)
        rc = dcpi_blob_read(ck, b, *buf, (size_t)ze->size, off, key, err);
    if (rc == 0)
        rc = pk_parse(*buf, (size_t)ze->size, key, doc, root, err);
    if (rc < 0) {
        free(*buf);
        *buf = NULL;
    }
    dcpi_zip_close(&z);
    return rc;
}
