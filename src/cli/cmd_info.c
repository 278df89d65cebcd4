/* dcp info: what the checkpoint is, and how big. */
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

static void usage(FILE *f) { fprintf(f, "usage: dcp info CKPT\n"); }

int cmd_info(int argc, char **argv)
{
    static const struct option opts[] = {{"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (c == 'h') {
            usage(stdout);
            return 0;
        }
        usage(stderr);
        return 2;
    }
    if (optind != argc - 1) {
        usage(stderr);
        return 2;
    }
    const char *path = argv[optind];
    dcp_checkpoint *ck = cli_open(path);
    if (!ck)
        return cli_open_status();
    const dcp_info *in = dcp_get_info(ck);
    size_t tensors = 0, bytes_items = 0, chunks = 0, replicated = 0;
    /* Megatron-LM's torch.distributed.checkpoint formats (fsdp_dtensor,
     * torch_dcp): its args and checkpoint_version values as bytes items, no
     * metadata.json; fsdp_dtensor's keys are Megatron-FSDP's (model.module.,
     * optimizer.param_to_group_meta.). */
    int mlm_args = 0, mlm_version = 0, mlm_fsdp = 0;
    uint64_t by_dtype[DCP_DTYPE_COUNT] = {0}, bytes_total = 0;
    size_t n = dcp_num_entries(ck);
    for (size_t i = 0; i < n; i++) {
        const dcp_entry *e;
        dcp_error err;
        if (dcp_get_entry(ck, i, &e, &err) < 0) {
            cli_error("%s", err.msg);
            dcp_close(ck);
            return 1;
        }
        replicated += dcp_entry_replicated(ck, e) != 0;
        if (e->kind == DCP_KIND_TENSOR) {
            tensors++;
            chunks += e->nchunks;
            by_dtype[e->dtype] += dcp_entry_numel(e) * dcp_dtype_size(e->dtype);
        } else {
            bytes_items++;
            bytes_total += e->blob.length;
            mlm_args |= !strcmp(e->key, "args");
            mlm_version |= !strcmp(e->key, "checkpoint_version");
        }
        mlm_fsdp |= !strncmp(e->key, "model.module.", 13) || !strncmp(e->key, "optimizer.param_to_group_meta.", 30);
    }
    /* Shard files: how many, how big on disk, which are missing. */
    uint64_t file_bytes = 0;
    size_t missing = 0, nfiles = dcp_num_files(ck);
    int dirfd = open(dcp_path(ck), O_RDONLY | O_DIRECTORY | O_CLOEXEC);   /* a single file's folder too */
    for (size_t f = 0; f < nfiles; f++) {
        struct stat st;
        if (dirfd >= 0 && fstatat(dirfd, dcp_file_name(ck, (uint32_t)f), &st, 0) == 0)
            file_bytes += (uint64_t)st.st_size;
        else
            missing++;
    }
    if (dirfd >= 0)
        close(dirfd);

    char h[32];
    printf("checkpoint:     %s\n", path);
    printf("format:         %s\n", in->generation ? in->generation : "unknown");
    printf("serialization:  %s\n", in->serialization ? in->serialization : "unknown");
    printf("layout:         %s%s\n", in->layout ? in->layout : "unknown",
           in->megatron                 ? " (Megatron-Core torch_dist: metadata.json present)"
           : !mlm_args || !mlm_version ? ""
           : mlm_fsdp                   ? " (Megatron-LM fsdp_dtensor: args and checkpoint_version items, model.module. keys)"
                                        : " (Megatron-LM: args and checkpoint_version items, no metadata.json)");
    if (in->version)
        printf("version:        %s\n", in->version);
    if (in->checkpoint_id)
        printf("checkpoint_id:  %s\n", in->checkpoint_id);
    if (in->save_id)
        printf("save_id:        %s\n", in->save_id);
    printf("planner data:   %s\n", in->has_planner_data ? "yes" : "no");
    printf("metadata:       %s%s\n", cli_human_bytes(in->metadata_bytes, h),
           dcp_from_catalog(ck) ? " (model rebuilt from the catalog, not parsed)" : "");
    printf("keys:           %zu (%zu tensors, %zu bytes items)\n", n, tensors, bytes_items);
    printf("chunks:         %zu\n", chunks);
    if (replicated)   /* a rank-local save merged: torch's dcp.load gives each rank its own file's */
        printf("replicated:     %zu key%s saved by several ranks, shown from the lowest rank's file (torch's"
               " dcp.load gives each rank its own: dcp --rank R)\n", replicated, replicated == 1 ? "" : "s");
    if (in->megatron_reformulated && !in->megatron_folded)
        printf("reformulated:   %zu tensors stored as Megatron-Core's distributed optimizer stores them"
               " (--megatron-fold shows them in their original shapes)\n", in->megatron_reformulated);
    else if (in->megatron_reformulated == in->megatron_folded && in->megatron_folded)
        printf("reformulated:   %zu tensors, shown in their original shapes (--megatron-fold)\n", in->megatron_folded);
    else if (in->megatron_reformulated)
        printf("reformulated:   %zu tensors, %zu shown in their original shapes (--megatron-fold; %zu kept"
               " stored: chunks that are not one block's range each)\n", in->megatron_reformulated,
               in->megatron_folded, in->megatron_reformulated - in->megatron_folded);
    printf("shard files:    %zu, %s", nfiles, cli_human_bytes(file_bytes, h));
    if (missing)
        printf(", %zu MISSING", missing);
    printf("\n");
    printf("tensor bytes by dtype:\n");
    for (int d = 1; d < DCP_DTYPE_COUNT; d++)
        if (by_dtype[d])
            printf("  %-18s %s\n", dcp_dtype_name((dcp_dtype)d), cli_human_bytes(by_dtype[d], h));
    if (bytes_items)
        printf("bytes items:    %s stored\n", cli_human_bytes(bytes_total, h));
    dcp_close(ck);
    return missing ? 1 : 0;
}
