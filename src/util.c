/* The library's version, errors as values, an arena for open-time data, and a string hash map. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

unsigned dcp_version_number(void)
{
    return DCP_VERSION_NUMBER;
}

const char *dcp_version(void)
{
    return DCP_VERSION_STRING;
}

int dcpi_err(dcp_error *err, int code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->code = code;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return -1;
}

int dcpi_err_prefix(dcp_error *err, const char *fmt, ...)
{
    if (err) {
        char prefix[DCP_ERRMSG_MAX], old[DCP_ERRMSG_MAX];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(prefix, sizeof prefix, fmt, ap);
        va_end(ap);
        memcpy(old, err->msg, sizeof old);
        size_t n = strnlen(prefix, sizeof err->msg - 3);
        memcpy(err->msg, prefix, n);
        memcpy(err->msg + n, ": ", 2);
        size_t room = sizeof err->msg - n - 3;
        size_t m = strnlen(old, room);
        memcpy(err->msg + n + 2, old, m);
        err->msg[n + 2 + m] = 0;
    }
    return -1;
}

/* ---------------------------------------------------------------- arena */

struct dcpi_arena_block {
    struct dcpi_arena_block *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

#define ARENA_BLOCK (64 * 1024)

void dcpi_arena_init(dcpi_arena *a) { a->head = NULL; a->total = 0; }

void dcpi_arena_free(dcpi_arena *a)
{
    struct dcpi_arena_block *b = a->head;
    while (b) {
        struct dcpi_arena_block *n = b->next;
        free(b);
        b = n;
    }
    a->head = NULL;
    a->total = 0;
}

void *dcpi_arena_alloc(dcpi_arena *a, size_t n)
{
    size_t need = (n + 15) & ~(size_t)15;
    if (need < n)
        return NULL;
    struct dcpi_arena_block *b = a->head;
    if (!b || b->cap - b->used < need) {
        size_t cap = need > ARENA_BLOCK / 4 ? need : ARENA_BLOCK;
        if (cap > SIZE_MAX - sizeof *b)
            return NULL;
        struct dcpi_arena_block *nb = malloc(sizeof *nb + cap);
        if (!nb)
            return NULL;
        nb->used = 0;
        nb->cap = cap;
        if (cap == need && b) {   /* a big one-off: keep the current block current */
            nb->next = b->next;
            b->next = nb;
        } else {
            nb->next = b;
            a->head = nb;
        }
        a->total += cap;
        b = nb;
    }
    void *p = b->data + b->used;
    b->used += need;
    memset(p, 0, n);
    return p;
}

dcpi_arena_mark dcpi_arena_here(const dcpi_arena *a)
{
    dcpi_arena_mark mk = {.head = a->head, .total = a->total};
    if (a->head) {
        mk.next = a->head->next;
        mk.used = a->head->used;
    }
    return mk;
}

/* Blocks made since the mark are the new heads in front of mk->head and the
 * big one-offs dcpi_arena_alloc put right behind a head (mk->head's own
 * lie between it and mk->next). */
void dcpi_arena_rewind(dcpi_arena *a, const dcpi_arena_mark *mk)
{
    struct dcpi_arena_block *b = a->head;
    while (b && b != mk->head) {
        struct dcpi_arena_block *n = b->next;
        free(b);
        b = n;
    }
    a->head = mk->head;
    if (mk->head) {
        b = mk->head->next;
        while (b && b != mk->next) {
            struct dcpi_arena_block *n = b->next;
            free(b);
            b = n;
        }
        mk->head->next = mk->next;
        mk->head->used = mk->used;
    }
    a->total = mk->total;
}

char *dcpi_arena_strndup(dcpi_arena *a, const char *s, size_t n)
{
    if (n == SIZE_MAX)
        return NULL;
    char *p = dcpi_arena_alloc(a, n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

void *dcpi_arena_memdup(dcpi_arena *a, const void *src, size_t n)
{
    void *p = dcpi_arena_alloc(a, n ? n : 1);
    if (p && n)
        memcpy(p, src, n);
    return p;
}

/* ------------------------------------------------------------ string map */

struct dcpi_strmap_slot {
    const char *key;
    size_t len;
    uint64_t hash;
    uint64_t value;
};

uint64_t dcpi_hash_bytes(const void *p, size_t n)
{
    /* FNV-1a, then a final mix: keys are short and this is not a checksum. */
    const unsigned char *s = p;
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 1099511628211ULL;
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return h;
}

void dcpi_strmap_init(dcpi_strmap *m) { m->slots = NULL; m->cap = m->count = 0; }
void dcpi_strmap_free(dcpi_strmap *m) { free(m->slots); dcpi_strmap_init(m); }

static struct dcpi_strmap_slot *find_slot(struct dcpi_strmap_slot *slots, size_t cap,
                                         const char *key, size_t len, uint64_t h)
{
    size_t i = h & (cap - 1);
    for (;;) {
        struct dcpi_strmap_slot *s = &slots[i];
        if (!s->key || (s->hash == h && s->len == len && memcmp(s->key, key, len) == 0))
            return s;
        i = (i + 1) & (cap - 1);
    }
}

int dcpi_strmap_put(dcpi_strmap *m, const char *key, size_t len, uint64_t value)
{
    if ((m->count + 1) * 4 >= m->cap * 3) {
        size_t ncap = m->cap ? m->cap * 2 : 64;
        if (ncap > SIZE_MAX / sizeof(struct dcpi_strmap_slot))
            return -1;
        struct dcpi_strmap_slot *ns = calloc(ncap, sizeof *ns);
        if (!ns)
            return -1;
        for (size_t i = 0; i < m->cap; i++)
            if (m->slots[i].key)
                *find_slot(ns, ncap, m->slots[i].key, m->slots[i].len, m->slots[i].hash) = m->slots[i];
        free(m->slots);
        m->slots = ns;
        m->cap = ncap;
    }
    uint64_t h = dcpi_hash_bytes(key, len);
    struct dcpi_strmap_slot *s = find_slot(m->slots, m->cap, key, len, h);
    if (!s->key)
        m->count++;
    s->key = key;
    s->len = len;
    s->hash = h;
    s->value = value;
    return 0;
}

bool dcpi_strmap_get(const dcpi_strmap *m, const char *key, size_t len, uint64_t *value)
{
    if (!m->cap)
        return false;
    struct dcpi_strmap_slot *s = find_slot(m->slots, m->cap, key, len, dcpi_hash_bytes(key, len));
    if (!s->key)
        return false;
    if (value)
        *value = s->value;
    return true;
}

int dcpi_path_inside_folder(const char *path, const char *folder_path)
{
    char dir[PATH_MAX], real[PATH_MAX], folder[PATH_MAX];
    if (!strcmp(path, ":memory:"))
        return 0;
    /* The deepest existing ancestor decides: folders that do not exist yet
     * would be created under it. */
    snprintf(dir, sizeof dir, "%s", path);
    for (;;) {
        char *slash = strrchr(dir, '/');
        if (!slash) {
            snprintf(dir, sizeof dir, ".");
            break;
        }
        *(slash == dir ? slash + 1 : slash) = 0;
        if (slash == dir || realpath(dir, real))
            break;
    }
    if (!realpath(dir, real) || !realpath(folder_path, folder))
        return 0;
    size_t n = strlen(folder);
    return !strncmp(real, folder, n) && (real[n] == 0 || real[n] == '/');
}

int dcpi_dirent_regular(int dirfd, const struct dirent *de)
{
    if (de->d_type == DT_REG)
        return 1;
    if (de->d_type != DT_LNK && de->d_type != DT_UNKNOWN)
        return 0;
    struct stat st;   /* a link counts by what it names (the Hugging Face cache links its blobs) */
    return fstatat(dirfd, de->d_name, &st, 0) == 0 && S_ISREG(st.st_mode);
}

int dcpi_read_json(dcp_checkpoint *ck, const char *rel, const char *what, uint64_t max, const char *bound,
                   json_t **root, dcp_error *err)
{
    return dcpi_read_json_at(ck->dirfd, rel, what, max, bound, root, err);
}

int dcpi_read_json_at(int dirfd, const char *rel, const char *what, uint64_t max, const char *bound,
                      json_t **root, dcp_error *err)
{
    *root = NULL;
    int fd = openat(dirfd, rel, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return errno == ENOENT ? 0 : dcpi_err(err, errno, "%s: cannot open: %s", what, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return dcpi_err(err, EINVAL, "%s: not a regular file", what);
    }
    if ((uint64_t)st.st_size > max) {
        close(fd);
        return dcpi_err(err, EFBIG, "%s: %lld bytes: larger than %s (%" PRIu64 " %s at most)", what,
                        (long long)st.st_size, bound, max % (1u << 20) ? max : max >> 20,
                        max % (1u << 20) ? "bytes" : "MiB");
    }
    size_t len = (size_t)st.st_size;
    char *buf = malloc(len ? len : 1);
    if (!buf) {
        close(fd);
        return dcpi_err(err, ENOMEM, "%s: out of memory", what);
    }
    size_t got = 0;
    while (got < len) {
        ssize_t r = pread(fd, buf + got, len - got, (off_t)got);
        if (r <= 0) {
            int e = r < 0 ? errno : EIO;
            free(buf);
            close(fd);
            return dcpi_err(err, e, "%s: cannot read: %s", what, r < 0 ? strerror(e) : "shorter than its size");
        }
        got += (size_t)r;
    }
    close(fd);
    json_error_t je;
    *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
    free(buf);
    if (!*root)
        return dcpi_err(err, EIO, "%s: not valid JSON: %s (line %d)", what, je.text, je.line);
    return 0;
}
