/* Runs a fuzz harness without libFuzzer: `replay TARGET FILE...` feeds each
 * file to LLVMFuzzerTestOneInput once, as libFuzzer would, so that `make
 * check` (any compiler, tests/fuzz-regress.sh) runs every committed seed and
 * crash input against the normal build. Exits non-zero only by crashing, as
 * the harness does on a finding (or 2 on bad usage). */
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

int main(int argc, char **argv)
{
    if (argc < 2 || setenv("FUZZ_TARGET", argv[1], 1) < 0) {
        fprintf(stderr, "usage: %s TARGET FILE...\n", argv[0]);
        return 2;
    }
    LLVMFuzzerInitialize(&argc, &argv);
    for (int i = 2; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        if (!f) {
            perror(argv[i]);
            return 2;
        }
        unsigned char *buf = NULL;
        size_t n = 0, cap = 0, got;
        do {
            if (n == cap && !(buf = realloc(buf, cap = cap ? 2 * cap : 65536)))
                abort();
            got = fread(buf + n, 1, cap - n, f);
            n += got;
        } while (got);
        fclose(f);
        LLVMFuzzerTestOneInput(buf, n);
        free(buf);
    }
    return 0;
}
