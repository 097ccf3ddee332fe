/* An engine's counters: striped relaxed atomics, summed by a snapshot. */
#include "core/metrics.h"

#include <string.h>

#include "core/clock.h"

/* Upper bounds of the batch latency buckets, in microseconds. */
static const uint64_t bound_us[ORB_METRICS_LATENCY_BUCKETS] = {
    10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 500000,
    1000000, 2500000, 5000000, 10000000, UINT64_MAX,
};

/* This thread's stripe: threads take them in turn, the first time they count anything. */
static atomic_uint next_stripe;
static _Thread_local unsigned my_stripe = UINT32_MAX;

static struct orb_metrics_stripe *stripe_of(struct orb_metrics_counters *m)
{
    if (my_stripe == UINT32_MAX)
        my_stripe = atomic_fetch_add_explicit(&next_stripe, 1, memory_order_relaxed) % ORB_METRICS_STRIPES;
    return &m->stripe[my_stripe];
}

static void add(atomic_uint_fast64_t *c, uint64_t v)
{
    atomic_fetch_add_explicit(c, v, memory_order_relaxed);
}

static uint64_t get(const atomic_uint_fast64_t *c)
{
    return atomic_load_explicit((atomic_uint_fast64_t *)c, memory_order_relaxed);
}

void orb_metrics_init(struct orb_metrics_counters *m)
{
    memset(m, 0, sizeof *m); /* all-zero atomics are valid zero counters here (C11 lock-free) */
    m->created_ns = orb_now_ns();
}

void orb_metrics_requested(struct orb_metrics_counters *m, unsigned tp, unsigned op, uint64_t bytes, int status)
{
    if (m == NULL || tp >= ORB_METRICS_TRANSPORTS || op > 1)
        return;
    struct orb_metrics_stripe *s = stripe_of(m);
    if (status == 0) {
        add(&s->requested[tp][op][0], 1);
        add(&s->requested[tp][op][1], bytes);
    } else if (status > 0) {
        add(&s->withdrawn, 1);
    } else {
        add(&s->requested[tp][op][2], 1);
        if ((unsigned)-status < ORB_METRICS_STATUSES)
            add(&s->failures[-status], 1);
    }
}

void orb_metrics_served(struct orb_metrics_counters *m, unsigned tp, unsigned op, uint64_t bytes, int ends, int status)
{
    if (m == NULL || tp >= ORB_METRICS_TRANSPORTS || op > 1)
        return;
    struct orb_metrics_stripe *s = stripe_of(m);
    if (status == 0) {
        if (ends)
            add(&s->served[tp][op][0], 1);
        add(&s->served[tp][op][1], bytes);
    } else {
        add(&s->served[tp][op][2], 1);
    }
}

void orb_metrics_batch(struct orb_metrics_counters *m, uint64_t ns)
{
    if (m == NULL)
        return;
    uint64_t us = ns / 1000u;
    unsigned i = 0;
    while (us > bound_us[i])
        i++; /* the last bound is UINT64_MAX */
    struct orb_metrics_stripe *s = stripe_of(m);
    add(&s->latency[i], 1);
    add(&s->latency_sum_ns, ns);
}

void orb_metrics_notification(struct orb_metrics_counters *m)
{
    if (m != NULL)
        add(&stripe_of(m)->notifications_received, 1);
}

void orb_metrics_sum(const struct orb_metrics_counters *m, struct orb_metrics *out)
{
    uint64_t now = orb_now_ns();
    out->uptime_ns = now > m->created_ns ? now - m->created_ns : 0;
    memcpy(out->latency_bound_us, bound_us, sizeof bound_us);
    for (unsigned k = 0; k < ORB_METRICS_STRIPES; k++) {
        const struct orb_metrics_stripe *s = &m->stripe[k];
        for (unsigned t = 0; t < ORB_METRICS_TRANSPORTS; t++) {
            for (unsigned op = 0; op < 2; op++) {
                out->requested[t][op].requests += get(&s->requested[t][op][0]);
                out->requested[t][op].bytes += get(&s->requested[t][op][1]);
                out->requested[t][op].failed += get(&s->requested[t][op][2]);
                out->served[t][op].requests += get(&s->served[t][op][0]);
                out->served[t][op].bytes += get(&s->served[t][op][1]);
                out->served[t][op].failed += get(&s->served[t][op][2]);
            }
        }
        out->withdrawn_requests += get(&s->withdrawn);
        for (unsigned i = 1; i < ORB_METRICS_STATUSES; i++)
            out->failures[i] += get(&s->failures[i]);
        for (unsigned i = 0; i < ORB_METRICS_LATENCY_BUCKETS; i++) {
            uint64_t n = get(&s->latency[i]);
            out->latency_buckets[i] += n;
            out->batches += n;
        }
        out->latency_sum_ns += get(&s->latency_sum_ns);
        out->notifications_received += get(&s->notifications_received);
    }
}
