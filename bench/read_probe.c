/* Two ways for one process to read files from storage into fresh memory,
 * side by side (bench/bench-read.sh; issue 16: "io_uring through liburing,
 * or a pool of reader threads with preadv2; measure both, keep the faster"):
 *
 *   read_probe threads T UNIT FILE...            T threads take UNIT-MiB pieces
 *                                                of the files in order and pread
 *                                                them (dcpload's unit readers)
 *   read_probe uring DEPTH UNIT [direct] FILE... one thread keeps DEPTH reads of
 *                                                UNIT MiB in flight with io_uring,
 *                                                through the page cache or O_DIRECT
 *
 * The bytes land in one buffer the size of the files, 2 MiB-aligned in
 * transparent huge pages, allocated inside the clock and not touched before
 * (the reads fault it in, as a program's fresh tensors are). Prints
 * "SECONDS BYTES CPU_SECONDS". uring exits 77 where liburing was not found
 * at build time or the kernel refuses io_uring.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#ifdef HAVE_LIBURING
#include <liburing.h>
#endif

#define MAX_FILES 256

static int fds[MAX_FILES], nfiles;
static uint64_t sizes[MAX_FILES], bases[MAX_FILES], total;
static unsigned char *buf;
static size_t unit;
static atomic_size_t next_piece;
static atomic_int failed;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
}

static int die(const char *what, int e)
{
    fprintf(stderr, "read_probe: %s: %s\n", what, strerror(e));
    return 1;
}

/* Piece i of the files in order: file *f, offset *off, length *len (0: none). */
static size_t piece(size_t i, int *f, uint64_t *off)
{
    for (int k = 0; k < nfiles; k++) {
        uint64_t n = (sizes[k] + unit - 1) / unit;
        if (i < n) {
            *f = k;
            *off = i * unit;
            return sizes[k] - *off < unit ? (size_t)(sizes[k] - *off) : unit;
        }
        i -= n;
    }
    return 0;
}

static void *reader(void *arg)
{
    (void)arg;
    for (;;) {
        int f;
        uint64_t off;
        size_t len = piece(atomic_fetch_add(&next_piece, 1), &f, &off);
        if (!len)
            return NULL;
        for (size_t done = 0; done < len;) {
            ssize_t n = pread(fds[f], buf + bases[f] + off + done, len - done, (off_t)(off + done));
            if (n <= 0) {
                atomic_store(&failed, n < 0 ? errno : EIO);
                return NULL;
            }
            done += (size_t)n;
        }
    }
}

static int run_threads(unsigned t)
{
    pthread_t th[64];
    unsigned started = 0;
    for (unsigned i = 1; i < t && pthread_create(&th[started], NULL, reader, NULL) == 0; i++)
        started++;
    reader(NULL);
    for (unsigned i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    return atomic_load(&failed) ? die("pread", atomic_load(&failed)) : 0;
}

static int run_uring(unsigned depth, int direct)
{
#ifdef HAVE_LIBURING
    struct io_uring ring;
    int e = io_uring_queue_init(depth, &ring, 0);
    if (e < 0) {
        fprintf(stderr, "read_probe: io_uring_queue_init: %s\n", strerror(-e));
        return 77;
    }
    size_t i = 0;
    unsigned inflight = 0;
    for (;;) {
        while (inflight < depth) {
            int f;
            uint64_t off;
            size_t len = piece(i, &f, &off);
            if (!len)
                break;
            i++;
            if (direct)   /* whole blocks: the buffer has room (bases are 4 KiB-aligned) */
                len = (len + 4095) & ~(size_t)4095;
            struct io_uring_sqe *s = io_uring_get_sqe(&ring);
            io_uring_prep_read(s, fds[f], buf + bases[f] + off, (unsigned)len, off);
            io_uring_sqe_set_data64(s, (uint64_t)len);
            inflight++;
        }
        if (!inflight)
            break;
        io_uring_submit(&ring);
        struct io_uring_cqe *c;
        if ((e = io_uring_wait_cqe(&ring, &c)) < 0)
            return die("io_uring_wait_cqe", -e);
        /* a short read is the end of a file (O_DIRECT rounds the last block up); any other is an error */
        if (c->res < 0)
            return die("io_uring read", -c->res);
        io_uring_cqe_seen(&ring, c);
        inflight--;
    }
    io_uring_queue_exit(&ring);
    return 0;
#else
    (void)depth, (void)direct;
    fprintf(stderr, "read_probe: built without liburing\n");
    return 77;
#endif
}

int main(int argc, char **argv)
{
    if (argc < 5 || (strcmp(argv[1], "threads") && strcmp(argv[1], "uring"))) {
        fprintf(stderr, "usage: read_probe threads T UNIT_MIB FILE... | uring DEPTH UNIT_MIB [direct] FILE...\n");
        return 2;
    }
    int uring = !strcmp(argv[1], "uring");
    unsigned n = (unsigned)strtoul(argv[2], NULL, 10);
    unit = (size_t)strtoul(argv[3], NULL, 10) << 20;
    int first = 4, direct = 0;
    if (uring && !strcmp(argv[first], "direct"))
        direct = 1, first++;
    if (n < 1 || n > 64 || unit < 4096 || unit > ((size_t)1 << 30) || argc - first < 1 || argc - first > MAX_FILES) {
        fprintf(stderr, "read_probe: 1-64 threads or depth, 1 MiB to 1 GiB units, 1-%d files\n", MAX_FILES);
        return 2;
    }
    for (int i = first; i < argc; i++) {
        struct stat st;
        int fd = open(argv[i], O_RDONLY | (direct ? O_DIRECT : 0));
        if (fd < 0 || fstat(fd, &st) < 0)
            return die(argv[i], errno);
        fds[nfiles] = fd;
        sizes[nfiles] = (uint64_t)st.st_size;
        bases[nfiles] = total;
        total += ((uint64_t)st.st_size + 4095) & ~(uint64_t)4095;
        nfiles++;
    }
    double c0 = cpu_seconds(), t0 = now();
    if (posix_memalign((void **)&buf, (size_t)2 << 20, total + 4096) != 0)
        return die("the buffer", ENOMEM);
    (void)madvise(buf, total + 4096, MADV_HUGEPAGE);
    int rc = uring ? run_uring(n, direct) : run_threads(n);
    if (rc)
        return rc;
    double secs = now() - t0, cpu = cpu_seconds() - c0;
    uint64_t bytes = 0;
    for (int i = 0; i < nfiles; i++)
        bytes += sizes[i];
    printf("%.6f %llu %.6f\n", secs, (unsigned long long)bytes, cpu);
    free(buf);
    return 0;
}
