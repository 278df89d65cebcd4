/* dcp_export_hf: a checkpoint written as a Hugging Face model folder by a
 * recipe (recipe.c), streaming.
 *
 * Every output tensor is a view of one source tensor: some leading
 * dimensions fixed (a layer-stacked key unstacked), then its rows (dim 0)
 * taken through a row map (a part of a split, a fused QKV's q/k/v rows, a
 * rotary permutation within each head), each row whole. Rows that stay
 * adjacent form runs, and each run is a contiguous byte range of the source
 * tensor's C-order image, so the safetensors writer's fill (1 MiB at a time)
 * plans and reads runs through dcp_plan_bytes: a permutation reads row by
 * row, a rename in MiB pieces, and no tensor is ever held whole. Casts go
 * through a bounded staging buffer. The folder is written under a temporary
 * name and renamed into place at the end, as dcp_convert_files does. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dcp_export.h"
#include "atomic.h"
#include "internal.h"
#include "sized_opts.h"
#include "pickle.h"
#include "recipe.h"
#include "zip.h"

#ifndef DCP_RECIPEDIR
#define DCP_RECIPEDIR NULL
#endif

#define STAGE_BYTES (4u << 20)       /* source bytes staged for a cast */
#define OUTPUTS_MAX (1u << 22)       /* output tensors of one export */
#define CONFIG_MAX (16u << 20)       /* bytes of a config.json */
#define ARGS_PKL_MAX (64u << 20)     /* bytes of common.pt's data.pkl */
#define NAME_MAX_LEN 1024

typedef struct hf_out {
    char *key;
    const char *from;                /* the source key (errors) */
    size_t entry;
    uint64_t base;                   /* element of the source image where the unstacked view starts */
    int64_t rows;                    /* output dim 0 (1 for a 0-d output) */
    uint64_t row_elems;              /* elements per row */
    rcp_rowmap maps[2];
    int nmaps;
    dcp_dtype in, out;
    int ndim;
    int64_t shape[DCPI_MAX_NDIM];
    uint64_t nbytes;
} hf_out;

typedef struct hf {
    dcp_checkpoint *ck;
    const dcp_export_options *opt;
    const char *srcp;
    hf_out *outs;
    size_t nouts, cap;
    dcp_plan plan;
    unsigned char *stage;
    uint64_t done, total;
    json_t *config;                  /* --config's object, or NULL */
} hf;

/* ------------------------------------------------------------ dtype casts */

static float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);          /* NaN stays a (quiet) NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);   /* round to nearest even */
}

static float f16_to_f32(uint16_t h)
{
    uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
    if (e == 0x1f) {
        u = s | 0x7f800000u | (m << 13);
    } else if (e) {
        u = s | ((e + 112) << 23) | (m << 13);
    } else if (!m) {
        u = s;
    } else {                                          /* subnormal: normalise */
        e = 113;
        while (!(m & 0x400)) {
            m <<= 1;
            e--;
        }
        u = s | (e << 23) | ((m & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t s = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return s | 0x7e00;                            /* NaN */
    if (a >= 0x477ff000u)                             /* rounds past 65504: infinity */
        return s | 0x7c00;
    if (a < 0x38800000u) {                            /* subnormal or zero in half */
        if (a < 0x33000000u)                          /* below half the smallest subnormal */
            return s;
        uint32_t m = (a & 0x7fffff) | 0x800000, e = a >> 23;
        uint32_t shift = 126 - e;                     /* 14..24 */
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (r & 1)))
            r++;
        return s | (uint16_t)r;
    }
    uint32_t r = a - 0x38000000u;                     /* rebias the exponent */
    r = (r + 0xfffu + ((r >> 13) & 1)) >> 13;
    return s | (uint16_t)r;
}

static int is_float(dcp_dtype d)
{
    return d == DCP_FLOAT32 || d == DCP_FLOAT16 || d == DCP_BFLOAT16 || d == DCP_FLOAT64;
}

/* n elements of dtype in at src to dtype out at dst (both floating point). */
static void cast(dcp_dtype in, const unsigned char *src, dcp_dtype out, unsigned char *dst, size_t n)
{
    /* The common casts as tight loops the compiler vectorises; the rest element by element. */
    if (in == DCP_FLOAT32 && (out == DCP_BFLOAT16 || out == DCP_FLOAT16)) {
        for (size_t i = 0; i < n; i++) {
            float f;
            memcpy(&f, src + 4 * i, 4);
            uint16_t h = out == DCP_BFLOAT16 ? f32_to_bf16(f) : f32_to_f16(f);
            memcpy(dst + 2 * i, &h, 2);
        }
        return;
    }
    if (in == DCP_BFLOAT16 && out == DCP_FLOAT32) {
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            uint32_t u = (uint32_t)h << 16;
            memcpy(dst + 4 * i, &u, 4);
        }
        return;
    }
    for (size_t i = 0; i < n; i++) {
        float f;
        double d = 0;
        uint16_t h;
        switch (in) {
        case DCP_FLOAT32: memcpy(&f, src + 4 * i, 4); break;
        case DCP_FLOAT64: memcpy(&d, src + 8 * i, 8); f = (float)d; break;
        case DCP_FLOAT16: memcpy(&h, src + 2 * i, 2); f = f16_to_f32(h); break;
        default: memcpy(&h, src + 2 * i, 2); f = bf16_to_f32(h); break;
        }
        switch (out) {
        case DCP_FLOAT32: memcpy(dst + 4 * i, &f, 4); break;
        case DCP_FLOAT64:
            d = in == DCP_FLOAT64 ? d : (double)f;
            memcpy(dst + 8 * i, &d, 8);
            break;
        case DCP_FLOAT16: h = f32_to_f16(f); memcpy(dst + 2 * i, &h, 2); break;
        default: h = f32_to_bf16(f); memcpy(dst + 2 * i, &h, 2); break;
        }
    }
}

/* ------------------------------------------------------------ the source */

static int fill(void *ctx, uint64_t tag, uint64_t off, void *buf, size_t len, dcp_error *err)
{
    hf *h = ctx;
    const hf_out *o = &h->outs[tag];
    const dcp_entry *e = dcp_entry_at(h->ck, o->entry);
    size_t isz = dcp_dtype_size(o->in), osz = dcp_dtype_size(o->out);
    if (!e || off % osz || len % osz)
        return dcpi_err(err, EIO, "%s: %s: a read of the output not on element boundaries", h->srcp, o->key);
    uint64_t el = off / osz, n = len / osz;
    unsigned char *dst = buf;
    int same = o->in == o->out;
    uint64_t stage_elems = STAGE_BYTES / isz;
    while (n) {
        int64_t r = (int64_t)(el / o->row_elems);
        uint64_t c = el % o->row_elems;
        int64_t s = rcp_map_row(o->maps, o->nmaps, r);
        uint64_t cnt = o->row_elems - c;
        if (cnt > n)
            cnt = n;
        /* Following rows whose sources follow too join the run. */
        for (int64_t rr = r, ss = s; cnt < n && rr + 1 < o->rows; rr++, ss++) {
            if (!same && cnt >= stage_elems)
                break;
            if (rcp_map_row(o->maps, o->nmaps, rr + 1) != ss + 1)
                break;
            cnt += n - cnt < o->row_elems ? n - cnt : o->row_elems;
        }
        if (!same && cnt > stage_elems)
            cnt = stage_elems;
        uint64_t soff = (o->base + (uint64_t)s * o->row_elems + c) * isz;
        if (dcp_plan_bytes(h->ck, e, soff, cnt * isz, &h->plan, err) < 0)
            return dcpi_err_prefix(err, "%s", o->key);
        if (h->plan.nbytes != cnt * isz)
            return dcpi_err(err, EIO, "%s: %s: short read for %s", h->srcp, e->key, o->key);
        if (dcp_plan_execute(h->ck, &h->plan, same ? dst : h->stage, err) < 0)
            return -1;
        if (!same)
            cast(o->in, h->stage, o->out, dst, (size_t)cnt);
        dst += cnt * osz;
        el += cnt;
        n -= cnt;
    }
    h->done += len;
    if (h->opt->progress)
        h->opt->progress(h->opt->progress_ctx, h->done, h->total);
    return 0;
}

/* ------------------------------------------------------------ planning */

/* A rule's parameter: literal, else from the config. 0 when neither has it. */
static int param(const hf *h, const rcp_param *p, int64_t *v)
{
    if (p->value) {
        *v = p->value;
        return 1;
    }
    for (int i = 0; i < p->nnames && h->config; i++) {
        json_t *x = json_object_get(h->config, p->names[i]);
        if (json_is_integer(x) && json_integer_value(x) > 0 && json_integer_value(x) <= (1 << 24)) {
            *v = json_integer_value(x);
            return 1;
        }
    }
    return 0;
}

static int need_param(const hf *h, const rcp_recipe *rc, const rcp_rule *ru, const rcp_param *p, const char *what,
                      const char *key, int64_t *v, dcp_error *err)
{
    if (param(h, p, v))
        return 0;
    const char *name = p->nnames ? p->names[0] : "a number";
    if (h->opt->config)
        return dcpi_err(err, EINVAL, "%s: %s: rule '%s' of recipe %s needs %s (%s), which %s lacks", h->srcp, key,
                        ru->from, rc->name, what, name, h->opt->config);
    return dcpi_err(err, EINVAL, "%s: %s: rule '%s' of recipe %s needs %s (%s): give --config FILE (the model's "
                    "config.json)", h->srcp, key, ru->from, rc->name, what, name);
}

static int add_out(hf *h, hf_out *o, dcp_error *err)
{
    if (h->nouts == h->cap) {
        if (h->cap >= OUTPUTS_MAX)
            return dcpi_err(err, EFBIG, "%s: more than %u output tensors", h->srcp, OUTPUTS_MAX);
        size_t nc = h->cap ? h->cap * 2 : 64;
        hf_out *n = realloc(h->outs, nc * sizeof *n);
        if (!n)
            return dcpi_err(err, ENOMEM, "%s: out of memory", h->srcp);
        h->outs = n;
        h->cap = nc;
    }
    h->outs[h->nouts++] = *o;
    return 0;
}

/* The outputs of source entry i matched by m. */
static int plan_entry(hf *h, const rcp_recipe *rc, size_t i, const dcp_entry *e, const rcp_match *m, dcp_error *err)
{
    const rcp_rule *ru = m->rule;
    int ns = m->nstack, split = ru->op != RCP_RENAME;
    if (e->kind != DCP_KIND_TENSOR)
        return dcpi_err(err, EINVAL, "%s: %s: a bytes item, not a tensor (rule '%s' of recipe %s)", h->srcp, e->key,
                        ru->from, rc->name);
    if (e->ndim < ns + split)
        return dcpi_err(err, EINVAL, "%s: %s: %d dimensions, but rule '%s' of recipe %s unstacks %d and %s", h->srcp,
                        e->key, e->ndim, ru->from, rc->name, ns, split ? "splits the next" : "keeps the rest");
    dcp_dtype out = e->dtype;
    if (h->opt->dtype != DCP_DTYPE_INVALID && is_float(e->dtype))
        out = h->opt->dtype;
    if (!dcp_dtype_safetensors(out))
        return dcpi_err(err, EINVAL, "%s: %s: safetensors has no dtype %s", h->srcp, e->key, dcp_dtype_name(out));
    int64_t rows_in = e->ndim > ns ? e->shape[ns] : 1;
    uint64_t row_elems = 1, sub = 1;
    for (int d = ns + 1; d < e->ndim; d++)
        if (!dcpi_mul_u64(row_elems, (uint64_t)e->shape[d], &row_elems))
            return dcpi_err(err, EFBIG, "%s: %s: the shape overflows", h->srcp, e->key);
    if (!dcpi_mul_u64(row_elems, (uint64_t)rows_in, &sub))
        return dcpi_err(err, EFBIG, "%s: %s: the shape overflows", h->srcp, e->key);

    /* Row maps and output rows, per output name. */
    int64_t rows[RCP_MAX_OUT];
    rcp_rowmap maps[RCP_MAX_OUT][2];
    int nmaps[RCP_MAX_OUT] = {0};
    memset(maps, 0, sizeof maps);
    if (ru->op == RCP_RENAME) {
        rows[0] = rows_in;
    } else if (ru->op == RCP_SPLIT) {
        if (rows_in % ru->nto)
            return dcpi_err(err, EINVAL, "%s: %s: %" PRId64 " rows do not split into %d equal parts (rule '%s')",
                            h->srcp, e->key, rows_in, ru->nto, ru->from);
        for (int t = 0; t < ru->nto; t++) {
            rows[t] = rows_in / ru->nto;
            maps[t][0] = (rcp_rowmap){.kind = 0, .offset = t * rows[t]};
            nmaps[t] = 1;
        }
    } else {
        int64_t heads, kv = 0, hd = 0;
        if (need_param(h, rc, ru, &ru->heads, "the number of attention heads", e->key, &heads, err) < 0)
            return -1;
        if (ru->op == RCP_SPLIT_QKV) {
            if (!param(h, &ru->kv_heads, &kv))
                kv = heads;
            if (!param(h, &ru->head_dim, &hd))
                hd = rows_in / (heads + 2 * kv);
            if (kv <= 0 || heads % kv || hd <= 0 || hd * (heads + 2 * kv) != rows_in || (ru->rope && hd % 2))
                return dcpi_err(err, EINVAL, "%s: %s: %" PRId64 " rows are not a fused QKV of %" PRId64
                                " query heads, %" PRId64 " key/value heads of %" PRId64 " rows (rule '%s')",
                                h->srcp, e->key, rows_in, heads, kv, hd, ru->from);
            for (int t = 0; t < 3; t++) {
                rows[t] = (t == 0 ? heads : kv) * hd;
                maps[t][0] = (rcp_rowmap){.kind = 1, .part = t, .groups = kv, .per_group = heads / kv,
                                          .head_dim = hd};
                nmaps[t] = 1;
                if (ru->rope && t < 2) {
                    maps[t][1] = (rcp_rowmap){.kind = ru->rope == RCP_ROPE_TO_HF ? 2 : 3, .hd = hd};
                    nmaps[t] = 2;
                }
            }
        } else {   /* ROPE_PERMUTE */
            if (rows_in % heads || (rows_in / heads) % 2)
                return dcpi_err(err, EINVAL, "%s: %s: %" PRId64 " rows are not %" PRId64
                                " heads of an even number of rows (rule '%s')", h->srcp, e->key, rows_in, heads,
                                ru->from);
            rows[0] = rows_in;
            maps[0][0] = (rcp_rowmap){.kind = ru->rope == RCP_ROPE_TO_HF ? 2 : 3, .hd = rows_in / heads};
            nmaps[0] = 1;
        }
    }

    /* One set of outputs per index of the stacked dimensions. */
    uint64_t count = 1;
    for (int d = 0; d < ns; d++)
        if (!dcpi_mul_u64(count, (uint64_t)e->shape[d], &count) || count > OUTPUTS_MAX)
            return dcpi_err(err, EFBIG, "%s: %s: too many stacked tensors", h->srcp, e->key);
    int64_t idx[RCP_MAX_STACK] = {0};
    for (uint64_t k = 0; k < count; k++) {
        uint64_t lin = k;
        for (int d = ns - 1; d >= 0; d--) {
            idx[d] = (int64_t)(lin % (uint64_t)e->shape[d]);
            lin /= (uint64_t)e->shape[d];
        }
        for (int t = 0; t < ru->nto; t++) {
            char name[NAME_MAX_LEN];
            if (rcp_expand(ru->to[t], m, idx, name, sizeof name) < 0)
                return dcpi_err(err, EINVAL, "%s: %s: output name '%s' of recipe %s is too long", h->srcp, e->key,
                                ru->to[t], rc->name);
            hf_out o = {.from = e->key, .entry = i, .base = k * sub, .rows = rows[t], .row_elems = row_elems,
                        .nmaps = nmaps[t], .in = e->dtype, .out = out, .ndim = e->ndim - ns};
            memcpy(o.maps, maps[t], sizeof o.maps);
            for (int d = 0; d < o.ndim; d++)
                o.shape[d] = e->shape[ns + d];
            if (o.ndim)
                o.shape[0] = rows[t];
            uint64_t numel;
            if (!dcpi_mul_u64((uint64_t)rows[t], row_elems, &numel) ||
                !dcpi_mul_u64(numel, dcp_dtype_size(out), &o.nbytes) || !dcpi_add_u64(h->total, o.nbytes, &h->total))
                return dcpi_err(err, EFBIG, "%s: %s: the sizes overflow", h->srcp, e->key);
            if (!(o.key = strdup(name)))
                return dcpi_err(err, ENOMEM, "%s: out of memory", h->srcp);
            if (add_out(h, &o, err) < 0) {
                free(o.key);
                return -1;
            }
        }
    }
    return 0;
}

static int cmp_out(const void *a, const void *b)
{
    return strcmp(((const hf_out *)a)->key, ((const hf_out *)b)->key);
}

/* ------------------------------------------------------------ writing */

static void remove_tmp(const char *p)
{
    DIR *d = opendir(p);
    struct dirent *de;
    while (d && (de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
            unlinkat(dirfd(d), de->d_name, 0);
    if (d)
        closedir(d);
    rmdir(p);
}

static int write_all(const char *path, const char *data, size_t len, int sync, dcp_error *err)
{
    int rc = 0, fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0)
        return dcpi_err(err, errno, "%s: cannot create: %s", path, strerror(errno));
    for (size_t done = 0; rc == 0 && done < len;) {
        ssize_t w = write(fd, data + done, len - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            rc = dcpi_err(err, w < 0 ? errno : EIO, "%s: write: %s", path, w < 0 ? strerror(errno) : "no progress");
        else
            done += (size_t)w;
    }
    if (rc == 0 && sync && fsync(fd) < 0)
        rc = dcpi_err(err, errno, "%s: fsync: %s", path, strerror(errno));
    if (close(fd) < 0 && rc == 0)
        rc = dcpi_err(err, errno, "%s: close: %s", path, strerror(errno));
    return rc;
}

static int write_json(const char *path, const json_t *j, int sync, dcp_error *err)
{
    char *js = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15));
    if (!js)
        return dcpi_err(err, ENOMEM, "%s: cannot build the JSON", path);
    int rc = write_all(path, js, strlen(js), sync, err);
    free(js);
    return rc;
}

/* The shards: greedy, a shard takes outputs until the next would pass max;
 * one shard is model.safetensors (no index), as save_pretrained writes it. */
static int write_shards(hf *h, const char *dir, uint64_t max, dcp_error *err)
{
    dcp_item *items = calloc(h->nouts ? h->nouts : 1, sizeof *items);
    size_t *shard = calloc(h->nouts ? h->nouts : 1, sizeof *shard);
    if (!items || !shard) {
        free(items);
        free(shard);
        return dcpi_err(err, ENOMEM, "%s: out of memory", dir);
    }
    size_t nshards = 0;
    uint64_t cur = 0;
    for (size_t i = 0; i < h->nouts; i++) {
        const hf_out *o = &h->outs[i];
        items[i] = (dcp_item){.key = o->key, .kind = DCP_KIND_TENSOR, .dtype = o->out, .ndim = o->ndim,
                              .shape = o->shape, .nbytes = o->nbytes, .tag = i};
        if (nshards == 0 || (cur > 0 && (cur >= max || o->nbytes > max - cur))) {
            nshards++;
            cur = 0;
        }
        cur += o->nbytes;
        shard[i] = nshards - 1;
    }
    if (!nshards)
        nshards = 1;
    dcp_source src = {.fill = fill, .ctx = h};
    unsigned wflags = DCP_WRITE_NO_REPLACE | ((h->opt->flags & DCP_EXPORT_NO_SYNC) ? DCP_WRITE_NO_SYNC : 0);
    json_t *index = json_object(), *meta = json_object(), *wm = json_object();
    int rc = 0;
    char path[4200];
    for (size_t sh = 0, first = 0; sh < nshards && rc == 0; sh++) {
        size_t last = first;
        while (last < h->nouts && shard[last] == sh)
            last++;
        char name[64];
        if (nshards == 1)
            snprintf(name, sizeof name, "model.safetensors");
        else
            snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", sh + 1, nshards);
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path)
            rc = dcpi_err(err, ENAMETOOLONG, "%s: path too long", dir);
        if (rc == 0)
            rc = dcp_write_safetensors(path, items + first, last - first, wflags, &src, NULL, NULL, err);
        for (size_t i = first; i < last; i++)
            json_object_set_new(wm, items[i].key, json_string(name));
        first = last;
    }
    json_object_set_new(meta, "total_size", json_integer((json_int_t)h->total));
    json_object_set_new(index, "metadata", meta);
    json_object_set_new(index, "weight_map", wm);
    if (rc == 0 && nshards > 1) {
        if ((size_t)snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir) >= sizeof path)
            rc = dcpi_err(err, ENAMETOOLONG, "%s: path too long", dir);
        else
            rc = write_json(path, index, !(h->opt->flags & DCP_EXPORT_NO_SYNC), err);
    }
    json_decref(index);
    free(items);
    free(shard);
    return rc;
}

/* Read --config: a JSON object, kept as bytes to copy as is. */
static int read_config(const char *path, json_t **obj, char **bytes, size_t *len, dcp_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return dcpi_err(err, errno, "%s: cannot open the config: %s", path, strerror(errno));
    char *b = malloc(CONFIG_MAX + 1);
    size_t n = b ? fread(b, 1, CONFIG_MAX + 1, f) : 0;
    int bad = ferror(f);
    fclose(f);
    if (!b)
        return dcpi_err(err, ENOMEM, "%s: out of memory", path);
    if (bad || n > CONFIG_MAX) {
        free(b);
        return dcpi_err(err, bad ? EIO : EFBIG, "%s: %s", path, bad ? "read error" : "a config.json over 16 MiB");
    }
    json_error_t je;
    json_t *j = json_loadb(b, n, JSON_REJECT_DUPLICATES, &je);
    if (!j || !json_is_object(j)) {
        json_decref(j);
        free(b);
        return j ? dcpi_err(err, EINVAL, "%s: the config is not a JSON object", path)
                 : dcpi_err(err, EINVAL, "%s: line %d: the config is not valid JSON: %s", path, je.line, je.text);
    }
    *obj = j;
    *bytes = b;
    *len = n;
    return 0;
}

/* ------------------------------------------------ Megatron's arguments */

/* Megatron-Core's training arguments: the "args" (an argparse.Namespace) of
 * SRC/common.pt, read through the torch.save zip reader and the pickle
 * parser (nothing is executed). *args is the Namespace's attribute dict, or
 * NULL when the source has no common.pt or it holds no args. */
typedef struct mg_args {
    pk_doc *doc;
    void *buf;
    const pk_node *args;
} mg_args;

static int megatron_args(const char *srcp, mg_args *a, dcp_error *err)
{
    char path[4200];
    struct stat st;
    memset(a, 0, sizeof *a);
    if ((size_t)snprintf(path, sizeof path, "%s/common.pt", srcp) >= sizeof path || stat(path, &st) < 0 ||
        !S_ISREG(st.st_mode))
        return 0;
    dcp_checkpoint *ck;
    if (dcp_open_file(path, DCP_FORMAT_TORCH_SAVE, &ck, NULL, err) < 0)
        return -1;
    dcpi_zip z = {0};
    dcp_blob b = {.file = 0, .offset = 0, .length = (uint64_t)st.st_size};
    const dcpi_zip_entry *ze;
    uint64_t off;
    int fd, rc = dcpi_zip_open(ck, &b, "common.pt", &z, err);
    if (rc == 0 && !(ze = dcpi_zip_find(&z, "data.pkl")))
        rc = dcpi_err(err, EIO, "%s: no data.pkl record", path);
    if (rc == 0)
        rc = dcpi_zip_data(ck, &b, "common.pt", ze, b.length, &off, err);
    if (rc == 0 && (ze->size > ARGS_PKL_MAX || ze->method != 0))
        rc = dcpi_err(err, EIO, "%s: data.pkl is compressed or over 64 MiB", path);
    if (rc == 0)
        rc = dcp_file_fd(ck, 0, &fd, err);
    if (rc == 0 && !(a->buf = malloc(ze->size ? ze->size : 1)))
        rc = dcpi_err(err, ENOMEM, "%s: out of memory", path);
    if (rc == 0 && pread(fd, a->buf, ze->size, (off_t)off) != (ssize_t)ze->size)
        rc = dcpi_err(err, EIO, "%s: short read of data.pkl", path);
    const pk_node *root;
    if (rc == 0 && (rc = pk_parse(a->buf, ze->size, path, &a->doc, &root, err)) == 0) {
        const pk_node *ns = pk_dict_get(pk_as_dict(root), "args");
        if (ns && ns->type == PK_CALL && ns->u.call.state)
            a->args = pk_as_dict(ns->u.call.state);
    }
    dcpi_zip_close(&z);
    dcp_close(ck);
    return rc;
}

static void mg_args_free(mg_args *a)
{
    pk_free(a->doc);
    free(a->buf);
}

/* args.name as JSON; NULL when absent or None. */
static json_t *mg_value(const pk_node *args, const char *name)
{
    const pk_node *v = pk_dict_get(args, name);
    const char *str;
    size_t len;
    if (!v)
        return NULL;
    switch (v->type) {
    case PK_BOOL: return json_boolean(v->u.b);
    case PK_INT: return json_integer((json_int_t)v->u.i);
    case PK_FLOAT: return json_real(v->u.f);
    default: return pk_str(v, &str, &len) ? json_stringn(str, len) : NULL;
    }
}

/* First of a name or a list of names present. */
static json_t *mg_first(const pk_node *args, json_t *names)
{
    if (json_is_string(names))
        return mg_value(args, json_string_value(names));
    for (size_t i = 0; i < json_array_size(names); i++) {
        json_t *v = mg_value(args, json_string_value(json_array_get(names, i)));
        if (v)
            return v;
    }
    return NULL;
}

/* The template's values taken from Megatron's arguments (before planning:
 * the rules read their parameters from them): {"$megatron": NAME or [NAMES],
 * "$if": BOOL_ARG, "$else": NAME or [NAMES], "$optional": true}; and the
 * recipe's "megatron_expect" (arguments that must hold these values when
 * present). */
static int template_args(hf *h, const rcp_recipe *rc, json_t *c, dcp_error *err)
{
    const char *k;
    json_t *v, *tmp;
    mg_args a = {0};
    int rc_ = 0, loaded = 0;
    json_object_foreach_safe(c, tmp, k, v) {
        json_t *names = json_object_get(v, "$megatron");
        if (!json_is_object(v) || !names)
            continue;
        if (!loaded++ && megatron_args(h->srcp, &a, err) < 0) {
            rc_ = dcpi_err_prefix(err, "recipe %s: config.json's %s", rc->name, k);
            break;
        }
        json_t *cond = json_object_get(v, "$if");
        if (a.args && cond) {
            json_t *cv = mg_value(a.args, json_string_value(cond) ? json_string_value(cond) : "");
            if (!json_is_true(cv))
                names = json_object_get(v, "$else");
            json_decref(cv);
        }
        json_t *val = a.args && names ? mg_first(a.args, names) : NULL;
        if (val) {
            json_object_set_new(c, k, val);
        } else if (json_is_true(json_object_get(v, "$optional"))) {
            json_object_del(c, k);
        } else {
            rc_ = dcpi_err(err, EINVAL, "%s: recipe %s cannot write config.json: %s (Megatron's args.%s) is not in "
                           "%s/common.pt: give --config FILE", h->srcp, rc->name, k,
                           json_string_value(names) ? json_string_value(names)
                                                    : json_string_value(json_array_get(names, 0)),
                           h->srcp);
            break;
        }
    }
    json_t *expect = json_object_get(rc->doc, "megatron_expect");
    if (rc_ == 0 && json_is_object(expect) && json_object_size(expect)) {
        if (!loaded++ && megatron_args(h->srcp, &a, err) < 0)
            rc_ = -1;
        json_object_foreach(expect, k, v) {
            json_t *got = a.args ? mg_value(a.args, k) : NULL;
            if (rc_ == 0 && got && !json_equal(got, v)) {
                char *gs = json_dumps(got, JSON_ENCODE_ANY), *ws = json_dumps(v, JSON_ENCODE_ANY);
                rc_ = dcpi_err(err, EINVAL, "%s: common.pt: args.%s is %s, recipe %s expects %s: give --config FILE "
                               "if the model is still what the recipe writes", h->srcp, k, gs ? gs : "?", rc->name,
                               ws ? ws : "?");
                free(gs);
                free(ws);
            }
            json_decref(got);
        }
    }
    mg_args_free(&a);
    return rc_;
}

/* The recipe's config template, filled from the outputs: {"$shape": [name,
 * dim]}, {"$count": pattern} (outputs whose names match), {"$dtype": name};
 * {"$required": why} cannot be known from the checkpoint. */
static int fill_template(hf *h, const rcp_recipe *rc, json_t *c, dcp_error *err)
{
    const char *k;
    json_t *v;
    json_object_foreach(c, k, v) {
        json_t *why = json_object_get(v, "$required");
        if (json_is_object(v) && why)
            return dcpi_err(err, EINVAL, "%s: recipe %s cannot write config.json: the checkpoint does not say %s "
                            "(%s): give --config FILE", h->srcp, rc->name, k,
                            json_is_string(why) ? json_string_value(why) : "");
    }
    json_object_foreach(c, k, v) {
        if (!json_is_object(v) || json_object_size(v) != 1)
            continue;
        const char *op = json_object_iter_key(json_object_iter(v));
        json_t *a = json_object_get(v, op);
        json_t *val = NULL;
        if (!strcmp(op, "$shape") && json_array_size(a) == 2) {
            const char *name = json_string_value(json_array_get(a, 0));
            json_int_t d = json_integer_value(json_array_get(a, 1));
            for (size_t i = 0; name && i < h->nouts && !val; i++)
                if (!strcmp(h->outs[i].key, name) && d >= 0 && d < h->outs[i].ndim)
                    val = json_integer(h->outs[i].shape[d]);
        } else if (!strcmp(op, "$count") && json_is_string(a)) {
            json_int_t n = 0;
            for (size_t i = 0; i < h->nouts; i++)
                n += fnmatch(json_string_value(a), h->outs[i].key, 0) == 0;
            val = json_integer(n);
        } else if (!strcmp(op, "$absent") && json_is_string(a)) {
            int found = 0;
            for (size_t i = 0; i < h->nouts && !found; i++)
                found = !strcmp(h->outs[i].key, json_string_value(a));
            val = json_boolean(!found);
        } else if (!strcmp(op, "$dtype") && json_is_string(a)) {
            for (size_t i = 0; i < h->nouts && !val; i++)
                if (!strcmp(h->outs[i].key, json_string_value(a)))
                    val = json_string(dcp_dtype_name(h->outs[i].out));
        } else {
            continue;
        }
        if (!val)
            return dcpi_err(err, EINVAL, "%s: recipe %s: config.json's %s: the output has no such tensor", h->srcp,
                            rc->name, k);
        json_object_set_new(c, k, val);
    }
    return 0;
}

static void out_free(hf *h)
{
    for (size_t i = 0; i < h->nouts; i++)
        free(h->outs[i].key);
    free(h->outs);
}

static int open_source(const char *srcp, dcp_checkpoint **ck, dcp_error *err)
{
    struct stat st;
    if (stat(srcp, &st) < 0)
        return dcpi_err(err, errno, "%s: cannot open: %s", srcp, strerror(errno));
    if (S_ISDIR(st.st_mode))
        return dcp_open(srcp, 0, ck, err);
    return dcp_open_file(srcp, DCP_FORMAT_AUTO, ck, NULL, err);
}

int dcp_export_hf(const char *srcp, const char *dst_in, const dcp_export_options *caller, dcp_error *err)
{
    if (!srcp || !dst_in || !caller)
        return dcpi_err(err, EINVAL, "dcp_export_hf: a source, a destination and options are needed");
    dcp_export_options o;
    const dcp_export_options *opt = &o;
    /* At least the first sized layout (0.2), which ends at the field named. */
    if (dcpi_sized_opts(&o, sizeof o, DCPI_OPTS_MIN(dcp_export_options, skipped_ctx), caller, "dcp_export_hf",
                        "DCP_EXPORT_OPTIONS_INIT", err) < 0)
        return -1;
    if (opt->dtype != DCP_DTYPE_INVALID && !is_float(opt->dtype))
        return dcpi_err(err, EINVAL, "%s: --dtype %s: float32, float16, bfloat16 or float64", dst_in,
                        dcp_dtype_name(opt->dtype) ? dcp_dtype_name(opt->dtype) : "?");
    char dst[4096];
    size_t dl = strlen(dst_in);
    while (dl > 1 && dst_in[dl - 1] == '/')
        dl--;
    if (dl >= sizeof dst)
        return dcpi_err(err, ENAMETOOLONG, "%s: path too long", dst_in);
    memcpy(dst, dst_in, dl);
    dst[dl] = 0;
    struct stat st;
    if (lstat(dst, &st) == 0)
        return dcpi_err(err, EEXIST, "%s: already exists (an export never overwrites)", dst);

    rcp_recipe *rc;
    if (rcp_load(opt->recipe, opt->recipe_dirs, DCP_RECIPEDIR, &rc, err) < 0)
        return -1;
    hf h = {.opt = opt, .srcp = srcp};
    dcp_plan_init(&h.plan);
    char *cfg_bytes = NULL;
    size_t cfg_len = 0;
    json_t *cfg_out = NULL;
    char tmp[4200] = "";
    int rc_ = 0;
    if (opt->config && read_config(opt->config, &h.config, &cfg_bytes, &cfg_len, err) < 0)
        rc_ = -1;
    if (rc_ == 0)
        rc_ = open_source(srcp, &h.ck, err);
    /* Without --config: the template, its values from Megatron's arguments
     * first (the rules' parameters may come from them), shapes after planning. */
    if (rc_ == 0 && !opt->config && rc->config) {
        if (!(cfg_out = json_deep_copy(rc->config)))
            rc_ = dcpi_err(err, ENOMEM, "%s: out of memory", srcp);
        else if ((rc_ = template_args(&h, rc, cfg_out, err)) == 0)
            h.config = json_incref(cfg_out);
    }

    /* Map every key. */
    size_t n = rc_ == 0 ? dcp_num_entries(h.ck) : 0, nunmapped = 0;
    const char *unmapped[3] = {"", "", ""};
    for (size_t i = 0; i < n && rc_ == 0; i++) {
        const dcp_entry *e = dcp_entry_at(h.ck, i);
        rcp_match m;
        if (!e) {
            rc_ = dcpi_err(err, ESTALE, "%s: the checkpoint changed while it was read", srcp);
            break;
        }
        if (!dcp_key_matches(opt->keys, e->key))
            continue;
        if (rcp_ignored(rc, e->key)) {
            if (opt->skipped)
                opt->skipped(opt->skipped_ctx, e->key, "left out by the recipe");
            continue;
        }
        if (!rcp_match_key(rc, e->key, &m)) {
            if (nunmapped < 3)
                unmapped[nunmapped] = e->key;
            nunmapped++;
            if (opt->skipped && (opt->flags & DCP_EXPORT_ALLOW_UNMAPPED))
                opt->skipped(opt->skipped_ctx, e->key, "no rule of the recipe maps it");
            continue;
        }
        rc_ = plan_entry(&h, rc, i, e, &m, err);
    }
    if (rc_ == 0 && nunmapped && !(opt->flags & DCP_EXPORT_ALLOW_UNMAPPED))
        rc_ = dcpi_err(err, ENOENT, "%s: %s%s%s%s%s%s: no rule of recipe %s maps %s (%zu key%s in all; "
                       "--allow-unmapped leaves them out)", srcp, unmapped[0], nunmapped > 1 ? ", " : "", unmapped[1],
                       nunmapped > 2 ? ", " : "", unmapped[2], nunmapped > 3 ? ", ..." : "", rc->name,
                       nunmapped > 1 ? "these keys" : "this key", nunmapped, nunmapped > 1 ? "s" : "");
    if (rc_ == 0 && h.nouts == 0)
        rc_ = dcpi_err(err, ENOENT, "%s: recipe %s maps no key of the checkpoint", srcp, rc->name);
    if (rc_ == 0) {
        qsort(h.outs, h.nouts, sizeof *h.outs, cmp_out);
        for (size_t i = 1; i < h.nouts && rc_ == 0; i++)
            if (!strcmp(h.outs[i - 1].key, h.outs[i].key))
                rc_ = dcpi_err(err, EINVAL, "%s: %s and %s both become %s (recipe %s)", srcp, h.outs[i - 1].from,
                               h.outs[i].from, h.outs[i].key, rc->name);
    }
    if (rc_ == 0 && !opt->config && rc->config)
        rc_ = fill_template(&h, rc, cfg_out, err);
    if (rc_ == 0 && !opt->config && !rc->config)
        rc_ = dcpi_err(err, EINVAL, "%s: recipe %s has no config.json template: give --config FILE", srcp, rc->name);
    if (rc_ == 0 && !(h.stage = malloc(STAGE_BYTES)))
        rc_ = dcpi_err(err, ENOMEM, "%s: out of memory", srcp);

    /* The folder, under a temporary name. */
    int sync = !(opt->flags & DCP_EXPORT_NO_SYNC);
    if (rc_ == 0 && (rc_ = dcpw_tmp_name(dst, tmp, sizeof tmp, err)) == 0 && mkdir(tmp, 0777) < 0) {
        rc_ = dcpi_err(err, errno, "%s: cannot create: %s", tmp, strerror(errno));
        tmp[0] = 0;
    }
    if (rc_ == 0)
        rc_ = write_shards(&h, tmp, opt->max_shard_size ? opt->max_shard_size : 5000000000ull, err);
    char path[4200];
    if (rc_ == 0 && (size_t)snprintf(path, sizeof path, "%s/config.json", tmp) >= sizeof path)
        rc_ = dcpi_err(err, ENAMETOOLONG, "%s: path too long", dst);
    if (rc_ == 0)
        rc_ = cfg_bytes ? write_all(path, cfg_bytes, cfg_len, sync, err) : write_json(path, cfg_out, sync, err);
    if (rc_ == 0 && sync)
        rc_ = dcpw_fsync_dir(tmp, err);
    if (rc_ == 0)
        rc_ = dcpw_rename(tmp, dst, 1, sync, err);
    if (rc_ < 0 && tmp[0])
        remove_tmp(tmp);
    free(h.stage);
    free(cfg_bytes);
    json_decref(cfg_out);
    json_decref(h.config);
    out_free(&h);
    dcp_plan_free(&h.plan);
    dcp_close(h.ck);
    rcp_free(rc);
    return rc_;
}
