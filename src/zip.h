/* A reader for torch.save zip archives: the central directory of a blob
 * (a byte range of a shard file, or a decoded zstd blob), zip64-aware,
 * stored records only. Offsets are relative to the blob start. */
#ifndef DCP_ZIP_H
#define DCP_ZIP_H

#include <stddef.h>
#include <stdint.h>

#include "internal.h"

typedef struct dcpi_zip_entry {
    const char *name;        /* points into the zip's name buffer, NUL-terminated */
    size_t name_len;
    uint64_t local_offset;   /* local header, from the blob start */
    uint64_t size;           /* stored == uncompressed */
    uint32_t crc;            /* the central directory's CRC-32 of the data (0: none computed) */
    uint16_t method, flags;
} dcpi_zip_entry;

typedef struct dcpi_zip {
    dcpi_zip_entry *entries;
    size_t n;
    char *names;             /* all names, NUL-separated */
    size_t root_len;         /* length of "archive/" (text up to and including the first '/') */
} dcpi_zip;

/* Read the central directory of a blob of `len` bytes through dcpi_blob_read. */
int dcpi_zip_open(dcp_checkpoint *ck, const dcp_blob *b, const char *key, dcpi_zip *z, dcp_error *err);
void dcpi_zip_close(dcpi_zip *z);
/* Find "<root>/<name>"; NULL if absent. */
const dcpi_zip_entry *dcpi_zip_find(const dcpi_zip *z, const char *name);
/* Data start of a record (from its local header), checked to lie in the blob. */
int dcpi_zip_data(dcp_checkpoint *ck, const dcp_blob *b, const char *key, const dcpi_zip_entry *ze,
                  uint64_t blob_len, uint64_t *data_offset, dcp_error *err);
/* Parse the data.pkl record (at most max bytes) of a torch.save blob: *root
 * is owned by *doc, which points into *buf: the caller frees both (pk_free,
 * free); a failure leaves neither. */
struct pk_doc;
struct pk_node;
int dcpi_zip_pickle(dcp_checkpoint *ck, const dcp_blob *b, const char *key, uint64_t max, char **buf,
                    struct pk_doc **doc, const struct pk_node **root, dcp_error *err);

#endif
