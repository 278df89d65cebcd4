/* Reading a caller's options struct that can grow (dcp.h, options): the
 * rules every call taking one applies, the same way, in libdcp and in
 * libdcpload (a header of its own, inline, because libdcpload sees none of
 * libdcp's internal symbols). Not installed. */
#ifndef DCP_SIZED_OPTS_H
#define DCP_SIZED_OPTS_H

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "dcp.h"

/* The size of a struct's first sized layout, which ends at field `last`:
 * the least a caller may pass. Stays when fields are added after it. */
#define DCPI_OPTS_MIN(type, last) (offsetof(type, last) + sizeof(((type *)0)->last))

/* Copy the caller's struct at src (its first field `size_t size`) into dst,
 * a struct of `known` bytes this library was built with, zeroed first so
 * that fields past the caller's size take their defaults; dst's size is set
 * to known. min is the size of the first sized layout. 0, or -1 with err
 * naming call: EINVAL when the size is below min (0: not made by its
 * initialiser), E2BIG when the caller's struct is longer than known and a
 * byte this library does not know is set (a field it would ignore). */
static inline int dcpi_sized_opts(void *dst, size_t known, size_t min, const void *src, const char *call,
                                  const char *init, dcp_error *err)
{
    size_t size;
    memset(dst, 0, known);
    memcpy(&size, src, sizeof size);
    if (size < min) {
        if (err) {
            err->code = EINVAL;
            snprintf(err->msg, sizeof err->msg,
                     "%s: options size %zu is below %zu (initialise the struct with %s)", call, size, min, init);
        }
        return -1;
    }
    for (size_t i = known; i < size; i++)
        if (((const unsigned char *)src)[i]) {
            if (err) {
                err->code = E2BIG;
                snprintf(err->msg, sizeof err->msg,
                         "%s: options of %zu bytes set byte %zu, past the %zu this library knows (a newer "
                         "field it would ignore)", call, size, i, known);
            }
            return -1;
        }
    memcpy(dst, src, size < known ? size : known);
    memcpy(dst, &known, sizeof known);
    return 0;
}

#endif
