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
};

#endif
