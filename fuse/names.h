/* dcpfs: how state-dict keys become paths, and back.
 *
 * A key is split on '.' into components; each component becomes one path
 * component, encoded so that every key has exactly one path and every path
 * decodes to exactly one key:
 *   - '%' is written "%25" and '/' is written "%2F" (so a component is never
 *     a path separator and '%' always starts an escape);
 *   - an empty component (the key "a..b", ".a" or "a.") is written "%";
 *   - components never contain '.', so "." and ".." cannot occur, and no
 *     encoded component contains '.': names with a '.' are free for suffixes;
 *   - when a key is both a file and a prefix of other keys ("a.b" beside
 *     "a.b.c"), "a/b" is the directory and the file is "a/b.data"
 *     (DFS_COLLIDE_SUFFIX);
 *   - with -o view=npy every tensor file is NAME.npy (which never collides
 *     with a directory); bytes items keep their name.
 * A component longer than NAME_MAX once encoded cannot be shown; the daemon
 * logs and skips that key.
 */
#ifndef DCPFS_NAMES_H
#define DCPFS_NAMES_H

#include <stddef.h>

#define DFS_COLLIDE_SUFFIX ".data"
#define DFS_NPY_SUFFIX ".npy"
#define DFS_NAME_MAX 255

/* Encode the key component comp[0..len) into out (outlen bytes with room for
 * the NUL). Returns the encoded length, or -1 when it does not fit. */
int dfs_name_encode(const char *comp, size_t len, char *out, size_t outlen);

/* Decode one encoded component (without any suffix) into out. Returns the
 * decoded length, or -1 for a name that no key component encodes to. */
int dfs_name_decode(const char *name, char *out, size_t outlen);

#endif
