/* bench/folios: how much of a file's cached data sits in large folios.
 *
 * bench-fuse.sh prints it beside the re-read numbers: a re-read is served
 * from the page cache, and its cost per byte depends on how many folios the
 * kernel walks (one lookup, reference and LRU update per folio). Maps the
 * first LIMIT bytes of each file, touches every page, and looks each page's
 * frame up in /proc/self/pagemap and /proc/kpageflags (needs root).
 *
 * usage: folios FILE...   prints "FILE PAGES PERCENT_IN_LARGE_FOLIOS" per file
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define LIMIT ((size_t)256 << 20)
#define KPF_COMPOUND_HEAD (1ULL << 15)
#define KPF_COMPOUND_TAIL (1ULL << 16)

int main(int argc, char **argv)
{
    long ps = sysconf(_SC_PAGESIZE);
    int pm = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    int kf = open("/proc/kpageflags", O_RDONLY | O_CLOEXEC);
    if (pm < 0 || kf < 0) {
        fprintf(stderr, "folios: /proc/self/pagemap or /proc/kpageflags: %s\n", strerror(errno));
        return 1;
    }
    for (int a = 1; a < argc; a++) {
        int fd = open(argv[a], O_RDONLY | O_CLOEXEC);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) < 0 || st.st_size == 0) {
            fprintf(stderr, "folios: %s: %s\n", argv[a], fd < 0 ? strerror(errno) : "empty");
            return 1;
        }
        size_t n = (size_t)st.st_size < LIMIT ? (size_t)st.st_size : LIMIT;
        volatile unsigned char *m = mmap(NULL, n, PROT_READ, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) {
            fprintf(stderr, "folios: %s: mmap: %s\n", argv[a], strerror(errno));
            return 1;
        }
        size_t pages = 0, large = 0;
        for (size_t i = 0; i < n; i += (size_t)ps) {
            uint64_t e = 0, f = 0;
            (void)m[i];   /* maps the cached page (reads it if it was not cached) */
            if (pread(pm, &e, 8, (off_t)(((uintptr_t)m + i) / (uintptr_t)ps * 8)) != 8 || !(e >> 63))
                continue;
            uint64_t pfn = e & ((1ULL << 55) - 1);
            if (!pfn || pread(kf, &f, 8, (off_t)(pfn * 8)) != 8)
                continue;   /* no frame numbers without CAP_SYS_ADMIN */
            pages++;
            if (f & (KPF_COMPOUND_HEAD | KPF_COMPOUND_TAIL))
                large++;
        }
        munmap((void *)m, n);
        close(fd);
        if (!pages) {
            fprintf(stderr, "folios: %s: no page frames visible (needs root)\n", argv[a]);
            return 1;
        }
        printf("%s %zu %.0f\n", argv[a], pages, 100.0 * (double)large / (double)pages);
    }
    return 0;
}
