/* Internal: the registration table of one engine (containment, permission, pins).
 *
 * A registration is a range of a memory owner. Users hold references (register / unregister);
 * admitted work holds pins (acquire / release). The last unregister hides the range from lookups
 * at once; the owner is released when the last pin goes. Thread-safe. */
#ifndef ORB_CORE_REGISTRY_H
#define ORB_CORE_REGISTRY_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <orbite/orbite.h>

#include "memory.h"
#include "reaper.h"

/* Transports are held in arrays indexed by their public id (enum orb_transport). */
#define ORB_TRANSPORT_SLOTS 5

/* Memory kinds: each is a small operation table, chosen per registration. */
struct orb_reg;

enum orb_mem_kind { ORB_MEM_HOST = 0, ORB_MEM_PINNED = 1, ORB_MEM_CUDA = 2 };

struct orb_memkind_ops {
    enum orb_mem_kind kind;
    const char *name;
    /* A CPU-addressable pointer for `addr` inside the registration, or NULL when the bytes need
     * staging (device memory). Host and pinned memory return the address itself. */
    void *(*cpu_view)(const struct orb_reg *reg, uint64_t addr);
    /* The owner object's first byte, length and reference counting (reg->owner is one of this
     * kind's owners: an orb_host_memory, an orb_cuda_memory). */
    uint64_t (*owner_base)(const void *owner);
    size_t (*owner_size)(const void *owner);
    void (*owner_ref)(void *owner);
    void (*owner_unref)(void *owner);
    /* 1 when dropping the owner's last reference must happen on the release thread (it runs a
     * user's callback or a driver call that may block); 0 when it only frees memory. */
    int (*owner_defers)(const void *owner);
    /* Wait, once, for work a producer recorded on the owner (a GPU stream's) before the first
     * access: every path that touches a registration's bytes calls it first. 0, or the wait's
     * failure (ORB_EUNQUIESCED: the owner is fenced). NULL: nothing to wait for. */
    int (*ready)(const struct orb_reg *reg);
    /* Range loans of kinds without a CPU view (NULL otherwise): [addr, +len) lent to one request
     * or one peer operation while its copies run; `writes` when they write the memory. A loan
     * conflicts with an overlapping one when either writes, in this engine or another of the
     * process (a copy to itself through the source included). Errors: ORB_EBUSY (naming the
     * conflict), ORB_ENOMEM. */
    int (*loan)(const struct orb_reg *reg, uint64_t addr, uint64_t len, int writes, void **loan_out);
    void (*loan_end)(void *loan);
    /* Host memory to stage this kind's bytes through, as fast to copy to and from as the kind
     * allows (pinned memory, for device memory): `len` bytes, page-aligned, given back with
     * stage_free; NULL when none can be had, and the caller uses ordinary memory. NULL op:
     * ordinary memory. */
    void *(*stage_alloc)(const struct orb_reg *reg, size_t len);
    void (*stage_free)(void *p);
    /* Staging from stage_alloc that the device may still use (a copy through it unproven): it is
     * never freed, and the kind counts it as retained. NULL: nothing to count. */
    void (*stage_keep)(void *p);
    /* Staging copies for kinds without a CPU view (NULL otherwise): [addr, +len) of the
     * registration into or out of `host`, complete when they return 0. Errors: the kind's.
     * `*held` (never NULL) is true exactly when the copy's end was not proven (ORB_EUNQUIESCED):
     * the device may still use `host`, which is then never reused or freed. A refusal of memory
     * fenced before (ORB_EUNQUIESCED too) queued nothing: `host` is free again. */
    int (*to_host)(const struct orb_reg *reg, uint64_t addr, void *host, size_t len, bool *held);
    int (*from_host)(const struct orb_reg *reg, uint64_t addr, const void *host, size_t len, bool *held);
};

extern const struct orb_memkind_ops orb_memkind_host;

/* One range of one owner of `kind`, as the registry takes it (orb_host_range and its CUDA
 * counterpart both become this). */
struct orb_reg_range {
    const struct orb_memkind_ops *kind;
    void *owner;                 /* borrowed; retained by the registration */
    size_t offset;
    size_t length;
    enum orb_perm perm;
};

/* What the engine does when a registration is created and retired: its transports' state
 * (memory regions, keys) lives in the registration. attach runs before the registration becomes
 * visible and fills reg->tp_state, all or nothing (a failure leaves every slot NULL); when its
 * own undo fails it takes a reference to reg->owner that it never drops, so the bytes a device
 * may still map are never released. retire runs on the release thread once the last pin
 * dropped, before the owner reference; non-zero means some state could not be undone, and the
 * owner reference is then kept forever for the same reason. */
struct orb_reg_hooks {
    void *ctx;
    int (*attach)(void *ctx, struct orb_reg *reg);
    int (*retire)(void *ctx, struct orb_reg *reg);
};

struct orb_reg {
    orb_reg_id id;
    uint64_t base;
    uint64_t len;
    enum orb_perm perm;
    const struct orb_memkind_ops *kind;
    void *owner;                 /* one of kind's owners, retained until the struct is freed */
    atomic_uint_fast64_t pins;   /* 1 for table membership + 1 per admitted user */
    uint32_t user_refs;          /* register/unregister count; written under both locks */
    struct orb_reaper *reaper;   /* where the owner reference is dropped after the last pin */
    struct orb_reap_node reap;
    /* Each transport's state, by transport id; written before publication, then read-only. */
    void *tp_state[ORB_TRANSPORT_SLOTS];
    uint32_t gpu_routes;         /* ORB_GPU_ROUTE_* its transports registered it by; before publication */
    const struct orb_reg_hooks *hooks; /* NULL: nothing to retire */
};

struct orb_registry;

/* A table allowing at most `max_registrations` live registrations. Owners whose last pin drops
 * are released on `reaper`'s thread (NULL: in the thread that drops the pin). `hooks` (NULL for
 * none; borrowed, must outlive every registration) attach and retire transport state. */
int orb_registry_new(uint32_t max_registrations, struct orb_reaper *reaper,
                     const struct orb_reg_hooks *hooks, struct orb_registry **out);

/* Unpublish every registration at once, as if each had been unregistered to the last user
 * reference. The table stays usable (and empty). */
void orb_registry_retire_all(struct orb_registry *reg);

/* Free the table. Registrations still pinned by admitted work stay alive until released. */
void orb_registry_free(struct orb_registry *reg);

/* Register [offset, offset+len) of `owner` (retained). An identical (base, len) range already
 * registered gains a user reference and keeps its permission; its id is returned.
 * Errors: ORB_EINVAL, ORB_ERESOURCE, ORB_ENOMEM. */
int orb_registry_add(struct orb_registry *reg, orb_host_memory *owner, size_t offset, size_t len,
                     enum orb_perm perm, orb_reg_id *id_out);

/* Register [offset, offset+len) of `owner` only if no identical range is published: the table
 * decides under its lock, so the answer cannot race with a concurrent add or remove. For bytes
 * whose ownership is handed over (orb_register_memory()), which cannot be handed over twice.
 * Errors: as orb_registry_add(), and ORB_EEXIST (the range is published; nothing changed). */
int orb_registry_adopt(struct orb_registry *reg, orb_host_memory *owner, size_t offset, size_t len,
                       enum orb_perm perm, orb_reg_id *id_out);

/* All or nothing; see orb_register_host_memory_batch(). */
int orb_registry_add_batch(struct orb_registry *reg, const struct orb_host_range *ranges, size_t n,
                           orb_reg_id *ids_out);

/* The same for ranges of any memory kind (each range names its own). */
int orb_registry_add_ranges(struct orb_registry *reg, const struct orb_reg_range *ranges, size_t n,
                            orb_reg_id *ids_out);

/* kind->loan() where the kind lends ranges (*out NULL otherwise, and 0); orb_reg_loan_end()
 * gives it back (NULL: nothing). */
int orb_reg_loan(const struct orb_reg *r, uint64_t addr, uint64_t len, int writes, void **out);
void orb_reg_loan_end(const struct orb_reg *r, void *loan);

/* Staging memory for r's bytes (kind->stage_alloc, else page-aligned ordinary memory), and the
 * function that frees it into *free_out. NULL when there is no memory at all. */
void *orb_reg_stage_alloc(const struct orb_reg *r, size_t len, void (**free_out)(void *));
/* `p` (from orb_reg_stage_alloc, freed by `free_fn`) is kept for good: the device may still use
 * it. Counted by the kind when it came from the kind's own staging. */
void orb_reg_stage_keep(const struct orb_reg *r, void *p, void (*free_fn)(void *));

/* kind->ready(r) where the kind has one; 0 otherwise. */
int orb_reg_ready(const struct orb_reg *r);

/* Take a reference to r's owner that is never dropped: transport state that could not be undone
 * may still map its bytes, which must then never be released. */
void orb_reg_keep_owner(const struct orb_reg *r);

/* Drop one user reference; the last one unpublishes. Errors: ORB_ENOENT. */
int orb_registry_remove(struct orb_registry *reg, orb_reg_id id);

/* Describe a registration containing [addr, addr+len). Errors: ORB_EINVAL, ORB_ENOENT. */
int orb_registry_resolve(struct orb_registry *reg, uint64_t addr, uint64_t len,
                         struct orb_local_region *out);

/* Admission: find a published registration containing [addr, addr+len) whose permission
 * includes `need` (ORB_PERM_LOCAL for the engine's own side, ORB_PERM_REMOTE_READ or
 * ORB_PERM_REMOTE_WRITE for a peer's request) and pin it.
 * Errors: ORB_EINVAL (len 0 or overflow), ORB_ENOENT (no registration contains the range; for a
 * peer's need, local-only registrations are invisible and never contain it), ORB_EPERM (some
 * peer-visible registration does, none allows `need`: a WRITE into a REMOTE_READ range). */
int orb_registry_acquire(struct orb_registry *reg, uint64_t addr, uint64_t len, enum orb_perm need,
                         struct orb_reg **out);

/* How many registrations have left the table so far (unregistered or retired). A holder of a pin
 * that read this count before orb_registry_acquire() knows, while the count is unchanged, that
 * the registration it pinned is still published and admits what it admitted then: a source
 * serving a run of requests admits each without the table's lock (orb_reg_admits()). */
uint64_t orb_registry_unpublished(const struct orb_registry *reg);

/* 1 if `r` contains [addr, addr+len) and its permission includes `need`, by the rules of
 * orb_registry_acquire() (local-only registrations never admit a peer's need); 0 otherwise,
 * for bad arguments too. Looks at `r` only: whether it is still published is the caller's
 * question (orb_registry_unpublished()). */
int orb_reg_admits(const struct orb_reg *r, uint64_t addr, uint64_t len, enum orb_perm need);

/* Unpin. The last pin of an unpublished registration releases its owner, on the reaper's thread
 * when the owner has a release callback. Takes no lock but the reaper's queue lock, so it may be
 * called with any other lock held. NULL is a no-op. */
void orb_registry_release(struct orb_reg *r);

/* One more pin of `r`, for a caller that holds one already (admitted work it hands on): released
 * with orb_registry_release() like an acquired one. */
void orb_registry_retain(struct orb_reg *r);

/* A new array (free with free()) of every published registration allowing remote READ. */
int orb_registry_describe_remote(struct orb_registry *reg, struct orb_region_desc **out, size_t *count);

/* Number of published registrations. */
size_t orb_registry_count(struct orb_registry *reg);

#endif
