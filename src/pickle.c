/* STUB: replaced by the pickle reader. */
#include <errno.h>
#include <string.h>
#include "internal.h"
#include "pickle.h"
int pk_parse(const void *data, size_t len, const char *what, pk_doc **doc, const pk_node **root, dcp_error *err)
{ (void)data; (void)len; *doc = NULL; *root = NULL; return dcpi_err(err, ENOSYS, "%s: pickle reader not implemented", what); }
void pk_free(pk_doc *doc) { (void)doc; }
