/* Internal: NIC eligibility configuration (whitelist, blacklist, device mask, pins, NUMA policy)
 * and the filter that turns it, with an inventory, into the mask of eligible stable NIC ids.
 *
 * Rules:
 *  - A non-empty whitelist wins: the blacklist is then ignored. Every whitelist name must name a
 *    discovered NIC (a typo fails instead of silently narrowing the set); blacklist names that
 *    are not present are ignored.
 *  - device_mask keeps NIC ids whose bit is set (bit i = stable id i).
 *  - Pins never fall back: a pinned device must be present, usable and left by the filters, a
 *    pinned port must exist on it and a pinned GID index must hold a valid GID on that port (on
 *    any of its ports when the port is not pinned). A port or GID pin without a device pin keeps
 *    only the NICs that have it.
 *  - Explicit filters that leave no NIC are a configuration error; the default configuration on
 *    a host without usable NICs gives an empty mask and no error.
 *  - preferred_numa_node must be a discovered node when the inventory has NUMA data.
 * Pure functions of their arguments: thread-safe, no allocation. */
#ifndef ORB_TOPO_CONFIG_H
#define ORB_TOPO_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "topo/inventory.h"

#define ORB_TOPO_FILTER_NAMES_MAX 64   /* entries per whitelist or blacklist */
#define ORB_TOPO_PIN_NONE (-1)         /* gid_index value: not pinned */
#define ORB_TOPO_GID_INDEX_MAX 65535
#define ORB_TOPO_DEVICE_MASK_ALL UINT64_MAX

struct orb_topo_pin {
    char device[ORB_TOPO_NAME_MAX]; /* "" = not pinned */
    uint8_t port;                   /* 0 = not pinned; otherwise the 1-based port number */
    int32_t gid_index;              /* ORB_TOPO_PIN_NONE = not pinned; otherwise 0..65535 */
};

struct orb_topo_config {
    uint32_t nwhitelist;
    char whitelist[ORB_TOPO_FILTER_NAMES_MAX][ORB_TOPO_NAME_MAX];
    uint32_t nblacklist;
    char blacklist[ORB_TOPO_FILTER_NAMES_MAX][ORB_TOPO_NAME_MAX];
    struct orb_topo_pin pin;
    uint64_t device_mask;           /* default: all ids */
    int32_t preferred_numa_node;    /* ORB_TOPO_NUMA_UNKNOWN (-1) = none */
    bool strict_local_numa;         /* reject known cross-NUMA NICs; unknown locality stays eligible */
};

/* Defaults: empty lists, nothing pinned, all ids, no preferred node, strict NUMA off. */
void orb_topo_config_defaults(struct orb_topo_config *cfg);

/* Append a name to the whitelist or blacklist. Errors: ORB_EINVAL (NULL), ORB_ECONFIG (invalid
 * name, or the list already holds ORB_TOPO_FILTER_NAMES_MAX names). */
int orb_topo_config_whitelist_add(struct orb_topo_config *cfg, const char *name);
int orb_topo_config_blacklist_add(struct orb_topo_config *cfg, const char *name);

/* Checks that need no inventory: list counts and names, the pin's fields, a non-zero
 * device_mask, preferred_numa_node >= -1. Errors: ORB_EINVAL (NULL), ORB_ECONFIG naming the field. */
int orb_topo_config_validate(const struct orb_topo_config *cfg);

struct orb_rdma_config;

/* The NIC filters of RDMA settings (whitelist, blacklist, pinned device, port and GID index,
 * device_mask, NUMA preferences) in these terms, validated. Errors: ORB_EINVAL, ORB_ECONFIG
 * naming the field. */
int orb_topo_config_from_rdma(const struct orb_rdma_config *rdma, struct orb_topo_config *cfg);

/* The stable id of the NIC named `name`, or -1. */
int orb_topo_find_nic(const struct orb_topo_inventory *inv, const char *name);

/* Validate `cfg` against `inv` and write the mask of eligible NIC ids (usable, allowed by the
 * lists, the device mask and the pins) to `*out_eligible_mask`, only on success. Errors:
 * ORB_EINVAL (NULL), ORB_ECONFIG with a message naming the device, list or field at fault. */
int orb_topo_filter(const struct orb_topo_inventory *inv, const struct orb_topo_config *cfg,
                    uint64_t *out_eligible_mask);

#endif
