/* "Not a checkpoint" said usefully: when the folder a user named is a run
 * folder (Megatron-LM's iter_0001000/ beside latest_checkpointed_iteration.txt,
 * torchtitan's step-100/, Hugging Face Trainer's checkpoint-500/), name the
 * checkpoints one level below it, so the next command is obvious. Names
 * alone decide (dcp_probe_folder opens no file), so a folder of thousands of
 * steps costs a listing and a probe each. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"

#define BELOW_MAX_SCAN 100000   /* entries listed at most: a hint, not a walk */
#define BELOW_SHOWN 6           /* named in full up to this many */

/* Names in human order: digit runs compare as numbers (checkpoint-500 before
 * checkpoint-1000), the rest byte by byte. */
static int natural_cmp(const char *a, const char *b)
{
    while (*a && *b) {
        if (isdigit((unsigned char)*a) && isdigit((unsigned char)*b)) {
            while (*a == '0')
                a++;
            while (*b == '0')
                b++;
            size_t na = 0, nb = 0;
            while (isdigit((unsigned char)a[na]))
                na++;
            while (isdigit((unsigned char)b[nb]))
                nb++;
            if (na != nb)
                return na < nb ? -1 : 1;
            int c = memcmp(a, b, na);
            if (c)
                return c;
            a += na;
            b += nb;
        } else {
            if (*a != *b)
                return (unsigned char)*a < (unsigned char)*b ? -1 : 1;
            a++;
            b++;
        }
    }
    return *a ? 1 : *b ? -1 : 0;
}

static int by_name(const void *x, const void *y)
{
    return natural_cmp(*(char *const *)x, *(char *const *)y);
}

/* Megatron-LM's tracker file: an iteration number (its checkpoint is
 * iter_%07d) or "release". The folder it names, in buf, or NULL. */
static const char *megatron_latest(const char *folder, char *buf, size_t cap)
{
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s/latest_checkpointed_iteration.txt", folder) >= (int)sizeof p)
        return NULL;
    FILE *f = fopen(p, "r");
    if (!f)
        return NULL;
    char line[64] = "";
    char *ok = fgets(line, sizeof line, f);
    fclose(f);
    if (!ok)
        return NULL;
    line[strcspn(line, " \t\r\n")] = 0;
    if (!strcmp(line, "release")) {
        snprintf(buf, cap, "release");
        return buf;
    }
    char *end;
    errno = 0;
    long long it = strtoll(line, &end, 10);
    if (!line[0] || *end || errno || it < 0)
        return NULL;
    snprintf(buf, cap, "iter_%07lld", it);
    return buf;
}

void cli_hint_checkpoints_below(const char *folder)
{
    DIR *d = opendir(folder);
    if (!d)
        return;
    char **names = NULL;
    size_t n = 0, cap = 0, partial = 0, listed = 0;
    struct dirent *de;
    while ((de = readdir(d)) && listed++ < BELOW_MAX_SCAN) {
        if (de->d_name[0] == '.')
            continue;
        char p[PATH_MAX];
        struct stat st;
        dcp_folder_probe probe;
        if (snprintf(p, sizeof p, "%s/%s", folder, de->d_name) >= (int)sizeof p || stat(p, &st) < 0 ||
            !S_ISDIR(st.st_mode) || dcp_probe_folder(p, &probe, NULL) < 0)
            continue;
        if (probe.kind == DCP_FOLDER_PARTIAL)
            partial++;
        if (probe.kind != DCP_FOLDER_CHECKPOINT)
            continue;
        if (n == cap) {
            size_t ncap = cap ? 2 * cap : 16;
            char **grown = realloc(names, ncap * sizeof *grown);
            if (!grown)
                break;
            names = grown;
            cap = ncap;
        }
        if (!(names[n] = strdup(de->d_name)))
            break;
        n++;
    }
    closedir(d);
    if (n) {
        qsort(names, n, sizeof *names, by_name);
        /* "RUN holds 12 checkpoints: RUN/a, RUN/b, ..., RUN/k, RUN/l" */
        const char *sep = folder[strlen(folder) - 1] == '/' ? "" : "/";
        fprintf(stderr, "dcp: %s holds %zu checkpoint%s: ", folder, n, n == 1 ? "" : "s");
        for (size_t i = 0; i < n; i++) {
            if (n > BELOW_SHOWN && i == 2) {
                fputs("..., ", stderr);
                i = n - 3;
            }
            fprintf(stderr, "%s%s%s%s", folder, sep, names[i], i + 1 < n ? ", " : "");
        }
        if (partial)
            fprintf(stderr, " (and %zu partial)", partial);
        fputc('\n', stderr);
        char buf[64];
        const char *latest = megatron_latest(folder, buf, sizeof buf);
        for (size_t i = 0; latest && i < n; i++)
            if (!strcmp(names[i], latest)) {
                fprintf(stderr, "dcp: %s's latest_checkpointed_iteration.txt names %s%s%s\n", folder, folder, sep,
                        latest);
                break;
            }
    } else if (partial) {
        fprintf(stderr, "dcp: %s holds %zu partial checkpoint%s (saves that did not finish) and no complete one\n",
                folder, partial, partial == 1 ? "" : "s");
    }
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
}
