/* Internal: host inventory discovery from a sysfs tree given as a directory fd.
 *
 * Only paths relative to that fd are opened (openat, readlinkat, fdopendir), so the same code
 * reads the real /sys and the fixture trees of the tests. Every attribute is read into a fixed
 * buffer; a file larger than its buffer, a name outside [A-Za-z0-9_.-]{1,63}, a number that does
 * not parse strictly, a symlink loop or a non-regular file fails closed.
 *
 * What is read:
 *  - class/infiniband/<nic>: node_guid; the device link (PCI bus id), device/numa_node; the class
 *    symlink target (PCI path from the root complex down to the function); ports/<n>/state,
 *    link_layer, rate; ports/<n>/gids/<k> with gid_attrs/types/<k> (all-zero entries skipped).
 *  - bus/pci/devices/<bdf>: vendor, class, numa_node and the symlink target of NVIDIA display
 *    and 3D controllers (class 0x0300xx or 0x0302xx), ordered by PCI bus id as CUDA numbers them
 *    with CUDA_DEVICE_ORDER=PCI_BUS_ID.
 *  - devices/system/node/node<N>/distance.
 *
 * Results and their failure rules:
 *  - NICs take stable ids 0..63 in natural name order (mlx5_2 before mlx5_10); names beyond the
 *    64th are ignored with a warning. A NIC whose attributes fail to read or parse keeps its slot
 *    with usable = 0 (only id, name when valid and numa_node = unknown are kept), so that it never
 *    renumbers the others. A missing device link or numa_node leaves the PCI address, path and
 *    NUMA node unknown; a missing link_layer or rate leaves them unknown (0); a GID whose type
 *    cannot be read is skipped; at most ORB_TOPO_MAX_PORTS ports (lowest numbers) and
 *    ORB_TOPO_MAX_GIDS valid GIDs per port (lowest indexes) are kept.
 *  - GPUs: when any PCI device's vendor or class cannot be read strictly, the GPU list is
 *    dropped (ngpus = 0, with a warning) rather than giving any GPU a wrong ordinal. A GPU's
 *    unreadable numa_node or path is unknown.
 *  - NUMA: numa[] is sorted by node id and numa[i].distance[j] is the distance from numa[i] to
 *    numa[j] (the kernel prints a row in that order). A row that is missing, malformed or whose
 *    length differs from the node count has ndistances = 0 (unknown). No node directory: nnuma = 0.
 */
#ifndef ORB_TOPO_SYSFS_H
#define ORB_TOPO_SYSFS_H

#include <stdbool.h>
#include <stddef.h>

#include "topo/cpuset.h"
#include "topo/inventory.h"

/* Fill `*out` from the sysfs tree rooted at `sysfs_dirfd` (not closed; read only). `*out` is
 * written only on success. Errors: ORB_EINVAL (NULL, or the fd is not a directory),
 * ORB_EUNAVAILABLE (class/infiniband exists but cannot be listed), ORB_ENOMEM. A tree without
 * class/infiniband gives an inventory without NICs. Thread-safe; allocates scratch memory. */
int orb_topo_load_sysfs(int sysfs_dirfd, struct orb_topo_inventory *out);

/* Whether `name` is a valid device name: [A-Za-z0-9_.-]{1,63} ("." and ".." excluded). */
bool orb_topo_name_valid(const char *name);

/* Describe which provider drives NIC `nic` for messages, into `buf` (NUL-terminated): "kernel
 * driver NAME" from class/infiniband/<nic>/device/driver (mlx5_core, irdma, ...), or "rxe
 * (soft-RoCE over NETDEV)" for a device without a parent device that has rdma_rxe's `parent`
 * attribute. Errors (`buf` then unspecified): ORB_EINVAL (NULL, empty buffer, invalid name),
 * ORB_ENOENT (sysfs names neither, or the text does not fit). Reads only. */
int orb_topo_nic_provider(int sysfs_dirfd, const char *nic, char *buf, size_t len);

/* Whether NIC `nic` is a soft-RoCE (rdma_rxe) device, by the same sysfs facts
 * orb_topo_nic_provider() names it by. false also for an invalid name or unreadable sysfs. */
bool orb_topo_nic_is_rxe(int sysfs_dirfd, const char *nic);

/* The CPUs of NUMA node `node` (devices/system/node/node<N>/cpulist) into *out, written only on
 * success. Errors: ORB_EINVAL (NULL, negative node), ORB_ENOENT (no such file, or unreadable),
 * ORB_ECONFIG (not a cpulist). */
int orb_topo_node_cpus(int sysfs_dirfd, int32_t node, struct orb_cpuset *out);

#endif
