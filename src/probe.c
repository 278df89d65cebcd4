/* What a folder holds: a checkpoint, the start of one whose save did not
 * finish, or neither (dcp_probe_folder). A crashed or in-flight save leaves
 * files that look like a checkpoint's, and reading them would either fail
 * obscurely or, worse, succeed on half the data; this tells the three apart
 * from names alone (no file is opened), so a scanner of many step folders
 * can afford it on each one.
 *
 * What the writers do first and last (so what a cut-off save leaves):
 *   - torch.distributed.checkpoint's FileSystemWriter writes the shard files
 *     (__R_I.distcp) first, then the metadata as ".metadata.tmp" (rank-local:
 *     "__R.metadata.tmp") renamed to ".metadata" last;
 *   - Megatron-Core (torch_dist) writes common.pt, then the DCP files, then
 *     metadata.json last, in folders named iter_NNNNNNN;
 *   - Hugging Face's save_pretrained writes model-0000I-of-0000N.safetensors
 *     shards, then model.safetensors.index.json;
 *   - trainers that stage a save in a temporary folder and rename it when it
 *     is complete name it "tmp-" or "tmp_" and a step word (Hugging Face's
 *     Trainer: "tmp-checkpoint-N"), or "....tmp". The step word keeps
 *     Python's mkdtemp names ("tmp" and 8 of [a-z0-9_]) from counting: a
 *     complete checkpoint saved into one must still open.
 * Layer 1 of the core: it uses only util.c.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "probe.h"

static int ends_with(const char *s, size_t n, const char *suffix)
{
    size_t m = strlen(suffix);
    return n > m && memcmp(s + n - m, suffix, m) == 0;
}

/* "__R.metadata" or, with tmp, "__R.metadata.tmp" (R decimal). */
static int rank_metadata(const char *nm, size_t n, int tmp)
{
    const char *suffix = tmp ? ".metadata.tmp" : ".metadata";
    size_t m = strlen(suffix);
    if (n <= 2 + m || strncmp(nm, "__", 2) != 0 || !ends_with(nm, n, suffix))
        return 0;
    for (size_t i = 2; i < n - m; i++)
        if (!isdigit((unsigned char)nm[i]))
            return 0;
    return 1;
}

/* The last component of path, without trailing slashes, in buf. */
static const char *base_name(const char *path, char *buf, size_t len)
{
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        n--;
    size_t s = n;
    while (s > 0 && path[s - 1] != '/')
        s--;
    size_t k = n - s < len - 1 ? n - s : len - 1;
    memcpy(buf, path + s, k);
    buf[k] = '\0';
    return buf;
}

/* N of a "model-0000I-of-0000N.safetensors" shard name (what save_pretrained
 * and torch's HuggingFaceStorageWriter write beside model.safetensors.index.json),
 * else 0. Other names ("shard-1-model-1-of-2": a distributed save without
 * an index) are not judged. */
static unsigned long hf_shard_of(const char *nm, size_t n)
{
    const char *suffix = ".safetensors";
    size_t m = strlen(suffix), e = n - m, d = e;
    while (d > 0 && isdigit((unsigned char)nm[d - 1]))
        d--;
    /* "model-" I "-of-" N: I is at [6, d - 4), at least one digit */
    if (d == e || e - d > 9 || d < 11 || memcmp(nm + d - 4, "-of-", 4) != 0 || strncmp(nm, "model-", 6) != 0)
        return 0;
    for (size_t i = 6; i < d - 4; i++)
        if (!isdigit((unsigned char)nm[i]))
            return 0;
    unsigned long v = 0;
    for (size_t i = d; i < e; i++)
        v = v * 10 + (unsigned long)(nm[i] - '0');
    return v;
}

static int tmp_name(const char *b)
{
    static const char *const steps[] = {"checkpoint", "ckpt", "step", "global_step", "iter", "epoch"};
    size_t n = strlen(b);
    if (ends_with(b, n, ".tmp"))
        return 1;
    if (strncmp(b, "tmp-", 4) != 0 && strncmp(b, "tmp_", 4) != 0)
        return 0;
    for (size_t i = 0; i < sizeof steps / sizeof *steps; i++)
        if (strncmp(b + 4, steps[i], strlen(steps[i])) == 0)
            return 1;
    return 0;
}

int dcpi_probe_at(int dirfd, const char *path, dcp_folder_probe *out, dcp_error *err)
{
    memset(out, 0, sizeof *out);
    int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return dcpi_err(err, errno, "%s: cannot list the folder: %s", path, strerror(errno));
    DIR *d = fdopendir(fd);
    if (!d) {
        int e = errno;
        close(fd);
        return dcpi_err(err, e, "%s: cannot list the folder: %s", path, strerror(e));
    }
    unsigned distcp = 0, safetensors = 0, rank_local = 0, rank_tmp = 0, rank_files = 0;
    int metadata = 0, metadata_tmp = 0, megatron_json = 0, common_pt = 0, hf_index = 0;
    unsigned long hf_of = 0, hf_shards = 0;
    struct dirent *de;
    errno = 0;
    while ((de = readdir(d))) {
        const char *nm = de->d_name;
        size_t n = strlen(nm);
        if (!dcpi_dirent_regular(fd, de)) {
            /* a .metadata that is not a file (a folder, a FIFO, a link to a device) is
             * damage, not a save that did not finish: opening names it */
            metadata |= !strcmp(nm, ".metadata");
            errno = 0;
            continue;
        }
        if (!strcmp(nm, ".metadata"))
            metadata = 1;
        else if (!strcmp(nm, ".metadata.tmp"))
            metadata_tmp = 1;
        else if (!strcmp(nm, "metadata.json"))
            megatron_json = 1;
        else if (!strcmp(nm, "common.pt"))
            common_pt = 1;
        else if (ends_with(nm, n, ".distcp"))
            distcp++;
        else if (!strcmp(nm, "model.safetensors.index.json"))
            hf_index = 1;
        else if (ends_with(nm, n, ".safetensors")) {
            safetensors++;
            unsigned long of = hf_shard_of(nm, n);
            if (of) {
                hf_shards++;
                hf_of = of > hf_of ? of : hf_of;
            }
        }
        else if (rank_metadata(nm, n, 0))
            rank_local++;
        else if (rank_metadata(nm, n, 1))
            rank_tmp++;
        else if (ends_with(nm, n, "_0.pt") && dcp_is_rank_file(nm))
            rank_files++;   /* rank 0's file of torch-checkpointing or verl (rankfiles.c) */
        errno = 0;
    }
    int list_errno = errno;
    closedir(d);
    if (list_errno)
        return dcpi_err(err, list_errno, "%s: cannot list the folder: %s", path, strerror(list_errno));
    out->nshards = distcp + safetensors;

    char bbuf[256];
    const char *base = base_name(path, bbuf, sizeof bbuf);
    int dcp_data = distcp || metadata || metadata_tmp || rank_local || rank_tmp;
    int anything = dcp_data || safetensors || common_pt || rank_files;
    const char *s = out->nshards == 1 ? "" : "s";
    out->kind = DCP_FOLDER_PARTIAL;
    if (!anything) {
        out->kind = DCP_FOLDER_NOT_CHECKPOINT;
        snprintf(out->reason, sizeof out->reason, "no .metadata, __R.metadata or .safetensors files");
    } else if (metadata_tmp || rank_tmp) {
        snprintf(out->reason, sizeof out->reason,
                 "%u shard file%s, %s (the save was writing its metadata and did not finish)", out->nshards, s,
                 metadata_tmp ? (metadata ? ".metadata.tmp beside .metadata" : ".metadata.tmp, no .metadata")
                              : "__R.metadata.tmp files");
    } else if (distcp && !metadata && !rank_local) {
        snprintf(out->reason, sizeof out->reason, "%u shard file%s, no .metadata (the save did not finish)",
                 out->nshards, s);
    } else if (common_pt && !dcp_data && !safetensors && megatron_json) {
        /* metadata.json is written last: a finished save, in a backend that
         * stores no DCP files (zarr...; dcp_open names it) */
        out->kind = DCP_FOLDER_NOT_CHECKPOINT;
        snprintf(out->reason, sizeof out->reason,
                 "Megatron-Core common.pt and metadata.json but no .metadata or shard files (not the torch_dist backend)");
    } else if (common_pt && !dcp_data && !safetensors) {
        snprintf(out->reason, sizeof out->reason,
                 "common.pt but no shard files, no .metadata (a Megatron save that did not finish)");
    } else if (dcp_data && !megatron_json && common_pt) {
        /* dist_checkpointing writes common.pt before the shards and
         * metadata.json after them. Megatron-LM's fsdp_dtensor and
         * torch_dcp formats (torch's own save into iter_N: no common.pt, no
         * metadata.json) are complete with their .metadata, and so is a
         * torch_dist save of 0.19+ (its common state an item of the DCP) that
         * stopped after its .metadata: names cannot tell that one apart. */
        snprintf(out->reason, sizeof out->reason,
                 "%u shard file%s, no metadata.json (Megatron writes it last: the save did not finish)",
                 out->nshards, s);
    } else if (!dcp_data && hf_of > 1 && !hf_index) {
        snprintf(out->reason, sizeof out->reason,
                 "%lu of %lu shard files, no model.safetensors.index.json (it is written last: the save did not finish)",
                 hf_shards, hf_of);
    } else if (!dcp_data && hf_of > 1 && hf_shards < hf_of) {
        snprintf(out->reason, sizeof out->reason, "%lu of %lu shard files (the save did not finish)", hf_shards, hf_of);
    } else if (tmp_name(base)) {
        snprintf(out->reason, sizeof out->reason,
                 "%u shard file%s in a temporary folder \"%.80s\" (the save did not finish, or was not renamed yet)",
                 out->nshards, s, base);
    } else {
        out->kind = DCP_FOLDER_CHECKPOINT;
    }
    return 0;
}

int dcp_is_part_of_checkpoint(const char *path, const char **folder, int *folder_len)
{
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    size_t n = strlen(base);
    if (folder)
        *folder = slash ? path : ".";
    if (folder_len)   /* what precedes the last '/' ("/" for "/.metadata"); a path fits in an int (argv, PATH_MAX) */
        *folder_len = !slash || slash == path ? 1 : (int)(slash - path);
    return !strcmp(base, ".metadata") || !strcmp(base, ".metadata.tmp") ||
           (n > 11 && !strncmp(base, "__", 2) && ends_with(base, n, ".metadata")) || ends_with(base, n, ".distcp") ||
           !strcmp(base, "metadata.json") || !strcmp(base, "model.safetensors.index.json");
}

int dcp_probe_folder(const char *path, dcp_folder_probe *out, dcp_error *err)
{
    if (!path || !out)
        return dcpi_err(err, EINVAL, "dcp_probe_folder: a NULL argument");
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        memset(out, 0, sizeof *out);
        return dcpi_err(err, e, "%s: %s", path, strerror(e));
    }
    int rc = dcpi_probe_at(fd, path, out, err);
    close(fd);
    return rc;
}
