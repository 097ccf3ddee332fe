/* The NUMA node behind host memory (see mem_numa.h). */
#include "topo/mem_numa.h"

#include <sys/syscall.h>
#include <unistd.h>

#include "topo/inventory.h"

/* <numaif.h> belongs to libnuma, which the library does not need: the two flags, from the
 * kernel's uapi (include/uapi/linux/mempolicy.h). */
#define MEM_NUMA_F_NODE (1 << 0)
#define MEM_NUMA_F_ADDR (1 << 1)

int32_t orb_mem_numa_node(const void *addr)
{
#ifdef SYS_get_mempolicy
    int node = -1;
    if (addr != NULL && syscall(SYS_get_mempolicy, &node, NULL, 0UL, addr, MEM_NUMA_F_NODE | MEM_NUMA_F_ADDR) == 0 &&
        node >= 0)
        return (int32_t)node;
#else
    (void)addr;
#endif
    return ORB_TOPO_NUMA_UNKNOWN;
}
