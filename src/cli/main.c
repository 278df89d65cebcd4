/* dcp: list, inspect, extract, verify, convert and write PyTorch Distributed Checkpoints. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static const struct command {
    const char *name;
    int (*run)(int, char **);
    const char *summary;
} commands[] = {
    {"ls", cmd_ls, "list keys with dtype, shape and size"},
    {"cat", cmd_cat, "write a tensor (or a box of it) or a bytes item to stdout"},
    {"info", cmd_info, "summarise the checkpoint: format, keys, chunks, files, bytes"},
    {"layout", cmd_layout, "show which file and offset hold each chunk"},
    {"verify", cmd_verify, "check structure and, with --record, content digests"},
    {"diff", cmd_diff, "compare two checkpoints"},
    {"digest", cmd_digest, "XXH3-128 of each key's value, the same in every format and layout"},
    {"convert", cmd_convert, "convert between DCP, torch.save and safetensors"},
    {"synth", cmd_synth, "write a synthetic checkpoint"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: dcp [--catalog PATH | --no-catalog] [--megatron-fold] [--rank R] COMMAND [ARGS]\n\n"
               "commands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\nThe catalog (default $XDG_CACHE_HOME/dcpfs/catalog.sqlite) remembers parsed metadata so\n"
               "later opens skip it; --no-catalog parses every time and writes nothing.\n"
               "--megatron-fold shows Megatron-Core's reformulated optimizer states in their original\n"
               "shapes (as its own load does; PyTorch's shows the stored [X/x, Y/y, x*y]).\n"
               "--rank R reads a rank-local checkpoint (__R.metadata files) as rank R's dcp.load does:\n"
               "its __R.metadata alone; without it every rank's file is merged, a value several ranks\n"
               "saved taken from the lowest rank.\n"
               "'dcp COMMAND --help' describes one command; man dcp describes them all.\n");
}

int main(int argc, char **argv)
{
    /* Options before the command apply to every command (cli_open). */
    while (argc >= 2 && argv[1][0] == '-' && argv[1][1] == '-') {
        if (!strcmp(argv[1], "--no-catalog")) {
            cli_catalog_enabled = 0;
        } else if (!strcmp(argv[1], "--megatron-fold")) {
            cli_megatron_fold = 1;
        } else if (!strcmp(argv[1], "--rank") && argc >= 3) {
            if (cli_parse_rank(argv[2]) < 0)
                return 2;
            argv++;
            argc--;
        } else if (!strcmp(argv[1], "--catalog") && argc >= 3) {
            cli_catalog_path = argv[2];
            argv++;
            argc--;
        } else {
            break;
        }
        argv++;
        argc--;
    }
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "-V") || !strcmp(argv[1], "--version")) {
        printf("dcp (dcpfs) %s\n", dcp_version());   /* the libdcp it runs with */
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) {
            /* getopt names argv[0] in its messages: "dcp ls: unrecognized
             * option '--jsn'", not "ls: ..." (which reads as ls(1)'s). */
            static char name[32];
            snprintf(name, sizeof name, "dcp %s", commands[i].name);
            argv[1] = name;
            return commands[i].run(argc - 1, argv + 1);
        }
    cli_error("unknown command '%s'", argv[1]);
    usage(stderr);
    return 2;
}
