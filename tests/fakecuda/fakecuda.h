/* The test controls of the fakecuda stand-in (fakecuda.c): tests dlopen the same library the
 * loader loaded and call these through dlsym. */
#ifndef ORB_TESTS_FAKECUDA_H
#define ORB_TESTS_FAKECUDA_H

#include <dlfcn.h>
#include <stdio.h>

#include "cuda/cuda_api.h"

/* What is alive in the stand-in. */
struct fakecuda_counts {
    long device_allocations, host_allocations;
    long primary_refs;                 /* retains of every device's primary context */
    long streams, events;
    long blocking_streams;             /* streams made without CU_STREAM_NON_BLOCKING, ever */
    long imports;                      /* other processes' allocations mapped (cuIpcOpenMemHandle) */
    long vmm_allocations;              /* physical allocations of cuMemCreate or imported, still held */
    long reservations;                 /* address ranges of cuMemAddressReserve not freed */
    long dmabuf_exports;               /* descriptors cuMemGetHandleForAddressRange gave, ever */
    long rdma_flushes;                 /* cuFlushGPUDirectRDMAWrites calls, ever */
};

/* The leading fields of the driver's CUmemAllocationProp, as cuMemCreate reads them (type 1:
 * pinned; location type 1: a device). */
struct fakecuda_alloc_prop {
    unsigned int type;
    unsigned int requested_handle_types;
    struct {
        unsigned int type;
        int id;
    } location;
    void *win32_metadata;
    unsigned char alloc_flags[8];
};
/* The stand-in's allocation granularity (cuMemCreate sizes and mapped ranges are multiples). */
#define FAKECUDA_VMM_GRANULARITY (2ull << 20)

/* The Nth call (from 1) of `export` (its exported name) fails with `rc`, once; nth 0 disarms.
 * Up to 8 exports may be armed at once. */
void fakecuda_fail(const char *export, unsigned long long nth, unsigned int rc);
/* How many devices cuInit finds (0..8; only before it). */
void fakecuda_set_devices(int n);
/* Every stream operation waits this long before it runs. */
void fakecuda_slow_streams(unsigned microseconds);
/* While `hold` is non-zero, no stream runs its next operation (what it runs finishes). */
void fakecuda_hold_streams(int hold);
/* cuStreamIsCapturing answers `status` for `stream` from now on. */
void fakecuda_set_capturing(orb_cu_stream stream, unsigned int status);
struct fakecuda_counts fakecuda_counts(void);
/* What CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED answers (1 until told otherwise); 0 also makes
 * cuMemGetHandleForAddressRange answer CUDA_ERROR_NOT_SUPPORTED. */
void fakecuda_set_dmabuf(int supported);
/* What CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING answers (100, "owner", until told). */
void fakecuda_set_rdma_ordering(int ordering);

/* A copy a stream runs (cuMemcpy*Async), as fakecuda_watch_copies() reports it. */
enum fakecuda_copy_kind { FAKECUDA_HTOD = 1, FAKECUDA_DTOH = 2, FAKECUDA_DTOD = 3 };
struct fakecuda_copy {
    enum fakecuda_copy_kind kind;
    unsigned long long dst, src;       /* device addresses, or host addresses as numbers */
    size_t bytes;
    int done;                          /* 0: its bytes are about to move; 1: they moved */
};
/* From now on every stream copy is reported to `fn` (NULL: none), twice: before its bytes move
 * and after, on the stream's thread with none of the stand-in's locks held, so `fn` may block
 * (its stream waits, as behind a slow copy). Returns once no call of the previous `fn` runs. */
void fakecuda_watch_copies(void (*fn)(const struct fakecuda_copy *copy, void *arg), void *arg);

/* Where the stand-in keeps device bytes [dptr, +bytes) (a test double of a NIC that reaches
 * device memory, as a peer-memory module gives it); NULL when no allocation holds them whole. */
void *fakecuda_host_view(unsigned long long dptr, size_t bytes);

/* The controls above, as a test reaches them: through the stand-in it loaded. */
struct fakecuda_controls {
    void (*fail_nth)(const char *export, unsigned long long nth, unsigned int rc);
    void (*slow_streams)(unsigned microseconds);
    void (*hold_streams)(int hold);
    void (*set_capturing)(orb_cu_stream stream, unsigned int status);
    struct fakecuda_counts (*counts)(void);
    void (*set_dmabuf)(int supported);
    void (*set_rdma_ordering)(int ordering);
    void (*watch_copies)(void (*fn)(const struct fakecuda_copy *copy, void *arg), void *arg);
    void *(*host_view)(unsigned long long dptr, size_t bytes);
};

/* Resolve every control of the stand-in at `path` (the one the loader loaded). 0, or -1 when
 * the library or a control is missing. */
static inline int fakecuda_controls_load(const char *path, struct fakecuda_controls *out)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL)
        return -1;
    *(void **)&out->fail_nth = dlsym(h, "fakecuda_fail");
    *(void **)&out->slow_streams = dlsym(h, "fakecuda_slow_streams");
    *(void **)&out->hold_streams = dlsym(h, "fakecuda_hold_streams");
    *(void **)&out->set_capturing = dlsym(h, "fakecuda_set_capturing");
    *(void **)&out->counts = dlsym(h, "fakecuda_counts");
    *(void **)&out->set_dmabuf = dlsym(h, "fakecuda_set_dmabuf");
    *(void **)&out->set_rdma_ordering = dlsym(h, "fakecuda_set_rdma_ordering");
    *(void **)&out->watch_copies = dlsym(h, "fakecuda_watch_copies");
    *(void **)&out->host_view = dlsym(h, "fakecuda_host_view");
    return out->fail_nth && out->slow_streams && out->hold_streams && out->set_capturing && out->counts &&
                   out->set_dmabuf && out->set_rdma_ordering && out->watch_copies && out->host_view
               ? 0
               : -1;
}

#endif
