/* A fake device layer (device.h) for tests on machines without a GPU.
 * TEST ONLY: selected by DCPLOAD_FAKE_DEVICE=1, never by default.
 *
 *  - Device buffers the loader allocates are POSIX shared memory objects
 *    ("/dcpload-fake-PID-N", mapped MAP_SHARED); an IPC handle carries the
 *    name and the size, and ipc_open maps the object in the peer process,
 *    so node peers really read each other's "device" buffers. The name is
 *    unlinked when the owner frees the buffer: a leak leaves it in /dev/shm.
 *    Opening a handle of one's own process fails, as cudaIpcOpenMemHandle
 *    does.
 *  - User buffers of DCP_LOAD_CUDA regions are ordinary host memory: any
 *    non-NULL pointer passes check_ptr.
 *  - Streams queue their copies and memsets; they run when the stream is
 *    synchronized or an event recorded after them is waited for (in stream
 *    order). A caller that forgets a wait reads stale bytes, and a test's
 *    digests catch it, as they would on a GPU.
 *  - DCPLOAD_FAKE_DEVICE_IPC_FAIL=get|open (1 means open) makes that IPC
 *    call fail, to test the fall-back to host messages.
 *  - DCPLOAD_FAKE_DEVICE_LOG=PATH appends one line per call:
 *    "PID CALL BYTES" (tests count allocations against frees and handle
 *    opens against closes; a refused IPC call logs CALL_refused).
 * One mutex serializes the whole fake (the loader calls it from its main
 * thread and its I/O thread). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "device.h"
#include "load.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local int current;   /* the thread's device (the fake has one: 0) */
static unsigned counter;

/* ------------------------------------------------------------ the log */

static void logf_(const char *call, size_t bytes)
{
    const char *path = getenv("DCPLOAD_FAKE_DEVICE_LOG");
    if (!path || !*path)
        return;
    char line[128];
    int n = snprintf(line, sizeof line, "%ld %s %zu\n", (long)getpid(), call, bytes);
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    if (n > 0 && (size_t)n < sizeof line && write(fd, line, (size_t)n) < 0) {
        /* a test log: nothing to do about a failed write */
    }
    close(fd);
}

static int ipc_fails(const char *which)
{
    const char *s = getenv("DCPLOAD_FAKE_DEVICE_IPC_FAIL");
    if (!s || !*s || !strcmp(s, "0"))
        return 0;
    if (!strcmp(s, "1"))
        s = "open";
    return !strcmp(s, which);
}

/* ------------------------------------------------------------ shared "device" buffers */

struct shmbuf {
    void *p;
    size_t n;
    int owned;            /* 1: allocated here (name to unlink), 0: a peer's, mapped by ipc_open */
    char name[48];
    struct shmbuf *next;
};
static struct shmbuf *bufs;

static struct shmbuf **find(const void *p)
{
    for (struct shmbuf **b = &bufs; *b; b = &(*b)->next)
        if ((*b)->p == p)
            return b;
    return NULL;
}

static int dev_alloc(void **p, size_t n, dcp_error *err)
{
    struct shmbuf *b = calloc(1, sizeof *b);
    if (!b)
        return ldi_err(err, ENOMEM, "fake device: out of memory");
    pthread_mutex_lock(&lock);
    snprintf(b->name, sizeof b->name, "/dcpload-fake-%ld-%u", (long)getpid(), counter++);
    pthread_mutex_unlock(&lock);
    int fd = shm_open(b->name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
        int e = errno;
        ldi_err(err, e, "fake device: shm_open %s: %s", b->name, strerror(e));
        free(b);
        return -1;
    }
    if (ftruncate(fd, (off_t)(n ? n : 1)) < 0 ||
        (b->p = mmap(NULL, n ? n : 1, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
        int e = errno;
        close(fd);
        shm_unlink(b->name);
        free(b);
        return ldi_err(err, e, "fake device: cannot map %zu bytes: %s", n, strerror(e));
    }
    close(fd);
    b->n = n ? n : 1;
    b->owned = 1;
    pthread_mutex_lock(&lock);
    b->next = bufs;
    bufs = b;
    pthread_mutex_unlock(&lock);
    *p = b->p;
    logf_("dev_alloc", n);
    return 0;
}

static void unmap(struct shmbuf *b)
{
    munmap(b->p, b->n);
    if (b->owned)
        shm_unlink(b->name);
    free(b);
}

static void dev_free(void *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&lock);
    struct shmbuf **at = find(p), *b = at ? *at : NULL;
    if (b)
        *at = b->next;
    pthread_mutex_unlock(&lock);
    if (b) {
        logf_("dev_free", b->n);
        unmap(b);
    }
}

static int ipc_get(void *p, ldi_ipc_handle *h, dcp_error *err)
{
    if (ipc_fails("get")) {
        logf_("ipc_get_refused", 0);
        return ldi_err(err, EIO, "fake device: ipc_get: failing as DCPLOAD_FAKE_DEVICE_IPC_FAIL asks");
    }
    logf_("ipc_get", 0);
    pthread_mutex_lock(&lock);
    struct shmbuf **at = find(p);
    memset(h, 0, sizeof *h);
    if (at && (*at)->owned) {
        uint64_t n = (*at)->n;
        memcpy(h->b, (*at)->name, sizeof (*at)->name);
        memcpy(h->b + sizeof (*at)->name, &n, sizeof n);
    }
    pthread_mutex_unlock(&lock);
    if (!at)
        return ldi_err(err, EINVAL, "fake device: ipc_get: %p is no device allocation", p);
    return 0;
}

static int ipc_open(const ldi_ipc_handle *h, void **p, dcp_error *err)
{
    if (ipc_fails("open")) {
        logf_("ipc_open_refused", 0);
        return ldi_err(err, EIO, "fake device: ipc_open: failing as DCPLOAD_FAKE_DEVICE_IPC_FAIL asks");
    }
    struct shmbuf *b = calloc(1, sizeof *b);
    if (!b)
        return ldi_err(err, ENOMEM, "fake device: out of memory");
    uint64_t n;
    memcpy(b->name, h->b, sizeof b->name);
    memcpy(&n, h->b + sizeof b->name, sizeof n);
    b->name[sizeof b->name - 1] = 0;
    long pid = 0;
    if (sscanf(b->name, "/dcpload-fake-%ld-", &pid) != 1 || n == 0 || n > SIZE_MAX) {
        free(b);
        return ldi_err(err, EINVAL, "fake device: ipc_open: not a handle");
    }
    if (pid == (long)getpid()) {   /* as CUDA: a process cannot open its own handle */
        free(b);
        return ldi_err(err, EINVAL, "fake device: ipc_open: a handle of this process");
    }
    int fd = shm_open(b->name, O_RDWR, 0);
    if (fd < 0) {
        int e = errno;
        ldi_err(err, e, "fake device: ipc_open %s: %s", b->name, strerror(e));
        free(b);
        return -1;
    }
    b->n = (size_t)n;
    b->p = mmap(NULL, b->n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (b->p == MAP_FAILED) {
        int e = errno;
        free(b);
        return ldi_err(err, e, "fake device: ipc_open: mmap: %s", strerror(e));
    }
    pthread_mutex_lock(&lock);
    b->next = bufs;
    bufs = b;
    pthread_mutex_unlock(&lock);
    *p = b->p;
    logf_("ipc_open", b->n);
    return 0;
}

static int ipc_close(void *p, dcp_error *err)
{
    logf_("ipc_close", 0);
    pthread_mutex_lock(&lock);
    struct shmbuf **at = find(p), *b = at && !(*at)->owned ? *at : NULL;
    if (b)
        *at = b->next;
    pthread_mutex_unlock(&lock);
    if (!b)
        return ldi_err(err, EINVAL, "fake device: ipc_close: %p was not opened by ipc_open", p);
    unmap(b);
    return 0;
}

/* ------------------------------------------------------------ devices, host memory */

static int device_count(int *count, char *msg, size_t cap)
{
    (void)msg;
    (void)cap;
    *count = 1;
    return 0;
}

static int get_device(int *device, dcp_error *err)
{
    (void)err;
    *device = current;
    return 0;
}

static int set_device(int device, dcp_error *err)
{
    if (device != 0)
        return ldi_err(err, ENODEV, "fake device: cudaSetDevice: no device %d (the fake has one)", device);
    current = device;
    logf_("set_device", 0);
    return 0;
}

static int check_ptr(const void *p, int device, char *msg, size_t cap)
{
    if (!p || device != 0) {
        snprintf(msg, cap, "the buffer is not device memory");
        return -1;
    }
    return 0;
}

static int host_alloc(void **p, size_t n, dcp_error *err)
{
    if (posix_memalign(p, 4096, n ? n : 1) != 0)
        return ldi_err(err, ENOMEM, "fake device: cudaHostAlloc of %zu bytes failed", n);
    logf_("host_alloc", n);
    return 0;
}

static void host_free(void *p)
{
    if (!p)
        return;
    logf_("host_free", 0);
    free(p);
}

static int host_register(void *p, size_t n)
{
    (void)p;
    logf_("host_register", n);
    return 0;
}

/* DCPLOAD_FAKE_DEVICE_REGISTER_FAIL=1: refused, as a runtime without
 * read-only registration would (the unit is then read as usual). */
static int host_register_ro(void *p, size_t n)
{
    (void)p;
    const char *s = getenv("DCPLOAD_FAKE_DEVICE_REGISTER_FAIL");
    if (s && !strcmp(s, "1")) {
        logf_("host_register_ro_refused", n);
        return -1;
    }
    logf_("host_register_ro", n);
    return 0;
}

static void host_unregister(void *p)
{
    (void)p;
    logf_("host_unregister", 0);
}

/* ------------------------------------------------------------ streams and events */

struct op {
    void *dst;
    const void *src;      /* NULL: a memset of value v */
    size_t dpitch, spitch, width, rows;
    int v;
};

struct stream {
    struct op *q;
    size_t n, cap;        /* queued, not yet run */
    uint64_t done;        /* ops run since creation */
};

struct event {
    struct stream *s;     /* NULL: never recorded (a wait returns at once, as in CUDA) */
    uint64_t upto;        /* the stream's op count when recorded */
};

static void run(struct stream *s, uint64_t upto)
{
    size_t k = 0;
    while (k < s->n && s->done < upto) {
        struct op *o = &s->q[k++];
        for (size_t r = 0; r < o->rows; r++) {
            unsigned char *d = (unsigned char *)o->dst + r * o->dpitch;
            if (o->src)
                memmove(d, (const unsigned char *)o->src + r * o->spitch, o->width);
            else
                memset(d, o->v, o->width);
        }
        s->done++;
    }
    memmove(s->q, s->q + k, (s->n - k) * sizeof *s->q);
    s->n -= k;
}

static int enqueue(struct stream *s, const struct op *o, dcp_error *err)
{
    int rc = 0;
    pthread_mutex_lock(&lock);
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 16;
        struct op *q = realloc(s->q, cap * sizeof *q);
        if (!q)
            rc = ldi_err(err, ENOMEM, "fake device: out of memory");
        else {
            s->q = q;
            s->cap = cap;
        }
    }
    if (rc == 0)
        s->q[s->n++] = *o;
    pthread_mutex_unlock(&lock);
    return rc;
}

static int stream_create(void **out, dcp_error *err)
{
    struct stream *s = calloc(1, sizeof *s);
    if (!s)
        return ldi_err(err, ENOMEM, "fake device: out of memory");
    *out = s;
    logf_("stream_create", 0);
    return 0;
}

static void stream_destroy(void *p)
{
    struct stream *s = p;
    if (!s)
        return;
    logf_("stream_destroy", 0);
    pthread_mutex_lock(&lock);
    run(s, UINT64_MAX);   /* as CUDA: queued work still completes */
    pthread_mutex_unlock(&lock);
    free(s->q);
    free(s);
}

static int stream_sync(void *p, dcp_error *err)
{
    (void)err;
    pthread_mutex_lock(&lock);
    run(p, UINT64_MAX);
    pthread_mutex_unlock(&lock);
    return 0;
}

static int event_create(void **out, dcp_error *err)
{
    struct event *e = calloc(1, sizeof *e);
    if (!e)
        return ldi_err(err, ENOMEM, "fake device: out of memory");
    *out = e;
    return 0;
}

static void event_destroy(void *e)
{
    free(e);
}

static int event_record(void *pe, void *ps, dcp_error *err)
{
    (void)err;
    struct event *e = pe;
    struct stream *s = ps;
    pthread_mutex_lock(&lock);
    e->s = s;
    e->upto = s->done + s->n;
    pthread_mutex_unlock(&lock);
    return 0;
}

static int event_sync(void *pe, dcp_error *err)
{
    (void)err;
    struct event *e = pe;
    pthread_mutex_lock(&lock);
    if (e->s)
        run(e->s, e->upto);
    pthread_mutex_unlock(&lock);
    return 0;
}

static const char *kind_name(ldi_copy_kind k)
{
    return k == LDI_H2D ? "copy_h2d" : k == LDI_D2D ? "copy_d2d" : "copy_d2h";
}

static int copy2d_async(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows,
                        ldi_copy_kind k, void *s, dcp_error *err)
{
    logf_(kind_name(k), width * rows);
    struct op o = {.dst = dst, .src = src, .dpitch = dpitch, .spitch = spitch, .width = width, .rows = rows};
    return enqueue(s, &o, err);
}

static int copy_async(void *dst, const void *src, size_t n, ldi_copy_kind k, void *s, dcp_error *err)
{
    return copy2d_async(dst, n, src, n, n, 1, k, s, err);
}

static int copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows,
                  ldi_copy_kind k, dcp_error *err)
{
    (void)err;
    logf_(kind_name(k), width * rows);
    for (size_t r = 0; r < rows; r++)
        memmove((unsigned char *)dst + r * dpitch, (const unsigned char *)src + r * spitch, width);
    return 0;
}

static int copy(void *dst, const void *src, size_t n, ldi_copy_kind k, dcp_error *err)
{
    return copy2d(dst, n, src, n, n, 1, k, err);
}

static int memset_async(void *p, int v, size_t n, void *s, dcp_error *err)
{
    logf_("memset", n);
    struct op o = {.dst = p, .v = v, .dpitch = n, .width = n, .rows = 1};
    return enqueue(s, &o, err);
}

const ldi_devops ldi_devops_fake = {
    .name = "fake",
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

const ldi_devops *ldi_devops_get(void)
{
    const char *s = getenv("DCPLOAD_FAKE_DEVICE");
    if (s && !strcmp(s, "1"))
        return &ldi_devops_fake;
#ifdef HAVE_CUDA
    return &ldi_devops_cuda;
#else
    return NULL;
#endif
}
