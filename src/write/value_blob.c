/* A torch.save file's plain values (an epoch, a learning rate, an
 * optimizer's param_groups) as DCP bytes items: each pickled again on its
 * own and wrapped as torch.save wraps one object, which is what DCP's
 * writer stores for a non-tensor value and what torch.load gives back. */
#include <errno.h>
#include <stdlib.h>

#include "value_blob.h"
#include "pickle_write.h"
#include "zip_write.h"

int dcpw_value_blob(const char *key, const struct pk_node *v, uint64_t max, unsigned char **out, size_t *len,
                    dcp_error *err)
{
    pw p;
    pw_init(&p, 2, -1, key);
    int r = pw_value(&p, v, max);
    if (r < 0) {
        pw_free(&p);
        return r == -2 ? 2 : 1;
    }
    zw_out o;
    zw z;
    int rc = pw_finish(&p, err);
    if (rc == 0 && (rc = zw_out_init(&o, -1, 0, key, err)) == 0) {
        zw_begin(&z, &o, "archive", err);
        rc = zw_torch_prologue(&z, p.buf, p.len, err);
        if (rc == 0)
            rc = zw_finish(&z, NULL, err);
        zw_free(&z);
        if (rc == 0) {
            *out = o.buf;
            *len = o.len;
        } else {
            zw_out_free(&o);
        }
    }
    pw_free(&p);
    return rc;
}
