/* dcp_hf_view_build: a checkpoint laid out as a Hugging Face model folder
 * by a recipe (recipe.c), nothing read but keys and shapes.
 *
 * Every output tensor is a view of one source tensor: some leading
 * dimensions fixed (a layer-stacked key unstacked), then its rows (dim 0)
 * taken through a row map (a part of a split, a fused QKV's q/k/v rows, a
 * rotary permutation within each head), each row whole, and for a rule with
 * "transpose" the 2-D result transposed (hf_view.c renders them). Outputs
 * are sorted by name and go into safetensors shards greedily
 * (a shard takes outputs until the next would pass the maximum; one shard is
 * model.safetensors, without an index, as save_pretrained writes it); the
 * folder is config.json (--config's bytes as they are, or the recipe's
 * template filled in), model.safetensors.index.json when there are several
 * shards, and the shards, each header as the safetensors writer makes it
 * (dcpw_st_header). */
#include <errno.h>
#include <fnmatch.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hf.h"
#include "pickle.h"
#include "sized_opts.h"
#include "st_header.h"
#include "zip.h"

#ifndef DCP_RECIPEDIR
#define DCP_RECIPEDIR NULL
#endif

#define OUTPUTS_MAX (1u << 22)       /* output tensors of one export */
#define CONFIG_MAX (16u << 20)       /* bytes of a config.json */
#define ARGS_PKL_MAX (64u << 20)     /* bytes of the Megatron common state's data.pkl */
#define NAME_MAX_LEN 1024

/* How a caller gives config.json: dcp convert's option and dcpfs's (the
 * export serves both, and a message naming one alone misled the other's user). */
#define HF_GIVE_CONFIG "give --config FILE (dcpfs: -o hf_config=FILE)"

typedef struct hf {
    dcp_checkpoint *ck;
    const dcp_export_options *opt;
    const char *srcp;
    hf_out *outs;
    size_t nouts, cap;
    uint64_t total;
    json_t *config;                  /* --config's object, or NULL */
} hf;

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
    return dcpi_err(err, EINVAL, "%s: %s: rule '%s' of recipe %s needs %s (%s): " HF_GIVE_CONFIG " (the "
                    "model's config.json)", h->srcp, key, ru->from, rc->name, what, name);
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
static int plan_entry(hf *h, const rcp_recipe *rc, const dcp_entry *e, const rcp_match *m, dcp_error *err)
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
    if (h->opt->dtype != DCP_DTYPE_INVALID && hf_is_float(e->dtype))
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

    if (ru->transpose && e->ndim - ns != 2)
        return dcpi_err(err, EINVAL, "%s: %s: rule '%s' of recipe %s transposes it, but it has %d dimension%s%s, "
                        "not 2", h->srcp, e->key, ru->from, rc->name, e->ndim - ns, e->ndim - ns == 1 ? "" : "s",
                        ns ? " once unstacked" : "");

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
        if (ru->op == RCP_SPLIT_QKV || ru->op == RCP_MERGE_QKV) {
            if (!param(h, &ru->kv_heads, &kv))
                kv = heads;
            if (!param(h, &ru->head_dim, &hd))
                hd = rows_in / (heads + 2 * kv);
            if (kv <= 0 || heads % kv || hd <= 0 || hd * (heads + 2 * kv) != rows_in || (ru->rope && hd % 2))
                return dcpi_err(err, EINVAL, "%s: %s: %" PRId64 " rows are not a fused QKV of %" PRId64
                                " query heads, %" PRId64 " key/value heads of %" PRId64 " rows (rule '%s')",
                                h->srcp, e->key, rows_in, heads, kv, hd, ru->from);
            if (ru->op == RCP_MERGE_QKV) {
                rows[0] = rows_in;
                maps[0][0] = (rcp_rowmap){.kind = 4, .groups = kv, .per_group = heads / kv, .head_dim = hd};
                nmaps[0] = 1;
            }
            for (int t = 0; t < 3 && ru->op == RCP_SPLIT_QKV; t++) {
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
            hf_out o = {.from = e->key, .entry = e, .base = k * sub, .rows = rows[t], .row_elems = row_elems,
                        .nmaps = nmaps[t], .in = e->dtype, .out = out, .ndim = e->ndim - ns,
                        .transpose = ru->transpose};
            memcpy(o.maps, maps[t], sizeof o.maps);
            for (int d = 0; d < o.ndim; d++)
                o.shape[d] = e->shape[ns + d];
            if (o.ndim)
                o.shape[0] = rows[t];
            if (o.transpose) {
                o.shape[0] = (int64_t)row_elems;
                o.shape[1] = rows[t];
            }
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
 * the checkpoint's common state, read through the torch.save zip reader and
 * the pickle parser (nothing is executed). Before Megatron-Core 0.19 the
 * common state is SRC/common.pt ({"args": ...}); from 0.19 it is a bytes item
 * of the checkpoint itself, "common_state/shard_0_1", torch.save bytes of
 * [{"args": ...}]. Megatron-LM's fsdp_dtensor and torch_dcp formats
 * (torch.distributed.checkpoint.save of its whole state dict) have no common
 * state: the Namespace is the bytes item "args" itself, torch.save bytes.
 * *args is the Namespace's attribute dict, or NULL when the source has none
 * of them or its common state holds no args; `where` names the common state
 * in messages. */
#define COMMON_STATE_ITEM "common_state/shard_0_1"
#define ARGS_ITEM "args"

typedef struct mg_args {
    pk_doc *doc;
    void *buf;
    const pk_node *args;
    char where[4200];
} mg_args;

/* The root of a torch.save blob's data.pkl (a->doc, a->buf keep it). */
static int common_pickle(dcp_checkpoint *ck, const dcp_blob *b, mg_args *a, const pk_node **root, dcp_error *err)
{
    char *buf;
    int rc = dcpi_zip_pickle(ck, b, a->where, ARGS_PKL_MAX, &buf, &a->doc, root, err);
    a->buf = buf;
    return rc;
}

/* A Namespace's attribute dict, or NULL when ns is not an object with state. */
static const pk_node *namespace_attrs(const pk_node *ns)
{
    return ns && ns->type == PK_CALL && ns->u.call.state ? pk_as_dict(ns->u.call.state) : NULL;
}

/* The Namespace's attribute dict under "args" of a common-state dict. */
static const pk_node *args_of(const pk_node *common)
{
    return namespace_attrs(pk_dict_get(pk_as_dict(common), "args"));
}

static int megatron_args(dcp_checkpoint *src, const char *srcp, mg_args *a, dcp_error *err)
{
    char path[4200];
    struct stat st;
    const pk_node *root;
    int rc;
    memset(a, 0, sizeof *a);
    if ((size_t)snprintf(path, sizeof path, "%s/common.pt", srcp) < sizeof path && stat(path, &st) == 0 &&
        S_ISREG(st.st_mode)) {
        dcp_checkpoint *ck;
        snprintf(a->where, sizeof a->where, "%s", path);
        if (dcp_open_file(path, DCP_FORMAT_TORCH_SAVE, &ck, NULL, err) < 0)
            return -1;
        dcp_blob b = {.file = 0, .offset = 0, .length = (uint64_t)st.st_size};
        if ((rc = common_pickle(ck, &b, a, &root, err)) == 0)
            a->args = args_of(root);
        dcp_close(ck);
        return rc;
    }
    const dcp_entry *e = dcp_find(src, COMMON_STATE_ITEM);
    if (e && e->kind == DCP_KIND_BYTES) {
        snprintf(a->where, sizeof a->where, "%s's %s item", srcp, COMMON_STATE_ITEM);
        if ((rc = common_pickle(src, &e->blob, a, &root, err)) == 0)
            a->args = args_of(root->type == PK_LIST && pk_len(root) == 1 ? pk_item(root, 0) : root);
        return rc;
    }
    e = dcp_find(src, ARGS_ITEM);
    if (!e || e->kind != DCP_KIND_BYTES)
        return 0;
    snprintf(a->where, sizeof a->where, "%s's %s item", srcp, ARGS_ITEM);
    if ((rc = common_pickle(src, &e->blob, a, &root, err)) == 0)
        a->args = namespace_attrs(root);
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
        if (!loaded++ && megatron_args(h->ck, h->srcp, &a, err) < 0) {
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
            const char *arg = json_string_value(names) ? json_string_value(names)
                                                       : json_string_value(json_array_get(names, 0));
            if (a.where[0])
                rc_ = dcpi_err(err, EINVAL, "%s: recipe %s cannot write config.json: %s (Megatron's args.%s) is not "
                               "in %s: " HF_GIVE_CONFIG, h->srcp, rc->name, k, arg, a.where);
            else
                rc_ = dcpi_err(err, EINVAL, "%s: recipe %s cannot write config.json: %s is Megatron's args.%s, and "
                               "the checkpoint has no common state (no common.pt, no %s item, no %s item): "
                               HF_GIVE_CONFIG, h->srcp, rc->name, k, arg, COMMON_STATE_ITEM, ARGS_ITEM);
            break;
        }
    }
    json_t *expect = json_object_get(rc->doc, "megatron_expect");
    if (rc_ == 0 && json_is_object(expect) && json_object_size(expect)) {
        if (!loaded++ && megatron_args(h->ck, h->srcp, &a, err) < 0)
            rc_ = -1;
        json_object_foreach(expect, k, v) {
            json_t *got = a.args ? mg_value(a.args, k) : NULL;
            if (rc_ == 0 && got && !json_equal(got, v)) {
                char *gs = json_dumps(got, JSON_ENCODE_ANY), *ws = json_dumps(v, JSON_ENCODE_ANY);
                rc_ = dcpi_err(err, EINVAL, "%s: args.%s is %s, recipe %s expects %s: " HF_GIVE_CONFIG
                               " if the model is still what the recipe writes", a.where, k, gs ? gs : "?", rc->name,
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
                            "(%s): " HF_GIVE_CONFIG, h->srcp, rc->name, k,
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


static void out_free(hf_out *outs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(outs[i].key);
    free(outs);
}

static char *dump_json(const json_t *j)
{
    return json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15));
}

/* ------------------------------------------------------------ the layout */

static int add_file(dcp_hf_view *v, const char *name, unsigned char *head, uint64_t head_len, dcp_error *err)
{
    hf_file *f = &v->files[v->nfiles++];
    snprintf(f->name, sizeof f->name, "%s", name);
    f->head = head;
    f->head_len = head_len;
    if (!head)
        return dcpi_err(err, ENOMEM, "%s: out of memory", v->srcp);
    return 0;
}

/* The folder: config.json (cfg: its bytes), the index when there are
 * several shards, the shards. Takes h->outs. */
static int lay_out(hf *h, dcp_hf_view *v, char *cfg, size_t cfg_len, uint64_t max, dcp_error *err)
{
    v->outs = h->outs;
    v->nouts = h->nouts;
    v->total = h->total;
    h->outs = NULL;
    h->nouts = 0;
    size_t nshards = 0;
    uint64_t cur = 0;
    size_t *shard = calloc(v->nouts ? v->nouts : 1, sizeof *shard);
    dcp_item *items = calloc(v->nouts ? v->nouts : 1, sizeof *items);
    if (!shard || !items) {
        free(shard);
        free(items);
        free(cfg);
        return dcpi_err(err, ENOMEM, "%s: out of memory", v->srcp);
    }
    for (size_t i = 0; i < v->nouts; i++) {
        const hf_out *o = &v->outs[i];
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
    int rc = 0;
    v->files = calloc(nshards + 2, sizeof *v->files);
    v->pub = calloc(nshards + 2, sizeof *v->pub);
    if (!v->files || !v->pub) {
        free(cfg);
        rc = dcpi_err(err, ENOMEM, "%s: out of memory", v->srcp);
    }
    if (rc == 0)
        rc = add_file(v, "config.json", (unsigned char *)cfg, cfg_len, err);
    json_t *index = json_object(), *meta = json_object(), *wm = json_object();
    for (size_t sh = 0, first = 0; sh < nshards && rc == 0; sh++) {
        size_t last = first;
        while (last < v->nouts && shard[last] == sh)
            last++;
        char name[64], what[4200];
        if (nshards == 1)
            snprintf(name, sizeof name, "model.safetensors");
        else
            snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", sh + 1, nshards);
        snprintf(what, sizeof what, "%s: %s", v->srcp, name);
        unsigned char *hdr;
        uint64_t hlen, dlen, at;
        if (dcpw_st_header(items + first, last - first, what, &hdr, &hlen, &dlen, err) < 0) {
            rc = -1;
            break;
        }
        hf_file *f = &v->files[v->nfiles];
        rc = add_file(v, name, hdr, hlen, err);
        f->first = first;
        f->count = last - first;
        at = hlen;
        for (size_t i = first; i < last; i++) {
            v->outs[i].at = at;
            at += v->outs[i].nbytes;   /* no overflow: the header's offsets added up */
            json_object_set_new(wm, items[i].key, json_string(name));
        }
        first = last;
    }
    json_object_set_new(meta, "total_size", json_integer((json_int_t)v->total));
    json_object_set_new(index, "metadata", meta);
    json_object_set_new(index, "weight_map", wm);
    if (rc == 0 && nshards > 1) {
        char *js = dump_json(index);
        rc = add_file(v, "model.safetensors.index.json", (unsigned char *)js, js ? strlen(js) : 0, err);
    }
    json_decref(index);
    for (size_t i = 0; i < v->nfiles; i++) {
        const hf_file *f = &v->files[i];
        uint64_t size = f->head_len;
        if (f->count)
            size = v->outs[f->first + f->count - 1].at + v->outs[f->first + f->count - 1].nbytes;
        v->pub[i] = (dcp_hf_file){.name = f->name, .size = size};
    }
    free(items);
    free(shard);
    return rc;
}

/* ------------------------------------------------------------ the view */

/* The caller's options (dcp.h, options) copied into o: 0, or -1 naming call. */
static int take_opts(dcp_export_options *o, const dcp_export_options *caller, const char *call, dcp_error *err)
{
    return dcpi_sized_opts(o, sizeof *o, DCPI_OPTS_MIN(dcp_export_options, skipped_ctx), caller, call,
                           "DCP_EXPORT_OPTIONS_INIT", err);
}

int dcp_export_check(const dcp_export_options *caller, dcp_error *err)
{
    dcp_export_options o;
    const dcp_export_options *opt = &o;
    if (!caller)
        return dcpi_err(err, EINVAL, "an export needs a recipe");
    if (take_opts(&o, caller, "dcp_export_check", err) < 0)
        return -1;
    if (!opt->recipe)
        return dcpi_err(err, EINVAL, "an export needs a recipe");
    if (opt->dtype != DCP_DTYPE_INVALID && !hf_is_float(opt->dtype))
        return dcpi_err(err, EINVAL, "--dtype %s: float32, float16, bfloat16 or float64",
                        dcp_dtype_name(opt->dtype) ? dcp_dtype_name(opt->dtype) : "?");
    rcp_recipe *rc;
    if (rcp_load(opt->recipe, opt->recipe_dirs, DCP_RECIPEDIR, &rc, err) < 0)
        return -1;
    rcp_free(rc);
    json_t *cfg = NULL;
    char *bytes = NULL;
    size_t len;
    if (opt->config && read_config(opt->config, &cfg, &bytes, &len, err) < 0)
        return -1;
    json_decref(cfg);
    free(bytes);
    return 0;
}

int hf_view_build(dcp_checkpoint *ck, const char *srcp, const dcp_export_options *opt, dcp_hf_view **out,
                  dcp_error *err)
{
    *out = NULL;
    if (opt->dtype != DCP_DTYPE_INVALID && !hf_is_float(opt->dtype))
        return dcpi_err(err, EINVAL, "%s: --dtype %s: float32, float16, bfloat16 or float64", srcp,
                        dcp_dtype_name(opt->dtype) ? dcp_dtype_name(opt->dtype) : "?");
    rcp_recipe *rc;
    if (rcp_load(opt->recipe, opt->recipe_dirs, DCP_RECIPEDIR, &rc, err) < 0)
        return -1;
    hf h = {.ck = ck, .opt = opt, .srcp = srcp};
    char *cfg_bytes = NULL;
    size_t cfg_len = 0;
    json_t *cfg_out = NULL;
    int rc_ = 0;
    if (opt->config && read_config(opt->config, &h.config, &cfg_bytes, &cfg_len, err) < 0)
        rc_ = -1;
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
        rc_ = plan_entry(&h, rc, e, &m, err);
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
        rc_ = dcpi_err(err, EINVAL, "%s: recipe %s has no config.json template: " HF_GIVE_CONFIG, srcp, rc->name);
    if (rc_ == 0 && !cfg_bytes) {
        if ((cfg_bytes = dump_json(cfg_out)))
            cfg_len = strlen(cfg_bytes);
        else
            rc_ = dcpi_err(err, ENOMEM, "%s: cannot build config.json", srcp);
    }

    dcp_hf_view *v = NULL;
    if (rc_ == 0 && (!(v = calloc(1, sizeof *v)) || !(v->srcp = strdup(srcp)))) {
        free(v);
        v = NULL;
        rc_ = dcpi_err(err, ENOMEM, "%s: out of memory", srcp);
    }
    if (rc_ == 0) {
        v->ck = ck;
        rc_ = lay_out(&h, v, cfg_bytes, cfg_len, opt->max_shard_size ? opt->max_shard_size : 5000000000ull, err);
        cfg_bytes = NULL;   /* the view's now */
        if (rc_ < 0) {
            dcp_hf_view_free(v);
            v = NULL;
        }
    }
    free(cfg_bytes);
    json_decref(cfg_out);
    json_decref(h.config);
    out_free(h.outs, h.nouts);
    rcp_free(rc);
    *out = v;
    return rc_;
}

int dcp_hf_view_build(dcp_checkpoint *ck, const dcp_export_options *caller, dcp_hf_view **out, dcp_error *err)
{
    if (!out)
        return dcpi_err(err, EINVAL, "dcp_hf_view_build: no place for the view");
    *out = NULL;
    dcp_export_options o;
    if (!ck || !caller)
        return dcpi_err(err, EINVAL, "dcp_hf_view_build: a checkpoint and options with a recipe are needed");
    if (take_opts(&o, caller, "dcp_hf_view_build", err) < 0)
        return -1;
    if (!o.recipe)
        return dcpi_err(err, EINVAL, "dcp_hf_view_build: a checkpoint and options with a recipe are needed");
    return hf_view_build(ck, dcp_path(ck), &o, out, err);
}

const dcp_hf_file *dcp_hf_view_files(const dcp_hf_view *v, size_t *n)
{
    *n = v ? v->nfiles : 0;
    return v ? v->pub : NULL;
}

void dcp_hf_view_free(dcp_hf_view *v)
{
    if (!v)
        return;
    for (size_t i = 0; i < v->nfiles; i++)
        free(v->files[i].head);
    free(v->files);
    free(v->pub);
    out_free(v->outs, v->nouts);
    free(v->srcp);
    free(v);
}
