/* Fixture trees and a protocol client for the orbite-helper tests. */
#ifndef ORB_TESTS_HELPER_TEST_UTIL_H
#define ORB_TESTS_HELPER_TEST_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/helper_proto.h"

/* ---- fixture trees -------------------------------------------------------------------------- */

/* A scratch directory tree for one test: sysfs (a copy of a tests/data/sysfs fixture plus the
 * class/infiniband_verbs entries the fixtures lack), policy, dev (fake /dev/infiniband) and shm. */
struct hp_fixture {
    char root[256];
    char sysfs[300];
    char policy[300];
    char dev[300];
    char shm[300];
};

/* Build the tree from tests/data/sysfs/<fixture> (FIXTURE_DIR) with uverbs0 -> mlx5_0 and
 * uverbs1 -> mlx5_1 whose sysfs device numbers are 1:3 and 1:5. Returns 0 or -1. */
int hp_fixture_create(struct hp_fixture *f, const char *fixture);
/* Remove the whole tree. */
void hp_fixture_destroy(struct hp_fixture *f);

/* Make NIC `nic` of the fixture driven by mlx5_core (its device/driver link). 0 or -1. */
int hp_fixture_mark_mlx5(struct hp_fixture *f, const char *nic);

/* Write `text` to dir/name with `mode` (exactly, regardless of umask). 0 or -1. */
int hp_write_file(const char *dir, const char *name, const char *text, mode_t mode);
/* As root, chown `path` to the tenant the test helper runs as (tenant.h): what policy files and
 * their directory need when the tenant is also the test's administrator. 0 or -1. */
int hp_give_to_tenant(const char *path);
/* mkdir -p of dir/rel. 0 or -1. */
int hp_mkdirs(const char *dir, const char *rel, mode_t mode);
/* Recursive removal (no symlink following). */
void hp_remove_tree(const char *path);

/* ---- a helper process and its socket ---------------------------------------------------------- */

struct hp_proc {
    pid_t pid;
    int sock;
    uint32_t seq;
};

struct hp_spawn_opts {
    const char *const *argv;   /* argv[0] is the program; NULL-terminated */
    const char *const *envp;   /* NULL: a small environment with a marker variable */
    bool fd3_not_socket;       /* give the child /dev/null as fd 3 */
    bool leak_fd;              /* leave an extra non-CLOEXEC descriptor (fd 9) open across exec */
    bool keep_ids;             /* run as this process (default: as the tenant, tenant.h) */
    unsigned long nofile;      /* RLIMIT_NOFILE (soft and hard) for the child; 0: inherited */
};

/* fork + exec with one end of socketpair(SOCK_SEQPACKET) as fd 3. 0 or -1. */
int hp_spawn(struct hp_proc *p, const struct hp_spawn_opts *opts);

/* Wait for the child (up to timeout_ms, then SIGKILL) and return its wait status, -1 on error. */
int hp_wait(struct hp_proc *p, int timeout_ms);

/* Close our end of the socket (the helper sees EOF). */
void hp_close(struct hp_proc *p);

/* Send one datagram (optionally with fds) and receive the reply (up to 1 fd). Returns 0 or the
 * orb_hp_recv/orb_hp_send status. */
int hp_call(struct hp_proc *p, const uint8_t *req, size_t req_len, const int *send_fds, size_t nsend,
            struct orb_hp_msg *reply, uint8_t reply_buf[ORB_HP_MAX_MSG], int *fd_out);

/* Request builders: the next sequence number is taken from p. */
int hp_hello(struct hp_proc *p);                   /* HELLO + check the reply; 0 or -1 */
size_t hp_raw_header(uint8_t *buf, uint16_t type, uint32_t length, uint32_t seq); /* 16 bytes */

/* The self-report of orbite-helper-test. */
struct hp_self_report {
    uint32_t environ_bytes;
    uint32_t nfds;
    int fds[64];
    char status[ORB_HP_MAX_MSG];
};
int hp_self_report(struct hp_proc *p, struct hp_self_report *out);

/* A field of a /proc/PID/status text ("CapEff:"), parsed as hex (base 16) or decimal (base 10). */
bool hp_status_field(const char *status, const char *key, int base, uint64_t *out);

/* A child of `parent` (a helper worker's monitor), found through /proc/PID/status and looked for
 * again every 5 ms for up to `timeout_ms`; -1 when there is none by then. */
pid_t hp_child_of(pid_t parent, int timeout_ms);

#endif
