/* The header of a safetensors file, as the safetensors package writes it:
 * 8-byte little-endian length N, N bytes of JSON {"__metadata__": {"format":
 * "pt"}, key: {"dtype", "shape", "data_offsets": [begin, end]}, ...} padded
 * with spaces to a multiple of 8; the data follows in item order with no
 * holes. One implementation for every writer and view of the format
 * (safetensors_writer.c, the Hugging Face export). */
#ifndef DCP_WRITE_ST_HEADER_H
#define DCP_WRITE_ST_HEADER_H

#include <stddef.h>
#include <stdint.h>

#include "dcp_write.h"

/* Header bytes for items (tensors only: anything else is EINVAL naming the
 * key, as are duplicate names and "__metadata__"); *out (malloc'd) holds
 * *out_len bytes, *data_len is the bytes of data that follow. what names the
 * file in errors. */
int dcpw_st_header(const dcp_item *items, size_t n, const char *what, unsigned char **out, uint64_t *out_len,
                   uint64_t *data_len, dcp_error *err);

#endif
