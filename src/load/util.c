/* Small helpers of the loader: error messages, a clock, the checkpoint name. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "load.h"

int ldi_err(dcp_error *err, int code, const char *fmt, ...)
{
    if (!err)
        return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    err->code = code;
    return -1;
}

double ldi_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

const char *ldi_name(const dcp_checkpoint *ck)
{
    static _Thread_local char buf[4352];
    const dcp_info *in = dcp_get_info(ck);
    if (in && in->layout && !strcmp(in->layout, "single file") && dcp_num_files(ck) == 1) {
        snprintf(buf, sizeof buf, "%s/%s", dcp_path(ck), dcp_file_name(ck, 0));
        return buf;
    }
    return dcp_path(ck);
}
