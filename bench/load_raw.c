/* The raw-read baseline of bench-load.sh: N MPI processes read files with
 * pread(2), nothing else. The concatenated bytes of FILE... are split into N
 * contiguous shares (as numpy.array_split), and each rank reads its share in
 * requests of --request bytes (default 16 MiB, dcpload's staging size) into
 * a reused buffer, or with --dest into a buffer the size of its share,
 * allocated and touched before the clock starts (as dcpload's destinations
 * are). --all: every rank reads all the bytes (what every rank of a
 * replicated load reads when each reads its own needs).
 *
 *   mpiexec -n N load_raw [--all] [--dest] [--request BYTES] FILE...
 *
 * Rank 0 prints "SECONDS BYTES CPU_SECONDS": barrier to barrier, the bytes
 * all ranks read, and their user+system CPU time summed over ranks.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
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

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int me, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    int all = 0, into_dest = 0, first = 1;
    size_t request = (size_t)16 << 20;
    for (; first < argc && argv[first][0] == '-'; first++) {
        if (!strcmp(argv[first], "--all")) {
            all = 1;
        } else if (!strcmp(argv[first], "--dest")) {
            into_dest = 1;
        } else if (!strcmp(argv[first], "--request") && first + 1 < argc) {
            request = (size_t)strtoull(argv[++first], NULL, 10);
        } else {
            if (me == 0)
                fprintf(stderr, "usage: mpiexec -n N load_raw [--all] [--dest] [--request BYTES] FILE...\n");
            MPI_Finalize();
            return 2;
        }
    }
    int nfiles = argc - first;
    if (nfiles < 1 || request < 4096) {
        if (me == 0)
            fprintf(stderr, "load_raw: no files, or a request under 4096 bytes\n");
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
    /* 2 MiB-aligned in huge pages, as dcpload allocates its destinations */
    if (posix_memalign((void **)&buf, (size_t)2 << 20, cap ? cap : 1) != 0)
        return die("cannot allocate the buffer");
    (void)madvise(buf, cap, MADV_HUGEPAGE);
    memset(buf, 0xA5, cap);

    MPI_Barrier(MPI_COMM_WORLD);
    double c0 = cpu_seconds(), t0 = MPI_Wtime();
    uint64_t done = 0, pos = 0;
    for (int i = 0; i < nfiles; i++) {
        uint64_t a = lo > pos ? lo : pos, b = hi < pos + sizes[i] ? hi : pos + sizes[i];
        for (uint64_t off = a; off < b;) {
            size_t want = b - off < request ? (size_t)(b - off) : request;
            unsigned char *to = into_dest ? buf + (off - lo) : buf;
            ssize_t got = pread(fds[i], to, want, (off_t)(off - pos));
            if (got <= 0) {
                if (got == 0)
                    errno = EIO;   /* the file shrank */
                return die(argv[first + i]);
            }
            off += (uint64_t)got;
            done += (uint64_t)got;
        }
        pos += sizes[i];
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
    free(buf);
    MPI_Finalize();
    return 0;
}
