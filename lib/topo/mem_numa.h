/* Internal: the NUMA node that backs a byte of host memory, for locality tiers. */
#ifndef ORB_TOPO_MEM_NUMA_H
#define ORB_TOPO_MEM_NUMA_H

#include <stdint.h>

/* The node of the page holding `addr` (get_mempolicy with MPOL_F_NODE | MPOL_F_ADDR: a page not
 * yet faulted in is placed there on first touch, so ask after the memory is pinned), or
 * ORB_TOPO_NUMA_UNKNOWN (-1) when the kernel does not say (no NUMA support, a seccomp filter,
 * an unmapped address). One system call; thread-safe; sets no error message. */
int32_t orb_mem_numa_node(const void *addr);

#endif
