/* libFuzzer harness: the fuzz input becomes one file of a checkpoint folder
 * (MODE 0: .metadata next to fixture 05's shards; MODE 1: fixture 01's
 * __0_0.distcp; MODE 2: a Hugging Face model.safetensors), which is then
 * opened, and the first 64 KiB of every entry planned and read. Run by
 * `make fuzz` (tests/fuzz/local.mk); FIXTURES names tests/fixtures. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "dcp.h"

static char dir[256], target[300];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc; (void)argv;
    snprintf(dir, sizeof dir, "/dev/shm/dcpfuzz.%d", (int)getpid());
    const char *fx = getenv("FIXTURES");
    char cmd[1024];
#if MODE == 0
    snprintf(cmd, sizeof cmd, "rm -rf %s; mkdir -p %s && cp %s/05_mixed_2ranks/ckpt/__* %s/", dir, dir, fx, dir);
    snprintf(target, sizeof target, "%s/.metadata", dir);
#elif MODE == 1
    snprintf(cmd, sizeof cmd, "rm -rf %s; mkdir -p %s && cp -r %s/01_single_plain/ckpt/. %s/", dir, dir, fx, dir);
    snprintf(target, sizeof target, "%s/__0_0.distcp", dir);
#else
    snprintf(cmd, sizeof cmd, "rm -rf %s; mkdir -p %s", dir, dir);
    snprintf(target, sizeof target, "%s/model.safetensors", dir);
#endif
    if (system(cmd) != 0)
        abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    int fd = open(target, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || write(fd, data, size) != (ssize_t)size)
        abort();
    close(fd);
    dcp_checkpoint *ck;
    dcp_error err;
    if (dcp_open(dir, 0, &ck, &err) < 0)
        return 0;
    static unsigned char buf[65536];
    dcp_plan plan;
    dcp_plan_init(&plan);
    for (size_t i = 0; i < dcp_num_entries(ck); i++) {
        const dcp_entry *e = dcp_entry_at(ck, i);
        if (dcp_plan_bytes(ck, e, 0, sizeof buf, &plan, &err) == 0 && plan.nbytes <= sizeof buf)
            (void)dcp_plan_execute(ck, &plan, buf, &err);
    }
    dcp_plan_free(&plan);
    dcp_close(ck);
    return 0;
}
