/* Internal: how many CPUs this process may run on. */
#ifndef ORB_CORE_CPUS_H
#define ORB_CORE_CPUS_H

/* CPUs in this process's affinity mask (what a cpuset or taskset leaves it), else the online
 * CPUs; at least 1. Asked anew on each call: the mask can change while the process runs. */
unsigned orb_usable_cpus(void);

#endif
