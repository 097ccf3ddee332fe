/* Source admission under attack: strangers (connections that never complete HELLO, idle or
 * trickling one byte a second) cannot keep good peers out, are dropped by their deadline, and
 * leave no descriptor or memory behind.
 *
 * The attacker is a child process, forked before any thread exists: 1000 idle strangers, then
 * 100 tricklers that reconnect whenever they are dropped. Meanwhile eight good peers (each its
 * own requester engine) open segments and transfer in a loop. Every open must succeed within
 * 1 s (3 s in sanitized builds) and every byte must verify; afterwards the source's descriptors and resident memory go
 * back to what they were before the attack. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <malloc.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "util.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

#define IDLE_STRANGERS 1000
#define TRICKLERS 100
#define GOOD_PEERS 8
#define HELLO_TIMEOUT_MS 2000
#define ATTACK_SECONDS 8
#define PEER_SLICE (256u * 1024)
/* A good peer's open deadline. Sanitized builds run every instruction several times slower on
 * a host shared with the rest of the suite; there the bound checks that strangers cannot keep
 * a good peer out at all, and the plain builds check that they cannot slow it past 1 s. */
#define OPEN_DEADLINE_NS (SANITIZED ? 3 * EU_SEC : EU_SEC)

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* ---- the attacker (child process: system calls and the stack only) ---------------------- */

struct attack_stats {
    int idle_connected, idle_dropped;
    int trickle_connected, trickle_dropped;
    int trickle_by_deadline;      /* dropped at their HELLO deadline, not for a newer one */
    uint64_t max_trickle_life_ms;
    int connect_failures;
};

static int dial(const struct sockaddr_in *sa)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (connect(fd, (const struct sockaddr *)sa, sizeof *sa) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void attacker(int endpoint_fd, int stop_fd, int result_fd)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        rlim_t want = IDLE_STRANGERS + TRICKLERS + 64;
        rl.rlim_cur = rl.rlim_max < want ? rl.rlim_max : want;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
    }
    char ep[ORB_ENDPOINT_MAX] = {0};
    if (read(endpoint_fd, ep, sizeof ep - 1) <= 0)
        _exit(2);
    char *colon = strrchr(ep, ':');
    if (colon == NULL)
        _exit(2);
    *colon = '\0';
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
    if (inet_pton(AF_INET, ep, &sa.sin_addr) != 1)
        _exit(2);

    static struct pollfd pfd[IDLE_STRANGERS + TRICKLERS + 1];
    static uint64_t born[TRICKLERS], redial_at[TRICKLERS];
    static unsigned sent[TRICKLERS];
    uint64_t start = now_ms();
    /* Dropped tricklers come back a second later until three seconds before the end; the last
     * ones are then left alone, so that their deadline, not the budget, drops them. */
    uint64_t last_redial = start + (ATTACK_SECONDS - 3) * 1000u;
    struct attack_stats st = {0};
    for (int i = 0; i < IDLE_STRANGERS; i++) {
        pfd[i].fd = dial(&sa);
        pfd[i].events = POLLIN;
        if (pfd[i].fd >= 0)
            st.idle_connected++;
        else
            st.connect_failures++;
    }
    for (int i = 0; i < TRICKLERS; i++) {
        pfd[IDLE_STRANGERS + i].fd = dial(&sa);
        pfd[IDLE_STRANGERS + i].events = POLLIN;
        born[i] = now_ms();
        if (pfd[IDLE_STRANGERS + i].fd >= 0)
            st.trickle_connected++;
        else
            st.connect_failures++;
    }
    pfd[IDLE_STRANGERS + TRICKLERS].fd = stop_fd;
    pfd[IDLE_STRANGERS + TRICKLERS].events = POLLIN;
    char ready = 'r';
    if (write(result_fd, &ready, 1) != 1)
        _exit(2);

    /* A HELLO's bytes, one a second: the header is well formed, the trickle never ends in time. */
    const uint8_t hello[8] = {0x4f, 0x52, 0x42, 0x54, 0x02, 0x01, 0x00, 0x00};
    uint64_t next_byte = now_ms() + 1000, give_up = now_ms() + 120000;
    for (;;) {
        int n = poll(pfd, IDLE_STRANGERS + TRICKLERS + 1, 50);
        if (n < 0 && errno != EINTR)
            break;
        if (pfd[IDLE_STRANGERS + TRICKLERS].revents != 0 || now_ms() > give_up)
            break; /* the parent is done */
        for (int i = 0; n > 0 && i < IDLE_STRANGERS + TRICKLERS; i++) {
            if (pfd[i].fd < 0 || pfd[i].revents == 0)
                continue;
            char sink[64];
            ssize_t got = recv(pfd[i].fd, sink, sizeof sink, MSG_DONTWAIT);
            if (got > 0 || (got < 0 && (errno == EAGAIN || errno == EINTR)))
                continue;
            close(pfd[i].fd);
            pfd[i].fd = -1;
            if (i < IDLE_STRANGERS) {
                st.idle_dropped++;
                continue;
            }
            int t = i - IDLE_STRANGERS;
            uint64_t life = now_ms() - born[t];
            if (life > st.max_trickle_life_ms)
                st.max_trickle_life_ms = life;
            if (life + 300 >= HELLO_TIMEOUT_MS)
                st.trickle_by_deadline++;
            st.trickle_dropped++;
            redial_at[t] = now_ms() + 1000;
        }
        for (int t = 0; t < TRICKLERS; t++) {
            struct pollfd *p = &pfd[IDLE_STRANGERS + t];
            uint64_t now = now_ms();
            if (p->fd >= 0 || redial_at[t] == 0 || now < redial_at[t])
                continue;
            redial_at[t] = 0;
            if (now > last_redial)
                continue;
            p->fd = dial(&sa);
            born[t] = now;
            sent[t] = 0;
            if (p->fd >= 0)
                st.trickle_connected++;
            else
                st.connect_failures++;
        }
        if (now_ms() >= next_byte) {
            next_byte += 1000;
            for (int t = 0; t < TRICKLERS; t++) {
                int fd = pfd[IDLE_STRANGERS + t].fd;
                if (fd >= 0 && sent[t] < sizeof hello &&
                    send(fd, hello + sent[t], 1, MSG_NOSIGNAL | MSG_DONTWAIT) == 1)
                    sent[t]++;
            }
        }
    }
    if (write(result_fd, &st, sizeof st) != (ssize_t)sizeof st)
        _exit(3);
    _exit(0);
}

/* ---- the good peers --------------------------------------------------------------------- */

struct good_peer {
    int index;
    orb_engine *src;
    uint8_t *remote;          /* this peer's slice of the source's region */
    atomic_int *stop;
    int opens, failures;
    uint64_t worst_open_ns;
    char why[256];
};

static void *good_main(void *arg)
{
    struct good_peer *g = arg;
    struct orb_engine_config cfg;
    orb_engine_config_init(&cfg);
    cfg.enable_source = 0;
    cfg.tcp_workers = 1;
    orb_engine *req = NULL;
    if (orb_engine_create(&cfg, &req) != 0) {
        snprintf(g->why, sizeof g->why, "engine: %s", orb_last_error());
        g->failures++;
        return NULL;
    }
    orb_host_memory *mem;
    orb_reg_id id;
    if (orb_host_memory_alloc(2 * PEER_SLICE, 0, &mem) != 0 ||
        orb_register_host_memory(req, mem, 0, 2 * PEER_SLICE, ORB_PERM_LOCAL, &id) != 0) {
        g->failures++;
        orb_engine_free(req);
        return NULL;
    }
    uint8_t *out = orb_host_memory_data(mem), *in = out + PEER_SLICE;
    char ep[ORB_ENDPOINT_MAX];
    struct orb_epoch epoch;
    orb_engine_endpoint(g->src, ep, sizeof ep);
    orb_engine_source_epoch(g->src, &epoch);
    for (unsigned round = 0; !atomic_load(g->stop); round++) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        orb_segment *seg = NULL;
        int rc = orb_open_segment(req, ep, &epoch, OPEN_DEADLINE_NS, &seg);
        clock_gettime(CLOCK_MONOTONIC, &b);
        uint64_t took = (uint64_t)(b.tv_sec - a.tv_sec) * EU_SEC + (uint64_t)b.tv_nsec -
                        (uint64_t)a.tv_nsec;
        if (took > g->worst_open_ns)
            g->worst_open_ns = took;
        if (rc != 0) {
            g->failures++;
            snprintf(g->why, sizeof g->why, "open: %s", orb_last_error());
            continue;
        }
        g->opens++;
        eu_fill(out, PEER_SLICE, (uint8_t)(g->index * 31 + round));
        memset(in, 0, PEER_SLICE);
        struct orb_request w = eu_req(ORB_OP_WRITE, out, g->remote, PEER_SLICE);
        struct orb_request r = eu_req(ORB_OP_READ, in, g->remote, PEER_SLICE);
        struct orb_batch_report rep;
        if (orb_submit_and_wait(req, seg, &w, 1, NULL, 10 * EU_SEC, &rep) != 0 ||
            orb_submit_and_wait(req, seg, &r, 1, NULL, 10 * EU_SEC, &rep) != 0) {
            g->failures++;
            snprintf(g->why, sizeof g->why, "transfer: %s", orb_last_error());
        } else if (memcmp(in, out, PEER_SLICE) != 0) {
            g->failures++;
            snprintf(g->why, sizeof g->why, "bytes differ");
        }
        orb_segment_close(seg);
        usleep(50 * 1000);
    }
    orb_unregister_memory(req, id);
    orb_host_memory_unref(mem);
    orb_engine_free(req);
    return NULL;
}

/* ---- the source's footprint ----------------------------------------------------------------- */

static int open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n - 1; /* the directory's own descriptor */
}

static long resident_kib(void)
{
    malloc_trim(0);
    FILE *f = fopen("/proc/self/statm", "r");
    assert_non_null(f);
    long size = 0, resident = 0;
    assert_int_equal(fscanf(f, "%ld %ld", &size, &resident), 2);
    fclose(f);
    return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

static void test_strangers_cannot_block_good_peers(void **state)
{
    (void)state;
    int ep_pipe[2], stop_pipe[2], result_pipe[2];
    assert_int_equal(pipe(ep_pipe), 0);
    assert_int_equal(pipe(stop_pipe), 0);
    assert_int_equal(pipe(result_pipe), 0);
    pid_t child = fork(); /* before any thread exists */
    assert_true(child >= 0);
    if (child == 0) {
        close(ep_pipe[1]);
        close(stop_pipe[1]);
        close(result_pipe[0]);
        attacker(ep_pipe[0], stop_pipe[0], result_pipe[1]);
    }
    close(ep_pipe[0]);
    close(stop_pipe[0]);
    close(result_pipe[1]);

    struct orb_engine_config cfg;
    assert_int_equal(orb_engine_config_init(&cfg), 0);
    cfg.hello_timeout_ms = HELLO_TIMEOUT_MS;
    orb_engine *src = eu_engine(&cfg);
    struct eu_region region;
    eu_region_new(src, GOOD_PEERS * PEER_SLICE, ORB_PERM_REMOTE_WRITE, 0x44, &region);
    /* Warm up every path once, then take the baseline. */
    {
        atomic_int stop = 1;
        struct good_peer warm = {.index = 0, .src = src, .remote = region.base, .stop = &stop};
        good_main(&warm);
    }
    int fds_before = open_fds();
    long rss_before = resident_kib();

    char ep[ORB_ENDPOINT_MAX];
    assert_int_equal(orb_engine_endpoint(src, ep, sizeof ep), 0);
    assert_int_equal(write(ep_pipe[1], ep, strlen(ep)), (ssize_t)strlen(ep));
    close(ep_pipe[1]);
    char ready;
    assert_int_equal(read(result_pipe[0], &ready, 1), 1); /* the idle strangers are in */

    atomic_int stop = 0;
    struct good_peer peers[GOOD_PEERS];
    pthread_t threads[GOOD_PEERS];
    for (int i = 0; i < GOOD_PEERS; i++) {
        peers[i] = (struct good_peer){.index = i, .src = src,
                                      .remote = region.base + (size_t)i * PEER_SLICE,
                                      .stop = &stop};
        assert_int_equal(pthread_create(&threads[i], NULL, good_main, &peers[i]), 0);
    }
    sleep(ATTACK_SECONDS);
    atomic_store(&stop, 1);
    for (int i = 0; i < GOOD_PEERS; i++)
        pthread_join(threads[i], NULL);

    close(stop_pipe[1]);
    struct attack_stats st;
    assert_int_equal(read(result_pipe[0], &st, sizeof st), (ssize_t)sizeof st);
    close(result_pipe[0]);
    int status;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);

    print_message("attack: %d idle strangers (%d dropped), %d trickler connections (%d dropped, "
                  "%d of them at their deadline, longest %llu ms), %d connects failed\n",
                  st.idle_connected, st.idle_dropped, st.trickle_connected, st.trickle_dropped,
                  st.trickle_by_deadline, (unsigned long long)st.max_trickle_life_ms,
                  st.connect_failures);
    int opens = 0;
    uint64_t worst = 0;
    for (int i = 0; i < GOOD_PEERS; i++) {
        if (peers[i].failures != 0)
            fail_msg("good peer %d: %d failures (%s)", i, peers[i].failures, peers[i].why);
        assert_true(peers[i].opens > 0);
        opens += peers[i].opens;
        if (peers[i].worst_open_ns > worst)
            worst = peers[i].worst_open_ns;
    }
    print_message("good peers: %d opens, slowest %.1f ms\n", opens, (double)worst / 1e6);
    /* Every open succeeded within its own deadline (a late one is a failure above); the
     * clock readings around the call may add the thread's scheduling to that (an open that
     * waited for a SYN retransmission, 1 s on Linux, measured 1000.3 ms on a loaded host). */
    assert_true(worst <= OPEN_DEADLINE_NS + OPEN_DEADLINE_NS / 20);
    assert_true(st.idle_connected >= IDLE_STRANGERS / 2);
    /* Every idle stranger was dropped: by the budget or by its deadline. */
    assert_int_equal(st.idle_dropped, st.idle_connected);
    /* Tricklers never outlive their deadline (plus the source's 250 ms scan and some slack),
     * and the last ones, with no newer stranger to make room for, were dropped by it. */
    assert_true(st.trickle_dropped >= TRICKLERS);
    assert_true(st.trickle_by_deadline > 0);
    assert_true(st.max_trickle_life_ms <= HELLO_TIMEOUT_MS + 1000);
    assert_int_equal(st.connect_failures, 0);

    /* The attacker is gone: the source closes what is left and gets back to its footprint
     * (three pipe ends to the attacker were open at the baseline and are closed now). */
    fds_before -= 3;
    int fds_after = open_fds();
    for (int i = 0; i < 100 && fds_after > fds_before; i++) {
        usleep(100 * 1000);
        fds_after = open_fds();
    }
    assert_int_equal(fds_after, fds_before);
    long rss_after = resident_kib();
    print_message("source: %d descriptors before and after; resident %ld KiB before, %ld after\n",
                  fds_before, rss_before, rss_after);
    if (!SANITIZED) /* sanitizers keep freed memory in quarantine */
        assert_true(rss_after <= rss_before + 16 * 1024);

    eu_region_free(src, &region);
    orb_engine_free(src);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_strangers_cannot_block_good_peers),
    };
    return cmocka_run_group_tests_name("admission", tests, NULL, NULL);
}
