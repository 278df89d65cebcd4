/* "Not a checkpoint" said usefully, beyond what libdcp's message says (it
 * names the checkpoint folders one level below, open.c): when the folder a
 * user named is a run folder (Megatron-LM's iter_0001000/ beside
 * latest_checkpointed_iteration.txt, torchtitan's step-100/, Hugging Face
 * Trainer's checkpoint-500/), the one Megatron-LM's tracker names and how
 * many saves below it did not finish. Names alone decide (dcp_probe_folder
 * opens no file), and at most BELOW_MAX_PROBES folders are probed, so a
 * folder of thousands of steps is refused quickly. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"

#define BELOW_MAX_SCAN 10000    /* entries listed at most: a hint, not a walk */
#define BELOW_MAX_PROBES 64     /* folders probed at most (as libdcp's message, open.c) */

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
    size_t n = 0, partial = 0, listed = 0, probed = 0;
    int more = 0;   /* folders left unprobed */
    struct dirent *de;
    while ((de = readdir(d)) && listed++ < BELOW_MAX_SCAN) {
        if (de->d_name[0] == '.')
            continue;
        char p[PATH_MAX];
        struct stat st;
        dcp_folder_probe probe;
        if (snprintf(p, sizeof p, "%s/%s", folder, de->d_name) >= (int)sizeof p || stat(p, &st) < 0 ||
            !S_ISDIR(st.st_mode))
            continue;
        if (probed++ == BELOW_MAX_PROBES) {
            more = 1;
            break;
        }
        if (dcp_probe_folder(p, &probe, NULL) < 0)
            continue;
        partial += probe.kind == DCP_FOLDER_PARTIAL;
        n += probe.kind == DCP_FOLDER_CHECKPOINT;
    }
    closedir(d);
    const char *sep = folder[strlen(folder) - 1] == '/' ? "" : "/";
    char buf[64], p[PATH_MAX];
    const char *latest = megatron_latest(folder, buf, sizeof buf);
    dcp_folder_probe probe;
    if (latest && snprintf(p, sizeof p, "%s%s%s", folder, sep, latest) < (int)sizeof p &&
        dcp_probe_folder(p, &probe, NULL) == 0 && probe.kind == DCP_FOLDER_CHECKPOINT)
        fprintf(stderr, "dcp: %s's latest_checkpointed_iteration.txt names %s\n", folder, p);
    if (!partial)
        return;
    fprintf(stderr, "dcp: %s holds %zu partial checkpoint%s (%s did not finish)", folder, partial,
            partial == 1 ? "" : "s", partial == 1 ? "a save that" : "saves that");
    if (more)
        fprintf(stderr, " among the first %d of its folders", BELOW_MAX_PROBES);
    else if (!n)
        fputs(" and no complete one", stderr);
    fputc('\n', stderr);
}
