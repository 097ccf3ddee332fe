/* Worker lanes to NUMA nodes and CPUs (see lane_cpus.h). */
#include "topo/lane_cpus.h"

#include <string.h>

#include "core/error.h"
#include "topo/inventory.h"

int orb_lane_cpus_plan(const int32_t *rail_node, uint32_t nrails, uint32_t nlanes, orb_node_cpus_fn node_cpus,
                       void *ctx, const struct orb_cpuset *allowed, struct orb_lane_cpus *out)
{
    if ((rail_node == NULL && nrails > 0) || node_cpus == NULL || allowed == NULL || out == NULL || nlanes == 0)
        return orb_fail(ORB_EINVAL, "lane CPUs: NULL argument or no lane");
    int32_t nodes[ORB_TOPO_MAX_NICS];
    uint32_t nnodes = 0;
    for (uint32_t r = 0; r < nrails; r++) {
        int32_t n = rail_node[r];
        bool seen = n < 0;
        for (uint32_t i = 0; i < nnodes && !seen; i++)
            seen = nodes[i] == n;
        if (!seen && nnodes < ORB_TOPO_MAX_NICS)
            nodes[nnodes++] = n;
    }
    for (uint32_t l = 0; l < nlanes; l++) {
        memset(&out[l], 0, sizeof out[l]);
        out[l].node = ORB_TOPO_NUMA_UNKNOWN;
        if (nnodes == 0)
            continue;
        int32_t node = nodes[l % nnodes];
        struct orb_cpuset cpus;
        if (node_cpus(ctx, node, &cpus) != 0)
            continue;
        orb_cpuset_and(&cpus, &cpus, allowed);
        if (orb_cpuset_count(&cpus) == 0)
            continue;
        out[l].node = node;
        out[l].cpus = cpus;
    }
    return 0;
}
