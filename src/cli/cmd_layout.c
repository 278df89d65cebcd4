/* dcp layout: which file and offset hold each chunk (and where its elements are).
 * A torch.save file's plain values lie at no offset: pickled anew, in memory. */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

static void usage(FILE *f) { fprintf(f, "usage: dcp layout [--json] CKPT [KEY]\n"); }

static void print_vec(const int64_t *v, int n)
{
    putchar('[');
    for (int i = 0; i < n; i++)
        printf("%s%" PRId64, i ? "," : "", v[i]);
    putchar(']');
}

static int show(dcp_checkpoint *ck, const dcp_entry *e, int json)
{
    int status = 0;
    if (e->kind == DCP_KIND_BYTES) {
        const char *file = e->has_blob ? dcp_file_name(ck, e->blob.file) : "-";
        if (e->has_blob && e->blob.transforms & DCP_TRANSFORM_MEMORY) {   /* a .pt's plain value, pickled */
            if (json) {
                fputs("{\"key\":", stdout);
                cli_json_string(stdout, e->key);
                fputs(",\"kind\":\"bytes\",\"file\":", stdout);
                cli_json_string(stdout, file);
                printf(",\"length\":%" PRIu64 ",\"memory\":true}\n", e->blob.length);
            } else {
                printf("%s  bytes  %s value +%" PRIu64 " memory\n", cli_text(e->key), cli_text(file), e->blob.length);
            }
            return 0;
        }
        if (json) {
            fputs("{\"key\":", stdout);
            cli_json_string(stdout, e->key);
            fputs(",\"kind\":\"bytes\",\"file\":", stdout);
            cli_json_string(stdout, file);
            printf(",\"offset\":%" PRIu64 ",\"length\":%" PRIu64 "%s%s}\n", e->blob.offset, e->blob.length,
                   e->blob.transforms & DCP_TRANSFORM_ZSTD ? ",\"zstd\":true" : "",
                   e->blob.transforms & DCP_TRANSFORM_LATIN1 ? ",\"latin1\":true" : "");
        } else {
            printf("%s  bytes  %s @%" PRIu64 " +%" PRIu64 "%s%s\n", cli_text(e->key), cli_text(file), e->blob.offset,
                   e->blob.length, e->blob.transforms & DCP_TRANSFORM_ZSTD ? " zstd" : "",
                   e->blob.transforms & DCP_TRANSFORM_LATIN1 ? " latin1" : "");
        }
        return 0;
    }
    const dcp_chunk *chunks;
    dcp_error err;
    if (dcp_entry_chunks(ck, e, &chunks, &err) < 0) {
        cli_error("%s", err.msg);
        return 1;
    }
    for (size_t i = 0; i < e->nchunks; i++) {
        const dcp_chunk *c = &chunks[i];
        const dcp_record *r = NULL;
        if (dcp_chunk_record(ck, e, i, &r, &err) < 0) {
            cli_error("%s", err.msg);
            status = 1;
        }
        const char *file = c->has_blob ? dcp_file_name(ck, c->blob.file) : "-";
        if (json) {
            fputs("{\"key\":", stdout);
            cli_json_string(stdout, e->key);
            printf(",\"chunk\":%zu,\"offsets\":", i);
            cli_json_shape(stdout, c->offsets, e->ndim);
            fputs(",\"sizes\":", stdout);
            cli_json_shape(stdout, c->sizes, e->ndim);
            fputs(",\"file\":", stdout);
            cli_json_string(stdout, file);
            printf(",\"offset\":%" PRIu64 ",\"length\":%" PRIu64, c->blob.offset, c->blob.length);
            if (r) {
                printf(",\"data_offset\":%" PRIu64 ",\"data_length\":%" PRIu64 ",\"stride\":",
                       r->data_offset, r->data_length);
                cli_json_shape(stdout, r->stride, e->ndim);
                printf(",\"storage_offset\":%" PRId64 ",\"stored_dtype\":\"%s\"", r->storage_offset,
                       dcp_dtype_name(r->dtype));
            }
            fputs("}\n", stdout);
        } else {
            printf("%s  chunk %zu  offsets ", cli_text(e->key), i);
            print_vec(c->offsets, e->ndim);
            fputs(" sizes ", stdout);
            print_vec(c->sizes, e->ndim);
            printf("  %s @%" PRIu64 " +%" PRIu64, cli_text(file), c->blob.offset, c->blob.length);
            if (r) {
                printf("  data @%" PRIu64, r->data_offset);
                if (r->storage_offset)   /* a view into its storage (a folded Megatron run, a shared storage) */
                    printf(" +%" PRId64 " elements", r->storage_offset);
                fputs(" stride ", stdout);
                print_vec(r->stride, e->ndim);
                if (r->flags & DCP_RECORD_DECODED)
                    fputs(" (in decoded zstd blob)", stdout);
            }
            putchar('\n');
        }
    }
    dcp_release_chunks(ck, e);
    return status;
}

int cmd_layout(int argc, char **argv)
{
    static const struct option opts[] = {
        {"json", no_argument, 0, 'j'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int json = 0, c;
    while ((c = getopt_long(argc, argv, "jh", opts, NULL)) != -1) {
        switch (c) {
        case 'j': json = 1; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind != argc - 1 && optind != argc - 2) {
        usage(stderr);
        return 2;
    }
    dcp_checkpoint *ck = cli_open(argv[optind]);
    if (!ck)
        return cli_open_status();
    int status = 0;
    if (optind == argc - 2) {
        const dcp_entry *e;
        if (cli_find_key(ck, argv[optind], argv[optind + 1], &e) < 0) {
            status = 1;
        } else {
            status = show(ck, e, json);
        }
    } else {
        for (size_t i = 0; i < dcp_num_entries(ck); i++) {
            const dcp_entry *e;
            dcp_error err;
            if (dcp_get_entry(ck, i, &e, &err) < 0) {
                cli_error("%s", err.msg);
                status = 1;
                break;
            }
            status |= show(ck, e, json);
        }
    }
    dcp_close(ck);
    return status;
}
