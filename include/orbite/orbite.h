/*
 * OrbiTE public C API.
 *
 * Conventions, for every call below unless its comment says otherwise:
 *  - A call returns 0 on success or a negative ORB_E* status.
 *  - Out-parameters are written only on success. The exceptions are the batch
 *    calls that fill a struct orb_batch_report: the report *is* the result, so
 *    it is written whenever the call got past argument checking.
 *  - On failure a thread-local message naming the cause is available from
 *    orb_last_error() until the same thread's next OrbiTE call (see there).
 *  - Ownership is stated on each prototype. Every *_free / *_unref / *_close
 *    accepts NULL and then does nothing.
 *  - Timeouts are relative, in nanoseconds. ORB_TIMEOUT_INFINITE waits forever;
 *    every other value bounds the wait.
 *
 * Thread safety: every call may be made from any thread. Calls on one engine
 * may run concurrently; a batch handle must not be used by two threads at once.
 */
#ifndef ORBITE_ORBITE_H
#define ORBITE_ORBITE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ORB_VERSION_MAJOR 0
#define ORB_VERSION_MINOR 1
#define ORB_VERSION_PATCH 0

/** Wait without a deadline. */
#define ORB_TIMEOUT_INFINITE UINT64_MAX

/* ------------------------------------------------------------------------ */
/* Status codes                                                              */
/* ------------------------------------------------------------------------ */

enum orb_status {
    ORB_OK = 0,
    ORB_EINVAL = -1,        /* an argument is invalid                        */
    ORB_ECONFIG = -2,       /* configuration is invalid                      */
    ORB_EUNAVAILABLE = -3,  /* transport, library or device not available    */
    ORB_EPERM = -4,         /* permission of a registration does not allow it */
    ORB_ENOENT = -5,        /* no such registration, range or peer           */
    ORB_EEXIST = -6,        /* already exists                                */
    ORB_EBUSY = -7,         /* conflicting access or live work               */
    ORB_ERESOURCE = -8,     /* a configured budget is exhausted              */
    ORB_ETIMEDOUT = -9,     /* the deadline passed                           */
    ORB_ESTALE = -10,       /* wrong or old source epoch                     */
    ORB_EPEER = -11,        /* the peer failed or disconnected               */
    ORB_EPROTO = -12,       /* the peer broke the wire protocol              */
    ORB_EUNQUIESCED = -13,  /* cleanup could not be proven complete          */
    ORB_ECLOSED = -14,      /* the engine (or that direction) is closed      */
    ORB_ENOMEM = -15,       /* out of memory                                 */
    ORB_EAGAIN = -16        /* not ready yet; try again                      */
};

/** Static text for a status code ("unknown status" for other values). Never NULL. */
const char *orb_strerror(int status);

/**
 * The calling thread's detail message for its most recent failure. Never NULL
 * (empty string when there is none). Read it right after a call returned a
 * negative status: the text stays valid and unchanged until the same thread's
 * next OrbiTE call other than orb_last_error() and orb_strerror(), which may
 * replace it even when it succeeds.
 */
const char *orb_last_error(void);

/* ------------------------------------------------------------------------ */
/* Logging                                                                   */
/* ------------------------------------------------------------------------ */

enum orb_log_level {
    ORB_LOG_ERROR = 0,
    ORB_LOG_WARN = 1,
    ORB_LOG_INFO = 2,
    ORB_LOG_DEBUG = 3,
    ORB_LOG_TRACE = 4
};

/** A log sink. `message` is a NUL-terminated line without newline, valid only during the call. */
typedef void (*orb_log_fn)(enum orb_log_level level, const char *message, void *ctx);

/**
 * Route log lines to `fn` (called from any OrbiTE thread, possibly concurrently).
 * NULL restores the default sink, which writes to stderr. The default level is
 * WARN, or the value of the ORBITE_LOG environment variable (error, warn, info,
 * debug, trace) read once at first use.
 */
void orb_log_set_handler(orb_log_fn fn, void *ctx);
/** Set the most verbose level that is emitted. */
void orb_log_set_level(enum orb_log_level level);
/** The current level. */
enum orb_log_level orb_log_get_level(void);

/* ------------------------------------------------------------------------ */
/* Source epochs                                                             */
/* ------------------------------------------------------------------------ */

/** 128 random bits naming one engine's lifetime as a source. */
struct orb_epoch {
    uint8_t bytes[16];
};

/** Length of the hex text form of an epoch, without the NUL. */
#define ORB_EPOCH_HEX_LEN 32

/**
 * Write `epoch` as 32 lowercase hex digits plus NUL into `buf`.
 * Errors: ORB_EINVAL (NULL argument or `len` < ORB_EPOCH_HEX_LEN + 1).
 */
int orb_epoch_format(const struct orb_epoch *epoch, char *buf, size_t len);
/**
 * Parse exactly 32 hex digits into `*out`.
 * Errors: ORB_EINVAL (NULL argument, wrong length or a non-hex character).
 */
int orb_epoch_parse(const char *text, struct orb_epoch *out);

/* ------------------------------------------------------------------------ */
/* Engine configuration                                                      */
/* ------------------------------------------------------------------------ */

#define ORB_ENDPOINT_MAX 128

/**
 * Whether an engine may use orbite-helper, the small privileged program that opens RDMA devices
 * and probes the host under the administrator's policy (docs/operations.md). Only RDMA
 * transports need it: an engine without RDMA settings never starts it, whatever this says.
 */
enum orb_helper_mode {
    ORB_HELPER_AUTO = 0,     /* use it when an RDMA transport needs it and it is installed */
    ORB_HELPER_REQUIRED = 1, /* an RDMA transport must go through it; no helper is an error */
    ORB_HELPER_OFF = 2       /* never start it */
};

/**
 * Engine configuration. Initialise with orb_engine_config_init() and change
 * fields afterwards; the engine copies it and it is immutable from then on.
 */
struct orb_engine_config {
    /** Source listen address "host:port"; default "127.0.0.1:0" (loopback, any port). */
    char endpoint[ORB_ENDPOINT_MAX];
    /** Serve remote requests (default 1). 0: requester only, no listener. */
    int enable_source;
    /** TCP connections per peer that carry payload (default 2, 1..16), to a peer on another
     *  host; tcp_local_stripes says how many a peer on this host gets. */
    uint32_t tcp_stripes;
    /** Epoll worker threads for the TCP transport (default 2, 1..16). */
    uint32_t tcp_workers;
    /** Requests longer than this are split across stripes (default 1 MiB; >= 4096); smaller
     *  requests submitted together share one stripe up to this many bytes. */
    uint64_t tcp_stripe_threshold;
    /** SO_SNDBUF/SO_RCVBUF in bytes; 0 leaves the kernel's autotuning (default 0). */
    uint32_t tcp_socket_buffer;
    /** Microseconds a waiting caller spins before sleeping (default 200, 0..10000): a response
     *  that arrives within it costs no thread wake-up. The caller spins only while the engine's
     *  workers and the caller fit the CPUs the process may run on (tcp_workers + 1 <= CPUs),
     *  so that it never takes the CPU from the worker whose completion it waits for. */
    uint32_t busy_poll_us;
    /** Seconds without progress after which a connection with pending work is failed (default 30). */
    uint32_t io_timeout_s;
    /** Budget: live batches per engine (default 1024). */
    uint32_t max_batches;
    /** Budget: requests in one batch (default 65536). */
    uint32_t max_batch_requests;
    /** Budget: registrations per engine (default 65536). */
    uint32_t max_registrations;
    /** Budget: authenticated source connections, those that completed HELLO (default 256), for
     *  TCP and again for the same-host transport's socket. A connection beyond it is refused at
     *  HELLO with ORB_ERESOURCE. */
    uint32_t max_connections;
    /** Budget: notifications queued at the source before new ones are refused (default 1024). */
    uint32_t max_notifications;
    /**
     * Privileged helper use, an enum orb_helper_mode (default ORB_HELPER_AUTO). JSON key
     * "helper": "auto", "required" or "off".
     */
    uint32_t helper_mode;
    /** Milliseconds a new source connection has to complete HELLO before it is dropped
     *  (default 5000, 1..3600000); separate from io_timeout_s, so that a peer trickling its
     *  HELLO cannot hold a connection by making progress. */
    uint32_t hello_timeout_ms;
    /** Budget: source connections that have not completed HELLO yet (default 32, 1..65536),
     *  per transport as max_connections. They never take a slot of max_connections; when this
     *  budget is full, the oldest of them is dropped to admit a new one. */
    uint32_t max_unauthenticated;
    /*
     * helper_mode, hello_timeout_ms, max_unauthenticated and enable_shm took the place of the
     * first two of eight reserved words, tcp_local_stripes and reserved32 the third, so the
     * structure keeps its size on every ABI (enable_shm and reserved32 are 32-bit words so that
     * no ABI, not even one that aligns uint64_t to 4 bytes, has a padding hole here). A non-zero
     * field given to an older library is refused as a non-zero reserved word rather than
     * silently ignored.
     */
    /** The same-host transport, ORB_TRANSPORT_SHM (default 1). 0 forbids it both ways: this
     *  engine's source serves no same-host peer and its requests never use it. */
    uint32_t enable_shm;
    /** TCP connections carrying payload to a peer on this host, one reached over loopback or
     *  over an address of this host (default 0, 0..16). 0: automatic, tcp_stripes but at most
     *  one per two CPUs this process may run on (at least 1), since a stripe keeps a thread
     *  busy at both of its ends and on one host both ends share those CPUs. 1..16: exactly
     *  that many. */
    uint32_t tcp_local_stripes;
    /** Reserved for a future field; must stay zero. */
    uint32_t reserved32;
    /** Reserved for future fields; must stay zero. */
    uint64_t reserved[5];
};

/** Fill `cfg` with the defaults documented above. Errors: ORB_EINVAL (NULL). */
int orb_engine_config_init(struct orb_engine_config *cfg);

/**
 * Update `cfg` from a JSON object held in `json` (NUL-terminated). Keys are the
 * field names above, except "helper" for helper_mode; integers must be JSON
 * integers in range, switches (enable_source) must be JSON booleans, endpoint a
 * string, helper one of "auto", "required" or "off". Unknown keys are errors.
 * On failure `cfg` is unchanged.
 * Errors: ORB_EINVAL (NULL), ORB_ECONFIG (parse error, wrong type, out of
 * range or unknown key; the message names the key and the reason).
 */
int orb_engine_config_load_json(struct orb_engine_config *cfg, const char *json);

/* ------------------------------------------------------------------------ */
/* RDMA configuration                                                        */
/* ------------------------------------------------------------------------ */

/**
 * The RDMA transport's settings: an opaque handle of named keys, so that keys can be added in
 * any release without changing a structure's size (as UCX's ucp_config_modify() does). Each key
 * has a default, a type and a range, listed in docs/man/orb_rdma_config_set.md; every key can be
 * set as text (orb_rdma_config_set) or from JSON (orb_rdma_config_load_json), with the same
 * checks. An engine takes a copy through struct orb_engine_params.
 */
typedef struct orb_rdma_config orb_rdma_config;

/**
 * A new configuration holding every key's default. The caller owns `*out` and frees it with
 * orb_rdma_config_free(). Errors: ORB_EINVAL (NULL), ORB_ENOMEM.
 */
int orb_rdma_config_new(orb_rdma_config **out);

/** Free a configuration (engines hold their own copies). NULL does nothing. */
void orb_rdma_config_free(orb_rdma_config *cfg);

/**
 * Set `key` from its text form `value` (both read during the call only): "true"/"false"
 * switches, decimal integers, masks in decimal or 0x-hex, durations as digits and a unit
 * ("10ms", "30s"; ns, us, ms, s), comma-separated device names, choices by name; "" clears a
 * text key. On failure `cfg` is unchanged.
 * Errors: ORB_EINVAL (NULL argument), ORB_ECONFIG (unknown key, wrong type or out of range; the
 * message names the key and the accepted values), ORB_ENOMEM.
 */
int orb_rdma_config_set(orb_rdma_config *cfg, const char *key, const char *value);

/**
 * Write `key`'s current value, in the text form orb_rdma_config_set() accepts, into `buf`
 * (`len` bytes, NUL included). Errors: ORB_EINVAL (NULL argument or `len` too small; the message
 * gives the size needed), ORB_ECONFIG (unknown key).
 */
int orb_rdma_config_get(const orb_rdma_config *cfg, const char *key, char *buf, size_t len);

/**
 * Update `cfg` from JSON text `json` (NUL-terminated, at most 1 MiB + 64 KiB): either an engine
 * document whose "rdma" member is an object of RDMA keys (the other members are ignored here;
 * orb_engine_config_load_json() reads them), or that object itself. Switches are JSON booleans,
 * numbers JSON integers (a mask may be a "0x..." string), name lists arrays of strings, text,
 * durations and choices strings; null clears a text key. Unknown keys are errors. Checks across
 * keys run at the end (a pinned device must pass the filters; priority_matrix and
 * custom_json_path exclude each other). On failure `cfg` is unchanged.
 * Errors: ORB_EINVAL (NULL), ORB_ECONFIG (the message names the key), ORB_ENOMEM.
 */
int orb_rdma_config_load_json(orb_rdma_config *cfg, const char *json);

/* ------------------------------------------------------------------------ */
/* Engine                                                                    */
/* ------------------------------------------------------------------------ */

typedef struct orb_engine orb_engine;

/** Bits of struct orb_engine_params::field_mask: which fields the caller set. */
#define ORB_ENGINE_PARAM_CONFIG (1ull << 0)
#define ORB_ENGINE_PARAM_RDMA (1ull << 1)
#define ORB_ENGINE_PARAM_METRICS (1ull << 2)

/**
 * Everything an engine is made from. The library reads only the fields whose bit is set in
 * field_mask, so later releases append fields without breaking programs built against this
 * one (UCX's ucp_params_t works the same way); a bit this library does not know is refused.
 */
struct orb_engine_params {
    uint64_t field_mask;
    /** ORB_ENGINE_PARAM_CONFIG: the engine configuration (unset or NULL: the defaults). */
    const struct orb_engine_config *config;
    /** ORB_ENGINE_PARAM_RDMA: run the RDMA transport with these settings, copied (unset or
     *  NULL: no RDMA transport, and libibverbs is never loaded). */
    const orb_rdma_config *rdma;
    /** ORB_ENGINE_PARAM_METRICS: serve the engine's metrics in Prometheus's text format over
     *  HTTP (GET /metrics) on this address, "host:port" with a numeric host ("[::1]:9464" for
     *  IPv6); NULL or "" means "127.0.0.1:0", loopback on a free port. Unset: no server, and
     *  libmicrohttpd is never loaded (orb_engine_metrics() works either way). The bound address
     *  is orb_engine_metrics_address()'s. */
    const char *metrics_address;
};

/**
 * Create an engine: validates `cfg`, draws a fresh source epoch, starts the
 * source service (if enabled) and the transport workers. The caller owns
 * `*out` and releases it with orb_engine_free().
 * Errors: ORB_EINVAL, ORB_ECONFIG (invalid field, named in the message),
 * ORB_EUNAVAILABLE (cannot bind or start threads), ORB_ENOMEM.
 */
int orb_engine_create(const struct orb_engine_config *cfg, orb_engine **out);

/**
 * Create an engine from `params` (read during the call only; see struct orb_engine_params).
 * orb_engine_create(cfg, out) is this call with only the config set. With RDMA settings the
 * engine also runs the RDMA transport where the host has it: it opens the NICs the settings'
 * filters and the helper's policy leave, and registers host memory with them (Direct policy).
 * On a host without usable devices or libibverbs, or under a policy without RDMA, the engine
 * runs without it (an info log says why) and requests that name ORB_TRANSPORT_RDMA fail with
 * ORB_EUNAVAILABLE giving the reason. Where both engines run it, requests naming
 * ORB_TRANSPORT_RDMA or ORB_TRANSPORT_UNSPEC travel on RDMA.
 * Errors: as orb_engine_create(), and ORB_EINVAL (unknown field_mask bit), ORB_ECONFIG (the RDMA
 * settings' cross-key checks; a pin that does not hold, a whitelist name not present, or
 * filters that leave no NIC: the message names the key), ORB_EUNAVAILABLE (helper required but
 * absent, or a granted device it cannot hand over: the message names it), ORB_EPEER/ORB_EPROTO/
 * ORB_ETIMEDOUT (the helper failed).
 */
int orb_engine_create_params(const struct orb_engine_params *params, orb_engine **out);

/**
 * Counters of an engine's RDMA transport, since the engine was created (gauges: now).
 * Filled by orb_engine_rdma_stats(); fields a later release adds are named in comp_mask.
 */
struct orb_rdma_stats {
    uint32_t comp_mask;            /* 0 in this release */
    uint32_t nics_open;            /* NICs opened (protection domain allocated) */
    uint32_t rails;                /* NICs that carry requests (queue pairs per connection) */
    uint32_t helper;               /* 1: the NICs were opened through orbite-helper's session */
    uint64_t completed_reads;      /* READ work requests that completed successfully */
    uint64_t completed_writes;     /* WRITE work requests that completed successfully */
    uint64_t payload_send_cqes;    /* payload completions received (one per signaled WR) */
    uint64_t errors;               /* work completions in error and posts the device refused */
    uint64_t registrations;        /* gauge: registrations holding memory regions */
    uint64_t memory_regions;       /* gauge: memory regions across NICs */
    uint64_t registered_bytes;     /* gauge: bytes of those registrations */
    uint64_t kept_memory_regions;  /* regions a NIC refused to deregister (kept for good) */
    uint64_t requests_in_flight;   /* gauge: requester side */
    uint64_t grants_active;        /* gauge: source side, published and not ended */
    uint64_t grants_served;        /* source side: grants ended, acknowledged */
    uint64_t staging_bytes;        /* gauge: staging in use (staged host or device memory) */
    uint64_t staged_transfers;     /* requests and grants that moved through staging */
    uint64_t slot_deferrals;       /* payload posts a shared priority slot held back for a while */
    uint64_t deadline_drops;       /* requests dropped before dispatch: they could not meet their deadline */
    uint64_t reconnects;           /* requester connections rebuilt after the source lost them */
    uint64_t connections;          /* gauge: requester connections (the segments to a process share one) */
    uint64_t source_connections;   /* gauge: source side, requester connections served */
    /* Rail health, per (peer process, local rail, remote rail) pair: */
    uint64_t rail_errors;          /* failed attempts charged to a pair (the path failed, not the peer's authority) */
    uint64_t rail_open_pairs;      /* gauge: pairs paused by errors (cooling down or in their trial) */
    uint64_t rail_probes;          /* half-open trials posted on paused pairs */
    uint64_t rail_recoveries;      /* trials that brought their pair back */
    /* The monitor (a scan every second, with or without traffic): */
    uint64_t monitor_ticks;        /* scans */
    uint64_t route_queries;        /* port states queried */
    uint64_t route_recoveries;     /* rails whose port came back, their route open again */
    uint64_t routes_down;          /* gauge: rails whose port is not active now */
    uint64_t kept_queue_pairs;     /* queue pairs the device refused to destroy (kept for good) */
    uint64_t read_replays;         /* READs asked again after a queue pair carrying them died */
    uint64_t progress_recoveries;  /* lanes whose completion queues were replaced after an error */
    uint64_t dmabuf_registrations; /* device registrations made by dma-buf (cuda_memory "direct") */
    uint64_t peermem_registrations;/* device registrations made through a peer-memory module */
    uint64_t staged_slots;         /* requester side: slots after a request's first, for requests staged
                                    * (at either end) in more than one slot */
    uint64_t private_grants;       /* source side: private grants ended and acknowledged (device memory
                                    * under cuda_memory "direct": a protection domain, memory region and
                                    * queue pair per rail for each, torn down before its ACK) */
    uint64_t reuse_grants;         /* source side: grants of device memory served on connected queue pairs by
                                    * DevX keys (gpu_source_reuse), ended and acknowledged */
    uint64_t reuse_probe_failures; /* device registrations for which a NIC failed the gpu_source_reuse probe
                                    * (their grants stay private there; the log says why) */
    uint64_t kept_keys;            /* DevX keys the device refused to destroy: what they reach is kept for good */
    uint64_t own_connection_grants;/* source side: window grants served on queue pairs made for each (either
                                    * side stages), ended and acknowledged */
    uint64_t grant_round_trips;    /* requester side: GRANT_REQ and PGRANT_REQ messages sent (a GRANT_REQ asks
                                    * for up to 16 requests) */
    uint64_t ack_messages;         /* source side: ACKs posted (one ends up to 8 grants; one sent again after its
                                    * queue pair died counts again) */
};

/**
 * Copy the RDMA transport's counters into `*out` (written only on success; the caller owns it).
 * Errors: ORB_EINVAL (NULL), ORB_EUNAVAILABLE (the engine runs no RDMA transport: the message
 * says why).
 */
int orb_engine_rdma_stats(const orb_engine *engine, struct orb_rdma_stats *out);

/**
 * One rail's NIC as the RDMA transport's selector sees it (filled by orb_engine_rdma_nic_load()).
 * Rates are bytes per second; gauges are marked "now"; fields a later release adds are named in
 * comp_mask.
 */
struct orb_rdma_nic_load {
    uint32_t comp_mask;            /* 0 in this release */
    uint32_t rail;                 /* the rail this NIC carries (0-based) */
    char name[64];                 /* the device's name, NUL-terminated */
    uint32_t port;                 /* the port its queue pairs use */
    uint32_t healthy;              /* 1: slices may be placed on it (its port is active; pairs
                                    * paused by errors are left out per peer) */
    uint64_t link_mbps;            /* the port's rate as the device reports it; 0: unknown */
    uint64_t effective_mbps;       /* the rate the estimates start from */
    double selection_bps;          /* the estimate slices are scored with */
    double transmit_bps;           /* the estimate measured from busy periods (0: none yet) */
    uint64_t charged_bytes;        /* now: bytes of dispatched slices not completed */
    uint64_t posted_bytes;         /* now: payload posted to the NIC and not completed */
    uint64_t completed_bytes;      /* payload completed successfully */
    uint64_t allocated_bytes;      /* bytes the selector placed on it */
    uint64_t rail_errors;          /* failed attempts charged to its pairs with peers */
    uint64_t rail_probes;          /* half-open trials posted on it */
    uint64_t rail_open_pairs;      /* now: its pairs paused by errors */
    uint32_t port_active;          /* now: 1 while the monitor finds its port active */
    uint32_t reserved32;           /* 0 */
};

/**
 * Copy the load of each rail's NIC into out[0..*count) (rail order; the caller owns `out`). With
 * `out` NULL and `cap` 0, only *count is written: the number of rails. The figures are read one
 * at a time, so under traffic they are not one instant. Errors: ORB_EINVAL (NULL engine or
 * count, or `cap` below the number of rails: the message says how many), ORB_EUNAVAILABLE (the
 * engine runs no RDMA transport, or none of its NICs carries requests: the message says why).
 */
int orb_engine_rdma_nic_load(const orb_engine *engine, struct orb_rdma_nic_load *out, size_t cap,
                             size_t *count);

/**
 * Write the bound source endpoint "host:port" (NUL-terminated) into `buf`.
 * Errors: ORB_EINVAL (NULL or `len` too small), ORB_EUNAVAILABLE (source disabled).
 */
int orb_engine_endpoint(const orb_engine *engine, char *buf, size_t len);

/** Copy this engine's source epoch into `*out`. Errors: ORB_EINVAL. */
int orb_engine_source_epoch(const orb_engine *engine, struct orb_epoch *out);

/**
 * Fence source admission: stop accepting connections and requests from peers,
 * close source connections once their current message is answered. Work the
 * source already admitted finishes. Idempotent. Errors: ORB_EINVAL.
 */
int orb_engine_close_source(orb_engine *engine);

/**
 * Fence requester admission: new batches, submissions and segment opens get
 * ORB_ECLOSED; work already submitted continues. Idempotent. Errors: ORB_EINVAL.
 */
int orb_engine_close_requester(orb_engine *engine);

/**
 * Fence both directions, wait up to `timeout_ns` for accepted work to drain,
 * then fail whatever remains (its batches report ORB_ECLOSED), stop workers and
 * close every socket. May be called again after ORB_EUNQUIESCED.
 * Errors: ORB_EINVAL, ORB_EUNQUIESCED (work still touched memory at the
 * deadline; registrations and backing stay retained).
 */
int orb_engine_close(orb_engine *engine, uint64_t timeout_ns);

/**
 * Close (with a 10 s deadline if not closed yet) and free the engine. Batches
 * and segments still held by the caller stay valid objects but fail with
 * ORB_ECLOSED; free them afterwards. If close could not prove quiescence the
 * engine's memory is deliberately leaked rather than freed under live work.
 */
void orb_engine_free(orb_engine *engine);

/* ------------------------------------------------------------------------ */
/* Host memory owners                                                        */
/* ------------------------------------------------------------------------ */

/** A reference-counted owner of a host allocation. */
typedef struct orb_host_memory orb_host_memory;

/**
 * Called exactly once when the last reference to wrapped bytes is dropped: in
 * the thread of the orb_host_memory_unref() that drops it, or, when the last
 * reference is a registration's, on the engine's release thread (see
 * orb_register_memory()).
 */
typedef void (*orb_release_fn)(void *ptr, size_t len, void *ctx);

/**
 * Allocate `len` (> 0) zeroed bytes aligned to `align` (0 means the page size;
 * otherwise a power of two). The caller owns one reference.
 * Errors: ORB_EINVAL, ORB_ENOMEM.
 */
int orb_host_memory_alloc(size_t len, size_t align, orb_host_memory **out);

/**
 * Allocate `len` (> 0) zeroed bytes aligned to `align` (0 means the page size;
 * otherwise a power of two) that a same-host peer engine can be handed: the
 * same-host transport maps this memory at the source, so a transfer of it is
 * one copy. Memory from orb_host_memory_alloc() or orb_host_memory_wrap()
 * cannot be handed over. The bytes are a memory file (memfd) of `len` rounded
 * up to the page size, sealed against shrinking, growth and further sealing,
 * mapped shared read/write; offset 0 of the file is orb_host_memory_data().
 * Each allocation holds one file descriptor (close-on-exec) until the last
 * reference drops, which unmaps the bytes and closes it. A child forked
 * meanwhile shares these pages rather than copying them. There is no fallback
 * to the heap. The caller owns one reference.
 * Errors: ORB_EINVAL (`out` NULL, `len` 0 or too large to round up to the
 * page and `align`, `align` not a power of two), ORB_ERESOURCE (no memory file
 * could be made or sealed, e.g. the descriptor limit was reached; the detail
 * message names the errno), ORB_ENOMEM (no memory or address space for the
 * file, its mapping or the owner).
 */
int orb_host_memory_alloc_shared(size_t len, size_t align, orb_host_memory **out);

/**
 * Adopt `len` (> 0) bytes at `ptr`. `release` (may be NULL) runs once when the
 * last reference drops. The caller owns one reference; on failure nothing is
 * adopted and `release` is not called. Errors: ORB_EINVAL, ORB_ENOMEM.
 */
int orb_host_memory_wrap(void *ptr, size_t len, orb_release_fn release, void *ctx,
                         orb_host_memory **out);

/** Start of the bytes (borrowed; valid while a reference is held). NULL for NULL. */
void *orb_host_memory_data(const orb_host_memory *mem);
/** Length in bytes; 0 for NULL. */
size_t orb_host_memory_size(const orb_host_memory *mem);
/** Take another reference; returns `mem`. */
orb_host_memory *orb_host_memory_ref(orb_host_memory *mem);
/** Drop a reference; the last one releases the bytes. */
void orb_host_memory_unref(orb_host_memory *mem);

/* ------------------------------------------------------------------------ */
/* CUDA memory owners                                                        */
/* ------------------------------------------------------------------------ */

/*
 * The CUDA calls load the NVIDIA driver's libcuda.so.1 on first use (never
 * at build time, never in a process that does not call them). Devices are
 * named by their ordinal among the devices visible to the process
 * (CUDA_VISIBLE_DEVICES applies).
 */

/** A reference-counted owner of one CUDA device allocation, all of it. */
typedef struct orb_cuda_memory orb_cuda_memory;

/**
 * Allocate `len` (> 0) bytes of device memory on device `device` (cuMemAlloc
 * in its primary context). The owner holds a reference to that primary
 * context until its last reference drops; then the bytes are freed and the
 * context released. The bytes are not zeroed. The caller owns one reference.
 * Errors: ORB_EINVAL (len 0, out NULL, no such device), ORB_EUNAVAILABLE
 * (libcuda.so.1 cannot be loaded, lacks an export, or finds no device),
 * ORB_ENOMEM (device or host memory), ORB_EPEER (another driver failure; the
 * message names the driver's error).
 */
int orb_cuda_memory_alloc(int device, size_t len, orb_cuda_memory **out);

/**
 * Adopt device memory allocated elsewhere: [ptr, ptr + len) (len > 0) must lie
 * in one allocation the driver knows as device memory of device `device`,
 * made in its primary context (the one the CUDA runtime uses) or mapped with
 * cuMemMap (virtual memory management: such a mapping belongs to no context,
 * and its mapped range is the allocation); host, pinned
 * host and managed memory are refused. The owner covers the whole allocation
 * (orb_cuda_memory_ptr() is its first byte) and holds a reference to the
 * primary context. `release` (may be NULL) runs once when the last reference
 * drops, with the allocation's first byte and its length, on the thread of
 * that orb_cuda_memory_unref() or an engine's release thread; the caller frees
 * the allocation there, or later. One allocation has one owner: adopting a
 * range of an allocation that already has one (allocated or adopted here)
 * returns that owner with one more reference, and then `release` must be NULL.
 * On failure nothing is adopted and `release` is not called.
 * Errors: ORB_EINVAL (len 0, out NULL, the range not inside one device
 * allocation of `device`'s primary context, host or managed memory, memory
 * the driver does not know), ORB_EEXIST (the allocation has an owner already
 * and `release` is not NULL), ORB_EUNAVAILABLE, ORB_ENOMEM, ORB_EPEER (as
 * orb_cuda_memory_alloc()).
 */
int orb_cuda_memory_adopt(int device, uint64_t ptr, size_t len, orb_release_fn release, void *ctx,
                          orb_cuda_memory **out);

/** The device address of the allocation's first byte; 0 for NULL. */
uint64_t orb_cuda_memory_ptr(const orb_cuda_memory *mem);
/** The allocation's length in bytes; 0 for NULL. */
size_t orb_cuda_memory_size(const orb_cuda_memory *mem);
/** The allocation's device ordinal; -1 for NULL. */
int orb_cuda_memory_device(const orb_cuda_memory *mem);
/** Take another reference; returns `mem`. */
orb_cuda_memory *orb_cuda_memory_ref(orb_cuda_memory *mem);
/**
 * Copy `len` (> 0) bytes at `offset` of the allocation into `dst` (host
 * memory), or `src` into it: on the allocation's own non-blocking stream,
 * complete when the call returns 0 (its completion event was waited for). A
 * producer's recorded work (orb_cuda_memory_record_producer()) is waited for
 * first. Copies of one allocation run one at a time. A failed copy drains the
 * stream before it returns; one whose end cannot be proven fences the
 * allocation (ORB_EUNQUIESCED, then for every later copy) and the caller must
 * then keep `dst`/`src` too, since the device may still use them.
 * Errors: ORB_EINVAL (NULL, len 0, the range outside the allocation),
 * ORB_EUNQUIESCED, ORB_ENOMEM, ORB_EUNAVAILABLE, ORB_EPEER (the driver's
 * failure, named).
 */
int orb_cuda_memory_copy_out(orb_cuda_memory *mem, size_t offset, void *dst, size_t len);
/** See orb_cuda_memory_copy_out(). */
int orb_cuda_memory_copy_in(orb_cuda_memory *mem, size_t offset, const void *src, size_t len);

/**
 * Drop a reference; the last one frees an allocation made by
 * orb_cuda_memory_alloc() (or runs an adopted one's release) and releases the
 * primary context. A free or release the driver refuses keeps the allocation
 * and the context: orb_cuda_retained_resources() counts them.
 */
void orb_cuda_memory_unref(orb_cuda_memory *mem);

/**
 * Allocate `len` (> 0) bytes of pinned (page-locked) host memory with
 * cuMemHostAlloc (portable: every context may use it) in device `device`'s
 * primary context, as an orb_host_memory usable wherever host memory is. Its
 * last reference frees it with cuMemFreeHost and releases the context; a free
 * the driver refuses keeps both (orb_cuda_retained_resources()). The caller owns one
 * reference. Errors: as orb_cuda_memory_alloc().
 */
int orb_cuda_host_alloc(int device, size_t len, orb_host_memory **out);

/**
 * Hand `mem` to transfers while a producer's GPU work on it may still be
 * queued: records an event on `stream` (a CUstream; NULL, CU_STREAM_LEGACY
 * and CU_STREAM_PER_THREAD name the calling thread's default streams) that
 * captures the work queued on it so far. Call it on the producer's thread,
 * after queuing that work and before the transfer is submitted. The first
 * access OrbiTE makes to the bytes afterwards (a request's submission, a
 * peer's request at the source, a staging copy, freeing the allocation) waits
 * once for that work with cuEventSynchronize, on the CPU: the wait is not cut
 * short by a request's deadline. Then `done(ctx)` (may be NULL) runs once, on
 * the thread that waited (an application thread submitting a request, or an
 * engine thread serving a peer), with no OrbiTE lock held; it must not block
 * or call OrbiTE. Until then the caller keeps the stream and every input of
 * the producer alive. Recording again while a generation is pending waits for
 * the pending one first. The stream must belong to the allocation's context
 * (the device's primary context), and a stream capturing a graph is refused.
 * A record or wait whose end the driver cannot prove fences the allocation:
 * every later access fails with ORB_EUNQUIESCED, `done` never runs (the
 * producer's inputs stay), and the allocation is kept for the process's
 * lifetime (orb_cuda_retained_resources()).
 * Errors: ORB_EINVAL (mem NULL; the stream is of another context, or of none;
 * a capturing stream), ORB_EUNQUIESCED (the record failed, or a pending
 * generation's wait did: fenced), ORB_EUNAVAILABLE, ORB_EPEER (the driver's
 * other failures, named).
 */
int orb_cuda_memory_record_producer(orb_cuda_memory *mem, void *stream, void (*done)(void *ctx), void *ctx);

/**
 * The same for pinned host memory from orb_cuda_host_alloc() (the stream must
 * belong to the primary context of the device it was allocated on): OrbiTE
 * reads or writes none of its bytes (a request's submission, a peer's
 * request, staging, the final cuMemFreeHost) before that work ended.
 * Errors: as orb_cuda_memory_record_producer(); ORB_EINVAL also for host
 * memory of any other origin.
 */
int orb_cuda_host_record_producer(orb_host_memory *mem, void *stream, void (*done)(void *ctx), void *ctx);

/** What failed CUDA cleanup kept, for the process's lifetime (see orb_cuda_retained_resources()). */
struct orb_cuda_retained {
    uint64_t device_allocations; /* device allocations whose free failed */
    uint64_t device_bytes;
    uint64_t host_allocations;   /* pinned host allocations whose free failed, or kept as staging a device may still use */
    uint64_t host_bytes;
    uint64_t contexts;           /* primary context references kept */
    uint64_t imports;            /* other processes' allocations whose IPC mapping could not be closed */
    uint64_t reserved[2];        /* 0 */
};

/**
 * Fill *out with what failed cleanup of CUDA memory kept in this process (all
 * zero when none, or when CUDA was never used). Errors: ORB_EINVAL (out NULL).
 */
int orb_cuda_retained_resources(struct orb_cuda_retained *out);

/* ------------------------------------------------------------------------ */
/* Metrics                                                                   */
/* ------------------------------------------------------------------------ */

/** Slots of the per-transport tables below: by enum orb_transport (index 0, UNSPEC, stays 0). */
#define ORB_METRICS_TRANSPORTS 5
/** Buckets of the batch latency histogram (bounds in struct orb_metrics). */
#define ORB_METRICS_LATENCY_BUCKETS 20
/** struct orb_metrics::comp_mask: the rdma member is filled (the engine runs RDMA). */
#define ORB_METRICS_RDMA (1u << 0)

/** Requests of one transport and operation. */
struct orb_metrics_transfers {
    uint64_t requests; /* completed successfully */
    uint64_t bytes;    /* their bytes */
    uint64_t failed;   /* ended with a failure */
};

/**
 * An engine's counters (since it was created) and gauges (now), filled by orb_engine_metrics().
 * Counters only grow. The snapshot takes no lock on the data path: counters updated by
 * different threads at the same moment may be seen one before the other.
 */
struct orb_metrics {
    uint32_t comp_mask;        /* ORB_METRICS_* bits: which optional members are filled */
    uint32_t reserved32;       /* 0 */
    uint64_t uptime_ns;        /* since the engine was created */
    /* This engine's requests, by the transport that carried them and op ([t][ORB_OP_READ] and
     * [t][ORB_OP_WRITE]); a request counts once, when it ends. */
    struct orb_metrics_transfers requested[ORB_METRICS_TRANSPORTS][2];
    uint64_t withdrawn_requests; /* requests withdrawn before they started (after a failure) */
    /* Failed requests by status: failures[-status], for ORB_EINVAL (1) .. ORB_EAGAIN (16). */
    uint64_t failures[17];
    /* Peers' requests this engine's source served: a request counts when its last byte moved
     * (TCP, same-host, NVLink) or its grant ended (RDMA); failed: refused or failed there. */
    struct orb_metrics_transfers served[ORB_METRICS_TRANSPORTS][2];
    /* Batches (orb_submit_and_wait and asynchronous) from the first submission until every
     * request ended: latency_buckets[i] counts those that took at most latency_bound_us[i] and
     * more than the bound before it (not cumulative); the last bound is UINT64_MAX. */
    uint64_t latency_bound_us[ORB_METRICS_LATENCY_BUCKETS];
    uint64_t latency_buckets[ORB_METRICS_LATENCY_BUCKETS];
    uint64_t latency_sum_ns;
    uint64_t batches;            /* batches settled: the sum of latency_buckets */
    uint64_t notifications_received; /* delivered to this engine's source */
    /* Gauges. */
    uint64_t registrations;      /* published registrations */
    uint64_t batches_live;       /* open batches */
    uint64_t notifications_queued; /* received and not yet polled */
    uint32_t reserved32b;        /* 0 */
    struct orb_rdma_stats rdma;  /* with ORB_METRICS_RDMA; zero otherwise */
    struct orb_cuda_retained cuda_retained; /* process-wide (orb_cuda_retained_resources()) */
    uint64_t reserved[8];        /* 0: room for fields before 1.0 */
};

/**
 * Write the address the engine serves its metrics on (ORB_ENGINE_PARAM_METRICS), "host:port",
 * NUL-terminated, into `buf`. Errors: ORB_EINVAL (NULL, or `len` too small), ORB_EUNAVAILABLE
 * (the engine serves none, or it was closed).
 */
int orb_engine_metrics_address(const orb_engine *engine, char *buf, size_t len);

/**
 * Fill *out with the engine's metrics (written only on success; the caller owns it). Callable at
 * any rate from any thread, also while the engine closes.
 * Errors: ORB_EINVAL (NULL).
 */
int orb_engine_metrics(const orb_engine *engine, struct orb_metrics *out);

/**
 * The same snapshot as one JSON object, with the RDMA NICs' load (orb_engine_rdma_nic_load())
 * as "nics", written NUL-terminated into `buf` (`len` bytes). `*needed` (if not NULL) receives
 * the length the text needs, NUL included. With `buf` NULL and `len` 0 only that is written
 * (and 0 returned), so that a caller can size its buffer; a buffer too small gets nothing, and
 * *needed is written all the same. The layout is in docs/man/orb_engine_metrics.md.
 * Errors: ORB_EINVAL (NULL engine, `buf` NULL with `len` > 0, or `len` too small), ORB_ENOMEM.
 */
int orb_engine_metrics_json(const orb_engine *engine, char *buf, size_t len, size_t *needed);

/* ------------------------------------------------------------------------ */
/* Registration                                                              */
/* ------------------------------------------------------------------------ */

/** What peers may do with a registered range. */
enum orb_perm {
    ORB_PERM_LOCAL = 0,        /* local requests only                    */
    ORB_PERM_REMOTE_READ = 1,  /* peers may READ                         */
    ORB_PERM_REMOTE_WRITE = 3  /* peers may READ and WRITE               */
};

/** Names one registration; never 0. */
typedef uint64_t orb_reg_id;

/**
 * Register `len` bytes at `ptr`, taking ownership: on success the engine owns
 * the bytes and calls `release(ptr, len, ctx)` (if not NULL) once the
 * registration is retired and no admitted work uses it. On failure the caller
 * still owns the bytes and `release` is not called. `release` runs on the
 * engine's release thread, with no OrbiTE lock held, never on the caller's
 * thread or a transport worker. It may block and may call OrbiTE functions,
 * on this engine too (which may be closing by then, so that such calls fail
 * with ORB_ECLOSED), but not orb_engine_close() or orb_engine_free() of this
 * engine. Every release of an engine's registrations has run by the time the
 * engine's last handle (engine, segment or batch) is freed.
 * Errors: ORB_EINVAL, ORB_ECLOSED, ORB_EEXIST (exactly this range is already
 * registered: its ownership was handed over before; nothing changed),
 * ORB_ERESOURCE (max_registrations), ORB_ENOMEM, and those of the RDMA
 * transport's registration (see orb_register_host_memory()).
 */
int orb_register_memory(orb_engine *engine, void *ptr, size_t len, enum orb_perm perm,
                        orb_release_fn release, void *ctx, orb_reg_id *id_out);

/**
 * Register [offset, offset + len) of `owner`, which the registration retains
 * (the caller keeps its own reference). Registering exactly the same range
 * again returns the same id, adds a reference and keeps the original
 * permission. With the RDMA transport's Direct policy the range is also
 * registered with every open NIC first (all or nothing, never a fallback to
 * staging). Errors: ORB_EINVAL (range outside the owner, len 0; or memory a
 * NIC cannot pin), ORB_ECLOSED, ORB_ERESOURCE (max_registrations; a NIC's
 * memory-region or memory-lock limit; the helper policy's registered-bytes
 * budget), ORB_EPERM (memory a NIC may not pin for writing),
 * ORB_EUNAVAILABLE (a NIC failed otherwise), ORB_ENOMEM. An RDMA failure's
 * message names the NIC.
 */
int orb_register_host_memory(orb_engine *engine, orb_host_memory *owner, size_t offset,
                             size_t len, enum orb_perm perm, orb_reg_id *id_out);

/** One range of an orb_register_host_memory_batch() call. */
struct orb_host_range {
    orb_host_memory *owner; /* borrowed; retained by the registration */
    size_t offset;
    size_t length;
    enum orb_perm perm;
};

/**
 * Register `n` ranges, all or nothing: every range is checked and every
 * resource reserved before any registration becomes visible. On success
 * `ids_out[i]` names range i. On failure nothing changed; the message names
 * the first bad index. Errors: as orb_register_host_memory().
 */
int orb_register_host_memory_batch(orb_engine *engine, const struct orb_host_range *ranges,
                                   size_t n, orb_reg_id *ids_out);

/**
 * Register [offset, offset + len) of the CUDA device allocation `owner`, which
 * the registration retains (the caller keeps its own reference), under the
 * same rules as orb_register_host_memory(): registering exactly the same
 * range again returns the same id and adds a reference. Addresses are the
 * device's (unified virtual addressing: they never collide with host
 * memory), so requests name device bytes by their device address. A request
 * whose local or remote range is device memory moves through the engine's
 * host staging, the engine's one staging pool (see "Device memory in
 * requests" in the API guide): TCP carries it on either side, and so does the
 * RDMA transport under its `cuda_memory` `staged` (the default; `direct`
 * registers it with the NICs instead); between processes of one host,
 * ORB_TRANSPORT_NVLINK copies it device to device.
 * Errors: ORB_EINVAL (owner or id_out NULL, len 0, the range outside the
 * allocation, an unknown permission), ORB_ECLOSED, ORB_ERESOURCE
 * (max_registrations), ORB_ENOMEM.
 */
int orb_register_cuda_memory(orb_engine *engine, orb_cuda_memory *owner, size_t offset, size_t len,
                             enum orb_perm perm, orb_reg_id *id_out);

/** One range of an orb_register_cuda_memory_batch() call. */
struct orb_cuda_range {
    orb_cuda_memory *owner; /* borrowed; retained by the registration */
    size_t offset;
    size_t length;
    enum orb_perm perm;
};

/**
 * Register `n` ranges of device memory, all or nothing, as
 * orb_register_host_memory_batch() does for host memory. On failure nothing
 * changed; the message names the first bad index.
 * Errors: as orb_register_cuda_memory().
 */
int orb_register_cuda_memory_batch(orb_engine *engine, const struct orb_cuda_range *ranges, size_t n,
                                   orb_reg_id *ids_out);

/**
 * Drop one reference of registration `id`. The last reference hides the range
 * from new requests at once; work already admitted keeps the backing until it
 * drains, then the owner reference is released.
 * Errors: ORB_EINVAL, ORB_ENOENT (no such id).
 */
int orb_unregister_memory(orb_engine *engine, orb_reg_id id);

/** A resolved local registration. */
struct orb_local_region {
    orb_reg_id id;
    uint64_t base;   /* first byte of the registration */
    uint64_t length; /* its length */
    enum orb_perm perm;
};

/**
 * Find a registration containing [addr, addr + len). Errors: ORB_EINVAL
 * (len 0 or overflow), ORB_ENOENT (no registration contains the whole range).
 */
int orb_resolve_local_address(orb_engine *engine, uint64_t addr, uint64_t len,
                              struct orb_local_region *out);

/* ------------------------------------------------------------------------ */
/* Peers (segments)                                                          */
/* ------------------------------------------------------------------------ */

typedef struct orb_segment orb_segment;

/**
 * Connect to the source at `endpoint` ("host:port") and prove that it is the
 * engine whose epoch is `*expected` (which must come from that engine's owner,
 * e.g. orb_engine_source_epoch()). The caller owns `*out`.
 * Errors: ORB_EINVAL, ORB_ECLOSED, ORB_ESTALE (the endpoint runs another
 * epoch), ORB_EPEER (cannot connect or the peer hung up), ORB_EPROTO,
 * ORB_ERESOURCE (the source serves max_connections peers already),
 * ORB_ETIMEDOUT, ORB_ENOMEM.
 */
int orb_open_segment(orb_engine *engine, const char *endpoint, const struct orb_epoch *expected,
                     uint64_t timeout_ns, orb_segment **out);

/**
 * Where registered bytes live. Later releases may add kinds; a value this header does not
 * name may then appear in a region description.
 */
enum orb_memory_kind {
    ORB_MEMORY_HOST = 0, /* CPU memory (pinned or not) */
    ORB_MEMORY_CUDA = 1  /* NVIDIA device memory (orb_register_cuda_memory()) */
};

/**
 * How a source registered device memory with its NICs (GPUDirect RDMA, cuda_memory "direct"):
 * bits of orb_region_desc.gpu_direct_routes.
 */
enum orb_gpu_direct_route {
    ORB_GPU_ROUTE_DMABUF = 1u << 0, /* a dma-buf export registered with ibv_reg_dmabuf_mr */
    ORB_GPU_ROUTE_PEERMEM = 1u << 1 /* the device pointer registered through a peer-memory module */
};

/**
 * A region a source publishes. The library writes every field, zeroing those it does not fill;
 * comp_mask names the optional fields it filled (none is defined in this release).
 */
struct orb_region_desc {
    uint64_t addr;
    uint64_t length;
    enum orb_perm perm;   /* ORB_PERM_REMOTE_READ or ORB_PERM_REMOTE_WRITE */
    uint32_t memory_kind; /* an enum orb_memory_kind */
    uint32_t comp_mask;   /* 0 in this release */
    /* ORB_GPU_ROUTE_* bits: the routes the source registered this device region by when it was
     * published. Evidence of how it was published, not a promise that a later request takes
     * that route; 0 for host memory and for device memory the source stages. */
    uint32_t gpu_direct_routes;
    uint64_t reserved[3]; /* 0: room for optional fields (a device, a key) before 1.0 */
};

/**
 * Ask the peer for its remotely accessible registrations. On success
 * `*regions_out` is a new array of `*count_out` entries (NULL when 0) that the
 * caller frees with orb_region_descs_free(). The list is a snapshot for
 * information, not a permission: the source checks every request again.
 * Errors: ORB_EINVAL, ORB_ECLOSED, ORB_ESTALE (the endpoint now runs another
 * epoch), ORB_EPEER, ORB_EPROTO, ORB_ETIMEDOUT, ORB_ENOMEM.
 */
int orb_segment_describe(orb_segment *segment, uint64_t timeout_ns,
                         struct orb_region_desc **regions_out, size_t *count_out);

/** Free an array from orb_segment_describe(). */
void orb_region_descs_free(struct orb_region_desc *regions);

/**
 * Drop the caller's handle. Connections close once no batch uses them; live
 * batches keep working.
 */
void orb_segment_close(orb_segment *segment);

/* ------------------------------------------------------------------------ */
/* Requests and reports                                                      */
/* ------------------------------------------------------------------------ */

enum orb_transport {
    ORB_TRANSPORT_UNSPEC = 0, /* the best transport with a path to the peer: NVLink for device
                               * memory the source shares on one host, then the same-host
                               * transport for shareable host memory, else RDMA, else TCP */
    ORB_TRANSPORT_TCP = 1,
    ORB_TRANSPORT_RDMA = 2,
    ORB_TRANSPORT_NVLINK = 3, /* CUDA IPC between device memory of processes on one host */
    ORB_TRANSPORT_SHM = 4     /* host memory of processes on one host, one copy by the source
                               * between its registration and the requester's buffer, which
                               * must come from orb_host_memory_alloc_shared() */
};

enum orb_op {
    ORB_OP_READ = 0,  /* remote -> local */
    ORB_OP_WRITE = 1  /* local -> remote */
};

enum orb_priority {
    ORB_PRIORITY_HIGH = 0, /* default */
    ORB_PRIORITY_MEDIUM = 1,
    ORB_PRIORITY_LOW = 2
};

/**
 * One transfer. [local_addr, +length) must lie in one local registration
 * (checked at submission) and [remote_addr, +length) in one peer registration
 * that allows `op` (checked by the source for the whole request before any of
 * its bytes move). A zero-initialised request is a HIGH-priority READ on the
 * best transport.
 *
 * Requests are passed in arrays, so the structure has a fixed size with room
 * to grow, as rdma-core's extended structures have: comp_mask says which optional
 * fields a caller filled. No optional field is defined in this release, so
 * comp_mask and every reserved word must be 0; a library that does not know a
 * bit refuses the request (ORB_EINVAL naming the bit) rather than ignoring it.
 */
struct orb_request {
    enum orb_transport transport;
    enum orb_op op;
    uint64_t local_addr;
    uint64_t remote_addr;
    uint64_t length; /* > 0 */
    enum orb_priority priority;
    uint32_t comp_mask;   /* optional fields in use: 0 in this release */
    uint64_t reserved[4]; /* must be 0 */
};

/** Largest notification payload. */
#define ORB_NOTIFY_MAX 4096

/** A message delivered to the source after all of a batch's data is in place. */
struct orb_notification {
    const void *data; /* borrowed during the call that takes it; copied */
    size_t length;    /* 1..ORB_NOTIFY_MAX */
};

enum orb_remote_effect {
    ORB_REMOTE_EFFECT_NONE = 0,   /* the failed span changed no peer byte */
    ORB_REMOTE_EFFECT_UNKNOWN = 1 /* an attempted WRITE may have changed peer bytes */
};

enum orb_notify_state {
    ORB_NOTIFY_NONE = 0,      /* no notification was requested */
    ORB_NOTIFY_PENDING = 1,   /* requested, not sent yet */
    ORB_NOTIFY_DELIVERED = 2, /* the source queued it */
    ORB_NOTIFY_FAILED = 3,    /* sending failed; see notification_status */
    ORB_NOTIFY_SKIPPED = 4    /* not sent because a request failed or was refused */
};

/** The first failure of a batch and the span of requests it covers. */
struct orb_transfer_failure {
    size_t request_index;     /* the first request that did not complete, across all groups */
    size_t affected_requests; /* the span: request_index through the last attempted request */
    int status;               /* negative ORB_E* of request_index (ORB_ETIMEDOUT: deadline) */
    enum orb_remote_effect remote_effect;
};

/**
 * The state of a batch. completed_* count the prefix of requests that
 * finished successfully before the first failure: a prefix, not a
 * transaction. A failure's span runs from the first request that did not
 * complete through the last request that was attempted (sent in whole or in
 * part), whatever each one's own outcome: a request in the span may have
 * succeeded, and a READ in it may have filled local bytes. Requests after the
 * span were never attempted. remote_effect is UNKNOWN when a WRITE in the span
 * may have changed peer bytes. A reported failure is never replayed
 * automatically, and a WRITE never is; before its failure is reported, an
 * RDMA READ whose queue pair died is asked again (the RDMA setting
 * read_replays, 1 by default).
 */
struct orb_batch_report {
    int done;                  /* 1: every request finished or failed */
    int status;                /* 0, or the failure's status once done */
    size_t submitted_requests; /* accepted; a group rejected at submission adds nothing */
    size_t completed_requests;
    uint64_t completed_bytes;
    int has_failure;
    struct orb_transfer_failure failure;
    enum orb_notify_state notification;
    int notification_status; /* 0 or negative ORB_E* when FAILED */
    int local_drained;       /* 1: no OrbiTE thread touches this batch's local memory */
    uint32_t comp_mask;      /* optional fields the library filled: 0 in this release */
    uint32_t reserved32;     /* 0 */
    uint64_t reserved[4];    /* 0: room for optional fields before 1.0 */
};

/**
 * Run `n` (>= 1) requests against `segment`, then deliver `notify_or_null`,
 * waiting at most `timeout_ns`. Returns 0 when every request completed and any
 * notification was delivered; otherwise the failure's status (or
 * ORB_ETIMEDOUT), and `*report` says what happened. On timeout, unstarted
 * requests are withdrawn and started ones run to completion in the background
 * with their backing retained (local_drained tells whether any remain).
 * Errors before any work (report written, submitted_requests 0, nothing
 * attempted; has_failure set, naming the rejected request, or request 0 and
 * all `n` when the call was refused as a whole): ORB_EINVAL,
 * ORB_EUNAVAILABLE, ORB_ENOENT (local range), ORB_ECLOSED, ORB_ERESOURCE,
 * ORB_ENOMEM, ORB_EPEER or ORB_ESTALE (the peer is known to be lost).
 */
int orb_submit_and_wait(orb_engine *engine, orb_segment *segment, const struct orb_request *reqs,
                        size_t n, const struct orb_notification *notify_or_null,
                        uint64_t timeout_ns, struct orb_batch_report *report);

/* ------------------------------------------------------------------------ */
/* Asynchronous batches                                                      */
/* ------------------------------------------------------------------------ */

typedef struct orb_batch orb_batch;

/**
 * Open an empty batch against `segment` (retained by the batch). The caller
 * owns `*out` and frees it with orb_batch_free() once it is done.
 * Errors: ORB_EINVAL, ORB_ECLOSED, ORB_ERESOURCE (max_batches), ORB_ENOMEM.
 */
int orb_batch_open(orb_engine *engine, orb_segment *segment, orb_batch **out);

/**
 * Submit a group of `n` requests; they start at once. Every request's fields
 * and its local side (one local registration contains its local range) are
 * checked before any request of the group starts; a failing check rejects the
 * whole group, which adds nothing to the batch (nothing attempted or counted),
 * and returns its status. The remote side is checked by the source, which
 * authorises each whole request before any of its bytes move: a request it
 * refuses fails in the batch report, while later requests of the group may
 * already be under way (see struct orb_batch_report). Requests of one group
 * may travel on different transports: if the first of them (TCP's part
 * first) refuses, the group is rejected; if a later one refuses, its requests
 * fail unattempted in the report. May be called any number of times before
 * sealing.
 * Errors: ORB_EINVAL (bad request, unknown comp_mask bit or non-zero reserved
 * word; the message names the index), ORB_EUNAVAILABLE (the transport is not
 * in this engine or has no path to the peer), ORB_ENOENT (local range not registered),
 * ORB_EBUSY (sealed), ORB_ECLOSED, ORB_ERESOURCE, ORB_ENOMEM, ORB_EPEER or
 * ORB_ESTALE (the peer is known to be lost; the group is rejected), or the
 * batch's failure status if it already failed.
 */
int orb_batch_submit(orb_batch *batch, const struct orb_request *reqs, size_t n);

/**
 * Seal the batch: no more groups. If `notify_or_null` is given (copied), it is
 * sent once every request has completed, and skipped if one failed. It is sent
 * from the caller's thread: by this call if the requests are already done,
 * else by the orb_batch_poll()/orb_batch_wait() that first finds them done.
 * Errors: ORB_EINVAL (notification too large or empty), ORB_EBUSY (already sealed).
 */
int orb_batch_seal(orb_batch *batch, const struct orb_notification *notify_or_null);

/**
 * Non-blocking: write a snapshot into `*report`. Returns ORB_EAGAIN while the
 * batch runs (or is unsealed), else its final status (0 or the failure status).
 */
int orb_batch_poll(orb_batch *batch, struct orb_batch_report *report);

/**
 * Wait up to `timeout_ns` for the sealed batch to finish; writes `*report`.
 * Returns the final status, ORB_ETIMEDOUT if it is still running, or
 * ORB_EINVAL if the batch is not sealed.
 */
int orb_batch_wait(orb_batch *batch, uint64_t timeout_ns, struct orb_batch_report *report);

/**
 * Free a batch. Refuses with ORB_EBUSY while any of its work is live (never
 * frees live work); NULL returns 0.
 */
int orb_batch_free(orb_batch *batch);

/* ------------------------------------------------------------------------ */
/* Notifications at the source                                               */
/* ------------------------------------------------------------------------ */

/** A received notification. */
struct orb_notification_msg {
    struct orb_epoch sender; /* the sending engine's source epoch */
    uint32_t length;
    uint8_t data[ORB_NOTIFY_MAX];
};

/**
 * Move up to `cap` queued notifications, oldest first, into `out`; writes the
 * number moved (possibly 0) to `*count_out`. Never blocks.
 * Errors: ORB_EINVAL.
 */
int orb_engine_poll_notifications(orb_engine *engine, struct orb_notification_msg *out,
                                  size_t cap, size_t *count_out);

/* ------------------------------------------------------------------------ */
/* Endpoint directory (etcd)                                                 */
/* ------------------------------------------------------------------------ */

/*
 * A directory where engines publish their endpoint, epoch, host and remotely accessible regions
 * under a name, and where peers resolve names to them: on etcd (v3, through its HTTP gateway,
 * with libcurl loaded at run time). A resolved entry is a hint, never an authority: opening a
 * segment proves the epoch, and a stale entry gets ORB_ESTALE there.
 */
typedef struct orb_directory orb_directory;

/** Names: 1..127 bytes of [A-Za-z0-9._:-]. */
#define ORB_DIRECTORY_NAME_MAX 128
/** Regions kept in one entry (an engine with more publishes the first this many, by address). */
#define ORB_DIRECTORY_REGIONS_MAX 256
/** Host names, NUL included. */
#define ORB_DIRECTORY_HOST_MAX 256

/** Where the directory is and how to talk to it; read during orb_directory_open() only. */
struct orb_directory_params {
    /** etcd client URLs, comma-separated ("http://10.0.0.2:2379,http://10.0.0.3:2379"); required.
     *  https URLs use TLS with the files below. Tried in order until one answers. */
    const char *endpoints;
    /** Key prefix, for a tenant or a job: starts and ends with '/', at most 128 bytes, no
     *  ".." component (NULL: "/orbite/"). Entries live at prefix + name. */
    const char *prefix;
    /** Seconds a published entry outlives its engine (its lease's TTL): 2..3600 (0: 10). The
     *  directory refreshes it every third of that. */
    uint32_t lease_ttl_s;
    uint32_t reserved32;     /* 0 */
    /** Bound of each call's exchange with etcd, in ns (0: 5 s). */
    uint64_t timeout_ns;
    /** TLS: a CA bundle to verify the servers with, and a client certificate and key (NULL:
     *  the system's CAs, no client certificate). */
    const char *ca_file;
    const char *cert_file;
    const char *key_file;
    /** etcd authentication (NULL: none): a token is taken with them and renewed when it expires. */
    const char *username;
    const char *password;
    uint64_t reserved[4];    /* 0 */
};

/** One resolved entry (written by orb_directory_resolve() and orb_directory_watch()). */
struct orb_directory_entry {
    char name[ORB_DIRECTORY_NAME_MAX];
    char endpoint[ORB_ENDPOINT_MAX];    /* the engine's source endpoint, "host:port" */
    struct orb_epoch epoch;             /* its epoch when it published */
    char host[ORB_DIRECTORY_HOST_MAX];  /* the publishing host's name (information only) */
    uint64_t revision;                  /* etcd's modification revision of the entry */
    uint32_t nregions;
    uint32_t reserved32;                /* 0 */
    struct orb_region_desc regions[ORB_DIRECTORY_REGIONS_MAX]; /* [0, nregions): by address */
};

/**
 * Open a directory on the etcd cluster `params` names, and check that it answers (within the
 * timeout). The caller owns `*out` and closes it with orb_directory_close().
 * Errors: ORB_EINVAL (NULL, no endpoints, a bad prefix, TTL out of range, a non-zero reserved
 * field; the message names it), ORB_EUNAVAILABLE (libcurl cannot be loaded, or this liborbite was
 * built without it), ORB_EPEER (no endpoint answered, or authentication failed: the message
 * says which and why), ORB_ETIMEDOUT, ORB_ENOMEM.
 */
int orb_directory_open(const struct orb_directory_params *params, orb_directory **out);

/**
 * Withdraw every entry this directory published (their leases are revoked, within the
 * timeout; an unreachable etcd lets them expire on their own after the TTL), stop refreshing and
 * free. NULL does nothing.
 */
void orb_directory_close(orb_directory *dir);

/**
 * Publish `engine`'s source endpoint, epoch, this host's name and its remotely accessible
 * regions (as orb_segment_describe() would give them now) under `name`, replacing whatever entry
 * had that name (an engine that restarted publishes its new epoch). The entry lives while the
 * directory refreshes its lease: a process that dies loses it after lease_ttl_s. The directory
 * refreshes it in the background and, when etcd lost it (restarted without its data, or the
 * lease expired while etcd was unreachable), publishes it again on its own. Publish again after
 * registering or unregistering to update the regions.
 * Errors: ORB_EINVAL (NULL, a bad name), ORB_EUNAVAILABLE (the engine has no source),
 * ORB_ERESOURCE (1024 names published by this directory), ORB_EPEER (etcd refused or is
 * unreachable), ORB_ETIMEDOUT, ORB_ENOMEM.
 */
int orb_directory_publish(orb_directory *dir, const char *name, orb_engine *engine);

/**
 * Remove the entry `name` this directory published, and stop refreshing it.
 * Errors: ORB_EINVAL, ORB_ENOENT (not published by this directory), ORB_EPEER, ORB_ETIMEDOUT.
 */
int orb_directory_unpublish(orb_directory *dir, const char *name);

/**
 * Resolve `name` into `*out` (written only on success).
 * Errors: ORB_EINVAL (NULL, a bad name), ORB_ENOENT (no entry, or it expired), ORB_EPROTO (the
 * stored entry is not one this library writes: it is refused, never half-read), ORB_EPEER,
 * ORB_ETIMEDOUT.
 */
int orb_directory_resolve(orb_directory *dir, const char *name, struct orb_directory_entry *out);

/**
 * Wait, at most `timeout_ns`, for the entry `name` to change after etcd revision
 * `after_revision` (an entry's `revision`). With 0: the entry as it is now when there is one
 * (at once), else its first publication or change from now on, with no gap between the two
 * (how a peer waits for a name to appear). On a new or replaced entry *out is written and
 * *deleted_out set to 0; on its removal or expiry *deleted_out is 1 and only out->name and
 * out->revision are written.
 * Errors: ORB_EINVAL, ORB_ETIMEDOUT (no change), ORB_EPROTO (a malformed entry), ORB_EPEER.
 */
int orb_directory_watch(orb_directory *dir, const char *name, uint64_t after_revision, uint64_t timeout_ns,
                        struct orb_directory_entry *out, int *deleted_out);

#ifdef __cplusplus
}
#endif

#endif /* ORBITE_ORBITE_H */
