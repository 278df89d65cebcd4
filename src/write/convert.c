/* dcp_convert_files: DCP <-> torch.save <-> safetensors, streaming.
 *
 * Every source becomes a dcp_checkpoint: a DCP (or Hugging Face safetensors)
 * folder through dcp_open, a single .pt or .safetensors file through the
 * core's single-file reader (single_file.c), which builds the same model
 * over the one file (a torch.save storage record or a safetensors range per
 * tensor, strides and all; a torch.save file's plain values as bytes
 * items); its hooks give convert the keys' nesting.
 * Every destination is fed by one fill callback that plans and reads a few
 * MiB of an entry at a time, so memory is bounded by the key count.
 * The destination is written under a temporary name beside it and renamed
 * into place at the end; on failure the temporary is removed. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dcp_write.h"
#include "atomic.h"
#include "internal.h"
#include "sized_opts.h"
#include "keypaths.h"
#include "dcp_file.h"   /* dcp_st_refusal */
#include "single_file.h"
#include "pickle.h"
#include "pickle_write.h"
#include "zip.h"


/* ---------------------------------------------------------------- formats */

static int has_suffix(const char *s, const char *suf)
{
    size_t n = strlen(s), m = strlen(suf);
    return n > m && !strcmp(s + n - m, suf);
}

/* ------------------------------------- torch.save sources: the reader's hooks */

/* What the single-file reader's hooks write to. */
typedef struct pt_hooks_ctx {
    dcpw_keypaths *paths;
    dcp_skip_fn skipped;
    void *skipped_ctx;
} pt_hooks_ctx;

/* The path hook: each kept value's dict keys and list indexes, for planner_data. */
static int path_of_value(void *ctx, const char *key, size_t klen, const dcp_path_part *parts, size_t n)
{
    pt_hooks_ctx *h = ctx;
    return dcpw_kp_add(h->paths, key, klen, parts, n);
}

static void skipped_value(void *ctx, const char *key, const char *why)
{
    pt_hooks_ctx *h = ctx;
    if (h->skipped)
        h->skipped(h->skipped_ctx, key, why);
}

/* ---------------------------------------------------------------- convert */

typedef struct src {
    dcp_source source;       /* first: the writers' view of this */
    dcp_checkpoint *ck;
    dcp_plan plan;
    uint64_t *base;          /* per entry: tensor bytes of the selected entries before it */
    uint64_t done, total;
    const dcp_convert_options *opt;
    dcpw_keypaths paths;          /* keys' paths for planner_data, when the source knows them */
    size_t no_run_tag;       /* an entry of one chunk found not stored as is: */
    int no_run_valid;        /* its strides or transforms hold for all of it, so ask no more */
} src;

/* Progress by position (entry's base + end of the bytes just produced), so
 * bytes produced twice (a kernel copy that fell back to reading) count once. */
static void src_progress(src *s, size_t tag, const dcp_entry *e, uint64_t end)
{
    if (e->kind != DCP_KIND_TENSOR || !s->base || s->base[tag] + end <= s->done)
        return;
    s->done = s->base[tag] + end;
    if (s->opt->progress)
        s->opt->progress(s->opt->progress_ctx, s->done, s->total);
}

#define PROBE (8u << 20)          /* bytes planned to see whether a region is stored as is */
#define RANGE_MAX (1ull << 30)    /* at most this much planned at once (bounded op lists) */

/* The op that produces the first bytes of a plan, when it copies them as
 * is (no transform, byte swap, stride or zero fill); NULL otherwise. */
static const dcp_op *as_is_head(const dcp_plan *p)
{
    if (p->zero_fill)
        return NULL;
    for (size_t i = 0; i < p->nops; i++) {
        const dcp_op *op = &p->ops[i];
        if (op->dest_offset == 0)
            return !op->flags && op->dest_stride == op->elem_size ? op : NULL;
    }
    return NULL;
}

/* The CRC-32 a zip writer recorded for the record whose data is exactly
 * [foff, foff+len) of fd: its data descriptor follows the data (PyTorch's
 * writer always writes one, with the signature). 1 when found with the
 * record's size and a non-zero CRC (0 is what writers that skip CRCs store),
 * 0 otherwise. A descriptor that lies yields the lie: the output then
 * carries the source's recorded CRC, so zip readers still see a mismatch. */
static int recorded_crc(int fd, uint64_t foff, uint64_t len, uint32_t *crc)
{
    unsigned char d[24];
    ssize_t got = pread(fd, d, sizeof d, (off_t)(foff + len));
    if (got < 16)
        return 0;
    uint64_t v[4] = {0};
    for (int f = 0; f < 4; f++)
        for (int b = 3; b >= 0; b--)
            v[f] = v[f] << 8 | d[4 * f + b];
    if (v[0] != 0x08074b50u || v[1] == 0)
        return 0;
    int match = len < 0xFFFFFFFFu && v[2] == len && v[3] == len;   /* 4-byte sizes */
    if (!match && got == 24) {                                       /* zip64: 8-byte sizes */
        uint64_t c = 0, u = 0;
        for (int b = 7; b >= 0; b--) {
            c = c << 8 | d[8 + b];
            u = u << 8 | d[16 + b];
        }
        match = c == len && u == len;
    }
    if (match)
        *crc = (uint32_t)v[1];
    return match;
}

/* The longest prefix of [off, off+len) stored as is in one file: planned
 * first over a probe, then (when the probe is one run) over up to 1 GiB,
 * so a strided region never makes a huge plan. */
/* The caller asked to stop (its cancel flag, set by a signal handler): the
 * writer fails as on any error, removing its temporary. */
static int canceled(const src *s, dcp_error *err)
{
    return s->opt->cancel && *s->opt->cancel ? dcpi_err(err, ECANCELED, "interrupted: nothing was written") : 0;
}

static int src_range(void *ctx, uint64_t tag, uint64_t off, uint64_t len, dcp_run *run, dcp_error *err)
{
    src *s = ctx;
    const dcp_entry *e = dcp_entry_at(s->ck, (size_t)tag);
    if (canceled(s, err) < 0)
        return -1;
    src_progress(s, (size_t)tag, e, off);   /* the writer asks in order: all before off is written */
    if (dcp_num_files(s->ck) > 256)
        return 0;   /* too many files to pin an fd for each */
    if (s->no_run_valid && s->no_run_tag == tag)
        return 0;
    uint64_t want = len < PROBE ? len : PROBE;
    if (dcp_plan_bytes(s->ck, e, off, want, &s->plan, err) < 0)
        return -1;
    const dcp_op *op = as_is_head(&s->plan);
    /* One chunk's record is uniform: when its head here is transformed,
     * byte-swapped or strided in the last dimension, so is every piece. */
    if (!op && e->kind == DCP_KIND_TENSOR && e->nchunks == 1 && !s->plan.zero_fill) {
        s->no_run_tag = tag;
        s->no_run_valid = 1;
    }
    if (op && op->length == want && len > want) {
        want = len < RANGE_MAX ? len : RANGE_MAX;
        if (dcp_plan_bytes(s->ck, e, off, want, &s->plan, err) < 0)
            return -1;
        op = as_is_head(&s->plan);
    }
    if (!op || op->length == 0 || op->length > want)
        return 0;
    *run = (dcp_run){.offset = op->src_offset, .length = op->length};
    if (dcp_file_fd(s->ck, op->file, &run->fd, err) < 0)
        return -1;
    run->has_crc = recorded_crc(run->fd, run->offset, run->length, &run->crc);
    return 1;
}

static int src_fill(void *ctx, uint64_t tag, uint64_t off, void *buf, size_t len, dcp_error *err)
{
    src *s = ctx;
    const dcp_entry *e = dcp_entry_at(s->ck, (size_t)tag);
    if (canceled(s, err) < 0)
        return -1;
    if (dcp_plan_bytes(s->ck, e, off, len, &s->plan, err) < 0)
        return -1;
    if (s->plan.nbytes != len)
        return dcpi_err(err, EIO, "%s: %s: short read", dcp_path(s->ck), e->key);
    if (dcp_plan_execute(s->ck, &s->plan, buf, err) < 0)
        return -1;
    src_progress(s, (size_t)tag, e, off + len);
    return 0;
}

/* Remove what a failed conversion left under its temporary name. */
static void remove_tmp(const char *p)
{
    struct stat st;
    if (lstat(p, &st) < 0)
        return;
    if (!S_ISDIR(st.st_mode)) {
        unlink(p);
        return;
    }
    DIR *d = opendir(p);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        unlinkat(dirfd(d), de->d_name, 0);
    }
    if (d)
        closedir(d);
    rmdir(p);
}

/* model.safetensors.index.json, written through an fd so it can be fsynced. */
static int write_index(const char *path, const json_t *index, int sync, dcp_error *err)
{
    char *js = json_dumps(index, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (!js)
        return dcpi_err(err, ENOMEM, "%s: cannot build the index", path);
    size_t len = strlen(js), done = 0;
    int rc = 0, fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0)
        rc = dcpi_err(err, errno, "%s: cannot create: %s", path, strerror(errno));
    while (rc == 0 && done < len) {
        ssize_t w = write(fd, js + done, len - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            rc = dcpi_err(err, w < 0 ? errno : EIO, "%s: write: %s", path, w < 0 ? strerror(errno) : "no progress");
        else
            done += (size_t)w;
    }
    if (rc == 0 && sync && fsync(fd) < 0)
        rc = dcpi_err(err, errno, "%s: fsync: %s", path, strerror(errno));
    if (fd >= 0 && close(fd) < 0 && rc == 0)
        rc = dcpi_err(err, errno, "%s: close: %s", path, strerror(errno));
    free(js);
    return rc;
}

static int write_shards(src *s, const char *dir, dcp_item *items, size_t n, uint64_t max, dcp_error *err)
{
    if (mkdir(dir, 0777) < 0)
        return dcpi_err(err, errno, "%s: cannot create: %s", dir, strerror(errno));
    /* Greedy: a shard takes items until the next would pass max. */
    size_t nshards = 0;
    uint64_t cur = 0;
    size_t *shard_of = malloc((n ? n : 1) * sizeof *shard_of);
    if (!shard_of)
        return dcpi_err(err, ENOMEM, "%s: out of memory", dir);
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t next;
        if (!dcpi_add_u64(total, items[i].nbytes, &total) || !dcpi_add_u64(cur, items[i].nbytes, &next)) {
            free(shard_of);
            return dcpi_err(err, EFBIG, "%s: %s: the total size overflows", dir, items[i].key);
        }
        if (nshards == 0 || (cur > 0 && max && next > max)) {
            nshards++;
            next = items[i].nbytes;
        }
        cur = next;
        shard_of[i] = nshards - 1;
    }
    if (nshards == 0)
        nshards = 1;
    json_t *index = json_object(), *wm = json_object(), *meta = json_object();
    int rc = 0;
    for (size_t sh = 0, first = 0; sh < nshards && rc == 0; sh++) {
        size_t last = first;
        while (last < n && shard_of[last] == sh)
            last++;
        char name[64], path[4200];
        snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", sh + 1, nshards);
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path) {
            rc = dcpi_err(err, ENAMETOOLONG, "%s: path too long", dir);
            break;
        }
        rc = dcp_write_safetensors(path, items + first, last - first, s->opt->flags, &s->source, NULL, NULL, err);
        for (size_t i = first; i < last; i++)
            json_object_set_new(wm, items[i].key, json_string(name));
        first = last;
    }
    json_object_set_new(meta, "total_size", json_integer((json_int_t)total));
    json_object_set_new(index, "metadata", meta);
    json_object_set_new(index, "weight_map", wm);
    char ipath[4200];
    if (rc == 0 && (size_t)snprintf(ipath, sizeof ipath, "%s/model.safetensors.index.json", dir) >= sizeof ipath)
        rc = dcpi_err(err, ENAMETOOLONG, "%s: path too long", dir);
    if (rc == 0)
        rc = write_index(ipath, index, !(s->opt->flags & DCP_WRITE_NO_SYNC), err);
    json_decref(index);
    free(shard_of);
    return rc;
}

static int write_dcp(src *s, const char *tmp, const char *dst, const size_t *sel, size_t nsel, dcp_error *err)
{
    dcp_ckpt_writer *w;
    dcp_ckpt_options o = DCP_CKPT_OPTIONS_INIT;
    o.checkpoint_id = dst;
    o.flags = s->opt->flags & (DCP_WRITE_NO_SYNC | DCP_WRITE_NO_CRC);   /* one flag family */
    if (dcp_ckpt_create(tmp, &o, &w, err) < 0)
        return -1;
    int rc = 0;
    int64_t zero[DCPI_MAX_NDIM] = {0};
    /* Bytes items first, as FileSystemWriter orders a rank's file. */
    for (size_t k = 0; k < nsel && rc == 0; k++) {
        const dcp_entry *e = dcp_entry_at(s->ck, sel[k]);
        uint64_t len;
        if (e->kind == DCP_KIND_BYTES)
            rc = dcp_entry_nbytes(s->ck, e, &len, err) < 0 ? -1
                 : dcp_ckpt_add_bytes(w, e->key, 0, len, &s->source, sel[k], err);
    }
    for (size_t k = 0; k < nsel && rc == 0; k++) {
        const dcp_entry *e = dcp_entry_at(s->ck, sel[k]);
        if (e->kind != DCP_KIND_TENSOR)
            continue;
        rc = dcp_ckpt_add_tensor(w, e->key, e->dtype, e->ndim, e->shape, err);
        if (rc == 0)
            rc = dcp_ckpt_add_chunk(w, e->key, 0, zero, e->shape, &s->source, sel[k], NULL, err);
    }
    /* The source's nesting, where known; a path that does not spell its key
     * (a hand-made source) leaves the key flat. */
    for (size_t k = 0; k < nsel && rc == 0; k++) {
        const dcp_entry *e = dcp_entry_at(s->ck, sel[k]);
        size_t np;
        const dcp_path_part *path = dcpw_kp_get(&s->paths, e->key, &np);
        dcp_error ignored;
        if (path && dcp_ckpt_set_path(w, e->key, path, np, &ignored) < 0 && ignored.code == ENOMEM)
            rc = dcpi_err(err, ENOMEM, "%s: out of memory", dst);
    }
    if (rc == 0)
        rc = dcp_ckpt_finish(w, err);
    dcp_ckpt_free(w);
    return rc;
}

/* --nested to a .pt gives what torch's dcp_to_torch_save gives: each bytes
 * item (a torch.save of one value) as that value, where it is plain data
 * (None, bool, int, float, str, bytes, and tuples, lists and dicts of them)
 * that pw_value writes whole within 4x its blob (a pickle sharing one list
 * under itself 2^60 times does not); others stay bytes. values[k] and
 * docs[k] per item; -1 only on out of memory. */
typedef struct plain_values {
    const pk_node **values;
    pk_doc **docs;
    char **bufs;
    size_t n;
} plain_values;

static void plain_values_free(plain_values *v)
{
    for (size_t k = 0; k < v->n; k++) {
        pk_free(v->docs[k]);
        free(v->bufs[k]);
    }
    free(v->values);
    free(v->docs);
    free(v->bufs);
}

static int plain_values_read(dcp_checkpoint *ck, const dcp_item *items, size_t n, plain_values *v, dcp_error *err)
{
    v->n = n;
    v->values = calloc(n ? n : 1, sizeof *v->values);
    v->docs = calloc(n ? n : 1, sizeof *v->docs);
    v->bufs = calloc(n ? n : 1, sizeof *v->bufs);
    if (!v->values || !v->docs || !v->bufs)
        return dcpi_err(err, ENOMEM, "%s: out of memory", dcp_path(ck));
    for (size_t k = 0; k < n; k++) {
        const dcp_entry *e = dcp_entry_at(ck, (size_t)items[k].tag);
        if (items[k].kind == DCP_KIND_TENSOR || !e || !e->has_blob)
            continue;
        const pk_node *root;
        dcp_error ignored;
        if (dcpi_zip_pickle(ck, &e->blob, e->key, items[k].nbytes, &v->bufs[k], &v->docs[k], &root, &ignored) < 0) {
            if (ignored.code == ENOMEM)
                return dcpi_err(err, ENOMEM, "%s: out of memory", dcp_path(ck));
            continue;   /* not a torch.save blob: stays bytes, as it was stored */
        }
        pw trial;
        pw_init(&trial, 2, -1, e->key);
        if (pw_value(&trial, root, 4 * items[k].nbytes + 4096) == 0)
            v->values[k] = root;
        pw_free(&trial);
    }
    return 0;
}

static int convert(const char *srcp, const char *dst, const dcp_convert_options *opt, dcp_error *err);

int dcp_convert_files(const char *srcp, const char *dst, const dcp_convert_options *opt, dcp_error *err)
{
    /* "hf/" names the folder hf: the temporary goes beside it, not inside. */
    size_t n = strlen(dst);
    while (n > 1 && dst[n - 1] == '/')
        n--;
    char *d = strndup(dst, n);
    if (!d)
        return dcpi_err(err, ENOMEM, "%s: out of memory", dst);
    int rc = convert(srcp, d, opt, err);
    free(d);
    return rc;
}

static int convert(const char *srcp, const char *dst, const dcp_convert_options *caller, dcp_error *err)
{
    dcp_convert_options o = DCP_CONVERT_OPTIONS_INIT;
    const dcp_convert_options *opt = &o;
    /* At least the first sized layout (0.2), which ends at the field named. */
    if (caller && dcpi_sized_opts(&o, sizeof o, DCPI_OPTS_MIN(dcp_convert_options, skipped_ctx), caller,
                                  "dcp_convert_files", "DCP_CONVERT_OPTIONS_INIT", err) < 0)
        return -1;
    dcp_format from = opt->from ? opt->from : dcp_format_guess(srcp);
    dcp_format to = opt->to ? opt->to : dcp_format_guess(dst);
    struct stat st;
    if (lstat(dst, &st) == 0)
        return dcpi_err(err, EEXIST, "%s: already exists (convert never overwrites)", dst);
    if (stat(srcp, &st) < 0)
        return dcpi_err(err, errno, "%s: cannot open: %s", srcp, strerror(errno));
    int src_is_dir = S_ISDIR(st.st_mode);
    if (to == DCP_FORMAT_SAFETENSORS && opt->max_shard_size && has_suffix(dst, ".safetensors"))
        return dcpi_err(err, EINVAL, "%s: --max-shard-size writes a folder of shards: give a path without .safetensors",
                        dst);

    src s = {.opt = opt};
    s.source = (dcp_source){.fill = src_fill, .range = src_range, .ctx = &s};
    dcpw_kp_init(&s.paths);
    dcp_plan_init(&s.plan);
    size_t nskipped = 0;
    int rc;
    if ((opt->flags & DCP_WRITE_RANK) && !src_is_dir)
        return dcpi_err(err, EINVAL, "%s: rank %u's view is of a rank-local checkpoint folder, its __%u.metadata; "
                        "this is a single file", srcp, opt->rank, opt->rank);
    if (src_is_dir) {
        dcp_checkpoint *ck;
        dcp_open_options oo = DCP_OPEN_OPTIONS_INIT;
        oo.flags = (opt->flags & DCP_WRITE_MEGATRON_FOLD ? DCP_OPEN_MEGATRON_FOLD : 0) |
                   (opt->flags & DCP_WRITE_RANK ? DCP_OPEN_RANK : 0);
        oo.rank = opt->rank;
        rc = dcp_open_ex(srcp, &oo, &ck, err);
        s.ck = rc == 0 ? ck : NULL;
        int nests = to == DCP_FORMAT_DCP || (to == DCP_FORMAT_TORCH_SAVE && (opt->flags & DCP_WRITE_NESTED));
        if (rc == 0 && nests && (rc = dcpw_kp_from_metadata(srcp, &s.paths, err)) < 0)
            dcp_close(ck);
    } else if (from == DCP_FORMAT_TORCH_SAVE) {
        pt_hooks_ctx hc = {.paths = &s.paths, .skipped = opt->skipped, .skipped_ctx = opt->skipped_ctx};
        dcpi_torch_hooks h = {.path = path_of_value, .skipped = skipped_value, .ctx = &hc};
        rc = dcpi_open_torch_file(srcp, &h, &s.ck, &nskipped, err);
    } else if (from == DCP_FORMAT_SAFETENSORS) {
        rc = dcp_open_file(srcp, DCP_FORMAT_SAFETENSORS, &s.ck, NULL, err);
    } else {
        rc = dcpi_err(err, ENOTDIR, "%s: a DCP checkpoint is a folder", srcp);
    }
    if (rc < 0) {
        dcpw_kp_free(&s.paths);
        return -1;
    }

    /* A checkpoint folder is never written into: dst would join the source
     * (another file of a safetensors folder, a stray file of a DCP one). */
    if (src_is_dir && dcpi_path_inside(dst, s.ck))
        rc = dcpi_err(err, EINVAL, "%s: lies inside the source checkpoint %s, which convert never writes into", dst,
                      srcp);

    /* The selection, and what safetensors cannot hold. */
    size_t n = dcp_num_entries(s.ck), nsel = 0, nitems = 0;
    size_t *sel = malloc((n ? n : 1) * sizeof *sel);
    dcp_item *items = calloc(n ? n : 1, sizeof *items);
    s.base = calloc(n ? n : 1, sizeof *s.base);
    if (!sel || !items || !s.base)
        rc = dcpi_err(err, ENOMEM, "%s: out of memory", srcp);
    for (size_t i = 0; i < n && rc == 0; i++) {
        const dcp_entry *e = dcp_entry_at(s.ck, i);
        if (!e) {   /* the first call reads every header: later ones cannot fail */
            rc = dcpi_err(err, ESTALE, "%s: the checkpoint changed while it was read", srcp);
            break;
        }
        if (!dcp_key_matches(opt->keys, e->key))
            continue;
        const char *refused = to == DCP_FORMAT_SAFETENSORS ? dcp_st_refusal(e) : NULL;
        if (refused) {
            if (opt->skipped)
                opt->skipped(opt->skipped_ctx, e->key, refused);
            continue;
        }
        sel[nsel++] = i;
        dcp_item *it = &items[nitems++];
        *it = (dcp_item){.key = e->key, .kind = e->kind, .dtype = e->dtype, .ndim = e->ndim, .shape = e->shape,
                         .tag = i};
        if (e->kind == DCP_KIND_TENSOR) {
            s.base[i] = s.total;
            if (!dcpi_mul_u64(dcp_entry_numel(e), dcp_dtype_size(e->dtype), &it->nbytes) ||
                !dcpi_add_u64(s.total, it->nbytes, &s.total))
                rc = dcpi_err(err, EFBIG, "%s: %s: the total size overflows", srcp, e->key);
        } else {
            rc = dcp_entry_nbytes(s.ck, e, &it->nbytes, err);
        }
    }
    if (rc == 0 && opt->keys && nsel == 0)
        rc = dcpi_err(err, ENOENT, "%s: no key matches '%s'", srcp, opt->keys);

    /* Single files: the writers go through a temporary name and a rename
     * that never replaces. Folders: written under a temporary name beside
     * dst, hidden, unique to this process, then renamed the same way. */
    const char *slash = strrchr(dst, '/');
    int single = to == DCP_FORMAT_TORCH_SAVE || (to == DCP_FORMAT_SAFETENSORS && has_suffix(dst, ".safetensors"));
    int sync = !(opt->flags & DCP_WRITE_NO_SYNC);
    unsigned wflags = opt->flags | DCP_WRITE_NO_REPLACE;
    char tmp[4200] = "";
    if (rc == 0 && !single)
        rc = dcpw_tmp_name(dst, tmp, sizeof tmp, err);
    if (rc == 0) {
        switch (to) {
        case DCP_FORMAT_DCP:
            rc = write_dcp(&s, tmp, dst, sel, nsel, err);
            break;
        case DCP_FORMAT_TORCH_SAVE: {
            char root[256];
            const char *b = slash ? slash + 1 : dst, *dot = strrchr(b, '.');
            snprintf(root, sizeof root, "%.*s", dot && dot != b ? (int)(dot - b) : (int)strlen(b), b);
            plain_values v = {0};
            if (opt->flags & DCP_WRITE_NESTED)
                rc = plain_values_read(s.ck, items, nitems, &v, err);
            if (rc == 0)
                rc = dcpw_write_torch_save(dst, root, items, nitems, wflags, &s.paths, v.values, &s.source, NULL,
                                           NULL, err);
            plain_values_free(&v);
            break;
        }
        case DCP_FORMAT_SAFETENSORS:
            if (single)
                rc = dcp_write_safetensors(dst, items, nitems, wflags, &s.source, NULL, NULL, err);
            else
                rc = write_shards(&s, tmp, items, nitems, opt->max_shard_size, err);
            break;
        default:
            rc = dcpi_err(err, EINVAL, "%s: unknown output format", dst);
        }
    }
    if (rc == 0 && !single && sync)
        rc = dcpw_fsync_dir(tmp, err);
    if (rc == 0 && !single)   /* a signal while .metadata (or the index) was written, or files synced */
        rc = canceled(&s, err);
    if (rc == 0 && !single)
        rc = dcpw_rename(tmp, dst, 1, sync, err);
    if (rc == 0 && s.done < s.total && opt->progress)   /* the last bytes went by kernel copy */
        opt->progress(opt->progress_ctx, s.total, s.total);
    if (rc < 0 && tmp[0])
        remove_tmp(tmp);
    free(sel);
    free(items);
    free(s.base);
    dcp_plan_free(&s.plan);
    dcp_close(s.ck);
    dcpw_kp_free(&s.paths);
    return rc;
}
