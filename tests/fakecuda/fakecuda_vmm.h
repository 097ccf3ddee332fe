/* Tests only: a virtual memory management allocation made the way an application makes one
 * (cuMemCreate, cuMemAddressReserve, cuMemMap, cuMemSetAccess), on the fakecuda stand-in at
 * `path` through the driver table `cu`; and its undoing. */
#ifndef ORB_TESTS_FAKECUDA_VMM_H
#define ORB_TESTS_FAKECUDA_VMM_H

#include <dlfcn.h>
#include <string.h>

#include "cuda/cuda.h"
#include "fakecuda.h"

struct fakecuda_vmm {
    orb_cu_mem_handle handle;
    orb_cu_deviceptr va;
    size_t size;
};

/* 0, or the failing step's number. `types`: the handle types asked for (0: none). */
static inline int fakecuda_vmm_make(const struct orb_cuda *cu, const char *path, int device, size_t size,
                                    unsigned int types, struct fakecuda_vmm *out)
{
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL)
        return 1;
    orb_cu_result (*create)(orb_cu_mem_handle *, size_t, const struct fakecuda_alloc_prop *, unsigned long long);
    *(void **)&create = dlsym(lib, "cuMemCreate");
    struct fakecuda_alloc_prop prop;
    memset(&prop, 0, sizeof prop);
    prop.type = 1;
    prop.requested_handle_types = types;
    prop.location.type = ORB_CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    memset(out, 0, sizeof *out);
    out->size = size;
    if (create == NULL || create(&out->handle, size, &prop, 0) != ORB_CU_SUCCESS)
        return 2;
    if (cu->mem_address_reserve(&out->va, size, 0, 0, 0) != ORB_CU_SUCCESS)
        return 3;
    if (cu->mem_map(out->va, size, 0, out->handle, 0) != ORB_CU_SUCCESS)
        return 4;
    orb_cu_mem_access_desc access;
    memset(&access, 0, sizeof access);
    access.location.type = ORB_CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device;
    access.flags = ORB_CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return cu->mem_set_access(out->va, size, &access, 1) == ORB_CU_SUCCESS ? 0 : 5;
}

static inline int fakecuda_vmm_free(const struct orb_cuda *cu, struct fakecuda_vmm *m)
{
    if (cu->mem_unmap(m->va, m->size) != ORB_CU_SUCCESS)
        return 1;
    if (cu->mem_address_free(m->va, m->size) != ORB_CU_SUCCESS)
        return 2;
    return cu->mem_release(m->handle) == ORB_CU_SUCCESS ? 0 : 3;
}

#endif
