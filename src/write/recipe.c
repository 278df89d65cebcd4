/* Export recipes: load and check a recipe file, match keys against its
 * rules, expand output names, and the row maps of its reshaping ops.
 *
 * A recipe file is hostile input like any other: its size, every field's
 * type, the length and placeholders of every pattern and the range of every
 * number are checked before use, and an error names the file, the rule and
 * what is wrong (dcp-recipe(5) documents the format). */
#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "internal.h"
#include "recipe.h"

#define RECIPE_FILE_MAX (1u << 20)    /* bytes of a recipe file */
#define RECIPE_RULES_MAX 4096
#define PATTERN_MAX 512

static int is_ident(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
}

/* Check a pattern or template: {X} placeholders, well formed, not two in a
 * row (a number must end where text starts). */
static int check_pattern(const char *p, const char *file, const char *what, dcp_error *err)
{
    size_t n = strlen(p);
    int nvars = 0;
    if (n == 0 || n > PATTERN_MAX)
        return dcpi_err(err, EINVAL, "%s: %s: '%s' is empty or longer than %d bytes", file, what, p, PATTERN_MAX);
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '}')
            return dcpi_err(err, EINVAL, "%s: %s: '%s': '}' without '{'", file, what, p);
        if (p[i] != '{')
            continue;
        size_t j = i + 1;
        while (j < n && is_ident(p[j]))
            j++;
        if (j == i + 1 || j >= n || p[j] != '}')
            return dcpi_err(err, EINVAL, "%s: %s: '%s': a placeholder is {NAME} (letters and '_')", file, what, p);
        if (j + 1 < n && p[j + 1] == '{')
            return dcpi_err(err, EINVAL, "%s: %s: '%s': two placeholders in a row", file, what, p);
        if (++nvars > RCP_MAX_VARS)
            return dcpi_err(err, EINVAL, "%s: %s: '%s': more than %d placeholders", file, what, p, RCP_MAX_VARS);
        i = j;
    }
    return 0;
}

/* Is {name} in pattern p? */
static int has_var(const char *p, const char *name)
{
    size_t nl = strlen(name);
    for (const char *q = strchr(p, '{'); q; q = strchr(q + 1, '{'))
        if (!strncmp(q + 1, name, nl) && q[1 + nl] == '}')
            return 1;
    return 0;
}

static int parse_param(json_t *v, rcp_param *p, const char *file, size_t rule, const char *field, dcp_error *err)
{
    memset(p, 0, sizeof *p);
    if (!v)
        return 0;
    if (json_is_integer(v)) {
        json_int_t x = json_integer_value(v);
        if (x <= 0 || x > (1 << 24))
            return dcpi_err(err, EINVAL, "%s: rule %zu: %s: %" JSON_INTEGER_FORMAT " is not in 1..16777216", file, rule,
                            field, x);
        p->value = x;
        return 0;
    }
    if (json_is_string(v)) {
        p->names[0] = json_string_value(v);
        p->nnames = 1;
        return 0;
    }
    if (json_is_array(v) && json_array_size(v) >= 1 && json_array_size(v) <= 4) {
        for (size_t i = 0; i < json_array_size(v); i++) {
            json_t *s = json_array_get(v, i);
            if (!json_is_string(s))
                break;
            p->names[p->nnames++] = json_string_value(s);
        }
        if ((size_t)p->nnames == json_array_size(v))
            return 0;
    }
    return dcpi_err(err, EINVAL, "%s: rule %zu: %s: a number, a config.json key, or a list of up to 4 keys", file, rule,
                    field);
}

static int parse_rope(json_t *v, rcp_rope *r, const char *file, size_t rule, dcp_error *err)
{
    const char *s = json_string_value(v);
    *r = RCP_ROPE_NONE;
    if (!v)
        return 0;
    if (s && !strcmp(s, "to_hf"))
        *r = RCP_ROPE_TO_HF;
    else if (s && !strcmp(s, "from_hf"))
        *r = RCP_ROPE_FROM_HF;
    else if (!s || strcmp(s, "none"))
        return dcpi_err(err, EINVAL, "%s: rule %zu: rope: \"to_hf\", \"from_hf\" or \"none\"", file, rule);
    return 0;
}

static int strings(json_t *v, const char **out, int max, int *n, const char *file, const char *field, dcp_error *err)
{
    *n = 0;
    if (!v)
        return 0;
    if (json_is_string(v)) {
        out[(*n)++] = json_string_value(v);
        return 0;
    }
    if (!json_is_array(v) || json_array_size(v) > (size_t)max)
        return dcpi_err(err, EINVAL, "%s: %s: a string or a list of at most %d strings", file, field, max);
    for (size_t i = 0; i < json_array_size(v); i++) {
        const char *s = json_string_value(json_array_get(v, i));
        if (!s || !*s)
            return dcpi_err(err, EINVAL, "%s: %s: item %zu is not a non-empty string", file, field, i);
        out[(*n)++] = s;
    }
    return 0;
}

static int parse_rule(rcp_recipe *r, json_t *o, size_t i, rcp_rule *ru, dcp_error *err)
{
    const char *file = r->path;
    if (!json_is_object(o))
        return dcpi_err(err, EINVAL, "%s: rule %zu: not an object", file, i);
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        static const char *known[] = {"from", "to", "op", "rope", "heads", "kv_heads", "head_dim", "stacked",
                                      "transpose", "comment"};
        size_t j = 0;
        while (j < sizeof known / sizeof known[0] && strcmp(known[j], k))
            j++;
        if (j == sizeof known / sizeof known[0])
            return dcpi_err(err, EINVAL, "%s: rule %zu: unknown field '%s'", file, i, k);
    }
    memset(ru, 0, sizeof *ru);
    ru->from = json_string_value(json_object_get(o, "from"));
    if (!ru->from)
        return dcpi_err(err, EINVAL, "%s: rule %zu: \"from\" (a key pattern) is missing", file, i);
    char what[64];
    snprintf(what, sizeof what, "rule %zu: from", i);
    if (check_pattern(ru->from, file, what, err) < 0)
        return -1;
    if (strings(json_object_get(o, "to"), ru->to, RCP_MAX_OUT, &ru->nto, file, "to", err) < 0)
        return dcpi_err_prefix(err, "rule %zu", i);
    if (ru->nto == 0)
        return dcpi_err(err, EINVAL, "%s: rule %zu (%s): \"to\" is missing", file, i, ru->from);
    if (strings(json_object_get(o, "stacked"), ru->stacked, RCP_MAX_STACK, &ru->nstacked, file, "stacked", err) < 0)
        return -1;
    const char *op = json_string_value(json_object_get(o, "op"));
    if (!op || !strcmp(op, "rename"))
        ru->op = RCP_RENAME;
    else if (!strcmp(op, "split") || !strcmp(op, "split_gate_up"))
        ru->op = RCP_SPLIT;
    else if (!strcmp(op, "split_qkv"))
        ru->op = RCP_SPLIT_QKV;
    else if (!strcmp(op, "rope_permute"))
        ru->op = RCP_ROPE_PERMUTE;
    else if (!strcmp(op, "merge_qkv"))
        ru->op = RCP_MERGE_QKV;
    else
        return dcpi_err(err, EINVAL, "%s: rule %zu (%s): unknown op '%s' (rename, split, split_gate_up, split_qkv, "
                        "rope_permute, merge_qkv)", file, i, ru->from, op);
    json_t *tr = json_object_get(o, "transpose");
    if (tr && !json_is_boolean(tr))
        return dcpi_err(err, EINVAL, "%s: rule %zu (%s): transpose is true or false", file, i, ru->from);
    ru->transpose = json_is_true(tr);
    if (json_object_get(o, "op") && !op)
        return dcpi_err(err, EINVAL, "%s: rule %zu (%s): op is not a string", file, i, ru->from);
    int want = ru->op == RCP_SPLIT_QKV ? 3 : ru->op == RCP_SPLIT ? -1 : 1;
    if ((want > 0 && ru->nto != want) || (want < 0 && ru->nto < 2))
        return dcpi_err(err, EINVAL, "%s: rule %zu (%s): %s takes %s output names, not %d", file, i, ru->from,
                        op ? op : "rename", want == 3 ? "3" : want == 1 ? "1" : "2 or more", ru->nto);
    if (parse_rope(json_object_get(o, "rope"), &ru->rope, file, i, err) < 0 ||
        parse_param(json_object_get(o, "heads"), &ru->heads, file, i, "heads", err) < 0 ||
        parse_param(json_object_get(o, "kv_heads"), &ru->kv_heads, file, i, "kv_heads", err) < 0 ||
        parse_param(json_object_get(o, "head_dim"), &ru->head_dim, file, i, "head_dim", err) < 0)
        return -1;
    if (ru->op == RCP_ROPE_PERMUTE && ru->rope == RCP_ROPE_NONE)
        ru->rope = RCP_ROPE_TO_HF;
    if ((ru->op == RCP_ROPE_PERMUTE || ru->op == RCP_SPLIT_QKV || ru->op == RCP_MERGE_QKV) && !ru->heads.value &&
        !ru->heads.nnames)
        return dcpi_err(err, EINVAL, "%s: rule %zu (%s): %s needs \"heads\"", file, i, ru->from, op);
    if (ru->rope && ru->op != RCP_ROPE_PERMUTE && ru->op != RCP_SPLIT_QKV)
        return dcpi_err(err, EINVAL, "%s: rule %zu (%s): rope applies to rope_permute and split_qkv only", file, i,
                        ru->from);
    /* Every placeholder of an output name is captured or stacked. */
    for (int t = 0; t < ru->nto; t++) {
        snprintf(what, sizeof what, "rule %zu: to", i);
        if (check_pattern(ru->to[t], file, what, err) < 0)
            return -1;
        for (const char *q = strchr(ru->to[t], '{'); q; q = strchr(q + 1, '{')) {
            const char *e = strchr(q, '}');
            char name[PATTERN_MAX + 1];
            snprintf(name, sizeof name, "%.*s", (int)(e - q - 1), q + 1);
            int found = has_var(ru->from, name);
            for (int s = 0; s < ru->nstacked && !found; s++)
                found = !strcmp(ru->stacked[s], name);
            if (!found)
                return dcpi_err(err, EINVAL, "%s: rule %zu (%s): output name '%s' uses {%s}, which the pattern "
                                "does not capture", file, i, ru->from, ru->to[t], name);
        }
    }
    return 0;
}

static int parse_recipe(rcp_recipe *r, dcp_error *err)
{
    json_t *d = r->doc;
    const char *file = r->path, *k;
    json_t *v;
    if (!json_is_object(d))
        return dcpi_err(err, EINVAL, "%s: a recipe is a JSON object", file);
    json_object_foreach(d, k, v) {
        static const char *known[] = {"recipe", "description", "strip_prefix", "unstack", "ignore", "rules",
                                      "config", "megatron_expect", "comment"};
        size_t j = 0;
        while (j < sizeof known / sizeof known[0] && strcmp(known[j], k))
            j++;
        if (j == sizeof known / sizeof known[0])
            return dcpi_err(err, EINVAL, "%s: unknown field '%s'", file, k);
    }
    r->name = json_string_value(json_object_get(d, "recipe"));
    r->description = json_string_value(json_object_get(d, "description"));
    if (!r->name)
        return dcpi_err(err, EINVAL, "%s: \"recipe\" (its name) is missing", file);
    if (strings(json_object_get(d, "strip_prefix"), r->prefixes, 8, &r->nprefixes, file, "strip_prefix", err) < 0 ||
        strings(json_object_get(d, "unstack"), r->unstack, RCP_MAX_STACK, &r->nunstack, file, "unstack", err) < 0 ||
        strings(json_object_get(d, "ignore"), r->ignore, 64, &r->nignore, file, "ignore", err) < 0)
        return -1;
    for (int u = 0; u < r->nunstack; u++)
        for (const char *c = r->unstack[u]; *c; c++)
            if (!is_ident(*c))
                return dcpi_err(err, EINVAL, "%s: unstack: '%s' is not a placeholder name", file, r->unstack[u]);
    json_t *rules = json_object_get(d, "rules");
    if (!json_is_array(rules) || json_array_size(rules) == 0 || json_array_size(rules) > RECIPE_RULES_MAX)
        return dcpi_err(err, EINVAL, "%s: \"rules\" is not a list of 1 to %d rules", file, RECIPE_RULES_MAX);
    r->nrules = json_array_size(rules);
    r->rules = calloc(r->nrules, sizeof *r->rules);
    if (!r->rules)
        return dcpi_err(err, ENOMEM, "%s: out of memory", file);
    for (size_t i = 0; i < r->nrules; i++)
        if (parse_rule(r, json_array_get(rules, i), i, &r->rules[i], err) < 0)
            return -1;
    r->config = json_object_get(d, "config");
    if (r->config && !json_is_object(r->config))
        return dcpi_err(err, EINVAL, "%s: \"config\" is not an object", file);
    return 0;
}

static int load_file(const char *path, rcp_recipe **out, dcp_error *err)
{
    struct stat st;
    if (stat(path, &st) < 0)
        return dcpi_err(err, errno, "%s: cannot open the recipe: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode) || st.st_size > RECIPE_FILE_MAX)
        return dcpi_err(err, EINVAL, "%s: a recipe is a file of at most %u bytes", path, RECIPE_FILE_MAX);
    json_error_t je;
    json_t *doc = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!doc)
        return dcpi_err(err, EINVAL, "%s: line %d: not valid JSON: %s", path, je.line, je.text);
    rcp_recipe *r = calloc(1, sizeof *r);
    char *p = strdup(path);
    if (!r || !p) {
        free(r);
        free(p);
        json_decref(doc);
        return dcpi_err(err, ENOMEM, "%s: out of memory", path);
    }
    r->doc = doc;
    r->path = p;
    if (parse_recipe(r, err) < 0) {
        rcp_free(r);
        return -1;
    }
    *out = r;
    return 0;
}

void rcp_free(rcp_recipe *r)
{
    if (!r)
        return;
    free(r->rules);
    free((char *)r->path);
    json_decref(r->doc);
    free(r);
}

/* Append the names of the *.json files of dir to list (for the error). */
static void list_dir(const char *dir, size_t dl, char *list, size_t cap)
{
    char d[4096];
    if (dl >= sizeof d)
        return;
    memcpy(d, dir, dl);
    d[dl] = 0;
    DIR *dh = opendir(d);
    struct dirent *de;
    while (dh && (de = readdir(dh))) {
        size_t n = strlen(de->d_name), l = strlen(list);
        if (n > 5 && !strcmp(de->d_name + n - 5, ".json") && de->d_name[0] != '.' && l + n < cap)
            snprintf(list + l, cap - l, "%s%.*s", l ? ", " : "", (int)(n - 5), de->d_name);
    }
    if (dh)
        closedir(dh);
}

int rcp_load(const char *name, const char *dirs, const char *fallback, rcp_recipe **out, dcp_error *err)
{
    size_t nl = name ? strlen(name) : 0;
    if (!nl)
        return dcpi_err(err, EINVAL, "no recipe named (--recipe NAME)");
    if (strchr(name, '/') || (nl > 5 && !strcmp(name + nl - 5, ".json")))
        return load_file(name, out, err);
    for (const char *c = name; *c; c++)
        if (!is_ident(*c) && *c != '-' && !(*c >= '0' && *c <= '9') && *c != '.')
            return dcpi_err(err, EINVAL, "recipe '%s': a name is letters, digits, '-', '_' and '.'", name);
    char list[1024] = "", path[4200];
    const char *srcs[2] = {dirs, fallback};
    for (int s = 0; s < 2; s++) {
        for (const char *p = srcs[s]; p && *p;) {
            const char *c = strchr(p, ':');
            size_t dl = c ? (size_t)(c - p) : strlen(p);
            if (dl && (size_t)snprintf(path, sizeof path, "%.*s/%s.json", (int)dl, p, name) < sizeof path) {
                struct stat st;
                if (stat(path, &st) == 0)
                    return load_file(path, out, err);
                list_dir(p, dl, list, sizeof list);
            }
            p = c ? c + 1 : p + dl;
        }
    }
    /* None at all: most likely a build not installed yet (the recipes are
     * installed by make install), so say where else they can come from. */
    return dcpi_err(err, ENOENT, "recipe '%s': no such recipe (found: %s; searched %s%s%s)%s", name,
                    list[0] ? list : "none", dirs && *dirs ? dirs : "", dirs && *dirs && fallback ? ":" : "",
                    fallback ? fallback : "",
                    list[0] ? "" : ": install them (make install), or set DCP_RECIPE_PATH to a folder of recipes "
                                   "(the source tree's recipes/), or name a recipe file (NAME.json)");
}

/* Match pattern p (with the placeholders of `skip` and the dot after each
 * left out: a layer-stacked key) against key k. */
static int match_one(const char *p, const char *k, const char *const *skip, int nskip, rcp_match *m)
{
    while (*p) {
        if (*p != '{') {
            if (*p++ != *k++)
                return 0;
            continue;
        }
        const char *e = strchr(p, '}');
        size_t nl = (size_t)(e - p - 1);
        int skipped = 0;
        for (int s = 0; s < nskip && !skipped; s++)
            skipped = strlen(skip[s]) == nl && !strncmp(skip[s], p + 1, nl);
        if (skipped) {
            if (m->nstack >= RCP_MAX_STACK)
                return 0;
            m->stack_name[m->nstack] = p + 1;
            m->stack_len[m->nstack++] = nl;
            p = e + 1;
            if (*p == '.')
                p++;
            continue;
        }
        int64_t v = 0;
        const char *k0 = k;
        while (*k >= '0' && *k <= '9' && k - k0 < 10)
            v = v * 10 + (*k++ - '0');
        if (k == k0 || (*k >= '0' && *k <= '9') || (k - k0 > 1 && *k0 == '0') || m->nvars >= RCP_MAX_VARS)
            return 0;
        /* The same placeholder twice must capture the same number. */
        for (int i = 0; i < m->nvars; i++)
            if (m->var_len[i] == nl && !strncmp(m->var_name[i], p + 1, nl) && m->var_value[i] != v)
                return 0;
        m->var_name[m->nvars] = p + 1;
        m->var_len[m->nvars] = nl;
        m->var_value[m->nvars++] = v;
        p = e + 1;
    }
    return *k == 0;
}

int rcp_match_key(const rcp_recipe *r, const char *key, rcp_match *m)
{
    for (int pre = -1; pre < r->nprefixes; pre++) {
        const char *k = key;
        if (pre >= 0) {
            size_t pl = strlen(r->prefixes[pre]);
            if (strncmp(key, r->prefixes[pre], pl))
                continue;
            k = key + pl;
        }
        for (size_t i = 0; i < r->nrules; i++) {
            const rcp_rule *ru = &r->rules[i];
            /* Every subset of the recipe's unstack placeholders the pattern holds may be stacked. */
            const char *present[RCP_MAX_STACK];
            int np = 0;
            for (int u = 0; u < r->nunstack; u++)
                if (has_var(ru->from, r->unstack[u]))
                    present[np++] = r->unstack[u];
            for (unsigned mask = 0; mask < (1u << np); mask++) {
                const char *skip[RCP_MAX_STACK];
                int ns = 0;
                for (int b = 0; b < np; b++)
                    if (mask & (1u << b))
                        skip[ns++] = present[b];
                memset(m, 0, sizeof *m);
                if (!match_one(ru->from, k, skip, ns, m))
                    continue;
                for (int s = 0; s < ru->nstacked && m->nstack < RCP_MAX_STACK; s++) {
                    m->stack_name[m->nstack] = ru->stacked[s];
                    m->stack_len[m->nstack++] = strlen(ru->stacked[s]);
                }
                if (ns + ru->nstacked > RCP_MAX_STACK)
                    continue;
                m->rule = ru;
                return 1;
            }
        }
    }
    return 0;
}

int rcp_ignored(const rcp_recipe *r, const char *key)
{
    for (int i = 0; i < r->nignore; i++)
        if (fnmatch(r->ignore[i], key, 0) == 0)
            return 1;
    return 0;
}

int rcp_expand(const char *t, const rcp_match *m, const int64_t *stack_values, char *buf, size_t cap)
{
    size_t o = 0;
    while (*t) {
        if (*t != '{') {
            if (o + 1 >= cap)
                return -1;
            buf[o++] = *t++;
            continue;
        }
        const char *e = strchr(t, '}');
        size_t nl = (size_t)(e - t - 1);
        int64_t v = -1;
        for (int i = 0; i < m->nvars && v < 0; i++)
            if (m->var_len[i] == nl && !strncmp(m->var_name[i], t + 1, nl))
                v = m->var_value[i];
        for (int i = 0; i < m->nstack && v < 0; i++)
            if (m->stack_len[i] == nl && !strncmp(m->stack_name[i], t + 1, nl))
                v = stack_values[i];
        if (v < 0)
            return -1;
        int w = snprintf(buf + o, cap - o, "%" PRId64, v);
        if (w < 0 || (size_t)w >= cap - o)
            return -1;
        o += (size_t)w;
        t = e + 1;
    }
    buf[o] = 0;
    return 0;
}

int64_t rcp_map_row(const rcp_rowmap *maps, int n, int64_t r)
{
    for (int i = n - 1; i >= 0; i--) {
        const rcp_rowmap *m = &maps[i];
        switch (m->kind) {
        case 0:
            r += m->offset;
            break;
        case 1: {
            /* Megatron's fused QKV rows: per group, per_group q heads, then one k, one v. */
            int64_t span = m->part == 0 ? m->per_group * m->head_dim : m->head_dim;
            int64_t g = r / span, w = r % span;
            int64_t at = m->part == 0 ? 0 : m->part == 1 ? m->per_group : m->per_group + 1;
            r = g * (m->per_group + 2) * m->head_dim + at * m->head_dim + w;
            break;
        }
        case 4: {
            /* q | k | v (all query heads, then the groups' k, then their v) from Megatron's fused rows. */
            int64_t nq = m->groups * m->per_group * m->head_dim, nk = m->groups * m->head_dim, part, g, w;
            if (r < nq) {
                part = 0;
                g = r / (m->per_group * m->head_dim);
                w = r % (m->per_group * m->head_dim);
            } else {
                part = r < nq + nk ? m->per_group : m->per_group + 1;
                r -= r < nq + nk ? nq : nq + nk;
                g = r / m->head_dim;
                w = r % m->head_dim;
            }
            r = g * (m->per_group + 2) * m->head_dim + part * m->head_dim + w;
            break;
        }
        case 2: {
            /* Hugging Face row h*hd + j*hd/2 + i holds the interleaved row h*hd + 2i + j. */
            int64_t h = r / m->hd, o = r % m->hd, half = m->hd / 2;
            r = h * m->hd + 2 * (o % half) + o / half;
            break;
        }
        case 3: {
            int64_t h = r / m->hd, o = r % m->hd, half = m->hd / 2;
            r = h * m->hd + (o % 2) * half + o / 2;
            break;
        }
        }
    }
    return r;
}
