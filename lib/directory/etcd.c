/* etcd v3's HTTP gateway through libcurl, loaded with dlopen. */
#include "directory/etcd.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/dynlib.h"
#include "core/error.h"
#include "core/log.h"
#include "directory/entry.h"

#ifndef ORB_HAVE_CURL

int orb_etcd_new(const struct orb_etcd_params *p, struct orb_etcd **out)
{
    (void)p;
    (void)out;
    return orb_fail(ORB_EUNAVAILABLE, "directory: this liborbite was built without libcurl (its headers, "
                    "libcurl4-openssl-dev, were missing at build time)");
}

void orb_etcd_free(struct orb_etcd *e)
{
    (void)e;
}

int orb_etcd_call(struct orb_etcd *e, const char *path, json_t *body, uint64_t deadline, json_t **reply)
{
    (void)e;
    (void)path;
    (void)body;
    (void)deadline;
    (void)reply;
    return ORB_EUNAVAILABLE;
}

int orb_etcd_watch(struct orb_etcd *e, const uint8_t *key, size_t key_len, uint64_t start, uint64_t deadline,
                   json_t **event)
{
    (void)e;
    (void)key;
    (void)key_len;
    (void)start;
    (void)deadline;
    (void)event;
    return ORB_EUNAVAILABLE;
}

void orb_etcd_use_library(const char *name)
{
    (void)name;
}

#else

#include <curl/curl.h>
#include <stddef.h>

#define CURL_LIBRARY "libcurl.so.4"
#define REPLY_MAX (8u << 20)     /* an answer longer than this ends the call */
#define URLS_MAX 16u
#define URL_MAX 512u
#define TOKEN_MAX 512u

static struct curl_calls {
    __typeof__(curl_global_init) *global_init;
    __typeof__(curl_easy_init) *easy_init;
    __typeof__(curl_easy_setopt) *easy_setopt;
    __typeof__(curl_easy_perform) *easy_perform;
    __typeof__(curl_easy_getinfo) *easy_getinfo;
    __typeof__(curl_easy_cleanup) *easy_cleanup;
    __typeof__(curl_easy_strerror) *easy_strerror;
    __typeof__(curl_slist_append) *slist_append;
    __typeof__(curl_slist_free_all) *slist_free_all;
} cu;
#define CALL(field, export) {#export, offsetof(struct curl_calls, field), true}
static const struct orb_dl_symbol curl_symbols[] = {
    CALL(global_init, curl_global_init),     CALL(easy_init, curl_easy_init),
    CALL(easy_setopt, curl_easy_setopt),     CALL(easy_perform, curl_easy_perform),
    CALL(easy_getinfo, curl_easy_getinfo),   CALL(easy_cleanup, curl_easy_cleanup),
    CALL(easy_strerror, curl_easy_strerror), CALL(slist_append, curl_slist_append),
    CALL(slist_free_all, curl_slist_free_all),
};
#undef CALL
static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static const char *library_name = CURL_LIBRARY;
static char load_error[256];
static int loaded;

static void load(void)
{
    void *handle = NULL;
    if (orb_dl_open("directory", library_name, curl_symbols, sizeof curl_symbols / sizeof curl_symbols[0], &cu,
                    sizeof cu, NULL, &handle) != 0) {
        snprintf(load_error, sizeof load_error, "%s", orb_last_error());
        return;
    }
    /* Once per process, before any thread uses libcurl (7.84 and later make it thread-safe;
     * pthread_once serialises the callers here anyway). */
    if (cu.global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        snprintf(load_error, sizeof load_error, "directory: %s: curl_global_init failed", library_name);
        return;
    }
    loaded = 1;
}

void orb_etcd_use_library(const char *name)
{
    library_name = name;
}

struct orb_etcd {
    unsigned nurls;
    char urls[URLS_MAX][URL_MAX];
    char *ca_file, *cert_file, *key_file, *username, *password;
    pthread_mutex_t lock;        /* the two below */
    unsigned current;            /* the endpoint that answered last */
    char token[TOKEN_MAX];       /* the authentication token; "" none yet */
};

static char *dup_or_null(const char *s, int *failed)
{
    if (s == NULL)
        return NULL;
    char *d = strdup(s);
    if (d == NULL)
        *failed = 1;
    return d;
}

int orb_etcd_new(const struct orb_etcd_params *p, struct orb_etcd **out)
{
    if (p == NULL || p->endpoints == NULL || p->endpoints[0] == '\0')
        return orb_fail(ORB_EINVAL, "directory: no etcd endpoints");
    struct orb_etcd *e = calloc(1, sizeof *e);
    if (e == NULL)
        return orb_fail(ORB_ENOMEM, "directory: no memory for the etcd client");
    int rc = 0;
    for (const char *s = p->endpoints; rc == 0 && *s != '\0';) {
        const char *end = strchr(s, ',');
        size_t n = end != NULL ? (size_t)(end - s) : strlen(s);
        while (n > 0 && s[n - 1] == '/')
            n--; /* paths are appended */
        if (e->nurls == URLS_MAX)
            rc = orb_fail(ORB_EINVAL, "directory: more than %u etcd endpoints", URLS_MAX);
        else if (n == 0 || n >= URL_MAX || (strncmp(s, "http://", 7) != 0 && strncmp(s, "https://", 8) != 0))
            rc = orb_fail(ORB_EINVAL, "directory: etcd endpoint \"%.*s\" is not an http:// or https:// URL of at most "
                          "%u bytes", (int)(n < 80 ? n : 80), s, URL_MAX - 1);
        else
            memcpy(e->urls[e->nurls++], s, n);
        s = end != NULL ? end + 1 : s + strlen(s);
    }
    int failed = 0;
    e->ca_file = dup_or_null(p->ca_file, &failed);
    e->cert_file = dup_or_null(p->cert_file, &failed);
    e->key_file = dup_or_null(p->key_file, &failed);
    e->username = dup_or_null(p->username, &failed);
    e->password = dup_or_null(p->password, &failed);
    if (rc == 0 && failed)
        rc = orb_fail(ORB_ENOMEM, "directory: no memory for the etcd client");
    if (rc == 0 && (p->username == NULL) != (p->password == NULL))
        rc = orb_fail(ORB_EINVAL, "directory: a username needs a password, and a password a username");
    if (rc == 0) {
        pthread_once(&load_once, load);
        if (!loaded)
            rc = orb_fail(ORB_EUNAVAILABLE, "%s (Debian: libcurl4)", load_error);
    }
    if (rc != 0) {
        orb_etcd_free(e);
        return rc;
    }
    pthread_mutex_init(&e->lock, NULL);
    *out = e;
    return 0;
}

void orb_etcd_free(struct orb_etcd *e)
{
    if (e == NULL)
        return;
    free(e->ca_file);
    free(e->cert_file);
    free(e->key_file);
    free(e->username);
    if (e->password != NULL)
        memset(e->password, 0, strlen(e->password));
    free(e->password);
    free(e);
}

/* ---- one exchange ------------------------------------------------------------------------------ */

struct sink {
    char *buf;
    size_t len, cap;
    int overflow;
    /* Watching: the answer is a stream of JSON objects; stop at the first event. */
    int watching;
    json_t *event;
    int stream_error;
};

static size_t on_data(char *data, size_t size, size_t nmemb, void *arg)
{
    struct sink *s = arg;
    size_t n = size * nmemb;
    if (s->len + n + 1 > REPLY_MAX) {
        s->overflow = 1;
        return 0; /* ends the transfer */
    }
    if (s->len + n + 1 > s->cap) {
        size_t cap = (s->len + n + 1) * 2;
        char *b = realloc(s->buf, cap);
        if (b == NULL)
            return 0;
        s->buf = b;
        s->cap = cap;
    }
    memcpy(s->buf + s->len, data, n);
    s->len += n;
    s->buf[s->len] = '\0';
    if (!s->watching)
        return n;
    /* Each complete object: {"result": {...}}; the first with events ends the watch. */
    for (;;) {
        json_error_t err;
        json_t *doc = json_loadb(s->buf, s->len, JSON_DISABLE_EOF_CHECK, &err);
        if (doc == NULL)
            return n; /* not whole yet */
        size_t used = err.position;
        memmove(s->buf, s->buf + used, s->len - used);
        s->len -= used;
        s->buf[s->len] = '\0';
        json_t *result = json_object_get(doc, "result");
        json_t *events = json_object_get(result, "events");
        if (json_object_get(doc, "error") != NULL || json_is_true(json_object_get(result, "canceled"))) {
            s->stream_error = 1;
            json_decref(doc);
            return 0;
        }
        if (json_is_array(events) && json_array_size(events) > 0) {
            s->event = json_incref(json_array_get(events, 0));
            json_decref(doc);
            return 0; /* enough: end the stream */
        }
        json_decref(doc);
        while (s->len > 0 && (s->buf[0] == '\n' || s->buf[0] == '\r' || s->buf[0] == ' '))
            memmove(s->buf, s->buf + 1, s->len--);
        if (s->len == 0)
            return n;
    }
}

/* POST to one URL. 0 with the answer in *sink and *http_status; ORB_EPEER (connection), or
 * ORB_ETIMEDOUT. */
static int post(struct orb_etcd *e, const char *url, const char *body, const char *token, uint64_t deadline,
                struct sink *sink, long *http_status)
{
    uint64_t now = orb_now_ns();
    if (now >= deadline)
        return orb_fail(ORB_ETIMEDOUT, "directory: the deadline passed before %s was asked", url);
    long ms = (long)((deadline - now + 999999u) / 1000000u);
    CURL *h = cu.easy_init();
    if (h == NULL)
        return orb_fail(ORB_ENOMEM, "directory: curl_easy_init failed");
    struct curl_slist *headers = cu.slist_append(NULL, "Content-Type: application/json");
    char auth[TOKEN_MAX + 32];
    if (headers != NULL && token != NULL && token[0] != '\0') {
        snprintf(auth, sizeof auth, "Authorization: %s", token);
        struct curl_slist *more = cu.slist_append(headers, auth);
        if (more != NULL)
            headers = more;
    }
    cu.easy_setopt(h, CURLOPT_URL, url);
    cu.easy_setopt(h, CURLOPT_POSTFIELDS, body);
    cu.easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    cu.easy_setopt(h, CURLOPT_HTTPHEADER, headers);
    cu.easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    cu.easy_setopt(h, CURLOPT_WRITEDATA, sink);
    cu.easy_setopt(h, CURLOPT_TIMEOUT_MS, ms);
    cu.easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, ms);
    cu.easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    cu.easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
    if (e->ca_file != NULL)
        cu.easy_setopt(h, CURLOPT_CAINFO, e->ca_file);
    if (e->cert_file != NULL)
        cu.easy_setopt(h, CURLOPT_SSLCERT, e->cert_file);
    if (e->key_file != NULL)
        cu.easy_setopt(h, CURLOPT_SSLKEY, e->key_file);
    CURLcode c = cu.easy_perform(h);
    long status = 0;
    cu.easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    cu.easy_cleanup(h);
    cu.slist_free_all(headers);
    *http_status = status;
    if (c == CURLE_OK || (c == CURLE_WRITE_ERROR && sink->watching && sink->event != NULL && !sink->overflow))
        return 0;
    if (sink->overflow)
        return orb_fail(ORB_EPROTO, "directory: %s answered more than %u bytes", url, REPLY_MAX);
    if (c == CURLE_OPERATION_TIMEDOUT)
        return orb_fail(ORB_ETIMEDOUT, "directory: %s did not answer in time", url);
    if (sink->watching && sink->stream_error)
        return orb_fail(ORB_EPEER, "directory: %s ended the watch with an error", url);
    return orb_fail(ORB_EPEER, "directory: %s: %s", url, cu.easy_strerror(c));
}

/* The grpc-gateway's error object ({"error", "code", "message"}), if the answer is one. */
static const char *gateway_error(json_t *doc, int *code)
{
    json_t *msg = json_object_get(doc, "message");
    if (msg == NULL)
        msg = json_object_get(doc, "error");
    json_t *c = json_object_get(doc, "code");
    if (!json_is_integer(c) || !json_is_string(msg))
        return NULL;
    *code = (int)json_integer_value(c);
    return json_string_value(msg);
}

/* Take a token with the credentials (lock not held). */
static int authenticate(struct orb_etcd *e, uint64_t deadline);

/* One exchange, over the endpoints in turn. */
static int exchange(struct orb_etcd *e, const char *path, const char *body, uint64_t deadline, int watching,
                    json_t **reply, int may_authenticate)
{
    pthread_mutex_lock(&e->lock);
    unsigned first = e->current;
    char token[TOKEN_MAX];
    snprintf(token, sizeof token, "%s", e->token);
    pthread_mutex_unlock(&e->lock);
    if (may_authenticate && e->username != NULL && token[0] == '\0') {
        int rc = authenticate(e, deadline);
        if (rc != 0)
            return rc;
        pthread_mutex_lock(&e->lock);
        snprintf(token, sizeof token, "%s", e->token);
        pthread_mutex_unlock(&e->lock);
    }
    int rc = ORB_EPEER;
    char why[512] = "";
    for (unsigned k = 0; k < e->nurls; k++) {
        unsigned i = (first + k) % e->nurls;
        char url[URL_MAX + 64];
        snprintf(url, sizeof url, "%s%s", e->urls[i], path);
        struct sink sink = {.watching = watching};
        long status = 0;
        rc = post(e, url, body, token, deadline, &sink, &status);
        if (rc == 0 && watching) {
            if (sink.event == NULL)
                rc = orb_fail(ORB_ETIMEDOUT, "directory: no change within the deadline");
            *reply = sink.event;
            free(sink.buf);
            if (rc == 0) {
                pthread_mutex_lock(&e->lock);
                e->current = i;
                pthread_mutex_unlock(&e->lock);
            }
            return rc;
        }
        if (rc == 0) {
            json_error_t err;
            json_t *doc = sink.buf != NULL ? json_loadb(sink.buf, sink.len, 0, &err) : NULL;
            free(sink.buf);
            int code = 0;
            const char *message = doc != NULL ? gateway_error(doc, &code) : NULL;
            if (doc == NULL) {
                rc = orb_fail(ORB_EPROTO, "directory: %s answered HTTP %ld without JSON", url, status);
            } else if (message != NULL && code == 16 && may_authenticate && e->username != NULL) {
                /* UNAUTHENTICATED: the token expired; take a new one and ask again, once. */
                json_decref(doc);
                pthread_mutex_lock(&e->lock);
                e->token[0] = '\0';
                pthread_mutex_unlock(&e->lock);
                return exchange(e, path, body, deadline, watching, reply, 0);
            } else if (message != NULL || status != 200) {
                rc = orb_fail(ORB_EPEER, "directory: %s refused: %s (HTTP %ld, code %d)", url,
                              message != NULL ? message : "no message", status, code);
                json_decref(doc);
            } else {
                pthread_mutex_lock(&e->lock);
                e->current = i;
                pthread_mutex_unlock(&e->lock);
                *reply = doc;
                return 0;
            }
            return rc; /* an answer, even a refusal, ends the search */
        }
        free(sink.buf);
        json_decref(sink.event);
        snprintf(why, sizeof why, "%s", orb_last_error());
        if (rc == ORB_ETIMEDOUT)
            break;
    }
    return orb_fail(rc, "%s", why[0] != '\0' ? why : "directory: no etcd endpoint answered");
}

static int authenticate(struct orb_etcd *e, uint64_t deadline)
{
    json_t *body = json_pack("{s:s,s:s}", "name", e->username, "password", e->password);
    char *text = body != NULL ? json_dumps(body, JSON_COMPACT) : NULL;
    /* jansson keeps its own copy of the password: wipe it before the object frees it. */
    json_t *copy = json_object_get(body, "password");
    if (json_is_string(copy))
        memset((char *)json_string_value(copy), 0, json_string_length(copy));
    json_decref(body);
    if (text == NULL)
        return orb_fail(ORB_ENOMEM, "directory: no memory to authenticate");
    json_t *reply = NULL;
    int rc = exchange(e, "/v3/auth/authenticate", text, deadline, 0, &reply, 0);
    memset(text, 0, strlen(text));
    free(text);
    if (rc != 0)
        return orb_fail(rc, "directory: authenticating as \"%s\": %s", e->username, orb_last_error());
    json_t *tok = json_object_get(reply, "token");
    if (!json_is_string(tok) || json_string_length(tok) == 0 || json_string_length(tok) >= TOKEN_MAX) {
        json_decref(reply);
        return orb_fail(ORB_EPROTO, "directory: etcd's authentication answer has no usable token");
    }
    pthread_mutex_lock(&e->lock);
    snprintf(e->token, sizeof e->token, "%s", json_string_value(tok));
    pthread_mutex_unlock(&e->lock);
    json_decref(reply);
    return 0;
}

int orb_etcd_call(struct orb_etcd *e, const char *path, json_t *body, uint64_t deadline, json_t **reply)
{
    char *text = json_dumps(body, JSON_COMPACT);
    if (text == NULL)
        return orb_fail(ORB_ENOMEM, "directory: no memory for a request");
    int rc = exchange(e, path, text, deadline, 0, reply, 1);
    free(text);
    return rc;
}

int orb_etcd_watch(struct orb_etcd *e, const uint8_t *key, size_t key_len, uint64_t start, uint64_t deadline,
                   json_t **event)
{
    char *k = orb_dir_b64_encode(key, key_len);
    if (k == NULL)
        return orb_fail(ORB_ENOMEM, "directory: no memory for a watch");
    char rev[24];
    snprintf(rev, sizeof rev, "%llu", (unsigned long long)start);
    json_t *body = start != 0 ? json_pack("{s:{s:s,s:s}}", "create_request", "key", k, "start_revision", rev)
                              : json_pack("{s:{s:s}}", "create_request", "key", k);
    free(k);
    char *text = body != NULL ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (text == NULL)
        return orb_fail(ORB_ENOMEM, "directory: no memory for a watch");
    int rc = exchange(e, "/v3/watch", text, deadline, 1, event, 1);
    free(text);
    return rc;
}

#endif
