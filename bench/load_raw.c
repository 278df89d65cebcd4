/* The raw-read baseline of bench-load.sh: N MPI processes read files with
 * pread(2), nothing else. The concatenated bytes of FILE... are split into N
 * contiguous shares (as numpy.array_split), and each rank reads its share in
 * requests of --request bytes (default 16 MiB, dcpload's staging size) into
 * a reused buffer, or with --dest into a buffer the size of its share,
 * allocated and touched before the clock starts (as dcpload's destinations
 * are). --all: every rank reads all the bytes (what every rank of a
 * replicated load reads when each reads its own needs). --threads T: each
 * rank reads its share on T threads, each a contiguous part of it. --fresh
 * (with --dest): the buffer is allocated inside the clock and not touched
 * first, so the reads fault its pages in, as they do into a program's fresh
 * tensors (issue 16's peer: 8 threads reading into fresh huge-page memory).
 *
 *   mpiexec -n N load_raw [--all] [--dest [--fresh]] [--threads T] [--request BYTES] FILE...
 *
 * Rank 0 prints "SECONDS BYTES CPU_SECONDS": barrier to barrier, the bytes
 * all ranks read, and their user+system CPU time summed over ranks.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mpi.h>

static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
}

static int die(const char *what)
{
    fprintf(stderr, "load_raw: %s: %s\n", what, errno ? strerror(errno) : "failed");
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
}

/* One reader's part [lo, hi) of the concatenation, into buf (at lo - base
 * with dest, else at 0 of a request-sized buffer of its own). */
struct part {
    const int *fds;
    const uint64_t *sizes;
    int nfiles;
    uint64_t lo, hi, base;
    unsigned char *buf;
    size_t request;
    int into_dest;
    uint64_t done;
    int err;
    const char *what;
};

static void *read_part(void *arg)
{
    struct part *p = arg;
    uint64_t pos = 0;
    for (int i = 0; i < p->nfiles && !p->err; i++) {
        uint64_t a = p->lo > pos ? p->lo : pos, b = p->hi < pos + p->sizes[i] ? p->hi : pos + p->sizes[i];
        for (uint64_t off = a; off < b;) {
            size_t want = b - off < p->request ? (size_t)(b - off) : p->request;
            unsigned char *to = p->into_dest ? p->buf + (off - p->base) : p->buf;
            ssize_t got = pread(p->fds[i], to, want, (off_t)(off - pos));
            if (got <= 0) {
                p->err = got == 0 ? EIO : errno;   /* EIO: the file shrank */
                p->what = "pread";
                break;
            }
            off += (uint64_t)got;
            p->done += (uint64_t)got;
        }
        pos += p->sizes[i];
    }
    return NULL;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int me, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    int all = 0, into_dest = 0, fresh = 0, first = 1;
    unsigned nthreads = 1;
    size_t request = (size_t)16 << 20;
    for (; first < argc && argv[first][0] == '-'; first++) {
        if (!strcmp(argv[first], "--all")) {
            all = 1;
        } else if (!strcmp(argv[first], "--dest")) {
            into_dest = 1;
        } else if (!strcmp(argv[first], "--fresh")) {
            fresh = 1;
        } else if (!strcmp(argv[first], "--threads") && first + 1 < argc) {
            nthreads = (unsigned)strtoul(argv[++first], NULL, 10);
        } else if (!strcmp(argv[first], "--request") && first + 1 < argc) {
            request = (size_t)strtoull(argv[++first], NULL, 10);
        } else {
            if (me == 0)
                fprintf(stderr, "usage: mpiexec -n N load_raw [--all] [--dest [--fresh]] [--threads T] [--request BYTES] FILE...\n");
            MPI_Finalize();
            return 2;
        }
    }
    int nfiles = argc - first;
    if (nfiles < 1 || request < 4096 || nthreads < 1 || nthreads > 64 || (fresh && !into_dest)) {
        if (me == 0)
            fprintf(stderr, "load_raw: no files, a request under 4096 bytes, --threads not 1-64, or --fresh without --dest\n");
        MPI_Finalize();
        return 2;
    }
    int *fds = calloc((size_t)nfiles, sizeof *fds);
    uint64_t *sizes = calloc((size_t)nfiles, sizeof *sizes), total = 0;
    if (!fds || !sizes)
        return die("out of memory");
    for (int i = 0; i < nfiles; i++) {
        struct stat st;
        if ((fds[i] = open(argv[first + i], O_RDONLY)) < 0 || fstat(fds[i], &st) < 0)
            return die(argv[first + i]);
        sizes[i] = (uint64_t)st.st_size;
        total += sizes[i];
    }
    /* this rank's share [lo, hi) of the concatenation */
    uint64_t lo = 0, hi = total;
    if (!all) {
        uint64_t q = total / (uint64_t)n, r = total % (uint64_t)n, k = (uint64_t)me;
        lo = k * q + (k < r ? k : r);
        hi = lo + q + (k < r);
    }
    size_t cap = into_dest ? (size_t)(hi - lo) : request;
    unsigned char *buf = NULL;
    /* 2 MiB-aligned in huge pages, as dcpload allocates its destinations;
     * touched before the clock unless --fresh (then allocated inside it) */
    unsigned char *bufs[64] = {0};
    if (!fresh) {
        for (unsigned t = 0; t < (into_dest ? 1 : nthreads); t++) {
            if (posix_memalign((void **)&bufs[t], (size_t)2 << 20, cap ? cap : 1) != 0)
                return die("cannot allocate the buffer");
            (void)madvise(bufs[t], cap, MADV_HUGEPAGE);
            memset(bufs[t], 0xA5, cap);
        }
    }

    MPI_Barrier(MPI_COMM_WORLD);
    double c0 = cpu_seconds(), t0 = MPI_Wtime();
    if (fresh) {
        if (posix_memalign((void **)&bufs[0], (size_t)2 << 20, cap ? cap : 1) != 0)
            return die("cannot allocate the buffer");
        (void)madvise(bufs[0], cap, MADV_HUGEPAGE);
    }
    buf = bufs[0];
    struct part parts[64];
    pthread_t th[64];
    unsigned started = 0;
    for (unsigned t = 0; t < nthreads; t++) {
        uint64_t share = hi - lo;
        parts[t] = (struct part){fds, sizes, nfiles, lo + share * t / nthreads, lo + share * (t + 1) / nthreads,
                                 lo, into_dest ? buf : bufs[t], request, into_dest, 0, 0, NULL};
    }
    for (unsigned t = 1; t < nthreads; t++, started++)
        if (pthread_create(&th[t], NULL, read_part, &parts[t]) != 0)
            return die("pthread_create");
    read_part(&parts[0]);
    for (unsigned t = 1; t <= started; t++)
        pthread_join(th[t], NULL);
    uint64_t done = 0;
    for (unsigned t = 0; t < nthreads; t++) {
        if (parts[t].err) {
            errno = parts[t].err;
            return die(parts[t].what);
        }
        done += parts[t].done;
    }
    double cpu = cpu_seconds() - c0;
    MPI_Barrier(MPI_COMM_WORLD);
    double wall = MPI_Wtime() - t0, slowest, cpu_sum;
    unsigned long long bytes = done, bytes_sum;
    MPI_Reduce(&wall, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(&cpu, &cpu_sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    MPI_Reduce(&bytes, &bytes_sum, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (me == 0)
        printf("%.6f %llu %.6f\n", slowest, bytes_sum, cpu_sum);
    for (int i = 0; i < nfiles; i++)
        close(fds[i]);
    free(fds);
    free(sizes);
    for (unsigned t = 0; t < 64; t++)
        free(bufs[t]);
    MPI_Finalize();
    return 0;
}
