/* What every rank of a call must share: the options (after defaults) and
 * the checkpoint. Ranks that differ would plan differently and post
 * mismatched transfers, so each rank sends this with its requests and all
 * compare it with rank 0's.
 *
 * The checkpoint's identity is cheap on purpose (it runs on every call): the
 * names and sizes of its data files, its entry count and the size of its
 * .metadata. Modification times are left out, so copies of one checkpoint
 * on node-local disks still match. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "load.h"

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ c[i]) * 1099511628211ull;
    return h;
}

int ldi_identity(dcp_checkpoint *ck, uint64_t *out, dcp_error *err)
{
    uint64_t h = 1469598103934665603ull;   /* FNV-1a */
    uint64_t v[2] = {dcp_num_files(ck), dcp_num_entries(ck)};
    h = fnv(h, v, sizeof v);
    char path[4352];
    struct stat sb;
    for (uint32_t f = 0; f < dcp_num_files(ck); f++) {
        /* stat, not dcp_file_fd: no file is opened (or evicted from the
         * reader's descriptor cache) for this */
        const char *name = dcp_file_name(ck, f);
        snprintf(path, sizeof path, "%s/%s", dcp_path(ck), name ? name : "");
        if (stat(path, &sb) < 0)
            return ldi_err(err, errno, "%s: %s", path, strerror(errno));
        uint64_t size = (uint64_t)sb.st_size;
        h = fnv(h, name ? name : "", name ? strlen(name) + 1 : 1);
        h = fnv(h, &size, sizeof size);
    }
    snprintf(path, sizeof path, "%s/.metadata", dcp_path(ck));
    uint64_t msize = stat(path, &sb) == 0 && S_ISREG(sb.st_mode) ? (uint64_t)sb.st_size : 0;
    *out = fnv(h, &msize, sizeof msize);
    return 0;
}

/* ---------------------------------------------------------------- how two ranks differ */

/* The parts of ck's identity as NUL-terminated strings, for rank 0 to send
 * and rank rk to compare (ldi_identity_diff): the checkpoint's name, its
 * entry count, the size of .metadata, then each data file's name and size
 * (-1: stat failed). *len bytes, malloc'd; NULL when out of memory. */
static char *identity_text(dcp_checkpoint *ck, size_t *len)
{
    char *buf = NULL, path[4352];
    FILE *f = open_memstream(&buf, len);
    if (!f)
        return NULL;
    struct stat sb;
    snprintf(path, sizeof path, "%s/.metadata", dcp_path(ck));
    int64_t msize = stat(path, &sb) == 0 && S_ISREG(sb.st_mode) ? (int64_t)sb.st_size : 0;
    fprintf(f, "%s%c%zu%c%" PRId64 "%c", ldi_name(ck), 0, dcp_num_entries(ck), 0, msize, 0);
    for (uint32_t i = 0; i < dcp_num_files(ck); i++) {
        const char *name = dcp_file_name(ck, i);
        snprintf(path, sizeof path, "%s/%s", dcp_path(ck), name ? name : "");
        fprintf(f, "%s%c%" PRId64 "%c", name ? name : "", 0, stat(path, &sb) == 0 ? (int64_t)sb.st_size : -1, 0);
    }
    if (fclose(f) != 0) {   /* out of memory while writing */
        free(buf);
        return NULL;
    }
    return buf;
}

/* The string after s in a text of len bytes ending at end (NULL past it). */
static const char *next_str(const char *s, const char *end)
{
    if (!s)
        return NULL;
    const char *z = memchr(s, '\0', (size_t)(end - s));
    return z && z + 1 < end ? z + 1 : NULL;
}

/* Rank rk's text (mine) against rank 0's (first, possibly cut short):
 * where they differ, into why. */
static void compare(const char *mine, size_t mlen, const char *first, size_t flen, int rk, char *why, size_t cap)
{
    const char *mend = mine + mlen, *fend = first + flen;
    int cut = !flen || first[flen - 1] != '\0';
    if (cut) {   /* cut short (DIFF_TEXT_MAX): whole strings only */
        const char *z = flen ? memrchr(first, '\0', flen) : NULL;
        fend = z ? z + 1 : first;
    }
    const char *m_ent = next_str(mine, mend), *m_md = next_str(m_ent, mend);
    const char *f_ent = next_str(first, fend), *f_md = next_str(f_ent, fend);
    int n = snprintf(why, cap, ": %s (rank 0: %s)", mine, f_ent ? first : "?");
    if (n < 0 || (size_t)n >= cap)
        return;
    why += n;
    cap -= (size_t)n;
    /* each of this rank's data files among rank 0's */
    for (const char *m = next_str(m_md, mend); m; m = next_str(next_str(m, mend), mend)) {
        const char *msz = next_str(m, mend), *fsz = NULL;
        for (const char *f = next_str(f_md, fend); f && !fsz; f = next_str(next_str(f, fend), fend))
            if (!strcmp(f, m))
                fsz = next_str(f, fend);
        if (!f_md || (!fsz && cut)) {
            return;   /* rank 0's files did not arrive, or not all of them */
        } else if (!fsz) {
            snprintf(why, cap, ": %s is not a data file of rank 0's", m);
            return;
        } else if (msz && strcmp(msz, fsz)) {
            snprintf(why, cap, ": %s: %s bytes on rank %d, %s on rank 0", m, msz, rk, fsz);
            return;
        }
    }
    for (const char *f = next_str(f_md, fend); f; f = next_str(next_str(f, fend), fend)) {
        int found = 0;
        for (const char *m = next_str(m_md, mend); m && !found; m = next_str(next_str(m, mend), mend))
            found = !strcmp(f, m);
        if (!found) {
            snprintf(why, cap, ": %s is a data file of rank 0's only", f);
            return;
        }
    }
    if (m_md && f_md && strcmp(m_md, f_md))
        snprintf(why, cap, ": .metadata: %s bytes on rank %d, %s on rank 0", m_md, rk, f_md);
    else if (m_ent && f_ent && strcmp(m_ent, f_ent))
        snprintf(why, cap, ": %s entries on rank %d, %s on rank 0", m_ent, rk, f_ent);
}

#define DIFF_TEXT_MAX ((int)1 << 20)   /* rank 0's part sent: 1 MiB (tens of thousands of shards) */

void ldi_identity_diff(MPI_Comm comm, dcp_checkpoint *ck, int rk, dcp_error *err)
{
    int me;
    MPI_Comm_rank(comm, &me);
    char why[DCP_ERRMSG_MAX] = "";
    MPI_Request r;
    MPI_Status st;
    if (me == rk) {
        /* a buffer first, whatever happens: its size tells rank 0 how much to send */
        static char small[4096];
        char *buf = malloc((size_t)DIFF_TEXT_MAX);
        int cap = buf ? DIFF_TEXT_MAX : (int)sizeof small, got = 0;
        if (!buf)
            buf = small;
        MPI_Isend(&cap, 1, MPI_INT, 0, 0, comm, &r);
        ldi_wait(1, &r, &st);
        MPI_Irecv(buf, cap, MPI_BYTE, 0, 1, comm, &r);
        ldi_wait(1, &r, &st);
        MPI_Get_count(&st, MPI_BYTE, &got);
        size_t mlen = 0;
        char *mine = identity_text(ck, &mlen);
        if (mine && mlen)
            compare(mine, mlen, buf, got > 0 ? (size_t)got : 0, rk, why, sizeof why);
        free(mine);
        if (buf != small)
            free(buf);
    } else if (me == 0) {
        int cap = 0;
        MPI_Irecv(&cap, 1, MPI_INT, rk, 0, comm, &r);
        ldi_wait(1, &r, &st);
        size_t len = 0;
        char *text = identity_text(ck, &len);
        int n = !text ? 0 : len < (size_t)cap ? (int)len : cap;
        MPI_Isend(text ? text : "", n, MPI_BYTE, rk, 1, comm, &r);
        ldi_wait(1, &r, &st);
        free(text);
    }
    ldi_bcast(why, (int)sizeof why, rk, comm);
    why[sizeof why - 1] = '\0';
    ldi_err(err, EINVAL, "dcp_load: rank %d passes another checkpoint than rank 0%.*s", rk,
            (int)(DCP_ERRMSG_MAX - 64), why);
}
