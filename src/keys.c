/* Key selection shared by dcp ls/convert/cat, dcpload and the library's
 * users: one rule everywhere (dcp.h, dcp_key_matches). */
#include <fnmatch.h>
#include <string.h>

#include "dcp.h"

int dcp_key_matches(const char *pattern, const char *key)
{
    if (!pattern)
        return 1;
    if (fnmatch(pattern, key, 0) == 0)
        return 1;
    /* A pattern without wildcards is also a dotted prefix: "model" selects
     * "model.layer.weight" (torch's _load_state_dict_from_keys does the same). */
    size_t n = strlen(pattern);
    return n && strpbrk(pattern, "*?[\\") == NULL && strncmp(pattern, key, n) == 0 && key[n] == '.';
}
