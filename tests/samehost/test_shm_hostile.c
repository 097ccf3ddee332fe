/* The same-host source against a hostile requester: a raw client that speaks the transport's
 * socket and ring protocol by hand (samehost/shm_msg.h) to a real engine's source. Every forged
 * request is refused without changing a byte, every malformed message or impossible ring index
 * ends the connection, and memory the source cannot map safely is never mapped. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <orbite/orbite.h>

#include "core/clock.h"
#include "core/engine.h"
#include "samehost/shm_internal.h"

#define SEC 1000000000ull
#define RW_LEN (1u << 20)
#define RO_LEN (64u << 10)
#define BUF_LEN (64u << 10)

struct fx {
    orb_engine *src;
    orb_host_memory *rw_mem, *ro_mem, *local_mem;
    uint8_t *rw, *ro, *local;
    struct orb_epoch epoch;
    struct orb_shm_info info;
};

struct raw {
    int sock;
    uint8_t *rings;
    size_t rings_len;
    struct orb_sh_ring req, cpl;
};

static void pattern(uint8_t *p, size_t n, uint8_t seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(i * 131u + seed);
}

static void check_pattern(const uint8_t *p, size_t n, uint8_t seed, const char *what)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != (uint8_t)(i * 131u + seed))
            fail_msg("%s: byte %zu changed", what, i);
}

static int setup_with(void **state, uint32_t hello_ms, uint32_t max_strangers, uint32_t max_connections)
{
    struct fx *f = calloc(1, sizeof *f);
    assert_non_null(f);
    struct orb_engine_config cfg;
    assert_int_equal(orb_engine_config_init(&cfg), 0);
    cfg.hello_timeout_ms = hello_ms;
    if (max_strangers != 0)
        cfg.max_unauthenticated = max_strangers;
    if (max_connections != 0)
        cfg.max_connections = max_connections;
    if (orb_engine_create(&cfg, &f->src) != 0)
        fail_msg("orb_engine_create: %s", orb_last_error());
    assert_int_equal(orb_host_memory_alloc(RW_LEN, 0, &f->rw_mem), 0);
    assert_int_equal(orb_host_memory_alloc(RO_LEN, 0, &f->ro_mem), 0);
    assert_int_equal(orb_host_memory_alloc(RO_LEN, 0, &f->local_mem), 0);
    f->rw = orb_host_memory_data(f->rw_mem);
    f->ro = orb_host_memory_data(f->ro_mem);
    f->local = orb_host_memory_data(f->local_mem);
    pattern(f->rw, RW_LEN, 1);
    pattern(f->ro, RO_LEN, 2);
    pattern(f->local, RO_LEN, 3);
    orb_reg_id id;
    assert_int_equal(orb_register_host_memory(f->src, f->rw_mem, 0, RW_LEN, ORB_PERM_REMOTE_WRITE, &id), 0);
    assert_int_equal(orb_register_host_memory(f->src, f->ro_mem, 0, RO_LEN, ORB_PERM_REMOTE_READ, &id), 0);
    assert_int_equal(orb_register_host_memory(f->src, f->local_mem, 0, RO_LEN, ORB_PERM_LOCAL, &id), 0);
    assert_int_equal(orb_engine_source_epoch(f->src, &f->epoch), 0);
    /* What a requester learns over the TCP control connection. */
    uint8_t req[64], resp[ORB_CONTROL_MAX];
    size_t len = 0, resp_len = 0;
    struct orb_epoch nobody = {{0}};
    assert_int_equal(orb_shm_info_encode(req, sizeof req, &len), 0);
    assert_int_equal(orb_engine_control(f->src, ORB_TRANSPORT_SHM, &nobody, req, len, resp, sizeof resp, &resp_len), 0);
    assert_int_equal(orb_shm_info_ok_decode(resp, resp_len, &f->info), 0);
    *state = f;
    return 0;
}

static int setup(void **state)
{
    return setup_with(state, 300, 0, 0);
}

/* Strangers may wait a minute for their proof, four of them at most; three proved requesters. */
static int setup_budgets(void **state)
{
    return setup_with(state, 60000, 4, 3);
}

static int teardown(void **state)
{
    struct fx *f = *state;
    assert_int_equal(orb_engine_close(f->src, 5 * SEC), 0);
    orb_engine_free(f->src);
    orb_host_memory_unref(f->rw_mem);
    orb_host_memory_unref(f->ro_mem);
    orb_host_memory_unref(f->local_mem);
    free(f);
    return 0;
}

static int raw_connect(struct fx *f)
{
    int sock = -1;
    assert_int_equal(shm_sock_connect(f->info.id, orb_deadline_after(5 * SEC), &sock), 0);
    return sock;
}

static void send_hello(struct fx *f, int sock, const struct orb_epoch *epoch, uint32_t pid)
{
    struct orb_samehost_hello h = {.epoch = *epoch, .pid = pid};
    memcpy(h.boot_id, f->info.boot_id, sizeof h.boot_id);
    uint8_t buf[ORB_SAMEHOST_HELLO_LEN];
    assert_int_equal(orb_samehost_hello_encode(&h, buf), 0);
    assert_int_equal(shm_sock_send(sock, buf, sizeof buf, -1, orb_deadline_after(SEC)), 0);
}

/* The source ends the connection: the next receive sees its end (never a message), in time. */
static void assert_ended(int sock, const char *what)
{
    uint8_t buf[256];
    size_t n = 0;
    int fd = -1;
    uint64_t t0 = orb_now_ns();
    int rc = shm_sock_recv(sock, buf, sizeof buf, &n, &fd, orb_deadline_after(3 * SEC));
    if (rc != ORB_EPEER)
        fail_msg("%s: the source did not end the connection (rc %d, %zu bytes)", what, rc, n);
    assert_true(orb_now_ns() - t0 < 3 * SEC);
    close(sock);
}

static int memory_file(size_t len, int seal)
{
    int fd = memfd_create("test-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)len), 0);
    if (seal)
        assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
    return fd;
}

static void send_setup(int sock, int fd, uint64_t bytes)
{
    struct orb_shm_setup su = {.request_capacity = 16, .completion_capacity = 16, .bytes = bytes};
    uint8_t msg[ORB_SHM_SETUP_LEN];
    size_t len = 0;
    assert_int_equal(orb_shm_setup_encode(&su, msg, sizeof msg, &len), 0);
    assert_int_equal(shm_sock_send(sock, msg, len, fd, orb_deadline_after(SEC)), 0);
}

/* Send HELLO on `sock` and read the source's: 0 when it answered with its own, else the
 * status of the receive (the source ended the connection: ORB_EPEER). */
static int raw_prove(struct fx *f, int sock)
{
    send_hello(f, sock, &f->epoch, (uint32_t)getpid());
    uint8_t buf[256];
    size_t n = 0;
    int rc = shm_sock_recv(sock, buf, sizeof buf, &n, NULL, orb_deadline_after(3 * SEC));
    if (rc != 0)
        return rc;
    struct orb_samehost_hello h;
    assert_int_equal(orb_samehost_hello_decode(buf, n, &h), 0);
    assert_memory_equal(h.epoch.bytes, f->epoch.bytes, sizeof h.epoch.bytes);
    return 0;
}

/* SETUP on a proved connection `sock` (taken over by *r): 16-entry rings. */
static void raw_setup(struct raw *r, int sock)
{
    memset(r, 0, sizeof *r);
    r->sock = sock;
    uint8_t buf[256];
    size_t n = 0;
    uint64_t bytes = orb_shm_setup_bytes(16, 16);
    int fd = memory_file(bytes, 1);
    r->rings = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(r->rings != MAP_FAILED);
    r->rings_len = bytes;
    uint64_t at = orb_shm_setup_completion_offset(16);
    assert_int_equal(orb_sh_ring_open(&r->req, r->rings, at, 16, ORB_SH_RING_PRODUCER, 1), 0);
    assert_int_equal(orb_sh_ring_open(&r->cpl, r->rings + at, bytes - at, 16, ORB_SH_RING_CONSUMER, 1), 0);
    send_setup(r->sock, fd, bytes);
    close(fd);
    assert_int_equal(shm_sock_recv(r->sock, buf, sizeof buf, &n, NULL, orb_deadline_after(3 * SEC)), 0);
    struct orb_shm_status st;
    assert_int_equal(orb_shm_status_decode(ORB_SHM_SETUP_OK, buf, n, &st), 0);
    assert_int_equal(st.status, 0);
}

/* A proved, set-up connection with 16-entry rings. */
static void raw_open(struct fx *f, struct raw *r)
{
    int sock = raw_connect(f);
    assert_int_equal(raw_prove(f, sock), 0);
    raw_setup(r, sock);
}

static void raw_close(struct raw *r)
{
    if (r->sock >= 0)
        close(r->sock);
    munmap(r->rings, r->rings_len);
}

/* MAP [offset, +len) of `fd` as `id`; the source's answer. */
static int raw_map(struct raw *r, uint32_t id, int fd, uint64_t offset, uint64_t len, int writable)
{
    struct orb_shm_map mm = {.map_id = id, .writable = (uint8_t)writable, .file_offset = offset, .length = len};
    uint8_t msg[ORB_SHM_MAP_LEN], buf[64];
    size_t n = 0;
    assert_int_equal(orb_shm_map_encode(&mm, msg, sizeof msg, &n), 0);
    assert_int_equal(shm_sock_send(r->sock, msg, n, fd, orb_deadline_after(SEC)), 0);
    assert_int_equal(shm_sock_recv(r->sock, buf, sizeof buf, &n, NULL, orb_deadline_after(3 * SEC)), 0);
    struct orb_shm_status st;
    assert_int_equal(orb_shm_status_decode(ORB_SHM_MAP_OK, buf, n, &st), 0);
    assert_int_equal(st.map_id, id);
    return st.status;
}

/* Push one request and wait for its completion's status. */
static int raw_request(struct raw *r, uint8_t op, uint32_t map_id, uint64_t map_offset, const void *remote,
                       uint64_t len, const void *request, uint64_t request_len)
{
    static uint64_t tag = 100;
    struct orb_shm_request rq = {.tag = ++tag, .op = op, .map_id = map_id, .map_offset = map_offset,
                                 .remote_addr = (uint64_t)(uintptr_t)remote, .length = len,
                                 .request_addr = (uint64_t)(uintptr_t)request, .request_length = request_len};
    uint8_t entry[ORB_SH_RING_ENTRY];
    assert_int_equal(orb_shm_request_encode(&rq, entry), 0);
    SHM_ORDER_RELEASE(); /* as the library's requester does: for ThreadSanitizer only */
    assert_int_equal(orb_sh_ring_push(&r->req, entry), 0);
    uint64_t deadline = orb_deadline_after(5 * SEC);
    int rc;
    while ((rc = orb_sh_ring_pop(&r->cpl, entry)) == ORB_EAGAIN) {
        assert_true(orb_now_ns() < deadline);
        (void)orb_sh_ring_wait(&r->cpl, 0, orb_deadline_after(SEC / 10));
    }
    assert_int_equal(rc, 0);
    SHM_ORDER_ACQUIRE();
    struct orb_shm_completion cp;
    assert_int_equal(orb_shm_completion_decode(entry, &cp), 0);
    assert_int_equal(cp.tag, tag);
    if (cp.status != 0)
        assert_true(strlen(cp.why) > 0); /* the cause travels with the refusal */
    return cp.status;
}

/* ---- the proof --------------------------------------------------------------------------------- */

/* Whether the source still holds a connection open: nothing to read and no end seen. */
static int still_open(int sock)
{
    struct pollfd p = {.fd = sock, .events = POLLIN};
    return poll(&p, 1, 0) == 0;
}

/* Processes that connect and say nothing draw from max_unauthenticated, never from
 * max_connections: the oldest is dropped for each newcomer past the budget, so that they
 * cannot keep a requester out for hello_timeout_ms; proved connections have their own budget. */
static void test_strangers_cannot_keep_a_requester_out(void **state)
{
    struct fx *f = *state;
    enum { N = 10, BUDGET = 4 };
    int strangers[N];
    for (int i = 0; i < N; i++)
        strangers[i] = raw_connect(f);
    /* The six oldest make room for the four newest, long before their 60 s proof deadline. */
    for (int i = 0; i < N - BUDGET; i++)
        assert_ended(strangers[i], "a stranger past the budget");
    for (int i = N - BUDGET; i < N; i++)
        assert_true(still_open(strangers[i]));
    /* A requester gets in at once and is served. */
    uint64_t t0 = orb_now_ns();
    struct raw r[3];
    raw_open(f, &r[0]);
    assert_true(orb_now_ns() - t0 < 2 * SEC);
    int fd = memory_file(BUF_LEN, 1);
    assert_int_equal(raw_map(&r[0], 1, fd, 0, BUF_LEN, 1), 0);
    assert_int_equal(raw_request(&r[0], ORB_OP_READ, 1, 0, f->rw, 4096, f->rw, 4096), 0);
    /* Its arrival dropped the oldest stranger left; the others are still there. */
    assert_ended(strangers[N - BUDGET], "the oldest stranger when a requester came");
    for (int i = N - BUDGET + 1; i < N; i++)
        assert_true(still_open(strangers[i]));
    /* Two more proved requesters fit max_connections (3); a fourth is refused after its HELLO,
     * and the strangers were never counted against it. */
    raw_open(f, &r[1]);
    raw_open(f, &r[2]);
    int late = raw_connect(f);
    send_hello(f, late, &f->epoch, (uint32_t)getpid());
    assert_ended(late, "a requester past max_connections");
    /* One leaves: the next one gets its slot once the source has seen it go. */
    raw_close(&r[2]);
    uint64_t deadline = orb_now_ns() + 5 * SEC;
    int sock;
    for (;;) {
        sock = raw_connect(f);
        if (raw_prove(f, sock) == 0)
            break;
        close(sock);
        assert_true(orb_now_ns() < deadline);
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    struct raw again;
    raw_setup(&again, sock);
    assert_int_equal(raw_map(&again, 1, fd, 0, BUF_LEN, 1), 0);
    assert_int_equal(raw_request(&again, ORB_OP_WRITE, 1, 0, f->rw + 4096, 4096, f->rw + 4096, 4096), 0);
    raw_close(&again);
    raw_close(&r[1]);
    raw_close(&r[0]);
    close(fd);
    for (int i = N - BUDGET + 1; i < N; i++)
        close(strangers[i]);
}

static void test_proof_refusals(void **state)
{
    struct fx *f = *state;
    struct orb_epoch wrong = f->epoch;
    wrong.bytes[3] ^= 1;
    int sock = raw_connect(f);
    send_hello(f, sock, &wrong, (uint32_t)getpid());
    assert_ended(sock, "a HELLO expecting another epoch");

    sock = raw_connect(f);
    send_hello(f, sock, &f->epoch, (uint32_t)getpid() + 1);
    assert_ended(sock, "a HELLO naming another process");

    sock = raw_connect(f);
    uint8_t junk[ORB_SAMEHOST_HELLO_LEN];
    memset(junk, 0x5a, sizeof junk);
    assert_int_equal(shm_sock_send(sock, junk, sizeof junk, -1, orb_deadline_after(SEC)), 0);
    assert_ended(sock, "a HELLO of junk");

    /* Silence: the HELLO deadline (300 ms here) ends it. */
    sock = raw_connect(f);
    assert_ended(sock, "no HELLO at all");

    /* A descriptor riding on the HELLO is refused with it. */
    sock = raw_connect(f);
    struct orb_samehost_hello h = {.epoch = f->epoch, .pid = (uint32_t)getpid()};
    memcpy(h.boot_id, f->info.boot_id, sizeof h.boot_id);
    uint8_t buf[ORB_SAMEHOST_HELLO_LEN];
    assert_int_equal(orb_samehost_hello_encode(&h, buf), 0);
    int extra = memory_file(4096, 1);
    assert_int_equal(shm_sock_send(sock, buf, sizeof buf, extra, orb_deadline_after(SEC)), 0);
    close(extra);
    assert_ended(sock, "a HELLO carrying a descriptor");
}

static void test_setup_refusals(void **state)
{
    struct fx *f = *state;
    uint64_t bytes = orb_shm_setup_bytes(16, 16);
    uint8_t buf[256];
    size_t n;
    const struct {
        const char *what;
        int kind; /* 0 none, 1 unsealed memfd, 2 a pipe, 3 too short */
    } cases[] = {{"SETUP without its memory", 0}, {"SETUP with an unsealed memory file", 1},
                 {"SETUP with a pipe", 2}, {"SETUP with a memory file shorter than it says", 3}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int sock = raw_connect(f);
        send_hello(f, sock, &f->epoch, (uint32_t)getpid());
        assert_int_equal(shm_sock_recv(sock, buf, sizeof buf, &n, NULL, orb_deadline_after(3 * SEC)), 0);
        int fd = -1, pipefd[2] = {-1, -1};
        if (cases[i].kind == 1)
            fd = memory_file(bytes, 0);
        else if (cases[i].kind == 2) {
            assert_int_equal(pipe(pipefd), 0);
            fd = pipefd[0];
        } else if (cases[i].kind == 3)
            fd = memory_file(bytes / 2 / 4096 * 4096, 1);
        send_setup(sock, fd, bytes);
        if (fd >= 0)
            close(fd);
        if (pipefd[1] >= 0)
            close(pipefd[1]);
        assert_ended(sock, cases[i].what);
    }
}

/* ---- forged requests ----------------------------------------------------------------------------- */

static void test_forged_maps(void **state)
{
    struct fx *f = *state;
    struct raw r;
    raw_open(f, &r);
    int good = memory_file(BUF_LEN, 1), unsealed = memory_file(BUF_LEN, 0);
    assert_int_equal(raw_map(&r, 1, good, 0, BUF_LEN, 1), 0);
    assert_int_equal(raw_map(&r, 1, good, 0, BUF_LEN, 1), ORB_EEXIST);       /* an id in use */
    assert_int_equal(raw_map(&r, 2, unsealed, 0, BUF_LEN, 1), ORB_EPERM);    /* could shrink under the source */
    assert_int_equal(raw_map(&r, 3, good, 0, 2 * BUF_LEN, 0), ORB_EINVAL);   /* past the file's end */
    assert_int_equal(raw_map(&r, 4, good, BUF_LEN, 4096, 0), ORB_EINVAL);    /* at the file's end */
    /* A buffer the source refused was never mapped: requests naming it are refused. */
    assert_int_equal(raw_request(&r, ORB_OP_READ, 2, 0, f->rw, 4096, f->rw, 4096), ORB_EINVAL);
    assert_int_equal(raw_request(&r, ORB_OP_READ, 3, 0, f->rw, 4096, f->rw, 4096), ORB_EINVAL);
    /* The connection still serves. */
    assert_int_equal(raw_request(&r, ORB_OP_READ, 1, 0, f->rw, 4096, f->rw, 4096), 0);
    /* An id outside the table is a malformed MAP: the connection ends. */
    struct orb_shm_map mm = {.map_id = 1, .writable = 0, .file_offset = 0, .length = 4096};
    uint8_t msg[ORB_SHM_MAP_LEN];
    size_t n = 0;
    assert_int_equal(orb_shm_map_encode(&mm, msg, sizeof msg, &n), 0);
    uint32_t id = ORB_SHM_MAPS_MAX + 1;
    memcpy(msg + 4, &id, sizeof id); /* little-endian hosts only run this test */
    assert_int_equal(shm_sock_send(r.sock, msg, n, good, orb_deadline_after(SEC)), 0);
    assert_ended(r.sock, "a MAP naming an id outside the table");
    r.sock = -1;
    close(good);
    close(unsealed);
    raw_close(&r);
}

static void test_forged_requests(void **state)
{
    struct fx *f = *state;
    struct raw r;
    raw_open(f, &r);
    int fd = memory_file(BUF_LEN, 1);
    uint8_t *mine = mmap(NULL, BUF_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(mine != MAP_FAILED);
    pattern(mine, BUF_LEN, 9);
    assert_int_equal(raw_map(&r, 1, fd, 0, BUF_LEN, 1), 0); /* writable: READs land here */
    assert_int_equal(raw_map(&r, 2, fd, 0, BUF_LEN, 0), 0); /* read-only: WRITEs come from here */

    /* Refused, each changing nothing anywhere. */
    struct {
        const char *what;
        uint8_t op;
        uint32_t map;
        uint64_t map_offset;
        const uint8_t *remote;
        uint64_t len;
        const uint8_t *request;
        uint64_t request_len;
        int want;
    } cases[] = {
        {"READ into the read-only buffer", ORB_OP_READ, 2, 0, f->rw, 4096, f->rw, 4096, ORB_EPERM},
        {"a buffer never handed over", ORB_OP_WRITE, 7, 0, f->rw, 4096, f->rw, 4096, ORB_EINVAL},
        {"past the buffer's end", ORB_OP_READ, 1, BUF_LEN - 4095, f->rw, 4096, f->rw, 4096, ORB_EINVAL},
        {"one byte past the registration", ORB_OP_WRITE, 2, 0, f->rw + RW_LEN - 4095, 4096,
         f->rw + RW_LEN - 4095, 4096, ORB_ENOENT},
        {"one byte before the registration", ORB_OP_READ, 1, 0, f->rw - 1, 16, f->rw - 1, 16, ORB_ENOENT},
        {"a piece inside, its request not", ORB_OP_WRITE, 2, 0, f->rw, 4096, f->rw, (uint64_t)RW_LEN + 1,
         ORB_ENOENT},
        {"WRITE into a read-only registration", ORB_OP_WRITE, 2, 0, f->ro, 4096, f->ro, 4096, ORB_EPERM},
        {"a local-only registration", ORB_OP_READ, 1, 0, f->local, 4096, f->local, 4096, ORB_ENOENT},
        {"memory nobody registered", ORB_OP_READ, 1, 0, mine, 4096, mine, 4096, ORB_ENOENT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = raw_request(&r, cases[i].op, cases[i].map, cases[i].map_offset, cases[i].remote, cases[i].len,
                             cases[i].request, cases[i].request_len);
        if (rc != cases[i].want)
            fail_msg("%s: status %d, want %d", cases[i].what, rc, cases[i].want);
        check_pattern(f->rw, RW_LEN, 1, cases[i].what);
        check_pattern(f->ro, RO_LEN, 2, cases[i].what);
        check_pattern(f->local, RO_LEN, 3, cases[i].what);
        check_pattern(mine, BUF_LEN, 9, cases[i].what);
    }
    /* The exact ranges move, both ways, at any offset. */
    assert_int_equal(raw_request(&r, ORB_OP_READ, 1, 100, f->rw + 7, 5000, f->rw, RW_LEN), 0);
    assert_memory_equal(mine + 100, f->rw + 7, 5000);
    assert_int_equal(raw_request(&r, ORB_OP_WRITE, 2, 0, f->rw + RW_LEN - 4096, 4096, f->rw + RW_LEN - 4096, 4096),
                     0);
    assert_memory_equal(f->rw + RW_LEN - 4096, mine, 4096);
    /* After UNMAP the buffer is gone for requests. */
    uint8_t msg[ORB_SHM_UNMAP_LEN];
    size_t n = 0;
    assert_int_equal(orb_shm_unmap_encode(1, msg, sizeof msg, &n), 0);
    assert_int_equal(shm_sock_send(r.sock, msg, n, -1, orb_deadline_after(SEC)), 0);
    uint64_t deadline = orb_deadline_after(3 * SEC);
    int rc;
    while ((rc = raw_request(&r, ORB_OP_READ, 1, 0, f->rw, 16, f->rw, 16)) == 0 && orb_now_ns() < deadline)
        usleep(1000); /* the socket and the ring are two paths: UNMAP may take a moment */
    assert_int_equal(rc, ORB_EINVAL);

    /* A malformed entry (an unknown operation) ends the connection. */
    uint8_t entry[ORB_SH_RING_ENTRY];
    struct orb_shm_request rq = {.tag = 1, .op = ORB_OP_READ, .map_id = 2, .remote_addr = (uint64_t)(uintptr_t)f->rw,
                                 .length = 16, .request_addr = (uint64_t)(uintptr_t)f->rw, .request_length = 16};
    assert_int_equal(orb_shm_request_encode(&rq, entry), 0);
    entry[8] = 7;
    assert_int_equal(orb_sh_ring_push(&r.req, entry), 0);
    assert_ended(r.sock, "a malformed request");
    r.sock = -1;
    munmap(mine, BUF_LEN);
    close(fd);
    raw_close(&r);
}

static void test_impossible_ring_index(void **state)
{
    struct fx *f = *state;
    struct raw r;
    raw_open(f, &r);
    /* The request ring's tail (its first word) 1000 entries ahead of a 16-entry ring. */
    _Atomic uint32_t *tail = (_Atomic uint32_t *)(void *)r.rings;
    atomic_store(tail, 1000);
    orb_sh_ring_wake(&r.req);
    assert_ended(r.sock, "an impossible request index");
    r.sock = -1;
    raw_close(&r);
    /* The source still serves others. */
    raw_open(f, &r);
    int fd = memory_file(BUF_LEN, 1);
    assert_int_equal(raw_map(&r, 1, fd, 0, BUF_LEN, 1), 0);
    assert_int_equal(raw_request(&r, ORB_OP_READ, 1, 0, f->rw, 4096, f->rw, 4096), 0);
    close(fd);
    raw_close(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_proof_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_strangers_cannot_keep_a_requester_out, setup_budgets, teardown),
        cmocka_unit_test_setup_teardown(test_setup_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_forged_maps, setup, teardown),
        cmocka_unit_test_setup_teardown(test_forged_requests, setup, teardown),
        cmocka_unit_test_setup_teardown(test_impossible_ring_index, setup, teardown),
    };
    return cmocka_run_group_tests_name("shm_hostile", tests, NULL, NULL);
}
