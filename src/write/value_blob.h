/* A plain value of a torch.save file as a DCP bytes item holds it
 * (value_blob.c). Not installed. */
#ifndef DCP_VALUE_BLOB_H
#define DCP_VALUE_BLOB_H

#include <stddef.h>
#include <stdint.h>

#include "dcp.h"

struct pk_node;

/* torch.save(v) in memory, as DCP's writer stores a non-tensor value: a
 * zip archive whose data.pkl pickles v (protocol 2). v is a value the
 * pickle reader parsed: None, bool, int, float, str, bytes, and tuples,
 * lists and dicts of them. 0 with the malloc'd archive in *out; 1 when v
 * holds anything else (an object torch.load would rebuild: left out); 2
 * when its pickle would pass max bytes; -1 with err. key names the value
 * in errors. */
int dcpw_value_blob(const char *key, const struct pk_node *v, uint64_t max, unsigned char **out, size_t *len,
                    dcp_error *err);

#endif
