/* Export recipes (dcp convert --to hf): a recipe is data, a JSON file per
 * model family (recipes/NAME.json, installed under $(pkgdatadir)/recipes) that
 * says how a training framework's keys become Hugging Face's. recipe.c
 * parses and checks one (every field of a hostile file checked before use)
 * and matches source keys against its rules; hf_export.c plans and writes
 * the output. The format is described in dcp-recipe(5). */
#ifndef DCP_WRITE_RECIPE_H
#define DCP_WRITE_RECIPE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "dcp.h"

#define RCP_MAX_VARS 8          /* placeholders in one pattern */
#define RCP_MAX_OUT 8           /* output names of one rule */
#define RCP_MAX_STACK 4         /* leading dimensions one source tensor may be unstacked along */

typedef enum rcp_op {
    RCP_RENAME = 0,
    RCP_SPLIT,                  /* n equal parts of dim 0 (SwiGLU linear_fc1 = cat(gate, up)) */
    RCP_SPLIT_QKV,              /* Megatron's fused QKV: [groups, heads/groups + 2, head_dim, ...] */
    RCP_ROPE_PERMUTE,           /* rows of each head reordered between rotary layouts */
    RCP_MERGE_QKV               /* Megatron's fused QKV regrouped into one q | k | v tensor (GPT-2's c_attn) */
} rcp_op;

/* Which way a rotary permutation goes: interleaved pairs (Meta, torchtitan)
 * to Hugging Face's two halves, or back. */
typedef enum rcp_rope { RCP_ROPE_NONE = 0, RCP_ROPE_TO_HF, RCP_ROPE_FROM_HF } rcp_rope;

/* A parameter: a literal, or the first of some config.json keys present. */
typedef struct rcp_param {
    int64_t value;              /* > 0: a literal */
    const char *names[4];       /* config keys tried in order */
    int nnames;
} rcp_param;

typedef struct rcp_rule {
    const char *from;           /* pattern: text and {X} placeholders (decimal numbers) */
    const char *to[RCP_MAX_OUT];    /* name templates */
    int nto;
    rcp_op op;
    rcp_rope rope;              /* ROPE_PERMUTE: its direction; SPLIT_QKV: applied to q and k */
    rcp_param heads, kv_heads, head_dim;
    const char *stacked[RCP_MAX_STACK];   /* placeholders the source's leading dims enumerate */
    int nstacked;
    int transpose;              /* outputs are the transposes of the (row-mapped) 2-D source */
} rcp_rule;

typedef struct rcp_recipe {
    json_t *doc;                /* owns every string below */
    const char *name, *path;
    const char *description;
    const char *prefixes[8];    /* stripped from source keys before matching */
    int nprefixes;
    const char *unstack[RCP_MAX_STACK];   /* placeholders a layer-stacked key may leave out */
    int nunstack;
    const char *ignore[64];     /* fnmatch patterns of keys left out on purpose */
    int nignore;
    rcp_rule *rules;
    size_t nrules;
    json_t *config;             /* the config.json template, or NULL */
} rcp_recipe;

/* Load a recipe: `name` with a '/' or ending in ".json" is a file; else
 * NAME.json in the ':'-separated folders of `dirs`, then in `fallback`.
 * The error names the file and what is wrong, or lists the recipes found. */
int rcp_load(const char *name, const char *dirs, const char *fallback, rcp_recipe **out, dcp_error *err);
void rcp_free(rcp_recipe *r);

/* A source key matched by a rule. vars: the numbers captured, by name;
 * stack: placeholders the source tensor's leading dims stand for (in order). */
typedef struct rcp_match {
    const rcp_rule *rule;
    int nvars;
    const char *var_name[RCP_MAX_VARS];
    size_t var_len[RCP_MAX_VARS];
    int64_t var_value[RCP_MAX_VARS];
    int nstack;
    const char *stack_name[RCP_MAX_STACK];
    size_t stack_len[RCP_MAX_STACK];
} rcp_match;

/* 1 when a rule matches key (after a prefix of the recipe's is stripped),
 * 0 when none does. */
int rcp_match_key(const rcp_recipe *r, const char *key, rcp_match *m);
/* 1 when the key is one the recipe leaves out on purpose. */
int rcp_ignored(const rcp_recipe *r, const char *key);
/* Expand template t with m's values (and extra stacked values, nstack of
 * them, in m->stack_name order) into buf. -1 when it does not fit or names
 * a placeholder the match lacks. */
int rcp_expand(const char *t, const rcp_match *m, const int64_t *stack_values, char *buf, size_t cap);

/* Dim-0 row maps: output row r of a derived tensor comes from source row
 * rcp_map_row(...). */
typedef struct rcp_rowmap {
    int kind;                   /* 0: r + offset; 1: qkv part; 2: rope to_hf; 3: rope from_hf; 4: qkv merged */
    int64_t offset;             /* kind 0 */
    int64_t part, groups, per_group, head_dim;   /* kind 1: part 0 q, 1 k, 2 v; kind 4: all three */
    int64_t hd;                 /* kinds 2, 3: rows per head */
} rcp_rowmap;

/* Apply maps[n-1], ..., maps[0] (the last one is nearest the output). */
int64_t rcp_map_row(const rcp_rowmap *maps, int n, int64_t r);

#endif
