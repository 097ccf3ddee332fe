/* Internal: reference-counted host memory owners. */
#ifndef ORB_CORE_MEMORY_H
#define ORB_CORE_MEMORY_H

#include <stdatomic.h>
#include <stddef.h>
#include <orbite/orbite.h>

struct orb_host_memory {
    atomic_uint_fast64_t refs;
    void *ptr;
    size_t len;
    orb_release_fn release; /* NULL for wraps without release and for orb_host_memory_alloc */
    void *release_ctx;
    int owns_allocation;    /* 1: ptr came from orb_host_memory_alloc and is freed with free() */
    /* Pinned host memory from orb_cuda_host_alloc: waits once for a producer's recorded work
     * (orb_cuda_host_record_producer) before OrbiTE touches the bytes. 0, or ORB_EUNQUIESCED
     * when that work's end is not proven. NULL for other memory. */
    int (*ready)(orb_host_memory *mem);
};

#endif
