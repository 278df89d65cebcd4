/* dcpfs: logging. To stderr in the foreground, to syslog once the daemon
 * has detached (libfuse's own messages too); debug lines only with -d. */
#include <stdarg.h>
#include <stdio.h>

#include "dcpfs.h"

static int log_to_syslog;
static int log_debug;

void dfs_log(int level, const char *fmt, ...)
{
    if (level >= LOG_DEBUG && !log_debug)
        return;
    va_list ap;
    va_start(ap, fmt);
    if (log_to_syslog) {
        vsyslog(level, fmt, ap);
    } else {
        fputs("dcpfs: ", stderr);
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
    }
    va_end(ap);
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
