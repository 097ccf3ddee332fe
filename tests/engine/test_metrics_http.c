/* The Prometheus exporter (ORB_ENGINE_PARAM_METRICS) from outside, over HTTP: GET /metrics
 * answers with text that follows the exposition format and whose values move with the traffic;
 * other paths and methods are refused; bad addresses and one in use are refused by name; close
 * stops the server; without libmicrohttpd the engine is refused, naming it. Linked with the static
 * library for the one internal hook it needs (which library to load). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/metrics_http.h"
#include "util.h"

static orb_engine *engine_serving(const char *address, int *rc_out)
{
    struct orb_engine_params p = {.field_mask = ORB_ENGINE_PARAM_METRICS, .metrics_address = address};
    orb_engine *e = NULL;
    *rc_out = orb_engine_create_params(&p, &e);
    return e;
}

/* One HTTP/1.0 exchange with 127.0.0.1:port (or another host); the whole answer, NUL-terminated
 * (the caller frees), or NULL when the connection was refused. */
static char *http(const char *address, const char *request)
{
    char host[64];
    snprintf(host, sizeof host, "%s", address);
    char *colon = strrchr(host, ':');
    assert_non_null(colon);
    *colon = '\0';
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
    assert_int_equal(inet_pton(AF_INET, host, &sa.sin_addr), 1);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return NULL;
    }
    size_t rl = strlen(request);
    assert_int_equal(send(fd, request, rl, MSG_NOSIGNAL), (ssize_t)rl);
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    assert_non_null(buf);
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        assert_true(poll(&p, 1, 10000) == 1); /* an answer within 10 s */
        if (len + 4096 > cap) {
            cap *= 2;
            buf = realloc(buf, cap);
            assert_non_null(buf);
        }
        ssize_t n = recv(fd, buf + len, cap - len - 1, 0);
        assert_true(n >= 0);
        if (n == 0)
            break;
        len += (size_t)n;
    }
    close(fd);
    buf[len] = '\0';
    return buf;
}

/* The value of the sample line that starts with `series` followed by a space, or -1. */
static double sample(const char *body, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = body; p != NULL && *p != '\0'; p = strchr(p, '\n'), p = p != NULL ? p + 1 : NULL) {
        if (strncmp(p, series, n) == 0 && p[n] == ' ')
            return strtod(p + n + 1, NULL);
    }
    return -1;
}

/* Every line is a comment (# HELP / # TYPE) or "name[{labels}] value", the format's two forms. */
static void assert_exposition_format(const char *body)
{
    int samples = 0;
    for (const char *line = body; *line != '\0';) {
        const char *end = strchr(line, '\n');
        assert_non_null(end); /* every line ends with a newline */
        if (strncmp(line, "# HELP ", 7) == 0 || strncmp(line, "# TYPE ", 7) == 0) {
            line = end + 1;
            continue;
        }
        const char *p = line;
        assert_true((*p >= 'a' && *p <= 'z') || *p == '_');
        while ((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_')
            p++;
        if (*p == '{') {
            const char *close = memchr(p, '}', (size_t)(end - p));
            assert_non_null(close);
            p = close + 1;
        }
        assert_int_equal(*p, ' ');
        char *num_end = NULL;
        (void)strtod(p + 1, &num_end);
        assert_ptr_equal(num_end, end);
        samples++;
        line = end + 1;
    }
    assert_true(samples > 50);
}

static void test_metrics_over_http(void **state)
{
    (void)state;
    int rc;
    orb_engine *src = engine_serving(NULL, &rc); /* NULL: loopback, any port */
    if (rc != 0)
        fail_msg("engine with metrics: %s", orb_last_error());
    char address[ORB_ENDPOINT_MAX];
    assert_int_equal(orb_engine_metrics_address(src, address, sizeof address), 0);
    assert_int_equal(strncmp(address, "127.0.0.1:", 10), 0);
    assert_true(atoi(address + 10) > 0);
    char tiny[4];
    assert_int_equal(orb_engine_metrics_address(src, tiny, sizeof tiny), ORB_EINVAL);

    orb_engine *req = eu_requester(2, 0);
    struct eu_region r, l;
    eu_region_new(src, 1 << 20, ORB_PERM_REMOTE_WRITE, 1, &r);
    eu_region_new(req, 1 << 20, ORB_PERM_LOCAL, 2, &l);
    orb_segment *seg = eu_open(req, src);
    char *before = http(address, "GET /metrics HTTP/1.0\r\n\r\n");
    assert_non_null(before);
    struct orb_request reqs[4];
    for (int i = 0; i < 4; i++)
        reqs[i] = eu_req(ORB_OP_WRITE, l.base + i * 4096, r.base + i * 4096, 4096);
    struct orb_batch_report rep;
    assert_int_equal(orb_submit_and_wait(req, seg, reqs, 4, NULL, 30 * EU_SEC, &rep), 0);
    char *after = http(address, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    assert_non_null(after);
    assert_non_null(strstr(after, "200 OK"));
    assert_non_null(strstr(after, "text/plain; version=0.0.4"));
    char *body = strstr(after, "\r\n\r\n");
    assert_non_null(body);
    body += 4;
    assert_exposition_format(body);
    const char *served = "orbite_served_requests_total{transport=\"tcp\",op=\"write\"}";
    const char *served_bytes = "orbite_served_bytes_total{transport=\"tcp\",op=\"write\"}";
    double before_n = sample(strstr(before, "\r\n\r\n") + 4, served);
    assert_true(before_n >= 0);
    assert_true(sample(body, served) - before_n == 4);
    assert_true(sample(body, served_bytes) >= 4 * 4096);
    assert_true(sample(body, "orbite_registrations") == 1);
    assert_true(sample(body, "orbite_helper_up") == 0);
    assert_true(sample(body, "orbite_failures_total{status=\"ORB_ENOENT\"}") == 0);
    assert_true(sample(body, "orbite_batch_duration_seconds_bucket{le=\"+Inf\"}") ==
                sample(body, "orbite_batch_duration_seconds_count"));
    assert_non_null(strstr(body, "# TYPE orbite_batch_duration_seconds histogram\n"));
    free(before);
    free(after);

    /* Anything else is refused, and the server keeps serving. */
    char *nf = http(address, "GET /other HTTP/1.0\r\n\r\n");
    assert_non_null(strstr(nf, "404"));
    free(nf);
    char *post = http(address, "POST /metrics HTTP/1.0\r\nContent-Length: 5\r\n\r\nhello");
    assert_non_null(strstr(post, "405"));
    free(post);
    char *junk = http(address, "\x01\x02 not http at all\r\n\r\n");
    free(junk); /* whatever the answer, the server lives on: */
    char *again = http(address, "GET /metrics HTTP/1.0\r\n\r\n");
    assert_non_null(strstr(again, "200 OK"));
    free(again);

    /* A second engine cannot take the same address. */
    orb_engine *clash = engine_serving(address, &rc);
    assert_null(clash);
    assert_int_equal(rc, ORB_EUNAVAILABLE);
    assert_non_null(strstr(orb_last_error(), address));

    orb_segment_close(seg);
    eu_region_free(req, &l);
    eu_region_free(src, &r);
    orb_engine_free(req);
    /* Close stops the server. */
    assert_int_equal(orb_engine_close(src, 5 * EU_SEC), 0);
    assert_null(http(address, "GET /metrics HTTP/1.0\r\n\r\n"));
    assert_int_equal(orb_engine_metrics_address(src, address, sizeof address), ORB_EUNAVAILABLE);
    orb_engine_free(src);
}

static void test_addresses(void **state)
{
    (void)state;
    const char *bad[] = {"localhost:9464", "127.0.0.1", "127.0.0.1:", "127.0.0.1:http", "999.1.1.1:80",
                         ":80", "[::1:80", "127.0.0.1:75000", "127.0.0.1:65536", "127.0.0.1:4294977761",
                         "127.0.0.1:+9466", "127.0.0.1: 9465", "127.0.0.1:-1", "127.0.0.1:0x10", "127.0.0.1:094640"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc;
        orb_engine *e = engine_serving(bad[i], &rc);
        if (e != NULL)
            fail_msg("served metrics on \"%s\"", bad[i]);
        assert_int_equal(rc, ORB_EINVAL);
    }
    /* IPv6 loopback, where the host has it. */
    int rc;
    orb_engine *e = engine_serving("[::1]:0", &rc);
    if (e != NULL) {
        char address[ORB_ENDPOINT_MAX];
        assert_int_equal(orb_engine_metrics_address(e, address, sizeof address), 0);
        assert_int_equal(strncmp(address, "[::1]:", 6), 0);
        orb_engine_free(e);
    } else {
        assert_int_equal(rc, ORB_EUNAVAILABLE);
    }
    /* Unknown bits are refused before anything starts. */
    struct orb_engine_params p = {.field_mask = 1ull << 40};
    assert_int_equal(orb_engine_create_params(&p, &e), ORB_EINVAL);
}

static void test_without_the_library(void **state)
{
    (void)state;
    /* In a child: which library to load is decided once per process. */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        orb_metrics_http_use_library("libmicrohttpd-not-here.so.99");
        int rc;
        orb_engine *e = engine_serving("127.0.0.1:0", &rc);
        int ok = e == NULL && rc == ORB_EUNAVAILABLE && strstr(orb_last_error(), "libmicrohttpd-not-here.so.99") != NULL;
        if (!ok)
            fprintf(stderr, "rc %d: %s\n", rc, orb_last_error());
        /* The engine's own metrics still work without the server. */
        orb_engine *plain = eu_engine(NULL);
        struct orb_metrics m;
        ok = ok && orb_engine_metrics(plain, &m) == 0;
        orb_engine_free(plain);
        _exit(ok ? 0 : 1);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_without_the_library),
        cmocka_unit_test(test_metrics_over_http),
        cmocka_unit_test(test_addresses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
