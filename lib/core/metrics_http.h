/* Internal: the engine's Prometheus exporter, an HTTP server (libmicrohttpd, loaded with dlopen
 * when an engine asks for it) answering GET /metrics with the engine's metrics. */
#ifndef ORB_CORE_METRICS_HTTP_H
#define ORB_CORE_METRICS_HTTP_H

#include <stddef.h>

#include <orbite/orbite.h>

struct orb_metrics_http;

/* Serve `engine`'s metrics on `address` ("host:port" with a numeric host, IPv6 in brackets; port
 * 0 picks a free one). Errors: ORB_EINVAL (the address), ORB_EUNAVAILABLE (libmicrohttpd cannot be
 * loaded or lacks a call, this library was built without it, or the address cannot be bound: the
 * message says which), ORB_ENOMEM. */
int orb_metrics_http_start(orb_engine *engine, const char *address, struct orb_metrics_http **out);

/* The bound address, "host:port". */
const char *orb_metrics_http_address(const struct orb_metrics_http *h);

/* Stop serving and free; waits for a request being answered. NULL does nothing. */
void orb_metrics_http_stop(struct orb_metrics_http *h);

/* Tests: load `name` instead of libmicrohttpd.so.12 from now on (before the first start). */
void orb_metrics_http_use_library(const char *name);

#endif
