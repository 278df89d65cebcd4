/* libdcp export recipes: a training checkpoint (DCP, Megatron-Core
 * torch_dist, a torch.save or safetensors file) written as a Hugging Face
 * model folder that transformers' from_pretrained loads: keys renamed and
 * tensors reshaped on the fly by a recipe (a JSON table per model family,
 * dcp-recipe(5)), cast to one dtype, in safetensors shards with
 * model.safetensors.index.json and a config.json.
 *
 * Streaming like dcp_convert_files (dcp_write.h): a split or a rotary
 * permutation reads its source rows through the planner a few MiB at a time,
 * so memory is bounded by the number of keys, never by the tensors' bytes.
 * The folder appears only when complete (temporary name, fsync, a rename
 * that never replaces). The same folder can be served without writing it
 * (dcp_hf_view_*, below; dcpfs -o view=hf:NAME): the export writes what the
 * view renders. Errors as in dcp.h. */
#ifndef DCP_EXPORT_H
#define DCP_EXPORT_H

#include <stdint.h>

#include "dcp.h"
#include "dcp_write.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
    DCP_EXPORT_ALLOW_UNMAPPED = 1u << 0,   /* keys no rule maps are left out (each reported to
                                              `skipped`), not an error */
    DCP_EXPORT_NO_SYNC = 1u << 1,          /* no fsync of the files and folder */
    DCP_EXPORT_RANK = 1u << 2              /* since 0.2: a rank-local checkpoint folder read as rank
                                              dcp_export_options.rank's view (DCP_OPEN_RANK) */
};

typedef struct dcp_export_options {
    size_t size;                /* sizeof(dcp_export_options): DCP_EXPORT_OPTIONS_INIT (dcp.h, options) */
    const char *recipe;         /* a recipe name (NAME.json looked up in recipe_dirs, then in the
                                   installed $(pkgdatadir)/recipes), or a path to a recipe file
                                   (one with a '/' or ending in .json) */
    const char *recipe_dirs;    /* ':'-separated folders searched first; may be NULL */
    const char *config;         /* a Hugging Face config.json: the recipe's parameters
                                   (num_attention_heads, ...) are read from it and it is copied
                                   as is; NULL: written from the recipe's template, when the
                                   checkpoint says enough */
    dcp_dtype dtype;            /* floating-point tensors cast to this (float32, float16,
                                   bfloat16; round to nearest even); DCP_DTYPE_INVALID: kept */
    uint64_t max_shard_size;    /* bytes per safetensors shard; 0: 5 GB (Hugging Face's default) */
    const char *keys;           /* only source keys dcp_key_matches selects; NULL: all */
    unsigned flags;             /* DCP_EXPORT_* */
    dcp_progress_fn progress;
    void *progress_ctx;
    dcp_skip_fn skipped;        /* each source key left out, with why (the recipe ignores it,
                                   no rule maps it with DCP_EXPORT_ALLOW_UNMAPPED) */
    void *skipped_ctx;
    volatile sig_atomic_t *cancel;   /* since 0.2 (appended): as dcp_convert_options' (dcp_write.h) */
    unsigned rank;              /* since 0.2 (appended): with DCP_EXPORT_RANK, the R of __R.metadata */
} dcp_export_options;
#define DCP_EXPORT_OPTIONS_INIT {.size = sizeof(dcp_export_options)}

/* Export src (a checkpoint folder or a single .pt/.safetensors file) to the
 * folder dst, which must not exist. A source key that no rule maps and the
 * recipe does not ignore is an error (ENOENT, naming the key) unless
 * DCP_EXPORT_ALLOW_UNMAPPED; a rule whose parameters neither the config nor
 * the recipe give is EINVAL naming the parameter. */
int dcp_export_hf(const char *src, const char *dst, const dcp_export_options *opt, dcp_error *err);

/* Load and check what an export needs before any checkpoint is read: the
 * recipe (parsed and checked), --config (a JSON object) and the dtype. The
 * errors dcp_export_hf would give for them. */
int dcp_export_check(const dcp_export_options *opt, dcp_error *err);

/* ------------------------------------------------- the export as a view
 *
 * The folder dcp_export_hf writes, laid out without writing it: its files'
 * names and sizes, and any byte range of any of them rendered on demand
 * from the checkpoint (dcpfs -o view=hf:NAME serves a mount of it).
 * dcp_export_hf writes exactly these bytes: there is one layout. */

typedef struct dcp_hf_file {
    const char *name;           /* "config.json", "model.safetensors" (one shard) or
                                   "model.safetensors.index.json" and "model-0000I-of-0000N.safetensors" */
    uint64_t size;
} dcp_hf_file;

typedef struct dcp_hf_view dcp_hf_view;

/* Map ck's keys through opt's recipe and lay the folder out (keys and
 * shapes only; no tensor data is read). The errors of dcp_export_hf (an
 * unmapped key, a missing parameter, ...), naming dcp_path(ck). ck must stay
 * open while the view lives; opt's progress callback is not used. */
int dcp_hf_view_build(dcp_checkpoint *ck, const dcp_export_options *opt, dcp_hf_view **out, dcp_error *err);
/* The files, *n of them, in the view's order; valid while the view lives. */
const dcp_hf_file *dcp_hf_view_files(const dcp_hf_view *v, size_t *n);
/* Bytes [off, off + len) of file `file` into buf, clamped at its end (*got:
 * the bytes given; 0 at or past the end). Any offset and length: only the
 * rows of the outputs the range touches are read. plan (dcp_plan_init'ed)
 * and stage (stage_len bytes, used by casts and transposes: at least one
 * source element, 8 bytes; the more, the fewer reads) are the caller's, so
 * threads reading one view each bring their own. */
int dcp_hf_view_read(const dcp_hf_view *v, size_t file, uint64_t off, void *buf, size_t len, size_t *got,
                     dcp_plan *plan, void *stage, size_t stage_len, dcp_error *err);
void dcp_hf_view_free(dcp_hf_view *v);

#ifdef __cplusplus
}
#endif
#endif /* DCP_EXPORT_H */
