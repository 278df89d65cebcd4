/* Reading safetensors headers (shared by the Hugging Face layout loader and
 * the converters). */
#ifndef DCP_SAFETENSORS_H
#define DCP_SAFETENSORS_H

#include <jansson.h>
#include <stdint.h>

#include "dcp.h"

#define DCPI_ST_HEADER_MAX (100u << 20)   /* safetensors' own limit */

/* Parse the header of the safetensors buffer at `offset` of fd (file size
 * fsize): *root is the JSON object (json_decref it), *data_start the absolute
 * offset of the byte buffer. `what` names the file in errors. */
int dcpi_st_header(int fd, uint64_t offset, uint64_t fsize, const char *what, json_t **root,
                   uint64_t *data_start, dcp_error *err);

/* Check one tensor entry of a header: a dtype libdcp knows, a shape of at
 * most DCPI_MAX_NDIM non-negative sizes (into size[], *nd), data_offsets
 * [b, e) inside the data_len bytes of the buffer with e - b = numel * dtype
 * size. *begin = b, *nbytes = e - b. 0, or -1 with *why set. */
int dcpi_st_entry(const json_t *t, uint64_t data_len, dcp_dtype *dt, int *nd, int64_t *size, uint64_t *begin,
                  uint64_t *nbytes, const char **why);

#endif
