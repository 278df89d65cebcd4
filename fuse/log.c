/* dcpfs: logging. To stderr in the foreground, to syslog once the daemon
 * has detached (libfuse's own messages too); debug lines only with -d. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>

#include "dcpfs.h"

static int log_to_syslog;
static int log_debug;

void dfs_log(int level, const char *fmt, ...)
{
    if (level >= LOG_DEBUG && !log_debug)
        return;
    char small[1024], *msg = small;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof small && (msg = malloc((size_t)n + 1))) {
        va_start(ap, fmt);
        vsnprintf(msg, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    const char *text = msg ? msg : small;
    /* keys and file names in it are the checkpoint's bytes: a newline must not forge a log line */
    size_t need = dcp_key_text(text, NULL, 0);
    char *shown = need == strlen(text) ? NULL : malloc(need + 1);
    if (shown)
        dcp_key_text(text, shown, need + 1);
    else if (need != strlen(text))
        text = "(a message with control characters or bytes that are not UTF-8; out of memory to show it)";
    if (log_to_syslog)
        syslog(level, "%s", shown ? shown : text);
    else
        fprintf(stderr, "dcpfs: %s\n", shown ? shown : text);
    free(shown);
    if (msg != small)
        free(msg);
}

void dfs_log_debug(int on) { log_debug = on; }

static void fuse_log_to_syslog(enum fuse_log_level level, const char *fmt, va_list ap)
{
    vsyslog((int)level, fmt, ap);
}

void dfs_log_to_syslog(void)
{
    openlog("dcpfs", LOG_PID, LOG_DAEMON);
    log_to_syslog = 1;
    fuse_set_log_func(fuse_log_to_syslog);
}
