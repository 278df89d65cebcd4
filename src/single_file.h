/* One torch.save or safetensors file read as a checkpoint (single_file.c):
 * what dcp_open_file gives, and what dcp convert's single-file sources use,
 * with the hooks convert needs to keep non-tensor values. Not installed. */
#ifndef DCP_SINGLE_FILE_H
#define DCP_SINGLE_FILE_H

#include <stddef.h>

#include "dcp.h"

struct pk_node;

/* One dict key on the way from the file's top-level dict to a value. */
typedef struct dcpi_key_part {
    const char *str;
    size_t len;
} dcpi_key_part;

/* What a torch.save file's non-tensor values become. With every hook NULL
 * (dcp_open_file) they are left out and counted. */
typedef struct dcpi_torch_hooks {
    /* A value that is neither a tensor nor a bytes object holding a
     * torch.save blob (which is kept as a bytes item as it is): its
     * torch.save blob, malloc'd, in *data (0); 1 to leave it out (not plain
     * data); -1 with err. NULL: such values are left out. */
    int (*blob)(void *ctx, const char *key, const struct pk_node *v, unsigned char **data, size_t *len,
                dcp_error *err);
    /* The dict keys leading to each value kept (n >= 1). 0, or -1 on out of memory. */
    int (*path)(void *ctx, const char *key, size_t klen, const dcpi_key_part *parts, size_t n);
    /* Each value left out, with why. */
    void (*skipped)(void *ctx, const char *key, const char *why);
    void *ctx;
} dcpi_torch_hooks;

/* The bytes of a bytes item made from a value (no file range holds them). */
typedef struct dcpi_side_bytes {
    size_t entry;
    unsigned char *data;
    size_t len;
} dcpi_side_bytes;

/* Open the torch.save file at path. With hooks->blob, bytes items are made
 * and their bytes handed over in *side (*nside of them; free with
 * dcpi_side_bytes_free); side may be NULL otherwise. *nskipped (may be
 * NULL): the values left out. */
int dcpi_open_torch_file(const char *path, const dcpi_torch_hooks *hooks, dcp_checkpoint **out,
                         dcpi_side_bytes **side, size_t *nside, size_t *nskipped, dcp_error *err);
void dcpi_side_bytes_free(dcpi_side_bytes *s, size_t n);

/* A bytes object as a pickle holds it: BINBYTES, or protocol 2's
 * _codecs.encode('<latin-1 text>', 'latin1'). 0 with a malloc'd copy of
 * its bytes; 1 when n is not one; -1 out of memory. */
int dcpi_pickled_bytes(const struct pk_node *n, unsigned char **out, size_t *len);

#endif
