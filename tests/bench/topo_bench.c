/* Device selection micro-benchmark: nanoseconds per slice to choose a NIC, charge it and return
 * the charge (orb_selector_select + orb_lease_consume), for one-slice and multi-slice parents
 * over 2, 8 and 16 NICs, with one thread and with two threads contending for one selector. It
 * also counts heap calls and wrapped system-call entry points (clock_gettime, gettimeofday,
 * syscall, sched_yield, nanosleep) made by the program's own code during the timed loops, and
 * reads of the selector's injected clock: all must be zero.
 *
 *   topo_bench [--iterations N] [--repeat R] [--nics N] [--slices N] [--threads N]
 *
 * --iterations: slices per thread per cell (default 2000000); --repeat: runs per cell (default
 * 5), reported as the best and the median ns/slice, since on a shared machine other processes
 * only ever add time; --nics (2, 8, 16), --slices (slices per parent: 1, 8, 64) and --threads
 * (1, 2) run only the matching cells. ns/slice is wall time over the slices one thread did, so
 * with two threads it is what each contending thread sees.
 *
 * Exits 1 when any timed loop allocated, made a counted call or read the clock; 2 on a usage
 * error. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <orbite/orbite.h>

#include "call_counter.h"
#include "topo/selector.h"
#include "topo/slicing.h"

struct cell {
    uint32_t nics;
    uint32_t slices_per_parent;
    uint32_t threads;
};

struct worker {
    struct orb_selector *sel;
    const uint8_t *tier;
    uint32_t slices_per_parent;
    uint64_t parents;
    pthread_barrier_t *start;
    int failed;
};

static uint64_t bench_clock_reads;

static uint64_t counting_clock(void *ctx)
{
    (void)ctx;
    __atomic_fetch_add(&bench_clock_reads, 1, __ATOMIC_RELAXED);
    return 0;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void *run_worker(void *arg)
{
    struct worker *w = arg;
    struct orb_slice slices[ORB_SLICE_MAX];
    for (uint32_t s = 0; s < w->slices_per_parent; s++)
        slices[s] = (struct orb_slice){(uint64_t)s * ORB_SLICE_BASE_BLOCK, ORB_SLICE_BASE_BLOCK};
    struct orb_lease lease;
    pthread_barrier_wait(w->start);
    for (uint64_t p = 0; p < w->parents; p++) {
        if (orb_selector_select(w->sel, w->tier, ~0ull, slices, w->slices_per_parent, &lease) !=
            0) {
            w->failed = 1;
            break;
        }
        for (uint32_t s = 0; s < w->slices_per_parent; s++)
            orb_lease_consume(&lease, s);
    }
    return NULL;
}

/* Runs one cell; returns 0, or -1 when it could not run. */
static int run_cell(const struct cell *c, uint64_t slices_per_thread, double *ns_per_slice,
                    double *mslices_per_s, uint64_t *heap_calls, uint64_t *system_calls)
{
    struct orb_selector_config cfg;
    orb_selector_config_default(&cfg);
    struct orb_clock clock = {counting_clock, NULL};
    struct orb_selector *sel = NULL;
    if (orb_selector_create(&cfg, c->nics, NULL, &clock, &sel) != 0)
        return -1;
    /* Mixed locality: NICs cycle through the three tiers, all eligible. */
    uint8_t tier[ORB_TOPO_MAX_NICS];
    for (uint32_t i = 0; i < ORB_TOPO_MAX_NICS; i++)
        tier[i] = (uint8_t)(i % ORB_SELECT_TIERS);

    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, c->threads + 1);
    struct worker workers[2];
    pthread_t threads[2];
    uint64_t parents = slices_per_thread / c->slices_per_parent;
    if (parents == 0)
        parents = 1;
    for (uint32_t t = 0; t < c->threads; t++) {
        workers[t] = (struct worker){sel, tier, c->slices_per_parent, parents, &start, 0};
        if (pthread_create(&threads[t], NULL, run_worker, &workers[t]) != 0) {
            fprintf(stderr, "topo_bench: pthread_create failed\n");
            exit(1);
        }
    }
    uint64_t heap_before = orb_test_heap_calls();
    uint64_t t0 = now_ns();
    uint64_t sys_before = orb_test_system_calls(); /* after our own clock read */
    pthread_barrier_wait(&start);
    for (uint32_t t = 0; t < c->threads; t++)
        pthread_join(threads[t], NULL);
    *system_calls = orb_test_system_calls() - sys_before;
    uint64_t t1 = now_ns();
    *heap_calls = orb_test_heap_calls() - heap_before;
    pthread_barrier_destroy(&start);

    int failed = 0;
    for (uint32_t t = 0; t < c->threads; t++)
        failed |= workers[t].failed;
    orb_selector_free(sel);
    if (failed)
        return -1;
    double elapsed = (double)(t1 - t0);
    double per_thread = (double)(parents * c->slices_per_parent);
    *ns_per_slice = elapsed / per_thread;
    *mslices_per_s = per_thread * c->threads / elapsed * 1e3;
    return 0;
}

/* A positive decimal integer, or 0 for anything else. */
static uint64_t parse_positive(const char *text)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || text[0] == '-')
        return 0;
    return v;
}

int main(int argc, char **argv)
{
    uint64_t iterations = 2000000;
    uint64_t repeat = 5;
    uint64_t only_nics = 0, only_slices = 0, only_threads = 0;
    for (int i = 1; i < argc; i++) {
        uint64_t *target = NULL;
        if (strcmp(argv[i], "--iterations") == 0)
            target = &iterations;
        else if (strcmp(argv[i], "--repeat") == 0)
            target = &repeat;
        else if (strcmp(argv[i], "--nics") == 0)
            target = &only_nics;
        else if (strcmp(argv[i], "--slices") == 0)
            target = &only_slices;
        else if (strcmp(argv[i], "--threads") == 0)
            target = &only_threads;
        if (target == NULL || i + 1 >= argc || (*target = parse_positive(argv[++i])) == 0) {
            fprintf(stderr, "usage: topo_bench [--iterations N] [--repeat R] [--nics N] "
                            "[--slices N] [--threads N]  (positive integers)\n");
            return 2;
        }
    }

    static const uint32_t nic_counts[] = {2, 8, 16};
    static const uint32_t parent_sizes[] = {1, 8, 64};
    int allocated = 0;
    if (repeat > 101)
        repeat = 101;
    printf("%-5s %-14s %-8s %9s %11s %14s %11s %10s\n", "nics", "slices/parent", "threads",
           "best ns", "median ns", "Mslices/s all", "heap calls", "sys calls");
    for (uint32_t threads = 1; threads <= 2; threads++) {
        for (size_t n = 0; n < sizeof nic_counts / sizeof nic_counts[0]; n++) {
            for (size_t p = 0; p < sizeof parent_sizes / sizeof parent_sizes[0]; p++) {
                struct cell c = {nic_counts[n], parent_sizes[p], threads};
                if ((only_nics && only_nics != c.nics) ||
                    (only_slices && only_slices != c.slices_per_parent) ||
                    (only_threads && only_threads != c.threads))
                    continue;
                double runs[101] = {0};
                double best_rate = 0;
                uint64_t heap = 0, sys = 0;
                for (uint64_t r = 0; r < repeat; r++) {
                    double ns = 0, rate = 0;
                    uint64_t run_heap = 0, run_sys = 0;
                    if (run_cell(&c, iterations, &ns, &rate, &run_heap, &run_sys) != 0) {
                        fprintf(stderr, "topo_bench: cell %u NICs x %u slices failed: %s\n",
                                c.nics, c.slices_per_parent, orb_last_error());
                        return 1;
                    }
                    /* Insertion into the sorted run times. */
                    uint64_t j = r;
                    for (; j > 0 && runs[j - 1] > ns; j--)
                        runs[j] = runs[j - 1];
                    runs[j] = ns;
                    best_rate = rate > best_rate ? rate : best_rate;
                    heap += run_heap;
                    sys += run_sys;
                }
                printf("%-5u %-14u %-8u %9.1f %11.1f %14.2f %11llu %10llu\n", c.nics,
                       c.slices_per_parent, c.threads, runs[0], runs[repeat / 2], best_rate,
                       (unsigned long long)heap, (unsigned long long)sys);
                if (heap != 0 || sys != 0)
                    allocated = 1;
            }
        }
    }
    printf("injected clock reads during selection: %llu\n",
           (unsigned long long)__atomic_load_n(&bench_clock_reads, __ATOMIC_RELAXED));
    if (allocated || __atomic_load_n(&bench_clock_reads, __ATOMIC_RELAXED) != 0) {
        fprintf(stderr, "topo_bench: selection allocated, made a system call or read the clock\n");
        return 1;
    }
    return 0;
}
