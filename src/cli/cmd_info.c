/* STUB: dcp info. */
#include "cli.h"
int cmd_info(int argc, char **argv)
{
    (void)argc; (void)argv;
    cli_error("info: not implemented yet");
    return 1;
}
