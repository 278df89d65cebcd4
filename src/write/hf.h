/* The Hugging Face export (dcp_export.h), one layout in three files:
 * hf_plan.c maps a checkpoint's keys through a recipe (recipe.c) to output
 * tensors and lays the folder out (dcp_hf_view_build: file names, sizes,
 * headers, where each output's bytes lie); hf_view.c renders any byte
 * range of any of those files from the source (dcp_hf_view_read);
 * hf_export.c writes every file's bytes as hf_view.c renders them
 * (dcp_export_hf). dcpfs serves the same view (-o view=hf:NAME), so a mount
 * and an export are the same bytes by construction. */
#ifndef DCP_WRITE_HF_H
#define DCP_WRITE_HF_H

#include <stdint.h>

#include "dcp_export.h"
#include "internal.h"
#include "recipe.h"

/* An output tensor: a view of one source tensor (leading dimensions fixed
 * at `base`, then rows through a row map). */
typedef struct hf_out {
    char *key;
    const char *from;                /* the source key (errors) */
    const dcp_entry *entry;
    uint64_t base;                   /* element of the source image where the unstacked view starts */
    int64_t rows;                    /* mapped source rows: output dim 0 (1 for a 0-d output) unless transposed */
    uint64_t row_elems;              /* elements per row */
    rcp_rowmap maps[2];
    int nmaps;
    int transpose;                   /* the output is [row_elems, rows]: the row-mapped source transposed */
    dcp_dtype in, out;
    int ndim;
    int64_t shape[DCPI_MAX_NDIM];
    uint64_t nbytes;
    uint64_t at;                     /* offset of its first byte in its shard file */
} hf_out;

/* A file of the folder: `head` (a safetensors header, or the whole of a JSON
 * file) then outputs [first, first + count) back to back. */
typedef struct hf_file {
    char name[64];
    unsigned char *head;
    uint64_t head_len;
    size_t first, count;
} hf_file;

struct dcp_hf_view {
    dcp_checkpoint *ck;              /* borrowed: open while the view lives */
    char *srcp;                      /* the source as named in errors */
    hf_out *outs;                    /* sorted by key; a shard's outputs are adjacent */
    size_t nouts;
    uint64_t total;                  /* bytes of every output tensor */
    hf_file *files;
    dcp_hf_file *pub;                /* names and sizes, as dcp_hf_view_files gives them */
    size_t nfiles;
};

/* dcp_hf_view_build with the source named srcp in errors. */
int hf_view_build(dcp_checkpoint *ck, const char *srcp, const dcp_export_options *opt, dcp_hf_view **out,
                  dcp_error *err);

/* n elements of floating-point dtype in at src to dtype out at dst. */
void hf_cast(dcp_dtype in, const void *src, dcp_dtype out, void *dst, size_t n);
int hf_is_float(dcp_dtype d);

#endif
