/* Internal: locality tiers of each NIC for one memory location, the input of the selector's
 * tier weights. tier[id] is 0 (nearest), 1, 2, or ORB_TOPO_TIER_NONE for a NIC that is not
 * eligible for that location (not in the filter mask, absent, or rejected by strict NUMA).
 *
 * CPU memory on NUMA node N (the effective node: preferred_numa_node when set, else N):
 *   tier 0  NICs on node N;
 *   tier 1  NICs on the nearest other nodes (smallest distance among the remote NICs' nodes),
 *           remote NICs whose distance is unknown, and NICs whose own node is unknown;
 *   tier 2  NICs on farther nodes.
 *   Unknown location (N = -1 and no preferred node): every eligible NIC is tier 0.
 * GPU memory (CUDA ordinal), using the GPU's own PCI path and node (preferred_numa_node does
 * not apply):
 *   tier 0  NICs below the GPU's nearest common PCI bridge: the deepest hop shared with any
 *           discovered NIC, which must lie below the root complex; unknown paths never share;
 *   tier 1  other NICs on the GPU's node (both nodes known);
 *   tier 2  the rest, including NICs or GPUs of unknown locality.
 * strict_local_numa turns a NIC whose node is known and differs from the location's known node
 * into ORB_TOPO_TIER_NONE; unknown locality on either side stays eligible.
 * Pure functions of their arguments: thread-safe, no allocation. */
#ifndef ORB_TOPO_TIERS_H
#define ORB_TOPO_TIERS_H

#include <stdint.h>

#include "topo/inventory.h"
#include "topo/location.h"
#include "topo/topo_config.h"

#define ORB_TOPO_TIERS 3
#define ORB_TOPO_TIER_NONE 255

/* Tiers for host memory on `numa_node` (ORB_TOPO_NUMA_UNKNOWN for an unknown location, e.g. "*").
 * `eligible` is the mask from orb_topo_filter(). Errors: ORB_EINVAL (NULL, numa_node < -1). */
int orb_topo_tiers_cpu(const struct orb_topo_inventory *inv, const struct orb_topo_config *cfg,
                       uint64_t eligible, int32_t numa_node, uint8_t tier[ORB_TOPO_MAX_NICS]);

/* Tiers for memory of the GPU with CUDA ordinal `ordinal`. Errors: ORB_EINVAL (NULL), ORB_ENOENT
 * (no such GPU in the inventory). `tier` is written only on success. */
int orb_topo_tiers_gpu(const struct orb_topo_inventory *inv, const struct orb_topo_config *cfg,
                       uint64_t eligible, uint32_t ordinal, uint8_t tier[ORB_TOPO_MAX_NICS]);

/* Dispatch on a parsed location: "*" is host memory of unknown node, cpu:N and cuda:N as above.
 * A matrix row, when one governs the location, replaces the tiers; entries that are
 * ORB_TOPO_TIER_NONE here (filtered out or strict-NUMA rejected) must still exclude the NIC.
 * Errors: as the two functions above, ORB_EINVAL for an unknown kind. */
int orb_topo_tiers_for_location(const struct orb_topo_inventory *inv, const struct orb_topo_config *cfg,
                                uint64_t eligible, struct orb_location loc, uint8_t tier[ORB_TOPO_MAX_NICS]);

struct orb_topo_ranks;

/* The tiers of `loc` as the selector takes them: the discovered tiers above, replaced, when the
 * compiled matrix `ranks` (NULL: none) has a row governing `loc`, by that row's ranks (rank r is
 * tier r; a NIC the row does not list, or a disabled row, excludes the NIC). A NIC the discovered
 * tiers exclude (filters, strict NUMA) stays excluded whatever the row says. `tier` is written
 * only on success. Errors: as orb_topo_tiers_for_location. */
int orb_topo_tiers_ranked(const struct orb_topo_inventory *inv, const struct orb_topo_config *cfg, uint64_t eligible,
                          const struct orb_topo_ranks *ranks, struct orb_location loc,
                          uint8_t tier[ORB_TOPO_MAX_NICS]);

/* Number of PCI hops two paths share when that includes at least one bridge below the root
 * complex (>= 2), else 0; 0 when either path is unknown. */
unsigned orb_topo_common_bridge_depth(const struct orb_pci_path *a, const struct orb_pci_path *b);

#endif
