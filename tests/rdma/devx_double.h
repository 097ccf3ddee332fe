/* A test-only double of mlx5 DevX grant keys (lib/rdma/devx_key.h) on soft-RoCE, which has no
 * DevX, so that gpu_source_reuse runs through the whole transport: registration probe, grant,
 * payload, invalidation, ACK.
 *
 * The device's side of a key:
 *  - CREATE_MKEY: the double keeps the command the library built as the device's record of the
 *    key (what QUERY_MKEY would read back) and hands out a key index of its own (never one of
 *    soft-RoCE's: at or above DEVX_DOUBLE_INDEX_BASE);
 *  - the key's access: a real memory region of exactly the key's range, at its address as iova,
 *    with only the key's remote right, over the host bytes that `view` gives for the device
 *    range (the CUDA stand-in's memory);
 *  - the translation: each KLM entry must lie in a live memory region of the key's PD (of the
 *    device the command went to) of the entry's local key, the entries contiguous over the key;
 *  - the QP binding: the interposer (verbs_interposer.h) puts that region's key into a READ or
 *    WRITE only when it is posted on a queue pair connected to the key's QP (its number at its
 *    GID), and while the key is valid; any other post keeps the made-up key, which the device
 *    refuses;
 *  - remote invalidation: a SEND_WITH_INV of the key goes out as a SEND with the key as
 *    immediate data, and its receive completion on the key's QP (of the key's device) comes back
 *    to the library as an invalidation of the key, the region deregistered first, where the
 *    command enabled remote invalidation (else the completion fails);
 *  - object handles numbered apart from key indices;
 *  - DEVX destroy: the region deregistered (if the key is still valid).
 * The helper's side (DEVX_VERIFY) is the helper's own decoder and checker (helper/devx.c) over
 * the kept command, so a key passes only if the command asks for exactly the range, QP and
 * direction. Faults: a device that binds keys to the wildcard QP, a refused CREATE, a refused
 * destroy. Thread-safe. */
#ifndef ORB_TESTS_RDMA_DEVX_DOUBLE_H
#define ORB_TESTS_RDMA_DEVX_DOUBLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/helper_proto.h"
#include "rdma/devx_key.h"

#define DEVX_DOUBLE_INDEX_BASE 0xF00000u
#define DEVX_DOUBLE_MAX_KEYS 256u

/* Install the filters over the interposer (itp_install() first) with `view` for device bytes. */
void devx_double_install(void *(*view)(unsigned long long addr, size_t len));
/* The key operations and the check, for orb_rdma_env's devx_ops / devx_verify (impl unused). */
const struct orb_devx_key_ops *devx_double_ops(void);
int devx_double_verify(void *impl, const struct orb_hp_devx_verify *v);

enum devx_double_fault {
    DEVX_DOUBLE_WILDCARD,        /* keys bound to the wildcard QP */
    DEVX_DOUBLE_CREATE_REFUSED,  /* CREATE_MKEY fails */
    DEVX_DOUBLE_DESTROY_REFUSED, /* destroy fails; the key stays valid */
    DEVX_DOUBLE_FAULTS
};
/* After `skip` more calls that the fault concerns (creates; destroys), the next `count` ones
 * have it; count 0 clears it. */
void devx_double_fault(enum devx_double_fault f, uint32_t skip, uint32_t count);

/* One key the double made, as the device knows it. */
struct devx_double_key {
    uint32_t key, qpn, pdn;
    uint64_t addr, len;
    bool remote_read, remote_write;
    bool verified;       /* a check passed on it */
    bool invalidated;    /* by the peer's SEND_WITH_INV, on its QP */
    bool destroyed;
    uint32_t posts;      /* READs and WRITEs that reached the device with it */
};
struct devx_double_counts {
    uint64_t creates, destroys, verifies, verify_failures, invalidations;
    uint64_t refused_posts;   /* READs/WRITEs that named a key the device would refuse */
    uint64_t live;            /* made, not destroyed */
};
struct devx_double_counts devx_double_counts(void);
/* The key made `n`-th (from 0), false when fewer were made. */
bool devx_double_key(size_t n, struct devx_double_key *out);

#endif
