/* The administrator's policy (the "*.ini" files of /etc/orbite/policy.d), parsed with inih
 * and decided per tenant. Linked by orbite-helper and tools/orbite-policy. Fails closed: any
 * problem with any file yields a policy that denies everything, with the reason kept for logs
 * and `check`. */
#ifndef ORB_COMMON_POLICY_H
#define ORB_COMMON_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "common/helper_proto.h"
#include "topo/inventory.h"

struct orb_policy;

/* Read every "*.ini" file of the directory open at `dirfd` (not closed; names starting with
 * '.' skipped; bytewise name order). The directory must be owned by `expected_owner` (root, 0;
 * tests pass their own uid) and not group/world writable. Each file is opened with
 * openat(O_NOFOLLOW | O_NONBLOCK) and checked after opening with fstat: regular file, owned by
 * `expected_owner`, not group/world writable, one link, at most 64 KiB; its name must be
 * [A-Za-z0-9_.@+-]{1,128}. No policy files at all is valid and gives the built-in defaults,
 * which deny RDMA devices (see docs/policy.md).
 * Always returns a policy in *out unless out of memory (ORB_ENOMEM) or EINVAL (dirfd < 0, out
 * NULL): on any problem the policy is deny-all and orb_policy_error() says why. Returns 0 for a
 * clean load, ORB_ECONFIG for a deny-all. `origin` names the directory in messages. */
int orb_policy_load_dir(int dirfd, const char *origin, uint32_t expected_owner, struct orb_policy **out);

/* Parse one INI text (no file checks): for tests, fuzzing and `orbite-policy check`. The empty
 * text gives the built-in defaults (what a missing policy directory means). */
int orb_policy_load_string(const char *text, const char *origin, struct orb_policy **out);

/* A policy that denies everything because of `reason` about `origin` (for example a policy
 * directory that cannot be opened): orb_policy_error() is "origin: reason". Returns ORB_ECONFIG
 * with *out set, or ORB_EINVAL, ORB_ENOMEM (nothing written). */
int orb_policy_deny_all(const char *origin, const char *reason, struct orb_policy **out);

/* `orbite-policy check`: called once per "*.ini" file in load order with error NULL (the file
 * is good) or the first problem ("file:line: reason"); once with file = origin for a problem
 * with the directory itself. */
typedef void (*orb_policy_report_fn)(void *ctx, const char *file, const char *error);

/* Check the directory like orb_policy_load_dir, but go on after a bad file so that every file
 * is reported. Returns 0 when the whole policy is clean, ORB_ECONFIG when anything is wrong,
 * ORB_EINVAL, ORB_ENOMEM. */
int orb_policy_check_dir(int dirfd, const char *origin, uint32_t expected_owner, orb_policy_report_fn report,
                         void *ctx);

/* How many policy files were read (for messages). */
size_t orb_policy_file_count(const struct orb_policy *p);

/* NULL for a clean policy, else why everything is denied ("file:line: reason"). */
const char *orb_policy_error(const struct orb_policy *p);

void orb_policy_free(struct orb_policy *p);

/* The tenant, as the helper sees itself: real uid/gids and their names (names may be NULL when
 * the account database has none). */
struct orb_policy_subject {
    uint32_t uid;
    const char *user;
    uint32_t ngroups;
    const uint32_t *gids;
    const char *const *group_names;
};

/* One decided item and the line that decided it, for `orbite-policy explain`. A decision
 * has at most ORB_POLICY_MAX_REASONS items. */
#define ORB_POLICY_MAX_REASONS 160

struct orb_policy_reason {
    char item[96];        /* e.g. "nic mlx5_0", "transport rdma", "max_grants" */
    char verdict[96];     /* e.g. "allowed", "denied", "64" */
    char source[160];     /* "file.ini:12 [group:gpu] matches mlx5_*", "built-in default",
                             "policy error at file.ini:3", ... (docs/policy.md) */
};

/* Decide what `who` may use on `inv`: NIC bits by inventory id, GPU bits by ordinal, only for
 * devices `inv` has. `reasons` (may be NULL) receives up to `cap` entries (every byte written)
 * and *nreasons the count written: transports, gpudirect routes, NICs and GPUs in inventory
 * order, slots, then budgets. Pure and thread-safe: a loaded policy is read-only.
 * Errors: ORB_EINVAL. */
int orb_policy_decide(const struct orb_policy *p, const struct orb_policy_subject *who,
                      const struct orb_topo_inventory *inv, struct orb_hp_policy *out,
                      struct orb_policy_reason *reasons, size_t cap, size_t *nreasons);

#endif
