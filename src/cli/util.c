/* Helpers shared by the dcp subcommands. */
#include <errno.h>
#include <langinfo.h>
#include <locale.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <wchar.h>

#include "cli.h"
#include "dcp_file.h"   /* dcp_open_file */

void cli_error(const char *fmt, ...)
{
    char small[512], *msg = small;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof small && (msg = malloc((size_t)n + 1))) {
        va_start(ap, fmt);
        vsnprintf(msg, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    /* keys and paths in it are the checkpoint's bytes: shown as cli_text shows them */
    fputs("dcp: ", stderr);
    fputs(cli_text(msg ? msg : small), stderr);
    fputc('\n', stderr);
    if (msg != small)
        free(msg);
}

volatile sig_atomic_t cli_stop_signal;

static void on_signal(int sig)
{
    cli_stop_signal = sig;
}

void cli_catch_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
}

void cli_end_by_signal(void)
{
    signal(cli_stop_signal, SIG_DFL);
    raise(cli_stop_signal);
}

int cli_catalog_enabled = 1;
int cli_megatron_fold;
int cli_open_partial;

int cli_open_status(void)
{
    return cli_open_partial ? 3 : 1;
}

int cli_float_dtype(const char *name, dcp_dtype *as)
{
    *as = dcp_dtype_from_name(name);
    if (*as == DCP_BFLOAT16 || *as == DCP_FLOAT16 || *as == DCP_FLOAT32 || *as == DCP_FLOAT64)
        return 0;
    cli_error("--dtype %s: cast to bfloat16, float16, float32 or float64", name);
    return -1;
}
const char *cli_catalog_path;
long cli_rank = -1;

int cli_parse_rank(const char *text)
{
    char *end;
    errno = 0;
    long r = text[0] >= '0' && text[0] <= '9' ? strtol(text, &end, 10) : -1;
    if (r < 0 || errno || *end || r > 100000000) {
        cli_error("--rank %s: a rank is a decimal number from 0 (the R of a rank-local save's __R.metadata)",
                  text);
        return -1;
    }
    cli_rank = r;
    return 0;
}

dcp_checkpoint *cli_open(const char *path)
{
    dcp_checkpoint *ck;
    dcp_error err;
    dcp_open_options o = DCP_OPEN_OPTIONS_INIT;
    o.flags = (cli_catalog_enabled ? DCP_OPEN_CATALOG : 0) | (cli_megatron_fold ? DCP_OPEN_MEGATRON_FOLD : 0);
    o.catalog = cli_catalog_path;
    if (cli_rank >= 0) {
        o.flags |= DCP_OPEN_RANK;
        o.rank = (unsigned)cli_rank;
    }
    struct stat st;
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
        if (cli_rank >= 0) {
            cli_error("%s: --rank %ld reads a rank-local checkpoint folder's __%ld.metadata; this is a single file",
                      path, cli_rank, cli_rank);
            return NULL;
        }
        /* A single torch.save or safetensors file (dcp_write.h). */
        size_t skipped = 0;
        if (dcp_open_file(path, DCP_FORMAT_AUTO, &ck, &skipped, &err) < 0) {
            cli_error("%s", err.msg);
            return NULL;
        }
        if (skipped)   /* never silently: a diff would not see them */
            cli_error("%s: %zu value%s not shown: not tensors nor plain data (dcp convert names each and why)",
                      path, skipped, skipped == 1 ? "" : "s");
        return ck;
    }
    /* A save that did not finish is named as such, never read as a
     * checkpoint (nor called "not a checkpoint"). */
    dcp_folder_probe probe;
    int nothing_here = 0;   /* a folder without checkpoint files: maybe a run folder */
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode) && dcp_probe_folder(path, &probe, &err) == 0) {
        if (probe.kind == DCP_FOLDER_PARTIAL) {
            cli_error("%s: a partial checkpoint: %s", path, probe.reason);
            cli_open_partial = 1;
            return NULL;
        }
        nothing_here = probe.kind == DCP_FOLDER_NOT_CHECKPOINT;
    }
    if (dcp_open_ex(path, &o, &ck, &err) < 0) {
        cli_error("%s", err.msg);
        if (nothing_here && err.code == ENOENT)
            cli_hint_checkpoints_below(path);   /* name the checkpoints below it */
        return NULL;
    }
    return ck;
}

int cli_find_key(dcp_checkpoint *ck, const char *path, const char *key, const dcp_entry **out)
{
    dcp_error err;
    if (dcp_find_entry(ck, key, out, &err) == 0)
        return 0;
    if (err.code != DCP_ENOTFOUND) {
        cli_error("%s", err.msg);
        return -1;
    }
    /* A key's dotted prefix (a module, "model.layers.0"): name the keys under
     * it, which is what was most likely meant, and how to list them all. */
    size_t n = strlen(key);
    char *prefix = malloc(n + 2);
    const dcp_entry *e = NULL;
    size_t under = 0;
    char names[3][256];
    if (prefix) {
        memcpy(prefix, key, n);
        memcpy(prefix + n, ".", 2);
        const char *from = prefix;
        char *next = NULL;
        while (under < 1000 && dcp_seek(ck, from, &e, &err) == 0 && e && !strncmp(e->key, prefix, n + 1)) {
            if (under < 3)
                snprintf(names[under], sizeof names[under], "%s", cli_text(e->key));
            under++;
            size_t k = strlen(e->key);   /* the key right after e->key: e->key "\x01" */
            char *nx = realloc(next, k + 2);
            if (!nx)
                break;
            next = nx;
            memcpy(next, e->key, k);
            memcpy(next + k, "\x01", 2);
            from = next;
        }
        free(next);
        free(prefix);
    }
    if (!under) {
        cli_error("%s: %s: no such key", path, cli_text(key));
        return -1;
    }
    cli_error("%s: %s: no such key; %s%zu %s under it (%s%s%s%s%s%s): dcp ls --keys '%s' %s lists them",
              path, cli_text(key), under >= 1000 ? "at least " : "", under, under == 1 ? "key lies" : "keys lie",
              names[0], under > 1 ? ", " : "",
              under > 1 ? names[1] : "", under > 2 ? ", " : "", under > 2 ? names[2] : "", under > 3 ? ", ..." : "",
              cli_text(key), path);
    return -1;
}

void cli_json_string(FILE *f, const char *s)
{
    char *q = dcp_key_json(s);   /* keys that are not UTF-8 too (dcp.h) */
    fputs(q ? q : "\"(out of memory)\"", f);
    free(q);
}

const char *cli_text(const char *s)
{
    static char *buf[2];
    static size_t cap[2];
    static int turn;
    size_t n = dcp_key_text(s, NULL, 0);
    if (n == strlen(s))   /* nothing escaped */
        return s;
    int t = turn ^= 1;
    if (cap[t] < n + 1) {
        char *nb = realloc(buf[t], n + 1);
        if (!nb)
            return "(a name with control characters or bytes that are not UTF-8)";
        buf[t] = nb;
        cap[t] = n + 1;
    }
    dcp_key_text(s, buf[t], n + 1);
    return buf[t];
}

/* A UTF-8 LC_CTYPE for measuring text: the user's locale when it is UTF-8
 * (its width table is the one the terminal most likely follows), else
 * C.UTF-8. (locale_t)0 when there is none. Only cli_text_width uses it
 * (uselocale, for this thread alone): the program's locale stays "C", so
 * nothing else (fnmatch of --keys, messages) changes with the environment. */
static locale_t utf8_ctype(void)
{
    static locale_t loc;
    static int tried;
    if (tried)
        return loc;
    tried = 1;
    static const char *const names[] = {"", "C.UTF-8", "C.utf8", "en_US.UTF-8"};
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !loc; i++) {
        loc = newlocale(LC_CTYPE_MASK, names[i], (locale_t)0);
        if (loc && strcmp(nl_langinfo_l(CODESET, loc), "UTF-8") != 0) {
            freelocale(loc);
            loc = (locale_t)0;
        }
    }
    return loc;
}

size_t cli_text_width(const char *s)
{
    locale_t loc = utf8_ctype();
    size_t cols = 0;
    if (!loc) {   /* no UTF-8 locale: one column a character */
        for (; *s; s++)
            cols += (*s & 0xc0) != 0x80;
        return cols;
    }
    locale_t old = uselocale(loc);
    mbstate_t st;
    memset(&st, 0, sizeof st);
    size_t left = strlen(s);
    while (left) {
        wchar_t wc;
        size_t n = mbrtowc(&wc, s, left, &st);
        if (n == (size_t)-1 || n == (size_t)-2 || n == 0) {   /* not UTF-8 (cli_text never gives it) */
            memset(&st, 0, sizeof st);
            n = 1;
            cols++;
        } else {
            int w = wcwidth(wc);
            cols += w > 0 ? (size_t)w : 0;   /* combining marks 0, C1 controls -1: no column */
        }
        s += n;
        left -= n;
    }
    uselocale(old);
    return cols;
}

void cli_pad(FILE *f, const char *s, size_t width)
{
    fputs(s, f);
    for (size_t w = cli_text_width(s); w < width; w++)
        fputc(' ', f);
}

void cli_json_shape(FILE *f, const int64_t *v, int n)
{
    fputc('[', f);
    for (int i = 0; i < n; i++)
        fprintf(f, "%s%lld", i ? "," : "", (long long)v[i]);
    fputc(']', f);
}

const char *cli_human_bytes(uint64_t n, char *buf)
{
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double)n;
    int u = 0;
    while (v >= 1024 && u < 5) {
        v /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, 32, "%llu B", (unsigned long long)n);
    else
        snprintf(buf, 32, "%.1f %s", v, units[u]);
    return buf;
}

int cli_write_stdout(const void *buf, size_t len)
{
    const char *p = buf;
    while (len) {
        ssize_t w = write(1, p, len);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

int cli_err_stdout(dcp_error *err)
{
    err->code = errno;
    snprintf(err->msg, sizeof err->msg, "writing to standard output: %s", strerror(errno));
    return -1;
}
