/* STUB: dcp cat. */
#include "cli.h"
int cmd_cat(int argc, char **argv)
{
    (void)argc; (void)argv;
    cli_error("cat: not implemented yet");
    return 1;
}
