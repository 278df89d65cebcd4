/* Megatron-Core's metadata.json: the CheckpointingConfig its
 * dist_checkpointing writes last into a checkpoint folder,
 *   {"sharded_backend": "torch_dist", "sharded_backend_version": 1,
 *    "common_backend": "torch", "common_backend_version": 1}
 * Only the torch_dist backend stores DCP files (a .metadata and .distcp
 * shards); zarr or tensorstore store tensors in ways dcpfs does not read,
 * and saying so beats "not a checkpoint". Where a .metadata is there, it is
 * read whatever the config says (a backend named later may write DCP too).
 * A file that does not parse, or names no backend, changes nothing: the
 * DCP files beside it are what is read, and Megatron's own loader is the
 * one that needs the config.
 *
 * Hostile input: bounded before it is read, parsed by jansson.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

/* The config is four short fields; 1 MiB leaves room for any future ones. */
#define CONFIG_MAX (1u << 20)

int dcpi_megatron_config(dcp_checkpoint *ck, dcp_error *err)
{
    struct stat md;
    int has_metadata = fstatat(ck->dirfd, ".metadata", &md, 0) == 0;
    int fd = openat(ck->dirfd, "metadata.json", O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return 0;
    struct stat st;
    char *buf = NULL;
    size_t got = 0;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size <= CONFIG_MAX &&
        (buf = malloc((size_t)st.st_size + 1))) {
        while (got < (size_t)st.st_size) {
            ssize_t r = pread(fd, buf + got, (size_t)st.st_size - got, (off_t)got);
            if (r <= 0)
                break;
            got += (size_t)r;
        }
    }
    close(fd);
    if (!buf)
        return 0;
    json_error_t je;
    json_t *root = json_loadb(buf, got, 0, &je);
    free(buf);
    const char *backend = json_string_value(json_object_get(root, "sharded_backend"));
    int rc = 0;
    if (backend) {
        ck->info.megatron = 1;
        if (strcmp(backend, "torch_dist") != 0 && !has_metadata)
            rc = dcpi_err(err, ENOTSUP,
                          "%s/metadata.json: a Megatron-Core checkpoint in the \"%.64s\" backend: dcpfs reads "
                          "the torch_dist backend only (Megatron's --ckpt-format torch_dist)",
                          ck->path, backend);
    }
    json_decref(root);
    return rc;
}
