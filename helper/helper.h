/* orbite-helper internals shared by main.c, handlers.c, slots.c and their tests.
 *
 * One helper serves one library instance over fd 3. Everything the handlers need is decided
 * or opened before the seccomp filter is loaded and lives in struct orb_helper_state: the held
 * directory fds, the inventory, the tenant's decided policy and the per-session objects (device
 * fds handed over, attached slot objects). */
#ifndef ORB_HELPER_HELPER_H
#define ORB_HELPER_HELPER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/helper_proto.h"
#include "helper/devx.h"
#include "helper/uctx.h"
#include "topo/inventory.h"
#include "topo/slots.h"

/* Exit statuses: 0 only for a session the library ended by closing its socket. */
enum orb_helper_exit {
    ORB_HELPER_EXIT_EOF = 0,      /* the library closed the socket */
    ORB_HELPER_EXIT_STARTUP = 1,  /* a start-up step failed */
    ORB_HELPER_EXIT_PROTOCOL = 2, /* malformed or unexpected message, or a failed reply */
    ORB_HELPER_EXIT_CAPS = 3,     /* capabilities or ids outside what the helper accepts */
    ORB_HELPER_EXIT_ORPHAN = 4,   /* no parent, or fd 3 is not the library's socket */
    ORB_HELPER_EXIT_STALLED = 5,  /* the library left a reply unread for ORB_HELPER_REPLY_DEADLINE_MS */
    ORB_HELPER_EXIT_MONITOR = 6,  /* the privileged monitor failed or went away */
    ORB_HELPER_EXIT_USAGE = 64,   /* the installed helper takes no arguments */
};

#define ORB_HELPER_SOCK ORB_HP_FD
#define ORB_HELPER_SLOT_SIZE 4096u   /* a slot object is one page: the header and zeros */
#define ORB_HELPER_SLOT_MODE 0644u   /* administrator's, readable by every participant */
/* The administrator's 0700 directory in /dev/shm for objects under construction and lock files:
 * '+' is not allowed in slot names, so no slot can take this name. */
#define ORB_HELPER_PRIVATE_DIR "orbite+helper"
#define ORB_HELPER_REPLY_DEADLINE_MS 1000 /* a library that does not take a reply by then is dropped */
#define ORB_HELPER_UVERBS_MAX 16     /* "uverbsNNN" + NUL */

/* Candidate files of the GPU peer-memory probe, NCCL's order (bit i of the reply). */
#define ORB_HELPER_PEERMEM_CANDIDATES 3
extern const char *const orb_helper_peermem_files[ORB_HELPER_PEERMEM_CANDIDATES];

/* One attached slot object of this session. */
struct orb_helper_slot {
    char name[ORB_HP_NAME_MAX + 1]; /* "" when the entry is unused */
    int fd;                         /* read-write (or read-only when re-open was refused) */
    int lock_fd;                    /* its lock file in its directory; -1 when read-only */
    int dir_fd;                     /* its directory in the private one (slot_dirs owns it) */
    bool writable;                  /* fd is read-write: may take over publishing */
    bool publisher;                 /* holds the lock and publishes every millisecond */
    bool dead;                      /* header found damaged after attach: never publish */
    void *map;                      /* ORB_HELPER_SLOT_SIZE bytes, MAP_SHARED */
    uint64_t interval_ns;
    dev_t dev;                      /* identity checked on the library's read-only open */
    ino_t ino;
};

struct orb_helper_state {
    int sock;                       /* the library's socket (fd 3) */
    int sysfs_fd;                   /* held directory fds; -1 when absent */
    int devib_fd;
    int shm_fd;
    int priv_fd;                    /* ORB_HELPER_PRIVATE_DIR in shm_fd (monitor only) */
    struct orb_helper_slot_dir {    /* priv_fd/<slot name>, opened so far */
        char name[ORB_HP_NAME_MAX + 1]; /* "" when unused */
        int fd;
    } slot_dirs[ORB_HP_MAX_SLOTS];
    bool sealed;                    /* the monitor's filter is loaded: no directory can be opened now */
    int monitor_sock;               /* worker: the monitor's socket; -1 in the monitor or in-process */
    const struct orb_helper_priv_ops *priv; /* the two privileged steps (monitor.h) */
    int exit_code;                  /* set by a handler that ends the session with a code of its own */
    uid_t admin_uid;                /* owner of policy files and slot objects (root) */
    gid_t admin_gid;                /* group given to new slot objects; (gid_t)-1: unchanged */
    uid_t uid;                      /* the tenant: the helper's own real ids */
    gid_t gid;
    uint64_t caps_kept;             /* permitted capabilities after the drop */
    struct orb_topo_inventory *inv; /* owned */
    char uverbs[ORB_TOPO_MAX_NICS][ORB_HELPER_UVERBS_MAX]; /* NIC id -> uverbs node, "" none */
    bool mlx5[ORB_TOPO_MAX_NICS];   /* NIC id driven by mlx5_core */
    struct orb_hp_policy allowed;   /* what this tenant may use, decided at start-up */
    bool domain_ok;                 /* clock domain known (slots need it) */
    struct orb_clock_domain domain;
    int dev_fds[ORB_TOPO_MAX_NICS]; /* dup of the last uverbs fd handed over, -1 none */
    bool devx[ORB_TOPO_MAX_NICS];   /* that fd's device context was created with DevX */
    struct orb_helper_slot slots[ORB_HP_MAX_SLOTS];
    const struct orb_uctx_ops *uctx_ops; /* device context creation (OPEN_DEVICE) */
    void *uctx_impl;
    const struct orb_devx_ops *devx_ops;  /* key queries (DEVX_VERIFY) */
    void *devx_impl;
    bool hello_done;
    uint64_t next_takeover_ns;      /* next attempt to take over an idle publisher */
};

struct orb_helper_priv_ops;

/* Fresh state: every fd -1, nothing attached, privileged steps in-process (orb_helper_priv_local). `inv` is taken over (freed by _release). */
void orb_helper_state_init(struct orb_helper_state *st, int sock, struct orb_topo_inventory *inv);
/* Close every held fd, unmap slots, free the inventory. Safe on a zeroed or _init'ed state. */
void orb_helper_state_release(struct orb_helper_state *st);

/* Fill uverbs[] and mlx5[] from the sysfs tree (class/infiniband_verbs/<node>/ibdev and the
 * NIC's device/driver link). Before the filter. */
void orb_helper_map_devices(struct orb_helper_state *st);

/* ---- request handlers (handlers.c) ----------------------------------------------------------
 * Each decodes its request, decides, and sends exactly one reply. A malformed body (the
 * decoder's ORB_EPROTO) or a failed send returns negative: the session ends. A refusal is a
 * reply with a negative status and returns 0. */
int orb_helper_on_hello(struct orb_helper_state *st, const struct orb_hp_msg *m);
int orb_helper_on_inventory(struct orb_helper_state *st, const struct orb_hp_msg *m);
int orb_helper_on_policy(struct orb_helper_state *st, const struct orb_hp_msg *m);
int orb_helper_on_open_device(struct orb_helper_state *st, const struct orb_hp_msg *m);
int orb_helper_on_peermem(struct orb_helper_state *st, const struct orb_hp_msg *m);
int orb_helper_on_slot_attach(struct orb_helper_state *st, const struct orb_hp_msg *m);
int orb_helper_on_devx_verify(struct orb_helper_state *st, const struct orb_hp_msg *m);

/* Open NIC `id`'s uverbs node through the held directory fd and prove it is that NIC's node: a
 * character device whose number is the one sysfs gives for it right now. The policy check is
 * the caller's. Errors: ORB_EUNAVAILABLE (no node), ORB_EPERM (symlink, wrong device, refused). */
int orb_helper_open_uverbs(struct orb_helper_state *st, int id, int *out);

/* The inventory's NIC `nic_id` when the policy grants it over RDMA, else NULL. */
const struct orb_topo_nic *orb_helper_granted_nic(const struct orb_helper_state *st, int nic_id);

/* The inventory id of the NIC called `name`, or -1. */
int orb_helper_find_nic(const struct orb_helper_state *st, const char *name);

/* ---- shared slot objects (slots.c) ---------------------------------------------------------- */

/* Create or attach the slot object `name` in the held /dev/shm directory and return in *ro_fd
 * a new read-only descriptor of it for the library (O_CLOEXEC; the caller owns it). The policy
 * check is the caller's. Errors (the reply's status): ORB_EINVAL (interval out of bounds),
 * ORB_EUNAVAILABLE (no /dev/shm, no clock domain, a capability the creation needs is missing),
 * ORB_EPERM (squatted or symlinked name, wrong owner, mode, link count, size or type; another
 * boot or time namespace; a foreign object), ORB_EPROTO (damaged header), ORB_ECONFIG (a valid
 * object with another interval), ORB_ERESOURCE (ORB_HP_MAX_SLOTS attached). */
int orb_helper_slot_open_shared(struct orb_helper_state *st, const char *name, uint64_t interval_ns, int *ro_fd);

/* Open (or create, as the administrator's 0700 directory) ORB_HELPER_PRIVATE_DIR in shm_fd into
 * st->priv_fd. Before the monitor's filter. A directory that a tenant made or filled is refused.
 * Errors: ORB_EUNAVAILABLE (no /dev/shm, a capability missing), ORB_EPERM (wrong owner, mode or
 * type, or tampered with while being created). */
int orb_helper_slots_prepare(struct orb_helper_state *st);

/* Open (creating them where missing) the directories of the slot names the policy grants, in
 * st->slot_dirs, before the monitor's filter and Landlock, which then name them alone. Returns
 * 0, or the first failure (the other names are still prepared). */
int orb_helper_slots_prepare_names(struct orb_helper_state *st);

/* Publish every slot this helper holds the lock of, at now_ns; every `takeover` call also try
 * to take the lock of attached objects whose publisher has gone. Returns whether any slot is
 * attached (the serve loop then wakes every millisecond). */
bool orb_helper_slots_tick(struct orb_helper_state *st, uint64_t now_ns);

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t orb_helper_now_ns(void);

#endif
