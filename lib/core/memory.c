/* Reference-counted host memory owners and the host memory kind. */
#include "memory.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "error.h"
#include "registry.h"

static size_t page_size(void)
{
    long ps = sysconf(_SC_PAGESIZE);
    return ps > 0 ? (size_t)ps : 4096;
}

static int is_power_of_two(size_t v)
{
    return v != 0 && (v & (v - 1)) == 0;
}

ORB_EXPORT int orb_host_memory_alloc(size_t len, size_t align, orb_host_memory **out)
{
    if (out == NULL)
        return orb_fail(ORB_EINVAL, "host memory alloc: out is NULL");
    if (len == 0)
        return orb_fail(ORB_EINVAL, "host memory alloc: length is zero");
    if (align == 0)
        align = page_size();
    if (!is_power_of_two(align))
        return orb_fail(ORB_EINVAL, "host memory alloc: alignment %zu is not a power of two", align);
    /* posix_memalign needs a multiple of sizeof(void *); a smaller power of two is implied by it. */
    if (align < sizeof(void *))
        align = sizeof(void *);
    /* Registrations address bytes as [base, base + len) in 64 bits and need room for padding. */
    if (len > SIZE_MAX - align || len > (size_t)INT64_MAX)
        return orb_fail(ORB_EINVAL, "host memory alloc: length %zu too large", len);

    orb_host_memory *mem = calloc(1, sizeof *mem);
    if (mem == NULL)
        return orb_fail(ORB_ENOMEM, "host memory alloc: no memory for the owner");
    void *ptr = NULL;
    int rc = posix_memalign(&ptr, align, len);
    if (rc != 0) {
        free(mem);
        return orb_fail(ORB_ENOMEM, "host memory alloc: cannot allocate %zu bytes aligned to %zu",
                        len, align);
    }
    memset(ptr, 0, len);

    atomic_init(&mem->refs, 1);
    mem->ptr = ptr;
    mem->len = len;
    mem->release = NULL;
    mem->release_ctx = NULL;
    mem->owns_allocation = HOST_HEAP;
    mem->shared_fd = -1;
    *out = mem;
    return 0;
}

ORB_EXPORT int orb_host_memory_alloc_shared(size_t len, size_t align, orb_host_memory **out)
{
    if (out == NULL)
        return orb_fail(ORB_EINVAL, "shared host memory alloc: out is NULL");
    if (len == 0)
        return orb_fail(ORB_EINVAL, "shared host memory alloc: length is zero");
    size_t page = page_size();
    if (align == 0)
        align = page;
    if (!is_power_of_two(align))
        return orb_fail(ORB_EINVAL, "shared host memory alloc: alignment %zu is not a power of two",
                        align);
    /* The file is mapped whole, so the length is rounded up to pages; an alignment above a page
     * needs that much more address space reserved to find the aligned place in. */
    size_t slack = align > page ? align : 0;
    if (len > SIZE_MAX - (page - 1) - slack || len > (size_t)INT64_MAX - (page - 1) - slack)
        return orb_fail(ORB_EINVAL, "shared host memory alloc: length %zu too large", len);
    size_t map_len = (len + page - 1) / page * page;

    orb_host_memory *mem = calloc(1, sizeof *mem);
    if (mem == NULL)
        return orb_fail(ORB_ENOMEM, "shared host memory alloc: no memory for the owner");
    int rc;
    int fd = memfd_create("orbite-host", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        int e = errno;
        rc = e == ENOMEM ? orb_fail(ORB_ENOMEM, "shared host memory alloc: memfd_create: %s", strerror(e))
                         : orb_fail(ORB_ERESOURCE, "shared host memory alloc: memfd_create: %s",
                                    strerror(e));
        goto free_owner;
    }
    if (ftruncate(fd, (off_t)map_len) != 0) {
        rc = orb_fail(ORB_ENOMEM, "shared host memory alloc: cannot size the memory file to %zu bytes: %s",
                      map_len, strerror(errno));
        goto close_fd;
    }
    /* Whoever is handed the descriptor later must not shrink the file under this mapping (the
     * next touch past its end would be SIGBUS here), grow it, or change the seals. */
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        rc = orb_fail(ORB_ERESOURCE, "shared host memory alloc: cannot seal the memory file: %s",
                      strerror(errno));
        goto close_fd;
    }
    /* Reserve the length plus the alignment, inaccessible, map the file at the aligned place inside
     * (MAP_FIXED replaces that part of the reservation) and give back the rest. */
    uint8_t *reserve = mmap(NULL, map_len + slack, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                            -1, 0);
    if (reserve == MAP_FAILED) {
        rc = orb_fail(ORB_ENOMEM, "shared host memory alloc: cannot reserve %zu bytes: %s",
                      map_len + slack, strerror(errno));
        goto close_fd;
    }
    uintptr_t a = (uintptr_t)reserve;
    if (slack != 0)
        a = (a + align - 1) & ~(uintptr_t)(align - 1);
    uint8_t *at = (uint8_t *)a;
    if (mmap(at, map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
        rc = orb_fail(ORB_ENOMEM, "shared host memory alloc: cannot map %zu bytes: %s", map_len,
                      strerror(errno));
        (void)munmap(reserve, map_len + slack);
        goto close_fd;
    }
    if (at > reserve)
        (void)munmap(reserve, (size_t)(at - reserve));
    uint8_t *reserve_end = reserve + map_len + slack;
    if (reserve_end > at + map_len)
        (void)munmap(at + map_len, (size_t)(reserve_end - (at + map_len)));

    /* The kernel fills the file's pages with zeros on first touch: no memset. */
    atomic_init(&mem->refs, 1);
    mem->ptr = at;
    mem->len = len;
    mem->release = NULL;
    mem->release_ctx = NULL;
    mem->owns_allocation = HOST_SHARED;
    mem->shared_fd = fd;
    mem->map_base = at;
    mem->map_len = map_len;
    *out = mem;
    return 0;

close_fd:
    close(fd);
free_owner:
    free(mem);
    return rc;
}

int orb_host_memory_shared_fd(const orb_host_memory *mem)
{
    return mem != NULL && mem->owns_allocation == HOST_SHARED ? mem->shared_fd : -1;
}

ORB_EXPORT int orb_host_memory_wrap(void *ptr, size_t len, orb_release_fn release, void *ctx,
                                    orb_host_memory **out)
{
    if (out == NULL)
        return orb_fail(ORB_EINVAL, "host memory wrap: out is NULL");
    if (ptr == NULL)
        return orb_fail(ORB_EINVAL, "host memory wrap: pointer is NULL");
    if (len == 0)
        return orb_fail(ORB_EINVAL, "host memory wrap: length is zero");
    if (len > UINTPTR_MAX - (uintptr_t)ptr)
        return orb_fail(ORB_EINVAL, "host memory wrap: range of %zu bytes wraps the address space",
                        len);

    orb_host_memory *mem = calloc(1, sizeof *mem);
    if (mem == NULL)
        return orb_fail(ORB_ENOMEM, "host memory wrap: no memory for the owner");
    atomic_init(&mem->refs, 1);
    mem->ptr = ptr;
    mem->len = len;
    mem->release = release;
    mem->release_ctx = ctx;
    mem->owns_allocation = HOST_WRAPPED;
    mem->shared_fd = -1;
    *out = mem;
    return 0;
}

ORB_EXPORT void *orb_host_memory_data(const orb_host_memory *mem)
{
    return mem != NULL ? mem->ptr : NULL;
}

ORB_EXPORT size_t orb_host_memory_size(const orb_host_memory *mem)
{
    return mem != NULL ? mem->len : 0;
}

ORB_EXPORT orb_host_memory *orb_host_memory_ref(orb_host_memory *mem)
{
    /* Relaxed: a new reference can only be made from one already held. */
    if (mem != NULL)
        atomic_fetch_add_explicit(&mem->refs, 1, memory_order_relaxed);
    return mem;
}

ORB_EXPORT void orb_host_memory_unref(orb_host_memory *mem)
{
    if (mem == NULL)
        return;
    /* acq_rel: every earlier use of the bytes by other holders happens before the release. */
    uint_fast64_t before = atomic_fetch_sub_explicit(&mem->refs, 1, memory_order_acq_rel);
    if (before != 1)
        return;
    if (mem->owns_allocation == HOST_SHARED) {
        (void)munmap(mem->map_base, mem->map_len);
        (void)close(mem->shared_fd);
    } else if (mem->owns_allocation == HOST_HEAP)
        free(mem->ptr);
    else if (mem->release != NULL)
        mem->release(mem->ptr, mem->len, mem->release_ctx);
    free(mem);
}

static void *host_cpu_view(const struct orb_reg *reg, uint64_t addr)
{
    (void)reg;
    return (void *)(uintptr_t)addr;
}

static int host_ready(const struct orb_reg *reg)
{
    orb_host_memory *m = reg->owner;
    return m->ready != NULL ? m->ready(m) : 0;
}

static uint64_t host_owner_base(const void *owner)
{
    return (uint64_t)(uintptr_t)((const orb_host_memory *)owner)->ptr;
}

static size_t host_owner_size(const void *owner)
{
    return ((const orb_host_memory *)owner)->len;
}

static void host_owner_ref(void *owner)
{
    (void)orb_host_memory_ref(owner);
}

static void host_owner_unref(void *owner)
{
    orb_host_memory_unref(owner);
}

static int host_owner_defers(const void *owner)
{
    return ((const orb_host_memory *)owner)->release != NULL;
}

const struct orb_memkind_ops orb_memkind_host = {
    .kind = ORB_MEM_HOST,
    .name = "host",
    .cpu_view = host_cpu_view,
    .owner_base = host_owner_base,
    .owner_size = host_owner_size,
    .owner_ref = host_owner_ref,
    .owner_unref = host_owner_unref,
    .owner_defers = host_owner_defers,
    .ready = host_ready,
};
