/* Same-host copy mechanisms, measured side by side: what a transport between two processes of
 * one host can build on, and what each costs here.
 *
 *   samehost_bench [--size BYTES] [--rounds N] [--json]
 *
 * A forked child holds a buffer of --size bytes (default 256 MiB, a cold working set as
 * orbite-bench's) filled with a pattern; the parent moves it in blocks of 1 MiB and of 4 KiB
 * with each mechanism, and checks every byte it moved:
 *   memcpy        both buffers in the parent, one thread (the bound a same-host path is held to)
 *   memcpy x2     the same with two threads, each half of the buffer
 *   cma read      process_vm_readv from the child's memory into the parent's
 *   cma write     process_vm_writev from the parent's memory into the child's
 *   shm first     the child's buffer is a memfd the parent maps (MAP_SHARED, read-only) and
 *                 copies from, first pass (its page faults included)
 *   shm           the same mapping, later passes
 * and the round trip of one 64-byte message between the processes through shared memory, the
 * waiter spinning (poll) or sleeping on a futex (futex), p50 and p99 over 20000 round trips.
 * GB/s figures are the best of --rounds passes (default 3), since on a shared host others only
 * ever add time.
 *
 * Exits 1 when a mechanism moved wrong bytes or failed (the message names it; a mechanism the
 * kernel refuses, such as cross-memory attach under Yama's ptrace_scope, is reported as
 * refused, not failed), 2 on a usage error. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BLOCK_BIG (1u << 20)
#define BLOCK_SMALL 4096u
#define PINGS 20000u

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint8_t pattern(size_t i)
{
    return (uint8_t)((i * 2654435761u) >> 13);
}

static void fill(uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = pattern(i);
}

/* The first byte of p[0..n) that is not the pattern, or n. */
static size_t check(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != pattern(i))
            return i;
    return n;
}

/* What the child shares with the parent: its buffer's address, the ping-pong words. */
struct shared {
    _Atomic uint64_t src_addr;  /* the child's private buffer (cma read) */
    _Atomic uint64_t dst_addr;  /* the child's private destination (cma write) */
    _Atomic uint32_t ready;
    _Atomic uint32_t stop;
    _Atomic uint32_t ping, pong; /* round trips: the parent bumps ping, the child answers pong */
    _Atomic uint32_t futex_mode;
    uint8_t message[64];
};

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

static long futex(_Atomic uint32_t *addr, int op, uint32_t val)
{
    return syscall(SYS_futex, (uint32_t *)addr, op, val, NULL, NULL, 0);
}

/* Wait until *w != old: spinning, or on the futex. */
static void wait_change(_Atomic uint32_t *w, uint32_t old, bool use_futex)
{
    while (atomic_load_explicit(w, memory_order_acquire) == old) {
        if (use_futex)
            (void)futex(w, FUTEX_WAIT, old);
        else
            cpu_relax();
    }
}

static void bump(_Atomic uint32_t *w, bool use_futex)
{
    atomic_fetch_add_explicit(w, 1, memory_order_release);
    if (use_futex)
        (void)futex(w, FUTEX_WAKE, 1);
}

static void child_main(struct shared *sh, uint8_t *shm, size_t size)
{
    uint8_t *src = malloc(size), *dst = malloc(size);
    if (src == NULL || dst == NULL)
        _exit(3);
    fill(src, size);
    fill(shm, size);
    memset(dst, 0, size);
    atomic_store(&sh->src_addr, (uint64_t)(uintptr_t)src);
    atomic_store(&sh->dst_addr, (uint64_t)(uintptr_t)dst);
    atomic_store(&sh->ready, 1);
    uint32_t seen = 0;
    for (;;) {
        bool use_futex = atomic_load(&sh->futex_mode) != 0;
        if (use_futex) {
            while (atomic_load_explicit(&sh->ping, memory_order_acquire) == seen && !atomic_load(&sh->stop))
                (void)futex(&sh->ping, FUTEX_WAIT, seen);
        } else {
            while (atomic_load_explicit(&sh->ping, memory_order_acquire) == seen && !atomic_load(&sh->stop))
                cpu_relax();
        }
        if (atomic_load(&sh->stop))
            break;
        seen = atomic_load(&sh->ping);
        sh->message[0] ^= 1; /* touch the message, as an answer would */
        /* The mode as of this ping (the parent sets it before pinging in it): a parent that
         * sleeps on the futex is always woken. */
        bump(&sh->pong, atomic_load(&sh->futex_mode) != 0);
    }
    /* Report whether the parent's cma write landed: the exit status. */
    _exit(check(dst, size) == size ? 0 : 4);
}

struct result {
    const char *name;
    double gbps_big, gbps_small;
    bool refused;
    char why[128];
};

typedef int (*move_fn)(void *ctx, uint8_t *dst, uint64_t remote, size_t n);

struct cma_ctx {
    pid_t pid;
};

static int cma_read(void *ctx, uint8_t *dst, uint64_t remote, size_t n)
{
    struct cma_ctx *c = ctx;
    struct iovec l = {.iov_base = dst, .iov_len = n}, r = {.iov_base = (void *)(uintptr_t)remote, .iov_len = n};
    ssize_t got = process_vm_readv(c->pid, &l, 1, &r, 1, 0);
    return got == (ssize_t)n ? 0 : (got < 0 ? errno : EIO);
}

static int cma_write(void *ctx, uint8_t *src, uint64_t remote, size_t n)
{
    struct cma_ctx *c = ctx;
    struct iovec l = {.iov_base = src, .iov_len = n}, r = {.iov_base = (void *)(uintptr_t)remote, .iov_len = n};
    ssize_t put = process_vm_writev(c->pid, &l, 1, &r, 1, 0);
    return put == (ssize_t)n ? 0 : (put < 0 ? errno : EIO);
}

static int copy_from(void *ctx, uint8_t *dst, uint64_t remote, size_t n)
{
    (void)ctx;
    memcpy(dst, (const void *)(uintptr_t)remote, n);
    return 0;
}

/* One pass over `size` bytes in blocks of `block`: GB/s, or a negative errno. */
static double pass(move_fn fn, void *ctx, uint8_t *local, uint64_t remote, size_t size, size_t block)
{
    uint64_t t0 = now_ns();
    for (size_t off = 0; off < size; off += block) {
        size_t n = size - off < block ? size - off : block;
        int err = fn(ctx, local + off, remote + off, n);
        if (err != 0)
            return -(double)err;
    }
    uint64_t t1 = now_ns();
    return (double)size / (double)(t1 - t0);
}

static double best_of(move_fn fn, void *ctx, uint8_t *local, uint64_t remote, size_t size, size_t block,
                      unsigned rounds)
{
    double best = 0;
    for (unsigned r = 0; r < rounds; r++) {
        double g = pass(fn, ctx, local, remote, size, block);
        if (g < 0)
            return g;
        if (g > best)
            best = g;
    }
    return best;
}

struct half {
    uint8_t *dst;
    const uint8_t *src;
    size_t size, block;
};

static void *copy_half(void *arg)
{
    struct half *h = arg;
    for (size_t off = 0; off < h->size; off += h->block) {
        size_t n = h->size - off < h->block ? h->size - off : h->block;
        memcpy(h->dst + off, h->src + off, n);
    }
    return NULL;
}

static double memcpy_two_threads(uint8_t *dst, const uint8_t *src, size_t size, size_t block, unsigned rounds)
{
    double best = 0;
    for (unsigned r = 0; r < rounds; r++) {
        size_t half = size / 2;
        struct half a = {dst, src, half, block}, b = {dst + half, src + half, size - half, block};
        pthread_t t;
        uint64_t t0 = now_ns();
        if (pthread_create(&t, NULL, copy_half, &b) != 0)
            return -(double)EAGAIN;
        copy_half(&a);
        pthread_join(t, NULL);
        double g = (double)size / (double)(now_ns() - t0);
        if (g > best)
            best = g;
    }
    return best;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* p50 and p99 round trip in ns. */
static void ping_pong(struct shared *sh, bool use_futex, double *p50, double *p99)
{
    static uint64_t rt[PINGS];
    atomic_store(&sh->futex_mode, use_futex);
    if (use_futex) /* the child may be spinning on the old mode: wake it into the new one */
        (void)futex(&sh->ping, FUTEX_WAKE, 1);
    for (unsigned i = 0; i < PINGS; i++) {
        uint32_t before = atomic_load(&sh->pong);
        uint64_t t0 = now_ns();
        sh->message[1] = (uint8_t)i;
        bump(&sh->ping, use_futex);
        wait_change(&sh->pong, before, use_futex);
        rt[i] = now_ns() - t0;
    }
    qsort(rt, PINGS, sizeof rt[0], cmp_u64);
    *p50 = (double)rt[PINGS / 2];
    *p99 = (double)rt[PINGS * 99 / 100];
}

static void usage(const char *prog)
{
    fprintf(stderr, "usage: %s [--size BYTES] [--rounds N] [--json]\n", prog);
}

int main(int argc, char **argv)
{
    size_t size = 256u << 20;
    unsigned rounds = 3;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--size") == 0 && i + 1 < argc) {
            char *end = NULL;
            unsigned long long v = strtoull(argv[++i], &end, 10);
            if (end == NULL || *end != '\0' || v < BLOCK_BIG || v > (8ull << 30) || v % BLOCK_BIG != 0) {
                usage(argv[0]);
                fprintf(stderr, "--size: a multiple of 1 MiB, 1 MiB..8 GiB\n");
                return 2;
            }
            size = (size_t)v;
        } else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
            int v = atoi(argv[++i]);
            if (v < 1 || v > 100) {
                usage(argv[0]);
                return 2;
            }
            rounds = (unsigned)v;
        } else if (strcmp(argv[i], "--json") == 0) {
            json = true;
        } else {
            usage(argv[0]);
            return 2;
        }
    }

    struct shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    int memfd = memfd_create("samehost-bench", MFD_CLOEXEC);
    if (sh == MAP_FAILED || memfd < 0 || ftruncate(memfd, (off_t)size) != 0) {
        perror("shared memory");
        return 1;
    }
    uint8_t *shm_child = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    uint8_t *local = malloc(size), *src = malloc(size);
    if (shm_child == MAP_FAILED || local == NULL || src == NULL) {
        perror("buffers");
        return 1;
    }
    memset(sh, 0, sizeof *sh);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return 1;
    }
    if (pid == 0)
        child_main(sh, shm_child, size);
    /* The parent keeps no mapping of the child's memfd pages but the one it makes below. */
    munmap(shm_child, size);
    while (!atomic_load(&sh->ready))
        usleep(1000);
    fill(src, size);

    int failures = 0;
    struct result res[6];
    size_t nres = 0;
    struct cma_ctx cma = {.pid = pid};

    /* memcpy, one thread and two */
    memset(local, 0, size);
    res[nres] = (struct result){.name = "memcpy"};
    res[nres].gbps_big = best_of(copy_from, NULL, local, (uint64_t)(uintptr_t)src, size, BLOCK_BIG, rounds);
    res[nres].gbps_small = best_of(copy_from, NULL, local, (uint64_t)(uintptr_t)src, size, BLOCK_SMALL, rounds);
    if (check(local, size) != size) {
        fprintf(stderr, "memcpy moved wrong bytes\n");
        failures++;
    }
    nres++;
    memset(local, 0, size);
    res[nres] = (struct result){.name = "memcpy x2"};
    res[nres].gbps_big = memcpy_two_threads(local, src, size, BLOCK_BIG, rounds);
    res[nres].gbps_small = memcpy_two_threads(local, src, size, BLOCK_SMALL, rounds);
    if (check(local, size) != size) {
        fprintf(stderr, "memcpy x2 moved wrong bytes\n");
        failures++;
    }
    nres++;

    /* cross-memory attach, both directions */
    memset(local, 0, size);
    res[nres] = (struct result){.name = "cma read"};
    uint64_t child_src = atomic_load(&sh->src_addr), child_dst = atomic_load(&sh->dst_addr);
    double g = best_of(cma_read, &cma, local, child_src, size, BLOCK_BIG, rounds);
    if (g < 0) {
        res[nres].refused = true;
        snprintf(res[nres].why, sizeof res[nres].why, "process_vm_readv: %s", strerror((int)-g));
    } else {
        res[nres].gbps_big = g;
        res[nres].gbps_small = best_of(cma_read, &cma, local, child_src, size, BLOCK_SMALL, rounds);
        if (check(local, size) != size) {
            fprintf(stderr, "cma read moved wrong bytes\n");
            failures++;
        }
    }
    nres++;
    res[nres] = (struct result){.name = "cma write"};
    g = best_of(cma_write, &cma, src, child_dst, size, BLOCK_BIG, rounds);
    bool cma_written = g >= 0;
    if (g < 0) {
        res[nres].refused = true;
        snprintf(res[nres].why, sizeof res[nres].why, "process_vm_writev: %s", strerror((int)-g));
    } else {
        res[nres].gbps_big = g;
        res[nres].gbps_small = best_of(cma_write, &cma, src, child_dst, size, BLOCK_SMALL, rounds);
    }
    nres++;

    /* the child's memfd, mapped read-only here */
    uint8_t *view = mmap(NULL, size, PROT_READ, MAP_SHARED, memfd, 0);
    if (view == MAP_FAILED) {
        perror("mmap of the memfd");
        return 1;
    }
    memset(local, 0, size);
    res[nres] = (struct result){.name = "shm first"};
    res[nres].gbps_big = pass(copy_from, NULL, local, (uint64_t)(uintptr_t)view, size, BLOCK_BIG);
    munmap(view, size);
    view = mmap(NULL, size, PROT_READ, MAP_SHARED, memfd, 0);
    if (view == MAP_FAILED) {
        perror("mmap of the memfd");
        return 1;
    }
    res[nres].gbps_small = pass(copy_from, NULL, local, (uint64_t)(uintptr_t)view, size, BLOCK_SMALL);
    if (check(local, size) != size) {
        fprintf(stderr, "shm moved wrong bytes\n");
        failures++;
    }
    nres++;
    memset(local, 0, size);
    res[nres] = (struct result){.name = "shm"};
    res[nres].gbps_big = best_of(copy_from, NULL, local, (uint64_t)(uintptr_t)view, size, BLOCK_BIG, rounds);
    res[nres].gbps_small = best_of(copy_from, NULL, local, (uint64_t)(uintptr_t)view, size, BLOCK_SMALL, rounds);
    if (check(local, size) != size) {
        fprintf(stderr, "shm moved wrong bytes\n");
        failures++;
    }
    nres++;
    /* A read-only mapping cannot be written through: the kernel refuses the writable one. */
    close(memfd);

    double poll50, poll99, fut50, fut99;
    ping_pong(sh, false, &poll50, &poll99);
    ping_pong(sh, true, &fut50, &fut99);
    atomic_store(&sh->stop, 1);
    (void)futex(&sh->ping, FUTEX_WAKE, 1);
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
        (WEXITSTATUS(status) != 0 && !(WEXITSTATUS(status) == 4 && !cma_written))) {
        fprintf(stderr, "the child ended with status 0x%x (4: cma write moved wrong bytes)\n", status);
        failures++;
    }

    if (json) {
        printf("{\"tool\":\"samehost_bench\",\"size\":%zu,\"rounds\":%u,\"results\":[", size, rounds);
        for (size_t i = 0; i < nres; i++)
            printf("%s{\"mechanism\":\"%s\",\"refused\":%s,\"gbps_1m\":%.3f,\"gbps_4k\":%.3f}", i ? "," : "",
                   res[i].name, res[i].refused ? "true" : "false", res[i].gbps_big, res[i].gbps_small);
        printf("],\"round_trip_ns\":{\"poll_p50\":%.0f,\"poll_p99\":%.0f,\"futex_p50\":%.0f,\"futex_p99\":%.0f},"
               "\"ok\":%s}\n", poll50, poll99, fut50, fut99, failures ? "false" : "true");
    } else {
        printf("%-10s %10s %10s\n", "mechanism", "1M GB/s", "4K GB/s");
        for (size_t i = 0; i < nres; i++) {
            if (res[i].refused)
                printf("%-10s refused (%s)\n", res[i].name, res[i].why);
            else
                printf("%-10s %10.3f %10.3f\n", res[i].name, res[i].gbps_big, res[i].gbps_small);
        }
        printf("64-byte round trip: poll p50 %.0f ns (p99 %.0f), futex p50 %.0f ns (p99 %.0f)\n", poll50, poll99,
               fut50, fut99);
    }
    munmap(view, size);
    munmap(sh, sizeof *sh);
    free(local);
    free(src);
    return failures ? 1 : 0;
}
