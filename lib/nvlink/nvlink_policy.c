/* Whether the administrator's policy gives this tenant the NVLink transport. orbite-helper
 * holds the policy; it is asked once per engine, the first time the transport is really used
 * (a segment's first device request, or a peer's first BEGIN or QUERY), so that an engine that
 * never moves device memory never starts the helper. */
#include <stdio.h>

#include "core/engine.h"
#include "core/error.h"
#include "core/log.h"
#include "helper/helper_client.h"
#include "nvlink/nvlink_internal.h"

#define POLICY_TIMEOUT_NS (2000ull * 1000000ull)

/* Ask the helper (policy_lock held). */
static void decide_locked(struct nvl_tp *tp)
{
    enum orb_helper_mode mode = orb_engine_cfg(tp->engine)->helper_mode;
    struct orb_helper *h = NULL;
    int rc = orb_helper_open(mode, POLICY_TIMEOUT_NS, &h);
    if (rc != 0) {
        if (orb_helper_failure_tolerated(mode, rc)) {
            /* No helper, or switched off: no administrator's policy applies here. */
            tp->policy_state = 1;
            return;
        }
        tp->policy_state = -1;
        snprintf(tp->policy_why, sizeof tp->policy_why, "nvlink: the helper is required and failed: %.120s",
                 orb_last_error());
        return;
    }
    struct orb_hp_policy p;
    rc = orb_helper_policy(h, &p);
    orb_helper_close(h);
    if (rc != 0) {
        tp->policy_state = -1;
        snprintf(tp->policy_why, sizeof tp->policy_why, "nvlink: the helper's policy could not be read: %.120s",
                 orb_last_error());
    } else if ((p.transports & ORB_HP_T_NVLINK) == 0) {
        tp->policy_state = -1;
        snprintf(tp->policy_why, sizeof tp->policy_why,
                 "nvlink: the administrator's policy does not give this tenant NVLink");
    } else
        tp->policy_state = 1;
    if (tp->policy_state < 0)
        ORB_LOGI("%s: the transport refuses every request", tp->policy_why);
}

int nvl_policy_check(struct nvl_tp *tp)
{
    pthread_mutex_lock(&tp->policy_lock);
    if (tp->policy_state == 0)
        decide_locked(tp);
    int rc = tp->policy_state > 0 ? 0 : orb_fail(ORB_EUNAVAILABLE, "%s", tp->policy_why);
    pthread_mutex_unlock(&tp->policy_lock);
    return rc;
}
