/* libibverbs, loaded at run time: the entry points the RDMA transport calls, resolved once per
 * process from libibverbs.so.1 with dlopen, and kept for the process's lifetime.
 *
 * liborbite never links libibverbs: an engine without an RDMA transport never loads it, and a
 * machine without rdma-core runs every TCP engine. The types come from rdma-core's headers at
 * build time (libibverbs-dev); only the symbols are late.
 *
 * Every required symbol or none: a library missing one is refused as a whole, with an
 * ORB_EUNAVAILABLE detail naming the library and the export. Optional symbols (newer rdma-core
 * only) are NULL when absent, and their users check. The data path (post_send, post_recv,
 * poll_cq, bind_mw, alloc_mw, req_notify_cq) goes through the context's operation table as
 * rdma-core's own inline functions do, and needs no symbol. */
#ifndef ORB_RDMA_VERBS_H
#define ORB_RDMA_VERBS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <infiniband/verbs.h>

#define ORB_VERBS_LIBRARY "libibverbs.so.1"

/* The exported ibv_query_port, which takes rdma-core's compatibility layout. */
struct _compat_ibv_port_attr;

struct orb_verbs {
    /* ---- required ---- */
    struct ibv_device **(*get_device_list)(int *num_devices);
    void (*free_device_list)(struct ibv_device **list);
    const char *(*get_device_name)(struct ibv_device *device);
    __be64 (*get_device_guid)(struct ibv_device *device);
    struct ibv_context *(*open_device)(struct ibv_device *device);
    int (*close_device)(struct ibv_context *context);
    int (*query_device)(struct ibv_context *context, struct ibv_device_attr *attr);
    int (*query_port_compat)(struct ibv_context *context, uint8_t port, struct _compat_ibv_port_attr *attr);
    int (*query_gid)(struct ibv_context *context, uint8_t port, int index, union ibv_gid *gid);
    struct ibv_pd *(*alloc_pd)(struct ibv_context *context);
    int (*dealloc_pd)(struct ibv_pd *pd);
    struct ibv_mr *(*reg_mr_iova2)(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
                                   unsigned int access);
    int (*dereg_mr)(struct ibv_mr *mr);
    struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *context);
    int (*destroy_comp_channel)(struct ibv_comp_channel *channel);
    struct ibv_cq *(*create_cq)(struct ibv_context *context, int cqe, void *cq_context,
                                struct ibv_comp_channel *channel, int comp_vector);
    int (*destroy_cq)(struct ibv_cq *cq);
    int (*get_cq_event)(struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context);
    void (*ack_cq_events)(struct ibv_cq *cq, unsigned int nevents);
    struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
    int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask);
    int (*query_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask, struct ibv_qp_init_attr *init);
    int (*destroy_qp)(struct ibv_qp *qp);
    int (*get_async_event)(struct ibv_context *context, struct ibv_async_event *event);
    void (*ack_async_event)(struct ibv_async_event *event);
    struct ibv_context *(*import_device)(int cmd_fd);
    const char *(*wc_status_str)(enum ibv_wc_status status);

    /* ---- rdma-core's inline calls, through the context's operation table: no export is
     * involved; the loader sets them to its own functions, so that every call the transport
     * makes goes through this table ---- */
    int (*post_send)(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr);
    int (*post_recv)(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);
    struct ibv_mw *(*alloc_mw)(struct ibv_pd *pd, enum ibv_mw_type type);
    int (*dealloc_mw)(struct ibv_mw *mw);

    /* ---- optional: NULL when this rdma-core lacks them ---- */
    struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                                    int access);
    int (*query_gid_ex)(struct ibv_context *context, uint32_t port, uint32_t index, struct ibv_gid_entry *entry,
                        uint32_t flags, size_t entry_size);
};

/* The process's libibverbs: loaded on the first call (thread-safe), then the same table for the
 * process's lifetime, never unloaded. *out is set on success. Errors: ORB_EUNAVAILABLE (the
 * library cannot be loaded, or lacks a required export: the detail names which), ORB_EINVAL
 * (out NULL). A failed load is remembered: later calls fail the same way without retrying. */
int orb_verbs_get(const struct orb_verbs **out);

/* Whether this process has loaded libibverbs through orb_verbs_get() (successfully or not). */
bool orb_verbs_attempted(void);

/* Load the library at `path` into *out, independently of the process's table: for tests of the
 * loader, which load stand-in libraries. The handle stays open for the process's lifetime.
 * Errors as orb_verbs_get. */
int orb_verbs_load(const char *path, struct orb_verbs *out);

/* ibv_query_port as rdma-core's inline wrapper does it: through the context's extended
 * operation when the provider has one (which fills the whole current struct, active_speed_ex
 * included, where the LAG port speed lives), else the exported compatibility call. */
int orb_verbs_query_port(const struct orb_verbs *v, struct ibv_context *context, uint8_t port,
                         struct ibv_port_attr *attr);

#endif
