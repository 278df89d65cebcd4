/* One torch.save (.pt) or safetensors file read as a checkpoint:
 * dcp_open_file (dcp_file.h), and the single-file sources of dcp convert.
 *
 * The model is the same as a folder's, over a file table of one file. A
 * torch.save file's tensors are found the way the record locator finds a
 * DCP chunk's (torchsave.c parses the rebuild calls): each tensor is one
 * chunk over its storage record, its record (offset, strides, conj/neg)
 * set now so the planner never parses again. Its non-tensor values are
 * bytes items, as DCP stores them: a bytes value holding a torch.save blob
 * read in place, other plain data pickled again into one held in memory
 * (write/value_blob.c); objects torch.load would rebuild are left out and
 * counted. A safetensors file is read by safetensors.c, as one file of a
 * Hugging Face folder is. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dcp_file.h"
#include "internal.h"
#include "pickle.h"
#include "single_file.h"
#include "write/value_blob.h"
#include "zip.h"

#define PKL_MAX (1ull << 30)          /* data.pkl of a torch.save file */
#define MAX_DEPTH 64                  /* dicts within dicts */
/* The plain values' bytes items, all together: a hostile data.pkl of tiny
 * values (each a zip archive of ~400 bytes) cannot make an open hold more. */
#define VALUES_MAX (256ull << 20)
#define VALUES_MAX_TEXT "256 MiB"

/* An empty model over path's folder (model.c's, without its folder
 * detection); *base is the file's name in it. */
static dcp_checkpoint *ck_over_folder(const char *path, const char **base, dcp_error *err)
{
    const char *slash = strrchr(path, '/');
    *base = slash ? slash + 1 : path;
    char *folder = slash ? strndup(path, (size_t)(slash - path) + (slash == path)) : strdup(".");
    if (!folder) {
        dcpi_err(err, ENOMEM, "%s: out of memory", path);
        return NULL;
    }
    dcp_checkpoint *ck = dcpi_ck_new(folder, err);
    free(folder);
    if (!ck)
        dcpi_err_prefix(err, "%s", path);
    return ck;
}

/* The model of a torch.save file before its tensors: the file table holds
 * the file alone, ready to read (its zip and data.pkl are read through it). */
static dcp_checkpoint *ck_for_file(const char *path, dcp_error *err)
{
    const char *base;
    dcp_checkpoint *ck = ck_over_folder(path, &base, err);
    uint32_t f;
    if (ck && (dcpi_model_file(ck, base, strlen(base), &f, err) < 0 || dcpi_ck_files_ready(ck, err) < 0)) {
        dcp_close(ck);
        return NULL;
    }
    return ck;
}

typedef struct pt_load {
    dcp_checkpoint *ck;
    const char *path;
    dcpi_zip z;
    dcp_blob whole;
    uint64_t flen;
    uint64_t pkl_start, pkl_len;      /* data.pkl's bytes in the file (stored, so as they are) */
    uint32_t rec_flags;
    uint64_t held;                    /* bytes of the plain values pickled so far */
    size_t nskipped;
    uint64_t visits, visit_cap;       /* values walked, and the bound: a pickle's memo can */
    uint64_t key_bytes, key_cap;      /* share one dict under many keys; their keys' bytes */
    dcpi_torch_hooks hooks;
    dcp_path_part stack[MAX_DEPTH + 1];   /* the path of the value being walked */
    dcp_error *err;
} pt_load;

/* A tensor of the torch.save file: one chunk over its storage record, whose
 * record (offset, strides, conj/neg flags) is filled in now so the planner
 * never parses. The rebuild call is parsed as the record locator parses it. */
static int pt_tensor(pt_load *L, const char *key, const pk_node *n)
{
    dcp_checkpoint *ck = L->ck;
    dcpi_rebuild rb;
    char why[512];
    if (dcpi_torch_rebuild_parse(n, &rb, why, sizeof why) < 0)
        return dcpi_err(L->err, EIO, "%s: %s: %s", L->path, key, why);
    char rname[128];
    snprintf(rname, sizeof rname, "data/%.*s", (int)rb.storage_key_len, rb.storage_key);
    const dcpi_zip_entry *de = dcpi_zip_find(&L->z, rname);
    if (!de || de->size != rb.storage_bytes)
        return dcpi_err(L->err, EIO, "%s: %s: storage record %s is missing or of the wrong size", L->path, key, rname);
    if (dcpi_torch_rebuild_check_view(&rb, why, sizeof why) < 0)
        return dcpi_err(L->err, EIO, "%s: %s: %s", L->path, key, why);
    uint64_t dstart;
    if (dcpi_zip_data(ck, &L->whole, key, de, L->flen, &dstart, L->err) < 0)
        return -1;
    int nd = rb.ndim;
    size_t idx, ci;
    int64_t zero[DCPI_MAX_NDIM] = {0};
    if (dcpi_model_entry(ck, key, strlen(key), DCP_KIND_TENSOR, &idx, L->err) < 0)
        return -1;
    if (dcp_entry_at(ck, idx)->nchunks)
        return dcpi_err(L->err, EIO, "%s: %s: the key appears twice", L->path, key);
    if (dcpi_model_set_tensor(ck, idx, rb.dtype, nd, rb.size, L->err) < 0 ||
        dcpi_model_add_chunk(ck, idx, zero, rb.size, &ci, L->err) < 0)
        return -1;
    dcp_blob b = {.file = 0, .offset = dstart, .length = de->size};
    dcp_record rec = {.data_offset = dstart, .data_length = de->size, .storage_offset = rb.storage_offset,
                      .stride = rb.stride, .dtype = rb.dtype, .flags = L->rec_flags | rb.flags};
    dcpi_model_chunk_blob(ck, idx, ci, &b);
    if (dcpi_model_chunk_record(ck, idx, ci, &rec, L->err) < 0)
        return -1;
    return 0;
}

/* A bytes value holding a torch.save blob (what a DCP bytes item holds, and
 * what dcp convert writes for one) as a blob of the file: its bytes lie in
 * data.pkl, raw (BINBYTES) or as latin-1 text (protocol 2, torch.save's
 * default; DCP_TRANSFORM_LATIN1 decodes it). 1 and *b, or 0 when n is no
 * such value. */
static int pt_bytes_blob(pt_load *L, const pk_node *n, dcp_blob *b)
{
    const pk_node *t = n && n->type == PK_BYTES ? n : pk_latin1_text(n);
    if (!t || t->u.s.at == PK_AT_NONE || t->u.s.len < 4 || memcmp(t->u.s.p, "PK\3\4", 4) ||
        t->u.s.at > L->pkl_len || L->pkl_len - t->u.s.at < t->u.s.len)
        return 0;
    *b = (dcp_blob){.file = 0, .offset = L->pkl_start + t->u.s.at, .length = t->u.s.len,
                    .transforms = t == n ? 0 : DCP_TRANSFORM_LATIN1};
    return 1;
}

static void pt_skip(pt_load *L, const char *key, const char *why)
{
    L->nskipped++;
    if (L->hooks.skipped)
        L->hooks.skipped(L->hooks.ctx, key, why);
}

static int pt_leaf_path(pt_load *L, const char *key, size_t klen, int depth)
{
    if (L->hooks.path && depth > 0 && L->hooks.path(L->hooks.ctx, key, klen, L->stack, (size_t)depth) < 0)
        return dcpi_err(L->err, ENOMEM, "%s: out of memory", L->path);
    return 0;
}

static int pt_walk(pt_load *L, const pk_node *n, char *key, size_t klen, int depth);

/* A value the walk counts: at most visit_cap of them (a pickle's memo can
 * share one dict under 2^60 paths in a few bytes). */
static int pt_visit(pt_load *L)
{
    if (++L->visits > L->visit_cap)
        return dcpi_err(L->err, EIO, "%s: more values than its data.pkl has bytes: dicts or lists shared under "
                        "many keys", L->path);
    return 0;
}

/* Walk value v under key.part (a dict key, or a list index when part->str
 * is NULL). */
static int pt_walk_under(pt_load *L, const pk_node *v, const char *key, size_t klen, const dcp_path_part *part,
                         int depth)
{
    char num[24];
    const char *ps = part->str;
    size_t pl = part->len;
    if (!ps) {
        pl = (size_t)snprintf(num, sizeof num, "%" PRId64, part->index);
        ps = num;
    }
    size_t nl = klen + (klen ? 1 : 0) + pl;
    if (nl < pl || (L->key_bytes += nl) > L->key_cap)
        return dcpi_err(L->err, EIO, "%s: keys longer in all than its data.pkl can name: dicts shared under many "
                        "keys", L->path);
    L->stack[depth] = *part;
    char *sub = malloc(nl + 1);
    if (!sub)
        return dcpi_err(L->err, ENOMEM, "%s: out of memory", L->path);
    memcpy(sub, key, klen);
    if (klen)
        sub[klen] = '.';
    memcpy(sub + klen + (klen ? 1 : 0), ps, pl);
    sub[nl] = 0;
    int rc = pt_walk(L, v, sub, nl, depth + 1);
    free(sub);
    return rc;
}

/* Whether torch's flatten_state_dict walks into list n (_traverse.py's
 * _is_terminal): it holds a tensor, a dict, or a list it walks into.
 * Otherwise the list is one value. */
static int pt_list_walked(pt_load *L, const pk_node *n, int depth, int *walked)
{
    *walked = 0;
    for (size_t i = 0; i < n->u.seq.n && !*walked; i++) {
        const pk_node *v = n->u.seq.items[i];
        if (pt_visit(L) < 0)
            return -1;
        if (dcpi_torch_is_tensor(v) || pk_as_dict(v))
            *walked = 1;
        else if (v && v->type == PK_LIST && depth < MAX_DEPTH && pt_list_walked(L, v, depth + 1, walked) < 0)
            return -1;
    }
    return 0;
}

static int pt_walk(pt_load *L, const pk_node *n, char *key, size_t klen, int depth)
{
    if (depth > MAX_DEPTH)
        return dcpi_err(L->err, EIO, "%s: values nested too deeply", L->path);
    if (pt_visit(L) < 0)
        return -1;
    const pk_node *d = pk_as_dict(n);   /* a dict, or an OrderedDict (state_dict()) */
    if (d && (depth == 0 || d->u.dict.n)) {
        for (size_t i = 0; i < d->u.dict.n; i++) {
            const pk_node *k = d->u.dict.keys[i];
            char part[PK_KEY_TEXT_MAX];
            const char *ks = NULL;
            size_t kl = 0;
            /* Paths as torch 2.13's flatten_state_dict makes them: dict keys
             * str()-converted, list indexes as ints. */
            if (!pk_key_text(k, part, &ks, &kl)) {
                pt_skip(L, klen ? key : "(top level)", "a dict key that is neither a string nor an integer");
                continue;
            }
            if (memchr(ks, 0, kl)) {
                pt_skip(L, klen ? key : "(top level)", "a dict key that holds a NUL byte");
                continue;
            }
            dcp_path_part pp = {.str = ks, .len = kl};
            if (pt_walk_under(L, d->u.dict.vals[i], key, klen, &pp, depth) < 0)
                return -1;
        }
        return 0;
    }
    int walked = 0;
    if (depth > 0 && n && n->type == PK_LIST && pt_list_walked(L, n, depth, &walked) < 0)
        return -1;
    if (walked) {
        for (size_t i = 0; i < n->u.seq.n; i++) {
            dcp_path_part pp = {.index = (int64_t)i};
            if (pt_walk_under(L, n->u.seq.items[i], key, klen, &pp, depth) < 0)
                return -1;
        }
        return 0;
    }
    if (depth == 0)
        return dcpi_torch_is_tensor(n) ? pt_tensor(L, "", n)
                                       : dcpi_err(L->err, EIO, "%s: holds no dict of tensors", L->path);
    if (dcpi_torch_is_tensor(n))
        return pt_tensor(L, key, n) < 0 ? -1 : pt_leaf_path(L, key, klen, depth);
    /* A non-tensor value: a bytes object holding a torch.save blob is a DCP
     * bytes item as it lies in data.pkl; other plain values are pickled
     * into one, held in memory. */
    dcp_blob b;
    size_t idx;
    if (!pt_bytes_blob(L, n, &b)) {
        unsigned char *data = NULL;
        size_t len = 0;
        uint64_t room = L->held < VALUES_MAX ? VALUES_MAX - L->held : 0;
        /* torch.save bytes the pickle does not hold as they are (protocol
         * 0's escaped text): a copy; other values pickled */
        int r = pk_bytes_copy(n, &data, &len);
        if (r < 0)
            return dcpi_err(L->err, ENOMEM, "%s: out of memory", L->path);
        if (r == 0 && !(len >= 4 && !memcmp(data, "PK\3\4", 4))) {
            free(data);
            r = 1;
        }
        if (r == 1 && (r = dcpw_value_blob(key, n, room, &data, &len, L->err)) < 0)
            return dcpi_err_prefix(L->err, "%s", L->path);
        if (r > 0 || len > room) {
            free(data);
            if (r != 1)   /* the room is used up: later values are not tried (each */
                L->held = VALUES_MAX;   /* could share this one's nodes and cost as much) */
            pt_skip(L, key, r == 1 ? "not plain data (an object torch.load would rebuild)"
                                   : "the file's plain values pass " VALUES_MAX_TEXT " as bytes items");
            return 0;
        }
        L->held += len;
        if (dcpi_blob_hold(L->ck, data, len, &b, L->err) < 0)
            return -1;
    }
    if (dcpi_model_entry(L->ck, key, klen, DCP_KIND_BYTES, &idx, L->err) < 0)
        return -1;
    if (L->ck->entries[idx].has_blob)
        return dcpi_err(L->err, EIO, "%s: %s: the key appears twice", L->path, key);
    L->ck->entries[idx].blob = b;
    L->ck->entries[idx].has_blob = 1;
    return pt_leaf_path(L, key, klen, depth);
}

int dcpi_open_torch_file(const char *path, const dcpi_torch_hooks *hooks, dcp_checkpoint **out, size_t *nskipped,
                         dcp_error *err)
{
    *out = NULL;
    dcp_checkpoint *ck = ck_for_file(path, err);
    if (!ck)
        return -1;
    pt_load L = {.ck = ck, .path = path, .err = err};
    if (hooks)
        L.hooks = *hooks;
    pk_doc *doc = NULL;
    char *pkl = NULL;
    int rc = -1, zopen = 0;
    if (dcpi_ck_file_size(ck, 0, &L.flen, err) < 0)
        goto out;
    L.whole = (dcp_blob){.file = 0, .offset = 0, .length = L.flen};
    if (dcpi_zip_open(ck, &L.whole, "", &L.z, err) < 0)
        goto out;
    zopen = 1;
    const dcpi_zip_entry *pe = dcpi_zip_find(&L.z, "data.pkl"), *bo = dcpi_zip_find(&L.z, "byteorder");
    uint64_t pstart;
    if (!pe) {
        dcpi_err(err, EIO, "%s: no data.pkl: not a torch.save file", path);
        goto out;
    }
    if (pe->size > PKL_MAX) {
        dcpi_err(err, EFBIG, "%s: data.pkl of %" PRIu64 " bytes is too large", path, pe->size);
        goto out;
    }
    if (bo && bo->size > 16) {
        dcpi_err(err, EIO, "%s: byteorder record of %" PRIu64 " bytes: unknown byteorder", path, bo->size);
        goto out;
    }
    if (bo) {
        char order[17] = {0};
        uint64_t ostart;
        if (dcpi_zip_data(ck, &L.whole, "byteorder", bo, L.flen, &ostart, err) < 0 ||
            dcpi_blob_read(ck, &L.whole, order, bo->size, ostart, "byteorder", err) < 0)
            goto out;
        if (!strcmp(order, "big")) {
            L.rec_flags |= DCP_RECORD_BIG_ENDIAN;
        } else if (strcmp(order, "little")) {
            dcpi_err(err, EIO, "%s: unknown byteorder '%s'", path, order);
            goto out;
        }
    }
    if (dcpi_zip_data(ck, &L.whole, "data.pkl", pe, L.flen, &pstart, err) < 0)
        goto out;
    L.pkl_start = pstart;
    L.pkl_len = pe->size;
    L.visit_cap = 2 * pe->size + 64;             /* a value takes at least one opcode byte */
    L.key_cap = 16 * pe->size + (1u << 20);      /* a key's parts are in it, once a dict */
    if (!(pkl = malloc(pe->size ? pe->size : 1))) {
        dcpi_err(err, ENOMEM, "%s: out of memory", path);
        goto out;
    }
    const pk_node *root;
    char what[4200];
    snprintf(what, sizeof what, "%s: data.pkl", path);
    if (dcpi_blob_read(ck, &L.whole, pkl, pe->size, pstart, "data.pkl", err) < 0 ||
        pk_parse(pkl, pe->size, what, &doc, &root, err) < 0)
        goto out;
    char empty[1] = "";
    rc = pt_walk(&L, root, empty, 0, 0);
    if (rc == 0) {
        ck->info.generation = "torch.save file";
        ck->info.serialization = "torch_save";
        ck->info.layout = "single file";   /* dcpi_ck_name then names the file */
    }
out:
    pk_free(doc);
    free(pkl);
    if (zopen)
        dcpi_zip_close(&L.z);
    if (rc < 0) {
        dcp_close(ck);
        return -1;
    }
    if (nskipped)
        *nskipped = L.nskipped;
    *out = ck;
    return 0;
}

/* A safetensors file: its folder's model over the one file, read as one
 * file of a Hugging Face folder is (safetensors.c). */
static int open_safetensors_file(const char *path, dcp_checkpoint **out, dcp_error *err)
{
    const char *base;
    dcp_checkpoint *ck = ck_over_folder(path, &base, err);
    if (!ck)
        return -1;
    if (dcpi_load_safetensors_file(ck, base, path, err) < 0 || dcpi_ck_files_ready(ck, err) < 0) {
        dcp_close(ck);
        return -1;
    }
    *out = ck;
    return 0;
}

/* A path dcp_open_file does not read, said plainly: a file of a checkpoint
 * folder (its .metadata, a shard, Megatron's metadata.json, an index) names
 * the folder to open instead; anything else, what a checkpoint is. */
static int not_single_file(const char *path, dcp_error *err)
{
    struct stat st;
    if (stat(path, &st) < 0)
        return dcpi_err(err, errno, "%s: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode))
        return dcpi_err(err, EINVAL, "%s: a folder, not a torch.save or safetensors file: open it as a checkpoint folder", path);
    const char *dir;
    int dirlen;
    if (dcp_is_part_of_checkpoint(path, &dir, &dirlen))
        return dcpi_err(err, EINVAL, "%s: a file of a checkpoint folder, not a checkpoint of its own: open the folder %.*s",
                        path, dirlen, dir);
    return dcpi_err(err, EINVAL, "%s: not a checkpoint: neither a folder (with .metadata, __R.metadata or .safetensors "
                    "files) nor, by its name, a torch.save (.pt, .pth, .bin) or safetensors (.safetensors) file", path);
}

int dcp_open_file(const char *path, dcp_format fmt, dcp_checkpoint **out, size_t *nskipped, dcp_error *err)
{
    *out = NULL;
    if (nskipped)
        *nskipped = 0;
    if (fmt == DCP_FORMAT_AUTO)
        fmt = dcp_format_guess(path);
    if (fmt == DCP_FORMAT_TORCH_SAVE)
        return dcpi_open_torch_file(path, NULL, out, nskipped, err);
    if (fmt == DCP_FORMAT_SAFETENSORS)
        return open_safetensors_file(path, out, err);
    return not_single_file(path, err);
}
