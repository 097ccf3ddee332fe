/* What the fake helper serves in its well-behaved mode, shared with the tests that check it
 * arrives intact. */
#ifndef ORB_TESTS_HELPERLIB_FAKE_DATA_H
#define ORB_TESTS_HELPERLIB_FAKE_DATA_H

#include <stdio.h>
#include <string.h>

#include "common/helper_proto.h"
#include "topo/inventory.h"

#define FAKE_NIC_OK "mlx5_0"        /* OPEN_DEVICE answers with an fd */
#define FAKE_NIC_DENIED "mlx5_1"    /* OPEN_DEVICE answers ORB_EPERM */
#define FAKE_SLOT "kvcache"         /* SLOT_ATTACH answers with a read-only fd */
#define FAKE_PEERMEM_FOUND 0x5u     /* nv_mem and nvidia_peermem version files */
#define FAKE_DEVX_KEY_OK 0x1234u    /* DEVX_VERIFY: 0 for this key through ... */
#define FAKE_DEVX_HANDLE_OK 9u      /* ... this object handle, ORB_EPERM for anything else */

static inline void fake_inventory(struct orb_topo_inventory *inv)
{
    memset(inv, 0, sizeof *inv);
    inv->nnics = 2;
    for (uint32_t i = 0; i < 2; i++) {
        struct orb_topo_nic *n = &inv->nics[i];
        n->id = (uint8_t)i;
        n->usable = 1;
        n->nports = 1;
        snprintf(n->name, sizeof n->name, "mlx5_%u", (unsigned)i);
        n->node_guid = 0x0c42a10300000000ull + i;
        snprintf(n->pci, sizeof n->pci, "0000:%02x:00.0", 0x17u + 0x20u * i);
        n->numa_node = (int32_t)i;
        n->path.depth = 2;
        snprintf(n->path.hops[0], sizeof n->path.hops[0], "pci0000:%02x", 0x16u + 0x20u * i);
        _Static_assert(sizeof n->path.hops[1] >= sizeof n->pci, "a PCI address fits a hop");
        memcpy(n->path.hops[1], n->pci, sizeof n->pci);
        struct orb_topo_port *p = &n->ports[0];
        p->num = 1;
        p->state = ORB_PORT_ACTIVE;
        p->link_layer = ORB_LINK_ETHERNET;
        p->rate_mbps = 200000;
        p->ngids = 1;
        p->gids[0].raw[0] = 0xfe;
        p->gids[0].raw[1] = 0x80;
        p->gids[0].raw[15] = (uint8_t)(1 + i);
        p->gids[0].type = ORB_GID_ROCE_V2;
    }
    inv->ngpus = 1;
    inv->gpus[0].ordinal = 0;
    snprintf(inv->gpus[0].pci, sizeof inv->gpus[0].pci, "0000:18:00.0");
    inv->gpus[0].numa_node = 0;
    inv->nnuma = 2;
    for (int32_t i = 0; i < 2; i++) {
        inv->numa[i].id = i;
        inv->numa[i].ndistances = 2;
        inv->numa[i].distance[0] = i == 0 ? 10 : 21;
        inv->numa[i].distance[1] = i == 0 ? 21 : 10;
    }
}

static inline void fake_policy(struct orb_hp_policy *p)
{
    memset(p, 0, sizeof *p);
    p->nic_mask = 0x1;
    p->gpu_mask = 0x1;
    p->transports = ORB_HP_T_TCP | ORB_HP_T_RDMA;
    p->gpudirect_routes = ORB_HP_R_DMABUF;
    p->max_registered_bytes = 1ull << 40;
    p->max_endpoints = 8;
    p->max_grants = 4096;
    p->nslots = 2;
    snprintf(p->slots[0], sizeof p->slots[0], "%s", FAKE_SLOT);
    snprintf(p->slots[1], sizeof p->slots[1], "weights.v2");
}

#endif
