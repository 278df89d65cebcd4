/* Small helpers of the loader: error messages and a clock. */
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
