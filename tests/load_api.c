/* libdcpload through its API, on real MPI ranks (run by tests/load-api.sh):
 * irregular and overlapping regions, a key twice on one rank, bytes items, a
 * rank with no regions, tiny staging buffers, point-to-point only; every
 * region compared with the core reader (dcp_plan_execute) of the same box.
 * Then the strict errors: a region outside its tensor, a dtype mismatch, a
 * wrong ndim and an unknown key on one rank fail the call on every rank with
 * the same message, and the next call on the same communicator works.
 *
 * usage: mpiexec -n N load_api FIXTURES_DIR
 */
#include <dlfcn.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <mpi.h>

#include "dcp.h"
#include "dcp_load.h"

static int me, nranks, failures;

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "rank %d: %s:%d: ", me, __FILE__, __LINE__);   \
            fprintf(stderr, __VA_ARGS__);                                  \
            fputc('\n', stderr);                                           \
            failures++;                                                    \
        }                                                                  \
    } while (0)

struct reg {
    const char *key;
    int ndim;
    int64_t off[4], len[4];
};

/* The reference bytes of a region, from the core reader. */
static void *reference(dcp_checkpoint *ck, const struct reg *r, uint64_t *n)
{
    const dcp_entry *e = dcp_find(ck, r->key);
    dcp_error err;
    if (e->kind == DCP_KIND_BYTES) {
        void *buf;
        if (dcp_read_entry(ck, e, &buf, n, &err) < 0) {
            fprintf(stderr, "reference: %s\n", err.msg);
            exit(2);
        }
        return buf;
    }
    dcp_plan p;
    dcp_plan_init(&p);
    if (dcp_plan_region(ck, e, r->off, r->len, &p, &err) < 0) {
        fprintf(stderr, "reference: %s\n", err.msg);
        exit(2);
    }
    void *buf = calloc(1, p.nbytes ? p.nbytes : 1);
    if (dcp_plan_execute(ck, &p, buf, &err) < 0) {
        fprintf(stderr, "reference: %s\n", err.msg);
        exit(2);
    }
    *n = p.nbytes;
    dcp_plan_free(&p);
    return buf;
}

typedef int (*load_fn)(MPI_Comm, dcp_checkpoint *, const dcp_load_region *, size_t, const dcp_load_options *,
                       dcp_load_stats *, dcp_error *);
static load_fn load_call = dcp_load;   /* the default version, as a program compiled now calls it */

/* dcp_load as a program linked against 0.1 calls it (dcp_load@DCP_LOAD_0.1):
 * options without a size, the stats without the device fields. */
typedef struct load_options_0_1 {
    unsigned flags;
    size_t staging_bytes;
    unsigned nstaging;
} load_options_0_1;

static int load_0_1(MPI_Comm comm, dcp_checkpoint *ck, const dcp_load_region *lr, size_t n,
                    const dcp_load_options *o, dcp_load_stats *st, dcp_error *err)
{
    int (*old)(MPI_Comm, dcp_checkpoint *, const dcp_load_region *, size_t, const load_options_0_1 *, void *,
               dcp_error *) = (int (*)(MPI_Comm, dcp_checkpoint *, const dcp_load_region *, size_t,
                                       const load_options_0_1 *, void *, dcp_error *))dlvsym(RTLD_DEFAULT, "dcp_load",
                                                                                           "DCP_LOAD_0.1");
    CHECK(old != NULL, "dcp_load@DCP_LOAD_0.1 is not exported");
    load_options_0_1 oo = {.flags = o->flags, .staging_bytes = o->staging_bytes, .nstaging = o->nstaging};
    memset(st, 0, sizeof *st);
    return old(comm, ck, lr, n, &oo, st, err);
}

/* Load regs (this rank's) with opts; compare each with the reference. */
static void load_and_compare(dcp_checkpoint *ck, const struct reg *regs, size_t n,
                             const dcp_load_options *o, const char *what)
{
    dcp_load_region *lr = calloc(n + 1, sizeof *lr);
    void **want = calloc(n + 1, sizeof *want);
    uint64_t *size = calloc(n + 1, sizeof *size);
    for (size_t i = 0; i < n; i++) {
        const dcp_entry *e = dcp_find(ck, regs[i].key);
        want[i] = reference(ck, &regs[i], &size[i]);
        lr[i].key = regs[i].key;
        lr[i].dtype = e->kind == DCP_KIND_BYTES ? DCP_UINT8 : e->dtype;
        lr[i].ndim = regs[i].ndim;
        lr[i].offsets = regs[i].off;
        lr[i].lengths = regs[i].len;
        lr[i].dest = malloc(size[i] ? size[i] : 1);
        memset(lr[i].dest, 0x5A, size[i]);
        lr[i].mem = DCP_LOAD_HOST;
    }
    dcp_load_stats st;
    dcp_error err;
    int rc = load_call(MPI_COMM_WORLD, ck, lr, n, o, &st, &err);
    CHECK(rc == 0, "%s: dcp_load failed: %s", what, err.msg);
    for (size_t i = 0; rc == 0 && i < n; i++)
        CHECK(!memcmp(lr[i].dest, want[i], size[i]), "%s: region %zu (%s) differs from the reference", what, i,
              regs[i].key);
    /* the statistics add up */
    uint64_t v[3] = {st.bytes_sent, st.bytes_received, st.bytes_read}, sum[3];
    MPI_Allreduce(v, sum, 3, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    CHECK(sum[0] == sum[1], "%s: sent %" PRIu64 " != received %" PRIu64, what, sum[0], sum[1]);
    if (!(o && (o->flags & DCP_LOAD_INDEPENDENT)))
        CHECK(sum[2] == st.bytes_unique, "%s: read %" PRIu64 " != unique %" PRIu64, what, sum[2],
              st.bytes_unique);
    for (size_t i = 0; i < n; i++) {
        free(lr[i].dest);
        free(want[i]);
    }
    free(lr);
    free(want);
    free(size);
}

/* dcp_load with opts must fail on every rank with the same message: exactly
 * want when exact, else containing it. */
static void expect_error_opts(dcp_checkpoint *ck, const dcp_load_region *lr, size_t n, const dcp_load_options *o,
                              const char *want, int exact, const char *what)
{
    dcp_error err;
    memset(&err, 0, sizeof err);
    int rc = dcp_load(MPI_COMM_WORLD, ck, lr, n, o, NULL, &err);
    CHECK(rc == -1, "%s: dcp_load succeeded", what);
    if (exact)
        CHECK(!strcmp(err.msg, want), "%s: message '%s', expected '%s'", what, err.msg, want);
    else
        CHECK(strstr(err.msg, want) != NULL, "%s: message '%s' lacks '%s'", what, err.msg, want);
    char first[DCP_ERRMSG_MAX];
    memcpy(first, err.msg, sizeof first);
    MPI_Bcast(first, sizeof first, MPI_CHAR, 0, MPI_COMM_WORLD);
    CHECK(!strcmp(first, err.msg), "%s: rank 0 says '%s', this rank '%s'", what, first, err.msg);
}

static void expect_collective_error(dcp_checkpoint *ck, const dcp_load_region *lr, size_t n, const char *want,
                                    const char *what)
{
    expect_error_opts(ck, lr, n, NULL, want, 0, what);
}

/* "rank R: " when there are several ranks */
static const char *prefix(int rank)
{
    static char buf[32];
    if (nranks > 1)
        snprintf(buf, sizeof buf, "rank %d: ", rank);
    else
        buf[0] = '\0';
    return buf;
}

int main(int argc, char **argv)
{
    int provided;
    int single = getenv("LOAD_API_THREAD_SINGLE") != NULL;
    MPI_Init_thread(&argc, &argv, single ? MPI_THREAD_SINGLE : MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    if (argc != 2) {
        fprintf(stderr, "usage: load_api FIXTURES_DIR\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    char path[4096];
    dcp_checkpoint *ck;
    dcp_error err;
    snprintf(path, sizeof path, "%s/02_rowwise_4ranks/ckpt", argv[1]);
    if (dcp_load_open(MPI_COMM_WORLD, path, 0, &ck, &err) < 0) {
        fprintf(stderr, "rank %d: %s\n", me, err.msg);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }

    /* overlapping row bands across ranks, a column band, the same key twice,
     * and the last rank asks for nothing */
    int64_t r0 = (int64_t)me * 150;
    struct reg regs[] = {
        {"model.embed_tokens.weight", 2, {r0, 0}, {300, 257}},
        {"model.lm_head.weight", 2, {0, (int64_t)me * 40}, {999, 60}},
        {"model.embed_tokens.weight", 2, {r0 + 10, 5}, {7, 250}},
        {"model.tiny", 2, {1, 1}, {3, 2}},
    };
    size_t nregs = me == nranks - 1 && nranks > 1 ? 0 : sizeof regs / sizeof regs[0];
    load_and_compare(ck, regs, nregs, NULL, "overlapping, default");
    dcp_load_options small = {.size = sizeof(dcp_load_options), .staging_bytes = 4096, .nstaging = 2};
    load_and_compare(ck, regs, nregs, &small, "overlapping, 4 KiB staging");
    dcp_load_options p2p = {.size = sizeof(dcp_load_options), .flags = DCP_LOAD_NO_BCAST, .staging_bytes = 10000,
                             .nstaging = 1};
    load_and_compare(ck, regs, nregs, &p2p, "overlapping, p2p, one buffer");
    dcp_load_options bcast = {.size = sizeof(dcp_load_options), .flags = DCP_LOAD_BCAST_LOCAL, .staging_bytes = 8192,
                               .nstaging = 2};
    load_and_compare(ck, regs, nregs, &bcast, "overlapping, messages and broadcasts");
    dcp_load_options shm1 = {.size = sizeof(dcp_load_options), .flags = DCP_LOAD_SHM, .staging_bytes = 10000,
                              .nstaging = 1};
    load_and_compare(ck, regs, nregs, &shm1, "overlapping, shared memory, one buffer");
    dcp_load_options indep = {.size = sizeof(dcp_load_options), .flags = DCP_LOAD_INDEPENDENT};
    load_and_compare(ck, regs, nregs, &indep, "overlapping, independent");
    /* a program linked against 0.1: its options (no size) read at their old offsets */
    if (dlvsym(RTLD_DEFAULT, "dcp_load", "DCP_LOAD_0.2")) {   /* a shared libdcpload: versions exist */
        load_call = load_0_1;
        load_and_compare(ck, regs, nregs, &p2p, "overlapping, p2p, one buffer, 0.1's layout");
        load_and_compare(ck, regs, nregs, &small, "overlapping, 4 KiB staging, 0.1's layout");
        load_call = dcp_load;
    }
    /* sizes outside the rules (dcp.h, options) fail on every rank, agreed */
    dcp_load_options unsized = {.staging_bytes = 4096};
    expect_error_opts(ck, NULL, 0, &unsized, "dcp_load: options size 0 is below", 0, "no size");
    expect_error_opts(ck, NULL, 0, me == nranks - 1 ? &unsized : NULL, "dcp_load: options size 0 is below", 0,
                      "no size on one rank");

    /* the strict errors; afterwards the communicator is still usable */
    static float sink[8];
    int64_t zero[2] = {0, 0}, one[2] = {1, 1}, big[2] = {2000, 1};
    dcp_load_region ok = {"model.tiny", DCP_FLOAT32, 2, zero, one, sink, DCP_LOAD_HOST};
    dcp_load_region bad = ok;
    int culprit = nranks - 1;
    bad.lengths = big;
    expect_collective_error(ck, me == culprit ? &bad : &ok, 1, "lies outside the tensor", "outside");
    bad = ok;
    bad.dtype = DCP_FLOAT16;
    expect_collective_error(ck, me == culprit ? &bad : &ok, 1, "dtype mismatch", "dtype");
    bad = ok;
    bad.ndim = 1;
    expect_collective_error(ck, me == culprit ? &bad : &ok, 1, "the region has 1 dimensions", "ndim");
    bad = ok;
    bad.key = "no.such.key";
    expect_collective_error(ck, me == 0 ? &bad : &ok, 1, "no.such.key: no such key", "unknown key");
    char want[sizeof path + 256];
    bad = ok;
    bad.dest = NULL;
    snprintf(want, sizeof want, "%s%s: model.tiny: the region has no destination buffer", prefix(culprit), path);
    expect_error_opts(ck, me == culprit ? &bad : &ok, 1, NULL, want, 1, "no destination");

    /* options and checkpoint must be the same on every rank: one rank that
     * differs fails every rank with one message naming it (no hang) */
    if (nranks > 1) {
        dcp_load_options mine = DCP_LOAD_OPTIONS_INIT;
        dcp_load_options other = {.size = sizeof(dcp_load_options), .staging_bytes = 8192};
        snprintf(want, sizeof want,
                 "dcp_load: rank %d passes other options than rank 0 (flags 0x0, 4 staging buffers of 8192 bytes;"
                 " rank 0: flags 0x0, 4 of 16777216)", culprit);
        expect_error_opts(ck, &ok, 1, me == culprit ? &other : &mine, want, 1, "other staging size");
        dcp_load_options flags[] = {{.size = sizeof(dcp_load_options), .flags = DCP_LOAD_INDEPENDENT},
                                    {.size = sizeof(dcp_load_options), .flags = DCP_LOAD_SHM},
                                    {.size = sizeof(dcp_load_options), .flags = DCP_LOAD_NO_BCAST},
                                    {.size = sizeof(dcp_load_options), .nstaging = 2}};
        for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
            snprintf(want, sizeof want, "dcp_load: rank %d passes other options than rank 0", culprit);
            expect_error_opts(ck, &ok, 1, me == culprit ? &flags[i] : &mine, want, 0, "other flags");
        }
    }
    load_and_compare(ck, regs, nregs, NULL, "after the option errors");
    load_and_compare(ck, regs, nregs, NULL, "after the errors");
    dcp_close(ck);

    /* bytes items and mixed dtypes (05: float64, float16, a 0-d int64) */
    snprintf(path, sizeof path, "%s/05_mixed_2ranks/ckpt", argv[1]);
    if (dcp_load_open(MPI_COMM_WORLD, path, 0, &ck, &err) < 0) {
        fprintf(stderr, "rank %d: %s\n", me, err.msg);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    struct reg regs5[] = {
        {"config", 0, {0}, {0}},
        {"enc.bias", 1, {(int64_t)me}, {20}},
        {"dec.weight", 2, {3, (int64_t)me}, {20, 30}},
        {"step", 0, {0}, {0}},
        {"optim.state", 0, {0}, {0}},
    };
    load_and_compare(ck, regs5, sizeof regs5 / sizeof regs5[0], NULL, "bytes items, mixed dtypes");
    load_and_compare(ck, regs5, sizeof regs5 / sizeof regs5[0], &small, "bytes items, 4 KiB staging");
    load_and_compare(ck, regs5, sizeof regs5 / sizeof regs5[0], &p2p, "bytes items, p2p");
    dcp_close(ck);

    /* one rank opened another checkpoint with the same keys (load-api.sh
     * makes a copy of 02 with one data file a byte longer): every rank
     * fails, naming it */
    const char *other = getenv("LOAD_API_OTHER_CKPT");
    if (nranks > 1 && other) {
        int culprit = nranks - 1;
        if (me == culprit)
            snprintf(path, sizeof path, "%s", other);
        else
            snprintf(path, sizeof path, "%s/02_rowwise_4ranks/ckpt", argv[1]);
        if (dcp_load_open(MPI_COMM_WORLD, path, 0, &ck, &err) < 0) {
            fprintf(stderr, "rank %d: %s\n", me, err.msg);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        static float sink2[8];
        int64_t z[2] = {0, 0}, o1[2] = {1, 1};
        dcp_load_region tiny = {"model.tiny", DCP_FLOAT32, 2, z, o1, sink2, DCP_LOAD_HOST};
        /* the message says how they differ: the data file of other sizes */
        char want[2 * PATH_MAX + 256], mine[PATH_MAX + 32];
        struct stat sb;
        snprintf(mine, sizeof mine, "%s/02_rowwise_4ranks/ckpt/__3_1.distcp", argv[1]);
        long long size = stat(mine, &sb) == 0 ? (long long)sb.st_size : -1;
        snprintf(want, sizeof want,
                 "dcp_load: rank %d passes another checkpoint than rank 0: %s (rank 0: %s/02_rowwise_4ranks/ckpt): "
                 "__3_1.distcp: %lld bytes on rank %d, %lld on rank 0",
                 culprit, other, argv[1], size + 1, culprit, size);
        expect_error_opts(ck, &tiny, 1, NULL, want, 1, "another checkpoint");
        dcp_close(ck);
    }

    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (me == 0)
        printf("load_api: %d ranks%s, %d failures\n", nranks, single ? " (MPI_THREAD_SINGLE)" : "", total);
    MPI_Finalize();
    return total ? 1 : 0;
}
