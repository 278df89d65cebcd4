/* STUB: dcp synth. */
#include "cli.h"
int cmd_synth(int argc, char **argv)
{
    (void)argc; (void)argv;
    cli_error("synth: not implemented yet");
    return 1;
}
