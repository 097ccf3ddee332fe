/* libcuda.so.1 (the NVIDIA driver's Driver API), loaded at run time: no CUDA toolkit, nvcc or
 * libcudart at build time, and a process that never asks for CUDA never loads it. Every export of
 * cuda_api.h is resolved, or none is used. */
#ifndef ORB_CUDA_CUDA_H
#define ORB_CUDA_CUDA_H

#include <stdbool.h>
#include <stddef.h>

#include "cuda/cuda_api.h"

#define ORB_CUDA_LIBRARY "libcuda.so.1"

/* The resolved exports (field names of ORB_CUDA_EXPORTS) and what cuInit found. */
struct orb_cuda {
#define ORB_CUDA_FIELD(field, export, params) orb_cu_##field##_fn *field;
    ORB_CUDA_EXPORTS(ORB_CUDA_FIELD)
    ORB_CUDA_VMM_EXPORTS(ORB_CUDA_FIELD)
    ORB_CUDA_DMABUF_EXPORTS(ORB_CUDA_FIELD)
    ORB_CUDA_FLUSH_EXPORTS(ORB_CUDA_FIELD)
#undef ORB_CUDA_FIELD
    int driver_version;            /* cuDriverGetVersion: 1000 x major + 10 x minor */
    bool vmm;                      /* every ORB_CUDA_VMM_EXPORTS export resolved (else all NULL) */
    bool dmabuf;                   /* ORB_CUDA_DMABUF_EXPORTS resolved (else NULL) */
    bool flush;                    /* ORB_CUDA_FLUSH_EXPORTS resolved (else NULL) */
};

/* The process's libcuda.so.1: loaded and initialised (cuInit(0)) on the first call, thread-safe,
 * then the same table for the process's lifetime; never unloaded (contexts and allocations made
 * through it outlive any engine). *out is set on success. Errors: ORB_EUNAVAILABLE (the library
 * cannot be loaded, lacks an export, or cuInit failed, say for want of a GPU: the detail names the
 * library and the export or the driver's error), ORB_EINVAL (out NULL). A failed load is
 * remembered: later calls fail the same way without trying again. */
int orb_cuda_get(const struct orb_cuda **out);

/* Tests only (the installed library's users cannot reach it: it is not exported): the
 * process's table comes from the library at `path` (a stand-in) instead of libcuda.so.1.
 * Errors: ORB_EINVAL (NULL or too long), ORB_EBUSY (orb_cuda_get() ran already). */
int orb_cuda_use_library(const char *path);

/* Whether this process has tried to load libcuda.so.1 through orb_cuda_get(). */
bool orb_cuda_attempted(void);

/* Load and initialise the library at `path` into *out, apart from the process's table: for the
 * loader's tests, which load stand-ins (tests/fakecuda). Its handle stays open for the process's
 * lifetime. Errors as orb_cuda_get. */
int orb_cuda_load(const char *path, struct orb_cuda *out);

/* The ORB_E* status a failed driver call stands for: ORB_ENOMEM (out of memory), ORB_EINVAL
 * (an invalid value, handle or context), ORB_EUNAVAILABLE (no device, not initialised, not
 * supported), ORB_EAGAIN (not ready), ORB_EPEER for the rest (the device or driver failed). */
int orb_cuda_status(orb_cu_result rc);

/* "NAME (text)" for `rc`, from the driver when it knows it, into buf (cap > 0): buf. */
const char *orb_cuda_describe(const struct orb_cuda *c, orb_cu_result rc, char *buf, size_t cap);

#endif
