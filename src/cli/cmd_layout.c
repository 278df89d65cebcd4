/* STUB: dcp layout. */
#include "cli.h"
int cmd_layout(int argc, char **argv)
{
    (void)argc; (void)argv;
    cli_error("layout: not implemented yet");
    return 1;
}
