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

#endif
