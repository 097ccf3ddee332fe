/* Thread names: every thread the library starts says what it is ("orb-rdma-lane0", ...), so
 * that an operator looking at a process's threads can tell the library's from the
 * application's and see which one takes the CPU. */
#include "thread_name.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>

void orb_thread_name(const char *what, ...)
{
    char name[16] = "orb-"; /* the kernel keeps 15 characters and the NUL */
    va_list ap;
    va_start(ap, what);
    (void)vsnprintf(name + 4, sizeof name - 4, what, ap); /* cut to fit, on purpose */
    va_end(ap);
    (void)pthread_setname_np(pthread_self(), name);
}
