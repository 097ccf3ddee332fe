/* Internal: device memory's registration kind (lib/cuda/cuda_register.c). */
#ifndef ORB_CUDA_CUDA_KIND_H
#define ORB_CUDA_CUDA_KIND_H

#include "core/registry.h"

extern const struct orb_memkind_ops orb_memkind_cuda;

#endif
