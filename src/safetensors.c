/* STUB: replaced by the safetensors / Hugging Face reader. */
#include <errno.h>
#include "internal.h"
int dcpi_load_huggingface(dcp_checkpoint *ck, dcp_error *err)
{ return dcpi_err(err, ENOSYS, "%s: safetensors layout not implemented", ck->path); }
