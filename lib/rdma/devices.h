/* The RDMA NICs of one engine: a device context and a protection domain per NIC of the host
 * inventory that the engine may use, opened through the helper where it can enforce the policy.
 *
 * Which NICs: the inventory's usable NICs whose id is set in `allowed` (the policy's NIC mask
 * when the helper is in use, intersected with the engine's own device mask). A NIC outside it
 * is never opened.
 *
 * How, per NIC:
 *  - with a helper session: OPEN_DEVICE, then ibv_import_device() of the descriptor. The helper
 *    opens only what the policy grants: the policy is enforced. A refusal (ORB_EPERM, ORB_ENOENT)
 *    leaves the NIC closed. Where the provider cannot import a context (the helper answers
 *    ORB_EUNAVAILABLE: every provider but mlx5 in rdma-core, rxe included), ORB_HELPER_AUTO
 *    opens the device directly and logs that the policy is honoured, not enforced, for that
 *    device; ORB_HELPER_REQUIRED fails the whole open with ORB_EUNAVAILABLE naming the device
 *    and its provider;
 *  - without one (ORB_HELPER_OFF, or AUTO with no helper installed): directly.
 * Slots are the inventory's ids: a NIC that fails to open stays in its slot, unusable, with the
 * status that says why, and never renumbers the others.
 *
 * The verbs calls go through an operation table, so that the decisions above are tested
 * without a device; orb_rdma_devices_verbs_ops() gives the real one. */
#ifndef ORB_RDMA_DEVICES_H
#define ORB_RDMA_DEVICES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <orbite/orbite.h>

#include "rdma/verbs.h"
#include "topo/inventory.h"

struct orb_rdma_open_ops {
    /* OPEN_DEVICE through the helper: 0 with a descriptor the caller owns, or the helper's
     * status. NULL: no helper session. */
    int (*helper_open_device)(void *impl, const char *nic, int *fd_out);
    /* ibv_import_device(fd), after which the context owns fd (ibv_close_device closes it); NULL
     * with errno when it cannot (the caller still owns fd then). */
    struct ibv_context *(*import_device)(void *impl, int fd);
    /* The device called `nic`, opened directly; NULL with errno (ENODEV: no such device). */
    struct ibv_context *(*open_direct)(void *impl, const char *nic);
    int (*close_device)(void *impl, struct ibv_context *ctx);
    struct ibv_pd *(*alloc_pd)(void *impl, struct ibv_context *ctx);
    int (*dealloc_pd)(void *impl, struct ibv_pd *pd);
    /* Describe the provider that drives `nic` into buf (NUL-terminated) for messages: 0, or an
     * error when it cannot say. NULL: no description. */
    int (*describe_provider)(void *impl, const char *nic, char *buf, size_t len);
};

struct orb_helper;

/* The real table over the process's libibverbs `v` and the helper session `helper` (NULL:
 * none). Fills *ops and *impl (which must outlive the devices it opens). */
struct orb_rdma_verbs_impl {
    const struct orb_verbs *v;
    struct orb_helper *helper;
};
void orb_rdma_devices_verbs_ops(struct orb_rdma_verbs_impl *impl, const struct orb_verbs *v,
                                struct orb_helper *helper, struct orb_rdma_open_ops *ops);

enum orb_rdma_route {
    ORB_RDMA_ROUTE_NONE = 0,     /* not opened */
    ORB_RDMA_ROUTE_IMPORTED = 1, /* through the helper: the policy is enforced */
    ORB_RDMA_ROUTE_DIRECT = 2,   /* opened here: the policy (if any) is honoured, not enforced */
};

struct orb_rdma_nic {
    uint8_t id;                  /* the inventory's NIC id (the slot) */
    uint8_t route;               /* enum orb_rdma_route */
    int status;                  /* 0 when open; else why not (ORB_EPERM denied, ...) */
    char name[ORB_TOPO_NAME_MAX];
    struct ibv_context *ctx;
    struct ibv_pd *pd;
};

struct orb_rdma_devices {
    struct orb_rdma_open_ops ops;
    void *impl;
    uint32_t nslots;             /* slots 0..nslots-1 (the highest inventory id + 1) */
    uint32_t nopen;
    struct orb_rdma_nic nics[ORB_TOPO_MAX_NICS];
};

/* Open the NICs as described above into *out (owned by the caller, closed with
 * orb_rdma_devices_close). `have_helper` says whether ops->helper_open_device may be called.
 * Returns 0 even when no NIC opened (nopen says how many did). Errors: ORB_EINVAL (NULL),
 * ORB_EUNAVAILABLE (ORB_HELPER_REQUIRED and a granted device whose provider cannot import a
 * context: the message names it; nothing stays open), a helper session failure (ORB_EPEER,
 * ORB_EPROTO, ORB_ETIMEDOUT: nothing stays open). */
int orb_rdma_devices_open(const struct orb_rdma_open_ops *ops, void *impl, const struct orb_topo_inventory *inv,
                          uint64_t allowed, enum orb_helper_mode mode, struct orb_rdma_devices *out);

/* Release every PD and context (NULL-safe, idempotent). A teardown call that fails keeps its
 * object (it is never freed twice) and is counted in the return value. */
uint32_t orb_rdma_devices_close(struct orb_rdma_devices *d);

#endif
