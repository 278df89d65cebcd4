/* The device layer (device.h) over the CUDA runtime. Compiled only with
 * HAVE_CUDA; the only file of libdcpload that includes cuda_runtime.h. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime.h>

#include "device.h"
#include "load.h"

_Static_assert(sizeof(cudaIpcMemHandle_t) == LDI_IPC_HANDLE_BYTES, "cudaIpcMemHandle_t is 64 bytes");

static int fail(dcp_error *err, cudaError_t e, const char *what)
{
    cudaGetLastError();   /* clear a non-sticky error so later calls are not blamed for it */
    return ldi_err(err, EIO, "CUDA: %s: %s", what, cudaGetErrorString(e));
}

#define CHECK(call, what)                  \
    do {                                   \
        cudaError_t e_ = (call);           \
        if (e_ != cudaSuccess)             \
            return fail(err, e_, what);    \
    } while (0)

static enum cudaMemcpyKind kind(ldi_copy_kind k)
{
    return k == LDI_H2D ? cudaMemcpyHostToDevice : k == LDI_D2H ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice;
}

static int device_count(int *count, char *msg, size_t cap)
{
    cudaError_t e = cudaGetDeviceCount(count);
    if (e != cudaSuccess) {
        snprintf(msg, cap, "no usable GPU (%s)", cudaGetErrorString(e));
        return -1;
    }
    if (*count <= 0) {
        snprintf(msg, cap, "no usable GPU (no CUDA device found)");
        return -1;
    }
    return 0;
}

static int get_device(int *device, dcp_error *err)
{
    CHECK(cudaGetDevice(device), "cudaGetDevice");
    return 0;
}

static int set_device(int device, dcp_error *err)
{
    CHECK(cudaSetDevice(device), "cudaSetDevice");
    return 0;
}

static int check_ptr(const void *p, int device, char *msg, size_t cap)
{
    struct cudaPointerAttributes a;
    cudaError_t e = cudaPointerGetAttributes(&a, p);
    if (e != cudaSuccess) {
        cudaGetLastError();   /* clear the sticky error of a host pointer */
        snprintf(msg, cap, "the buffer is not CUDA memory (%s)", cudaGetErrorString(e));
        return -1;
    }
    if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged) {
        snprintf(msg, cap, "the buffer is not device memory");
        return -1;
    }
    /* managed memory is usable from every device; device memory only from its own */
    if (a.type == cudaMemoryTypeDevice && a.device != device) {
        snprintf(msg, cap, "the buffer is on device %d, this rank loads to device %d", a.device, device);
        return -1;
    }
    return 0;
}

static int dev_alloc(void **p, size_t n, dcp_error *err)
{
    CHECK(cudaMalloc(p, n), "cudaMalloc");
    return 0;
}

static void dev_free(void *p)
{
    if (p)
        cudaFree(p);
}

static int host_alloc(void **p, size_t n, dcp_error *err)
{
    CHECK(cudaHostAlloc(p, n, cudaHostAllocDefault), "cudaHostAlloc");
    return 0;
}

static void host_free(void *p)
{
    if (p)
        cudaFreeHost(p);
}

static int host_register(void *p, size_t n)
{
    if (cudaHostRegister(p, n, cudaHostRegisterPortable) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return 0;
}

static int host_register_ro(void *p, size_t n)
{
#ifdef cudaHostRegisterReadOnly   /* CUDA 11.1 and later */
    if (cudaHostRegister(p, n, cudaHostRegisterPortable | cudaHostRegisterReadOnly) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return 0;
#else
    (void)p, (void)n;
    return -1;
#endif
}

static void host_unregister(void *p)
{
    if (cudaHostUnregister(p) != cudaSuccess)
        cudaGetLastError();   /* it was not registered */
}

static int stream_create(void **s, dcp_error *err)
{
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreate");
    *s = st;
    return 0;
}

static void stream_destroy(void *s)
{
    if (s)
        cudaStreamDestroy((cudaStream_t)s);
}

static int stream_sync(void *s, dcp_error *err)
{
    CHECK(cudaStreamSynchronize((cudaStream_t)s), "cudaStreamSynchronize");
    return 0;
}

static int event_create(void **ev, dcp_error *err)
{
    cudaEvent_t e;
    CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    *ev = e;
    return 0;
}

static void event_destroy(void *ev)
{
    if (ev)
        cudaEventDestroy((cudaEvent_t)ev);
}

static int event_record(void *ev, void *s, dcp_error *err)
{
    CHECK(cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)s), "cudaEventRecord");
    return 0;
}

static int event_sync(void *ev, dcp_error *err)
{
    CHECK(cudaEventSynchronize((cudaEvent_t)ev), "cudaEventSynchronize");
    return 0;
}

static int copy_async(void *dst, const void *src, size_t n, ldi_copy_kind k, void *s, dcp_error *err)
{
    CHECK(cudaMemcpyAsync(dst, src, n, kind(k), (cudaStream_t)s), "cudaMemcpyAsync");
    return 0;
}

static int copy2d_async(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows,
                        ldi_copy_kind k, void *s, dcp_error *err)
{
    CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, kind(k), (cudaStream_t)s), "cudaMemcpy2DAsync");
    return 0;
}

static int copy(void *dst, const void *src, size_t n, ldi_copy_kind k, dcp_error *err)
{
    CHECK(cudaMemcpy(dst, src, n, kind(k)), "cudaMemcpy");
    return 0;
}

static int copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows,
                  ldi_copy_kind k, dcp_error *err)
{
    CHECK(cudaMemcpy2D(dst, dpitch, src, spitch, width, rows, kind(k)), "cudaMemcpy2D");
    return 0;
}

static int memset_async(void *p, int v, size_t n, void *s, dcp_error *err)
{
    CHECK(cudaMemsetAsync(p, v, n, (cudaStream_t)s), "cudaMemsetAsync");
    return 0;
}

static int ipc_get(void *p, ldi_ipc_handle *h, dcp_error *err)
{
    cudaIpcMemHandle_t c;
    CHECK(cudaIpcGetMemHandle(&c, p), "cudaIpcGetMemHandle");
    memcpy(h->b, &c, sizeof c);
    return 0;
}

static int ipc_open(const ldi_ipc_handle *h, void **p, dcp_error *err)
{
    cudaIpcMemHandle_t c;
    memcpy(&c, h->b, sizeof c);
    /* a peer on another device of the node is mapped with peer access */
    CHECK(cudaIpcOpenMemHandle(p, c, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
    return 0;
}

static int ipc_close(void *p, dcp_error *err)
{
    CHECK(cudaIpcCloseMemHandle(p), "cudaIpcCloseMemHandle");
    return 0;
}

const ldi_devops ldi_devops_cuda = {
    .name = "cuda",
    .device_count = device_count,
    .get_device = get_device,
    .set_device = set_device,
    .check_ptr = check_ptr,
    .dev_alloc = dev_alloc,
    .dev_free = dev_free,
    .host_alloc = host_alloc,
    .host_free = host_free,
    .host_register = host_register,
    .host_register_ro = host_register_ro,
    .host_unregister = host_unregister,
    .stream_create = stream_create,
    .stream_destroy = stream_destroy,
    .stream_sync = stream_sync,
    .event_create = event_create,
    .event_destroy = event_destroy,
    .event_record = event_record,
    .event_sync = event_sync,
    .copy_async = copy_async,
    .copy2d_async = copy2d_async,
    .copy = copy,
    .copy2d = copy2d,
    .memset_async = memset_async,
    .ipc_get = ipc_get,
    .ipc_open = ipc_open,
    .ipc_close = ipc_close,
};
