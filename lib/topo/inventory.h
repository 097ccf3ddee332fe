/* Internal: the host inventory model (NICs, ports, GIDs, GPUs, NUMA nodes) shared by discovery,
 * matrices, selection and the helper. Plain data with fixed maxima: no pointers, so it can be
 * copied, compared and sent over the helper socket field by field. */
#ifndef ORB_TOPO_INVENTORY_H
#define ORB_TOPO_INVENTORY_H

#include <stdint.h>

#define ORB_TOPO_MAX_NICS 64        /* stable NIC ids are 0..63 (device_mask is 64 bits) */
#define ORB_TOPO_MAX_PORTS 4        /* ports per NIC */
#define ORB_TOPO_MAX_GIDS 16        /* GID table entries kept per port */
#define ORB_TOPO_MAX_GPUS 64
#define ORB_TOPO_MAX_NUMA 64
#define ORB_TOPO_NAME_MAX 64        /* device names: [A-Za-z0-9_.-]{1,63} + NUL */
#define ORB_TOPO_PCI_MAX 16         /* "dddd:bb:dd.f" + NUL */
#define ORB_TOPO_PCI_DEPTH 16       /* bridges kept from the root complex to the device */
#define ORB_TOPO_NUMA_UNKNOWN (-1)

enum orb_port_state {               /* the verbs encoding (IBV_PORT_*) */
    ORB_PORT_NOP = 0, ORB_PORT_DOWN = 1, ORB_PORT_INIT = 2, ORB_PORT_ARMED = 3,
    ORB_PORT_ACTIVE = 4, ORB_PORT_ACTIVE_DEFER = 5
};

enum orb_link_layer { ORB_LINK_UNKNOWN = 0, ORB_LINK_INFINIBAND = 1, ORB_LINK_ETHERNET = 2 };

enum orb_gid_type { ORB_GID_IB = 0, ORB_GID_ROCE_V1 = 1, ORB_GID_ROCE_V2 = 2 };

struct orb_topo_gid {
    uint8_t raw[16];
    uint16_t index;                 /* index in the port's GID table */
    uint8_t type;                   /* enum orb_gid_type */
    uint8_t is_ipv4;                /* ::ffff:a.b.c.d mapped address */
};

struct orb_topo_port {
    uint8_t num;                    /* 1-based port number */
    uint8_t state;                  /* enum orb_port_state */
    uint8_t link_layer;             /* enum orb_link_layer */
    uint8_t ngids;
    uint32_t rate_mbps;             /* effective rate; 0 when unknown */
    struct orb_topo_gid gids[ORB_TOPO_MAX_GIDS]; /* valid (non-zero) entries only */
};

/* A PCI location: the chain of bus ids from the root complex down to the device itself, so that
 * two devices' nearest common bridge can be computed. depth 0 means unknown. */
struct orb_pci_path {
    uint8_t depth;
    char hops[ORB_TOPO_PCI_DEPTH][ORB_TOPO_PCI_MAX]; /* hops[0] = "pci0000:00"-style root */
};

struct orb_topo_nic {
    uint8_t id;                     /* stable slot id; a failed slot never renumbers others */
    uint8_t usable;                 /* 0: slot kept but the device failed discovery */
    uint8_t nports;
    char name[ORB_TOPO_NAME_MAX];
    uint64_t node_guid;
    char pci[ORB_TOPO_PCI_MAX];     /* bus id; "" when unknown */
    int32_t numa_node;              /* ORB_TOPO_NUMA_UNKNOWN when sysfs has none */
    struct orb_pci_path path;
    struct orb_topo_port ports[ORB_TOPO_MAX_PORTS];
};

struct orb_topo_gpu {
    uint32_t ordinal;               /* CUDA ordinal (PCI bus id order) */
    char pci[ORB_TOPO_PCI_MAX];
    int32_t numa_node;
    struct orb_pci_path path;
};

struct orb_topo_numa {
    int32_t id;
    uint8_t ndistances;             /* 0 when sysfs has no distance row */
    uint8_t distance[ORB_TOPO_MAX_NUMA];
};

struct orb_topo_inventory {
    uint32_t nnics;
    struct orb_topo_nic nics[ORB_TOPO_MAX_NICS];
    uint32_t ngpus;
    struct orb_topo_gpu gpus[ORB_TOPO_MAX_GPUS];
    uint32_t nnuma;
    struct orb_topo_numa numa[ORB_TOPO_MAX_NUMA];
};

#endif
