/* model.safetensors.index.json of a Hugging Face folder: its weight_map
 * names every tensor and the shard file that holds it. The folder is read
 * from the shards themselves (safetensors.c); the index is what says that
 * none is missing — a shard lost in a copy would otherwise just make its
 * tensors vanish from the model. Checked once the shards are read: every
 * file the map names is one of the folder's shards, every key it names is
 * in the model. Keys the map leaves out are kept (loaders ignore the map
 * for them too).
 *
 * The index is hostile input like the rest: bounded in size before it is
 * read, file names taken only as plain names of *.safetensors files in the
 * same folder.
 */
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define INDEX_NAME "model.safetensors.index.json"
/* A 405B-parameter model's index is about 100 KiB; 64 MiB is far beyond any. */
#define INDEX_MAX (64u << 20)

static int plain_shard_name(const char *s)
{
    size_t n = strlen(s);
    return n > 12 && n < 256 && !strchr(s, '/') && s[0] != '.' && !strcmp(s + n - 12, ".safetensors");
}

static int listed(const char *name, const char *sub, char *const *files, size_t nfiles)
{
    size_t skip = strcmp(sub, ".") ? strlen(sub) + 1 : 0;
    for (size_t i = 0; i < nfiles; i++)
        if (!strcmp(files[i] + skip, name))
            return 1;
    return 0;
}

/* Read the index beside the shards (sub is "." or the subfolder they are
 * in) into *root; 0 with *root NULL when there is none. */
static int read_index(dcp_checkpoint *ck, const char *sub, json_t **root, char *what, size_t whatlen,
                      dcp_error *err)
{
    *root = NULL;
    char rel[512];
    if ((size_t)snprintf(rel, sizeof rel, "%s/%s", sub, INDEX_NAME) >= sizeof rel)
        return dcpi_err(err, ENAMETOOLONG, "%s/%s: path too long", ck->path, sub);
    snprintf(what, whatlen, "%s/%s", ck->path, strcmp(sub, ".") ? rel : INDEX_NAME);
    return dcpi_read_json(ck, rel, what, INDEX_MAX, "any index", root, err);
}

int dcpi_hf_index_check(dcp_checkpoint *ck, const char *sub, char *const *files, size_t nfiles, dcp_error *err)
{
    char what[4096];
    json_t *root;
    if (read_index(ck, sub, &root, what, sizeof what, err) < 0)
        return -1;
    if (!root)
        return 0;
    int rc = 0;
    json_t *map = json_object_get(root, "weight_map");
    if (!json_is_object(map))
        rc = dcpi_err(err, EIO, "%s: no \"weight_map\" object", what);
    const char *key;
    json_t *v;
    if (rc == 0) {
        json_object_foreach(map, key, v) {
            const char *file = json_string_value(v);
            if (!file || !plain_shard_name(file)) {
                rc = dcpi_err(err, EIO, "%s: %s: the file it names is not the plain name of a .safetensors file",
                              what, key);
                break;
            }
            if (!listed(file, sub, files, nfiles)) {
                rc = dcpi_err(err, ENOENT, "%s: %s: its shard %s is missing from the folder", what, key, file);
                break;
            }
            if (!dcp_find(ck, key)) {
                rc = dcpi_err(err, EIO, "%s: %s: listed (in %s) but no shard holds it", what, key, file);
                break;
            }
        }
    }
    json_decref(root);
    return rc;
}
