/* The final copy into a rank's destination buffers: host memory through
 * libdcp's dcp_gfrag_place, or CUDA device memory through cudaMemcpyAsync
 * (strided ops: cudaMemcpy2DAsync) from pinned staging buffers on a few
 * streams. Only this file knows CUDA, and only when HAVE_CUDA is defined;
 * everything before the final copy is shared by both paths. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#ifdef HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "load.h"

#define LDI_NSTREAMS 2

struct ldi_dest {
    int cuda;
#ifdef HAVE_CUDA
    int device;
    int caller_device;        /* the calling thread's device before open, restored by close */
    cudaStream_t streams[LDI_NSTREAMS];
    int next;
    cudaEvent_t *events;      /* one per staging slot */
    unsigned char *pending;   /* a copy was recorded on the slot's event */
    int nslots;
    unsigned char *scratch;   /* pinned: fixed-up elements before a CUDA copy */
    size_t scratch_cap;
#endif
};

#ifdef HAVE_CUDA
static int cuda_fail(dcp_error *err, cudaError_t e, const char *what)
{
    return ldi_err(err, EIO, "CUDA: %s: %s", what, cudaGetErrorString(e));
}
#endif

int ldi_dest_open(int need_cuda, int device, int nslots, ldi_dest **out, dcp_error *err)
{
    ldi_dest *d = calloc(1, sizeof *d);
    if (!d)
        return ldi_err(err, ENOMEM, "dcp_load: out of memory");
    *out = d;
    if (!need_cuda)
        return 0;
#ifdef HAVE_CUDA
    /* the caller's thread is bound to our device for the call, then given
     * back its own (close) */
    cudaError_t e = cudaGetDevice(&d->caller_device);
    if (e != cudaSuccess)
        return cuda_fail(err, e, "cudaGetDevice");
    d->device = device;
    if ((e = cudaSetDevice(device)) != cudaSuccess)
        return cuda_fail(err, e, "cudaSetDevice");
    d->cuda = 1;
    for (int i = 0; i < LDI_NSTREAMS; i++)
        if ((e = cudaStreamCreateWithFlags(&d->streams[i], cudaStreamNonBlocking)) != cudaSuccess)
            return cuda_fail(err, e, "cudaStreamCreate");
    d->events = calloc((size_t)nslots + 1, sizeof *d->events);
    d->pending = calloc((size_t)nslots + 1, 1);
    if (!d->events || !d->pending)
        return ldi_err(err, ENOMEM, "dcp_load: out of memory");
    for (int i = 0; i < nslots; i++) {
        if ((e = cudaEventCreateWithFlags(&d->events[i], cudaEventDisableTiming)) != cudaSuccess)
            return cuda_fail(err, e, "cudaEventCreate");
        d->nslots = i + 1;
    }
    return 0;
#else
    (void)device;
    (void)nslots;
    return ldi_err(err, ENOTSUP, "dcp_load: this libdcpload was built without CUDA support");
#endif
}

void ldi_dest_close(ldi_dest *d)
{
    if (!d)
        return;
#ifdef HAVE_CUDA
    if (d->cuda) {
        for (int i = 0; i < d->nslots; i++)
            cudaEventDestroy(d->events[i]);
        for (int i = 0; i < LDI_NSTREAMS; i++)
            if (d->streams[i])
                cudaStreamDestroy(d->streams[i]);
        if (d->scratch)
            cudaFreeHost(d->scratch);
        if (d->caller_device != d->device)
            cudaSetDevice(d->caller_device);
    }
    free(d->events);
    free(d->pending);
#endif
    free(d);
}

void *ldi_staging_alloc(ldi_dest *d, size_t n)
{
#ifdef HAVE_CUDA
    if (d->cuda) {
        void *p = NULL;
        return cudaHostAlloc(&p, n, cudaHostAllocDefault) == cudaSuccess ? p : NULL;
    }
#else
    (void)d;
#endif
    /* 2 MiB-aligned in huge pages: node peers copy units out of it through
     * process_vm_readv, which pins each source page (see dcpload's host_alloc) */
    size_t huge = (size_t)2 << 20;
    void *p = NULL;
    if (posix_memalign(&p, n < huge ? 4096 : huge, n) != 0)
        return NULL;
    if (n >= huge)
        (void)madvise(p, n, MADV_HUGEPAGE);
    return p;
}

void ldi_staging_free(ldi_dest *d, void *p)
{
    if (!p)
        return;
#ifdef HAVE_CUDA
    if (d->cuda) {
        cudaFreeHost(p);
        return;
    }
#else
    (void)d;
#endif
    free(p);
}

void ldi_staging_register(ldi_dest *d, void *p, size_t n)
{
#ifdef HAVE_CUDA
    if (d->cuda && p && n && cudaHostRegister(p, n, cudaHostRegisterPortable) != cudaSuccess)
        cudaGetLastError();   /* not fatal: copies from pageable memory are synchronous */
#else
    (void)d;
    (void)p;
    (void)n;
#endif
}

void ldi_staging_unregister(ldi_dest *d, void *p)
{
#ifdef HAVE_CUDA
    if (d->cuda && p && cudaHostUnregister(p) != cudaSuccess)
        cudaGetLastError();   /* it was not registered */
#else
    (void)d;
    (void)p;
#endif
}

#ifdef HAVE_CUDA
/* One fragment to the device. Elements needing a fix-up (byte swap, conj,
 * neg) are fixed in the pinned scratch buffer first and copied synchronously:
 * a rare path (big-endian or conj/neg records). */
static int cuda_place(ldi_dest *d, const dcp_op *sub, const unsigned char *src, void *region,
                      dcp_dtype dt, cudaStream_t s, dcp_error *err)
{
    size_t esz = sub->elem_size, n = (size_t)(sub->length / esz);
    unsigned char *dst = (unsigned char *)region + sub->dest_offset;
    size_t pitch = n == 1 ? esz : (size_t)sub->dest_stride;
    cudaError_t e;
    if (sub->flags & (DCP_OP_BSWAP | DCP_OP_CONJ | DCP_OP_NEG)) {
        if (d->scratch_cap < sub->length) {
            if (d->scratch)
                cudaFreeHost(d->scratch);
            d->scratch = NULL;
            d->scratch_cap = 0;
            if ((e = cudaHostAlloc((void **)&d->scratch, (size_t)sub->length, cudaHostAllocDefault)) != cudaSuccess)
                return cuda_fail(err, e, "cudaHostAlloc");
            d->scratch_cap = (size_t)sub->length;
        }
        dcp_op c = *sub;
        c.dest_offset = 0;
        c.dest_stride = esz;
        dcp_op_place(&c, src, d->scratch, dt);
        if (pitch == esz)
            e = cudaMemcpy(dst, d->scratch, (size_t)sub->length, cudaMemcpyHostToDevice);
        else
            e = cudaMemcpy2D(dst, pitch, d->scratch, esz, esz, n, cudaMemcpyHostToDevice);
        return e == cudaSuccess ? 0 : cuda_fail(err, e, "cudaMemcpy");
    }
    if (pitch == esz)
        e = cudaMemcpyAsync(dst, src, (size_t)sub->length, cudaMemcpyHostToDevice, s);
    else
        e = cudaMemcpy2DAsync(dst, pitch, src, esz, esz, n, cudaMemcpyHostToDevice, s);
    return e == cudaSuccess ? 0 : cuda_fail(err, e, "cudaMemcpyAsync");
}
#endif

int ldi_dest_place(ldi_dest *d, const dcp_gplan *g, const dcp_greqs *r, const dcp_gfrag *f, size_t n,
                   const unsigned char *buf, int slot, dcp_error *err)
{
    int rc = 0, used_cuda = 0;
#ifdef HAVE_CUDA
    cudaStream_t s = d->cuda ? d->streams[d->next++ % LDI_NSTREAMS] : 0;
#endif
    for (size_t i = 0; i < n; i++) {
        const dcp_greq *q = &r->v[g->gops[f[i].gop].req];
        if (q->mem == DCP_LOAD_HOST) {   /* a run of host fragments: libdcp places them */
            size_t j = i + 1;
            while (j < n && r->v[g->gops[f[j].gop].req].mem == DCP_LOAD_HOST)
                j++;
            dcp_gfrag_place(g, r, f + i, j - i, buf);
            i = j - 1;
            continue;
        }
#ifdef HAVE_CUDA
        used_cuda = 1;
        dcp_op sub = dcp_gfrag_op(g, &f[i]);
        if (rc == 0 && cuda_place(d, &sub, buf + f[i].img, q->dest, g->gops[f[i].gop].dtype, s, err) < 0)
            rc = -1;
#else
        if (rc == 0)
            rc = ldi_err(err, ENOTSUP, "dcp_load: this libdcpload was built without CUDA support");
#endif
    }
#ifdef HAVE_CUDA
    if (used_cuda) {
        cudaError_t e;
        if (slot >= 0 && slot < d->nslots) {
            if ((e = cudaEventRecord(d->events[slot], s)) != cudaSuccess && rc == 0)
                rc = cuda_fail(err, e, "cudaEventRecord");
            d->pending[slot] = 1;
        } else if ((e = cudaStreamSynchronize(s)) != cudaSuccess && rc == 0) {
            rc = cuda_fail(err, e, "cudaStreamSynchronize");
        }
    }
#else
    (void)d;
    (void)slot;
    (void)used_cuda;
#endif
    return rc;
}

int ldi_dest_fence(ldi_dest *d, int slot, dcp_error *err)
{
#ifdef HAVE_CUDA
    if (d->cuda && slot >= 0 && slot < d->nslots && d->pending[slot]) {
        d->pending[slot] = 0;
        cudaError_t e = cudaEventSynchronize(d->events[slot]);
        if (e != cudaSuccess)
            return cuda_fail(err, e, "cudaEventSynchronize");
    }
#else
    (void)d;
    (void)slot;
    (void)err;
#endif
    return 0;
}

int ldi_dest_zero(ldi_dest *d, const dcp_greq *q, dcp_error *err)
{
    if (!q->nbytes)
        return 0;
    if (q->mem == DCP_LOAD_HOST) {
        memset(q->dest, 0, (size_t)q->nbytes);
        return 0;
    }
#ifdef HAVE_CUDA
    cudaError_t e = cudaMemsetAsync(q->dest, 0, (size_t)q->nbytes, d->streams[0]);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(d->streams[0]);   /* before copies on other streams */
    return e == cudaSuccess ? 0 : cuda_fail(err, e, "cudaMemset");
#else
    (void)d;
    return ldi_err(err, ENOTSUP, "dcp_load: this libdcpload was built without CUDA support");
#endif
}

int ldi_dest_finish(ldi_dest *d, dcp_error *err)
{
#ifdef HAVE_CUDA
    int rc = 0;
    if (d && d->cuda)
        for (int i = 0; i < LDI_NSTREAMS; i++) {
            cudaError_t e = cudaStreamSynchronize(d->streams[i]);
            if (e != cudaSuccess && rc == 0)
                rc = cuda_fail(err, e, "cudaStreamSynchronize");
        }
    return rc;
#else
    (void)d;
    (void)err;
    return 0;
#endif
}

int ldi_cuda_pick(int local, int *device, char *msg, size_t cap)
{
#ifdef HAVE_CUDA
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        snprintf(msg, cap, "no usable GPU (%s)", cudaGetErrorString(e));
        return -1;
    }
    if (count <= 0) {
        snprintf(msg, cap, "no usable GPU (no CUDA device found)");
        return -1;
    }
    *device = local % count;
    return 0;
#else
    (void)local;
    *device = -1;
    snprintf(msg, cap, "this libdcpload was built without CUDA support");
    return -1;
#endif
}

int ldi_cuda_check_ptr(const void *p, int device, char *msg, size_t cap)
{
#ifdef HAVE_CUDA
    /* queried with the rank's device current, so that no context is made on
     * another (device 0 by default); the caller's device is given back */
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess || (prev != device && cudaSetDevice(device) != cudaSuccess)) {
        cudaGetLastError();
        snprintf(msg, cap, "cannot use device %d", device);
        return -1;
    }
    struct cudaPointerAttributes a;
    cudaError_t e = cudaPointerGetAttributes(&a, p);
    if (prev != device)
        cudaSetDevice(prev);
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
#else
    (void)p;
    (void)device;
    snprintf(msg, cap, "this libdcpload was built without CUDA support");
    return -1;
#endif
}

int dcp_load_have_cuda(void)
{
#ifdef HAVE_CUDA
    return 1;
#else
    return 0;
#endif
}
