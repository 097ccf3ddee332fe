/* The part of the CUDA Driver API that OrbiTE calls, declared here so that the library builds
 * without a CUDA toolkit: the driver's ABI types, the values OrbiTE uses, and the type of each
 * export it resolves from libcuda.so.1 at run time (lib/cuda/cuda.c). Where a toolkit's cuda.h
 * is found at build time, cuda_api_check.c proves every declaration here against it.
 *
 * Exports are named as the driver exports them: the `_v2` entry points where the toolkit's
 * header maps the plain name to one, the legacy-default-stream variants otherwise (OrbiTE
 * passes explicit streams, so the per-thread-default-stream `_ptsz`/`_ptds` twins would only
 * differ for stream handle 0, which it never passes). */
#ifndef ORB_CUDA_API_H
#define ORB_CUDA_API_H

#include <stddef.h>

/* The ABI types. Opaque handles keep the driver's own struct tags, so that function types
 * declared with them are the toolkit's types, not look-alikes. */
typedef unsigned int orb_cu_result;          /* CUresult (an enum of non-negative values) */
typedef int orb_cu_device;                   /* CUdevice: an ordinal */
typedef unsigned long long orb_cu_deviceptr; /* CUdeviceptr (the 64-bit one, _v2) */
typedef struct CUctx_st *orb_cu_context;
typedef struct CUstream_st *orb_cu_stream;
typedef struct CUevent_st *orb_cu_event;
/* CUipcMemHandle: the driver's 64 opaque bytes, passed by value. Declared here only without the
 * toolkit's cuda.h, whose own definition (same tag, same layout) then serves. */
#define ORB_CU_IPC_HANDLE_SIZE 64
#ifndef __cuda_cuda_h__
struct CUipcMemHandle_st {
    char reserved[ORB_CU_IPC_HANDLE_SIZE];
};
#endif
typedef struct CUipcMemHandle_st orb_cu_ipc_mem_handle;
/* Virtual memory management: CUmemGenericAllocationHandle, and CUmemAccessDesc (a location, then
 * the access flags) as the toolkit lays it out. */
typedef unsigned long long orb_cu_mem_handle;
#ifndef __cuda_cuda_h__
struct CUmemLocation_st {
    unsigned int type;               /* CUmemLocationType */
    int id;
};
struct CUmemAccessDesc_st {
    struct CUmemLocation_st location;
    unsigned int flags;              /* CUmemAccess_flags */
};
#endif
typedef struct CUmemAccessDesc_st orb_cu_mem_access_desc;

/* CUresult values OrbiTE tells apart. */
#define ORB_CU_SUCCESS 0u
#define ORB_CU_ERROR_INVALID_VALUE 1u
#define ORB_CU_ERROR_OUT_OF_MEMORY 2u
#define ORB_CU_ERROR_NOT_INITIALIZED 3u
#define ORB_CU_ERROR_DEINITIALIZED 4u
#define ORB_CU_ERROR_NO_DEVICE 100u
#define ORB_CU_ERROR_INVALID_DEVICE 101u
#define ORB_CU_ERROR_INVALID_CONTEXT 201u
#define ORB_CU_ERROR_ALREADY_MAPPED 208u
#define ORB_CU_ERROR_INVALID_HANDLE 400u
#define ORB_CU_ERROR_NOT_READY 600u
#define ORB_CU_ERROR_NOT_SUPPORTED 801u

/* CUdevice_attribute values. */
#define ORB_CU_DEVICE_ATTRIBUTE_PCI_BUS_ID 33u
#define ORB_CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID 34u
#define ORB_CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING 41u
#define ORB_CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID 50u
#define ORB_CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED 124u
#define ORB_CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS 117u /* bit 0: cuFlushGPUDirectRDMAWrites */
#define ORB_CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING 118u      /* 0 none, 100 owner, 200 all */
#define ORB_CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER 100u
#define ORB_CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST 0x1u
#define ORB_CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX 0u
#define ORB_CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER 100u
#define ORB_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD 0x1u  /* CUmemRangeHandleType */

/* CUpointer_attribute values. */
#define ORB_CU_POINTER_ATTRIBUTE_CONTEXT 1u
#define ORB_CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2u
#define ORB_CU_POINTER_ATTRIBUTE_SYNC_MEMOPS 6u
#define ORB_CU_POINTER_ATTRIBUTE_IS_MANAGED 8u
#define ORB_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9u
#define ORB_CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE 10u
#define ORB_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR 11u
#define ORB_CU_POINTER_ATTRIBUTE_RANGE_SIZE 12u
#define ORB_CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES 14u

/* Virtual memory management values. */
#define ORB_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR 0x1u /* CUmemAllocationHandleType */
#define ORB_CU_MEM_LOCATION_TYPE_DEVICE 0x1u             /* CUmemLocationType */
#define ORB_CU_MEM_ACCESS_FLAGS_PROT_READWRITE 0x3u      /* CUmemAccess_flags */

/* CUmemorytype values. */
#define ORB_CU_MEMORYTYPE_HOST 1u
#define ORB_CU_MEMORYTYPE_DEVICE 2u
#define ORB_CU_MEMORYTYPE_ARRAY 3u
#define ORB_CU_MEMORYTYPE_UNIFIED 4u

/* CUstreamCaptureStatus values. */
#define ORB_CU_STREAM_CAPTURE_STATUS_NONE 0u
#define ORB_CU_STREAM_CAPTURE_STATUS_ACTIVE 1u
#define ORB_CU_STREAM_CAPTURE_STATUS_INVALIDATED 2u

/* Flags. */
#define ORB_CU_STREAM_NON_BLOCKING 0x1u     /* cuStreamCreate */
#define ORB_CU_EVENT_DISABLE_TIMING 0x2u    /* cuEventCreate */
#define ORB_CU_MEMHOSTALLOC_PORTABLE 0x1u   /* cuMemHostAlloc */
#define ORB_CU_MEMHOSTALLOC_DEVICEMAP 0x2u
#define ORB_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 0x1u /* cuIpcOpenMemHandle */

/* The exports, as X(field, export, parameters), each returning orb_cu_result: the loader
 * resolves every one (all or none), the check proves each against the toolkit's declaration of
 * the export. Enum parameters are unsigned int, as the driver's enums of non-negative values
 * are to gcc and clang. */
#define ORB_CUDA_EXPORTS(X)                                                                                 \
    X(init, cuInit, (unsigned int flags))                                                                   \
    X(driver_get_version, cuDriverGetVersion, (int *version))                                               \
    X(get_error_name, cuGetErrorName, (orb_cu_result error, const char **name))                             \
    X(get_error_string, cuGetErrorString, (orb_cu_result error, const char **text))                         \
    X(device_get_count, cuDeviceGetCount, (int *count))                                                     \
    X(device_get, cuDeviceGet, (orb_cu_device * device, int ordinal))                                       \
    X(device_get_attribute, cuDeviceGetAttribute, (int *value, unsigned int attribute, orb_cu_device device)) \
    X(device_get_name, cuDeviceGetName, (char *name, int len, orb_cu_device device))                        \
    X(device_get_pci_bus_id, cuDeviceGetPCIBusId, (char *id, int len, orb_cu_device device))                \
    X(primary_ctx_retain, cuDevicePrimaryCtxRetain, (orb_cu_context * ctx, orb_cu_device device))           \
    X(primary_ctx_release, cuDevicePrimaryCtxRelease_v2, (orb_cu_device device))                            \
    X(ctx_set_current, cuCtxSetCurrent, (orb_cu_context ctx))                                               \
    X(ctx_get_current, cuCtxGetCurrent, (orb_cu_context * ctx))                                             \
    X(ctx_get_device, cuCtxGetDevice, (orb_cu_device * device))                                             \
    X(mem_alloc, cuMemAlloc_v2, (orb_cu_deviceptr * ptr, size_t bytes))                                     \
    X(mem_free, cuMemFree_v2, (orb_cu_deviceptr ptr))                                                       \
    X(mem_get_address_range, cuMemGetAddressRange_v2, (orb_cu_deviceptr * base, size_t *size, orb_cu_deviceptr ptr)) \
    X(mem_host_alloc, cuMemHostAlloc, (void **ptr, size_t bytes, unsigned int flags))                       \
    X(mem_free_host, cuMemFreeHost, (void *ptr))                                                            \
    X(pointer_get_attribute, cuPointerGetAttribute, (void *data, unsigned int attribute, orb_cu_deviceptr ptr)) \
    X(pointer_set_attribute, cuPointerSetAttribute, (const void *value, unsigned int attribute, orb_cu_deviceptr ptr)) \
    X(memcpy_htod, cuMemcpyHtoD_v2, (orb_cu_deviceptr dst, const void *src, size_t bytes))                  \
    X(memcpy_dtoh, cuMemcpyDtoH_v2, (void *dst, orb_cu_deviceptr src, size_t bytes))                        \
    X(memcpy_dtod, cuMemcpyDtoD_v2, (orb_cu_deviceptr dst, orb_cu_deviceptr src, size_t bytes))             \
    X(memcpy_htod_async, cuMemcpyHtoDAsync_v2,                                                              \
      (orb_cu_deviceptr dst, const void *src, size_t bytes, orb_cu_stream stream))                          \
    X(memcpy_dtoh_async, cuMemcpyDtoHAsync_v2, (void *dst, orb_cu_deviceptr src, size_t bytes, orb_cu_stream stream)) \
    X(memcpy_dtod_async, cuMemcpyDtoDAsync_v2,                                                              \
      (orb_cu_deviceptr dst, orb_cu_deviceptr src, size_t bytes, orb_cu_stream stream))                     \
    X(stream_create, cuStreamCreate, (orb_cu_stream * stream, unsigned int flags))                          \
    X(stream_destroy, cuStreamDestroy_v2, (orb_cu_stream stream))                                           \
    X(stream_synchronize, cuStreamSynchronize, (orb_cu_stream stream))                                      \
    X(stream_query, cuStreamQuery, (orb_cu_stream stream))                                                  \
    X(stream_get_ctx, cuStreamGetCtx, (orb_cu_stream stream, orb_cu_context * ctx))                         \
    X(stream_is_capturing, cuStreamIsCapturing, (orb_cu_stream stream, unsigned int *status))               \
    X(event_create, cuEventCreate, (orb_cu_event * event, unsigned int flags))                              \
    X(event_destroy, cuEventDestroy_v2, (orb_cu_event event))                                               \
    X(event_record, cuEventRecord, (orb_cu_event event, orb_cu_stream stream))                              \
    X(event_synchronize, cuEventSynchronize, (orb_cu_event event))                                          \
    X(event_query, cuEventQuery, (orb_cu_event event))                                                      \
    X(ipc_get_mem_handle, cuIpcGetMemHandle, (orb_cu_ipc_mem_handle * handle, orb_cu_deviceptr ptr))        \
    X(ipc_open_mem_handle, cuIpcOpenMemHandle_v2,                                                           \
      (orb_cu_deviceptr * ptr, orb_cu_ipc_mem_handle handle, unsigned int flags))                           \
    X(ipc_close_mem_handle, cuIpcCloseMemHandle, (orb_cu_deviceptr ptr))

/* Virtual memory management (CUDA 10.2 on): what sharing an allocation made with cuMemCreate
 * takes, since it has no legacy IPC handle. Resolved all together or not at all, apart from the
 * exports above: a driver without them still serves everything else, and such allocations are
 * then refused for sharing. */
#define ORB_CUDA_VMM_EXPORTS(X)                                                                             \
    X(mem_retain_allocation_handle, cuMemRetainAllocationHandle, (orb_cu_mem_handle * handle, void *addr))   \
    X(mem_release, cuMemRelease, (orb_cu_mem_handle handle))                                                 \
    X(mem_export_to_shareable_handle, cuMemExportToShareableHandle,                                          \
      (void *shareable, orb_cu_mem_handle handle, unsigned int type, unsigned long long flags))              \
    X(mem_import_from_shareable_handle, cuMemImportFromShareableHandle,                                      \
      (orb_cu_mem_handle * handle, void *os_handle, unsigned int type))                                      \
    X(mem_address_reserve, cuMemAddressReserve,                                                              \
      (orb_cu_deviceptr * ptr, size_t size, size_t alignment, orb_cu_deviceptr addr, unsigned long long flags)) \
    X(mem_address_free, cuMemAddressFree, (orb_cu_deviceptr ptr, size_t size))                               \
    X(mem_map, cuMemMap,                                                                                     \
      (orb_cu_deviceptr ptr, size_t size, size_t offset, orb_cu_mem_handle handle, unsigned long long flags)) \
    X(mem_unmap, cuMemUnmap, (orb_cu_deviceptr ptr, size_t size))                                            \
    X(mem_set_access, cuMemSetAccess,                                                                        \
      (orb_cu_deviceptr ptr, size_t size, const orb_cu_mem_access_desc *desc, size_t count))

/* dma-buf export (CUDA 11.7 on): what registering device memory with a NIC by dma-buf takes.
 * Resolved apart from the rest; without it that route is unavailable. */
#define ORB_CUDA_DMABUF_EXPORTS(X)                                                                          \
    X(mem_get_handle_for_address_range, cuMemGetHandleForAddressRange,                                       \
      (void *handle, orb_cu_deviceptr ptr, size_t size, unsigned int type, unsigned long long flags))

/* GPUDirect write visibility (CUDA 11.3 on): where a device does not order NIC writes for its own
 * consumers, this makes them visible. Resolved apart; without it such devices take no Direct. */
#define ORB_CUDA_FLUSH_EXPORTS(X)                                                                           \
    X(flush_gpudirect_rdma_writes, cuFlushGPUDirectRDMAWrites, (unsigned int target, unsigned int scope))

/* orb_cu_<field>_fn: each export's function type. */
#define ORB_CUDA_FN_TYPE(field, export, params) typedef orb_cu_result orb_cu_##field##_fn params;
ORB_CUDA_EXPORTS(ORB_CUDA_FN_TYPE)
ORB_CUDA_VMM_EXPORTS(ORB_CUDA_FN_TYPE)
ORB_CUDA_DMABUF_EXPORTS(ORB_CUDA_FN_TYPE)
ORB_CUDA_FLUSH_EXPORTS(ORB_CUDA_FN_TYPE)
#undef ORB_CUDA_FN_TYPE

#endif
