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
    /* Who made the bytes: HOST_WRAPPED (orb_host_memory_wrap: not this owner's; `release` frees
     * them), HOST_HEAP (orb_host_memory_alloc: posix_memalign, freed with free()) or HOST_SHARED
     * (orb_host_memory_alloc_shared: a sealed memfd mapped at ptr, unmapped and closed). */
    int owns_allocation;
    /* HOST_SHARED: the memfd (close-on-exec; offset 0 is ptr, its size is map_len, sealed against
     * shrinking, growth and further sealing) and the whole mapping to unmap (map_base == ptr).
     * -1, NULL and 0 otherwise. */
    int shared_fd;
    void *map_base;
    size_t map_len;
    /* Pinned host memory from orb_cuda_host_alloc: waits once for a producer's recorded work
     * (orb_cuda_host_record_producer) before OrbiTE touches the bytes. 0, or ORB_EUNQUIESCED
     * when that work's end is not proven. NULL for other memory. */
    int (*ready)(orb_host_memory *mem);
};

enum { HOST_WRAPPED = 0, HOST_HEAP = 1, HOST_SHARED = 2 };

/* The memfd behind `mem` (borrowed: valid while a reference is held; offset 0 of the file is
 * orb_host_memory_data(mem), and the file is the page-rounded length), or -1 when `mem` is NULL or
 * its bytes did not come from orb_host_memory_alloc_shared(). */
int orb_host_memory_shared_fd(const orb_host_memory *mem);

#endif
