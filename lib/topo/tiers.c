/* GPU-to-NIC and CPU-to-NIC locality tiers. */
#include "topo/tiers.h"

#include <stdbool.h>
#include <string.h>

#include "core/error.h"
#include "topo/matrix.h"

unsigned orb_topo_common_bridge_depth(const struct orb_pci_path *a, const struct orb_pci_path *b)
{
    if (a->depth < 2 || b->depth < 2 || a->depth > ORB_TOPO_PCI_DEPTH || b->depth > ORB_TOPO_PCI_DEPTH)
        return 0;
    /* Only bridges can be shared: each path's last hop is the device itself. */
    unsigned limit = (unsigned)(a->depth < b->depth ? a->depth : b->depth) - 1;
    unsigned shared = 0;
    while (shared < limit && strncmp(a->hops[shared], b->hops[shared], ORB_TOPO_PCI_MAX) == 0)
        shared++;
    return shared >= 2 ? shared : 0; /* hops[0] is the root complex itself */
}

static uint32_t nic_count(const struct orb_topo_inventory *inv)
{
    return inv->nnics < ORB_TOPO_MAX_NICS ? inv->nnics : ORB_TOPO_MAX_NICS;
}

static bool nic_eligible(const struct orb_topo_inventory *inv, uint64_t eligible, uint32_t id)
{
    return (eligible & (1ull << id)) != 0 && inv->nics[id].usable;
}

/* Position of node `id` in inv->numa, or -1. */
static int numa_position(const struct orb_topo_inventory *inv, int32_t id)
{
    uint32_t n = inv->nnuma < ORB_TOPO_MAX_NUMA ? inv->nnuma : ORB_TOPO_MAX_NUMA;
    for (uint32_t i = 0; i < n; i++)
        if (inv->numa[i].id == id)
            return (int)i;
    return -1;
}

/* The distance from node `from` to node `to`, or -1 when either node or the row is unknown. */
static int numa_distance(const struct orb_topo_inventory *inv, int32_t from, int32_t to)
{
    int pf = numa_position(inv, from), pt = numa_position(inv, to);
    if (pf < 0 || pt < 0 || pt >= inv->numa[pf].ndistances)
        return -1;
    return inv->numa[pf].distance[pt];
}

int orb_topo_tiers_cpu(const struct orb_topo_inventory *inv, const struct orb_topo_config *cfg,
                       uint64_t eligible, int32_t numa_node, uint8_t tier[ORB_TOPO_MAX_NICS])
{
    if (inv == NULL || cfg == NULL || tier == NULL)
        return orb_fail(ORB_EINVAL, "topology tiers: NULL argument");
    if (numa_node < ORB_TOPO_NUMA_UNKNOWN)
        return orb_fail(ORB_EINVAL, "topology tiers: NUMA node %d is invalid", (int)numa_node);
    int32_t node = cfg->preferred_numa_node != ORB_TOPO_NUMA_UNKNOWN ? cfg->preferred_numa_node : numa_node;
    uint32_t n = nic_count(inv);
    memset(tier, ORB_TOPO_TIER_NONE, ORB_TOPO_MAX_NICS);

    /* The nearest remote distance among eligible NICs decides which remote nodes are tier 1. */
    int nearest_remote = -1;
    for (uint32_t i = 0; node != ORB_TOPO_NUMA_UNKNOWN && i < n; i++) {
        int32_t nic_node = inv->nics[i].numa_node;
        if (!nic_eligible(inv, eligible, i) || nic_node == ORB_TOPO_NUMA_UNKNOWN || nic_node == node)
            continue;
        int d = numa_distance(inv, node, nic_node);
        if (d >= 0 && (nearest_remote < 0 || d < nearest_remote))
            nearest_remote = d;
    }

    for (uint32_t i = 0; i < n; i++) {
        if (!nic_eligible(inv, eligible, i))
            continue;
        int32_t nic_node = inv->nics[i].numa_node;
        if (node == ORB_TOPO_NUMA_UNKNOWN)
            tier[i] = 0;
        else if (nic_node == node)
            tier[i] = 0;
        else if (nic_node == ORB_TOPO_NUMA_UNKNOWN)
            tier[i] = 1;
        else if (cfg->strict_local_numa)
            continue; /* known cross-NUMA: stays ORB_TOPO_TIER_NONE */
        else {
            int d = numa_distance(inv, node, nic_node);
            tier[i] = (d < 0 || d == nearest_remote) ? 1 : 2;
        }
    }
    return 0;
}

int orb_topo_tiers_gpu(const struct orb_topo_inventory *inv, const struct orb_topo_config *cfg,
                       uint64_t eligible, uint32_t ordinal, uint8_t tier[ORB_TOPO_MAX_NICS])
{
    if (inv == NULL || cfg == NULL || tier == NULL)
        return orb_fail(ORB_EINVAL, "topology tiers: NULL argument");
    const struct orb_topo_gpu *gpu = NULL;
    for (uint32_t g = 0; g < inv->ngpus && g < ORB_TOPO_MAX_GPUS; g++)
        if (inv->gpus[g].ordinal == ordinal)
            gpu = &inv->gpus[g];
    if (gpu == NULL)
        return orb_fail(ORB_ENOENT, "topology tiers: cuda:%u is not a discovered GPU", ordinal);
    uint32_t n = nic_count(inv);

    /* The nearest common bridge is physical: computed over every discovered NIC, so that a
     * filtered-out neighbour does not promote a farther NIC into tier 0. */
    unsigned nearest = 0;
    for (uint32_t i = 0; i < n; i++) {
        unsigned shared = orb_topo_common_bridge_depth(&gpu->path, &inv->nics[i].path);
        if (shared > nearest)
            nearest = shared;
    }

    memset(tier, ORB_TOPO_TIER_NONE, ORB_TOPO_MAX_NICS);
    for (uint32_t i = 0; i < n; i++) {
        if (!nic_eligible(inv, eligible, i))
            continue;
        const struct orb_topo_nic *nic = &inv->nics[i];
        bool both_known = gpu->numa_node != ORB_TOPO_NUMA_UNKNOWN && nic->numa_node != ORB_TOPO_NUMA_UNKNOWN;
        if (cfg->strict_local_numa && both_known && nic->numa_node != gpu->numa_node)
            continue;
        if (nearest > 0 && orb_topo_common_bridge_depth(&gpu->path, &nic->path) == nearest)
            tier[i] = 0;
        else if (both_known && nic->numa_node == gpu->numa_node)
            tier[i] = 1;
        else
            tier[i] = 2;
    }
    return 0;
}

int orb_topo_tiers_for_location(const struct orb_topo_inventory *inv, const struct orb_topo_config *cfg,
                                uint64_t eligible, struct orb_location loc, uint8_t tier[ORB_TOPO_MAX_NICS])
{
    switch (loc.kind) {
    case ORB_LOC_ANY:
        return orb_topo_tiers_cpu(inv, cfg, eligible, ORB_TOPO_NUMA_UNKNOWN, tier);
    case ORB_LOC_CPU:
        return orb_topo_tiers_cpu(inv, cfg, eligible, loc.index, tier);
    case ORB_LOC_CUDA:
        return orb_topo_tiers_gpu(inv, cfg, eligible, loc.index, tier);
    default:
        return orb_fail(ORB_EINVAL, "topology tiers: unknown location kind %u", loc.kind);
    }
}

int orb_topo_tiers_ranked(const struct orb_topo_inventory *inv, const struct orb_topo_config *cfg, uint64_t eligible,
                          const struct orb_topo_ranks *ranks, struct orb_location loc,
                          uint8_t tier[ORB_TOPO_MAX_NICS])
{
    uint8_t t[ORB_TOPO_MAX_NICS];
    int rc = orb_topo_tiers_for_location(inv, cfg, eligible, loc, t);
    if (rc != 0)
        return rc;
    const struct orb_topo_rank_row *row = ranks != NULL ? orb_topo_ranks_row(ranks, loc) : NULL;
    if (row != NULL)
        for (unsigned id = 0; id < ORB_TOPO_MAX_NICS; id++)
            if (t[id] != ORB_TOPO_TIER_NONE)
                t[id] = row->rank[id] < ORB_TOPO_TIERS ? row->rank[id] : ORB_TOPO_TIER_NONE;
    memcpy(tier, t, sizeof t);
    return 0;
}
