/* STUB: dcp diff. */
#include "cli.h"
int cmd_diff(int argc, char **argv)
{
    (void)argc; (void)argv;
    cli_error("diff: not implemented yet");
    return 1;
}
