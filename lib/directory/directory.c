/* The endpoint directory on etcd: publish, resolve, watch, and a thread that keeps published
 * entries alive (lease keepalives every third of the TTL) and publishes them again when etcd
 * lost them. */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/engine.h"
#include "core/error.h"
#include "core/log.h"
#include "core/thread_name.h"
#include "directory/entry.h"
#include "directory/etcd.h"

#define DEFAULT_TTL_S 10u
#define DEFAULT_TIMEOUT_NS (5ull * ORB_NS_PER_SEC)
#define PUBLISHED_MAX 1024u

/* One name this directory published. */
struct published {
    struct published *next;
    char name[ORB_DIRECTORY_NAME_MAX];
    char *key;          /* prefix + name, base64 */
    char *value;        /* the stored value, base64 */
    char lease[24];     /* etcd's lease id, decimal */
    int failing;        /* the last refresh failed (logged once per outage) */
    uint64_t pass;      /* the refresher's last pass over it */
};

struct orb_directory {
    struct orb_etcd *etcd;
    char prefix[ORB_DIR_PREFIX_MAX + 1];
    uint32_t ttl_s;
    uint64_t timeout_ns;
    pthread_mutex_t lock;       /* the list, `stopping`; never held across an exchange but by the refresher */
    pthread_cond_t wake;        /* CLOCK_MONOTONIC */
    struct published *list;
    unsigned count;
    int stopping;
    pthread_t refresher;
    pthread_mutex_t refresh_lock; /* one exchange sequence on an entry at a time (refresh, publish, unpublish) */
    unsigned callers_waiting;     /* publish/unpublish calls waiting for refresh_lock (under lock) */
    pthread_cond_t callers_served; /* callers_waiting fell to 0, or stopping */
};

/* Take refresh_lock for a caller: the refresher lets callers go first between two entries
 * (a mutex is not fair: it would take it back at once, entry after entry). */
static void caller_lock(struct orb_directory *d)
{
    pthread_mutex_lock(&d->lock);
    d->callers_waiting++;
    pthread_mutex_unlock(&d->lock);
    pthread_mutex_lock(&d->refresh_lock);
    pthread_mutex_lock(&d->lock);
    if (--d->callers_waiting == 0)
        pthread_cond_broadcast(&d->callers_served);
    pthread_mutex_unlock(&d->lock);
}

static char *key_of(const struct orb_directory *d, const char *name)
{
    char raw[ORB_DIR_PREFIX_MAX + ORB_DIRECTORY_NAME_MAX + 1];
    int n = snprintf(raw, sizeof raw, "%s%s", d->prefix, name);
    return orb_dir_b64_encode((const uint8_t *)raw, (size_t)n);
}

/* A decimal string field of etcd's answers (int64 are strings in its JSON). */
static uint64_t num_of(json_t *v)
{
    const char *s = json_is_string(v) ? json_string_value(v) : NULL;
    if (s == NULL)
        return json_is_integer(v) ? (uint64_t)json_integer_value(v) : 0;
    return strtoull(s, NULL, 10);
}

/* ---- etcd operations ---------------------------------------------------------------------------- */

/* One etcd call: `body` is consumed (NULL, a failed json_pack, is ORB_ENOMEM); the answer goes
 * to *reply when reply is not NULL (the caller decrefs) and is dropped otherwise. */
static int exchange(struct orb_directory *d, const char *path, json_t *body, uint64_t deadline,
                    json_t **reply)
{
    json_t *answer = NULL;
    int rc = body == NULL ? orb_fail(ORB_ENOMEM, "directory: no memory")
                          : orb_etcd_call(d->etcd, path, body, deadline, &answer);
    json_decref(body);
    if (rc == 0 && reply != NULL)
        *reply = answer;
    else
        json_decref(answer);
    return rc;
}

static int lease_grant(struct orb_directory *d, uint64_t deadline, char lease[24])
{
    json_t *reply = NULL;
    int rc = exchange(d, "/v3/lease/grant", json_pack("{s:I}", "TTL", (json_int_t)d->ttl_s), deadline,
                      &reply);
    if (rc != 0)
        return rc;
    uint64_t id = num_of(json_object_get(reply, "ID"));
    json_decref(reply);
    if (id == 0)
        return orb_fail(ORB_EPROTO, "directory: etcd granted no lease id");
    snprintf(lease, 24, "%llu", (unsigned long long)id);
    return 0;
}

static int put(struct orb_directory *d, uint64_t deadline, const struct published *p)
{
    return exchange(d, "/v3/kv/put",
                    json_pack("{s:s,s:s,s:s}", "key", p->key, "value", p->value, "lease", p->lease),
                    deadline, NULL);
}

static int lease_revoke(struct orb_directory *d, uint64_t deadline, const char *lease)
{
    return exchange(d, "/v3/lease/revoke", json_pack("{s:s}", "ID", lease), deadline, NULL);
}

/* 1 when the lease is alive (and renewed), 0 when etcd no longer has it, or a failure. */
static int lease_keepalive(struct orb_directory *d, uint64_t deadline, const char *lease)
{
    json_t *reply = NULL;
    int rc = exchange(d, "/v3/lease/keepalive", json_pack("{s:s}", "ID", lease), deadline, &reply);
    if (rc != 0)
        return rc;
    uint64_t ttl = num_of(json_object_get(json_object_get(reply, "result"), "TTL"));
    json_decref(reply);
    return ttl > 0 ? 1 : 0;
}

/* Grant a new lease and store the entry under it (refresh_lock held). */
static int store(struct orb_directory *d, uint64_t deadline, struct published *p)
{
    char lease[24];
    int rc = lease_grant(d, deadline, lease);
    if (rc != 0)
        return rc;
    char old[24];
    snprintf(old, sizeof old, "%s", p->lease);
    snprintf(p->lease, sizeof p->lease, "%s", lease);
    rc = put(d, deadline, p);
    if (rc != 0) {
        /* Best effort, briefly: it expires on its own anyway. */
        (void)lease_revoke(d, orb_deadline_after(d->timeout_ns / 10), lease);
        snprintf(p->lease, sizeof p->lease, "%s", old);
    }
    return rc;
}

/* ---- the refresher ------------------------------------------------------------------------------ */

static void refresh_one(struct orb_directory *d, struct published *p)
{
    uint64_t deadline = orb_deadline_after(d->timeout_ns);
    int alive = lease_keepalive(d, deadline, p->lease);
    int rc = alive < 0 ? alive : 0;
    if (alive == 0) {
        rc = store(d, deadline, p); /* etcd lost it: a restart without its data, or it expired meanwhile */
        if (rc == 0)
            ORB_LOGI("directory: \"%s\" was gone from etcd: published again", p->name);
    }
    if (rc != 0 && !p->failing)
        ORB_LOGW("directory: cannot refresh \"%s\" (%s): trying again every %u s", p->name, orb_last_error(),
                 d->ttl_s / 3 > 0 ? d->ttl_s / 3 : 1);
    else if (rc == 0 && p->failing)
        ORB_LOGI("directory: \"%s\" is refreshed again", p->name);
    p->failing = rc != 0;
}

/* Refresh every entry once (pass number `pass`), each under refresh_lock on its own, so that a
 * publish or unpublish waits for one entry's exchanges at most, never for a whole pass. */
static void refresh_pass(struct orb_directory *d, uint64_t pass)
{
    for (;;) {
        pthread_mutex_lock(&d->lock);
        while (d->callers_waiting > 0 && !d->stopping)
            pthread_cond_wait(&d->callers_served, &d->lock);
        pthread_mutex_unlock(&d->lock);
        pthread_mutex_lock(&d->refresh_lock);
        pthread_mutex_lock(&d->lock);
        struct published *p = d->list;
        while (p != NULL && p->pass == pass)
            p = p->next;
        if (p == NULL || d->stopping) {
            pthread_mutex_unlock(&d->lock);
            pthread_mutex_unlock(&d->refresh_lock);
            return;
        }
        p->pass = pass;
        pthread_mutex_unlock(&d->lock);
        refresh_one(d, p); /* p stays: unpublish takes refresh_lock before it unlinks */
        pthread_mutex_unlock(&d->refresh_lock);
    }
}

static void *refresher_main(void *arg)
{
    struct orb_directory *d = arg;
    orb_thread_name("directory");
    uint64_t period = (uint64_t)d->ttl_s * ORB_NS_PER_SEC / 3;
    uint64_t pass = 0;
    pthread_mutex_lock(&d->lock);
    while (!d->stopping) {
        struct timespec ts = orb_deadline_timespec(orb_deadline_after(period));
        pthread_cond_timedwait(&d->wake, &d->lock, &ts);
        if (d->stopping)
            break;
        pthread_mutex_unlock(&d->lock);
        refresh_pass(d, ++pass);
        pthread_mutex_lock(&d->lock);
    }
    pthread_mutex_unlock(&d->lock);
    return NULL;
}

/* ---- the API ------------------------------------------------------------------------------------- */

ORB_EXPORT int orb_directory_open(const struct orb_directory_params *params, orb_directory **out)
{
    if (params == NULL || out == NULL)
        return orb_fail(ORB_EINVAL, "orb_directory_open: NULL argument");
    if (params->reserved32 != 0)
        return orb_fail(ORB_EINVAL, "orb_directory_open: reserved32 is not zero");
    for (size_t i = 0; i < sizeof params->reserved / sizeof params->reserved[0]; i++)
        if (params->reserved[i] != 0)
            return orb_fail(ORB_EINVAL, "orb_directory_open: reserved[%zu] is not zero", i);
    const char *prefix = params->prefix != NULL ? params->prefix : ORB_DIR_DEFAULT_PREFIX;
    int rc = orb_dir_check_prefix(prefix);
    if (rc != 0)
        return rc;
    uint32_t ttl = params->lease_ttl_s != 0 ? params->lease_ttl_s : DEFAULT_TTL_S;
    if (ttl < 2 || ttl > 3600)
        return orb_fail(ORB_EINVAL, "orb_directory_open: lease_ttl_s %u is outside 2..3600", ttl);
    struct orb_directory *d = calloc(1, sizeof *d);
    if (d == NULL)
        return orb_fail(ORB_ENOMEM, "orb_directory_open: no memory");
    snprintf(d->prefix, sizeof d->prefix, "%s", prefix);
    d->ttl_s = ttl;
    d->timeout_ns = params->timeout_ns != 0 ? params->timeout_ns : DEFAULT_TIMEOUT_NS;
    struct orb_etcd_params ep = {.endpoints = params->endpoints, .ca_file = params->ca_file,
                                 .cert_file = params->cert_file, .key_file = params->key_file,
                                 .username = params->username, .password = params->password};
    rc = orb_etcd_new(&ep, &d->etcd);
    if (rc != 0) {
        free(d);
        return rc;
    }
    /* One exchange now, so that a wrong address or credentials fail here, naming why: a read
     * of the prefix's own key, which a role confined to the prefix may make. */
    char *probe = orb_dir_b64_encode((const uint8_t *)d->prefix, strlen(d->prefix));
    json_t *body = probe != NULL ? json_pack("{s:s}", "key", probe) : NULL;
    free(probe);
    rc = exchange(d, "/v3/kv/range", body, orb_deadline_after(d->timeout_ns), NULL);
    if (rc != 0)
        goto free_etcd;
    pthread_mutex_init(&d->lock, NULL);
    pthread_mutex_init(&d->refresh_lock, NULL);
    if (orb_cond_init_monotonic(&d->wake) != 0) {
        rc = orb_fail(ORB_ENOMEM, "directory: cannot make a condition variable");
        goto destroy_locks;
    }
    if (pthread_cond_init(&d->callers_served, NULL) != 0) {
        rc = orb_fail(ORB_ENOMEM, "directory: cannot make a condition variable");
        goto destroy_wake;
    }
    if (pthread_create(&d->refresher, NULL, refresher_main, d) != 0) {
        rc = orb_fail(ORB_ENOMEM, "directory: cannot start the refresher");
        goto destroy_callers_served;
    }
    *out = d;
    return 0;

destroy_callers_served:
    pthread_cond_destroy(&d->callers_served);
destroy_wake:
    pthread_cond_destroy(&d->wake);
destroy_locks:
    pthread_mutex_destroy(&d->refresh_lock);
    pthread_mutex_destroy(&d->lock);
free_etcd:
    orb_etcd_free(d->etcd);
    free(d);
    return rc;
}

static void published_free(struct published *p)
{
    free(p->key);
    free(p->value);
    free(p);
}

ORB_EXPORT void orb_directory_close(orb_directory *d)
{
    if (d == NULL)
        return;
    /* One deadline for the whole close: the refresher's exchange in progress, then the revokes
     * (which fail at once once it has passed: the entries then expire on their own). */
    uint64_t deadline = orb_deadline_after(d->timeout_ns);
    pthread_mutex_lock(&d->lock);
    d->stopping = 1;
    pthread_cond_broadcast(&d->wake);
    pthread_cond_broadcast(&d->callers_served);
    pthread_mutex_unlock(&d->lock);
    pthread_join(d->refresher, NULL);
    /* Withdraw what was published: revoking a lease deletes its keys at once. */
    while (d->list != NULL) {
        struct published *p = d->list;
        d->list = p->next;
        if (lease_revoke(d, deadline, p->lease) != 0)
            ORB_LOGI("directory: \"%s\" not withdrawn (%s): it expires after %u s", p->name, orb_last_error(),
                     d->ttl_s);
        published_free(p);
    }
    pthread_cond_destroy(&d->callers_served);
    pthread_cond_destroy(&d->wake);
    pthread_mutex_destroy(&d->refresh_lock);
    pthread_mutex_destroy(&d->lock);
    orb_etcd_free(d->etcd);
    free(d);
}

/* The entry an engine publishes now. */
static int entry_of_engine(orb_engine *engine, struct orb_directory_entry *e)
{
    memset(e, 0, sizeof *e);
    int rc = orb_engine_endpoint(engine, e->endpoint, sizeof e->endpoint);
    if (rc == 0)
        rc = orb_engine_source_epoch(engine, &e->epoch);
    if (rc != 0)
        return orb_fail(rc, "directory: the engine's source: %s", orb_last_error());
    if (gethostname(e->host, sizeof e->host - 1) != 0 || e->host[0] == '\0')
        snprintf(e->host, sizeof e->host, "unknown");
    struct orb_region_desc *descs = NULL;
    size_t count = 0;
    rc = orb_registry_describe_remote(orb_engine_registry(engine), &descs, &count);
    if (rc != 0)
        return rc;
    e->nregions = count < ORB_DIRECTORY_REGIONS_MAX ? (uint32_t)count : ORB_DIRECTORY_REGIONS_MAX;
    if (e->nregions > 0)
        memcpy(e->regions, descs, e->nregions * sizeof *descs);
    orb_region_descs_free(descs);
    return 0;
}

ORB_EXPORT int orb_directory_publish(orb_directory *d, const char *name, orb_engine *engine)
{
    if (d == NULL || engine == NULL)
        return orb_fail(ORB_EINVAL, "orb_directory_publish: NULL argument");
    int rc = orb_dir_check_name(name);
    if (rc != 0)
        return rc;
    static _Thread_local struct orb_directory_entry e; /* 12 KiB: off the stack */
    if ((rc = entry_of_engine(engine, &e)) != 0)
        return rc;
    char *text = orb_dir_entry_encode(&e);
    if (text == NULL)
        return ORB_ENOMEM;
    char *value = orb_dir_b64_encode((const uint8_t *)text, strlen(text));
    free(text);
    char *key = key_of(d, name);
    if (value == NULL || key == NULL) {
        free(value);
        free(key);
        return orb_fail(ORB_ENOMEM, "directory: no memory for an entry");
    }
    /* The deadline covers the wait for the refresher (one entry's exchanges at most) too. */
    uint64_t deadline = orb_deadline_after(d->timeout_ns);
    caller_lock(d);
    pthread_mutex_lock(&d->lock);
    struct published *p = d->list;
    while (p != NULL && strcmp(p->name, name) != 0)
        p = p->next;
    bool fresh = p == NULL;
    if (fresh && d->count >= PUBLISHED_MAX) {
        pthread_mutex_unlock(&d->lock);
        pthread_mutex_unlock(&d->refresh_lock);
        free(value);
        free(key);
        return orb_fail(ORB_ERESOURCE, "directory: %u names are published by this directory already", PUBLISHED_MAX);
    }
    pthread_mutex_unlock(&d->lock);
    if (fresh) {
        p = calloc(1, sizeof *p);
        if (p == NULL) {
            pthread_mutex_unlock(&d->refresh_lock);
            free(value);
            free(key);
            return orb_fail(ORB_ENOMEM, "directory: no memory for an entry");
        }
        snprintf(p->name, sizeof p->name, "%s", name);
        p->key = key;
        p->value = value;
        rc = store(d, deadline, p);
    } else {
        /* Same lease, new value. */
        char *old_value = p->value;
        p->value = value;
        free(key);
        rc = put(d, deadline, p);
        if (rc == ORB_EPEER && lease_keepalive(d, deadline, p->lease) == 0)
            rc = store(d, deadline, p); /* the lease was gone: a new one */
        if (rc != 0) {
            p->value = old_value;
            free(value);
        } else {
            free(old_value);
        }
    }
    if (rc == 0 && fresh) {
        pthread_mutex_lock(&d->lock);
        p->next = d->list;
        d->list = p;
        d->count++;
        pthread_mutex_unlock(&d->lock);
    } else if (fresh) {
        published_free(p);
    }
    pthread_mutex_unlock(&d->refresh_lock);
    return rc;
}

ORB_EXPORT int orb_directory_unpublish(orb_directory *d, const char *name)
{
    if (d == NULL)
        return orb_fail(ORB_EINVAL, "orb_directory_unpublish: NULL directory");
    int rc = orb_dir_check_name(name);
    if (rc != 0)
        return rc;
    uint64_t deadline = orb_deadline_after(d->timeout_ns);
    caller_lock(d);
    pthread_mutex_lock(&d->lock);
    struct published **pp = &d->list;
    while (*pp != NULL && strcmp((*pp)->name, name) != 0)
        pp = &(*pp)->next;
    struct published *p = *pp;
    if (p != NULL) {
        *pp = p->next;
        d->count--;
    }
    pthread_mutex_unlock(&d->lock);
    if (p == NULL) {
        pthread_mutex_unlock(&d->refresh_lock);
        return orb_fail(ORB_ENOENT, "directory: \"%s\" was not published by this directory", name);
    }
    rc = lease_revoke(d, deadline, p->lease); /* deletes the key with its lease */
    pthread_mutex_unlock(&d->refresh_lock);
    published_free(p);
    return rc;
}

/* Decode etcd's kv object into *out. */
static int entry_of_kv(json_t *kv, const char *name, struct orb_directory_entry *out)
{
    json_t *v = json_object_get(kv, "value");
    if (!json_is_string(v))
        return orb_fail(ORB_EPROTO, "directory: etcd's record of \"%s\" has no value", name);
    if (json_string_length(v) > (ORB_DIR_VALUE_MAX / 3 + 1) * 4)
        return orb_fail(ORB_EPROTO, "directory: the entry \"%s\" is longer than %u bytes", name, ORB_DIR_VALUE_MAX);
    uint8_t *raw = NULL;
    size_t len = 0;
    int rc = orb_dir_b64_decode(json_string_value(v), json_string_length(v), &raw, &len);
    if (rc != 0)
        return rc;
    static _Thread_local struct orb_directory_entry e;
    memset(&e, 0, sizeof e);
    snprintf(e.name, sizeof e.name, "%s", name);
    e.revision = num_of(json_object_get(kv, "mod_revision"));
    rc = orb_dir_entry_decode(raw, len, &e);
    free(raw);
    if (rc != 0)
        return orb_fail(rc, "directory: \"%s\": %s", name, orb_last_error());
    *out = e;
    return 0;
}

/* Read the entry `name` into *out; *store_revision (when not NULL) gets etcd's revision at the
 * read, found or not. */
static int read_entry(orb_directory *d, const char *name, uint64_t deadline, struct orb_directory_entry *out,
                      uint64_t *store_revision)
{
    char *key = key_of(d, name);
    json_t *body = key != NULL ? json_pack("{s:s}", "key", key) : NULL, *reply = NULL;
    free(key);
    int rc = exchange(d, "/v3/kv/range", body, deadline, &reply);
    if (rc != 0)
        return rc;
    if (store_revision != NULL)
        *store_revision = num_of(json_object_get(json_object_get(reply, "header"), "revision"));
    json_t *kvs = json_object_get(reply, "kvs");
    if (!json_is_array(kvs) || json_array_size(kvs) == 0)
        rc = orb_fail(ORB_ENOENT, "directory: no entry \"%s\" under %s", name, d->prefix);
    else
        rc = entry_of_kv(json_array_get(kvs, 0), name, out);
    json_decref(reply);
    return rc;
}

ORB_EXPORT int orb_directory_resolve(orb_directory *d, const char *name, struct orb_directory_entry *out)
{
    if (d == NULL || out == NULL)
        return orb_fail(ORB_EINVAL, "orb_directory_resolve: NULL argument");
    int rc = orb_dir_check_name(name);
    if (rc != 0)
        return rc;
    return read_entry(d, name, orb_deadline_after(d->timeout_ns), out, NULL);
}

ORB_EXPORT int orb_directory_watch(orb_directory *d, const char *name, uint64_t after_revision, uint64_t timeout_ns,
                                   struct orb_directory_entry *out, int *deleted_out)
{
    if (d == NULL || out == NULL || deleted_out == NULL)
        return orb_fail(ORB_EINVAL, "orb_directory_watch: NULL argument");
    int rc = orb_dir_check_name(name);
    if (rc != 0)
        return rc;
    char raw[ORB_DIR_PREFIX_MAX + ORB_DIRECTORY_NAME_MAX + 1];
    int n = snprintf(raw, sizeof raw, "%s%s", d->prefix, name);
    uint64_t deadline = orb_deadline_after(timeout_ns);
    if (after_revision == 0) {
        /* "The entry, or else the first change": read it, and watch from the revision of that
         * read, so that an entry published between the two is not missed. */
        uint64_t read_deadline = orb_deadline_after(d->timeout_ns);
        uint64_t store_revision = 0;
        rc = read_entry(d, name, read_deadline < deadline ? read_deadline : deadline, out, &store_revision);
        if (rc == 0) {
            *deleted_out = 0;
            return 0;
        }
        if (rc != ORB_ENOENT)
            return rc;
        if (store_revision == 0)
            return orb_fail(ORB_EPROTO, "directory: etcd's answer has no revision");
        after_revision = store_revision;
    }
    json_t *event = NULL;
    rc = orb_etcd_watch(d->etcd, (const uint8_t *)raw, (size_t)n, after_revision + 1, deadline, &event);
    if (rc != 0)
        return rc;
    json_t *kv = json_object_get(event, "kv");
    const char *type = json_string_value(json_object_get(event, "type"));
    if (type != NULL && strcmp(type, "DELETE") == 0) {
        memset(out->name, 0, sizeof out->name);
        snprintf(out->name, sizeof out->name, "%s", name);
        out->revision = num_of(json_object_get(kv, "mod_revision"));
        *deleted_out = 1;
        json_decref(event);
        return 0;
    }
    rc = entry_of_kv(kv, name, out);
    json_decref(event);
    if (rc == 0)
        *deleted_out = 0;
    return rc;
}
