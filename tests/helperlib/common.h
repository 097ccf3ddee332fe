/* Small helpers shared by the helper-client tests: descriptor counts, children, temp dirs. */
#ifndef ORB_TESTS_HELPERLIB_COMMON_H
#define ORB_TESTS_HELPERLIB_COMMON_H

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Open descriptors of this process (the listing's own descriptor excluded). */
static inline int count_open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.' && atoi(e->d_name) != dirfd(d))
            n++;
    closedir(d);
    return n;
}

/* 1 when this process has no child left, reaped or not. */
static inline int no_children_left(void)
{
    return waitpid(-1, NULL, WNOHANG) == -1 && errno == ECHILD;
}

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static inline int file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Write `text` to `path` with `mode`. Returns 0 on success. */
static inline int write_file(const char *path, const char *text, mode_t mode)
{
    FILE *f = fopen(path, "we");
    if (f == NULL)
        return -1;
    int rc = fputs(text, f) < 0 ? -1 : 0;
    if (fclose(f) != 0)
        rc = -1;
    return rc == 0 ? chmod(path, mode) : rc;
}

/* A script that records that it ran by creating `marker`, then exits without a word. */
static inline int write_marker_script(const char *script, const char *marker)
{
    char text[1024];
    snprintf(text, sizeof text, "#!/bin/sh\necho spawned > '%s'\n", marker);
    return write_file(script, text, 0755);
}

#endif
