/* Each key's path in the nesting a state dict was flattened from (keypaths.h):
 * a table of copies, filled from a torch.save source's dicts (the
 * single-file reader's path hook) or from a DCP source's planner_data. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "keypaths.h"
#include "pickle.h"

#define PKL_MAX (1ull << 30)          /* a .metadata read for its planner_data */
#define MAX_DEPTH 64

void dcpw_kp_init(dcpw_keypaths *kp)
{
    memset(kp, 0, sizeof *kp);
    dcpi_arena_init(&kp->arena);
    dcpi_strmap_init(&kp->map);
}

void dcpw_kp_free(dcpw_keypaths *kp)
{
    dcpi_strmap_free(&kp->map);
    dcpi_arena_free(&kp->arena);
    free(kp->parts);
    free(kp->n);
}

bool dcpw_path_spells(const char *key, size_t kl, const dcp_path_part *parts, size_t n)
{
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        char num[24];
        const char *s = parts[i].str;
        size_t len = parts[i].len;
        if (!s) {
            len = (size_t)snprintf(num, sizeof num, "%" PRId64, parts[i].index);
            s = num;
        }
        if ((i && (at >= kl || key[at++] != '.')) || len > kl - at || memcmp(key + at, s, len))
            return false;
        at += len;
    }
    return n > 0 && at == kl;
}

int dcpw_kp_add(dcpw_keypaths *kp, const char *key, size_t kl, const dcp_path_part *parts, size_t n)
{
    if (kp->count == kp->cap) {
        size_t nc = kp->cap ? kp->cap * 2 : 64;
        dcp_path_part **np = realloc(kp->parts, nc * sizeof *np);
        if (np)
            kp->parts = np;
        size_t *nn = realloc(kp->n, nc * sizeof *nn);
        if (nn)
            kp->n = nn;
        if (!np || !nn)
            return -1;
        kp->cap = nc;
    }
    char *k = dcpi_arena_strndup(&kp->arena, key, kl);
    dcp_path_part *c = dcpi_arena_alloc(&kp->arena, (n ? n : 1) * sizeof *c);
    if (!k || !c)
        return -1;
    for (size_t i = 0; i < n; i++) {
        c[i] = parts[i];
        if (parts[i].str && !(c[i].str = dcpi_arena_strndup(&kp->arena, parts[i].str, parts[i].len)))
            return -1;
    }
    if (dcpi_strmap_put(&kp->map, k, kl, kp->count) < 0)
        return -1;
    kp->parts[kp->count] = c;
    kp->n[kp->count++] = n;
    return 0;
}

const dcp_path_part *dcpw_kp_get(const dcpw_keypaths *kp, const char *key, size_t *n)
{
    uint64_t i;
    if (!kp || !dcpi_strmap_get(&kp->map, key, strlen(key), &i))
        return NULL;
    *n = kp->n[i];
    return kp->parts[i];
}

int dcpw_kp_from_metadata(const char *dir, dcpw_keypaths *kp, dcp_error *err)
{
    char p[4200];
    if ((size_t)snprintf(p, sizeof p, "%s/.metadata", dir) >= sizeof p)
        return 0;
    int fd = open(p, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    struct stat st;
    if (fd < 0)
        return 0;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > PKL_MAX) {
        close(fd);
        return 0;
    }
    size_t size = (size_t)st.st_size, got = 0;
    char *buf = malloc(size ? size : 1);
    if (!buf) {
        close(fd);
        return dcpi_err(err, ENOMEM, "%s: out of memory", p);
    }
    while (got < size) {
        ssize_t r = pread(fd, buf + got, size - got, (off_t)got);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    pk_doc *doc = NULL;
    const pk_node *root;
    dcp_error ignored;
    int rc = 0;
    if (got == size && pk_parse(buf, size, p, &doc, &root, &ignored) == 0 && root->type == PK_CALL &&
        root->u.call.state) {
        const pk_node *state = pk_as_dict(root->u.call.state);
        if (!state && root->u.call.state->type == PK_TUPLE)   /* slots dataclass: (None, {slot: value}) */
            state = pk_as_dict(pk_item(root->u.call.state, 1));
        const pk_node *pd = pk_as_dict(pk_dict_get(state, "planner_data"));
        size_t np = 0;
        for (size_t i = 0; pd && i < pd->u.dict.n && rc == 0; i++) {
            const pk_node *path = pd->u.dict.vals[i];
            const char *key;
            size_t kl, n = pk_len(path);
            if (!pk_str(pd->u.dict.keys[i], &key, &kl) || !path || (path->type != PK_TUPLE && path->type != PK_LIST) ||
                n == 0 || n > MAX_DEPTH)
                continue;
            dcp_path_part parts[MAX_DEPTH];
            for (np = 0; np < n; np++) {
                const pk_node *e = pk_item(path, np);
                if (pk_str(e, &parts[np].str, &parts[np].len))
                    continue;
                if (!e || e->type != PK_INT)
                    break;
                parts[np] = (dcp_path_part){.index = e->u.i};
            }
            if (np == n && dcpw_kp_add(kp, key, kl, parts, n) < 0)
                rc = dcpi_err(err, ENOMEM, "%s: out of memory", p);
        }
    }
    pk_free(doc);
    free(buf);
    return rc;
}

/* The public table (dcp_write.h): dcpw_keypaths filled from a folder's .metadata. */
struct dcp_key_paths {
    dcpw_keypaths kp;
};

int dcp_key_paths_read(const char *dir, dcp_key_paths **out, dcp_error *err)
{
    *out = NULL;
    dcp_key_paths *t = malloc(sizeof *t);
    if (!t)
        return dcpi_err(err, ENOMEM, "%s: out of memory", dir);
    dcpw_kp_init(&t->kp);
    if (dcpw_kp_from_metadata(dir, &t->kp, err) < 0) {
        dcp_key_paths_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

const dcp_path_part *dcp_key_paths_get(const dcp_key_paths *kp, const char *key, size_t *n)
{
    return kp ? dcpw_kp_get(&kp->kp, key, n) : NULL;
}

void dcp_key_paths_free(dcp_key_paths *kp)
{
    if (!kp)
        return;
    dcpw_kp_free(&kp->kp);
    free(kp);
}
