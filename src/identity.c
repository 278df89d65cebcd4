/* The identity of a checkpoint's .metadata: its content key (XXH3-128 of
 * its size, mtime and bytes) and its stat stamp. Part of the model, not of
 * the catalog: the parse feeds the bytes it reads (so that what is stored is
 * filed under what was parsed), and the catalog (integrity/modelcache.c)
 * files and finds models by them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <xxhash.h>
#if __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h>
#endif

#include "internal.h"

struct dcpi_identity {
    XXH3_state_t *st;
    struct stat sb;
};

dcpi_identity *dcpi_identity_begin(const struct stat *sb)
{
    dcpi_identity *id = malloc(sizeof *id);
    if (!id)
        return NULL;
    if (!(id->st = XXH3_createState())) {
        free(id);
        return NULL;
    }
    id->sb = *sb;
    uint64_t v[3] = {(uint64_t)sb->st_size, (uint64_t)sb->st_mtim.tv_sec, (uint64_t)sb->st_mtim.tv_nsec};
    XXH3_128bits_reset(id->st);
    XXH3_128bits_update(id->st, v, sizeof v);
    return id;
}

void dcpi_identity_update(dcpi_identity *id, const void *p, size_t n)
{
    if (id)
        XXH3_128bits_update(id->st, p, n);
}

void dcpi_identity_key(dcpi_identity *id, char key[33])
{
    XXH128_hash_t h = XXH3_128bits_digest(id->st);
    snprintf(key, 33, "%016llx%016llx", (unsigned long long)h.high64, (unsigned long long)h.low64);
}

void dcpi_identity_free(dcpi_identity *id)
{
    if (id) {
        XXH3_freeState(id->st);
        free(id);
    }
}

void dcpi_identity_finish(dcpi_identity *id, dcp_checkpoint *ck)
{
    if (!id)
        return;   /* the key is computed from the file when it is needed */
    dcpi_identity_key(id, ck->meta.key);
    dcpi_identity_stamp(ck, &id->sb);
    dcpi_identity_free(id);
}

/* Device, inode, size, mtime and ctime serve a reopen without reading the
 * file. Users cannot set ctime, and any write to the file or replacement of
 * it changes ctime or the inode. "-" (none: the content key decides) when
 * the file changed in the last two seconds, since a change within the same
 * clock tick would not show. */
void dcpi_identity_stamp(dcp_checkpoint *ck, const struct stat *sb)
{
    struct timespec now;
    if (clock_gettime(CLOCK_REALTIME, &now) < 0 || now.tv_sec - sb->st_mtim.tv_sec < 2 ||
        now.tv_sec - sb->st_ctim.tv_sec < 2) {
        snprintf(ck->meta.stamp, sizeof ck->meta.stamp, "-");
        return;
    }
    snprintf(ck->meta.stamp, sizeof ck->meta.stamp, "%llx:%llx:%llx:%lld.%09ld:%lld.%09ld",
             (unsigned long long)sb->st_dev, (unsigned long long)sb->st_ino, (unsigned long long)sb->st_size,
             (long long)sb->st_mtim.tv_sec, sb->st_mtim.tv_nsec, (long long)sb->st_ctim.tv_sec, sb->st_ctim.tv_nsec);
}
