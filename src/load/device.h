/* The loader's device layer: every call libdcpload makes to a GPU runtime
 * goes through one table of operations, ldi_devops. Two implementations:
 *
 *   device_cuda.c  the CUDA runtime (built only with HAVE_CUDA);
 *   device_fake.c  a stand-in for tests on machines without a GPU (always
 *                  built; TEST ONLY, selected by DCPLOAD_FAKE_DEVICE=1).
 *                  "Device memory" is host memory: buffers the loader
 *                  allocates are POSIX shared memory objects, so an IPC
 *                  handle names one (shm_open by name) and a node peer maps
 *                  it for real; streams queue their copies and run them only
 *                  when the stream or an event recorded on it is waited
 *                  for, so a missing wait shows up as wrong bytes; IPC can
 *                  be made to fail (DCPLOAD_FAKE_DEVICE_IPC_FAIL=1) and
 *                  every call can be logged (DCPLOAD_FAKE_DEVICE_LOG=PATH,
 *                  one line per call, appended). A user buffer of a
 *                  DCP_LOAD_CUDA region is any host memory under the fake.
 *
 * The loader makes the same calls in the same order through either table,
 * so the fake exercises the delivery logic (dest.c, ipc.c, exec.c) across
 * real MPI processes.
 *
 * Conventions: calls returning int give 0, or -1 with err filled (naming the
 * runtime call and its reason). Streams and events are opaque pointers.
 * Device state is per thread, as in the CUDA runtime: set_device binds the
 * calling thread. */
#ifndef DCP_LOAD_DEVICE_H
#define DCP_LOAD_DEVICE_H

#include <stddef.h>

#include "dcp.h"

/* The size of an IPC handle (cudaIpcMemHandle_t is 64 bytes). */
#define LDI_IPC_HANDLE_BYTES 64
typedef struct ldi_ipc_handle {
    unsigned char b[LDI_IPC_HANDLE_BYTES];
} ldi_ipc_handle;

/* Direction of a copy (the CUDA implementation passes the matching
 * cudaMemcpyKind; device pointers include IPC-mapped peer memory). */
typedef enum ldi_copy_kind { LDI_H2D = 1, LDI_D2D = 2, LDI_D2H = 3 } ldi_copy_kind;

typedef struct ldi_devops {
    const char *name;   /* "cuda" or "fake" */
    /* Devices visible to this process (> 0), or -1 with the reason in msg. */
    int (*device_count)(int *count, char *msg, size_t cap);
    int (*get_device)(int *device, dcp_error *err);
    int (*set_device)(int device, dcp_error *err);
    /* Is p device memory usable from `device` (its own, or managed)? 0, or
     * -1 with the reason in msg. The caller makes `device` current. */
    int (*check_ptr)(const void *p, int device, char *msg, size_t cap);

    int (*dev_alloc)(void **p, size_t n, dcp_error *err);    /* device memory */
    void (*dev_free)(void *p);
    int (*host_alloc)(void **p, size_t n, dcp_error *err);   /* pinned host memory */
    void (*host_free)(void *p);
    /* Pin (page-lock) existing host memory, best effort: 0 or -1. */
    int (*host_register)(void *p, size_t n);
    /* Page-lock a read-only mapping (a shard file's pages, mapped.c) for
     * device copies out of it: 0 or -1 (not supported, or refused). */
    int (*host_register_ro)(void *p, size_t n);
    void (*host_unregister)(void *p);

    int (*stream_create)(void **s, dcp_error *err);
    void (*stream_destroy)(void *s);
    int (*stream_sync)(void *s, dcp_error *err);
    int (*event_create)(void **e, dcp_error *err);
    void (*event_destroy)(void *e);
    int (*event_record)(void *e, void *s, dcp_error *err);
    int (*event_sync)(void *e, dcp_error *err);

    /* Asynchronous on s: n bytes, or n rows of `width` bytes (dst rows
     * dpitch apart, src rows spitch apart). Synchronous: copy, memset. */
    int (*copy_async)(void *dst, const void *src, size_t n, ldi_copy_kind k, void *s, dcp_error *err);
    int (*copy2d_async)(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows,
                        ldi_copy_kind k, void *s, dcp_error *err);
    int (*copy)(void *dst, const void *src, size_t n, ldi_copy_kind k, dcp_error *err);
    int (*copy2d)(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows,
                  ldi_copy_kind k, dcp_error *err);
    int (*memset_async)(void *p, int v, size_t n, void *s, dcp_error *err);

    /* IPC: export a dev_alloc'd buffer; map a peer process's export (the
     * mapping of its first byte); unmap. A failure is not fatal to a load:
     * the loader falls back to host messages (ipc.c). */
    int (*ipc_get)(void *p, ldi_ipc_handle *h, dcp_error *err);
    int (*ipc_open)(const ldi_ipc_handle *h, void **p, dcp_error *err);
    int (*ipc_close)(void *p, dcp_error *err);
} ldi_devops;

/* The table this process uses: the fake when DCPLOAD_FAKE_DEVICE=1 (read
 * once), else CUDA when built with it, else NULL (no device path). */
const ldi_devops *ldi_devops_get(void);

#ifdef HAVE_CUDA
extern const ldi_devops ldi_devops_cuda;
#endif
extern const ldi_devops ldi_devops_fake;

#endif
