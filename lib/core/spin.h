/* Internal: the CPU hint for spin-wait loops. */
#ifndef ORB_CORE_SPIN_H
#define ORB_CORE_SPIN_H

/* Tell the CPU this is a spin-wait: it saves power and yields the core's pipeline to a sibling
 * hardware thread, without giving up the time slice the way sched_yield() does. */
static inline void orb_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#else
    __asm__ __volatile__("" ::: "memory");
#endif
}

#endif
