/* libdcp's single files: one torch.save (.pt) or safetensors file read as
 * a checkpoint (dcp_open_file), and a checkpoint read as one virtual
 * safetensors file (dcp_st_view_*, what dcpfs serves as model.safetensors).
 * Read side: nothing here writes. Errors as in dcp.h. dcp_write.h includes
 * this header, so programs that found these calls there still compile. */
#ifndef DCP_FILE_H
#define DCP_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "dcp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- formats */

typedef enum dcp_format {
    DCP_FORMAT_AUTO = 0,
    DCP_FORMAT_DCP,             /* a checkpoint folder */
    DCP_FORMAT_TORCH_SAVE,      /* .pt / .pth */
    DCP_FORMAT_SAFETENSORS      /* .safetensors file, or a folder of shards + model.safetensors.index.json */
} dcp_format;

/* The format a path names: an existing folder, or a path with neither a
 * .pt/.pth nor a .safetensors suffix, is DCP; a folder holding
 * model.safetensors.index.json (or only *.safetensors) is SAFETENSORS. */
dcp_format dcp_format_guess(const char *path);
const char *dcp_format_name(dcp_format f);

/* ---------------------------------------------------------------- one file as a checkpoint */

/* Open a single torch.save (.pt) or safetensors file as a checkpoint, read
 * with the dcp.h planner and reader. Non-tensor values of a torch.save file
 * other than bytes objects holding torch.save blobs are left out (counted in
 * *nskipped when given). */
int dcp_open_file(const char *path, dcp_format fmt, dcp_checkpoint **out, size_t *nskipped, dcp_error *err);

/* ---------------------------------------------------------------- a checkpoint as one file */

/* A checkpoint's tensors seen as one safetensors file, for serving without
 * materialising it: the header bytes, and where each tensor's bytes lie. */
typedef struct dcp_st_view_tensor {
    const dcp_entry *entry;
    uint64_t offset;            /* of its first byte in the virtual file */
    uint64_t length;
} dcp_st_view_tensor;

typedef struct dcp_st_view {
    unsigned char *header;      /* 8-byte little-endian length + JSON, space-padded */
    uint64_t header_len;        /* bytes of header = offset of the first tensor byte */
    dcp_st_view_tensor *tensors;     /* ascending offsets, contiguous */
    size_t ntensors;
    uint64_t size;              /* the whole virtual file */
    const dcp_entry **skipped;  /* what safetensors cannot hold: bytes items, tensors of a dtype
                                   it has no name for, "__metadata__", names not UTF-8 */
    size_t nskipped;
} dcp_st_view;

/* Why a safetensors file cannot hold entry e, or NULL when it can: a bytes
 * item, a dtype the format has no name for, the reserved "__metadata__", a
 * name that is not UTF-8 (the format's JSON and its readers take UTF-8 text
 * only). The writers and this view leave such entries out. Since DCP_0.2. */
const char *dcp_st_refusal(const dcp_entry *e);

/* Lay out the entries `select` accepts (all when NULL), in metadata order;
 * what safetensors cannot hold is left out (listed in skipped) before
 * `select` sees it. */
int dcp_st_view_build(dcp_checkpoint *ck, int (*select)(void *ctx, const dcp_entry *e), void *sctx,
                        dcp_st_view **out, dcp_error *err);
void dcp_st_view_free(dcp_st_view *l);
/* The index of the first of n tensors (ascending, contiguous offsets) whose
 * bytes reach past off; n when none does. For servers that answer a read of
 * the virtual file their own way (dcpfs splices the pieces). */
size_t dcp_st_view_find(const dcp_st_view_tensor *t, size_t n, uint64_t off);
/* Bytes [off, off+len) of the virtual file into buf (clamped at its end;
 * *got = bytes produced). Any alignment; thread-safe given one plan per thread. */
int dcp_st_view_read(dcp_checkpoint *ck, const dcp_st_view *l, uint64_t off, void *buf, size_t len,
                       size_t *got, dcp_plan *plan, dcp_error *err);

#ifdef __cplusplus
}
#endif
#endif /* DCP_FILE_H */
