/* The final copy into a rank's destination buffers: host memory through
 * libdcp's dcp_gfrag_place, or CUDA device memory through the device layer
 * (device.h: cudaMemcpyAsync, strided ops cudaMemcpy2DAsync) from pinned
 * staging buffers, or device-to-device from a device staging buffer (the
 * node's IPC delivery, ipc.c), on a few streams. No CUDA include here:
 * device_cuda.c (HAVE_CUDA) or the test-only device_fake.c does the calls;
 * everything before the final copy is shared by both paths. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "device.h"
#include "load.h"

#define LDI_NSTREAMS 2

struct ldi_dest {
    int cuda;
    const ldi_devops *ops;    /* the device layer (device.h), when cuda */
    int device;
    int caller_device;        /* the calling thread's device before open, restored by close */
    void *streams[LDI_NSTREAMS];
    int next;
    void **events;            /* one per staging slot */
    unsigned char *pending;   /* a copy was recorded on the slot's event */
    int nslots;
    unsigned char *scratch;   /* pinned: fixed-up elements before a device copy */
    size_t scratch_cap;
    unsigned char *scratch_src;   /* pinned: a fragment's bytes fetched from device memory */
    size_t scratch_src_cap;
};

static const char no_cuda[] = "dcp_load: this libdcpload was built without CUDA support";

int ldi_dest_open(int need_cuda, int device, int nslots, ldi_dest **out, dcp_error *err)
{
    ldi_dest *d = calloc(1, sizeof *d);
    if (!d)
        return ldi_err(err, ENOMEM, "dcp_load: out of memory");
    *out = d;
    if (!need_cuda)
        return 0;
    const ldi_devops *ops = ldi_devops_get();
    if (!ops)
        return ldi_err(err, ENOTSUP, "%s", no_cuda);
    /* the caller's thread is bound to our device for the call, then given
     * back its own (close) */
    if (ops->get_device(&d->caller_device, err) < 0)
        return -1;
    d->device = device;
    if (ops->set_device(device, err) < 0)
        return -1;
    d->ops = ops;
    d->cuda = 1;
    for (int i = 0; i < LDI_NSTREAMS; i++)
        if (ops->stream_create(&d->streams[i], err) < 0)
            return -1;
    d->events = calloc((size_t)nslots + 1, sizeof *d->events);
    d->pending = calloc((size_t)nslots + 1, 1);
    if (!d->events || !d->pending)
        return ldi_err(err, ENOMEM, "dcp_load: out of memory");
    for (int i = 0; i < nslots; i++) {
        if (ops->event_create(&d->events[i], err) < 0)
            return -1;
        d->nslots = i + 1;
    }
    return 0;
}

void ldi_dest_close(ldi_dest *d)
{
    if (!d)
        return;
    if (d->cuda) {
        const ldi_devops *ops = d->ops;
        for (int i = 0; i < d->nslots; i++)
            ops->event_destroy(d->events[i]);
        for (int i = 0; i < LDI_NSTREAMS; i++)
            if (d->streams[i])
                ops->stream_destroy(d->streams[i]);
        ops->host_free(d->scratch);
        ops->host_free(d->scratch_src);
        if (d->caller_device != d->device) {
            dcp_error e;
            ops->set_device(d->caller_device, &e);
        }
    }
    free(d->events);
    free(d->pending);
    free(d);
}

const ldi_devops *ldi_dest_ops(const ldi_dest *d)
{
    return d && d->cuda ? d->ops : NULL;
}

void *ldi_staging_alloc(ldi_dest *d, size_t n)
{
    if (d->cuda) {
        void *p = NULL;
        dcp_error e;
        return d->ops->host_alloc(&p, n, &e) == 0 ? p : NULL;
    }
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
    if (d->cuda) {
        d->ops->host_free(p);
        return;
    }
    free(p);
}

void ldi_staging_register(ldi_dest *d, void *p, size_t n)
{
    /* not fatal: copies from pageable memory are synchronous */
    if (d->cuda && p && n)
        (void)d->ops->host_register(p, n);
}

void ldi_staging_unregister(ldi_dest *d, void *p)
{
    if (d->cuda && p)
        d->ops->host_unregister(p);
}

/* A pinned scratch buffer of at least n bytes. */
static int scratch(ldi_dest *d, unsigned char **buf, size_t *cap, size_t n, dcp_error *err)
{
    if (*cap >= n)
        return 0;
    d->ops->host_free(*buf);
    *buf = NULL;
    *cap = 0;
    void *p = NULL;
    if (d->ops->host_alloc(&p, n, err) < 0)
        return -1;
    *buf = p;
    *cap = n;
    return 0;
}

/* One fragment to the device, from host memory (src_dev 0: a staging
 * buffer) or device memory (src_dev 1: a device staging buffer, this rank's
 * or a node peer's mapped by IPC). Elements needing a fix-up (byte swap,
 * conj, neg) are fixed in the pinned scratch buffer first (fetched from the
 * device first when they are there) and copied synchronously: a rare path
 * (big-endian or conj/neg records). */
static int device_place(ldi_dest *d, const dcp_op *sub, const unsigned char *src, int src_dev, void *region,
                        dcp_dtype dt, void *s, dcp_error *err)
{
    const ldi_devops *ops = d->ops;
    size_t esz = sub->elem_size, n = (size_t)(sub->length / esz);
    unsigned char *dst = (unsigned char *)region + sub->dest_offset;
    size_t pitch = n == 1 ? esz : (size_t)sub->dest_stride;
    if (sub->flags & (DCP_OP_BSWAP | DCP_OP_CONJ | DCP_OP_NEG)) {
        if (scratch(d, &d->scratch, &d->scratch_cap, (size_t)sub->length, err) < 0)
            return -1;
        if (src_dev) {
            /* copies queued on s read src too: they finish first */
            if (scratch(d, &d->scratch_src, &d->scratch_src_cap, (size_t)sub->length, err) < 0 ||
                ops->stream_sync(s, err) < 0 || ops->copy(d->scratch_src, src, (size_t)sub->length, LDI_D2H, err) < 0)
                return -1;
            src = d->scratch_src;
        }
        dcp_op c = *sub;
        c.dest_offset = 0;
        c.dest_stride = esz;
        dcp_op_place(&c, src, d->scratch, dt);
        if (pitch == esz)
            return ops->copy(dst, d->scratch, (size_t)sub->length, LDI_H2D, err);
        return ops->copy2d(dst, pitch, d->scratch, esz, esz, n, LDI_H2D, err);
    }
    ldi_copy_kind k = src_dev ? LDI_D2D : LDI_H2D;
    if (pitch == esz)
        return ops->copy_async(dst, src, (size_t)sub->length, k, s, err);
    return ops->copy2d_async(dst, pitch, src, esz, esz, n, k, s, err);
}

int ldi_dest_place(ldi_dest *d, const dcp_gplan *g, const dcp_greqs *r, const dcp_gfrag *f, size_t n,
                   const unsigned char *buf, int src_dev, int slot, dcp_error *err)
{
    int rc = 0, used_dev = 0;
    /* a stream only for device copies: the I/O threads place host-only units
     * here too, and must not touch the stream counter the main thread uses */
    void *s = NULL;
    for (size_t i = 0; i < n; i++) {
        const dcp_greq *q = &r->v[g->gops[f[i].gop].req];
        if (q->mem == DCP_LOAD_HOST && !src_dev) {   /* a run of host fragments: libdcp places them */
            size_t j = i + 1;
            while (j < n && r->v[g->gops[f[j].gop].req].mem == DCP_LOAD_HOST)
                j++;
            dcp_gfrag_place(g, r, f + i, j - i, buf);
            i = j - 1;
            continue;
        }
        if (!d->cuda || q->mem == DCP_LOAD_HOST) {
            /* host bytes from device memory: the plan never asks it (the device
             * path runs only when every destination is CUDA memory) */
            if (rc == 0)
                rc = ldi_err(err, ENOTSUP, "%s",
                             d->cuda ? "dcp_load: a host destination fed from device memory" : no_cuda);
            continue;
        }
        if (!used_dev)
            s = d->streams[d->next++ % LDI_NSTREAMS];
        used_dev = 1;
        dcp_op sub = dcp_gfrag_op(g, &f[i]);
        if (rc == 0 && device_place(d, &sub, buf + f[i].img, src_dev, q->dest, g->gops[f[i].gop].dtype, s, err) < 0)
            rc = -1;
    }
    if (used_dev) {
        if (slot >= 0 && slot < d->nslots) {
            if (d->ops->event_record(d->events[slot], s, rc == 0 ? err : &(dcp_error){0}) < 0 && rc == 0)
                rc = -1;
            d->pending[slot] = 1;
        } else if (d->ops->stream_sync(s, rc == 0 ? err : &(dcp_error){0}) < 0 && rc == 0) {
            rc = -1;
        }
    }
    return rc;
}

int ldi_dest_stage(ldi_dest *d, void *dev, const void *host, size_t n, int slot, dcp_error *err)
{
    if (!d->cuda || slot < 0 || slot >= d->nslots)
        return ldi_err(err, EINVAL, "dcp_load: no device staging for slot %d", slot);
    void *s = d->streams[d->next++ % LDI_NSTREAMS];
    if (d->ops->copy_async(dev, host, n, LDI_H2D, s, err) < 0 || d->ops->event_record(d->events[slot], s, err) < 0)
        return -1;
    d->pending[slot] = 1;
    return 0;
}

int ldi_dest_fence(ldi_dest *d, int slot, dcp_error *err)
{
    if (d->cuda && slot >= 0 && slot < d->nslots && d->pending[slot]) {
        d->pending[slot] = 0;
        return d->ops->event_sync(d->events[slot], err);
    }
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
    if (!d->cuda)
        return ldi_err(err, ENOTSUP, "%s", no_cuda);
    if (d->ops->memset_async(q->dest, 0, (size_t)q->nbytes, d->streams[0], err) < 0)
        return -1;
    return d->ops->stream_sync(d->streams[0], err);   /* before copies on other streams */
}

int ldi_dest_finish(ldi_dest *d, dcp_error *err)
{
    int rc = 0;
    if (d && d->cuda)
        for (int i = 0; i < LDI_NSTREAMS; i++)
            if (d->ops->stream_sync(d->streams[i], rc == 0 ? err : &(dcp_error){0}) < 0)
                rc = -1;
    return rc;
}

int ldi_cuda_pick(int local, int *device, char *msg, size_t cap)
{
    const ldi_devops *ops = ldi_devops_get();
    *device = -1;
    if (!ops) {
        snprintf(msg, cap, "this libdcpload was built without CUDA support");
        return -1;
    }
    int count = 0;
    if (ops->device_count(&count, msg, cap) < 0)
        return -1;
    *device = local % count;
    return 0;
}

int ldi_cuda_check_ptr(const void *p, int device, char *msg, size_t cap)
{
    const ldi_devops *ops = ldi_devops_get();
    if (!ops) {
        snprintf(msg, cap, "this libdcpload was built without CUDA support");
        return -1;
    }
    /* queried with the rank's device current, so that no context is made on
     * another (device 0 by default); the caller's device is given back */
    int prev = -1;
    dcp_error e;
    if (ops->get_device(&prev, &e) < 0 || (prev != device && ops->set_device(device, &e) < 0)) {
        snprintf(msg, cap, "cannot use device %d", device);
        return -1;
    }
    int rc = ops->check_ptr(p, device, msg, cap);
    if (prev != device)
        ops->set_device(prev, &e);
    return rc;
}

int dcp_load_have_cuda(void)
{
#ifdef HAVE_CUDA
    return 1;
#else
    return 0;
#endif
}
