/* Writing torch.save zip archives as PyTorch's PyTorchStreamWriter (miniz)
 * lays them out: records STORED, each record's data 64-byte aligned (relative
 * to the archive start) by an 'FB' padding extra field, sizes and CRC in a
 * data descriptor after the data, a zip64 end of central directory record and
 * locator before the classic one, always. Records are streamed: a tensor's
 * bytes pass through in bounded pieces.
 *
 * zw_out is the buffered output both writers use: small records are gathered
 * into large sequential writes, large pieces go straight to the file. */
#ifndef DCP_ZIP_WRITE_H
#define DCP_ZIP_WRITE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <unistd.h>

#include "dcp_write.h"
#include "internal.h"

#define ZW_ALIGN 64                 /* torch.utils.serialization.config.save.storage_alignment */

typedef struct zw_out {
    int fd;
    uint64_t pos;                  /* file offset of the next byte written */
    unsigned char *buf;            /* bytes not yet written, starting at pos - len */
    size_t len, cap;
    const char *what;              /* the file, for errors */
    int no_kernel_copy;            /* copy_file_range failed with EXDEV, ENOSYS...: read and write */
} zw_out;

/* Buffered writing to fd from file offset pos; fd < 0 builds the bytes in
 * memory (buf, len) instead, for small archives such as bytes items. */
int zw_out_init(zw_out *o, int fd, uint64_t pos, const char *what, dcp_error *err);
int zw_out_write(zw_out *o, const void *p, size_t n, dcp_error *err);
int zw_out_flush(zw_out *o, dcp_error *err);
void zw_out_free(zw_out *o);

typedef struct zw_entry {
    char *name;                    /* full name, "archive/data/0" */
    uint64_t offset;               /* local header, from the archive start */
    uint64_t size;
    uint32_t crc;
} zw_entry;

typedef struct zw {
    zw_out *out;
    uint64_t base;                 /* file offset of the archive start */
    char root[256];                /* "archive" */
    zw_entry *e;
    size_t n, cap;
    int open;                      /* a streamed record is open */
    uint64_t rec_size, rec_done;
    uint32_t rec_crc;
    uint64_t name_hash, crc_hash;  /* for .data/serialization_id */
    int no_crc;                    /* CRC-32s written as 0, as torch does with
                                      serialization config save.compute_crc32 = False */
} zw;

/* Start an archive at the output's current position. root: "archive" for a
 * stream (DCP blobs), the file name's stem for torch.save to a path. */
int zw_begin(zw *z, zw_out *out, const char *root, dcp_error *err);
/* A whole record from memory ("data.pkl", "byteorder", ...). */
int zw_record(zw *z, const char *name, const void *data, uint64_t size, dcp_error *err);
/* A streamed record of exactly `size` bytes: begin, data in pieces, end. */
int zw_record_begin(zw *z, const char *name, uint64_t size, dcp_error *err);
int zw_record_data(zw *z, const void *p, size_t n, dcp_error *err);
int zw_record_end(zw *z, dcp_error *err);
/* torch.save's leading records after data.pkl: .format_version "1",
 * .storage_alignment "64", byteorder "little". */
int zw_torch_prologue(zw *z, const void *pkl, size_t pkl_len, dcp_error *err);
/* version "3\n", .data/serialization_id, the central directory and the end
 * records. *len gets the archive's total length. */
int zw_finish(zw *z, uint64_t *len, dcp_error *err);
void zw_free(zw *z);

/* The zip CRC-32 (zlib's crc32 values), with libdeflate's PCLMULQDQ code when built with it. */
uint32_t zw_crc32(uint32_t crc, const void *p, size_t n);
/* copy_file_range, replaceable by the unit tests to exercise the fallbacks. */
extern ssize_t (*zw_copy_file_range)(int, loff_t *, int, loff_t *, size_t, unsigned);

/* Move len bytes of item `tag` from src to o: into the open record z, or raw
 * when z is NULL. Runs src->range reports as stored as is in a file (64 KiB
 * or more) are copied with copy_file_range when no CRC is wanted (falling
 * back to reading when the kernel cannot); the rest goes through src->fill
 * and piece (piece_len bytes, a multiple of 16). *done grows by len;
 * progress(pctx, *done, total) after each piece. */
int zw_pump(zw_out *o, zw *z, const dcp_source *src, uint64_t tag, uint64_t len, void *piece, size_t piece_len,
            uint64_t *done, uint64_t total, dcp_progress_fn progress, void *pctx, dcp_error *err);

#endif
