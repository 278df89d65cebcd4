/* A progress bar on stderr, only when stderr is a terminal. */
#include <stdio.h>
#include <unistd.h>

#include "cli.h"

void cli_progress(void *label, uint64_t done, uint64_t total)
{
    static int tty = -1, open_line;
    if (tty < 0)
        tty = isatty(2);
    if (!tty)
        return;
    if (!total) {   /* an end with nothing done (every file unreadable): close a bar drawn */
        if (open_line)
            fputc('\n', stderr);
        open_line = 0;
        return;
    }
    int pct = (int)(done * 100 / total);
    char h1[32], h2[32];
    fprintf(stderr, "\r%s %3d%% %s / %s", (const char *)label, pct, cli_human_bytes(done, h1), cli_human_bytes(total, h2));
    open_line = done < total;
    if (!open_line)
        fputc('\n', stderr);
}
