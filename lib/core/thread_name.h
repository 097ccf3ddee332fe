/* Internal: names for the library's threads, as `top -H`, `ps -L` and debuggers show them. */
#ifndef ORB_CORE_THREAD_NAME_H
#define ORB_CORE_THREAD_NAME_H

/* Name the calling thread "orb-" followed by `what` (printf-style), cut to the kernel's 15
 * characters. Best effort: a name that cannot be set leaves the inherited one. */
void orb_thread_name(const char *what, ...) __attribute__((format(printf, 1, 2)));

#endif
