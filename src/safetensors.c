/* The Hugging Face storage layout: *.safetensors files (written by
 * torch.distributed.checkpoint's HuggingFaceStorageWriter or by anyone) and no
 * .metadata. Each tensor entry is a chunk; DCP_SHARDING_INFO in the header's
 * __metadata__ gives its offsets in the global tensor (zeros otherwise), and
 * the global shape is the element-wise max of offset+shape over its chunks. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "safetensors.h"

int dcpi_st_header(int fd, uint64_t offset, uint64_t fsize, const char *what, json_t **root,
                   uint64_t *data_start, dcp_error *err)
{
    unsigned char hl[8];
    *root = NULL;
    if (offset > fsize || fsize - offset < 8 || pread(fd, hl, 8, (off_t)offset) != 8)
        return dcpi_err(err, EIO, "%s: too short for a safetensors header", what);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = (n << 8) | hl[i];
    if (n > DCPI_ST_HEADER_MAX || n > fsize - offset - 8)
        return dcpi_err(err, EIO, "%s: safetensors header length %llu is out of range", what, (unsigned long long)n);
    char *buf = malloc(n ? n : 1);
    if (!buf)
        return dcpi_err(err, ENOMEM, "%s: out of memory", what);
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, buf + got, n - got, (off_t)(offset + 8 + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            free(buf);
            return dcpi_err(err, EIO, "%s: short read of the safetensors header", what);
        }
        got += (size_t)r;
    }
    json_error_t je;
    json_t *j = json_loadb(buf, n, 0, &je);
    free(buf);
    if (!j || !json_is_object(j)) {
        json_decref(j);
        return dcpi_err(err, EIO, "%s: bad safetensors header: %s", what, j ? "not a JSON object" : je.text);
    }
    *root = j;
    *data_start = offset + 8 + n;
    return 0;
}

typedef struct piece {
    const char *key;              /* arena */
    dcp_dtype dt;
    int nd;
    int64_t off[DCPI_MAX_NDIM], size[DCPI_MAX_NDIM];
    dcp_blob blob;
    size_t next;                  /* next piece of the same key, or SIZE_MAX */
} piece;

typedef struct gather {
    piece *p;
    size_t n, cap;
    dcpi_strmap first, last;      /* key -> first / last piece index */
    size_t *order;                /* first piece of each key, in discovery order */
    size_t nkeys;
} gather;

static int is_safetensors(const char *name)
{
    size_t n = strlen(name);
    return n > 12 && !strcmp(name + n - 12, ".safetensors") && name[0] != '.';
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The tensors of file rel, as pieces in g. sharding_info NULL: the file is
 * read alone, DCP_SHARDING_INFO left aside (each tensor is what it holds);
 * else set when the file has it. name: the file in messages (NULL:
 * folder/rel). */
static int load_file(dcp_checkpoint *ck, const char *rel, const char *name_in, gather *g, int *sharding_info,
                     dcp_error *err)
{
    char what[4096];
    snprintf(what, sizeof what, "%s%s%s", name_in ? name_in : ck->path, name_in ? "" : "/", name_in ? "" : rel);
    uint32_t file;
    if (dcpi_model_file(ck, rel, strlen(rel), &file, err) < 0)
        return -1;
    int fd = openat(ck->dirfd, rel, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode)) {
        int e = fd < 0 ? errno : EINVAL;
        if (fd >= 0)
            close(fd);
        return dcpi_err(err, e, "%s: cannot open: %s", what, strerror(e));
    }
    json_t *root;
    uint64_t data;
    int rc = dcpi_st_header(fd, 0, (uint64_t)sb.st_size, what, &root, &data, err);
    close(fd);
    if (rc < 0)
        return -1;
    json_t *shard = NULL;
    const char *info = json_string_value(json_object_get(json_object_get(root, "__metadata__"), "DCP_SHARDING_INFO"));
    if (info && sharding_info) {
        json_error_t je;
        shard = json_loads(info, 0, &je);
        *sharding_info = 1;
    }
    const char *name;
    json_t *t;
    json_object_foreach(root, name, t) {
        if (!strcmp(name, "__metadata__"))
            continue;
        dcp_dtype dt;
        int nd;
        int64_t size[DCPI_MAX_NDIM];
        uint64_t b0, nbytes;
        const char *why;
        if (dcpi_st_entry(t, (uint64_t)sb.st_size - data, &dt, &nd, size, &b0, &nbytes, &why) < 0) {
            rc = dcpi_err(err, EIO, "%s: %s: %s", what, name, why);
            break;
        }
        if (g->n == g->cap) {
            size_t nc = g->cap ? g->cap * 2 : 64;
            piece *np = realloc(g->p, nc * sizeof *np);
            if (!np) {
                rc = dcpi_err(err, ENOMEM, "%s: out of memory", what);
                break;
            }
            g->p = np;
            g->cap = nc;
        }
        piece *p = &g->p[g->n];
        memset(p, 0, sizeof *p);
        p->next = SIZE_MAX;
        p->key = dcpi_arena_strndup(&ck->arena, name, strlen(name));
        p->dt = dt;
        p->nd = nd;
        memcpy(p->size, size, (size_t)nd * sizeof *size);
        json_t *saved = json_object_get(json_object_get(shard, name), "saved_offsets");
        int ok = p->key && (!saved || json_array_size(saved) == (size_t)nd);
        for (int d = 0; ok && d < nd; d++) {
            json_t *o = saved ? json_array_get(saved, (size_t)d) : NULL;
            p->off[d] = o ? json_integer_value(o) : 0;
            ok = (!saved || json_is_integer(o)) && p->off[d] >= 0;
        }
        if (!ok) {
            rc = dcpi_err(err, p->key ? EIO : ENOMEM, "%s: %s: %s", what, name,
                          p->key ? "bad saved_offsets in DCP_SHARDING_INFO" : "out of memory");
            break;
        }
        p->blob = (dcp_blob){.file = file, .transforms = DCPI_BLOB_RAW, .offset = data + b0, .length = nbytes};
        uint64_t v;
        size_t klen = strlen(p->key);
        if (dcpi_strmap_get(&g->last, p->key, klen, &v)) {
            g->p[v].next = g->n;
        } else {
            size_t *no = realloc(g->order, (g->nkeys + 1) * sizeof *no);
            if (!no || dcpi_strmap_put(&g->first, p->key, klen, g->n) < 0) {
                free(no);
                rc = dcpi_err(err, ENOMEM, "%s: out of memory", what);
                break;
            }
            g->order = no;
            g->order[g->nkeys++] = g->n;
        }
        if (dcpi_strmap_put(&g->last, p->key, klen, g->n) < 0) {
            rc = dcpi_err(err, ENOMEM, "%s: out of memory", what);
            break;
        }
        g->n++;
    }
    json_decref(shard);
    json_decref(root);
    return rc;
}

/* The files to read: the folder's *.safetensors, else those under sharded/. */
static int list_files(dcp_checkpoint *ck, const char *sub, char ***out, size_t *n, dcp_error *err)
{
    *out = NULL;
    *n = 0;
    int fd = openat(ck->dirfd, sub, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0)
            close(fd);
        return 0;
    }
    struct dirent *de;
    int rc = 0;
    while ((de = readdir(d))) {
        if (!is_safetensors(de->d_name))
            continue;
        char **nl = realloc(*out, (*n + 1) * sizeof *nl);
        char *name = malloc(strlen(sub) + strlen(de->d_name) + 2);
        if (!nl || !name) {
            free(nl ? NULL : name);
            if (nl)
                *out = nl;
            free(name);
            rc = dcpi_err(err, ENOMEM, "%s: out of memory", ck->path);
            break;
        }
        *out = nl;
        sprintf(name, "%s%s%s", strcmp(sub, ".") ? sub : "", strcmp(sub, ".") ? "/" : "", de->d_name);
        (*out)[(*n)++] = name;
    }
    closedir(d);
    if (*n)
        qsort(*out, *n, sizeof **out, cmp_str);
    return rc;
}

/* The model's entries from the pieces: a key's global shape is the
 * element-wise max of offset+shape over its pieces, each piece a chunk. */
static int build(dcp_checkpoint *ck, gather *g, dcp_error *err)
{
    int rc = 0;
    for (size_t k = 0; k < g->nkeys && rc == 0; k++) {
        piece *p0 = &g->p[g->order[k]];
        int64_t shape[DCPI_MAX_NDIM] = {0};
        for (size_t i = g->order[k]; i != SIZE_MAX; i = g->p[i].next) {
            piece *p = &g->p[i];
            if (p->nd != p0->nd || p->dt != p0->dt) {
                rc = dcpi_err(err, EIO, "%s: %s: chunks disagree on dtype or dimensions", ck->path, p->key);
                break;
            }
            for (int d = 0; d < p->nd; d++) {
                uint64_t end;
                if (!dcpi_add_u64((uint64_t)p->off[d], (uint64_t)p->size[d], &end) || end > INT64_MAX)
                    rc = dcpi_err(err, EIO, "%s: %s: chunk offsets overflow", ck->path, p->key);
                else if ((int64_t)end > shape[d])
                    shape[d] = (int64_t)end;
            }
        }
        size_t idx, ci;
        if (rc == 0 && (dcpi_model_entry(ck, p0->key, strlen(p0->key), DCP_KIND_TENSOR, &idx, err) < 0 ||
                        dcpi_model_set_tensor(ck, idx, p0->dt, p0->nd, shape, err) < 0))
            rc = -1;
        for (size_t i = g->order[k]; i != SIZE_MAX && rc == 0; i = g->p[i].next) {
            if (dcpi_model_add_chunk(ck, idx, g->p[i].off, g->p[i].size, &ci, err) < 0) {
                rc = -1;
                break;
            }
            dcpi_model_chunk_blob(ck, idx, ci, &g->p[i].blob);
        }
    }
    return rc;
}

static void gather_free(gather *g)
{
    free(g->p);
    free(g->order);
    dcpi_strmap_free(&g->first);
    dcpi_strmap_free(&g->last);
}

int dcpi_load_safetensors_file(dcp_checkpoint *ck, const char *rel, const char *name, dcp_error *err)
{
    gather g = {0};
    dcpi_strmap_init(&g.first);
    dcpi_strmap_init(&g.last);
    int rc = load_file(ck, rel, name, &g, NULL, err);
    if (rc == 0)
        rc = build(ck, &g, err);
    gather_free(&g);
    if (rc == 0) {
        ck->info.generation = "safetensors file";
        ck->info.serialization = "safetensors";
        ck->info.layout = "single file";   /* dcpi_ck_name then names the file */
    }
    return rc;
}

int dcpi_load_huggingface(dcp_checkpoint *ck, dcp_error *err)
{
    char **files;
    size_t nfiles;
    const char *sub = ".";
    if (list_files(ck, sub, &files, &nfiles, err) < 0)
        return -1;
    if (nfiles == 0 && list_files(ck, sub = "sharded", &files, &nfiles, err) < 0)
        return -1;
    gather g = {0};
    dcpi_strmap_init(&g.first);
    dcpi_strmap_init(&g.last);
    int rc = nfiles ? 0 : dcpi_err(err, ENOENT, "%s: no .safetensors files", ck->path);
    int sharding_info = 0;
    for (size_t i = 0; i < nfiles && rc == 0; i++)
        rc = load_file(ck, files[i], NULL, &g, &sharding_info, err);
    if (rc == 0)
        rc = build(ck, &g, err);
    if (rc == 0)
        rc = dcpi_hf_index_check(ck, sub, files, nfiles, err);
    for (size_t i = 0; i < nfiles; i++)
        free(files[i]);
    free(files);
    gather_free(&g);
    if (rc == 0) {
        ck->info.generation = sharding_info ? "Hugging Face safetensors written by torch.distributed.checkpoint (DCP_SHARDING_INFO)"
                                            : "Hugging Face safetensors";
        ck->info.serialization = "hf_safetensors";
        ck->info.layout = "huggingface";
    }
    return rc;
}

int dcpi_st_entry(const json_t *t, uint64_t data_len, dcp_dtype *dt, int *nd, int64_t *size, uint64_t *begin,
                  uint64_t *nbytes, const char **why)
{
    json_t *dts = json_object_get(t, "dtype"), *shape = json_object_get(t, "shape");
    json_t *offs = json_object_get(t, "data_offsets");
    if (!json_is_string(dts) || !json_is_array(shape) || !json_is_array(offs) || json_array_size(offs) != 2 ||
        json_array_size(shape) > DCPI_MAX_NDIM) {
        *why = "malformed safetensors entry";
        return -1;
    }
    *dt = dcp_dtype_from_safetensors(json_string_value(dts));
    *nd = (int)json_array_size(shape);
    json_t *j0 = json_array_get(offs, 0), *j1 = json_array_get(offs, 1);
    json_int_t b0 = json_integer_value(j0), b1 = json_integer_value(j1);
    uint64_t numel = 1;
    int ok = *dt != DCP_DTYPE_INVALID && json_is_integer(j0) && json_is_integer(j1) && b0 >= 0 && b1 >= b0 &&
             (uint64_t)b1 <= data_len;
    for (int d = 0; ok && d < *nd; d++) {
        json_t *s = json_array_get(shape, (size_t)d);
        size[d] = json_integer_value(s);
        ok = json_is_integer(s) && size[d] >= 0;
    }
    ok = ok && dcpi_shape_numel(*nd, size, &numel);   /* a 0 anywhere: 0 elements, [2^62,0] too */
    if (!ok || !dcpi_mul_u64(numel, dcp_dtype_size(*dt), nbytes) || (uint64_t)(b1 - b0) != *nbytes) {
        *why = "bad dtype, shape, offsets or data range";
        return -1;
    }
    *begin = (uint64_t)b0;
    return 0;
}
