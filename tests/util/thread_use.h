/* Test support: what this process's threads of one name have used so far, read from
 * /proc/self/task (the library names its threads "orb-..."). Header only. */
#ifndef ORB_TESTS_UTIL_THREAD_USE_H
#define ORB_TESTS_UTIL_THREAD_USE_H

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

struct thread_use {
    unsigned threads;           /* how many threads carry the name (a prefix of it) */
    unsigned long long ticks;   /* their CPU time (user and system), in clock ticks */
    unsigned long long sleeps;  /* their voluntary context switches: each wait that ended */
};

/* The threads whose name starts with `prefix`. A thread that ends while it is read is left out. */
static inline struct thread_use thread_use_of(const char *prefix)
{
    struct thread_use u = {0, 0, 0};
    DIR *d = opendir("/proc/self/task");
    if (d == NULL)
        return u;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char path[320], buf[2048] = "";
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (f == NULL)
            continue;
        int match = fgets(buf, sizeof buf, f) != NULL && strncmp(buf, prefix, strlen(prefix)) == 0;
        fclose(f);
        if (!match)
            continue;
        u.threads++;
        snprintf(path, sizeof path, "/proc/self/task/%s/stat", e->d_name);
        if ((f = fopen(path, "r")) != NULL) {
            size_t n = fread(buf, 1, sizeof buf - 1, f);
            fclose(f);
            buf[n] = '\0';
            /* After the name's closing parenthesis: the state, then fields 4..; utime and
             * stime are fields 14 and 15. */
            const char *at = strrchr(buf, ')');
            unsigned long long ut = 0, st = 0;
            if (at != NULL && sscanf(at + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) == 2)
                u.ticks += ut + st;
        }
        snprintf(path, sizeof path, "/proc/self/task/%s/status", e->d_name);
        if ((f = fopen(path, "r")) != NULL) {
            while (fgets(buf, sizeof buf, f) != NULL) {
                unsigned long long v;
                if (sscanf(buf, "voluntary_ctxt_switches: %llu", &v) == 1)
                    u.sleeps += v;
            }
            fclose(f);
        }
    }
    closedir(d);
    return u;
}

/* `ticks` of CPU time (thread_use.ticks, or a difference of two) in milliseconds. */
static inline unsigned long long thread_use_ms(unsigned long long ticks)
{
    long hz = sysconf(_SC_CLK_TCK);
    return ticks * 1000ull / (unsigned long long)(hz > 0 ? hz : 100);
}

#endif
