/* Test helper for the planner and reader tests: build a checkpoint in memory
 * (as dcp_open would) over real data files in a temporary folder, with chunk
 * records filled in by hand so no record locator is needed. */
#ifndef PLANNER_CK_H
#define PLANNER_CK_H

#include "check_quiet.h"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

static inline dcp_checkpoint *tck_new(void)
{
    const char *tmp = getenv("TMPDIR");
    char tmpl[4096];
    dcp_error err;
    snprintf(tmpl, sizeof tmpl, "%s/dcp-planner-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    ck_assert_ptr_nonnull(mkdtemp(tmpl));
    dcp_checkpoint *ck = dcpi_ck_new(tmpl, &err);   /* an empty model, as dcp_open starts */
    ck_assert_msg(ck != NULL, "%s", err.msg);
    return ck;
}

/* Register a data file; with data, also write it (len bytes). */
static inline uint32_t tck_file(dcp_checkpoint *ck, const char *name, const void *data, size_t len)
{
    uint32_t idx;
    dcp_error err;
    ck_assert_int_eq(dcpi_model_file(ck, name, strlen(name), &idx, &err), 0);
    if (data) {
        int fd = openat(ck->dirfd, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(write(fd, data, len), (ssize_t)len);
        close(fd);
    }
    return idx;
}

/* A tensor entry; returns its index. */
static inline size_t tck_tensor(dcp_checkpoint *ck, const char *key, dcp_dtype dt, int ndim,
                                const int64_t *shape)
{
    size_t idx;
    dcp_error err;
    ck_assert_int_eq(dcpi_model_entry(ck, key, strlen(key), DCP_KIND_TENSOR, &idx, &err), 0);
    ck_assert_msg(dcpi_model_set_tensor(ck, idx, dt, ndim, shape, &err) == 0, "%s", err.msg);
    return idx;
}

/* A chunk whose blob is [off, off+len) of file. */
static inline size_t tck_chunk(dcp_checkpoint *ck, size_t idx, const int64_t *offsets,
                               const int64_t *sizes, uint32_t file, uint64_t off, uint64_t len)
{
    size_t ci;
    dcp_error err;
    ck_assert_msg(dcpi_model_add_chunk(ck, idx, offsets, sizes, &ci, &err) == 0, "%s", err.msg);
    dcp_chunk *c = &ck->priv[idx].chunks[ci];
    c->blob = (dcp_blob){ .file = file, .offset = off, .length = len };
    c->has_blob = 1;
    return ci;
}

/* After every file is registered: the data files' state, as dcp_open makes it. */
static inline void tck_finish(dcp_checkpoint *ck)
{
    dcp_error err;
    ck_assert_msg(dcpi_ck_files_ready(ck, &err) == 0, "%s", err.msg);
}

/* After every chunk of entry idx is added: the resolved record of chunk ci. */
static inline void tck_record(dcp_checkpoint *ck, size_t idx, size_t ci, dcp_dtype dt,
                              uint64_t data_offset, uint64_t data_length, int64_t storage_offset,
                              const int64_t *stride, uint32_t flags)
{
    dcp_entry *e = &ck->entries[idx];
    struct dcpi_entry_priv *p = &ck->priv[idx];
    if (!p->records) {
        p->records = calloc(e->nchunks, sizeof *p->records);
        ck_assert_ptr_nonnull(p->records);
    }
    int64_t *s = dcpi_arena_alloc(&ck->arena, (size_t)e->ndim * sizeof *s + 1);
    ck_assert_ptr_nonnull(s);
    if (e->ndim)
        memcpy(s, stride, (size_t)e->ndim * sizeof *s);
    p->records[ci].rec = (dcp_record){ .data_offset = data_offset, .data_length = data_length,
                                       .storage_offset = storage_offset, .stride = s,
                                       .dtype = dt, .flags = flags };
    p->records[ci].state = 1;
}

/* Remove the temporary folder, then free the checkpoint. */
static inline void tck_free(dcp_checkpoint *ck)
{
    for (size_t i = 0; i < ck->nfiles; i++)
        unlinkat(ck->dirfd, ck->files[i], 0);
    char *path = strdup(ck->path);
    dcp_close(ck);
    rmdir(path);
    free(path);
}

#endif
