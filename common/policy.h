/* The administrator's policy (/etc/orbite/policy.d/*.ini), parsed with inih and decided per
 * tenant. Linked by orbite-helper and tools/orbite-policy. Fails closed: any problem with any
 * file yields a policy that denies everything, with the reason kept for logs and `check`. */
#ifndef ORB_COMMON_POLICY_H
#define ORB_COMMON_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "common/helper_proto.h"
#include "topo/inventory.h"

struct orb_policy;

/* Read every "*.ini" regular file of the directory open at `dirfd` (sorted by name), opened with
 * openat(O_NOFOLLOW) and checked after opening with fstat: regular file, owned by root (uid 0;
 * `expected_owner` lets tests pass their own uid), not group/world writable, one link. No
 * policy files at all is valid and denies RDMA devices (see docs/operations.md).
 * Always returns a policy in *out unless out of memory (ORB_ENOMEM): on any bad file the policy
 * is deny-all and orb_policy_error() says why. Returns 0 for a clean load, ORB_ECONFIG for a
 * deny-all caused by a bad file. `origin` names the directory in messages. */
int orb_policy_load_dir(int dirfd, const char *origin, uint32_t expected_owner, struct orb_policy **out);

/* Parse one INI text (no file checks): for tests, fuzzing and `orbite-policy check`. */
int orb_policy_load_string(const char *text, const char *origin, struct orb_policy **out);

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

/* One decided item and the line that decided it, for `orbite-policy explain`. */
struct orb_policy_reason {
    char item[96];        /* e.g. "nic mlx5_0", "transport rdma", "max_grants" */
    char verdict[96];     /* e.g. "allowed", "denied", "64" */
    char source[160];     /* "file.ini:12 [group:gpu]" or "default: deny" */
};

/* Decide what `who` may use on `inv`. `reasons` (may be NULL) receives up to `cap` entries and
 * *nreasons the count written. Errors: ORB_EINVAL. */
int orb_policy_decide(const struct orb_policy *p, const struct orb_policy_subject *who,
                      const struct orb_topo_inventory *inv, struct orb_hp_policy *out,
                      struct orb_policy_reason *reasons, size_t cap, size_t *nreasons);

#endif
