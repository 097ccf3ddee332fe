/* A private test system for root-only tests of the installed orbite-helper, whose paths are fixed
 * (/etc/orbite/policy.d, /sys, /dev/infiniband, /dev/shm): a mount namespace in which /etc and
 * optionally /dev are overlays on a scratch tmpfs, /sys is optionally a fixture tree and /dev/shm
 * is a fresh tmpfs, so that fixture content reaches the helper without any change to the host.
 *
 * Return codes only (no test framework): functions that fail print one line to stderr naming the
 * failing step and strerror(errno), and return -1. None of them is async-signal-safe; call them in
 * a single-threaded process or in the child of a fork from one. */
#ifndef ORB_TESTS_SYSNS_H
#define ORB_TESTS_SYSNS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* Whether this process can build a private test system: it is root, and (probed in a forked
 * child, so the caller's mounts and credentials are unchanged) sysns_enter() with the /dev overlay
 * succeeds and a character device created in the overlaid /dev can be opened. Prints why on
 * stderr when root but the probe fails; silent for non-root callers. */
bool sysns_available(void);

/* The scratch directory (a mkdtemp() directory under /tmp) on which sysns_enter() mounts the
 * tmpfs holding the overlays' upper and work directories. */
struct sysns {
    char scratch[256];   /* "" until prepared */
};

/* Create ns->scratch (mkdtemp "/tmp/orbite-sysns-XXXXXX", mode 0700) in the calling process.
 * Call it before fork() when the parent is to clean up after a child that runs sysns_enter():
 * the child inherits the name, the parent keeps it for sysns_cleanup_host(). Returns 0, or -1
 * (ns->scratch is then ""). */
int sysns_prepare(struct sysns *ns);

/* Enter a private mount namespace in the CALLING process, for good: call it in a forked child or
 * in a test process that exits afterwards. Fails with EINVAL in a multi-threaded process (the
 * kernel refuses unshare(CLONE_NEWNS) when the filesystem context is shared).
 *
 * Steps: sysns_prepare() unless ns->scratch is already set; unshare(CLONE_NEWNS); every mount
 * made private (MS_REC | MS_PRIVATE), so nothing below propagates to the host; a tmpfs on
 * ns->scratch; an overlay on /etc (lower /etc); /etc/orbite/policy.d created in it empty (root,
 * 0755; entries from the host's copy are hidden, not removed); when sysfs_fixture is not NULL,
 * that directory bind-mounted (MS_BIND | MS_REC) over /sys; when with_dev_overlay, an overlay on
 * /dev (lower /dev) so that /dev/infiniband and device nodes can be created in the namespace only
 * (the mounts that were below /dev, /dev/pts and /dev/mqueue among them, are hidden by it); last,
 * a fresh tmpfs (mode 01777, nosuid, nodev) on /dev/shm. The overlays keep their own references
 * to the scratch tmpfs, so it is then detached and the scratch directory removed: on success
 * nothing is left on the host side. sysfs_fixture is only read during the call.
 *
 * Returns 0, or -1 with the calling process in an unspecified, partly built namespace (it should
 * exit); the scratch directory may then remain, for sysns_cleanup_host() from a process that
 * knows its name. */
int sysns_enter(struct sysns *ns, const char *sysfs_fixture, bool with_dev_overlay);

/* From the host side, after the process that entered the namespace has exited: remove the
 * scratch directory if it is still there (sysns_enter() failed or was never reached), then clear
 * ns->scratch. Safe to call on a zeroed struct, on one whose directory is already gone, and
 * twice. */
void sysns_cleanup_host(struct sysns *ns);

/* In the namespace: write /etc/orbite/policy.d/<name> (a plain file name: not empty, no '/', not
 * "." or "..") with the NUL-terminated `text`, replacing any previous file; root-owned, mode
 * 0644. Neither argument is kept. Returns 0 or -1. */
int sysns_write_policy(const char *name, const char *text);

/* Copy the executable `src` to the new file `dst` (an existing dst is unlinked first, so a copy
 * that is running or holds capabilities is not modified in place), root-owned, mode 0755, and
 * give it the file capabilities `caps` in cap_from_text() syntax (e.g.
 * "cap_chown,cap_dac_override=p"); none when caps is NULL or "". The capabilities are set last
 * (a change of owner clears them) and read back. Fails when caps are requested for a file on a
 * nosuid mount, where exec would ignore them. Neither string is kept. Returns 0 or -1 (a partly
 * written dst is removed). */
int sysns_install_copy(const char *src, const char *dst, const char *caps);

/* In a forked child before execve(), as root: become uid/gid (real, effective and saved) with no
 * supplementary groups and no capabilities. Same as sysns_become_groups(uid, gid, 0, NULL). */
int sysns_become(uid_t uid, gid_t gid);

/* As sysns_become(), with the supplementary groups groups[0 .. ngroups - 1] (groups may be NULL
 * when ngroups is 0; not kept). Order: keep-caps off, setgroups, setresgid, setresuid (the switch
 * of every uid from 0 to a non-zero uid clears the permitted, effective and ambient sets), then
 * the inheritable and ambient sets are cleared and the result is checked. uid 0 is refused
 * (EINVAL): a root process keeps its capabilities. The bounding set is left whole, so executing a
 * file with capabilities still grants them. Returns 0 or -1 (the credentials are then
 * unspecified: the child should exit). */
int sysns_become_groups(uid_t uid, gid_t gid, size_t ngroups, const gid_t *groups);

#endif
