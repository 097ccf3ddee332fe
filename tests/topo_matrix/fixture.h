/* A small hand-built inventory for the matrix tests and the fuzz target. */
#ifndef ORB_TEST_TOPO_MATRIX_FIXTURE_H
#define ORB_TEST_TOPO_MATRIX_FIXTURE_H

#include <stdio.h>
#include <string.h>

#include "topo/inventory.h"

/* Append a usable NIC `name` with stable id `id`. */
static inline void fixture_add_nic(struct orb_topo_inventory *inv, const char *name, uint8_t id)
{
    struct orb_topo_nic *nic = &inv->nics[inv->nnics++];
    nic->id = id;
    nic->usable = 1;
    nic->numa_node = ORB_TOPO_NUMA_UNKNOWN;
    snprintf(nic->name, sizeof nic->name, "%s", name);
}

static inline void fixture_add_gpu(struct orb_topo_inventory *inv, uint32_t ordinal)
{
    inv->gpus[inv->ngpus].ordinal = ordinal;
    inv->gpus[inv->ngpus].numa_node = ORB_TOPO_NUMA_UNKNOWN;
    inv->ngpus++;
}

static inline void fixture_add_numa(struct orb_topo_inventory *inv, int32_t id)
{
    inv->numa[inv->nnuma++].id = id;
}

/* mlx5_0..mlx5_2 usable and eligible (ids 0..2); mlx5_3 (id 3) failed discovery; mlx5_4 (id 4)
 * excluded by the filters (FIXTURE_ELIGIBLE leaves bit 4 clear); GPUs 0 and 1; NUMA nodes 0, 1.
 * mlx5_1 sits in slot 2 and mlx5_2 in slot 1, so that slot order and stable ids differ. */
#define FIXTURE_ELIGIBLE UINT64_C(0x0f)

static inline void fixture_inventory(struct orb_topo_inventory *inv)
{
    memset(inv, 0, sizeof *inv);
    fixture_add_nic(inv, "mlx5_0", 0);
    fixture_add_nic(inv, "mlx5_2", 2);
    fixture_add_nic(inv, "mlx5_1", 1);
    fixture_add_nic(inv, "mlx5_3", 3);
    inv->nics[3].usable = 0;
    fixture_add_nic(inv, "mlx5_4", 4);
    fixture_add_gpu(inv, 0);
    fixture_add_gpu(inv, 1);
    fixture_add_numa(inv, 0);
    fixture_add_numa(inv, 1);
}

#endif
