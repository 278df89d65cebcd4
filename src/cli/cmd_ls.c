/* STUB: dcp ls. */
#include "cli.h"
int cmd_ls(int argc, char **argv)
{
    (void)argc; (void)argv;
    cli_error("ls: not implemented yet");
    return 1;
}
