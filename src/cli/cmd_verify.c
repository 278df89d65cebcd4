/* STUB: dcp verify. */
#include "cli.h"
int cmd_verify(int argc, char **argv)
{
    (void)argc; (void)argv;
    cli_error("verify: not implemented yet");
    return 1;
}
