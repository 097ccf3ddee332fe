/* CPUs this process may run on: the sizing input of thread and connection counts. */
#include "cpus.h"

#include <sched.h>
#include <unistd.h>

unsigned orb_usable_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return (unsigned)CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (unsigned)n : 1;
}
