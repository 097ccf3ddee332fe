/* Device memory as a registration's memory kind: its operation table (no CPU view, staging
 * copies on the allocation's own stream) and the public registration calls. */
#include <orbite/orbite.h>

#include <stdint.h>
#include <stdlib.h>

#include "core/engine.h"
#include "core/error.h"
#include "core/registry.h"
#include "cuda/cuda_kind.h"
#include "cuda/cuda_memory.h"

static void *cuda_cpu_view(const struct orb_reg *reg, uint64_t addr)
{
    (void)reg;
    (void)addr;
    return NULL; /* device bytes: staged */
}

static uint64_t cuda_owner_base(const void *owner)
{
    return orb_cuda_memory_ptr(owner);
}

static size_t cuda_owner_size(const void *owner)
{
    return orb_cuda_memory_size(owner);
}

static void cuda_owner_ref(void *owner)
{
    (void)orb_cuda_memory_ref(owner);
}

static void cuda_owner_unref(void *owner)
{
    orb_cuda_memory_unref(owner);
}

static int cuda_owner_defers(const void *owner)
{
    (void)owner;
    return 1; /* cuMemFree synchronizes the device; an adopted owner runs the user's release */
}

static int cuda_ready(const struct orb_reg *reg)
{
    return orb_cuda_memory_ready(reg->owner);
}

static int cuda_loan(const struct orb_reg *reg, uint64_t addr, uint64_t len, int writes, void **loan_out)
{
    orb_cuda_memory *m = reg->owner;
    struct orb_cuda_loan *loan = NULL;
    int rc = orb_cuda_memory_loan(m, (size_t)(addr - orb_cuda_memory_ptr(m)), (size_t)len, writes, &loan);
    if (rc == 0)
        *loan_out = loan;
    return rc;
}

static void cuda_loan_end(void *loan)
{
    orb_cuda_memory_loan_end(loan);
}

static void *cuda_stage_alloc(const struct orb_reg *reg, size_t len)
{
    return orb_cuda_staging_alloc(orb_cuda_memory_device(reg->owner), len);
}

static void cuda_stage_free(void *p)
{
    orb_cuda_staging_free(p);
}

static void cuda_stage_keep(void *p)
{
    orb_cuda_staging_keep(p);
}

static int cuda_to_host(const struct orb_reg *reg, uint64_t addr, void *host, size_t len, bool *held)
{
    orb_cuda_memory *m = reg->owner;
    return orb_cuda_memory_to_host_held(m, (size_t)(addr - orb_cuda_memory_ptr(m)), host, len, held);
}

static int cuda_from_host(const struct orb_reg *reg, uint64_t addr, const void *host, size_t len, bool *held)
{
    orb_cuda_memory *m = reg->owner;
    return orb_cuda_memory_from_host_held(m, (size_t)(addr - orb_cuda_memory_ptr(m)), host, len, held);
}

const struct orb_memkind_ops orb_memkind_cuda = {
    .kind = ORB_MEM_CUDA,
    .name = "cuda",
    .cpu_view = cuda_cpu_view,
    .owner_base = cuda_owner_base,
    .owner_size = cuda_owner_size,
    .owner_ref = cuda_owner_ref,
    .owner_unref = cuda_owner_unref,
    .owner_defers = cuda_owner_defers,
    .ready = cuda_ready,
    .loan = cuda_loan,
    .loan_end = cuda_loan_end,
    .stage_alloc = cuda_stage_alloc,
    .stage_free = cuda_stage_free,
    .stage_keep = cuda_stage_keep,
    .to_host = cuda_to_host,
    .from_host = cuda_from_host,
};

ORB_EXPORT int orb_register_cuda_memory(orb_engine *engine, orb_cuda_memory *owner, size_t offset, size_t len,
                                        enum orb_perm perm, orb_reg_id *id_out)
{
    if (owner == NULL || id_out == NULL)
        return orb_fail(ORB_EINVAL, "orb_register_cuda_memory: owner and id_out are required");
    struct orb_reg_range r = {.kind = &orb_memkind_cuda, .owner = owner, .offset = offset, .length = len,
                              .perm = perm};
    return orb_engine_register_ranges(engine, "orb_register_cuda_memory", &r, 1, id_out);
}

ORB_EXPORT int orb_register_cuda_memory_batch(orb_engine *engine, const struct orb_cuda_range *ranges, size_t n,
                                              orb_reg_id *ids_out)
{
    if (ranges == NULL || ids_out == NULL || n == 0)
        return orb_fail(ORB_EINVAL, "orb_register_cuda_memory_batch: ranges and ids_out are required and n must "
                        "be positive");
    if (n > SIZE_MAX / sizeof(struct orb_reg_range))
        return orb_fail(ORB_EINVAL, "orb_register_cuda_memory_batch: %zu ranges is too many", n);
    struct orb_reg_range *all = malloc(n * sizeof *all);
    if (all == NULL)
        return orb_fail(ORB_ENOMEM, "orb_register_cuda_memory_batch: no memory for %zu ranges", n);
    for (size_t i = 0; i < n; i++) {
        if (ranges[i].owner == NULL) {
            free(all);
            return orb_fail(ORB_EINVAL, "registration range %zu: owner is NULL", i);
        }
        all[i] = (struct orb_reg_range){.kind = &orb_memkind_cuda, .owner = ranges[i].owner,
                                        .offset = ranges[i].offset, .length = ranges[i].length,
                                        .perm = ranges[i].perm};
    }
    int rc = orb_engine_register_ranges(engine, "orb_register_cuda_memory_batch", all, n, ids_out);
    free(all);
    return rc;
}
