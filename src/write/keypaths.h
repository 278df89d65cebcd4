/* Each key's path in the nesting it was flattened from, for the DCP
 * writer's planner_data (dcp_ckpt_set_path): convert keeps them from its
 * source (keypaths.c). Not installed. */
#ifndef DCPW_KEYPATHS_H
#define DCPW_KEYPATHS_H

#include <stdbool.h>

#include "dcp_write.h"
#include "internal.h"

typedef struct dcpw_keypaths {
    dcpi_arena arena;
    dcpi_strmap map;          /* key -> index in parts[], n[] */
    dcp_path_part **parts;
    size_t *n;
    size_t count, cap;
} dcpw_keypaths;

void dcpw_kp_init(dcpw_keypaths *kp);
void dcpw_kp_free(dcpw_keypaths *kp);
/* Copies key and parts. 0, or -1 on out of memory. */
int dcpw_kp_add(dcpw_keypaths *kp, const char *key, size_t kl, const dcp_path_part *parts, size_t n);
/* key's path (*n parts), or NULL when it has none (kp may be NULL). */
const dcp_path_part *dcpw_kp_get(const dcpw_keypaths *kp, const char *key, size_t *n);
/* Whether parts joined with '.' (ints in decimal) give key back, as a path
 * must for planner_data (torch flattens a path to its key that way). */
bool dcpw_path_spells(const char *key, size_t kl, const dcp_path_part *parts, size_t n);
/* A DCP folder's planner_data (flattened key -> path tuple) into kp. Best
 * effort: a folder without one, or with one that is not str/int tuples,
 * leaves keys without paths (flat keys in the output). -1 only on out of
 * memory. */
int dcpw_kp_from_metadata(const char *dir, dcpw_keypaths *kp, dcp_error *err);
/* dcp_write_torch_save whose DCP_WRITE_NESTED nests each key as paths says
 * (dicts and lists, as torch's dcp_to_torch_save rebuilds them), and on its
 * dots where paths has none (paths may be NULL: every key); values (may be
 * NULL), by item: a bytes item written as that parsed value, which
 * pw_value must write whole, instead of as bytes. */
struct pk_node;
int dcpw_write_torch_save(const char *path, const char *archive_name, const dcp_item *items, size_t n,
                          unsigned flags, const dcpw_keypaths *paths, const struct pk_node *const *values,
                          const dcp_source *src, dcp_progress_fn progress, void *pctx, dcp_error *err);

#endif
