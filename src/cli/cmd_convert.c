/* STUB: dcp convert. */
#include "cli.h"
int cmd_convert(int argc, char **argv)
{
    (void)argc; (void)argv;
    cli_error("convert: not implemented yet");
    return 1;
}
