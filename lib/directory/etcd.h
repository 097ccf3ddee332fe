/* Internal: a client of etcd v3's HTTP gateway (JSON over HTTP POST), on libcurl loaded with
 * dlopen once per process (every call it needs, or none). Each call makes its own connection
 * and has its own deadline; the endpoints are tried in turn, starting with the last that
 * answered. Thread-safe. */
#ifndef ORB_DIRECTORY_ETCD_H
#define ORB_DIRECTORY_ETCD_H

#include <jansson.h>
#include <stdint.h>

struct orb_etcd;

struct orb_etcd_params {
    const char *endpoints;   /* comma-separated http:// or https:// URLs */
    const char *ca_file, *cert_file, *key_file, *username, *password; /* NULL: none */
};

/* A client (no exchange yet). Errors: ORB_EINVAL (no endpoint, a URL that is not http(s)://),
 * ORB_EUNAVAILABLE (no libcurl), ORB_ENOMEM. */
int orb_etcd_new(const struct orb_etcd_params *p, struct orb_etcd **out);
void orb_etcd_free(struct orb_etcd *e);

/* POST `body` (borrowed) to `path` ("/v3/kv/range", ...) and parse the answer into *reply (the
 * caller decrefs). An answer with an error is the call's failure. Errors: ORB_EPEER (no endpoint
 * answered, an HTTP or etcd error: the message names the endpoint and the cause; a refused
 * authentication), ORB_ETIMEDOUT (deadline, CLOCK_MONOTONIC ns), ORB_EPROTO (not JSON),
 * ORB_ENOMEM. */
int orb_etcd_call(struct orb_etcd *e, const char *path, json_t *body, uint64_t deadline, json_t **reply);

/* Watch `key` (raw bytes, `key_len`) from revision `start` (0: from now) until the first event,
 * or `deadline`: *event (the caller decrefs) is etcd's event object ({"type"?, "kv": {...}}).
 * Errors: ORB_ETIMEDOUT (no event), as orb_etcd_call otherwise. */
int orb_etcd_watch(struct orb_etcd *e, const uint8_t *key, size_t key_len, uint64_t start, uint64_t deadline,
                   json_t **event);

/* Tests: load `name` instead of libcurl.so.4 from now on (before the first client). */
void orb_etcd_use_library(const char *name);

#endif
