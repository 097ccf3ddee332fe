/* Internal: which CPUs each worker lane of the RDMA transport runs on.
 *
 * Lanes are dealt to the NUMA nodes of the rails' NICs, round-robin in the order the nodes first
 * appear among the rails (rail 0's node first), so that with lanes >= nodes every node with a NIC
 * has a lane of its own. A lane runs on its node's CPUs that the process may use (the affinity it
 * started with); a lane whose node has none of them, and every lane when no rail's node is known
 * (soft-RoCE, a host without NUMA data), stays unbound (node ORB_TOPO_NUMA_UNKNOWN): the
 * scheduler's choice, as before. A link is then given to a lane of its NIC's node when there is
 * one. Pure functions; thread-safe. */
#ifndef ORB_TOPO_LANE_CPUS_H
#define ORB_TOPO_LANE_CPUS_H

#include <stdbool.h>
#include <stdint.h>

#include "topo/cpuset.h"

struct orb_lane_cpus {
    int32_t node;            /* the NUMA node it serves; ORB_TOPO_NUMA_UNKNOWN: unbound */
    struct orb_cpuset cpus;  /* its CPUs (empty when unbound) */
};

/* Called for each node: its CPUs into *out; non-zero when they cannot be read (that node's lanes
 * stay unbound). */
typedef int (*orb_node_cpus_fn)(void *ctx, int32_t node, struct orb_cpuset *out);

/* Plan `nlanes` lanes for rails whose NICs sit on rail_node[0..nrails) (ORB_TOPO_NUMA_UNKNOWN
 * where unknown), with the process's CPUs `allowed`, into out[0..nlanes). Errors: ORB_EINVAL
 * (NULL, nlanes 0). */
int orb_lane_cpus_plan(const int32_t *rail_node, uint32_t nrails, uint32_t nlanes, orb_node_cpus_fn node_cpus,
                       void *ctx, const struct orb_cpuset *allowed, struct orb_lane_cpus *out);

#endif
