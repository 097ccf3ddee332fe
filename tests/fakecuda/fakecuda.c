/* A CPU stand-in for the NVIDIA driver's libcuda.so.1, for tests only (never installed): the
 * Driver API exports OrbiTE resolves (lib/cuda/cuda_api.h), with the driver's rules where OrbiTE
 * depends on them.
 *
 * - Devices (2 unless fakecuda_set_devices() says otherwise before cuInit) with primary
 *   contexts counted by retain/release, and a current context per thread.
 * - Device memory at addresses of its own: each device's allocations lie in a range far outside
 *   user space, so that a CPU that dereferences a device pointer faults, as it would on a GPU;
 *   their bytes live in a memfd mapping elsewhere. Pinned host memory is ordinary mapped memory
 *   the stand-in knows.
 * - Streams run their work on a thread each, in order, so asynchrony is real: a copy queued on a
 *   stream is done only after the stream gets to it; events record a generation on a stream and
 *   are complete once the stream passed it.
 * - Fault injection and counters for the tests (fakecuda.h): fail the Nth call of an export, slow
 *   or hold every stream's operations, mark a stream capturing, count what is alive, watch (and
 *   hold back) every stream copy.
 *
 * - Virtual memory management: physical allocations (cuMemCreate) in memfds, reserved address
 *   ranges, mappings usable once cuMemSetAccess allowed them, POSIX file descriptor export and
 *   import (a memfd named for its device).
 *
 * Built three times more: FAKECUDA_OMIT_DTOD leaves out one required export (cuMemcpyDtoD_v2),
 * FAKECUDA_OMIT_VMM one of the virtual memory management group (cuMemMap), FAKECUDA_NO_DEVICE
 * makes cuInit answer CUDA_ERROR_NO_DEVICE. */
#include "fakecuda.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cuda/cuda_api.h"

#define EXPORT __attribute__((visibility("default")))

/* Each export's prototype from cuda_api.h: the definitions below must match OrbiTE's types. */
#define FAKECUDA_PROTOTYPE(field, export, params) EXPORT orb_cu_result export params;
ORB_CUDA_EXPORTS(FAKECUDA_PROTOTYPE)
ORB_CUDA_VMM_EXPORTS(FAKECUDA_PROTOTYPE)
ORB_CUDA_DMABUF_EXPORTS(FAKECUDA_PROTOTYPE)
ORB_CUDA_FLUSH_EXPORTS(FAKECUDA_PROTOTYPE)
#undef FAKECUDA_PROTOTYPE
EXPORT orb_cu_result cuCtxCreate_v2(orb_cu_context *ctx, unsigned int flags, orb_cu_device device);
EXPORT orb_cu_result cuMemCreate(orb_cu_mem_handle *handle, size_t size, const struct fakecuda_alloc_prop *prop,
                                 unsigned long long flags);
EXPORT orb_cu_result cuCtxDestroy_v2(orb_cu_context ctx);
EXPORT orb_cu_result cuMemAllocManaged(orb_cu_deviceptr *ptr, size_t bytes, unsigned int flags);
#define MAX_DEVICES 8
#define MAX_ALLOCS 1024
#define DEVICE_SPACE(d) (0xd000000000000000ull + ((unsigned long long)(d) << 44))
#define DEVICE_ALIGN 4096ull           /* a host page: dma-buf exports start on the allocation */

struct CUctx_st {
    int device;
    int refs;                          /* primary context retains */
    struct CUstream_st *default_stream; /* NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD here */
};

enum alloc_kind { ALLOC_DEVICE = 1, ALLOC_HOST = 2 };

struct alloc {
    enum alloc_kind kind;
    unsigned long long base;           /* the device address, or the host address */
    size_t size;
    uint8_t *bytes;                    /* where its bytes are */
    int fd;                            /* a device allocation's memfd */
    int device;
    /* Imported from another process (cuIpcOpenMemHandle): its exporter and allocation, and how
     * many opens of it are not closed yet. */
    struct CUctx_st *ctx;              /* the context it was made in (NULL: the primary one) */
    bool imported;
    int exporter_pid, exporter_fd;
    unsigned long long exporter_base;
    int opens;
    /* A mapping of a virtual memory management allocation (cuMemMap): phys[vmm - 1], and
     * whether cuMemSetAccess made it usable (copies refuse it before). */
    int vmm;
    bool accessible;
    unsigned int sync_memops;          /* CU_POINTER_ATTRIBUTE_SYNC_MEMOPS as set */
    bool managed;                      /* cuMemAllocManaged's: unified memory */
};

/* Virtual memory management: physical allocations (cuMemCreate, or imported from a file
 * descriptor), alive while a handle or a mapping holds them; reservations of address space. */
#define MAX_PHYS 64
#define MAX_RESERVATIONS 64
#define VMM_GRANULARITY (2ull << 20)
#define VMM_HANDLE_BASE 0x7600000000ull
#define VMM_SPACE 0xe000000000000000ull
struct phys {
    int refs;                          /* handles (create, import, retain) and mappings */
    int fd;                            /* its memfd */
    size_t size;
    int device;
    unsigned int handle_types;
    bool imported;
};
static struct phys phys[MAX_PHYS];
static struct {
    unsigned long long base;
    size_t size;
} reservations[MAX_RESERVATIONS];
static unsigned long long next_reservation = VMM_SPACE;

/* What a stand-in IPC handle holds: enough for another process of the same user to map the
 * allocation's memfd through /proc/PID/fd. */
struct ipc_handle {
    unsigned int magic;
    int pid, fd, device;
    unsigned long long base, size;
};
#define IPC_MAGIC 0x46434950u

enum op_kind { OP_COPY = 1, OP_EVENT = 2 };

struct op {
    struct op *next;
    enum op_kind kind;
    void *dst;
    const void *src;
    size_t bytes;
    struct CUevent_st *event;
    unsigned long long generation;
    struct fakecuda_copy copy;         /* OP_COPY: what a watcher is told */
};

struct CUstream_st {
    struct CUctx_st *ctx;
    pthread_t thread;
    struct op *head, *tail;
    bool running;                      /* the thread is executing an op */
    bool destroyed;
    unsigned int capture;
};

struct CUevent_st {
    unsigned long long recorded, passed; /* generations */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static bool initialised;
static int ndevices = 2;
static struct CUctx_st contexts[MAX_DEVICES];
/* Contexts made with cuCtxCreate (not the primary ones): a test's, for memory of another context. */
#define MAX_CREATED 8
static struct CUctx_st created[MAX_CREATED];
static unsigned long long next_address[MAX_DEVICES];
static struct alloc allocs[MAX_ALLOCS];
/* Initial-exec: the stand-in is dlopen'ed, and a dynamic TLS block would be reached through
 * __tls_get_addr, whose ThreadSanitizer interceptor (GCC 12's libtsan) can compute a bogus range
 * for a new thread's first access and abort the test trying to map shadow for it. One pointer
 * fits the static TLS that glibc keeps for libraries loaded later. */
static _Thread_local struct CUctx_st *current __attribute__((tls_model("initial-exec")));
static long live_streams, live_events, blocking_streams;
static unsigned slow_us;
static bool held;                      /* fakecuda_hold_streams(): no stream runs anything */
static int dmabuf_supported = 1;       /* CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED (fakecuda_set_dmabuf) */
static unsigned long long dmabuf_exports; /* descriptors cuMemGetHandleForAddressRange gave */
static int rdma_ordering = 100;        /* CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING */
static unsigned long long rdma_flushes; /* cuFlushGPUDirectRDMAWrites calls */
static void (*watch_fn)(const struct fakecuda_copy *copy, void *arg); /* fakecuda_watch_copies() */
static void *watch_arg;
static long watch_calls;               /* calls of a watcher running now */

/* ---- fault injection ------------------------------------------------------------------------- */

/* Armed failures, one per export (arming an export again replaces its failure). */
#define MAX_FAULTS 8
static struct {
    char name[64];
    unsigned long long nth, calls;
    orb_cu_result rc;
} faults[MAX_FAULTS];

EXPORT void fakecuda_fail(const char *export, unsigned long long nth, unsigned int rc)
{
    pthread_mutex_lock(&lock);
    size_t slot = MAX_FAULTS;
    for (size_t i = 0; i < MAX_FAULTS && slot == MAX_FAULTS; i++)
        if (faults[i].nth != 0 && strcmp(faults[i].name, export != NULL ? export : "") == 0)
            slot = i;
    for (size_t i = 0; i < MAX_FAULTS && slot == MAX_FAULTS; i++)
        if (faults[i].nth == 0)
            slot = i;
    if (slot < MAX_FAULTS) {
        snprintf(faults[slot].name, sizeof faults[slot].name, "%s", export != NULL ? export : "");
        faults[slot].nth = nth;
        faults[slot].calls = 0;
        faults[slot].rc = rc;
    }
    pthread_mutex_unlock(&lock);
}

/* The armed failure of `export`, if this call is its Nth (lock held). */
static orb_cu_result injected(const char *export)
{
    for (size_t i = 0; i < MAX_FAULTS; i++)
        if (faults[i].nth != 0 && strcmp(faults[i].name, export) == 0) {
            if (++faults[i].calls != faults[i].nth)
                return ORB_CU_SUCCESS;
            faults[i].nth = 0;
            return faults[i].rc;
        }
    return ORB_CU_SUCCESS;
}

#define ENTER(export)                                                                                      \
    pthread_mutex_lock(&lock);                                                                             \
    do {                                                                                                   \
        orb_cu_result rc_ = !initialised ? ORB_CU_ERROR_NOT_INITIALIZED : injected(export);               \
        if (rc_ != ORB_CU_SUCCESS) {                                                                       \
            pthread_mutex_unlock(&lock);                                                                   \
            return rc_;                                                                                    \
        }                                                                                                  \
    } while (0)
#define LEAVE(rc)                                                                                          \
    do {                                                                                                   \
        orb_cu_result leave_ = (rc); /* evaluated under the lock */                                        \
        pthread_mutex_unlock(&lock);                                                                       \
        return leave_;                                                                                     \
    } while (0)

EXPORT void fakecuda_set_dmabuf(int supported)
{
    pthread_mutex_lock(&lock);
    dmabuf_supported = supported != 0;
    pthread_mutex_unlock(&lock);
}

EXPORT void fakecuda_set_rdma_ordering(int ordering)
{
    pthread_mutex_lock(&lock);
    rdma_ordering = ordering;
    pthread_mutex_unlock(&lock);
}

static uint8_t *bytes_of(unsigned long long addr, size_t bytes, bool device);

EXPORT void *fakecuda_host_view(unsigned long long dptr, size_t bytes)
{
    pthread_mutex_lock(&lock);
    void *p = bytes_of(dptr, bytes, true);
    pthread_mutex_unlock(&lock);
    return p;
}

EXPORT orb_cu_result cuFlushGPUDirectRDMAWrites(unsigned int target, unsigned int scope)
{
    ENTER("cuFlushGPUDirectRDMAWrites");
    if (target != ORB_CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX ||
        (scope != ORB_CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER && scope != 200u))
        LEAVE(ORB_CU_ERROR_INVALID_VALUE);
    if (current == NULL)
        LEAVE(ORB_CU_ERROR_INVALID_CONTEXT);
    rdma_flushes++;
    LEAVE(ORB_CU_SUCCESS);
}

EXPORT void fakecuda_set_devices(int n)
{
    pthread_mutex_lock(&lock);
    if (!initialised && n >= 0 && n <= MAX_DEVICES)
        ndevices = n;
    pthread_mutex_unlock(&lock);
}

EXPORT void fakecuda_slow_streams(unsigned microseconds)
{
    pthread_mutex_lock(&lock);
    slow_us = microseconds;
    pthread_mutex_unlock(&lock);
}

EXPORT void fakecuda_hold_streams(int hold)
{
    pthread_mutex_lock(&lock);
    held = hold != 0;
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&lock);
}

EXPORT void fakecuda_watch_copies(void (*fn)(const struct fakecuda_copy *copy, void *arg), void *arg)
{
    pthread_mutex_lock(&lock);
    watch_fn = fn;
    watch_arg = arg;
    while (watch_calls > 0)
        pthread_cond_wait(&changed, &lock);
    pthread_mutex_unlock(&lock);
}

EXPORT void fakecuda_set_capturing(orb_cu_stream stream, unsigned int status)
{
    pthread_mutex_lock(&lock);
    stream->capture = status;
    pthread_mutex_unlock(&lock);
}

EXPORT struct fakecuda_counts fakecuda_counts(void)
{
    struct fakecuda_counts c = {0};
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < MAX_ALLOCS; i++) {
        if (allocs[i].kind == ALLOC_DEVICE && allocs[i].imported)
            c.imports++;
        else if (allocs[i].kind == ALLOC_DEVICE)
            c.device_allocations++;
        else if (allocs[i].kind == ALLOC_HOST)
            c.host_allocations++;
    }
    for (int d = 0; d < ndevices; d++)
        c.primary_refs += contexts[d].refs;
    for (size_t i = 0; i < MAX_PHYS; i++)
        c.vmm_allocations += phys[i].refs > 0;
    for (size_t i = 0; i < MAX_RESERVATIONS; i++)
        c.reservations += reservations[i].size > 0;
    c.dmabuf_exports = (long)dmabuf_exports;
    c.rdma_flushes = (long)rdma_flushes;
    c.streams = live_streams;
    c.blocking_streams = blocking_streams;
    c.events = live_events;
    pthread_mutex_unlock(&lock);
    return c;
}

/* ---- init, errors, devices --------------------------------------------------------------------- */

EXPORT orb_cu_result cuInit(unsigned int flags)
{
    pthread_mutex_lock(&lock);
    orb_cu_result rc = injected("cuInit");
#ifdef FAKECUDA_NO_DEVICE
    rc = ORB_CU_ERROR_NO_DEVICE;
#endif
    if (rc == ORB_CU_SUCCESS && flags != 0)
        rc = ORB_CU_ERROR_INVALID_VALUE;
    if (rc == ORB_CU_SUCCESS && !initialised) {
        initialised = true;
        for (int d = 0; d < MAX_DEVICES; d++) {
            contexts[d].device = d;
            next_address[d] = DEVICE_SPACE(d);
        }
    }
    LEAVE(rc);
}

EXPORT orb_cu_result cuDriverGetVersion(int *version)
{
    if (version == NULL)
        return ORB_CU_ERROR_INVALID_VALUE;
    *version = 12080; /* needs no cuInit, as the driver's */
    return ORB_CU_SUCCESS;
}

static const struct {
    orb_cu_result rc;
    const char *name, *text;
} errors[] = {
    {ORB_CU_SUCCESS, "CUDA_SUCCESS", "no error"},
    {ORB_CU_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {ORB_CU_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {ORB_CU_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {ORB_CU_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {ORB_CU_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {ORB_CU_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {ORB_CU_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {ORB_CU_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {ORB_CU_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {999u, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static orb_cu_result error_entry(orb_cu_result error, const char **out, bool name)
{
    if (out == NULL)
        return ORB_CU_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (errors[i].rc == error) {
            *out = name ? errors[i].name : errors[i].text;
            return ORB_CU_SUCCESS;
        }
    *out = NULL;
    return ORB_CU_ERROR_INVALID_VALUE;
}

EXPORT orb_cu_result cuGetErrorName(orb_cu_result error, const char **name)
{
    return error_entry(error, name, true);
}

EXPORT orb_cu_result cuGetErrorString(orb_cu_result error, const char **text)
{
    return error_entry(error, text, false);
}

/* The driver's answer for an output pointer and a device ordinal (lock held). */
static orb_cu_result check_device(const void *out, orb_cu_device device)
{
    if (out == NULL)
        return ORB_CU_ERROR_INVALID_VALUE;
    return device < 0 || device >= ndevices ? ORB_CU_ERROR_INVALID_DEVICE : ORB_CU_SUCCESS;
}

#define CHECK_DEVICE(out, device)                                                                          \
    do {                                                                                                   \
        orb_cu_result check_ = check_device(out, device);                                                  \
        if (check_ != ORB_CU_SUCCESS)                                                                      \
            LEAVE(check_);                                                                                 \
    } while (0)

EXPORT orb_cu_result cuDeviceGetCount(int *count)
{
    ENTER("cuDeviceGetCount");
    if (count == NULL)
        LEAVE(ORB_CU_ERROR_INVALID_VALUE);
    *count = ndevices;
    LEAVE(ORB_CU_SUCCESS);
}

EXPORT orb_cu_result cuDeviceGet(orb_cu_device *device, int ordinal)
{
    ENTER("cuDeviceGet");
    CHECK_DEVICE(device, ordinal);
    *device = ordinal;
    LEAVE(ORB_CU_SUCCESS);
}

EXPORT orb_cu_result cuDeviceGetAttribute(int *value, unsigned int attribute, orb_cu_device device)
{
    ENTER("cuDeviceGetAttribute");
    CHECK_DEVICE(value, device);
    switch (attribute) {
    case ORB_CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
        *value = 0x41 + device;
        break;
    case ORB_CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID:
    case ORB_CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID:
        *value = 0;
        break;
    case ORB_CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
        *value = 1;
        break;
    case ORB_CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED:
        *value = dmabuf_supported;
        break;
    case ORB_CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING:
        *value = rdma_ordering;
        break;
    case ORB_CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS:
        *value = (int)ORB_CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST;
        break;
    default:
        LEAVE(ORB_CU_ERROR_INVALID_VALUE);
    }
    LEAVE(ORB_CU_SUCCESS);
}

EXPORT orb_cu_result cuDeviceGetName(char *name, int len, orb_cu_device device)
{
    ENTER("cuDeviceGetName");
    CHECK_DEVICE(len > 0 ? name : NULL, device);
    snprintf(name, (size_t)len, "fakecuda device %d", device);
    LEAVE(ORB_CU_SUCCESS);
}

EXPORT orb_cu_result cuDeviceGetPCIBusId(char *id, int len, orb_cu_device device)
{
    ENTER("cuDeviceGetPCIBusId");
    CHECK_DEVICE(len >= 13 ? id : NULL, device);
    snprintf(id, (size_t)len, "0000:%02x:00.0", 0x41 + device);
    LEAVE(ORB_CU_SUCCESS);
}

/* ---- contexts ---------------------------------------------------------------------------------- */

EXPORT orb_cu_result cuDevicePrimaryCtxRetain(orb_cu_context *ctx, orb_cu_device device)
{
    ENTER("cuDevicePrimaryCtxRetain");
    CHECK_DEVICE(ctx, device);
    contexts[device].refs++;
    *ctx = &contexts[device];
    LEAVE(ORB_CU_SUCCESS);
}

EXPORT orb_cu_result cuDevicePrimaryCtxRelease_v2(orb_cu_device device)
{
    ENTER("cuDevicePrimaryCtxRelease_v2");
    if (device < 0 || device >= ndevices)
        LEAVE(ORB_CU_ERROR_INVALID_DEVICE);
    if (contexts[device].refs == 0)
        LEAVE(ORB_CU_ERROR_INVALID_CONTEXT);
    contexts[device].refs--;
    LEAVE(ORB_CU_SUCCESS);
}

/* Whether `ctx` is a live context (lock held). */
static bool live_context(const struct CUctx_st *ctx)
{
    return ctx != NULL && ((ctx >= contexts && ctx < contexts + ndevices) || (ctx >= created && ctx < created + MAX_CREATED)) &&
           ctx->refs > 0;
}

/* Not resolved by OrbiTE's loader: tests call them through dlsym to make memory of a context
 * other than the device's primary one. The new context becomes current, as the driver's does. */
EXPORT orb_cu_result cuCtxCreate_v2(orb_cu_context *ctx, unsigned int flags, orb_cu_device device)
{
    ENTER("cuCtxCreate_v2");
    (void)flags;
    if (ctx == NULL || device < 0 || device >= ndevices)
        LEAVE(ORB_CU_ERROR_INVALID_VALUE);
    for (int i = 0; i < MAX_CREATED; i++)
        if (created[i].refs == 0) {
            created[i] = (struct CUctx_st){.device = device, .refs = 1};
            current = &created[i];
            *ctx = &created[i];
            LEAVE(ORB_CU_SUCCESS);
        }
    LEAVE(ORB_CU_ERROR_OUT_OF_MEMORY);
}

EXPORT orb_cu_result cuCtxDestroy_v2(orb_cu_context ctx)
{
    ENTER("cuCtxDestroy_v2");
    if (ctx == NULL || ctx < created || ctx >= created + MAX_CREATED || ctx->refs == 0)
        LEAVE(ORB_CU_ERROR_INVALID_CONTEXT);
    ctx->refs = 0;
    if (current == ctx)
        current = NULL;
    LEAVE(ORB_CU_SUCCESS);
}

EXPORT orb_cu_result cuCtxSetCurrent(orb_cu_context ctx)
{
    ENTER("cuCtxSetCurrent");
    if (ctx != NULL && !live_context(ctx))
        LEAVE(ORB_CU_ERROR_INVALID_CONTEXT);
    current = ctx;
    LEAVE(ORB_CU_SUCCESS);
}

EXPORT orb_cu_result cuCtxGetCurrent(orb_cu_context *ctx)
{
    ENTER("cuCtxGetCurrent");
    if (ctx == NULL)
        LEAVE(ORB_CU_ERROR_INVALID_VALUE);
    *ctx = current;
    LEAVE(ORB_CU_SUCCESS);
}

EXPORT orb_cu_result cuCtxGetDevice(orb_cu_device *device)
{
    ENTER("cuCtxGetDevice");
    if (device == NULL)
        LEAVE(ORB_CU_ERROR_INVALID_VALUE);
    if (!live_context(current))
        LEAVE(ORB_CU_ERROR_INVALID_CONTEXT);
    *device = current->device;
    LEAVE(ORB_CU_SUCCESS);
}

/* ---- memory ------------------------------------------------------------------------------------- */

/* The allocation holding [addr, +bytes) whole, or NULL (lock held). */
static struct alloc *find(unsigned long long addr, size_t bytes)
{
    for (size_t i = 0; i < MAX_ALLOCS; i++) {
        struct alloc *a = &allocs[i];
        if (a->kind != 0 && addr >= a->base && addr - a->base <= a->size && bytes <= a->size - (addr - a->base) &&
            (bytes > 0 || addr < a->base + a->size))
            return a;
    }
    return NULL;
}

static struct alloc *free_slot(void)
{
    for (size_t i = 0; i < MAX_ALLOCS; i++)
        if (allocs[i].kind == 0)
            return &allocs[i];
    return NULL;
}

static orb_cu_result mem_alloc(orb_cu_deviceptr *ptr, size_t bytes, bool managed);

EXPORT orb_cu_result cuMemAlloc_v2(orb_cu_deviceptr *ptr, size_t bytes)
{
    ENTER("cuMemAlloc_v2");
    LEAVE(mem_alloc(ptr, bytes, false));
}

/* Unified memory, for applications (OrbiTE refuses to adopt it): device memory to the pointer
 * attributes, IS_MANAGED set. */
EXPORT orb_cu_result cuMemAllocManaged(orb_cu_deviceptr *ptr, size_t bytes, unsigned int flags)
{
    ENTER("cuMemAllocManaged");
    (void)flags;
    LEAVE(mem_alloc(ptr, bytes, true));
}

/* cuMemAlloc and cuMemAllocManaged, under the lock. */
static orb_cu_result mem_alloc(orb_cu_deviceptr *ptr, size_t bytes, bool managed)
{
    if (ptr == NULL || bytes == 0)
        return ORB_CU_ERROR_INVALID_VALUE;
    if (!live_context(current))
        return ORB_CU_ERROR_INVALID_CONTEXT;
    struct alloc *a = free_slot();
    int fd = a != NULL ? memfd_create("fakecuda", MFD_CLOEXEC) : -1;
    void *bytes_at = MAP_FAILED;
    if (fd >= 0 && ftruncate(fd, (off_t)bytes) == 0)
        bytes_at = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (bytes_at == MAP_FAILED) {
        if (fd >= 0)
            close(fd);
        return ORB_CU_ERROR_OUT_OF_MEMORY;
    }
    int d = current->device;
    *a = (struct alloc){.kind = ALLOC_DEVICE, .base = next_address[d], .size = bytes, .bytes = bytes_at, .fd = fd,
                        .device = d, .ctx = current, .managed = managed};
    next_address[d] += (bytes + DEVICE_ALIGN - 1) / DEVICE_ALIGN * DEVICE_ALIGN + DEVICE_ALIGN; /* never reused */
    *ptr = a->base;
    return ORB_CU_SUCCESS;
}

EXPORT orb_cu_result cuMemFree_v2(orb_cu_deviceptr ptr)
{
    ENTER("cuMemFree_v2");
    struct alloc *a = find(ptr, 0);
    if (a == NULL || a->kind != ALLOC_DEVICE || a->base != ptr || a->imported || a->vmm != 0)
        LEAVE(ORB_CU_ERROR_INVALID_VALUE);
    munmap(a->bytes, a->size);
    close(a->fd);
    memset(a, 0, sizeof *a);
    LEAVE(ORB_CU_SUCCESS);
}

EXPORT orb_cu_result cuIpcGetMemHandle(orb_cu_ipc_mem_handle *handle, orb_cu_deviceptr ptr)
{
    ENTER("cuIpcGetMemHandle");
    struct alloc *a = find(ptr, 0);
    if (handle == NULL || a == NULL || a->kind != ALLOC_DEVICE || a->imported || a->vmm != 0)
        LEAVE(ORB_CU_ERROR_INVALID_VALUE);
    struct ipc_handle h = {.magic = IPC_MAGIC, .pid = (int)getpid(), .fd = a->fd, .device = a->device,
                           .base = a->base, .size = a->size};
    memset(handle, 0, sizeof *handle);
    memcpy(handle->reserved, &h, sizeof h);
    LEAVE(ORB_CU_SUCCESS);
}

EXPORT orb_cu_result cuIpcOpenMemHandle_v2(orb_cu_deviceptr *ptr, orb_cu_ipc_mem_handle handle, unsigned int flags)
{
    ENTER("cuIpcOpenMemHandle_v2");
    struct ipc_handle h;
    memcpy(&h, handle.reserved, sizeof h);
    if (ptr == NULL || h.magic != IPC_MAGIC || (flags & ~ORB_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != 0)
        LEAVE(ORB_CU_ERROR_INVALID_VALUE);
    if (!live_context(current) || h.pid == (int)getpid()) /* as the driver: not in its own process */
        LEAVE(ORB_CU_ERROR_INVALID_CONTEXT);
    for (size_t i = 0; i < MAX_ALLOCS; i++) {
        struct alloc *a = &allocs[i];
        if (a->kind == ALLOC_DEVICE && a->imported && a->exporter_pid == h.pid && a->exporter_base == h.base) {
            a->opens++;
            *ptr = a->base;
            LEAVE(ORB_CU_SUCCESS);
        }
    }
    struct alloc *a = free_slot();
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", h.pid, h.fd);
    int fd = a != NULL ? open(path, O_RDWR | O_CLOEXEC) : -1;
    void *bytes_at = fd >= 0 ? mmap(NULL, h.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (bytes_at == MAP_FAILED) {
        if (fd >= 0)
            close(fd);
        LEAVE(ORB_CU_ERROR_INVALID_VALUE); /* the exporter or its allocation is gone */
    }
    int d = h.device >= 0 && h.device < ndevices ? h.device : current->device;
    *a = (struct alloc){.kind = ALLOC_DEVICE, .base = next_address[d], .size = h.size, .bytes = bytes_at, .fd = fd,
                        .device = d, .imported = true, .exporter_pid = h.pid, .exporter_fd = h.fd,
                        .exporter_base = h.base, .opens = 1};
    next_address[d] += (h.size + DEVICE_ALIGN - 1) / DEVICE_ALIGN * DEVICE_ALIGN + DEVICE_ALIGN;
    *ptr = a->base;
    LEAVE(ORB_CU_SUCCESS);
}

EXPORT orb_cu_result cuIpcCloseMemHandle(orb_cu_deviceptr ptr)
{
    ENTER("cuIpcCloseMemHandle");
    struct alloc *a = find(ptr, 0);
    if (a == NULL || !a->imported || a->base != ptr)
        LEAVE(ORB_CU_ERROR_INVALID_VALUE);
    if (--a->opens == 0) {
        munmap(a->bytes, a->size);
        close(a->fd);
        memset(a, 0, sizeof *a);
    }
    LEAVE(ORB_CU_SUCCESS);
}

EXPORT orb_cu_result cuMemGetAddressRange_v2(orb_cu_deviceptr *base, size_t *size, orb_cu_deviceptr ptr)
{
    ENTER("cuMemGetAddressRange_v2");
    struct alloc *a = find(ptr, 0);
    if (a == NULL || a->kind != ALLOC_DEVICE)
        LEAVE(ORB_CU_ERROR_INVALID_VALUE);
    if (base != NULL)
        *base = a->base;
    if (size != NULL)
        *size = a->size;
    LEAVE(ORB_CU_SUCCESS);
}

EXPORT orb_cu_result cuMemHostAlloc(void **ptr, size_t bytes, unsigned int flags)
{
    ENTER("cuMemHostAlloc");
    if (ptr == NULL || bytes == 0 || (flags & ~0xfu) != 0)
        LEAVE(ORB_CU_ERROR_INVALID_VALUE);
    if (!live_context(current))
        LEAVE(ORB_CU_ERROR_INVALID_CONTEXT);
    struct alloc *a = free_slot();
    void *p = a != NULL ? mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) : MAP_FAILED;
    if (p == MAP_FAILED)
        LEAVE(ORB_CU_ERROR_OUT_OF_MEMORY);
    *a = (struct alloc){.kind = ALLOC_HOST, .base = (unsigned long long)(uintptr_t)p, .size = bytes, .bytes = p,
                        .fd = -1, .device = current->device};
    *ptr = p;
    LEAVE(ORB_CU_SUCCESS);
}

EXPORT orb_cu_result cuMemFreeHost(void *ptr)
{
    ENTER("cuMemFreeHost");
    struct alloc *a = find((unsigned long long)(uintptr_t)ptr, 0);
    if (a == NULL || a->kind != ALLOC_HOST || a->bytes != ptr)
        LEAVE(ORB_CU_ERROR_INVALID_VALUE);
    munmap(a->bytes, a->size);
    memset(a, 0, sizeof *a);
    LEAVE(ORB_CU_SUCCESS);
}

EXPORT orb_cu_result cuPointerGetAttribute(void *data, unsigned int attribute, orb_cu_deviceptr ptr)
{
    ENTER("cuPointerGetAttribute");
    struct alloc *a = find(ptr, 0);
    if (data == NULL)
        LEAVE(ORB_CU_ERROR_INVALID_VALUE);
    if (a == NULL) /* memory the driver does not know: as the driver answers for it */
        LEAVE(ORB_CU_ERROR_INVALID_VALUE);
    switch (attribute) {
    case ORB_CU_POINTER_ATTRIBUTE_CONTEXT: /* a mapping belongs to no context */
        *(orb_cu_context *)data = a->vmm != 0 ? NULL : a->ctx != NULL ? a->ctx : &contexts[a->device];
        break;
    case ORB_CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
        *(unsigned long long *)data = a->vmm != 0 ? phys[a->vmm - 1].handle_types : 0;
        break;
    case ORB_CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned int *)data = a->kind == ALLOC_DEVICE ? ORB_CU_MEMORYTYPE_DEVICE : ORB_CU_MEMORYTYPE_HOST;
        break;
    case ORB_CU_POINTER_ATTRIBUTE_IS_MANAGED:
        *(unsigned int *)data = a->managed;
        break;
    case ORB_CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
        *(unsigned int *)data = a->sync_memops;
        break;
    case ORB_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = a->device;
        break;
    case ORB_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *(orb_cu_deviceptr *)data = a->base;
        break;
    case ORB_CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        *(size_t *)data = a->size;
        break;
    case ORB_CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
        *(int *)data = a->kind == ALLOC_DEVICE && !a->imported && a->vmm == 0;
        break;
    default:
        LEAVE(ORB_CU_ERROR_INVALID_VALUE);
    }
    LEAVE(ORB_CU_SUCCESS);
}

/* Only SYNC_MEMOPS can be set, on device memory, as with the driver. */
EXPORT orb_cu_result cuPointerSetAttribute(const void *value, unsigned int attribute, orb_cu_deviceptr ptr)
{
    ENTER("cuPointerSetAttribute");
    struct alloc *a = find(ptr, 0);
    if (value == NULL || a == NULL || a->kind != ALLOC_DEVICE || attribute != ORB_CU_POINTER_ATTRIBUTE_SYNC_MEMOPS)
        LEAVE(ORB_CU_ERROR_INVALID_VALUE);
    a->sync_memops = *(const unsigned int *)value != 0;
    LEAVE(ORB_CU_SUCCESS);
}

/* Where the bytes of [addr, +bytes) are: a device range's backing, a pinned or any other host
 * address itself (the driver copies from pageable memory too). NULL: a device address that no
 * allocation holds whole (lock held). */
static uint8_t *bytes_of(unsigned long long addr, size_t bytes, bool device)
{
    if (!device)
        return (uint8_t *)(uintptr_t)addr;
    struct alloc *a = find(addr, bytes);
    return a != NULL && a->kind == ALLOC_DEVICE && (a->vmm == 0 || a->accessible) ? a->bytes + (addr - a->base)
                                                                                    : NULL;
}

/* dma-buf: a descriptor for a whole allocation, as the driver exports it (the stand-in's is a
 * duplicate of the allocation's memfd). The range must be the host pages holding the allocation
 * (its allocations start on a page); flags must be zero. */
EXPORT orb_cu_result cuMemGetHandleForAddressRange(void *handle, orb_cu_deviceptr ptr, size_t size, unsigned int type,
                                                   unsigned long long flags)
{
    ENTER("cuMemGetHandleForAddressRange");
    struct alloc *a = find(ptr, 0);
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (handle == NULL || a == NULL || a->kind != ALLOC_DEVICE || a->base != ptr || a->imported ||
        type != ORB_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD || flags != 0 || size != (a->size + page - 1) / page * page)
        LEAVE(ORB_CU_ERROR_INVALID_VALUE);
    if (!dmabuf_supported)
        LEAVE(ORB_CU_ERROR_NOT_SUPPORTED);
    int fd = fcntl(a->vmm != 0 ? phys[a->vmm - 1].fd : a->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0)
        LEAVE(ORB_CU_ERROR_OUT_OF_MEMORY);
    dmabuf_exports++;
    *(int *)handle = fd;
    LEAVE(ORB_CU_SUCCESS);
}

/* ---- virtual memory management ------------------------------------------------------------------ */

static struct phys *phys_of(orb_cu_mem_handle h)
{
    if (h < VMM_HANDLE_BASE || h >= VMM_HANDLE_BASE + MAX_PHYS || phys[h - VMM_HANDLE_BASE].refs <= 0)
        return NULL;
    return &phys[h - VMM_HANDLE_BASE];
}

static void phys_put(struct phys *p)
{
    if (--p->refs == 0) {
        close(p->fd);
        memset(p, 0, sizeof *p);
    }
}

/* A new physical allocation on `fd` (taken), its handle in *h; false when the table is full. */
static bool phys_add(int fd, size_t size, int device, unsigned int types, bool imported, orb_cu_mem_handle *h)
{
    for (size_t i = 0; i < MAX_PHYS; i++)
        if (phys[i].refs == 0) {
            phys[i] = (struct phys){.refs = 1, .fd = fd, .size = size, .device = device, .handle_types = types,
                                    .imported = imported};
            *h = VMM_HANDLE_BASE + i;
            return true;
        }
    return false;
}

EXPORT orb_cu_result cuMemCreate(orb_cu_mem_handle *handle, size_t size, const struct fakecuda_alloc_prop *prop,
                                 unsigned long long flags)
{
    ENTER("cuMemCreate");
    if (handle == NULL || prop == NULL || flags != 0 || size == 0 || size % VMM_GRANULARITY != 0 ||
        prop->type != 1 || prop->location.type != ORB_CU_MEM_LOCATION_TYPE_DEVICE || prop->location.id < 0 ||
        prop->location.id >= ndevices || (prop->requested_handle_types & ~ORB_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
        LEAVE(ORB_CU_ERROR_INVALID_VALUE);
    char name[32];
    snprintf(name, sizeof name, "fakecuda-vmm-d%d", prop->location.id);
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0 ||
        !phys_add(fd, size, prop->location.id, prop->requested_handle_types, false, handle)) {
        if (fd >= 0)
            close(fd);
        LEAVE(ORB_CU_ERROR_OUT_OF_MEMORY);
    }
    LEAVE(ORB_CU_SUCCESS);
}

EXPORT orb_cu_result cuMemRelease(orb_cu_mem_handle handle)
{
    ENTER("cuMemRelease");
    struct phys *p = phys_of(handle);
    if (p == NULL)
        LEAVE(ORB_CU_ERROR_INVALID_VALUE);
    phys_put(p);
    LEAVE(ORB_CU_SUCCESS);
}

EXPORT orb_cu_result cuMemRetainAllocationHandle(orb_cu_mem_handle *handle, void *addr)
{
    ENTER("cuMemRetainAllocationHandle");
    struct alloc *a = find((unsigned long long)(uintptr_t)addr, 0);
    if (handle == NULL || a == NULL || a->vmm == 0)
        LEAVE(ORB_CU_ERROR_INVALID_VALUE);
    phys[a->vmm - 1].refs++;
    *handle = VMM_HANDLE_BASE + (unsigned long long)(a->vmm - 1);
    LEAVE(ORB_CU_SUCCESS);
}

EXPORT orb_cu_result cuMemExportToShareableHandle(void *shareable, orb_cu_mem_handle handle, unsigned int type,
                                                  unsigned long long flags)
{
    ENTER("cuMemExportToShareableHandle");
    struct phys *p = phys_of(handle);
    if (shareable == NULL || p == NULL || flags != 0 || type != ORB_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        LEAVE(ORB_CU_ERROR_INVALID_VALUE);
    if ((p->handle_types & type) == 0)
        LEAVE(ORB_CU_ERROR_NOT_SUPPORTED); /* not asked for at cuMemCreate */
    int fd = fcntl(p->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0)
        LEAVE(ORB_CU_ERROR_OUT_OF_MEMORY);
    *(int *)shareable = fd;
    LEAVE(ORB_CU_SUCCESS);
}

EXPORT orb_cu_result cuMemImportFromShareableHandle(orb_cu_mem_handle *handle, void *os_handle, unsigned int type)
{
    ENTER("cuMemImportFromShareableHandle");
    int given = (int)(intptr_t)os_handle;
    char link[64], target[128];
    snprintf(link, sizeof link, "/proc/self/fd/%d", given);
    ssize_t n = readlink(link, target, sizeof target - 1);
    int device = 0;
    struct stat st;
    if (handle == NULL || type != ORB_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || n <= 0 ||
        (target[n] = '\0', sscanf(target, "/memfd:fakecuda-vmm-d%d", &device) != 1) || device < 0 ||
        device >= ndevices || fstat(given, &st) != 0 || st.st_size <= 0)
        LEAVE(ORB_CU_ERROR_INVALID_VALUE); /* not a descriptor an exporter gave */
    int fd = fcntl(given, F_DUPFD_CLOEXEC, 0); /* the caller keeps its own, as with the driver */
    if (fd < 0 || !phys_add(fd, (size_t)st.st_size, device, type, true, handle)) {
        if (fd >= 0)
            close(fd);
        LEAVE(ORB_CU_ERROR_OUT_OF_MEMORY);
    }
    LEAVE(ORB_CU_SUCCESS);
}

EXPORT orb_cu_result cuMemAddressReserve(orb_cu_deviceptr *ptr, size_t size, size_t alignment, orb_cu_deviceptr addr,
                                         unsigned long long flags)
{
    ENTER("cuMemAddressReserve");
    (void)addr; /* a hint only */
    if (ptr == NULL || size == 0 || size % VMM_GRANULARITY != 0 || flags != 0 ||
        (alignment != 0 && (alignment & (alignment - 1)) != 0))
        LEAVE(ORB_CU_ERROR_INVALID_VALUE);
    for (size_t i = 0; i < MAX_RESERVATIONS; i++)
        if (reservations[i].size == 0) {
            unsigned long long align = alignment > VMM_GRANULARITY ? alignment : VMM_GRANULARITY;
            unsigned long long base = (next_reservation + align - 1) / align * align;
            reservations[i].base = base;
            reservations[i].size = size;
            next_reservation = base + size + VMM_GRANULARITY; /* never reused */
            *ptr = base;
            LEAVE(ORB_CU_SUCCESS);
        }
    LEAVE(ORB_CU_ERROR_OUT_OF_MEMORY);
}

EXPORT orb_cu_result cuMemAddressFree(orb_cu_deviceptr ptr, size_t size)
{
    ENTER("cuMemAddressFree");
    for (size_t i = 0; i < MAX_RESERVATIONS; i++)
        if (reservations[i].size != 0 && reservations[i].base == ptr && reservations[i].size == size) {
            for (size_t j = 0; j < MAX_ALLOCS; j++)
                if (allocs[j].vmm != 0 && allocs[j].base >= ptr && allocs[j].base - ptr < size)
                    LEAVE(ORB_CU_ERROR_INVALID_VALUE); /* still mapped */
            reservations[i].base = 0;
            reservations[i].size = 0;
            LEAVE(ORB_CU_SUCCESS);
        }
    LEAVE(ORB_CU_ERROR_INVALID_VALUE);
}

#ifndef FAKECUDA_OMIT_VMM
EXPORT orb_cu_result cuMemMap(orb_cu_deviceptr ptr, size_t size, size_t offset, orb_cu_mem_handle handle,
                              unsigned long long flags)
{
    ENTER("cuMemMap");
    struct phys *p = phys_of(handle);
    bool reserved = false;
    for (size_t i = 0; i < MAX_RESERVATIONS && !reserved; i++)
        reserved = reservations[i].size != 0 && ptr >= reservations[i].base &&
                   ptr - reservations[i].base <= reservations[i].size &&
                   size <= reservations[i].size - (ptr - reservations[i].base);
    if (p == NULL || offset != 0 || flags != 0 || size == 0 || size > p->size || size % VMM_GRANULARITY != 0 ||
        !reserved)
        LEAVE(ORB_CU_ERROR_INVALID_VALUE);
    for (size_t j = 0; j < MAX_ALLOCS; j++)
        if (allocs[j].vmm != 0 && allocs[j].base < ptr + size && ptr < allocs[j].base + allocs[j].size)
            LEAVE(ORB_CU_ERROR_ALREADY_MAPPED);
    struct alloc *a = free_slot();
    void *bytes_at = a != NULL ? mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, p->fd, 0) : MAP_FAILED;
    if (bytes_at == MAP_FAILED)
        LEAVE(ORB_CU_ERROR_OUT_OF_MEMORY);
    *a = (struct alloc){.kind = ALLOC_DEVICE, .base = ptr, .size = size, .bytes = bytes_at, .fd = -1,
                        .device = p->device, .imported = p->imported, .vmm = (int)(p - phys) + 1};
    p->refs++;
    LEAVE(ORB_CU_SUCCESS);
}

#endif

EXPORT orb_cu_result cuMemUnmap(orb_cu_deviceptr ptr, size_t size)
{
    ENTER("cuMemUnmap");
    struct alloc *a = find(ptr, 0);
    if (a == NULL || a->vmm == 0 || a->base != ptr || a->size != size)
        LEAVE(ORB_CU_ERROR_INVALID_VALUE);
    munmap(a->bytes, a->size);
    struct phys *p = &phys[a->vmm - 1];
    memset(a, 0, sizeof *a);
    phys_put(p);
    LEAVE(ORB_CU_SUCCESS);
}

EXPORT orb_cu_result cuMemSetAccess(orb_cu_deviceptr ptr, size_t size, const orb_cu_mem_access_desc *desc,
                                    size_t count)
{
    ENTER("cuMemSetAccess");
    struct alloc *a = find(ptr, size);
    if (a == NULL || a->vmm == 0 || desc == NULL || count == 0)
        LEAVE(ORB_CU_ERROR_INVALID_VALUE);
    for (size_t i = 0; i < count; i++)
        if (desc[i].location.type != ORB_CU_MEM_LOCATION_TYPE_DEVICE || desc[i].location.id < 0 ||
            desc[i].location.id >= ndevices || desc[i].flags > ORB_CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            LEAVE(ORB_CU_ERROR_INVALID_VALUE);
    for (size_t i = 0; i < count; i++)
        if (desc[i].flags == ORB_CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            a->accessible = true;
    LEAVE(ORB_CU_SUCCESS);
}

EXPORT orb_cu_result cuMemcpyHtoD_v2(orb_cu_deviceptr dst, const void *src, size_t bytes)
{
    ENTER("cuMemcpyHtoD_v2");
    uint8_t *d = bytes_of(dst, bytes, true);
    if (d == NULL || src == NULL)
        LEAVE(ORB_CU_ERROR_INVALID_VALUE);
    memcpy(d, src, bytes);
    LEAVE(ORB_CU_SUCCESS);
}

EXPORT orb_cu_result cuMemcpyDtoH_v2(void *dst, orb_cu_deviceptr src, size_t bytes)
{
    ENTER("cuMemcpyDtoH_v2");
    uint8_t *s = bytes_of(src, bytes, true);
    if (s == NULL || dst == NULL)
        LEAVE(ORB_CU_ERROR_INVALID_VALUE);
    memcpy(dst, s, bytes);
    LEAVE(ORB_CU_SUCCESS);
}

#ifndef FAKECUDA_OMIT_DTOD
EXPORT orb_cu_result cuMemcpyDtoD_v2(orb_cu_deviceptr dst, orb_cu_deviceptr src, size_t bytes)
{
    ENTER("cuMemcpyDtoD_v2");
    uint8_t *d = bytes_of(dst, bytes, true), *s = bytes_of(src, bytes, true);
    if (d == NULL || s == NULL)
        LEAVE(ORB_CU_ERROR_INVALID_VALUE);
    memmove(d, s, bytes);
    LEAVE(ORB_CU_SUCCESS);
}
#endif

/* ---- streams and events ------------------------------------------------------------------------- */

static void *stream_main(void *arg)
{
    struct CUstream_st *s = arg;
    pthread_mutex_lock(&lock);
    for (;;) {
        while ((s->head == NULL && !s->destroyed) || (s->head != NULL && held))
            pthread_cond_wait(&changed, &lock);
        if (s->head == NULL) /* destroyed, and its work done */
            break;
        struct op *op = s->head;
        s->running = true;
        unsigned delay = slow_us;
        void (*watch)(const struct fakecuda_copy *, void *) = op->kind == OP_COPY ? watch_fn : NULL;
        void *warg = watch_arg;
        watch_calls += watch != NULL;
        pthread_mutex_unlock(&lock);
        if (delay > 0) {
            struct timespec ts = {(time_t)(delay / 1000000u), (long)(delay % 1000000u) * 1000L};
            nanosleep(&ts, NULL);
        }
        if (op->kind == OP_COPY) {
            struct fakecuda_copy seen = op->copy;
            if (watch != NULL)
                watch(&seen, warg);
            memmove(op->dst, op->src, op->bytes);
            seen.done = 1;
            if (watch != NULL)
                watch(&seen, warg);
        }
        pthread_mutex_lock(&lock);
        watch_calls -= watch != NULL;
        if (op->kind == OP_EVENT && op->event->passed < op->generation)
            op->event->passed = op->generation;
        s->head = op->next;
        if (s->head == NULL)
            s->tail = NULL;
        s->running = false;
        free(op);
        pthread_cond_broadcast(&changed);
    }
    pthread_mutex_unlock(&lock);
    free(s);
    return NULL;
}

/* The stream a handle names (lock held): NULL, CU_STREAM_LEGACY (0x1) and CU_STREAM_PER_THREAD
 * (0x2) name the calling thread's current context's default stream, made on first use and kept
 * for the process's lifetime (one per context: the stand-in does not tell the two apart). NULL
 * when there is no current context. */
static struct CUstream_st *resolve(orb_cu_stream s)
{
    if ((uintptr_t)s > 2)
        return s;
    if (!live_context(current))
        return NULL;
    if (current->default_stream == NULL) {
        struct CUstream_st *d = calloc(1, sizeof *d);
        if (d == NULL)
            return NULL;
        d->ctx = current;
        if (pthread_create(&d->thread, NULL, stream_main, d) != 0) {
            free(d);
            return NULL;
        }
        pthread_detach(d->thread);
        current->default_stream = d;
    }
    return current->default_stream;
}

/* Whether `s` is a stream OrbiTE may use now (lock held): the stand-in's streams are never
 * freed while alive, so a handle is checked by its state. */
static bool usable(const struct CUstream_st *s)
{
    return s != NULL && !s->destroyed && live_context(s->ctx);
}

/* Queue `op` on `s` (lock held; `op` freed on failure). */
static orb_cu_result enqueue(struct CUstream_st *s, struct op *op)
{
    s = resolve(s);
    if (!usable(s)) {
        free(op);
        return ORB_CU_ERROR_INVALID_HANDLE;
    }
    op->next = NULL;
    if (s->tail != NULL)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
    pthread_cond_broadcast(&changed);
    return ORB_CU_SUCCESS;
}

/* Queue a copy from `src` to `dst` (where their bytes are), reported to a watcher as `seen`. */
static orb_cu_result copy_async(void *dst, const void *src, struct fakecuda_copy seen, orb_cu_stream s)
{
    if (dst == NULL || src == NULL)
        return ORB_CU_ERROR_INVALID_VALUE;
    struct op *op = calloc(1, sizeof *op);
    if (op == NULL)
        return ORB_CU_ERROR_OUT_OF_MEMORY;
    *op = (struct op){.kind = OP_COPY, .dst = dst, .src = src, .bytes = seen.bytes, .copy = seen};
    return enqueue(s, op);
}

EXPORT orb_cu_result cuMemcpyHtoDAsync_v2(orb_cu_deviceptr dst, const void *src, size_t bytes, orb_cu_stream s)
{
    ENTER("cuMemcpyHtoDAsync_v2");
    struct fakecuda_copy seen = {FAKECUDA_HTOD, dst, (unsigned long long)(uintptr_t)src, bytes, 0};
    LEAVE(copy_async(bytes_of(dst, bytes, true), src, seen, s));
}

EXPORT orb_cu_result cuMemcpyDtoHAsync_v2(void *dst, orb_cu_deviceptr src, size_t bytes, orb_cu_stream s)
{
    ENTER("cuMemcpyDtoHAsync_v2");
    struct fakecuda_copy seen = {FAKECUDA_DTOH, (unsigned long long)(uintptr_t)dst, src, bytes, 0};
    LEAVE(copy_async(dst, bytes_of(src, bytes, true), seen, s));
}

EXPORT orb_cu_result cuMemcpyDtoDAsync_v2(orb_cu_deviceptr dst, orb_cu_deviceptr src, size_t bytes, orb_cu_stream s)
{
    ENTER("cuMemcpyDtoDAsync_v2");
    struct fakecuda_copy seen = {FAKECUDA_DTOD, dst, src, bytes, 0};
    LEAVE(copy_async(bytes_of(dst, bytes, true), bytes_of(src, bytes, true), seen, s));
}

EXPORT orb_cu_result cuStreamCreate(orb_cu_stream *stream, unsigned int flags)
{
    ENTER("cuStreamCreate");
    if (stream == NULL || (flags & ~ORB_CU_STREAM_NON_BLOCKING) != 0)
        LEAVE(ORB_CU_ERROR_INVALID_VALUE);
    if (!live_context(current))
        LEAVE(ORB_CU_ERROR_INVALID_CONTEXT);
    struct CUstream_st *s = calloc(1, sizeof *s);
    if (s == NULL)
        LEAVE(ORB_CU_ERROR_OUT_OF_MEMORY);
    s->ctx = current;
    if (pthread_create(&s->thread, NULL, stream_main, s) != 0) {
        free(s);
        LEAVE(ORB_CU_ERROR_OUT_OF_MEMORY);
    }
    pthread_detach(s->thread);
    live_streams++;
    blocking_streams += (flags & ORB_CU_STREAM_NON_BLOCKING) == 0;
    *stream = s;
    LEAVE(ORB_CU_SUCCESS);
}

EXPORT orb_cu_result cuStreamDestroy_v2(orb_cu_stream s)
{
    ENTER("cuStreamDestroy_v2");
    if (!usable(s))
        LEAVE(ORB_CU_ERROR_INVALID_HANDLE);
    /* As the driver: the call returns at once; work already queued still runs, then the
     * stream's resources go. */
    s->destroyed = true;
    live_streams--; /* the handle's count: its thread ends once the queued work is done */
    pthread_cond_broadcast(&changed);
    LEAVE(ORB_CU_SUCCESS);
}

EXPORT orb_cu_result cuStreamSynchronize(orb_cu_stream s)
{
    ENTER("cuStreamSynchronize");
    s = resolve(s);
    if (!usable(s))
        LEAVE(ORB_CU_ERROR_INVALID_HANDLE);
    while (s->head != NULL)
        pthread_cond_wait(&changed, &lock);
    LEAVE(ORB_CU_SUCCESS);
}

EXPORT orb_cu_result cuStreamQuery(orb_cu_stream s)
{
    ENTER("cuStreamQuery");
    s = resolve(s);
    if (!usable(s))
        LEAVE(ORB_CU_ERROR_INVALID_HANDLE);
    LEAVE(s->head != NULL ? ORB_CU_ERROR_NOT_READY : ORB_CU_SUCCESS);
}

EXPORT orb_cu_result cuStreamGetCtx(orb_cu_stream s, orb_cu_context *ctx)
{
    ENTER("cuStreamGetCtx");
    s = resolve(s);
    if (!usable(s) || ctx == NULL)
        LEAVE(ORB_CU_ERROR_INVALID_HANDLE);
    *ctx = s->ctx;
    LEAVE(ORB_CU_SUCCESS);
}

EXPORT orb_cu_result cuStreamIsCapturing(orb_cu_stream s, unsigned int *status)
{
    ENTER("cuStreamIsCapturing");
    s = resolve(s);
    if (!usable(s) || status == NULL)
        LEAVE(ORB_CU_ERROR_INVALID_HANDLE);
    *status = s->capture;
    LEAVE(ORB_CU_SUCCESS);
}

EXPORT orb_cu_result cuEventCreate(orb_cu_event *event, unsigned int flags)
{
    ENTER("cuEventCreate");
    if (event == NULL || (flags & ~0xfu) != 0)
        LEAVE(ORB_CU_ERROR_INVALID_VALUE);
    if (!live_context(current))
        LEAVE(ORB_CU_ERROR_INVALID_CONTEXT);
    struct CUevent_st *e = calloc(1, sizeof *e);
    if (e == NULL)
        LEAVE(ORB_CU_ERROR_OUT_OF_MEMORY);
    live_events++;
    *event = e;
    LEAVE(ORB_CU_SUCCESS);
}

EXPORT orb_cu_result cuEventDestroy_v2(orb_cu_event e)
{
    ENTER("cuEventDestroy_v2");
    if (e == NULL)
        LEAVE(ORB_CU_ERROR_INVALID_HANDLE);
    /* A recorded generation still queued keeps the event (its stream marks it when it gets
     * there); the handle itself is gone for the caller either way. The stand-in leaks such an
     * event rather than free memory a stream thread will write. */
    if (e->passed >= e->recorded)
        free(e);
    live_events--;
    LEAVE(ORB_CU_SUCCESS);
}

EXPORT orb_cu_result cuEventRecord(orb_cu_event e, orb_cu_stream s)
{
    ENTER("cuEventRecord");
    if (e == NULL)
        LEAVE(ORB_CU_ERROR_INVALID_HANDLE);
    struct op *op = calloc(1, sizeof *op);
    if (op == NULL)
        LEAVE(ORB_CU_ERROR_OUT_OF_MEMORY);
    *op = (struct op){.kind = OP_EVENT, .event = e, .generation = e->recorded + 1};
    orb_cu_result rc = enqueue(s, op);
    if (rc == ORB_CU_SUCCESS)
        e->recorded++;
    LEAVE(rc);
}

EXPORT orb_cu_result cuEventSynchronize(orb_cu_event e)
{
    ENTER("cuEventSynchronize");
    if (e == NULL)
        LEAVE(ORB_CU_ERROR_INVALID_HANDLE);
    unsigned long long want = e->recorded;
    while (e->passed < want)
        pthread_cond_wait(&changed, &lock);
    LEAVE(ORB_CU_SUCCESS);
}

EXPORT orb_cu_result cuEventQuery(orb_cu_event e)
{
    ENTER("cuEventQuery");
    if (e == NULL)
        LEAVE(ORB_CU_ERROR_INVALID_HANDLE);
    LEAVE(e->passed < e->recorded ? ORB_CU_ERROR_NOT_READY : ORB_CU_SUCCESS);
}
