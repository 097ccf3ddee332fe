/* orbite-pingpong: round-trip time of a small message over loopback TCP.
 *
 * One process forks an echo server; the parent sends a message of --size bytes, waits for the
 * echo, and times each round trip with blocking sockets and TCP_NODELAY on both ends. It prints
 * the median (and p99, min, mean) round trip. With --spin both ends poll with non-blocking
 * receives instead of sleeping in recv(), which removes the scheduler wake-up from the figure.
 * Everything is bounded: an alarm ends both processes if the peer stops answering. */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SIZE_MAX_BYTES (1u << 20)
#define ITERS_MAX 10000000u
#define RUN_LIMIT_S 120

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int send_all(int fd, const uint8_t *buf, size_t len)
{
    while (len > 0) {
        ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Receive flags: 0 (block in recv) or MSG_DONTWAIT (--spin). */
static int recv_flags;

/* 1 when `len` bytes arrived, 0 on a clean end of stream before any byte, -1 on error. */
static int recv_all(int fd, uint8_t *buf, size_t len)
{
    size_t got = 0;
    while (got < len) {
        ssize_t n = recv(fd, buf + got, len - got, recv_flags);
        if (n == 0)
            return got == 0 ? 0 : -1;
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)
                continue;
            return -1;
        }
        got += (size_t)n;
    }
    return 1;
}

static void set_nodelay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* The echo side: answer every message until the client closes. */
static int serve(int listener, size_t size)
{
    int fd = accept(listener, NULL, NULL);
    close(listener);
    if (fd < 0)
        return 1;
    set_nodelay(fd);
    uint8_t *buf = malloc(size);
    if (buf == NULL)
        return 1;
    int rc;
    while ((rc = recv_all(fd, buf, size)) == 1) {
        if (send_all(fd, buf, size) != 0) {
            rc = -1;
            break;
        }
    }
    free(buf);
    close(fd);
    return rc == 0 ? 0 : 1;
}

static int compare_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a;
    uint64_t y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank quantile of an ascending array. */
static uint64_t quantile(const uint64_t *v, size_t n, double q)
{
    size_t rank = (size_t)(q * (double)n);
    if ((double)rank < q * (double)n)
        rank++;
    if (rank == 0)
        rank = 1;
    return v[rank - 1];
}

static int parse_count(const char *text, unsigned min, unsigned max, unsigned *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long v = strtoul(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || text[0] == '-' || v < min || v > max)
        return -1;
    *out = (unsigned)v;
    return 0;
}

static void usage(FILE *f)
{
    fputs("Usage: orbite-pingpong [--size BYTES] [--iters N] [--warmup N] [--spin] [--json]\n"
          "Round-trip time of BYTES-byte messages over loopback TCP (defaults: 64 bytes,\n"
          "20000 timed round trips after 1000 untimed ones, blocking receives; --spin polls).\n",
          f);
}

int main(int argc, char **argv)
{
    unsigned size = 64;
    unsigned iters = 20000;
    unsigned warmup = 1000;
    int json = 0;
    static const struct option options[] = {
        {"size", required_argument, NULL, 's'},   {"iters", required_argument, NULL, 'n'},
        {"warmup", required_argument, NULL, 'w'}, {"json", no_argument, NULL, 'j'},
        {"spin", no_argument, NULL, 'p'},         {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "s:n:w:jph", options, NULL)) != -1) {
        switch (c) {
        case 's':
            if (parse_count(optarg, 1, SIZE_MAX_BYTES, &size) != 0) {
                fprintf(stderr, "orbite-pingpong: --size must be 1..%u\n", SIZE_MAX_BYTES);
                return 2;
            }
            break;
        case 'n':
            if (parse_count(optarg, 1, ITERS_MAX, &iters) != 0) {
                fprintf(stderr, "orbite-pingpong: --iters must be 1..%u\n", ITERS_MAX);
                return 2;
            }
            break;
        case 'w':
            if (parse_count(optarg, 0, ITERS_MAX, &warmup) != 0) {
                fprintf(stderr, "orbite-pingpong: --warmup must be 0..%u\n", ITERS_MAX);
                return 2;
            }
            break;
        case 'j':
            json = 1;
            break;
        case 'p':
            recv_flags = MSG_DONTWAIT;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        usage(stderr);
        return 2;
    }

    int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = 0};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t addr_len = sizeof addr;
    if (listener < 0 || bind(listener, (struct sockaddr *)&addr, sizeof addr) != 0 ||
        listen(listener, 1) != 0 || getsockname(listener, (struct sockaddr *)&addr, &addr_len) != 0) {
        perror("orbite-pingpong: listen on 127.0.0.1");
        return 1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        perror("orbite-pingpong: fork");
        return 1;
    }
    alarm(RUN_LIMIT_S); /* both processes: a stuck peer cannot hang the run */
    if (pid == 0)
        _exit(serve(listener, size));
    close(listener);

    int rc = 1;
    uint8_t *buf = calloc(1, size);
    uint64_t *rtt = calloc(iters, sizeof *rtt);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (buf == NULL || rtt == NULL || fd < 0) {
        fprintf(stderr, "orbite-pingpong: out of resources\n");
        goto cleanup;
    }
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        perror("orbite-pingpong: connect");
        goto cleanup;
    }
    set_nodelay(fd);
    for (unsigned i = 0; i < warmup + iters; i++) {
        buf[0] = (uint8_t)i;
        uint64_t t0 = now_ns();
        if (send_all(fd, buf, size) != 0 || recv_all(fd, buf, size) != 1) {
            fprintf(stderr, "orbite-pingpong: round trip %u failed\n", i);
            goto cleanup;
        }
        uint64_t t1 = now_ns();
        if (buf[0] != (uint8_t)i) {
            fprintf(stderr, "orbite-pingpong: round trip %u echoed the wrong message\n", i);
            goto cleanup;
        }
        if (i >= warmup)
            rtt[i - warmup] = t1 - t0;
    }
    uint64_t sum = 0;
    for (unsigned i = 0; i < iters; i++)
        sum += rtt[i];
    qsort(rtt, iters, sizeof *rtt, compare_u64);
    double p50 = (double)quantile(rtt, iters, 0.50) / 1e3;
    double p99 = (double)quantile(rtt, iters, 0.99) / 1e3;
    double min = (double)rtt[0] / 1e3;
    double mean = (double)sum / iters / 1e3;
    if (json)
        printf("{\"size\":%u,\"iters\":%u,\"spin\":%s,\"rtt_p50_us\":%.3f,\"rtt_p99_us\":%.3f,"
               "\"rtt_min_us\":%.3f,\"rtt_mean_us\":%.3f}\n",
               size, iters, recv_flags ? "true" : "false", p50, p99, min, mean);
    else
        printf("%u-byte TCP round trip (%s receives) over %u iterations: p50 %.2f us, p99 %.2f us, "
               "min %.2f us, mean %.2f us\n",
               size, recv_flags ? "polling" : "blocking", iters, p50, p99, min, mean);
    rc = 0;

cleanup:
    if (fd >= 0)
        close(fd); /* the server sees end of stream and exits */
    free(buf);
    free(rtt);
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        if (rc == 0)
            fprintf(stderr, "orbite-pingpong: the echo server failed\n");
        rc = 1;
    }
    return rc;
}
