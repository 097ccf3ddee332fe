/* The Prometheus exporter: libmicrohttpd, loaded with dlopen once per process when an engine asks
 * for it (every call it needs, or none), serving GET /metrics from its own thread. */
#include "core/metrics_http.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"
#include "core/dynlib.h"
#include "core/error.h"
#include "core/log.h"
#include "core/metrics_text.h"

#ifndef ORB_HAVE_MICROHTTPD

struct orb_metrics_http {
    char address[1];
};

int orb_metrics_http_start(orb_engine *engine, const char *address, struct orb_metrics_http **out)
{
    (void)engine;
    (void)address;
    (void)out;
    return orb_fail(ORB_EUNAVAILABLE, "metrics: this liborbite was built without libmicrohttpd (its headers, "
                    "libmicrohttpd-dev, were missing at build time)");
}

const char *orb_metrics_http_address(const struct orb_metrics_http *h)
{
    (void)h;
    return "";
}

void orb_metrics_http_stop(struct orb_metrics_http *h)
{
    (void)h;
}

void orb_metrics_http_use_library(const char *name)
{
    (void)name;
}

#else

#include <arpa/inet.h>
#include <microhttpd.h>
#include <stddef.h>
#include <netdb.h>
#include <pthread.h>
#include <sys/socket.h>

#define MHD_LIBRARY "libmicrohttpd.so.12"
#define CONNECTIONS_MAX 16u     /* scrapers at once */
#define CONNECTION_TIMEOUT_S 5u /* a scraper that stops talking is dropped */

/* The calls used, resolved from the library (the header gives only their types). */
static struct mhd_calls {
    __typeof__(MHD_start_daemon) *start_daemon;
    __typeof__(MHD_stop_daemon) *stop_daemon;
    __typeof__(MHD_get_daemon_info) *get_daemon_info;
    __typeof__(MHD_create_response_from_buffer) *create_response_from_buffer;
    __typeof__(MHD_add_response_header) *add_response_header;
    __typeof__(MHD_queue_response) *queue_response;
    __typeof__(MHD_destroy_response) *destroy_response;
} mhd;
#define CALL(field, export) {#export, offsetof(struct mhd_calls, field), true}
static const struct orb_dl_symbol mhd_symbols[] = {
    CALL(start_daemon, MHD_start_daemon),
    CALL(stop_daemon, MHD_stop_daemon),
    CALL(get_daemon_info, MHD_get_daemon_info),
    CALL(create_response_from_buffer, MHD_create_response_from_buffer),
    CALL(add_response_header, MHD_add_response_header),
    CALL(queue_response, MHD_queue_response),
    CALL(destroy_response, MHD_destroy_response),
};
#undef CALL
static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static const char *library_name = MHD_LIBRARY;
static char load_error[256];
static int loaded;

static void load(void)
{
    void *handle = NULL;
    if (orb_dl_open("metrics", library_name, mhd_symbols, sizeof mhd_symbols / sizeof mhd_symbols[0], &mhd,
                    sizeof mhd, NULL, &handle) != 0) {
        snprintf(load_error, sizeof load_error, "%s", orb_last_error());
        return;
    }
    loaded = 1; /* kept loaded for the process's lifetime */
}

void orb_metrics_http_use_library(const char *name)
{
    library_name = name;
}

struct orb_metrics_http {
    orb_engine *engine;
    struct MHD_Daemon *daemon;
    char address[ORB_ENDPOINT_MAX];
};

static enum MHD_Result answer(struct MHD_Connection *c, unsigned status, const char *type, char *body, size_t len)
{
    struct MHD_Response *r = mhd.create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (r == NULL) {
        free(body);
        return MHD_NO;
    }
    (void)mhd.add_response_header(r, "Content-Type", type);
    enum MHD_Result rc = mhd.queue_response(c, status, r);
    mhd.destroy_response(r);
    return rc;
}

static enum MHD_Result plain(struct MHD_Connection *c, unsigned status, const char *text)
{
    char *body = strdup(text);
    if (body == NULL)
        return MHD_NO;
    return answer(c, status, "text/plain; charset=utf-8", body, strlen(body));
}

/* One request (the server's thread). Only GET /metrics (and HEAD) is served; the body a client
 * sends is never read. */
static enum MHD_Result serve(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                             const char *version, const char *upload, size_t *upload_size, void **state)
{
    (void)version;
    (void)upload;
    (void)state;
    struct orb_metrics_http *h = cls;
    if (*upload_size != 0) {
        *upload_size = 0; /* a body is not for us: dropped unread */
        return MHD_YES;
    }
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
        return plain(c, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET /metrics is served here\n");
    if (strcmp(url, "/metrics") != 0)
        return plain(c, MHD_HTTP_NOT_FOUND, "not found: the metrics are at /metrics\n");
    char *text = NULL;
    size_t len = 0;
    if (orb_metrics_prometheus(h->engine, &text, &len) != 0)
        return plain(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "the metrics could not be read\n");
    return answer(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", text, len);
}

/* "host:port" with a numeric host ([v6] in brackets) into *ss: split as engine endpoints are
 * (a port of 1-5 decimal digits up to 65535; getaddrinfo() alone would take signs and spaces
 * and keep a port's low 16 bits), then resolved numerically. */
static int parse_address(const char *address, struct sockaddr_storage *ss, socklen_t *sl)
{
    char h[ORB_ENDPOINT_MAX], port[8];
    uint16_t pv = 0;
    if (address == NULL)
        return orb_fail(ORB_EINVAL, "metrics: no address");
    if (orb_endpoint_split(address, h, sizeof h, &pv) != 0)
        return orb_fail(ORB_EINVAL, "metrics: address \"%s\": %s", address, orb_last_error());
    snprintf(port, sizeof port, "%u", (unsigned)pv);
    struct addrinfo hints = {.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE, .ai_socktype = SOCK_STREAM};
    struct addrinfo *ai = NULL;
    int rc = getaddrinfo(h, port, &hints, &ai);
    if (rc != 0 || ai == NULL || ai->ai_addrlen > sizeof *ss)
        return orb_fail(ORB_EINVAL, "metrics: address \"%s\" is not a numeric host and port (%s)", address,
                        rc != 0 ? gai_strerror(rc) : "no address");
    memcpy(ss, ai->ai_addr, ai->ai_addrlen);
    *sl = ai->ai_addrlen;
    freeaddrinfo(ai);
    return 0;
}

int orb_metrics_http_start(orb_engine *engine, const char *address, struct orb_metrics_http **out)
{
    struct sockaddr_storage ss;
    socklen_t sl = 0;
    int rc = parse_address(address, &ss, &sl);
    if (rc != 0)
        return rc;
    pthread_once(&load_once, load);
    if (!loaded)
        return orb_fail(ORB_EUNAVAILABLE, "%s (Debian: libmicrohttpd12)", load_error);
    struct orb_metrics_http *h = calloc(1, sizeof *h);
    if (h == NULL)
        return orb_fail(ORB_ENOMEM, "metrics: no memory for the exporter");
    h->engine = engine;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL;
    if (ss.ss_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    h->daemon = mhd.start_daemon(flags, 0, NULL, NULL, serve, h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                                 MHD_OPTION_CONNECTION_LIMIT, CONNECTIONS_MAX, MHD_OPTION_CONNECTION_TIMEOUT,
                                 CONNECTION_TIMEOUT_S, MHD_OPTION_END);
    if (h->daemon == NULL) {
        free(h);
        return orb_fail(ORB_EUNAVAILABLE, "metrics: cannot serve on %s (in use, or not an address of this host)",
                        address);
    }
    /* The bound port (port 0 asked for any). */
    const union MHD_DaemonInfo *info = mhd.get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
    unsigned port = info != NULL ? info->port : 0;
    char host[INET6_ADDRSTRLEN] = "";
    if (ss.ss_family == AF_INET6)
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, host, sizeof host);
    else
        inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, host, sizeof host);
    snprintf(h->address, sizeof h->address, ss.ss_family == AF_INET6 ? "[%s]:%u" : "%s:%u", host, port);
    ORB_LOGI("metrics: serving http://%s/metrics", h->address);
    *out = h;
    return 0;
}

const char *orb_metrics_http_address(const struct orb_metrics_http *h)
{
    return h != NULL ? h->address : "";
}

void orb_metrics_http_stop(struct orb_metrics_http *h)
{
    if (h == NULL)
        return;
    mhd.stop_daemon(h->daemon); /* joins its thread: no request is being answered afterwards */
    free(h);
}

#endif
