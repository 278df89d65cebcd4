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
 * that never replaces). Errors as in dcp.h. */
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
    DCP_EXPORT_NO_SYNC = 1u << 1           /* no fsync of the files and folder */
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
} dcp_export_options;
#define DCP_EXPORT_OPTIONS_INIT {.size = sizeof(dcp_export_options)}

/* Export src (a checkpoint folder or a single .pt/.safetensors file) to the
 * folder dst, which must not exist. A source key that no rule maps and the
 * recipe does not ignore is an error (ENOENT, naming the key) unless
 * DCP_EXPORT_ALLOW_UNMAPPED; a rule whose parameters neither the config nor
 * the recipe give is EINVAL naming the parameter. */
int dcp_export_hf(const char *src, const char *dst, const dcp_export_options *opt, dcp_error *err);

#ifdef __cplusplus
}
#endif
#endif /* DCP_EXPORT_H */
