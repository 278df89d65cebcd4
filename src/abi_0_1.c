/* The calls whose options grew a size field in 0.2 (dcp.h, options), as
 * programs linked against 0.1 call them: each symbol@DCP_0.1 below takes
 * 0.1's layout (no size), copies it into the sized struct and calls the
 * default version (symbol@@DCP_0.2, src/libdcp.map). Kept in one file so
 * that the old layouts live in one place and nothing else knows them; a
 * program compiled now never binds to these. */
#include <string.h>

#include "dcp_gplan.h"
#include "dcp_write.h"

/* ---------------------------------------------------------------- 0.1's layouts */

typedef struct open_options_0_1 {
    unsigned flags;
    const char *catalog;
} open_options_0_1;

typedef struct ckpt_options_0_1 {
    unsigned flags;                /* 0.1's DCP_CKPT_NO_SYNC (1u << 0), DCP_CKPT_NO_CRC (1u << 1) */
    const char *checkpoint_id;
} ckpt_options_0_1;

typedef struct convert_options_0_1 {
    dcp_format from, to;
    const char *keys;
    uint64_t max_shard_size;
    unsigned flags;                /* DCP_WRITE_*: the same values then and now */
    dcp_progress_fn progress;
    void *progress_ctx;
    dcp_skip_fn skipped;
    void *skipped_ctx;
} convert_options_0_1;

typedef struct synth_options_0_1 {
    uint64_t nkeys;
    int ndim;
    int64_t shape[8];
    dcp_dtype dtype;
    int ranks;
    dcp_shard shard;
    uint64_t seed;
    int chunks_per_key;
    uint64_t bytes_items;
    int crc;
    dcp_progress_fn progress;
    void *progress_ctx;
} synth_options_0_1;

typedef struct gplan_opts_0_1 {
    uint64_t unit_max;
    int no_bcast;
    const int *node;
    int shm;
    int bcast_local;
} gplan_opts_0_1;

/* ---------------------------------------------------------------- the 0.1 calls */

int dcpi_open_ex_0_1(const char *path, const open_options_0_1 *old, dcp_checkpoint **out, dcp_error *err);
int dcpi_ckpt_create_0_1(const char *dir, const ckpt_options_0_1 *old, dcp_ckpt_writer **out, dcp_error *err);
int dcpi_convert_files_0_1(const char *src, const char *dst, const convert_options_0_1 *old, dcp_error *err);
int dcpi_synth_checkpoint_0_1(const char *dir, const synth_options_0_1 *old, dcp_error *err);
int dcpi_gplan_build_0_1(dcp_checkpoint *ck, const dcp_greqs *reqs, int nranks, int me, const gplan_opts_0_1 *old,
                         dcp_gplan *g, dcp_error *err);

int dcpi_open_ex_0_1(const char *path, const open_options_0_1 *old, dcp_checkpoint **out, dcp_error *err)
{
    dcp_open_options o = DCP_OPEN_OPTIONS_INIT;
    if (old) {
        o.flags = old->flags & ~(unsigned)DCP_OPEN_RANK;   /* (0.1 had no rank field to go with it) */
        o.catalog = old->catalog;
    }
    return dcp_open_ex(path, &o, out, err);
}

int dcpi_ckpt_create_0_1(const char *dir, const ckpt_options_0_1 *old, dcp_ckpt_writer **out, dcp_error *err)
{
    dcp_ckpt_options o = DCP_CKPT_OPTIONS_INIT;
    if (old) {
        /* 0.1's own flag family: bit 0 was NO_SYNC (now DCP_WRITE_NESTED's bit). */
        o.flags = ((old->flags & (1u << 0)) ? DCP_WRITE_NO_SYNC : 0) |
                  ((old->flags & (1u << 1)) ? DCP_WRITE_NO_CRC : 0);
        o.checkpoint_id = old->checkpoint_id;
    }
    return dcp_ckpt_create(dir, &o, out, err);
}

int dcpi_convert_files_0_1(const char *src, const char *dst, const convert_options_0_1 *old, dcp_error *err)
{
    dcp_convert_options o = DCP_CONVERT_OPTIONS_INIT;
    if (old) {
        o.from = old->from;
        o.to = old->to;
        o.keys = old->keys;
        o.max_shard_size = old->max_shard_size;
        o.flags = old->flags;
        o.progress = old->progress;
        o.progress_ctx = old->progress_ctx;
        o.skipped = old->skipped;
        o.skipped_ctx = old->skipped_ctx;
    }
    return dcp_convert_files(src, dst, &o, err);
}

int dcpi_synth_checkpoint_0_1(const char *dir, const synth_options_0_1 *old, dcp_error *err)
{
    if (!old)
        return dcp_synth_checkpoint(dir, NULL, err);
    dcp_synth_options o = DCP_SYNTH_OPTIONS_INIT;
    o.nkeys = old->nkeys;
    o.ndim = old->ndim;
    memcpy(o.shape, old->shape, sizeof o.shape);
    o.dtype = old->dtype;
    o.ranks = old->ranks;
    o.shard = old->shard;
    o.seed = old->seed;
    o.chunks_per_key = old->chunks_per_key;
    o.bytes_items = old->bytes_items;
    o.crc = old->crc;
    o.progress = old->progress;
    o.progress_ctx = old->progress_ctx;
    return dcp_synth_checkpoint(dir, &o, err);
}

int dcpi_gplan_build_0_1(dcp_checkpoint *ck, const dcp_greqs *reqs, int nranks, int me, const gplan_opts_0_1 *old,
                         dcp_gplan *g, dcp_error *err)
{
    if (!old)
        return dcp_gplan_build(ck, reqs, nranks, me, NULL, g, err);
    dcp_gplan_opts o = DCP_GPLAN_OPTS_INIT;
    o.unit_max = old->unit_max;
    o.no_bcast = old->no_bcast;
    o.node = old->node;
    o.shm = old->shm;
    o.bcast_local = old->bcast_local;
    return dcp_gplan_build(ck, reqs, nranks, me, &o, g, err);
}

__asm__(".symver dcpi_open_ex_0_1, dcp_open_ex@DCP_0.1");
__asm__(".symver dcpi_ckpt_create_0_1, dcp_ckpt_create@DCP_0.1");
__asm__(".symver dcpi_convert_files_0_1, dcp_convert_files@DCP_0.1");
__asm__(".symver dcpi_synth_checkpoint_0_1, dcp_synth_checkpoint@DCP_0.1");
__asm__(".symver dcpi_gplan_build_0_1, dcp_gplan_build@DCP_0.1");
