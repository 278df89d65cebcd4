/* One torch.save or safetensors file read as a checkpoint (single_file.c):
 * what dcp_open_file gives, and what dcp convert's single-file sources use,
 * with the hooks convert needs to keep the values' nesting. Not installed. */
#ifndef DCP_SINGLE_FILE_H
#define DCP_SINGLE_FILE_H

#include <stddef.h>

#include "dcp.h"
#include "dcp_write.h"   /* dcp_path_part */

/* What convert needs to know of a torch.save file's values. Every hook may
 * be NULL (dcp_open_file). */
typedef struct dcpi_torch_hooks {
    /* The dict keys and list indexes leading to each value kept (n >= 1). 0,
     * or -1 on out of memory. */
    int (*path)(void *ctx, const char *key, size_t klen, const dcp_path_part *parts, size_t n);
    /* Each value left out, with why. */
    void (*skipped)(void *ctx, const char *key, const char *why);
    void *ctx;
} dcpi_torch_hooks;

/* Open the torch.save file at path: tensors, and non-tensor values as bytes
 * items (in place, or pickled and held in memory). *nskipped (may be NULL):
 * the values left out. */
int dcpi_open_torch_file(const char *path, const dcpi_torch_hooks *hooks, dcp_checkpoint **out, size_t *nskipped,
                         dcp_error *err);

#endif
