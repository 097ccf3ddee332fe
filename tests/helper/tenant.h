/* The test build of orbite-helper refuses to run with any capability, and root holds them all:
 * tests that run it as root run it (or themselves) as an ordinary user instead. */
#ifndef ORB_TESTS_HELPER_TENANT_H
#define ORB_TESTS_HELPER_TENANT_H

#include <grp.h>
#include <sys/types.h>
#include <unistd.h>

#define HP_TENANT_ID 65534u /* nobody */

/* The uid the test helper runs as: this process's, or nobody's when this process is root. */
static inline uid_t hp_tenant_uid(void)
{
    return getuid() == 0 ? (uid_t)HP_TENANT_ID : getuid();
}

static inline gid_t hp_tenant_gid(void)
{
    return getuid() == 0 ? (gid_t)HP_TENANT_ID : getgid();
}

/* As root, become the tenant (no groups, no capabilities: setresuid() away from 0 clears
 * them); otherwise nothing. 0 or -1. */
static inline int hp_become_tenant(void)
{
    if (getuid() != 0)
        return 0;
    if (setgroups(0, NULL) != 0 || setresgid(HP_TENANT_ID, HP_TENANT_ID, HP_TENANT_ID) != 0 ||
        setresuid(HP_TENANT_ID, HP_TENANT_ID, HP_TENANT_ID) != 0)
        return -1;
    return getuid() == HP_TENANT_ID && geteuid() == HP_TENANT_ID ? 0 : -1;
}

#endif
