/* Internal: copies between a CUDA memory owner's device bytes and host bytes, for staging. Each
 * allocation lazily owns one non-blocking stream and one completion event (made in its device's
 * primary context on the first copy, destroyed with the allocation). A copy is submitted on that
 * stream, the event recorded after it and waited for before the call returns, so the bytes are
 * in place when it returns 0. Copies of one allocation run one at a time.
 *
 * A failed submit or record drains the stream (cuStreamSynchronize) before the call returns the
 * failure; nothing of that copy is then in flight. Where neither the event wait nor the drain
 * succeeds, nothing proves the stream idle: the call returns ORB_EUNQUIESCED, the allocation is
 * fenced (every later copy fails the same way at once) and, when its last reference goes, it is
 * kept with its stream, event and context (orb_cuda_retained_resources()), never freed under
 * work that may still run; the caller keeps that copy's host bytes too (staging), since the
 * device may still read or write them. Destroying a stream or an event is never taken as
 * completion. */
#ifndef ORB_CUDA_CUDA_MEMORY_H
#define ORB_CUDA_CUDA_MEMORY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <orbite/orbite.h>

#include "cuda/cuda_api.h"

/* [offset, offset + len) of mem's allocation into `host` (len bytes). Errors: ORB_EINVAL (NULL,
 * len 0, the range outside the allocation), ORB_EUNQUIESCED (fenced, or the copy's end not
 * proven), the driver's failure of a submit, record or stream creation (orb_cuda_status).
 * `*held` (when not NULL) says whether the device may still use `host`: true only when this
 * copy's end was not proven (then `host` must never be reused or freed); false on success and on
 * every other failure, a refusal of memory fenced before included (nothing was queued). */
int orb_cuda_memory_to_host_held(orb_cuda_memory *mem, size_t offset, void *host, size_t len, bool *held);
/* The same without `held`. */
int orb_cuda_memory_to_host(orb_cuda_memory *mem, size_t offset, void *host, size_t len);

/* `host` (len bytes) into [offset, offset + len) of mem's allocation. Errors and `held` as above. */
int orb_cuda_memory_from_host_held(orb_cuda_memory *mem, size_t offset, const void *host, size_t len, bool *held);
int orb_cuda_memory_from_host(orb_cuda_memory *mem, size_t offset, const void *host, size_t len);

/* Wait, once, for the producer work recorded on mem (orb_cuda_memory_record_producer): 0 when
 * none is pending or it finished (its `done` callback then ran, on this thread), ORB_EUNQUIESCED
 * when the allocation is fenced (a record or wait whose end is not proven). Every copy calls it
 * first; so do the transports before they touch a device registration. */
int orb_cuda_memory_ready(orb_cuda_memory *mem);

/* `len` bytes of pinned host memory (portable: any context may copy through it) to stage copies
 * of device `device`'s memory, page-aligned; NULL when the driver gives none. Freed with
 * orb_cuda_staging_free(); a free the driver refuses keeps the memory (retained resources). */
void *orb_cuda_staging_alloc(int device, size_t len);
void orb_cuda_staging_free(void *p);
/* Staging from orb_cuda_staging_alloc() that a device may still use: never freed, counted in the
 * retained resources (host_allocations, host_bytes and its context). */
void orb_cuda_staging_keep(void *p);

/* Lend [offset, +len) of mem (see orb_memkind_ops.loan): ORB_EBUSY when an overlapping loan
 * exists and either writes, ORB_EINVAL outside the allocation, ORB_ENOMEM. */
struct orb_cuda_loan;
int orb_cuda_memory_loan(orb_cuda_memory *mem, size_t offset, size_t len, int writes, struct orb_cuda_loan **out);
void orb_cuda_memory_loan_end(struct orb_cuda_loan *loan);

/* Several device-to-device copies of mem's allocation at once: queued one after the other on
 * its stream, the event recorded once after the last and waited for once. Each op's status is
 * set: 0, its submit's failure, or, when the wait fails, that failure for every queued copy
 * (which one failed is not known; the stream is drained first, ORB_EUNQUIESCED and the
 * allocation fenced when even that fails). Returns 0, or the first op's failure. Errors before
 * anything is queued (every status set to it): ORB_EINVAL (an op outside the allocation, no
 * peer, zero length), ORB_EUNQUIESCED (fenced), the producer wait's or context's failure. */
struct orb_cuda_dtod {
    size_t offset;                 /* in mem's allocation */
    uint64_t peer;                 /* a device address valid in mem's context */
    size_t len;
    int to_peer;                   /* mem -> peer, else peer -> mem */
    int status;                    /* out */
};
int orb_cuda_memory_dtod_many(orb_cuda_memory *mem, struct orb_cuda_dtod *ops, size_t n);

/* IPC between processes of one host. */

/* mem's legacy IPC handle (cuIpcGetMemHandle): another process maps the whole allocation with
 * it. Errors: ORB_EINVAL (NULL), ORB_EUNAVAILABLE (the allocation is not IPC-capable: a virtual
 * memory management one), the driver's failure. */
int orb_cuda_memory_ipc_handle(orb_cuda_memory *mem, uint8_t out[ORB_CU_IPC_HANDLE_SIZE]);

/* Map another process's allocation by its handle into device `device`'s primary context
 * (cuIpcOpenMemHandle, peer access enabled lazily); *ptr_out is its first byte here and
 * *size_out the length the driver maps (cuMemGetAddressRange), to bound every copy. The import
 * holds one retain of that context until orb_cuda_ipc_unimport(). Errors: ORB_EINVAL (no such
 * device, a handle of this process or of an allocation that is gone), the driver's failure. */
int orb_cuda_ipc_import(int device, const uint8_t handle[ORB_CU_IPC_HANDLE_SIZE], uint64_t *ptr_out,
                        size_t *size_out);

/* How another process may map mem's allocation: ORB_CUDA_SHARE_LEGACY (a legacy IPC handle,
 * orb_cuda_memory_ipc_handle) or ORB_CUDA_SHARE_FD (a virtual memory management allocation
 * made with a POSIX file descriptor handle type: orb_cuda_memory_export_fd). Errors: ORB_EINVAL
 * (NULL), ORB_EUNAVAILABLE (neither: the message says why), the driver's failure. */
enum orb_cuda_share { ORB_CUDA_SHARE_LEGACY = 1, ORB_CUDA_SHARE_FD = 2 };
/* The owner's number in this process (from 1, never reused): tells an allocation from a later
 * one at the same addresses. */
uint64_t orb_cuda_memory_serial(const orb_cuda_memory *mem);
int orb_cuda_memory_share_kind(orb_cuda_memory *mem, enum orb_cuda_share *out);

/* A new file descriptor (close-on-exec, the caller's to close) for the physical allocation mapped
 * at mem's first byte (cuMemRetainAllocationHandle, cuMemExportToShareableHandle). Errors as
 * orb_cuda_memory_share_kind for one that is not ORB_CUDA_SHARE_FD. */
int orb_cuda_memory_export_fd(orb_cuda_memory *mem, int *fd_out);

/* Map `size` bytes (a multiple of the allocation granularity) of another process's allocation,
 * given as the descriptor it exported (left open: the caller closes it), into device `device`:
 * an address range reserved for it, mapped and made readable and writable there. *ptr_out is its
 * first byte. It holds a retain of the device's primary context until orb_cuda_vmm_unimport().
 * Errors: ORB_EINVAL (no such device, a descriptor the driver does not take, a size beyond the
 * allocation), ORB_EUNAVAILABLE (the driver lacks virtual memory management), the driver's
 * failure; nothing stays mapped or reserved after one. */
int orb_cuda_vmm_import(int device, int fd, size_t size, uint64_t *ptr_out);

/* Unmap and free the range of an orb_cuda_vmm_import() and give back its context retain. One the
 * driver refuses to unmap stays for good (orb_cuda_retained_resources: imports and contexts)
 * and its failure is returned. */
int orb_cuda_vmm_unimport(int device, uint64_t ptr, size_t size);

/* GPUDirect. */

/* Make every synchronous memory operation on mem's allocation synchronize
 * (CU_POINTER_ATTRIBUTE_SYNC_MEMOPS), as a NIC reading or writing it directly requires. Errors:
 * ORB_EINVAL (NULL), the driver's failure. */
int orb_cuda_memory_sync_memops(orb_cuda_memory *mem);

/* How device `device` sees NIC writes into its memory: *ordered_out when its own consumers see
 * them in order (CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING at least OWNER), and
 * *flushable_out when cuFlushGPUDirectRDMAWrites can make them visible where they are not.
 * Errors: ORB_EINVAL (no such device, NULL), the driver's failure. */
int orb_cuda_device_gdr_writes(int device, bool *ordered_out, bool *flushable_out);

/* Make NIC writes into mem's allocation visible to its context (cuFlushGPUDirectRDMAWrites, to
 * the owner), for a device that does not order them. Errors: ORB_EINVAL, ORB_EUNAVAILABLE (the
 * driver has no such call), the driver's failure. */
int orb_cuda_memory_gdr_flush(orb_cuda_memory *mem);

/* Whether device `device` can export its memory as dma-buf: the driver exports
 * cuMemGetHandleForAddressRange and the device says CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED.
 * Errors: ORB_EINVAL (no such device, NULL), the driver's failure. */
int orb_cuda_device_dmabuf(int device, bool *supported_out);

/* A dma-buf descriptor (close-on-exec, the caller's to close) for the whole allocation of mem,
 * exported with flags 0 over the host pages that hold it: from *base_out (its first byte down to
 * a host page) for *size_out bytes (to its end up to a host page). A NIC registers any range of
 * it by offset from that base. Errors: ORB_EINVAL (NULL), ORB_EUNAVAILABLE (the driver cannot
 * export), the driver's failure. */
int orb_cuda_memory_dmabuf(orb_cuda_memory *mem, int *fd_out, uint64_t *base_out, uint64_t *size_out);

/* Unmap an import (cuIpcCloseMemHandle) and give back its context retain. A close the driver
 * refuses keeps the mapping and the retain for good (orb_cuda_retained_resources: imports and
 * contexts) and returns its failure. */
int orb_cuda_ipc_unimport(int device, uint64_t ptr);

#endif
