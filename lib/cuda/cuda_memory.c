/* CUDA memory owners: device allocations made or adopted here, and pinned host memory (see
 * <orbite/orbite.h>, "CUDA memory owners"). Every driver call that needs a context runs in the
 * device's primary context, made current for it and the caller's own restored after. */
#include <orbite/orbite.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"
#include "cuda/cuda.h"
#include "cuda/cuda_memory.h"

/* Producer readiness (orb_cuda_memory_record_producer, orb_cuda_host_record_producer): one event
 * per owner, shared by its aliases, recorded on the producer's stream; the first access waits
 * for the recorded generation once. */
struct readiness {
    orb_cu_context ctx;                /* the owner's context, device and name (for messages) */
    int device;
    char what[96];
    pthread_mutex_t lock;
    orb_cu_event event;                /* made on the first record, in the owner's context */
    uint64_t recorded, consumed;       /* generations */
    bool fenced;                       /* a record or wait whose end is not proven */
    void (*done)(void *ctx);           /* the pending generation's, run once it is proven */
    void *done_ctx;
};

struct orb_cuda_memory {
    atomic_uint refs;                  /* changed from 0 only under g_lock (aliases find it) */
    int device;
    orb_cu_context ctx;                /* the device's primary context: one retain held */
    orb_cu_deviceptr base;
    size_t size;
    bool allocated;                    /* here: cuMemFree at the end; else `release` */
    orb_release_fn release;
    void *release_ctx;
    struct orb_cuda_memory *next;      /* g_owners */
    /* Copies (cuda_memory.h), one at a time under copy_lock: */
    pthread_mutex_t copy_lock;
    orb_cu_stream stream;              /* made on the first copy */
    orb_cu_event done;
    bool fenced;                       /* a copy's end was not proven: kept for good */
    struct readiness ready;
    /* Range loans (cuda_memory.h), under loan_lock: */
    pthread_mutex_t loan_lock;
    struct orb_cuda_loan *loans;
    uint64_t serial;                   /* this process's number for the owner, never reused */
};

struct orb_cuda_loan {
    struct orb_cuda_loan *next;
    orb_cuda_memory *mem;
    size_t offset, len;
    int writes;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct orb_cuda_memory *g_owners; /* every live owner: one per allocation */
static struct orb_cuda_memory *g_kept;   /* owners whose free the driver refused: kept for good */
static struct orb_cuda_retained g_retained;

/* The driver's failure `rc` of `what` as an ORB_E* status with its message. */
static int cuda_fail(const struct orb_cuda *cu, orb_cu_result rc, const char *what)
{
    char text[160];
    return orb_fail(orb_cuda_status(rc), "cuda: %s: %s", what, orb_cuda_describe(cu, rc, text, sizeof text));
}

/* The driver table, and device `device`'s primary context retained, into *cu_out and *ctx_out. */
static int open_device(int device, const struct orb_cuda **cu_out, orb_cu_context *ctx_out)
{
    const struct orb_cuda *cu = NULL;
    int rc = orb_cuda_get(&cu);
    if (rc != 0)
        return rc;
    int count = 0;
    orb_cu_result r = cu->device_get_count(&count);
    if (r != ORB_CU_SUCCESS)
        return cuda_fail(cu, r, "cuDeviceGetCount");
    if (device < 0 || device >= count)
        return orb_fail(ORB_EINVAL, "cuda: no device %d (this process sees %d)", device, count);
    orb_cu_device dev = 0;
    if ((r = cu->device_get(&dev, device)) != ORB_CU_SUCCESS)
        return cuda_fail(cu, r, "cuDeviceGet");
    if ((r = cu->primary_ctx_retain(ctx_out, dev)) != ORB_CU_SUCCESS)
        return cuda_fail(cu, r, "cuDevicePrimaryCtxRetain");
    *cu_out = cu;
    return 0;
}

/* Give back a primary context retain of `device`; one the driver refuses is counted as kept. */
static void close_device(const struct orb_cuda *cu, int device)
{
    orb_cu_device dev = 0;
    orb_cu_result r = cu->device_get(&dev, device);
    if (r == ORB_CU_SUCCESS)
        r = cu->primary_ctx_release(dev);
    if (r != ORB_CU_SUCCESS) {
        char text[160];
        ORB_LOGE("cuda: device %d's primary context could not be released (%s): its reference is kept", device,
                 orb_cuda_describe(cu, r, text, sizeof text));
        pthread_mutex_lock(&g_lock);
        g_retained.contexts++;
        pthread_mutex_unlock(&g_lock);
    }
}

/* Make `ctx` current on this thread, the caller's into *saved. */
static orb_cu_result enter(const struct orb_cuda *cu, orb_cu_context ctx, orb_cu_context *saved)
{
    orb_cu_result r = cu->ctx_get_current(saved);
    return r != ORB_CU_SUCCESS ? r : cu->ctx_set_current(ctx);
}

/* The caller's context back. A failure leaves this thread in the primary context, which is
 * alive: said, not fatal. */
static void leave(const struct orb_cuda *cu, orb_cu_context saved)
{
    orb_cu_result r = cu->ctx_set_current(saved);
    if (r != ORB_CU_SUCCESS) {
        char text[160];
        ORB_LOGW("cuda: the thread's own context could not be made current again: %s",
                 orb_cuda_describe(cu, r, text, sizeof text));
    }
}

/* ---- producer readiness ------------------------------------------------------------------ */

/* leave() after a producer's record or wait (r->lock held): a context that cannot be restored
 * leaves the driver's state on this thread unknown, so nothing proves the producer's work: r is
 * fenced, its done callback (*done, when given) never runs, and rc becomes ORB_EUNQUIESCED. */
static int ready_leave_locked(const struct orb_cuda *cu, struct readiness *r, orb_cu_context saved, int rc,
                              void (**done)(void *))
{
    orb_cu_result lr = cu->ctx_set_current(saved);
    if (lr == ORB_CU_SUCCESS)
        return rc;
    char text[160];
    r->fenced = true;
    r->done = NULL; /* the producer's inputs stay with their owner */
    r->done_ctx = NULL;
    if (done != NULL)
        *done = NULL;
    return orb_fail(ORB_EUNQUIESCED, "cuda: the thread's own context could not be made current again after "
                    "waiting for or recording the producer's work on %s (%s): it is fenced", r->what,
                    orb_cuda_describe(cu, lr, text, sizeof text));
}

/* Wait for r's pending generation (r->lock held, ctx current). 0 (its done callback handed back
 * through done and done_ctx for the caller to run unlocked), or ORB_EUNQUIESCED (fenced now). */
static int ready_wait_locked(const struct orb_cuda *cu, struct readiness *r, void (**done)(void *),
                             void **done_ctx)
{
    const char *what = r->what;
    if (r->fenced)
        return orb_fail(ORB_EUNQUIESCED, "cuda: %s is fenced: a producer's recorded work was not proven to end",
                        what);
    if (r->recorded == r->consumed)
        return 0;
    orb_cu_result w = cu->event_synchronize(r->event);
    if (w != ORB_CU_SUCCESS) {
        char text[160];
        r->fenced = true; /* the producer's inputs stay with their owner: done never runs */
        return orb_fail(ORB_EUNQUIESCED, "cuda: waiting for the producer's work on %s failed (%s): it is fenced",
                        what, orb_cuda_describe(cu, w, text, sizeof text));
    }
    r->consumed = r->recorded;
    *done = r->done;
    *done_ctx = r->done_ctx;
    r->done = NULL;
    r->done_ctx = NULL;
    return 0;
}

static void ready_init(struct readiness *r, orb_cu_context ctx, int device, const char *what)
{
    r->ctx = ctx;
    r->device = device;
    snprintf(r->what, sizeof r->what, "%s", what);
    pthread_mutex_init(&r->lock, NULL);
}

static int ready_consume(struct readiness *r)
{
    pthread_mutex_lock(&r->lock);
    if (!r->fenced && r->recorded == r->consumed) {
        pthread_mutex_unlock(&r->lock);
        return 0;
    }
    const struct orb_cuda *cu = NULL;
    (void)orb_cuda_get(&cu); /* loaded: the owner exists */
    void (*done)(void *) = NULL;
    void *done_ctx = NULL;
    orb_cu_context saved = NULL;
    int rc;
    orb_cu_result r0 = enter(cu, r->ctx, &saved);
    if (r0 != ORB_CU_SUCCESS) {
        rc = cuda_fail(cu, r0, "making the owner's context current");
    } else {
        rc = ready_wait_locked(cu, r, &done, &done_ctx);
        rc = ready_leave_locked(cu, r, saved, rc, &done);
    }
    pthread_mutex_unlock(&r->lock);
    if (done != NULL)
        done(done_ctx);
    return rc;
}

/* The special stream handles: the calling thread's default streams of its current context. */
static bool default_stream(orb_cu_stream s)
{
    return (uintptr_t)s <= 2; /* NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD */
}

static int ready_record(struct readiness *r, void *stream_handle, void (*done)(void *), void *done_ctx)
{
    orb_cu_context ctx = r->ctx;
    int device = r->device;
    const char *what = r->what;
    const struct orb_cuda *cu = NULL;
    int rc = orb_cuda_get(&cu);
    if (rc != 0)
        return rc;
    orb_cu_stream stream = stream_handle;
    /* The stream must be of the owner's context: a default handle names the calling thread's. */
    orb_cu_context stream_ctx = NULL;
    orb_cu_result cr = default_stream(stream) ? cu->ctx_get_current(&stream_ctx) : cu->stream_get_ctx(stream, &stream_ctx);
    if (cr != ORB_CU_SUCCESS)
        return orb_fail(orb_cuda_status(cr) == ORB_EPEER ? ORB_EPEER : ORB_EINVAL, "cuda: the producer stream of %s: "
                        "%s", what, orb_cuda_describe(cu, cr, (char[160]){0}, 160));
    if (stream_ctx != ctx)
        return orb_fail(ORB_EINVAL, "cuda: the producer stream of %s belongs to %s, not to device %d's primary "
                        "context", what, stream_ctx == NULL ? "no context (none is current)" : "another context",
                        device);
    unsigned int capturing = 0;
    orb_cu_context saved = NULL;
    if ((cr = enter(cu, ctx, &saved)) != ORB_CU_SUCCESS)
        return cuda_fail(cu, cr, "making the owner's context current");
    cr = cu->stream_is_capturing(stream, &capturing);
    if (cr != ORB_CU_SUCCESS || capturing != ORB_CU_STREAM_CAPTURE_STATUS_NONE) {
        leave(cu, saved);
        if (cr != ORB_CU_SUCCESS)
            return cuda_fail(cu, cr, "cuStreamIsCapturing");
        return orb_fail(ORB_EINVAL, "cuda: the producer stream of %s is capturing a graph: its work is not queued "
                        "yet, so there is nothing to wait for", what);
    }
    void (*old_done)(void *) = NULL;
    void *old_ctx = NULL;
    pthread_mutex_lock(&r->lock);
    /* A generation still pending is waited for first: one event captures one stream's work. */
    rc = ready_wait_locked(cu, r, &old_done, &old_ctx);
    if (rc == 0 && r->event == NULL && (cr = cu->event_create(&r->event, ORB_CU_EVENT_DISABLE_TIMING)) != ORB_CU_SUCCESS) {
        r->event = NULL;
        rc = cuda_fail(cu, cr, "cuEventCreate");
    }
    if (rc == 0) {
        cr = cu->event_record(r->event, stream);
        if (cr != ORB_CU_SUCCESS) {
            char text[160];
            r->fenced = true; /* nothing proves the producer's work ends: its inputs stay */
            rc = orb_fail(ORB_EUNQUIESCED, "cuda: recording the producer's work on %s failed (%s): it is fenced",
                          what, orb_cuda_describe(cu, cr, text, sizeof text));
        } else {
            r->recorded++;
            r->done = done;
            r->done_ctx = done_ctx;
        }
    }
    rc = ready_leave_locked(cu, r, saved, rc, &old_done);
    pthread_mutex_unlock(&r->lock);
    if (old_done != NULL)
        old_done(old_ctx);
    return rc;
}

/* Whether r's event can go (no generation pending, nothing fenced), and destroy it (ctx current). */
static bool ready_gone(const struct orb_cuda *cu, struct readiness *r)
{
    if (r->fenced)
        return false;
    if (r->event != NULL && cu->event_destroy(r->event) != ORB_CU_SUCCESS)
        return false;
    r->event = NULL;
    pthread_mutex_destroy(&r->lock);
    return true;
}

static orb_cuda_memory *owner_new(int device, orb_cu_context ctx, orb_cu_deviceptr base, size_t size)
{
    orb_cuda_memory *m = calloc(1, sizeof *m);
    if (m == NULL)
        return NULL;
    atomic_init(&m->refs, 1);
    pthread_mutex_init(&m->copy_lock, NULL);
    char what[96];
    snprintf(what, sizeof what, "device %d's allocation [0x%llx, +%zu)", device, (unsigned long long)base, size);
    ready_init(&m->ready, ctx, device, what);
    pthread_mutex_init(&m->loan_lock, NULL);
    m->device = device;
    m->ctx = ctx;
    m->base = base;
    m->size = size;
    static atomic_uint_fast64_t serials;
    m->serial = atomic_fetch_add(&serials, 1) + 1;
    return m;
}

uint64_t orb_cuda_memory_serial(const orb_cuda_memory *mem)
{
    return mem->serial;
}

ORB_EXPORT int orb_cuda_memory_alloc(int device, size_t len, orb_cuda_memory **out)
{
    if (out == NULL || len == 0)
        return orb_fail(ORB_EINVAL, "cuda: %s", out == NULL ? "NULL output" : "a zero-length allocation");
    const struct orb_cuda *cu = NULL;
    orb_cu_context ctx = NULL, saved = NULL;
    int rc = open_device(device, &cu, &ctx);
    if (rc != 0)
        return rc;
    orb_cu_deviceptr base = 0;
    orb_cu_result r = enter(cu, ctx, &saved);
    if (r == ORB_CU_SUCCESS) {
        r = cu->mem_alloc(&base, len);
        leave(cu, saved);
    }
    if (r != ORB_CU_SUCCESS) {
        rc = cuda_fail(cu, r, "cuMemAlloc");
        goto release_device;
    }
    orb_cuda_memory *m = owner_new(device, ctx, base, len);
    if (m == NULL) {
        rc = orb_fail(ORB_ENOMEM, "cuda: out of memory for an owner");
        goto free_allocation;
    }
    m->allocated = true;
    pthread_mutex_lock(&g_lock);
    m->next = g_owners;
    g_owners = m;
    pthread_mutex_unlock(&g_lock);
    *out = m;
    return 0;

free_allocation:
    if (enter(cu, ctx, &saved) == ORB_CU_SUCCESS) {
        (void)cu->mem_free(base);
        leave(cu, saved);
    }
release_device:
    close_device(cu, device);
    return rc;
}

/* The owner of the allocation at `base` of `device`, with one more reference, or NULL (g_lock
 * held). An owner whose last reference is being dropped is no longer anyone's. */
static orb_cuda_memory *find_owner_locked(int device, orb_cu_deviceptr base)
{
    for (orb_cuda_memory *m = g_owners; m != NULL; m = m->next) {
        if (m->device != device || m->base != base)
            continue;
        unsigned refs = atomic_load(&m->refs);
        while (refs != 0 && !atomic_compare_exchange_weak(&m->refs, &refs, refs + 1))
            ;
        return refs != 0 ? m : NULL;
    }
    return NULL;
}

ORB_EXPORT int orb_cuda_memory_adopt(int device, uint64_t ptr, size_t len, orb_release_fn release, void *ctx,
                                     orb_cuda_memory **out)
{
    if (out == NULL || len == 0 || ptr > UINT64_MAX - len)
        return orb_fail(ORB_EINVAL, "cuda: %s", out == NULL ? "NULL output" : "an empty or wrapping range");
    const struct orb_cuda *cu = NULL;
    orb_cu_context primary = NULL, saved = NULL;
    int rc = open_device(device, &cu, &primary);
    if (rc != 0)
        return rc;
    unsigned int type = 0, managed = 0;
    int ordinal = -1;
    orb_cu_context owner_ctx = NULL;
    orb_cu_deviceptr base = 0;
    size_t size = 0;
    /* What the memory is first: the rest of the questions are only for device memory. */
    bool device_memory = false;
    orb_cu_result r = enter(cu, primary, &saved);
    if (r == ORB_CU_SUCCESS) {
        if ((r = cu->pointer_get_attribute(&type, ORB_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr)) == ORB_CU_SUCCESS &&
            (r = cu->pointer_get_attribute(&managed, ORB_CU_POINTER_ATTRIBUTE_IS_MANAGED, ptr)) == ORB_CU_SUCCESS &&
            (device_memory = type == ORB_CU_MEMORYTYPE_DEVICE && managed == 0) &&
            (r = cu->pointer_get_attribute(&ordinal, ORB_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr)) ==
                ORB_CU_SUCCESS &&
            (r = cu->pointer_get_attribute(&owner_ctx, ORB_CU_POINTER_ATTRIBUTE_CONTEXT, ptr)) == ORB_CU_SUCCESS)
            r = cu->mem_get_address_range(&base, &size, ptr);
        leave(cu, saved);
    }
    if (r == ORB_CU_ERROR_INVALID_VALUE)
        rc = orb_fail(ORB_EINVAL, "cuda: 0x%llx is not memory the CUDA driver knows", (unsigned long long)ptr);
    else if (r != ORB_CU_SUCCESS)
        rc = cuda_fail(cu, r, "the attributes of the memory to adopt");
    else if (!device_memory)
        rc = orb_fail(ORB_EINVAL, "cuda: 0x%llx is %s memory, not device memory", (unsigned long long)ptr,
                      managed != 0 ? "managed" : type == ORB_CU_MEMORYTYPE_HOST ? "host" : "another kind of");
    else if (ordinal != device)
        rc = orb_fail(ORB_EINVAL, "cuda: 0x%llx is memory of device %d, not %d", (unsigned long long)ptr, ordinal,
                      device);
    else if (owner_ctx != primary && owner_ctx != NULL) /* NULL: a mapping (cuMemMap), of no context */
        rc = orb_fail(ORB_EINVAL, "cuda: 0x%llx was allocated in a context other than device %d's primary one",
                      (unsigned long long)ptr, device);
    else if (ptr - base > size || len > size - (ptr - base))
        rc = orb_fail(ORB_EINVAL, "cuda: [0x%llx, +%zu) runs past its allocation [0x%llx, +%zu)",
                      (unsigned long long)ptr, len, (unsigned long long)base, size);
    if (rc != 0)
        goto release_device;

    pthread_mutex_lock(&g_lock);
    orb_cuda_memory *m = find_owner_locked(device, base);
    if (m != NULL) {
        pthread_mutex_unlock(&g_lock);
        close_device(cu, device); /* the owner holds its own */
        if (release != NULL) {
            orb_cuda_memory_unref(m);
            return orb_fail(ORB_EEXIST, "cuda: the allocation [0x%llx, +%zu) has an owner already: adopt it "
                            "without a release callback, or take a reference of that owner",
                            (unsigned long long)base, size);
        }
        *out = m;
        return 0;
    }
    if ((m = owner_new(device, primary, base, size)) == NULL) {
        pthread_mutex_unlock(&g_lock);
        rc = orb_fail(ORB_ENOMEM, "cuda: out of memory for an owner");
        goto release_device;
    }
    m->release = release;
    m->release_ctx = ctx;
    m->next = g_owners;
    g_owners = m;
    pthread_mutex_unlock(&g_lock);
    *out = m;
    return 0;

release_device:
    close_device(cu, device);
    return rc;
}

ORB_EXPORT uint64_t orb_cuda_memory_ptr(const orb_cuda_memory *mem)
{
    return mem != NULL ? mem->base : 0;
}

ORB_EXPORT size_t orb_cuda_memory_size(const orb_cuda_memory *mem)
{
    return mem != NULL ? mem->size : 0;
}

ORB_EXPORT int orb_cuda_memory_device(const orb_cuda_memory *mem)
{
    return mem != NULL ? mem->device : -1;
}

ORB_EXPORT orb_cuda_memory *orb_cuda_memory_ref(orb_cuda_memory *mem)
{
    if (mem != NULL)
        atomic_fetch_add(&mem->refs, 1);
    return mem;
}

/* Keep `mem` for the process's lifetime, with its context (and its stream and event, if any):
 * the driver did not prove it idle or free. */
static void keep(orb_cuda_memory *mem)
{
    pthread_mutex_lock(&g_lock);
    g_retained.device_allocations++;
    g_retained.device_bytes += mem->size;
    g_retained.contexts++;
    mem->next = g_kept;
    g_kept = mem;
    pthread_mutex_unlock(&g_lock);
}

/* Destroy the copies' event and stream (idle: every copy waited for its end). false: the
 * driver refused one; both are kept with the allocation. */
static bool copy_queues_gone(const struct orb_cuda *cu, orb_cuda_memory *mem)
{
    if (mem->stream == NULL)
        return true;
    orb_cu_context saved = NULL;
    orb_cu_result r = enter(cu, mem->ctx, &saved);
    if (r == ORB_CU_SUCCESS) {
        r = cu->event_destroy(mem->done);
        if (r == ORB_CU_SUCCESS)
            r = cu->stream_destroy(mem->stream);
        leave(cu, saved);
    }
    if (r != ORB_CU_SUCCESS) {
        char text[160];
        ORB_LOGE("cuda: the copy stream of device %d's allocation [0x%llx, +%zu) could not be destroyed (%s): the "
                 "allocation is kept", mem->device, (unsigned long long)mem->base, mem->size,
                 orb_cuda_describe(cu, r, text, sizeof text));
        return false;
    }
    return true;
}

/* Destroy the readiness event, in the owner's context. false: the driver refused (kept). */
static bool event_gone(const struct orb_cuda *cu, orb_cuda_memory *mem)
{
    if (mem->ready.event == NULL) {
        pthread_mutex_destroy(&mem->ready.lock);
        return true;
    }
    orb_cu_context saved = NULL;
    if (enter(cu, mem->ctx, &saved) != ORB_CU_SUCCESS)
        return false;
    bool gone = ready_gone(cu, &mem->ready);
    leave(cu, saved);
    return gone;
}

ORB_EXPORT void orb_cuda_memory_unref(orb_cuda_memory *mem)
{
    if (mem == NULL)
        return;
    pthread_mutex_lock(&g_lock);
    bool last = atomic_fetch_sub(&mem->refs, 1) == 1;
    if (last)
        for (orb_cuda_memory **pp = &g_owners; *pp != NULL; pp = &(*pp)->next)
            if (*pp == mem) {
                *pp = mem->next;
                break;
            }
    pthread_mutex_unlock(&g_lock);
    if (!last)
        return;
    /* The table was loaded when the owner was made. */
    const struct orb_cuda *cu = NULL;
    (void)orb_cuda_get(&cu);
    /* The last producer's work ends before the bytes go (a fenced one keeps them). */
    if (orb_cuda_memory_ready(mem) != 0 || mem->fenced || !copy_queues_gone(cu, mem) || !event_gone(cu, mem)) {
        keep(mem);
        return;
    }
    pthread_mutex_destroy(&mem->copy_lock);
    pthread_mutex_destroy(&mem->loan_lock);
    if (!mem->allocated) {
        if (mem->release != NULL)
            mem->release((void *)(uintptr_t)mem->base, mem->size, mem->release_ctx);
        close_device(cu, mem->device);
        free(mem);
        return;
    }
    orb_cu_context saved = NULL;
    orb_cu_result r = enter(cu, mem->ctx, &saved);
    if (r == ORB_CU_SUCCESS) {
        r = cu->mem_free(mem->base);
        leave(cu, saved);
    }
    if (r != ORB_CU_SUCCESS) {
        /* Kept, with its context: the driver did not say the bytes are free. */
        char text[160];
        ORB_LOGE("cuda: device %d's allocation [0x%llx, +%zu) could not be freed (%s): it and its context are kept",
                 mem->device, (unsigned long long)mem->base, mem->size, orb_cuda_describe(cu, r, text, sizeof text));
        keep(mem);
        return;
    }
    close_device(cu, mem->device);
    free(mem);
}

/* A pinned host allocation's release (orb_host_memory_wrap): its device's primary context. */
struct pinned {
    int device;
    orb_cu_context ctx;
    struct readiness ready;
    struct pinned *next;               /* on g_kept_pinned once kept */
};

/* Owners of pinned memory kept for good, with the producer event that was not proven done:
 * reachable, as the device allocations' owners are (g_kept). */
static struct pinned *g_kept_pinned;

static int pinned_ready(orb_host_memory *host)
{
    struct pinned *p = host->release_ctx;
    return ready_consume(&p->ready);
}

/* cuMemHostAlloc (portable: every context may use it) of `len` bytes in device `device`'s
 * primary context, whose retain it holds into *ctx_out. Errors: as orb_cuda_memory_alloc(). */
static int pinned_alloc(int device, size_t len, void **bytes_out, orb_cu_context *ctx_out)
{
    const struct orb_cuda *cu = NULL;
    orb_cu_context ctx = NULL, saved = NULL;
    int rc = open_device(device, &cu, &ctx);
    if (rc != 0)
        return rc;
    void *bytes = NULL;
    orb_cu_result r = enter(cu, ctx, &saved);
    if (r == ORB_CU_SUCCESS) {
        r = cu->mem_host_alloc(&bytes, len, ORB_CU_MEMHOSTALLOC_PORTABLE);
        leave(cu, saved);
    }
    if (r != ORB_CU_SUCCESS) {
        rc = cuda_fail(cu, r, "cuMemHostAlloc");
        close_device(cu, device);
        return rc;
    }
    *bytes_out = bytes;
    *ctx_out = ctx;
    return 0;
}

/* Pinned bytes the driver did not prove free (`r` says why): they and their context are kept. */
static void pinned_kept(const struct orb_cuda *cu, orb_cu_result r, const void *ptr, size_t len)
{
    char text[160];
    ORB_LOGE("cuda: pinned host memory [%p, +%zu) could not be freed (%s): it and its context are kept", ptr, len,
             orb_cuda_describe(cu, r, text, sizeof text));
    pthread_mutex_lock(&g_lock);
    g_retained.host_allocations++;
    g_retained.host_bytes += len;
    g_retained.contexts++;
    pthread_mutex_unlock(&g_lock);
}

/* Undo pinned_alloc(): cuMemFreeHost in `ctx`, then the context's retain; a free the driver
 * refuses keeps both. */
static void pinned_free(const struct orb_cuda *cu, int device, orb_cu_context ctx, void *ptr, size_t len)
{
    orb_cu_context saved = NULL;
    orb_cu_result r = enter(cu, ctx, &saved);
    if (r == ORB_CU_SUCCESS) {
        r = cu->mem_free_host(ptr);
        leave(cu, saved);
    }
    if (r != ORB_CU_SUCCESS)
        pinned_kept(cu, r, ptr, len);
    else
        close_device(cu, device);
}

static void pinned_release(void *ptr, size_t len, void *arg)
{
    struct pinned *p = arg;
    const struct orb_cuda *cu = NULL;
    (void)orb_cuda_get(&cu);
    /* The last producer's work ends before the bytes go; a fenced producer keeps them. */
    orb_cu_context saved = NULL;
    if (ready_consume(&p->ready) == 0 && enter(cu, p->ctx, &saved) == ORB_CU_SUCCESS) {
        bool gone = ready_gone(cu, &p->ready);
        leave(cu, saved);
        if (gone) {
            pinned_free(cu, p->device, p->ctx, ptr, len);
            free(p);
            return;
        }
    }
    pinned_kept(cu, ORB_CU_ERROR_NOT_READY, ptr, len);
    pthread_mutex_lock(&g_lock);
    p->next = g_kept_pinned; /* its event stays with it: destroying it proves nothing */
    g_kept_pinned = p;
    pthread_mutex_unlock(&g_lock);
}

ORB_EXPORT int orb_cuda_host_alloc(int device, size_t len, orb_host_memory **out)
{
    if (out == NULL || len == 0)
        return orb_fail(ORB_EINVAL, "cuda: %s", out == NULL ? "NULL output" : "a zero-length allocation");
    struct pinned *p = calloc(1, sizeof *p);
    if (p == NULL)
        return orb_fail(ORB_ENOMEM, "cuda: out of memory for pinned host memory's owner");
    p->device = device;
    void *bytes = NULL;
    int rc = pinned_alloc(device, len, &bytes, &p->ctx);
    if (rc != 0)
        goto free_owner;
    ready_init(&p->ready, p->ctx, device, "pinned host memory");
    if ((rc = orb_host_memory_wrap(bytes, len, pinned_release, p, out)) != 0)
        goto free_bytes;
    (*out)->ready = pinned_ready;
    return 0;

free_bytes:
    {
        const struct orb_cuda *cu = NULL;
        (void)orb_cuda_get(&cu); /* loaded: pinned_alloc used it */
        pinned_free(cu, device, p->ctx, bytes, len);
    }
    pthread_mutex_destroy(&p->ready.lock);
free_owner:
    free(p);
    return rc;
}

ORB_EXPORT int orb_cuda_retained_resources(struct orb_cuda_retained *out)
{
    if (out == NULL)
        return orb_fail(ORB_EINVAL, "cuda: NULL output");
    pthread_mutex_lock(&g_lock);
    *out = g_retained;
    pthread_mutex_unlock(&g_lock);
    return 0;
}

/* One copy on mem's stream (copy_lock held, mem's context current): submitted, the event
 * recorded after it and waited for; on a failure, the stream drained. */
/* Where one staging copy goes: to host bytes, or from them. */
struct copy_ends {
    void *to_host;
    const void *from_host;
};

static int copy_locked(const struct orb_cuda *cu, orb_cuda_memory *mem, orb_cu_deviceptr dptr,
                       const struct copy_ends *e, size_t len, bool *held)
{
    orb_cu_result r;
    if (mem->stream == NULL) {
        if ((r = cu->stream_create(&mem->stream, ORB_CU_STREAM_NON_BLOCKING)) != ORB_CU_SUCCESS) {
            mem->stream = NULL;
            return cuda_fail(cu, r, "cuStreamCreate");
        }
        if ((r = cu->event_create(&mem->done, ORB_CU_EVENT_DISABLE_TIMING)) != ORB_CU_SUCCESS) {
            (void)cu->stream_destroy(mem->stream); /* nothing was ever queued on it */
            mem->stream = NULL;
            return cuda_fail(cu, r, "cuEventCreate");
        }
    }
    const char *what;
    if (e->to_host != NULL) {
        what = "cuMemcpyDtoHAsync";
        r = cu->memcpy_dtoh_async(e->to_host, dptr, len, mem->stream);
    } else {
        what = "cuMemcpyHtoDAsync";
        r = cu->memcpy_htod_async(dptr, e->from_host, len, mem->stream);
    }
    if (r == ORB_CU_SUCCESS) {
        what = "cuEventRecord";
        r = cu->event_record(mem->done, mem->stream);
        if (r == ORB_CU_SUCCESS) {
            orb_cu_result w = cu->event_synchronize(mem->done);
            if (w == ORB_CU_SUCCESS)
                return 0;
            what = "cuEventSynchronize";
            r = w;
        }
    }
    /* Something of it may be queued still: the stream is drained before the failure returns. */
    char text[160], drain[160];
    (void)orb_cuda_describe(cu, r, text, sizeof text);
    orb_cu_result d = cu->stream_synchronize(mem->stream);
    if (d != ORB_CU_SUCCESS) {
        mem->fenced = true;
        *held = true; /* the host bytes of this copy: the device may still use them */
        return orb_fail(ORB_EUNQUIESCED, "cuda: %s failed (%s) and draining the copy stream failed too (%s): device "
                        "%d's allocation [0x%llx, +%zu) is fenced and kept", what, text,
                        orb_cuda_describe(cu, d, drain, sizeof drain), mem->device, (unsigned long long)mem->base,
                        mem->size);
    }
    return orb_fail(orb_cuda_status(r), "cuda: %s failed (%s); the copy stream drained", what, text);
}

static int copy(orb_cuda_memory *mem, size_t offset, const struct copy_ends *e, size_t len, bool *held_out)
{
    bool held_here = false, *held = held_out != NULL ? held_out : &held_here;
    *held = false;
    if (mem == NULL || len == 0 || offset > mem->size ||
        len > mem->size - offset)
        return orb_fail(ORB_EINVAL, "cuda: a copy of %zu bytes at +%zu of an allocation of %zu", len, offset,
                        mem != NULL ? mem->size : 0);
    const struct orb_cuda *cu = NULL;
    int rc = orb_cuda_get(&cu);
    if (rc != 0)
        return rc;
    if ((rc = orb_cuda_memory_ready(mem)) != 0)
        return rc;
    pthread_mutex_lock(&mem->copy_lock);
    if (mem->fenced) {
        pthread_mutex_unlock(&mem->copy_lock);
        return orb_fail(ORB_EUNQUIESCED, "cuda: device %d's allocation [0x%llx, +%zu) is fenced: an earlier copy's "
                        "end was not proven", mem->device, (unsigned long long)mem->base, mem->size);
    }
    orb_cu_context saved = NULL;
    orb_cu_result r = enter(cu, mem->ctx, &saved);
    if (r != ORB_CU_SUCCESS)
        rc = cuda_fail(cu, r, "making the allocation's context current");
    else {
        rc = copy_locked(cu, mem, mem->base + offset, e, len, held);
        leave(cu, saved);
    }
    pthread_mutex_unlock(&mem->copy_lock);
    return rc;
}

int orb_cuda_memory_to_host_held(orb_cuda_memory *mem, size_t offset, void *host, size_t len, bool *held)
{
    if (held != NULL)
        *held = false;
    struct copy_ends e = {.to_host = host};
    return host == NULL ? orb_fail(ORB_EINVAL, "cuda: NULL host bytes") : copy(mem, offset, &e, len, held);
}

int orb_cuda_memory_from_host_held(orb_cuda_memory *mem, size_t offset, const void *host, size_t len, bool *held)
{
    if (held != NULL)
        *held = false;
    struct copy_ends e = {.from_host = host};
    return host == NULL ? orb_fail(ORB_EINVAL, "cuda: NULL host bytes") : copy(mem, offset, &e, len, held);
}

int orb_cuda_memory_to_host(orb_cuda_memory *mem, size_t offset, void *host, size_t len)
{
    return orb_cuda_memory_to_host_held(mem, offset, host, len, NULL);
}

int orb_cuda_memory_from_host(orb_cuda_memory *mem, size_t offset, const void *host, size_t len)
{
    return orb_cuda_memory_from_host_held(mem, offset, host, len, NULL);
}

/* The copies of `ops` queued one after the other (copy_lock held, mem's context current), the
 * event recorded once after the last and waited for; each op's status set. */
static void dtod_many_locked(const struct orb_cuda *cu, orb_cuda_memory *mem, struct orb_cuda_dtod *ops, size_t n)
{
    orb_cu_result r;
    if (mem->stream == NULL) {
        if ((r = cu->stream_create(&mem->stream, ORB_CU_STREAM_NON_BLOCKING)) != ORB_CU_SUCCESS) {
            mem->stream = NULL;
            int rc = cuda_fail(cu, r, "cuStreamCreate");
            for (size_t i = 0; i < n; i++)
                ops[i].status = rc;
            return;
        }
        if ((r = cu->event_create(&mem->done, ORB_CU_EVENT_DISABLE_TIMING)) != ORB_CU_SUCCESS) {
            (void)cu->stream_destroy(mem->stream); /* nothing was ever queued on it */
            mem->stream = NULL;
            int rc = cuda_fail(cu, r, "cuEventCreate");
            for (size_t i = 0; i < n; i++)
                ops[i].status = rc;
            return;
        }
    }
    size_t queued = 0;
    for (size_t i = 0; i < n; i++) {
        struct orb_cuda_dtod *o = &ops[i];
        orb_cu_deviceptr mine = mem->base + o->offset;
        r = o->to_peer ? cu->memcpy_dtod_async((orb_cu_deviceptr)o->peer, mine, o->len, mem->stream)
                       : cu->memcpy_dtod_async(mine, (orb_cu_deviceptr)o->peer, o->len, mem->stream);
        o->status = r == ORB_CU_SUCCESS ? 1 : cuda_fail(cu, r, "cuMemcpyDtoDAsync"); /* 1: queued */
        queued += r == ORB_CU_SUCCESS;
    }
    if (queued == 0)
        return;
    const char *what = "cuEventRecord";
    r = cu->event_record(mem->done, mem->stream);
    if (r == ORB_CU_SUCCESS) {
        if ((r = cu->event_synchronize(mem->done)) == ORB_CU_SUCCESS) {
            for (size_t i = 0; i < n; i++)
                if (ops[i].status == 1)
                    ops[i].status = 0;
            return;
        }
        what = "cuEventSynchronize";
    }
    /* Which queued copy failed is not known: all of them fail, once the stream is drained. */
    char text[160], drain[160];
    (void)orb_cuda_describe(cu, r, text, sizeof text);
    orb_cu_result d = cu->stream_synchronize(mem->stream);
    int rc;
    if (d != ORB_CU_SUCCESS) {
        mem->fenced = true;
        rc = orb_fail(ORB_EUNQUIESCED, "cuda: %s failed (%s) and draining the copy stream failed too (%s): device "
                      "%d's allocation [0x%llx, +%zu) is fenced and kept", what, text,
                      orb_cuda_describe(cu, d, drain, sizeof drain), mem->device, (unsigned long long)mem->base,
                      mem->size);
    } else
        rc = orb_fail(orb_cuda_status(r), "cuda: %s after %zu device copies failed (%s); the copy stream drained",
                      what, queued, text);
    for (size_t i = 0; i < n; i++)
        if (ops[i].status == 1)
            ops[i].status = rc;
}

int orb_cuda_memory_dtod_many(orb_cuda_memory *mem, struct orb_cuda_dtod *ops, size_t n)
{
    if (mem == NULL || ops == NULL || n == 0)
        return orb_fail(ORB_EINVAL, "cuda: no device copies");
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        struct orb_cuda_dtod *o = &ops[i];
        if (o->peer == 0 || o->len == 0 || o->offset > mem->size || o->len > mem->size - o->offset)
            rc = orb_fail(ORB_EINVAL, "cuda: device copy %zu of %zu bytes at +%zu of an allocation of %zu", i,
                          o->len, o->offset, mem->size);
    }
    const struct orb_cuda *cu = NULL;
    if (rc == 0)
        rc = orb_cuda_get(&cu);
    if (rc == 0)
        rc = orb_cuda_memory_ready(mem);
    if (rc != 0)
        goto fail_all;
    pthread_mutex_lock(&mem->copy_lock);
    if (mem->fenced) {
        pthread_mutex_unlock(&mem->copy_lock);
        rc = orb_fail(ORB_EUNQUIESCED, "cuda: device %d's allocation [0x%llx, +%zu) is fenced: an earlier copy's "
                      "end was not proven", mem->device, (unsigned long long)mem->base, mem->size);
        goto fail_all;
    }
    orb_cu_context saved = NULL;
    orb_cu_result r = enter(cu, mem->ctx, &saved);
    if (r != ORB_CU_SUCCESS) {
        pthread_mutex_unlock(&mem->copy_lock);
        rc = cuda_fail(cu, r, "making the allocation's context current");
        goto fail_all;
    }
    dtod_many_locked(cu, mem, ops, n);
    leave(cu, saved);
    pthread_mutex_unlock(&mem->copy_lock);
    for (size_t i = 0; i < n; i++)
        if (ops[i].status != 0)
            return ops[i].status;
    return 0;

fail_all:
    for (size_t i = 0; i < n; i++)
        ops[i].status = rc;
    return rc;
}


int orb_cuda_memory_ready(orb_cuda_memory *mem)
{
    return ready_consume(&mem->ready);
}

ORB_EXPORT int orb_cuda_memory_record_producer(orb_cuda_memory *mem, void *stream, void (*done)(void *ctx),
                                               void *ctx)
{
    if (mem == NULL)
        return orb_fail(ORB_EINVAL, "cuda: NULL device memory");
    return ready_record(&mem->ready, stream, done, ctx);
}

ORB_EXPORT int orb_cuda_host_record_producer(orb_host_memory *host, void *stream, void (*done)(void *ctx),
                                             void *ctx)
{
    if (host == NULL)
        return orb_fail(ORB_EINVAL, "cuda: NULL host memory");
    if (host->ready != pinned_ready)
        return orb_fail(ORB_EINVAL, "cuda: producer readiness needs pinned host memory from orb_cuda_host_alloc");
    struct pinned *p = host->release_ctx;
    return ready_record(&p->ready, stream, done, ctx);
}

ORB_EXPORT int orb_cuda_memory_copy_out(orb_cuda_memory *mem, size_t offset, void *dst, size_t len)
{
    return orb_cuda_memory_to_host(mem, offset, dst, len);
}

ORB_EXPORT int orb_cuda_memory_copy_in(orb_cuda_memory *mem, size_t offset, const void *src, size_t len)
{
    return orb_cuda_memory_from_host(mem, offset, src, len);
}

int orb_cuda_memory_loan(orb_cuda_memory *mem, size_t offset, size_t len, int writes, struct orb_cuda_loan **out)
{
    if (mem == NULL || out == NULL || len == 0 || offset > mem->size || len > mem->size - offset)
        return orb_fail(ORB_EINVAL, "cuda: a loan of %zu bytes at +%zu of an allocation of %zu", len, offset,
                        mem != NULL ? mem->size : 0);
    struct orb_cuda_loan *loan = calloc(1, sizeof *loan);
    if (loan == NULL)
        return orb_fail(ORB_ENOMEM, "cuda: out of memory for a loan");
    *loan = (struct orb_cuda_loan){.mem = mem, .offset = offset, .len = len, .writes = writes != 0};
    pthread_mutex_lock(&mem->loan_lock);
    for (const struct orb_cuda_loan *l = mem->loans; l != NULL; l = l->next) {
        bool overlap = offset < l->offset + l->len && l->offset < offset + len;
        if (overlap && (writes || l->writes)) {
            size_t lo = l->offset, n = l->len;
            int w = l->writes;
            pthread_mutex_unlock(&mem->loan_lock);
            free(loan);
            return orb_fail(ORB_EBUSY, "cuda: [0x%llx, +%zu) of device %d's memory is in use: a transfer %s "
                            "[0x%llx, +%zu) (%s overlapping ranges conflict)", (unsigned long long)(mem->base + offset),
                            len, mem->device, w ? "writes" : "reads", (unsigned long long)(mem->base + lo), n,
                            writes ? "a write and any other access to" : "a read and a write of");
        }
    }
    loan->next = mem->loans;
    mem->loans = loan;
    pthread_mutex_unlock(&mem->loan_lock);
    *out = loan;
    return 0;
}

void orb_cuda_memory_loan_end(struct orb_cuda_loan *loan)
{
    if (loan == NULL)
        return;
    orb_cuda_memory *mem = loan->mem;
    pthread_mutex_lock(&mem->loan_lock);
    for (struct orb_cuda_loan **pp = &mem->loans; *pp != NULL; pp = &(*pp)->next)
        if (*pp == loan) {
            *pp = loan->next;
            break;
        }
    pthread_mutex_unlock(&mem->loan_lock);
    free(loan);
}

/* Pinned staging memory: its first page holds where it came from. */
struct staging_header {
    int device;
    orb_cu_context ctx; /* the device's primary context: one retain held */
    size_t len;
};
#define STAGING_HEADER 4096u

void *orb_cuda_staging_alloc(int device, size_t len)
{
    void *p = NULL;
    orb_cu_context ctx = NULL;
    if (len > SIZE_MAX - STAGING_HEADER)
        return NULL;
    if (pinned_alloc(device, len + STAGING_HEADER, &p, &ctx) != 0) {
        ORB_LOGW("%s: no pinned staging memory, ordinary memory instead", orb_last_error());
        return NULL;
    }
    struct staging_header *h = p;
    *h = (struct staging_header){.device = device, .ctx = ctx, .len = len};
    return (uint8_t *)p + STAGING_HEADER;
}

void orb_cuda_staging_free(void *p)
{
    if (p == NULL)
        return;
    struct staging_header *h = (struct staging_header *)(void *)((uint8_t *)p - STAGING_HEADER);
    const struct orb_cuda *cu = NULL;
    (void)orb_cuda_get(&cu); /* loaded: the memory came from it */
    pinned_free(cu, h->device, h->ctx, h, h->len + STAGING_HEADER);
}

void orb_cuda_staging_keep(void *p)
{
    if (p == NULL)
        return;
    const struct staging_header *h = (const struct staging_header *)(void *)((uint8_t *)p - STAGING_HEADER);
    ORB_LOGE("cuda: pinned staging [%p, +%zu) is kept: a device copy through it was not proven to end", p, h->len);
    pthread_mutex_lock(&g_lock);
    g_retained.host_allocations++;
    g_retained.host_bytes += h->len + STAGING_HEADER;
    g_retained.contexts++;
    pthread_mutex_unlock(&g_lock);
}

/* The driver table into *cu_out and mem's context made current on this thread (the caller's
 * into *saved, for leave()). */
static int enter_owner(const orb_cuda_memory *mem, const struct orb_cuda **cu_out, orb_cu_context *saved)
{
    if (mem == NULL)
        return orb_fail(ORB_EINVAL, "cuda: NULL device memory");
    const struct orb_cuda *cu = NULL;
    int rc = orb_cuda_get(&cu);
    if (rc != 0)
        return rc;
    orb_cu_result r = enter(cu, mem->ctx, saved);
    if (r != ORB_CU_SUCCESS)
        return cuda_fail(cu, r, "making the allocation's context current");
    *cu_out = cu;
    return 0;
}

/* ---- IPC: another process's view of an allocation on this host ----------------------------- */

int orb_cuda_memory_ipc_handle(orb_cuda_memory *mem, uint8_t out[ORB_CU_IPC_HANDLE_SIZE])
{
    if (mem == NULL || out == NULL)
        return orb_fail(ORB_EINVAL, "cuda: NULL device memory or handle");
    enum orb_cuda_share kind = 0;
    int rc = orb_cuda_memory_share_kind(mem, &kind);
    if (rc == 0 && kind != ORB_CUDA_SHARE_LEGACY)
        rc = orb_fail(ORB_EUNAVAILABLE, "cuda: device %d's allocation [0x%llx, +%zu) has no legacy IPC handle (a "
                      "virtual memory management allocation, shared by descriptor)", mem->device,
                      (unsigned long long)mem->base, mem->size);
    const struct orb_cuda *cu = NULL;
    orb_cu_context saved = NULL;
    if (rc != 0 || (rc = enter_owner(mem, &cu, &saved)) != 0)
        return rc;
    orb_cu_ipc_mem_handle h;
    orb_cu_result r = cu->ipc_get_mem_handle(&h, mem->base);
    leave(cu, saved);
    if (r != ORB_CU_SUCCESS)
        return cuda_fail(cu, r, "cuIpcGetMemHandle");
    memcpy(out, h.reserved, ORB_CU_IPC_HANDLE_SIZE);
    return 0;
}

int orb_cuda_ipc_import(int device, const uint8_t handle[ORB_CU_IPC_HANDLE_SIZE], uint64_t *ptr_out,
                        size_t *size_out)
{
    if (handle == NULL || ptr_out == NULL || size_out == NULL)
        return orb_fail(ORB_EINVAL, "cuda: NULL handle or output");
    const struct orb_cuda *cu = NULL;
    orb_cu_context ctx = NULL;
    int rc = open_device(device, &cu, &ctx);
    if (rc != 0)
        return rc;
    orb_cu_context saved = NULL;
    orb_cu_result r = enter(cu, ctx, &saved);
    if (r != ORB_CU_SUCCESS) {
        rc = cuda_fail(cu, r, "making the importing device's context current");
        goto release_device;
    }
    orb_cu_ipc_mem_handle h;
    memcpy(h.reserved, handle, ORB_CU_IPC_HANDLE_SIZE);
    orb_cu_deviceptr p = 0;
    r = cu->ipc_open_mem_handle(&p, h, ORB_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    if (r != ORB_CU_SUCCESS) {
        leave(cu, saved);
        rc = cuda_fail(cu, r, "cuIpcOpenMemHandle");
        goto release_device;
    }
    /* What the mapping really spans, whatever the handle's sender says. */
    orb_cu_deviceptr base = 0;
    size_t size = 0;
    r = cu->mem_get_address_range(&base, &size, p);
    leave(cu, saved);
    if (r != ORB_CU_SUCCESS || base != p) {
        rc = r != ORB_CU_SUCCESS ? cuda_fail(cu, r, "cuMemGetAddressRange of an import")
                                 : orb_fail(ORB_EPEER, "cuda: an import does not start its mapped range");
        (void)orb_cuda_ipc_unimport(device, (uint64_t)p); /* gives back the retain too */
        return rc;
    }
    *ptr_out = (uint64_t)p; /* the context retain stays with the import */
    *size_out = size;
    return 0;

release_device:
    close_device(cu, device);
    return rc;
}

/* How an import is unmapped, in the importing device's primary context: the driver's answer. */
typedef orb_cu_result (*unmap_fn)(const struct orb_cuda *cu, uint64_t ptr, size_t size);

/* Unmap an import of `device` with `unmap` (`what` names it) and give back the import's
 * context retain; one the driver refuses keeps the mapping and the retain for good. */
static int unimport(int device, uint64_t ptr, size_t size, unmap_fn unmap, const char *what)
{
    const struct orb_cuda *cu = NULL;
    int rc = orb_cuda_get(&cu);
    if (rc != 0)
        return rc;
    orb_cu_device dev = 0;
    orb_cu_context ctx = NULL, saved = NULL;
    orb_cu_result r = cu->device_get(&dev, device);
    if (r == ORB_CU_SUCCESS)
        r = cu->primary_ctx_retain(&ctx, dev); /* the import's own retain keeps it alive */
    if (r != ORB_CU_SUCCESS)
        rc = cuda_fail(cu, r, "finding the importing device's context");
    else {
        if ((r = enter(cu, ctx, &saved)) == ORB_CU_SUCCESS) {
            r = unmap(cu, ptr, size);
            leave(cu, saved);
        }
        close_device(cu, device); /* the retain just taken */
        if (r != ORB_CU_SUCCESS)
            rc = cuda_fail(cu, r, what);
    }
    if (rc != 0) {
        /* Still mapped, as far as anyone knows: the mapping and its context stay. */
        pthread_mutex_lock(&g_lock);
        g_retained.imports++;
        g_retained.contexts++;
        pthread_mutex_unlock(&g_lock);
        return rc;
    }
    close_device(cu, device);
    return 0;
}

static orb_cu_result ipc_close(const struct orb_cuda *cu, uint64_t ptr, size_t size)
{
    (void)size;
    return cu->ipc_close_mem_handle((orb_cu_deviceptr)ptr);
}

int orb_cuda_ipc_unimport(int device, uint64_t ptr)
{
    return unimport(device, ptr, 0, ipc_close, "cuIpcCloseMemHandle");
}

/* ---- virtual memory management: sharing cuMemCreate allocations by file descriptor --------------- */

int orb_cuda_memory_share_kind(orb_cuda_memory *mem, enum orb_cuda_share *out)
{
    if (mem == NULL || out == NULL)
        return orb_fail(ORB_EINVAL, "cuda: NULL device memory or output");
    const struct orb_cuda *cu = NULL;
    orb_cu_context saved = NULL;
    int rc = enter_owner(mem, &cu, &saved);
    if (rc != 0)
        return rc;
    orb_cu_result r;
    int legacy = 0;
    unsigned long long types = 0;
    r = cu->pointer_get_attribute(&legacy, ORB_CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, mem->base);
    if (r == ORB_CU_SUCCESS && !legacy && cu->vmm)
        r = cu->pointer_get_attribute(&types, ORB_CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, mem->base);
    leave(cu, saved);
    if (r != ORB_CU_SUCCESS)
        return cuda_fail(cu, r, "cuPointerGetAttribute(IS_LEGACY_CUDA_IPC_CAPABLE, ALLOWED_HANDLE_TYPES)");
    if (legacy) {
        *out = ORB_CUDA_SHARE_LEGACY;
        return 0;
    }
    if ((types & ORB_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0) {
        *out = ORB_CUDA_SHARE_FD;
        return 0;
    }
    /* The cause first: a peer's refusal carries only the start of the message. */
    return orb_fail(ORB_EUNAVAILABLE, "cuda: %s: device %d's allocation [0x%llx, +%zu) cannot be shared with another "
                    "process", cu->vmm ? "no legacy IPC handle, no POSIX file descriptor handle type"
                                       : "no legacy IPC handle, and the driver lacks virtual memory management",
                    mem->device, (unsigned long long)mem->base, mem->size);
}

int orb_cuda_memory_export_fd(orb_cuda_memory *mem, int *fd_out)
{
    if (fd_out == NULL)
        return orb_fail(ORB_EINVAL, "cuda: NULL output");
    enum orb_cuda_share kind = 0;
    int rc = orb_cuda_memory_share_kind(mem, &kind);
    if (rc != 0)
        return rc;
    if (kind != ORB_CUDA_SHARE_FD)
        return orb_fail(ORB_EUNAVAILABLE, "cuda: device %d's allocation [0x%llx, +%zu) is shared by its legacy IPC "
                        "handle, not by a file descriptor", mem->device, (unsigned long long)mem->base, mem->size);
    const struct orb_cuda *cu = NULL;
    orb_cu_context saved = NULL;
    if ((rc = enter_owner(mem, &cu, &saved)) != 0)
        return rc;
    orb_cu_result r;
    orb_cu_mem_handle h = 0;
    int fd = -1;
    if ((r = cu->mem_retain_allocation_handle(&h, (void *)(uintptr_t)mem->base)) != ORB_CU_SUCCESS) {
        rc = cuda_fail(cu, r, "cuMemRetainAllocationHandle");
    } else {
        if ((r = cu->mem_export_to_shareable_handle(&fd, h, ORB_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)) !=
            ORB_CU_SUCCESS)
            rc = cuda_fail(cu, r, "cuMemExportToShareableHandle");
        /* The retain only; the allocation stays with its mapping. */
        orb_cu_result rr = cu->mem_release(h);
        if (rr != ORB_CU_SUCCESS)
            ORB_LOGW("cuda: cuMemRelease of a retained allocation handle failed: %s",
                     orb_cuda_describe(cu, rr, (char[96]){0}, 96));
    }
    leave(cu, saved);
    if (rc != 0)
        return rc;
    *fd_out = fd;
    return 0;
}

int orb_cuda_vmm_import(int device, int fd, size_t size, uint64_t *ptr_out)
{
    if (ptr_out == NULL || fd < 0 || size == 0)
        return orb_fail(ORB_EINVAL, "cuda: %s", ptr_out == NULL ? "NULL output" : "no descriptor or size to map");
    const struct orb_cuda *cu = NULL;
    orb_cu_context ctx = NULL;
    int rc = open_device(device, &cu, &ctx);
    if (rc != 0)
        return rc;
    if (!cu->vmm) {
        rc = orb_fail(ORB_EUNAVAILABLE, "cuda: the driver lacks virtual memory management (cuMemMap and its kin)");
        goto release_device;
    }
    orb_cu_context saved = NULL;
    orb_cu_result r = enter(cu, ctx, &saved);
    if (r != ORB_CU_SUCCESS) {
        rc = cuda_fail(cu, r, "making the importing device's context current");
        goto release_device;
    }
    orb_cu_mem_handle h = 0;
    orb_cu_deviceptr va = 0;
    if ((r = cu->mem_import_from_shareable_handle(&h, (void *)(intptr_t)fd,
                                                  ORB_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) != ORB_CU_SUCCESS) {
        rc = cuda_fail(cu, r, "cuMemImportFromShareableHandle");
        goto leave_context;
    }
    if ((r = cu->mem_address_reserve(&va, size, 0, 0, 0)) != ORB_CU_SUCCESS) {
        rc = cuda_fail(cu, r, "cuMemAddressReserve");
        goto release_handle;
    }
    if ((r = cu->mem_map(va, size, 0, h, 0)) != ORB_CU_SUCCESS) {
        rc = cuda_fail(cu, r, "cuMemMap");
        goto free_range;
    }
    orb_cu_mem_access_desc access;
    memset(&access, 0, sizeof access);
    access.location.type = ORB_CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device;
    access.flags = ORB_CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if ((r = cu->mem_set_access(va, size, &access, 1)) != ORB_CU_SUCCESS) {
        rc = cuda_fail(cu, r, "cuMemSetAccess");
        goto unmap;
    }
    /* The mapping holds the allocation now. */
    if ((r = cu->mem_release(h)) != ORB_CU_SUCCESS)
        ORB_LOGW("cuda: cuMemRelease of an imported allocation handle failed: %s",
                 orb_cuda_describe(cu, r, (char[96]){0}, 96));
    leave(cu, saved);
    *ptr_out = (uint64_t)va; /* the context retain stays with the import */
    return 0;

unmap:
    if (cu->mem_unmap(va, size) != ORB_CU_SUCCESS) {
        /* Still mapped: the range, the allocation and the context stay. */
        ORB_LOGE("cuda: an import that failed halfway could not be unmapped: its mapping is kept");
        pthread_mutex_lock(&g_lock);
        g_retained.imports++;
        g_retained.contexts++;
        pthread_mutex_unlock(&g_lock);
        (void)cu->mem_release(h);
        leave(cu, saved);
        return rc;
    }
free_range:
    (void)cu->mem_address_free(va, size);
release_handle:
    (void)cu->mem_release(h);
leave_context:
    leave(cu, saved);
release_device:
    close_device(cu, device);
    return rc;
}

static orb_cu_result vmm_unmap(const struct orb_cuda *cu, uint64_t ptr, size_t size)
{
    orb_cu_result r = cu->mem_unmap((orb_cu_deviceptr)ptr, size);
    if (r == ORB_CU_SUCCESS && cu->mem_address_free((orb_cu_deviceptr)ptr, size) != ORB_CU_SUCCESS)
        ORB_LOGW("cuda: an unmapped import's address range could not be freed: it stays reserved");
    return r;
}

int orb_cuda_vmm_unimport(int device, uint64_t ptr, size_t size)
{
    const struct orb_cuda *cu = NULL;
    int rc = orb_cuda_get(&cu);
    if (rc != 0)
        return rc;
    if (!cu->vmm)
        return orb_fail(ORB_EUNAVAILABLE, "cuda: the driver lacks virtual memory management");
    return unimport(device, ptr, size, vmm_unmap, "cuMemUnmap");
}

/* ---- GPUDirect ------------------------------------------------------------------------------- */

/* Device `device`'s attributes attrs[0..n) into values (the device opened for it). */
static int device_attributes(int device, const unsigned int *attrs, int *values, size_t n, const char *what)
{
    const struct orb_cuda *cu = NULL;
    orb_cu_context ctx = NULL;
    int rc = open_device(device, &cu, &ctx);
    if (rc != 0)
        return rc;
    orb_cu_device dev = 0;
    orb_cu_result r = cu->device_get(&dev, device);
    for (size_t i = 0; i < n && r == ORB_CU_SUCCESS; i++)
        r = cu->device_get_attribute(&values[i], attrs[i], dev);
    close_device(cu, device);
    return r == ORB_CU_SUCCESS ? 0 : cuda_fail(cu, r, what);
}

int orb_cuda_device_gdr_writes(int device, bool *ordered_out, bool *flushable_out)
{
    if (ordered_out == NULL || flushable_out == NULL)
        return orb_fail(ORB_EINVAL, "cuda: NULL output");
    static const unsigned int attrs[] = {ORB_CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING,
                                         ORB_CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS};
    int v[2] = {0, 0};
    int rc = device_attributes(device, attrs, v, 2, "cuDeviceGetAttribute(GPU_DIRECT_RDMA_WRITES_ORDERING, "
                                                    "FLUSH_WRITES_OPTIONS)");
    if (rc != 0)
        return rc;
    const struct orb_cuda *cu = NULL;
    (void)orb_cuda_get(&cu); /* loaded: the device was opened */
    *ordered_out = v[0] >= (int)ORB_CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER;
    *flushable_out = cu->flush && (v[1] & (int)ORB_CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST) != 0;
    return 0;
}

int orb_cuda_memory_gdr_flush(orb_cuda_memory *mem)
{
    const struct orb_cuda *cu = NULL;
    orb_cu_context saved = NULL;
    int rc = enter_owner(mem, &cu, &saved); /* ORB_EINVAL for NULL */
    if (rc != 0)
        return rc;
    orb_cu_result r = cu->flush ? cu->flush_gpudirect_rdma_writes(ORB_CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX,
                                                                   ORB_CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER)
                                : ORB_CU_ERROR_NOT_SUPPORTED;
    leave(cu, saved);
    return r == ORB_CU_SUCCESS ? 0 : cuda_fail(cu, r, "cuFlushGPUDirectRDMAWrites");
}

int orb_cuda_memory_sync_memops(orb_cuda_memory *mem)
{
    const struct orb_cuda *cu = NULL;
    orb_cu_context saved = NULL;
    int rc = enter_owner(mem, &cu, &saved); /* ORB_EINVAL for NULL */
    if (rc != 0)
        return rc;
    unsigned int on = 1;
    orb_cu_result r = cu->pointer_set_attribute(&on, ORB_CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, mem->base);
    leave(cu, saved);
    return r == ORB_CU_SUCCESS ? 0 : cuda_fail(cu, r, "cuPointerSetAttribute(SYNC_MEMOPS)");
}

int orb_cuda_device_dmabuf(int device, bool *supported_out)
{
    if (supported_out == NULL)
        return orb_fail(ORB_EINVAL, "cuda: NULL output");
    static const unsigned int attr = ORB_CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED;
    int value = 0;
    int rc = device_attributes(device, &attr, &value, 1, "cuDeviceGetAttribute(DMA_BUF_SUPPORTED)");
    if (rc != 0)
        return rc;
    const struct orb_cuda *cu = NULL;
    (void)orb_cuda_get(&cu); /* loaded: the device was opened */
    *supported_out = cu->dmabuf && value != 0;
    return 0;
}

int orb_cuda_memory_dmabuf(orb_cuda_memory *mem, int *fd_out, uint64_t *base_out, uint64_t *size_out)
{
    if (mem == NULL || fd_out == NULL || base_out == NULL || size_out == NULL)
        return orb_fail(ORB_EINVAL, "cuda: NULL device memory or output");
    const struct orb_cuda *cu = NULL;
    int rc = orb_cuda_get(&cu);
    if (rc != 0)
        return rc;
    if (!cu->dmabuf)
        return orb_fail(ORB_EUNAVAILABLE, "cuda: the driver does not export cuMemGetHandleForAddressRange (dma-buf)");
    /* The host pages that hold the allocation: its base down to a page, its end up to one. */
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t base = mem->base / page * page;
    uint64_t size = ((uint64_t)mem->base + mem->size + page - 1) / page * page - base;
    orb_cu_context saved = NULL;
    if ((rc = enter_owner(mem, &cu, &saved)) != 0)
        return rc;
    orb_cu_result r;
    int fd = -1;
    r = cu->mem_get_handle_for_address_range(&fd, base, (size_t)size, ORB_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    leave(cu, saved);
    if (r != ORB_CU_SUCCESS)
        return cuda_fail(cu, r, "cuMemGetHandleForAddressRange(DMA_BUF_FD)");
    *fd_out = fd;
    *base_out = base;
    *size_out = size;
    return 0;
}
