/* dcpload: load a checkpoint's tensors collectively on N MPI ranks.
 *
 *   mpiexec -n N dcpload CKPT [--keys PATTERN] [--layout rows|cols|blocks|replicate]
 *                             [--device host|cuda] [--json]
 *
 * Every rank allocates its share of each selected tensor (by the layout),
 * loads it with dcp_load, and reports an XXH3-64 of the loaded bytes; rank 0
 * prints every rank's lines in rank order. CKPT is a checkpoint folder or one
 * torch.save or safetensors file. Options for comparisons and tests are
 * documented in dcpload(1): --strategy, --staging, --buffers, --no-bcast,
 * --bcast-local, --shm, --host-delivery, --device-delivery, --direct, --touch,
 * --no-digests, --map, --megatron-fold (Megatron-Core's reformulated tensors in their original
 * shapes: DCP_OPEN_MEGATRON_FOLD). Test hooks (environment): DCPLOAD_TEST_BAD_KEY_RANK=R makes rank
 * R also ask for a key that does not exist; DCPLOAD_TEST_NO_MEMORY_RANK=R makes rank R
 * fail to allocate its first buffer; DCPLOAD_TEST_NO_DIGEST_MEMORY_RANK=R makes rank R fail to
 * allocate its digests; DCPLOAD_TEST_PRINT_PIECE=N sends the output to
 * rank 0 in pieces of N bytes; DCPLOAD_TEST_READ_DELAY_MS=N (libdcpload, exec.c) sleeps
 * N ms before each unit a rank reads; DCPLOAD_FAKE_DEVICE=1 (libdcpload's test-only fake
 * device layer, src/load/device_fake.c): --device cuda buffers are host memory standing in
 * for device memory.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <mpi.h>
#include <xxhash.h>
#ifdef HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "dcp.h"
#include "dcp_load.h"
#include "dcp_write.h"   /* dcp_parse_size */

/* A host destination: large ones 2 MiB-aligned in transparent huge pages.
 * Peers on the node copy a replicated unit straight out of its reader's
 * destination (MPICH over UCX: process_vm_readv), which pins the source
 * pages one by one; with huge pages 4 ranks loaded a replicated 2 GiB
 * checkpoint in 0.66x the time, as does a raw pread into such memory. */
#define HUGE_MIN ((size_t)2 << 20)
static void *host_alloc(size_t n)
{
    void *p = NULL;
    if (n < HUGE_MIN)
        return malloc(n);
    if (posix_memalign(&p, HUGE_MIN, n) != 0)
        return NULL;
    (void)madvise(p, n, MADV_HUGEPAGE);   /* advice: without THP the memory is only slower */
    return p;
}

/* Where in its allocation a large host destination begins, for --direct:
 * the offset below DCP_DIRECT_ALIGN at which most of its bytes agree with
 * their place in the shard files modulo the block size, so that their units
 * are read with O_DIRECT straight in (dcp_gunit_read_direct_at) rather than
 * into staging and copied. Any byte: a record's data lies wherever the
 * records before it in its file ended (PyTorch appends one torch.save
 * archive after another), and dcpload's buffers are only hashed (libdcp
 * places bytes with memcpy). A program's own tensors land where its
 * allocator put them. 0 when the region cannot be planned (dcp_load
 * reports why). */
static size_t direct_shift(dcp_checkpoint *ck, const dcp_entry *e, const int64_t *off, const int64_t *len)
{
    uint64_t *weight = calloc(DCP_DIRECT_ALIGN, sizeof *weight);
    size_t best = 0;
    dcp_plan p;
    dcp_error err;
    dcp_plan_init(&p);
    if (weight && dcp_plan_region(ck, e, off, len, &p, &err) == 0)
        for (size_t i = 0; i < p.nops; i++) {
            const dcp_op *op = &p.ops[i];
            size_t s = (size_t)((op->src_offset - op->dest_offset) % DCP_DIRECT_ALIGN);
            if (op->flags & DCP_OP_DECODED || op->dest_stride != op->elem_size)
                continue;
            weight[s] += op->length;
            if (weight[s] > weight[best])
                best = s;
        }
    dcp_plan_free(&p);
    free(weight);
    return best;
}

enum layout { L_ROWS, L_COLS, L_BLOCKS, L_REPLICATE };

struct opts {
    const char *path;
    const char *keys;
    enum layout layout;
    int cuda, json, independent, no_bcast, shm, bcast_local, host_delivery, device_delivery, direct;
    int touch;               /* fill large destinations before the clock (--touch) */
    int no_digests;          /* --json without the per-tensor lines (--no-digests) */
    int map;                 /* --map: DCP_LOAD_MAP */
    int fold;                /* --megatron-fold: DCP_OPEN_MEGATRON_FOLD */
    int gpu;                 /* --device cuda on a real GPU (not libdcpload's fake device) */
    size_t staging;
    unsigned buffers;
};

static void usage(FILE *f)
{
    fprintf(f, "usage: mpiexec -n N dcpload CKPT [--keys PATTERN] [--layout rows|cols|blocks|replicate]\n"
               "                                [--device host|cuda] [--json]\n"
               "       [--strategy collective|independent] [--staging BYTES] [--no-bcast] [--bcast-local]\n"
               "       [--shm] [--host-delivery | --device-delivery] [--buffers N] [--direct]\n"
               "       [--touch] [--no-digests] [--map] [--megatron-fold]\n");
}

/* numpy.array_split: the first n mod parts parts get one more. */
static void split(int64_t n, int parts, int i, int64_t *off, int64_t *len)
{
    int64_t q = n / parts, rem = n % parts;
    *len = q + (i < rem);
    *off = (int64_t)i * q + (i < rem ? i : rem);
}

/* P: the largest divisor of n not above sqrt(n). */
static int grid_rows(int n)
{
    int p = 1;
    for (int d = 1; (int64_t)d * d <= n; d++)
        if (n % d == 0)
            p = d;
    return p;
}

static void share(const dcp_entry *e, enum layout l, int rank, int nranks, int64_t *off, int64_t *len)
{
    for (int d = 0; d < e->ndim; d++) {
        off[d] = 0;
        len[d] = e->shape[d];
    }
    if (e->ndim == 0 || l == L_REPLICATE)
        return;
    int last = e->ndim - 1;
    if (l == L_ROWS || (l == L_BLOCKS && e->ndim == 1)) {
        split(e->shape[0], nranks, rank, &off[0], &len[0]);
    } else if (l == L_COLS) {
        split(e->shape[last], nranks, rank, &off[last], &len[last]);
    } else {
        int p = grid_rows(nranks), q = nranks / p;
        split(e->shape[0], p, rank / q, &off[0], &len[0]);
        split(e->shape[last], q, rank % q, &off[last], &len[last]);
    }
}

/* ------------------------------------------------------------ output */

struct out {
    char *p;
    size_t len, cap;
};

static void outf(struct out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void outf(struct out *o, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(o->p ? o->p + o->len : NULL, o->p ? o->cap - o->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0)
            return;
        if (o->p && o->len + (size_t)n < o->cap) {
            o->len += (size_t)n;
            return;
        }
        size_t cap = o->cap ? o->cap : 4096;
        while (cap <= o->len + (size_t)n)
            cap *= 2;
        char *q = realloc(o->p, cap);
        if (!q)
            return;
        o->p = q;
        o->cap = cap;
    }
}

static void out_json_string(struct out *o, const char *s)
{
    char *q = dcp_key_json(s);   /* keys that are not UTF-8 too (dcp.h) */
    outf(o, "%s", q ? q : "\"(out of memory)\"");
    free(q);
}

static void out_dims(struct out *o, const int64_t *v, int n)
{
    outf(o, "[");
    for (int i = 0; i < n; i++)
        outf(o, "%s%" PRId64, i ? "," : "", v[i]);
    outf(o, "]");
}

/* Rank 0 prints every rank's text, in rank order: received from one rank
 * at a time in pieces (MPI counts are int), so no rank's text nor their
 * total has to fit in an int or in rank 0's memory at once.
 * DCPLOAD_TEST_PRINT_PIECE=N (bytes) makes the pieces small for tests. */
static void print_all(MPI_Comm comm, const struct out *o, FILE *f)
{
    int me, n;
    MPI_Comm_rank(comm, &me);
    MPI_Comm_size(comm, &n);
    /* rank 0 chooses the piece size by the buffer it could get */
    static char small[4096];
    char *buf = NULL;
    long long piece = 1ll << 26;
    const char *hook = getenv("DCPLOAD_TEST_PRINT_PIECE");
    if (hook && atoll(hook) > 0 && atoll(hook) < piece)
        piece = atoll(hook);
    if (me == 0 && n > 1 && !(buf = malloc((size_t)piece)))
        piece = sizeof small;
    MPI_Bcast(&piece, 1, MPI_LONG_LONG, 0, comm);
    if (me != 0) {
        long long len = o->p ? (long long)o->len : 0;
        MPI_Send(&len, 1, MPI_LONG_LONG, 0, 0, comm);
        for (long long done = 0; done < len;) {
            int k = (int)(len - done < piece ? len - done : piece);
            MPI_Send(o->p + done, k, MPI_CHAR, 0, 1, comm);
            done += k;
        }
        return;
    }
    if (o->p)
        fwrite(o->p, 1, o->len, f);
    if (!buf)
        buf = small;
    for (int r = 1; r < n; r++) {
        long long len = 0;
        MPI_Recv(&len, 1, MPI_LONG_LONG, r, 0, comm, MPI_STATUS_IGNORE);
        for (long long done = 0; done < len;) {
            int k = (int)(len - done < piece ? len - done : piece);
            MPI_Recv(buf, k, MPI_CHAR, r, 1, comm, MPI_STATUS_IGNORE);
            fwrite(buf, 1, (size_t)k, f);
            done += k;
        }
    }
    if (buf != small)
        free(buf);
    fflush(f);
}

/* ------------------------------------------------------------ main */

/* A usage error: its message (without "dcpload: "; "" for none) and
 * whether the usage follows it. */
struct usage_error { char msg[512]; int usage; };

/* The message into *u; 2, parse's status for a usage error. */
__attribute__((format(printf, 3, 4)))
static int bad_args(struct usage_error *u, int usage_too, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(u->msg, sizeof u->msg, fmt, ap);
    va_end(ap);
    u->usage = usage_too;
    return 2;
}

/* 0, 1 for --help (printed by rank 0 only: me), 2 for a usage error (in *u,
 * printed by the caller: once when every rank has the same one) */
static int parse(int argc, char **argv, struct opts *o, int me, struct usage_error *u)
{
    static const struct option lo[] = {
        {"keys", required_argument, 0, 'k'},     {"layout", required_argument, 0, 'l'},
        {"device", required_argument, 0, 'd'},   {"json", no_argument, 0, 'j'},
        {"strategy", required_argument, 0, 's'}, {"staging", required_argument, 0, 'S'},
        {"no-bcast", no_argument, 0, 'B'},       {"shm", no_argument, 0, 'M'},
        {"bcast-local", no_argument, 0, 'L'},    {"host-delivery", no_argument, 0, 'H'},
        {"device-delivery", no_argument, 0, 'D'}, {"direct", no_argument, 0, 'O'},
        {"buffers", required_argument, 0, 'N'},   {"touch", no_argument, 0, 'T'},
        {"no-digests", no_argument, 0, 'G'},      {"map", no_argument, 0, 'P'},
        {"megatron-fold", no_argument, 0, 'F'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    memset(o, 0, sizeof *o);
    memset(u, 0, sizeof *u);
    o->layout = L_ROWS;
    int c;
    opterr = 0;   /* getopt's own messages would come from every rank */
    while ((c = getopt_long(argc, argv, ":k:l:d:jh", lo, NULL)) != -1) {
        switch (c) {
        case 'k': o->keys = optarg; break;
        case 'l':
            if (!strcmp(optarg, "rows")) o->layout = L_ROWS;
            else if (!strcmp(optarg, "cols")) o->layout = L_COLS;
            else if (!strcmp(optarg, "blocks")) o->layout = L_BLOCKS;
            else if (!strcmp(optarg, "replicate")) o->layout = L_REPLICATE;
            else return bad_args(u, 0, "unknown layout '%s' (rows, cols, blocks, replicate)", optarg);
            break;
        case 'd':
            if (!strcmp(optarg, "host")) o->cuda = 0;
            else if (!strcmp(optarg, "cuda")) o->cuda = 1;
            else return bad_args(u, 0, "unknown device '%s' (host, cuda)", optarg);
            break;
        case 'j': o->json = 1; break;
        case 's':
            if (!strcmp(optarg, "collective")) o->independent = 0;
            else if (!strcmp(optarg, "independent")) o->independent = 1;
            else return bad_args(u, 0, "unknown strategy '%s' (collective, independent)", optarg);
            break;
        case 'S': {
            uint64_t v = 0;
            dcp_error err;
            if (dcp_parse_size_ex(optarg, NULL, &v, &err) < 0)
                return bad_args(u, 0, "bad --staging '%s': %s", optarg, err.msg);
            if (v == 0 || v > SIZE_MAX)
                return bad_args(u, 0, "bad --staging '%s' (a size: 65536, 64K, 16MiB, 1G)", optarg);
            o->staging = (size_t)v;
            break;
        }
        case 'N': {
            char *end;
            errno = 0;
            unsigned long v = strtoul(optarg, &end, 10);
            if (errno || end == optarg || *end || v == 0 || v > 64)
                return bad_args(u, 0, "bad --buffers '%s' (1 to 64)", optarg);
            o->buffers = (unsigned)v;
            break;
        }
        case 'B': o->no_bcast = 1; break;
        case 'M': o->shm = 1; break;
        case 'L': o->bcast_local = 1; break;
        case 'H': o->host_delivery = 1; break;
        case 'D': o->device_delivery = 1; break;
        case 'O': o->direct = 1; break;
        case 'T': o->touch = 1; break;
        case 'G': o->no_digests = 1; break;
        case 'P': o->map = 1; break;
        case 'F': o->fold = 1; break;
        case 'h':
            if (me == 0)
                usage(stdout);
            return 1;
        case ':':   /* as getopt says it */
            return bad_args(u, 1, "option '%s' requires an argument", argv[optind - 1]);
        default:
            if (optopt)
                return bad_args(u, 1, "invalid option -- '%c'", optopt);
            return bad_args(u, 1, "unrecognized option '%s'", argv[optind - 1]);
        }
    }
    if (optind == argc)
        return bad_args(u, 1, "no checkpoint named");
    if (optind != argc - 1)
        return bad_args(u, 1, "%d checkpoints named, one is loaded ('%s' is extra)", argc - optind,
                        argv[optind + 1]);
    o->path = argv[optind];
    const char *fake = getenv("DCPLOAD_FAKE_DEVICE");
    o->gpu = o->cuda && !(fake && !strcmp(fake, "1"));
    return 0;
}

struct job {
    dcp_load_region *reg;
    int64_t *dims;
    size_t n;                /* regions with buffers we own */
    size_t nreg;             /* regions passed to dcp_load (n, plus the test hook's) */
    uint64_t *nbytes;
    void **host;             /* the host allocations (dest may begin inside: direct_shift) */
};

/* The destinations; job_free the rest (the output still names regions). */
static void job_free_buffers(struct job *j, int cuda)
{
    for (size_t i = 0; i < j->n; i++) {
#ifdef HAVE_CUDA
        if (cuda) {
            if (j->reg[i].dest)
                cudaFree(j->reg[i].dest);
            j->reg[i].dest = NULL;
            continue;
        }
#else
        (void)cuda;
#endif
        free(j->host[i]);
        j->host[i] = NULL;
        j->reg[i].dest = NULL;
    }
}

static void job_free(struct job *j, int cuda)
{
    if (j->reg)
        job_free_buffers(j, cuda);
    free(j->host);
    free(j->reg);
    free(j->dims);
    free(j->nbytes);
}

/* This rank's regions: its share of every selected tensor. Buffers are
 * allocated unless CUDA is unusable (dcp_load then reports why). */
static int build_job(dcp_checkpoint *ck, const struct opts *o, int me, int nranks, int cuda_ok,
                     struct job *j, dcp_error *err)
{
    /* the test hook: this rank's first buffer cannot be allocated */
    const char *nomem = getenv("DCPLOAD_TEST_NO_MEMORY_RANK");
    int no_memory = nomem && atoi(nomem) == me;
    size_t n = 0, cap = dcp_num_entries(ck) + 1;
    j->reg = calloc(cap, sizeof *j->reg);
    j->dims = calloc(cap * 2 * 64, sizeof *j->dims);
    j->nbytes = calloc(cap, sizeof *j->nbytes);
    j->host = calloc(cap, sizeof *j->host);
    if (!j->reg || !j->dims || !j->nbytes || !j->host) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < dcp_num_entries(ck); i++) {
        const dcp_entry *e;
        if (dcp_get_entry(ck, i, &e, err) < 0)
            return -1;
        if (e->kind != DCP_KIND_TENSOR || !dcp_key_matches(o->keys, e->key) || e->ndim > 64)
            continue;
        dcp_load_region *r = &j->reg[n];
        int64_t *off = j->dims + n * 128, *len = off + 64;
        share(e, o->layout, me, nranks, off, len);
        uint64_t nb = dcp_dtype_size(e->dtype);
        for (int d = 0; d < e->ndim; d++)
            if (len[d] == 0)   /* no element: 0 bytes, whatever the other counts (up to INT64_MAX) */
                nb = 0;
        for (int d = 0; d < e->ndim && nb; d++)
            if (__builtin_mul_overflow(nb, (uint64_t)len[d], &nb) || nb > SIZE_MAX) {
                snprintf(err->msg, sizeof err->msg, "%s: its share on this rank exceeds the address space",
                         e->key);
                return -1;
            }
        r->key = e->key;
        r->dtype = e->dtype;
        r->ndim = e->ndim;
        r->offsets = off;
        r->lengths = len;
        r->mem = o->cuda ? DCP_LOAD_CUDA : DCP_LOAD_HOST;
        j->nbytes[n] = nb;
        j->n = j->nreg = ++n;
        if (!nb)
            continue;
        if (o->gpu) {
#ifdef HAVE_CUDA
            if (cuda_ok && cudaMalloc(&r->dest, (size_t)nb) != cudaSuccess) {
                snprintf(err->msg, sizeof err->msg, "%s: cudaMalloc of %" PRIu64 " bytes failed", e->key, nb);
                return -1;
            }
#else
            (void)cuda_ok;
#endif
        } else if (o->cuda && !cuda_ok) {
            /* the fake device unusable: dcp_load reports why */
        } else {
            size_t shift = o->direct && !o->cuda && nb >= HUGE_MIN ? direct_shift(ck, e, off, len) : 0;
            if (no_memory || nb > SIZE_MAX - shift || !(j->host[n - 1] = host_alloc((size_t)nb + shift))) {
                snprintf(err->msg, sizeof err->msg, "%s: cannot allocate %" PRIu64 " bytes", e->key, nb);
                return -1;
            }
            r->dest = (unsigned char *)j->host[n - 1] + shift;
        }
        if (j->host[n - 1] && (o->touch || nb < HUGE_MIN)) {
            /* A pattern, so that bytes the load leaves unwritten show in the
             * digests. Large destinations stay untouched unless asked, as a
             * program's fresh tensors are: the load's reader threads fault
             * their pages in, in parallel, where one thread filling them here
             * first cost more than the load (0.8-2.7 s for 2 GiB on a VM). */
            memset(r->dest, 0xA5, (size_t)nb);
        }
    }
    if (o->keys && n == 0) {   /* a mistyped pattern must not read as a load of nothing (as dcp ls) */
        snprintf(err->msg, sizeof err->msg, "no tensor matches '%s'", o->keys);
        return -1;
    }
    /* the test hook: this rank also asks for a key that does not exist */
    const char *bad = getenv("DCPLOAD_TEST_BAD_KEY_RANK");
    if (bad && atoi(bad) == me) {
        static const int64_t zero[1] = {0}, one[1] = {1};
        dcp_load_region *r = &j->reg[n];
        r->key = "dcpload.test.no_such_key";
        r->ndim = 1;
        r->offsets = zero;
        r->lengths = one;
        r->mem = DCP_LOAD_HOST;
        static float sink;
        r->dest = &sink;
        j->nreg = n + 1;   /* not owned: never freed or hashed */
    }
    return 0;
}

/* Every rank learns whether any failed and has the same message: the
 * lowest failing rank's, naming it (as dcp_load does). */
static int agree(MPI_Comm comm, int rc, dcp_error *err)
{
    int me, n, mine, first;
    MPI_Comm_rank(comm, &me);
    MPI_Comm_size(comm, &n);
    mine = rc < 0 ? me : n;
    MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm);
    if (first == n)
        return 0;
    char msg[sizeof err->msg];
    if (me == first && n > 1)
        snprintf(msg, sizeof msg, "rank %d: %.*s", me, (int)sizeof msg - 16, err->msg);
    else if (me == first)
        snprintf(msg, sizeof msg, "%s", err->msg);
    MPI_Bcast(msg, (int)sizeof msg, MPI_CHAR, first, comm);
    msg[sizeof msg - 1] = '\0';
    memcpy(err->msg, msg, sizeof msg);
    return -1;
}

/* A failure every rank returned from the same call (dcp_load_open, dcp_load
 * and agree() fail on all ranks at once), said once, by rank 0, when every
 * rank has the same message, as agreed ones are: N ranks printed N identical
 * lines. Ranks whose messages differ each print their own. Collective. */
static void report(MPI_Comm comm, const dcp_error *err)
{
    int me, same, all;
    char first[sizeof err->msg];
    MPI_Comm_rank(comm, &me);
    memcpy(first, err->msg, sizeof first);
    MPI_Bcast(first, (int)sizeof first, MPI_CHAR, 0, comm);
    same = strncmp(first, err->msg, sizeof first) == 0;
    MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_LAND, comm);
    if (me == 0 || !all)
        fprintf(stderr, "dcpload: %s\n", err->msg);
}

/* A usage error (u; NULL on a rank without one) said once, by rank 0, when
 * every rank has the same one (one command line for all: N ranks printed N
 * copies); else each rank with one says its own (mpiexec's MPMD form, A :
 * B, gives ranks different arguments). Collective. */
static void say_usage_error(MPI_Comm comm, const struct usage_error *u)
{
    int me, same, all;
    char first[sizeof u->msg + 1];   /* "" on a rank without an error, "!MSG" with one */
    char mine[sizeof first];
    MPI_Comm_rank(comm, &me);
    memset(mine, 0, sizeof mine);
    if (u) {
        mine[0] = '!';
        memcpy(mine + 1, u->msg, sizeof u->msg);
    }
    memcpy(first, mine, sizeof first);
    MPI_Bcast(first, (int)sizeof first, MPI_CHAR, 0, comm);
    same = u && strcmp(first, mine) == 0;
    MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_LAND, comm);
    if (!u || (all && me != 0))
        return;
    if (u->msg[0])
        fprintf(stderr, "dcpload: %s\n", u->msg);
    if (u->usage)
        usage(stderr);
}

static const char *delivery_name(int d)
{
    return d == DCP_LOAD_DELIVERY_IPC ? "ipc" : d == DCP_LOAD_DELIVERY_FALLBACK ? "fallback" : "host";
}

/* user+system CPU time of this process, all threads */
static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
           (double)ru.ru_stime.tv_usec * 1e-6;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Seconds from this process's exec to now (the dynamic loader's share of a
 * launch: MPI's and CUDA's libraries), from its start time in /proc (clock
 * ticks since boot); -1 where /proc cannot say. */
static double since_exec(void)
{
    char buf[1024];
    FILE *f = fopen("/proc/self/stat", "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');   /* the command name may hold spaces */
    unsigned long long start;
    struct timespec t;
    long hz = sysconf(_SC_CLK_TCK);
    if (!p || hz <= 0 || clock_gettime(CLOCK_BOOTTIME, &t) != 0 ||
        sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
               &start) != 1)
        return -1;
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9 - (double)start / (double)hz;
}

/* 0, or why region r could not be hashed */
static const char *hash_region(const dcp_load_region *r, uint64_t nb, int cuda, uint64_t *x)
{
    if (!nb) {
        *x = XXH3_64bits("", 0);
        return 0;
    }
#ifdef HAVE_CUDA
    if (cuda) {
        void *h = malloc((size_t)nb);
        if (!h)
            return "out of memory for a host copy to hash";
        cudaError_t e = cudaMemcpy(h, r->dest, (size_t)nb, cudaMemcpyDeviceToHost);
        if (e == cudaSuccess)
            *x = XXH3_64bits(h, (size_t)nb);
        free(h);
        return e == cudaSuccess ? 0 : cudaGetErrorString(e);
    }
#else
    (void)cuda;
#endif
    if (!r->dest)
        return "no destination";
    *x = XXH3_64bits(r->dest, (size_t)nb);
    return 0;
}

/* The digests of every region, on up to one thread per CPU (host regions;
 * CUDA ones are copied down one by one): one thread hashing 2 GiB took 0.4 s
 * on the development VM, as long as a fifth of the load. */
struct hashing {
    const struct job *job;
    int cuda;
    uint64_t *out;
    atomic_size_t next;
    const char **why;   /* per region: 0, or why it could not be hashed */
};

static void *hash_worker(void *arg)
{
    struct hashing *h = arg;
    for (size_t i; (i = atomic_fetch_add(&h->next, 1)) < h->job->n;)
        h->why[i] = hash_region(&h->job->reg[i], h->job->nbytes[i], h->cuda, &h->out[i]);
    return NULL;
}

/* The digests, or NULL with the reason in err (naming the region's key). */
static uint64_t *hash_all(const struct job *job, int cuda, dcp_error *err)
{
    size_t n = job->n ? job->n : 1;
    uint64_t *out = calloc(n, sizeof *out);
    const char **why = calloc(n, sizeof *why);
    const char *nomem = getenv("DCPLOAD_TEST_NO_DIGEST_MEMORY_RANK");   /* the test hook */
    int me;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    if (!out || !why || (nomem && atoi(nomem) == me)) {
        free(out);
        free(why);
        snprintf(err->msg, sizeof err->msg, "out of memory for the digests of %zu regions", job->n);
        return NULL;
    }
    struct hashing h = {job, cuda, out, 0, why};
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    size_t nt = cuda || cpus < 2 ? 1 : cpus > 8 ? 8 : (size_t)cpus;
    if (nt > job->n)
        nt = job->n ? job->n : 1;
    pthread_t th[8];
    size_t started = 0;
    for (size_t i = 1; i < nt; i++, started++)
        if (pthread_create(&th[i - 1], NULL, hash_worker, &h) != 0)
            break;
    hash_worker(&h);
    for (size_t i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    for (size_t i = 0; i < job->n; i++)
        if (why[i]) {
            snprintf(err->msg, sizeof err->msg, "%s: cannot hash its %" PRIu64 " loaded bytes: %s",
                     job->reg[i].key, job->nbytes[i], why[i]);
            free(out);
            out = NULL;
            break;
        }
    free(why);
    return out;
}

int main(int argc, char **argv)
{
    /* where a launch's time goes, beside the load's own (--json) */
    double t_exec = since_exec(), t = now();
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    double t_mpi = now() - t;
    MPI_Comm comm = MPI_COMM_WORLD;
    int me, nranks;
    MPI_Comm_rank(comm, &me);
    MPI_Comm_size(comm, &nranks);

    struct opts o;
    struct usage_error bad;
    int prc = parse(argc, argv, &o, me, &bad);
    say_usage_error(comm, prc == 2 ? &bad : NULL);
    /* Ranks may be given different arguments (mpiexec's MPMD form, A : B,
     * as for node-local copies of a checkpoint): a usage error on one rank,
     * or --device on some ranks only (the CUDA device query is collective
     * among the ranks asking for it), must end every rank, not leave the
     * others waiting in the first collective; --megatron-fold on some ranks
     * only gives ranks other shapes of one key (refused by dcp_load, but as
     * a region of the wrong rank). v: the lowest rank with a usage error,
     * whether none asked for --help, cuda, -cuda, fold, -fold, the lowest
     * rank without a usage error (minima): it alone names the rank with one,
     * not every such rank the same line. */
    int v[7] = {prc == 2 ? me : nranks, prc == 1 ? 0 : 1, prc ? 0 : o.cuda, prc ? 0 : -o.cuda,
                prc ? 0 : o.fold, prc ? 0 : -o.fold, prc == 2 ? nranks : me}, w[7];
    MPI_Allreduce(v, w, 7, MPI_INT, MPI_MIN, comm);
    if (w[0] < nranks || w[1] == 0 || w[2] != -w[3] || w[4] != -w[5]) {
        if (w[0] < nranks && me == w[6])
            fprintf(stderr, "dcpload: rank %d was given bad arguments (its message above)\n", w[0]);
        else if (w[0] == nranks && w[1] && me == 0)
            fprintf(stderr, "dcpload: every rank must pass the same %s: some ranks pass it, others not\n",
                    w[2] != -w[3] ? "--device" : "--megatron-fold");
        MPI_Finalize();
        return w[0] == nranks && !w[1] ? 0 : 2;
    }
    dcp_error err = {0};
    dcp_checkpoint *ck = NULL;
    struct job job = {0};
    int rc = 1;
    double t_open = now(), t_device = 0, t_alloc, t_warmup, t_digests, t_free;
    if (dcp_load_open(comm, o.path, o.fold ? DCP_OPEN_MEGATRON_FOLD : DCP_OPEN_DEFAULT, &ck, &err) < 0) {
        report(comm, &err);
        goto out;
    }
    t_open = now() - t_open;
    int cuda_ok = 0, device;
    if (o.cuda) {
        t_device = now();
        dcp_error cerr;
        cuda_ok = dcp_load_cuda_device(comm, &device, &cerr) == 0;
#ifdef HAVE_CUDA
        if (cuda_ok && o.gpu)
            cuda_ok = cudaSetDevice(device) == cudaSuccess;   /* creates the context (CUDA 12+) */
#endif
        t_device = now() - t_device;
    }
    t_alloc = now();
    int lrc = build_job(ck, &o, me, nranks, cuda_ok, &job, &err);
    if (agree(comm, lrc, &err) < 0) {
        report(comm, &err);
        goto out;
    }
    t_alloc = now() - t_alloc;
    dcp_load_options lo = DCP_LOAD_OPTIONS_INIT;
    lo.flags = (o.independent ? DCP_LOAD_INDEPENDENT : 0) | (o.no_bcast ? DCP_LOAD_NO_BCAST : 0) |
               (o.shm ? DCP_LOAD_SHM : 0) | (o.bcast_local ? DCP_LOAD_BCAST_LOCAL : 0) |
               (o.host_delivery ? DCP_LOAD_HOST_DELIVERY : 0) |
               (o.device_delivery ? DCP_LOAD_DEVICE_DELIVERY : 0) | (o.direct ? DCP_LOAD_DIRECT : 0) |
               (o.map ? DCP_LOAD_MAP : 0);
    lo.staging_bytes = o.staging;
    lo.nstaging = o.buffers;
    dcp_load_stats st;
    /* time the load, not MPI's start-up: an empty collective load first sets
     * up the connections its collectives use (MPICH makes them lazily) */
    t_warmup = now();
    dcp_load(comm, ck, NULL, 0, &lo, NULL, NULL);
    MPI_Barrier(comm);
    t_warmup = now() - t_warmup;
    double cpu = cpu_seconds();
    if (dcp_load(comm, ck, job.reg, job.nreg, &lo, &st, &err) < 0) {
        report(comm, &err);
        goto out;
    }
    cpu = cpu_seconds() - cpu;
    struct out txt = {0};
    int digest = o.json && !o.no_digests;
    t_digests = now();
    uint64_t *digests = digest ? hash_all(&job, o.gpu, &err) : NULL;
    t_digests = digest ? now() - t_digests : 0;
    /* agreed: rank 0 gathers every rank's output below, and must not wait
     * for a rank that stopped here */
    if (agree(comm, digest && !digests ? -1 : 0, &err) < 0) {
        report(comm, &err);
        goto out;
    }
    t_free = now();
    job_free_buffers(&job, o.gpu);
    t_free = now() - t_free;
    if (o.json) {
        for (size_t i = 0; digest && i < job.n; i++) {
            const dcp_load_region *r = &job.reg[i];
            outf(&txt, "{\"rank\":%d,\"key\":", me);
            out_json_string(&txt, r->key);
            outf(&txt, ",\"offsets\":");
            out_dims(&txt, r->offsets, r->ndim);
            outf(&txt, ",\"lengths\":");
            out_dims(&txt, r->lengths, r->ndim);
            outf(&txt, ",\"xxh3\":\"%016" PRIx64 "\"}\n", digests[i]);
        }
        outf(&txt,
             "{\"rank\":%d,\"bytes_read\":%" PRIu64 ",\"bytes_sent\":%" PRIu64 ",\"bytes_received\":%" PRIu64
             ",\"seconds\":%.6f,\"bytes_unique\":%" PRIu64 ",\"bytes_loaded\":%" PRIu64 ",\"bytes_shm\":%" PRIu64
             ",\"reads\":%" PRIu64 ",\"messages\":%" PRIu64 ",\"broadcasts\":%" PRIu64 ",\"seconds_exchange\":%.6f,\"seconds_plan\":%.6f"
             ",\"seconds_read\":%.6f,\"seconds_deliver\":%.6f,\"seconds_place\":%.6f,\"seconds_transfer\":%.6f"
             ",\"cpu_seconds\":%.6f,\"delivery\":\"%s\",\"bytes_ipc\":%" PRIu64 ",\"bytes_staged\":%" PRIu64
             ",\"mpi_cuda_aware\":%d,\"seconds_exec\":%.6f,\"seconds_mpi_init\":%.6f,\"seconds_open\":%.6f"
             ",\"seconds_device\":%.6f,\"seconds_alloc\":%.6f,\"seconds_warmup\":%.6f,\"seconds_digests\":%.6f"
             ",\"seconds_free\":%.6f,\"fallback\":",
             me, st.bytes_read, st.bytes_sent, st.bytes_received, st.seconds_total, st.bytes_unique, st.bytes_loaded,
             st.bytes_shm, st.reads, st.messages, st.broadcasts, st.seconds_exchange, st.seconds_plan, st.seconds_read,
             st.seconds_deliver, st.seconds_place, st.seconds_transfer, cpu, delivery_name(st.delivery),
             st.bytes_ipc, st.bytes_staged, st.mpi_cuda_aware, t_exec, t_mpi, t_open, t_device, t_alloc,
             t_warmup, t_digests, t_free);
        out_json_string(&txt, st.fallback);
        outf(&txt, "}\n");
    } else {
        if (me == 0)
            outf(&txt, "%zu tensors on %d ranks, %" PRIu64 " unique bytes\n", job.n, nranks, st.bytes_unique);
        outf(&txt,
             "rank %d: loaded %" PRIu64 " bytes; read %" PRIu64 " (%" PRIu64 " reads), sent %" PRIu64
             ", received %" PRIu64 " (%" PRIu64 " through shared memory); %.3f s: exchange %.3f, plan %.3f,"
             " transfer %.3f (busy reading %.3f, delivering %.3f, placing %.3f); CPU %.3f s\n",
             me, st.bytes_loaded, st.bytes_read, st.reads, st.bytes_sent, st.bytes_received, st.bytes_shm,
             st.seconds_total, st.seconds_exchange, st.seconds_plan, st.seconds_transfer, st.seconds_read,
             st.seconds_deliver, st.seconds_place, cpu);
        if (st.delivery == DCP_LOAD_DELIVERY_IPC)
            outf(&txt, "rank %d: device IPC delivery: %" PRIu64 " bytes device to device from node peers, %" PRIu64
                       " staged host to device\n", me, st.bytes_ipc, st.bytes_staged);
    }
    /* which path CUDA destinations took, once: the same on every rank */
    if (me == 0 && st.delivery == DCP_LOAD_DELIVERY_FALLBACK)
        fprintf(stderr, "dcpload: device IPC delivery unavailable (%s): node peers got host messages\n", st.fallback);
    print_all(comm, &txt, stdout);
    fflush(stdout);   /* before MPI_Finalize, which can hang in the transport's teardown */
    free(txt.p);
    free(digests);
    rc = 0;
out:
    job_free(&job, o.gpu);
    dcp_close(ck);
    MPI_Finalize();
    return rc;
}
