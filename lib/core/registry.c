/* The registration table: published ranges sorted by (base, length) for containment lookups, and
 * the same registrations by id for unregister.
 *
 * Locking: a writer mutex, then one rwlock. Only add, remove and retire_all change the table, and
 * each holds the writer mutex throughout, so a writer reads the table without the rwlock and
 * takes it exclusive only for the moment it changes the indexes. Lookups (resolve, acquire,
 * describe, count) take the rwlock shared: a transport's reg_attach (an RDMA memory registration
 * may take milliseconds) runs under the writer mutex alone and never blocks admission. A
 * published registration holds one pin for its table membership, so acquire can pin with a plain
 * atomic increment while it holds the shared lock: the membership pin cannot be dropped before
 * remove gets the exclusive lock. Whoever drops the last pin hands the registration to the
 * release thread (transport state, then the owner reference), outside every lock. */
#include "registry.h"

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

/* One slot of the id index. Slots of unpublished registrations become holes (reg == NULL) and are
 * squeezed out when they outnumber the live ones, so remove never allocates. */
struct id_slot {
    orb_reg_id id;
    struct orb_reg *reg;
};

struct orb_registry {
    pthread_mutex_t writer;   /* held by every change of the table, around the rwlock */
    pthread_rwlock_t lock;
    struct orb_reg **by_addr; /* published, sorted by (base, len); (base, len) is unique */
    size_t count;             /* entries of by_addr */
    size_t addr_cap;
    struct id_slot *by_id;    /* ascending ids, with holes */
    size_t id_len;
    size_t id_cap;
    size_t id_holes;
    uint64_t max_len;         /* >= the length of every published registration */
    orb_reg_id next_id;       /* never 0, never reused */
    atomic_uint_fast64_t unpublished; /* registrations taken out of the table so far */
    uint32_t max_registrations;
    struct orb_reaper *reaper;
    const struct orb_reg_hooks *hooks; /* NULL: no transport keeps registration state */
};

/* Small batches (single registrations above all) keep their scratch arrays on the stack. */
#define REG_SCRATCH_INLINE 8

static int perm_valid(enum orb_perm perm)
{
    return perm == ORB_PERM_LOCAL || perm == ORB_PERM_REMOTE_READ || perm == ORB_PERM_REMOTE_WRITE;
}

static int perm_allows(enum orb_perm perm, enum orb_perm need)
{
    switch (need) {
    case ORB_PERM_LOCAL: return 1;
    case ORB_PERM_REMOTE_READ: return perm == ORB_PERM_REMOTE_READ || perm == ORB_PERM_REMOTE_WRITE;
    case ORB_PERM_REMOTE_WRITE: return perm == ORB_PERM_REMOTE_WRITE;
    default: return 0;
    }
}

static int key_cmp(uint64_t base_a, uint64_t len_a, uint64_t base_b, uint64_t len_b)
{
    if (base_a != base_b)
        return base_a < base_b ? -1 : 1;
    if (len_a != len_b)
        return len_a < len_b ? -1 : 1;
    return 0;
}

/* Index of the first published registration whose base is above `addr`. */
static size_t upper_bound_base(const struct orb_registry *reg, uint64_t addr)
{
    size_t lo = 0, hi = reg->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (reg->by_addr[mid]->base <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Position of (base, len) in by_addr, or where it would be inserted; *found says which. */
static size_t find_exact(const struct orb_registry *reg, uint64_t base, uint64_t len, int *found)
{
    size_t lo = 0, hi = reg->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const struct orb_reg *r = reg->by_addr[mid];
        int c = key_cmp(r->base, r->len, base, len);
        if (c == 0) {
            *found = 1;
            return mid;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = 0;
    return lo;
}

static struct id_slot *find_id(struct orb_registry *reg, orb_reg_id id)
{
    size_t lo = 0, hi = reg->id_len;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (reg->by_id[mid].id == id)
            return reg->by_id[mid].reg != NULL ? &reg->by_id[mid] : NULL;
        if (reg->by_id[mid].id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static void compact_ids(struct orb_registry *reg)
{
    size_t w = 0;
    for (size_t i = 0; i < reg->id_len; i++)
        if (reg->by_id[i].reg != NULL)
            reg->by_id[w++] = reg->by_id[i];
    reg->id_len = w;
    reg->id_holes = 0;
}

/* Walk the published registrations that contain [addr, addr + len) (len > 0, no overflow), from the
 * highest base down. The scan stops once a base is further below `addr` than the longest
 * registration, since no earlier one can reach `addr`. Returns the first that allows `need`, or
 * NULL with *contained saying whether any contained the range. For a peer's need, local-only
 * registrations are skipped entirely, so they count as not containing it. Caller holds the
 * lock. */
static struct orb_reg *lookup(const struct orb_registry *reg, uint64_t addr, uint64_t len,
                              enum orb_perm need, int *contained)
{
    uint64_t end = addr + len;
    *contained = 0;
    for (size_t i = upper_bound_base(reg, addr); i > 0; i--) {
        struct orb_reg *r = reg->by_addr[i - 1];
        if (addr - r->base > reg->max_len)
            break;
        if (r->base + r->len < end)
            continue;
        if (need != ORB_PERM_LOCAL && r->perm == ORB_PERM_LOCAL)
            continue; /* local-only ranges do not exist for peers, not even as "forbidden" */
        *contained = 1;
        if (perm_allows(r->perm, need))
            return r;
    }
    return NULL;
}

static struct orb_reg *reg_of_node(struct orb_reap_node *node)
{
    return (struct orb_reg *)(void *)((char *)node - offsetof(struct orb_reg, reap));
}

static void reg_finish(struct orb_reap_node *node)
{
    free(reg_of_node(node));
}

static int reg_retire_state(struct orb_reap_node *node)
{
    struct orb_reg *r = reg_of_node(node);
    return r->hooks->retire(r->hooks->ctx, r);
}

static void reg_put(struct orb_reg *r)
{
    /* acq_rel: every pinned user's accesses happen before the owner is released. The release
     * itself (a user callback, perhaps) runs on the reaper's thread, never under the caller's
     * locks. */
    if (atomic_fetch_sub_explicit(&r->pins, 1, memory_order_acq_rel) == 1) {
        r->reap.owner = r->owner;
        r->reap.unref = r->kind->owner_unref;
        r->reap.defers = r->kind->owner_defers(r->owner);
        r->reap.retire = r->hooks != NULL ? reg_retire_state : NULL;
        r->reap.finish = reg_finish;
        orb_reaper_defer(r->reaper, &r->reap);
    }
}

int orb_registry_new(uint32_t max_registrations, struct orb_reaper *reaper,
                     const struct orb_reg_hooks *hooks, struct orb_registry **out)
{
    if (out == NULL)
        return orb_fail(ORB_EINVAL, "registry: out is NULL");
    if (max_registrations == 0)
        return orb_fail(ORB_EINVAL, "registry: max_registrations is zero");
    struct orb_registry *reg = calloc(1, sizeof *reg);
    if (reg == NULL)
        return orb_fail(ORB_ENOMEM, "registry: no memory for the table");
    atomic_init(&reg->unpublished, 0);

    pthread_rwlockattr_t attr;
    if (pthread_rwlockattr_init(&attr) != 0) {
        free(reg);
        return orb_fail(ORB_ENOMEM, "registry: cannot initialise lock attributes");
    }
    /* Writers must not starve behind a steady stream of admissions. */
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    int rc = pthread_rwlock_init(&reg->lock, &attr);
    pthread_rwlockattr_destroy(&attr);
    if (rc != 0) {
        free(reg);
        return orb_fail(ORB_ENOMEM, "registry: cannot initialise the table lock");
    }
    if (pthread_mutex_init(&reg->writer, NULL) != 0) {
        pthread_rwlock_destroy(&reg->lock);
        free(reg);
        return orb_fail(ORB_ENOMEM, "registry: cannot initialise the writer lock");
    }
    reg->next_id = 1;
    reg->max_registrations = max_registrations;
    reg->reaper = reaper;
    reg->hooks = hooks != NULL && hooks->attach != NULL && hooks->retire != NULL ? hooks : NULL;
    *out = reg;
    return 0;
}

void orb_registry_retire_all(struct orb_registry *reg)
{
    if (reg == NULL)
        return;
    pthread_mutex_lock(&reg->writer);
    pthread_rwlock_wrlock(&reg->lock);
    struct orb_reg **list = reg->by_addr;
    size_t n = reg->count;
    reg->by_addr = NULL;
    reg->count = 0;
    reg->addr_cap = 0;
    reg->max_len = 0;
    for (size_t i = 0; i < reg->id_len; i++)
        reg->by_id[i].reg = NULL;
    reg->id_len = 0;
    reg->id_holes = 0;
    atomic_fetch_add_explicit(&reg->unpublished, n, memory_order_release);
    pthread_rwlock_unlock(&reg->lock);
    pthread_mutex_unlock(&reg->writer);
    /* Outside the lock: the releases may call back into the (now empty) table. */
    for (size_t i = 0; i < n; i++)
        reg_put(list[i]);
    free(list);
}

void orb_registry_free(struct orb_registry *reg)
{
    if (reg == NULL)
        return;
    /* No other thread may use the table now; pinned registrations outlive it. */
    for (size_t i = 0; i < reg->count; i++)
        reg_put(reg->by_addr[i]);
    pthread_rwlock_destroy(&reg->lock);
    pthread_mutex_destroy(&reg->writer);
    free(reg->by_addr);
    free(reg->by_id);
    free(reg);
}

/* A range of the request, in (base, len, index) order after sorting so that identical ranges sit
 * together with their lowest index first. */
struct add_item {
    uint64_t base;
    uint64_t len;
    size_t index;
};

/* A run of identical ranges: one registration, new or already published. */
struct add_group {
    size_t first;           /* into the sorted items */
    size_t size;
    size_t lowest_index;    /* the batch index that creates the registration when it is new */
    struct orb_reg *target; /* the published registration it maps to, or `fresh` */
    struct orb_reg *fresh;  /* preallocated; freed unless it gets published */
};

static int item_cmp(const void *a, const void *b)
{
    const struct add_item *x = a, *y = b;
    int c = key_cmp(x->base, x->len, y->base, y->len);
    if (c != 0)
        return c;
    return x->index < y->index ? -1 : (x->index > y->index ? 1 : 0);
}

/* Report a failure of range `index`; single registrations get no index in the message. */
static int range_fail(int status, int batch, size_t index, const char *detail)
{
    if (batch)
        return orb_fail(status, "registration range %zu: %s", index, detail);
    return orb_fail(status, "registration: %s", detail);
}

static int check_range(const struct orb_reg_range *r, int batch, size_t index,
                       struct add_item *item)
{
    char detail[160];
    if (r->owner == NULL)
        return range_fail(ORB_EINVAL, batch, index, "owner is NULL");
    if (r->length == 0)
        return range_fail(ORB_EINVAL, batch, index, "length is zero");
    if (!perm_valid(r->perm)) {
        snprintf(detail, sizeof detail, "invalid permission %d", (int)r->perm);
        return range_fail(ORB_EINVAL, batch, index, detail);
    }
    size_t size = r->kind->owner_size(r->owner);
    if (r->offset > size || r->length > size - r->offset) {
        snprintf(detail, sizeof detail, "offset %zu + length %zu exceeds the %s owner's %zu bytes",
                 r->offset, r->length, r->kind->name, size);
        return range_fail(ORB_EINVAL, batch, index, detail);
    }
    /* Owners are checked not to wrap the address space when made, so base + len fits. */
    item->base = r->kind->owner_base(r->owner) + r->offset;
    item->len = r->length;
    item->index = index;
    return 0;
}

/* Make room for `extra` more registrations in both indexes. Called with the lock held; on failure
 * the table is unchanged (a larger array is harmless). */
static int reserve(struct orb_registry *reg, size_t extra)
{
    size_t need = reg->count + extra;
    if (need > reg->addr_cap) {
        size_t cap = reg->addr_cap < 16 ? 16 : reg->addr_cap;
        while (cap < need)
            cap *= 2;
        struct orb_reg **grown = realloc(reg->by_addr, cap * sizeof *grown);
        if (grown == NULL)
            return orb_fail(ORB_ENOMEM, "registration: no memory to grow the table to %zu entries", need);
        reg->by_addr = grown;
        reg->addr_cap = cap;
    }
    if (reg->id_len + extra > reg->id_cap && reg->id_holes > 0)
        compact_ids(reg);
    need = reg->id_len + extra;
    if (need > reg->id_cap) {
        size_t cap = reg->id_cap < 16 ? 16 : reg->id_cap;
        while (cap < need)
            cap *= 2;
        struct id_slot *grown = realloc(reg->by_id, cap * sizeof *grown);
        if (grown == NULL)
            return orb_fail(ORB_ENOMEM, "registration: no memory to grow the id index to %zu entries", need);
        reg->by_id = grown;
        reg->id_cap = cap;
    }
    return 0;
}

/* Insert the `k` new registrations (sorted by key, none already published) into by_addr by merging
 * from the back; capacity was reserved. */
static void merge_new(struct orb_registry *reg, struct add_group *groups, size_t ngroups, size_t k)
{
    size_t w = reg->count + k;
    size_t old = reg->count;
    size_t g = ngroups;
    while (k > 0) {
        while (groups[g - 1].target != groups[g - 1].fresh)
            g--;
        struct orb_reg *n = groups[g - 1].fresh;
        if (old > 0 && key_cmp(reg->by_addr[old - 1]->base, reg->by_addr[old - 1]->len, n->base, n->len) > 0) {
            reg->by_addr[--w] = reg->by_addr[--old];
        } else {
            reg->by_addr[--w] = n;
            g--;
            k--;
        }
    }
}

/* How add_ranges treats a range that is already published. */
enum add_mode {
    ADD_SHARE,   /* gain a user reference on it */
    ADD_ADOPT    /* refuse with ORB_EEXIST and change nothing: the caller hands over new bytes */
};

/* The shared body of add, adopt and add_batch. `batch` selects indexed messages. */
static int add_ranges(struct orb_registry *reg, const struct orb_reg_range *ranges, size_t n,
                      orb_reg_id *ids_out, int batch, enum add_mode mode)
{
    struct add_item items_inline[REG_SCRATCH_INLINE];
    struct add_group groups_inline[REG_SCRATCH_INLINE];
    size_t group_of_inline[REG_SCRATCH_INLINE];
    struct add_item *items = items_inline;
    struct add_group *groups = groups_inline;
    size_t *group_of = group_of_inline;
    size_t ngroups = 0;
    int rc = 0;

    if (n > REG_SCRATCH_INLINE) {
        if (n > SIZE_MAX / sizeof(struct add_group))
            return orb_fail(ORB_EINVAL, "registration: %zu ranges is too many", n);
        items = malloc(n * sizeof *items);
        groups = malloc(n * sizeof *groups);
        group_of = malloc(n * sizeof *group_of);
        if (items == NULL || groups == NULL || group_of == NULL) {
            rc = orb_fail(ORB_ENOMEM, "registration: no memory for a batch of %zu ranges", n);
            goto free_scratch;
        }
    }

    for (size_t i = 0; i < n; i++) {
        rc = check_range(&ranges[i], batch, i, &items[i]);
        if (rc != 0)
            goto free_scratch;
    }
    qsort(items, n, sizeof *items, item_cmp);

    /* Group identical ranges and preallocate one registration per group, so that nothing can
     * run out of memory once publishing starts. */
    for (size_t i = 0; i < n; i++) {
        if (i == 0 || key_cmp(items[i - 1].base, items[i - 1].len, items[i].base, items[i].len) != 0) {
            struct add_group *g = &groups[ngroups++];
            g->first = i;
            g->size = 0;
            g->lowest_index = items[i].index;
            g->target = NULL;
            g->fresh = calloc(1, sizeof *g->fresh);
            if (g->fresh == NULL) {
                rc = orb_fail(ORB_ENOMEM, "registration: no memory for a registration");
                goto free_groups;
            }
        }
        groups[ngroups - 1].size++;
        group_of[items[i].index] = ngroups - 1;
    }

    /* Only writers change the table and this one holds the writer lock: it reads the table
     * without the rwlock until it publishes. */
    pthread_mutex_lock(&reg->writer);

    /* Classify every group against the published table and check reference counts. */
    size_t new_count = 0;
    for (size_t gi = 0; gi < ngroups; gi++) {
        struct add_group *g = &groups[gi];
        int found;
        size_t pos = find_exact(reg, items[g->first].base, items[g->first].len, &found);
        uint64_t refs_before = found ? reg->by_addr[pos]->user_refs : 0;
        if (g->size > UINT32_MAX - refs_before) {
            size_t bad = items[g->first + (size_t)(UINT32_MAX - refs_before)].index;
            rc = range_fail(ORB_ERESOURCE, batch, bad, "too many references to one registration");
            goto unlock;
        }
        if (found && mode == ADD_ADOPT) {
            char detail[96];
            snprintf(detail, sizeof detail, "exactly this range is already registered as id %llu",
                     (unsigned long long)reg->by_addr[pos]->id);
            rc = range_fail(ORB_EEXIST, batch, items[g->first].index, detail);
            goto unlock;
        }
        if (found) {
            g->target = reg->by_addr[pos];
        } else {
            g->target = g->fresh;
            new_count++;
        }
    }

    /* The budget and the id space, reported at the first range (in batch order) that exceeds them. */
    size_t room = reg->max_registrations > reg->count ? reg->max_registrations - reg->count : 0;
    if (new_count > room || new_count > UINT64_MAX - reg->next_id) {
        size_t seen = 0;
        for (size_t i = 0; i < n; i++) {
            struct add_group *g = &groups[group_of[i]];
            if (g->target != g->fresh || g->lowest_index != i)
                continue;
            if (++seen > room) {
                char detail[96];
                snprintf(detail, sizeof detail, "registration budget of %u exhausted",
                         reg->max_registrations);
                rc = range_fail(ORB_ERESOURCE, batch, i, detail);
                goto unlock;
            }
        }
        rc = orb_fail(ORB_ERESOURCE, "registration: registration ids exhausted");
        goto unlock;
    }

    /* Describe the new registrations and let the transports attach their state, before any of
     * them is visible. The owner is borrowed until publication takes its reference. */
    size_t attached = 0;
    for (size_t i = 0; i < n; i++) {
        struct add_group *g = &groups[group_of[i]];
        if (g->target != g->fresh || g->lowest_index != i)
            continue;
        struct orb_reg *r = g->fresh;
        r->base = items[g->first].base;
        r->len = items[g->first].len;
        r->perm = ranges[i].perm;
        r->kind = ranges[i].kind;
        r->owner = ranges[i].owner;
        if (reg->hooks != NULL) {
            rc = reg->hooks->attach(reg->hooks->ctx, r);
            if (rc != 0) {
                char detail[256];
                snprintf(detail, sizeof detail, "%s", orb_last_error());
                rc = range_fail(rc, batch, i, detail);
                goto retire_attached;
            }
            /* Only state that exists needs retiring (and the release thread). */
            for (unsigned t = 0; t < ORB_TRANSPORT_SLOTS; t++)
                if (r->tp_state[t] != NULL)
                    r->hooks = reg->hooks;
        }
        attached++;
    }

    pthread_rwlock_wrlock(&reg->lock);
    rc = reserve(reg, new_count);
    if (rc != 0) {
        pthread_rwlock_unlock(&reg->lock);
        goto retire_attached;
    }

    /* Publish. Nothing below can fail. New ids follow batch order. */
    for (size_t i = 0; i < n; i++) {
        struct add_group *g = &groups[group_of[i]];
        if (g->target != g->fresh || g->lowest_index != i)
            continue;
        struct orb_reg *r = g->fresh;
        r->id = reg->next_id++;
        r->kind->owner_ref(ranges[i].owner);
        r->owner = ranges[i].owner;
        atomic_init(&r->pins, 1);
        r->user_refs = 0;
        r->reaper = reg->reaper;
        reg->by_id[reg->id_len].id = r->id;
        reg->by_id[reg->id_len].reg = r;
        reg->id_len++;
        if (r->len > reg->max_len)
            reg->max_len = r->len;
    }
    merge_new(reg, groups, ngroups, new_count);
    reg->count += new_count;
    for (size_t gi = 0; gi < ngroups; gi++) {
        groups[gi].target->user_refs += (uint32_t)groups[gi].size;
        if (groups[gi].target == groups[gi].fresh)
            groups[gi].fresh = NULL; /* now owned by the table */
    }
    for (size_t i = 0; i < n; i++)
        ids_out[i] = groups[group_of[i]].target->id;
    pthread_rwlock_unlock(&reg->lock);
    goto unlock;

retire_attached:
    /* Only the new copies are undone; published registrations were never touched. */
    for (size_t i = 0; i < n && attached > 0; i++) {
        struct add_group *g = &groups[group_of[i]];
        if (g->target != g->fresh || g->lowest_index != i || g->fresh->hooks == NULL)
            continue;
        /* State that cannot be undone keeps the caller's bytes referenced forever. */
        if (g->fresh->hooks->retire(g->fresh->hooks->ctx, g->fresh) != 0)
            orb_reg_keep_owner(g->fresh);
        attached--;
    }
unlock:
    pthread_mutex_unlock(&reg->writer);
free_groups:
    for (size_t gi = 0; gi < ngroups; gi++)
        free(groups[gi].fresh);
free_scratch:
    if (items != items_inline) {
        free(items);
        free(groups);
        free(group_of);
    }
    return rc;
}

static int add_one(struct orb_registry *reg, orb_host_memory *owner, size_t offset, size_t len,
                   enum orb_perm perm, enum add_mode mode, orb_reg_id *id_out)
{
    if (reg == NULL || id_out == NULL)
        return orb_fail(ORB_EINVAL, "registration: NULL argument");
    struct orb_reg_range range = {
        .kind = &orb_memkind_host, .owner = owner, .offset = offset, .length = len, .perm = perm};
    orb_reg_id id;
    int rc = add_ranges(reg, &range, 1, &id, 0, mode);
    if (rc == 0)
        *id_out = id;
    return rc;
}

int orb_registry_add(struct orb_registry *reg, orb_host_memory *owner, size_t offset, size_t len,
                     enum orb_perm perm, orb_reg_id *id_out)
{
    return add_one(reg, owner, offset, len, perm, ADD_SHARE, id_out);
}

int orb_registry_adopt(struct orb_registry *reg, orb_host_memory *owner, size_t offset, size_t len,
                       enum orb_perm perm, orb_reg_id *id_out)
{
    return add_one(reg, owner, offset, len, perm, ADD_ADOPT, id_out);
}

/* The checks of every batch call, then add_ranges(). */
static int add_checked(struct orb_registry *reg, const struct orb_reg_range *ranges, size_t n, orb_reg_id *ids_out,
                       int batch)
{
    if (reg == NULL)
        return orb_fail(ORB_EINVAL, "registration batch: registry is NULL");
    if (n == 0)
        return 0;
    if (ranges == NULL || ids_out == NULL)
        return orb_fail(ORB_EINVAL, "registration batch: NULL ranges or ids");
    for (size_t i = 0; i < n; i++)
        if (ranges[i].kind == NULL)
            return orb_fail(ORB_EINVAL, "registration range %zu: no memory kind", i);
    return add_ranges(reg, ranges, n, ids_out, batch, ADD_SHARE);
}

int orb_registry_add_batch(struct orb_registry *reg, const struct orb_host_range *ranges, size_t n,
                           orb_reg_id *ids_out)
{
    if (reg == NULL || n == 0 || ranges == NULL || ids_out == NULL)
        return add_checked(reg, NULL, n, ids_out, 1);
    struct orb_reg_range inline_ranges[REG_SCRATCH_INLINE];
    struct orb_reg_range *all = inline_ranges;
    if (n > REG_SCRATCH_INLINE) {
        if (n > SIZE_MAX / sizeof *all)
            return orb_fail(ORB_EINVAL, "registration: %zu ranges is too many", n);
        if ((all = malloc(n * sizeof *all)) == NULL)
            return orb_fail(ORB_ENOMEM, "registration: no memory for a batch of %zu ranges", n);
    }
    for (size_t i = 0; i < n; i++)
        all[i] = (struct orb_reg_range){.kind = &orb_memkind_host, .owner = ranges[i].owner,
                                        .offset = ranges[i].offset, .length = ranges[i].length,
                                        .perm = ranges[i].perm};
    int rc = add_checked(reg, all, n, ids_out, 1);
    if (all != inline_ranges)
        free(all);
    return rc;
}

int orb_registry_add_ranges(struct orb_registry *reg, const struct orb_reg_range *ranges, size_t n,
                            orb_reg_id *ids_out)
{
    return add_checked(reg, ranges, n, ids_out, n > 1);
}

int orb_reg_loan(const struct orb_reg *r, uint64_t addr, uint64_t len, int writes, void **out)
{
    *out = NULL;
    return r->kind->loan != NULL ? r->kind->loan(r, addr, len, writes, out) : 0;
}

void orb_reg_loan_end(const struct orb_reg *r, void *loan)
{
    if (loan != NULL)
        r->kind->loan_end(loan);
}

void *orb_reg_stage_alloc(const struct orb_reg *r, size_t len, void (**free_out)(void *))
{
    if (r->kind->stage_alloc != NULL) {
        void *p = r->kind->stage_alloc(r, len);
        if (p != NULL) {
            *free_out = r->kind->stage_free;
            return p;
        }
    }
    *free_out = free;
    return aligned_alloc(4096, (len + 4095) / 4096 * 4096);
}

void orb_reg_stage_keep(const struct orb_reg *r, void *p, void (*free_fn)(void *))
{
    if (r != NULL && p != NULL && r->kind->stage_keep != NULL && free_fn == r->kind->stage_free)
        r->kind->stage_keep(p);
}

int orb_reg_ready(const struct orb_reg *r)
{
    return r->kind->ready != NULL ? r->kind->ready(r) : 0;
}

void orb_reg_keep_owner(const struct orb_reg *r)
{
    if (r != NULL && r->owner != NULL)
        r->kind->owner_ref(r->owner);
}

int orb_registry_remove(struct orb_registry *reg, orb_reg_id id)
{
    if (reg == NULL)
        return orb_fail(ORB_EINVAL, "unregister: registry is NULL");
    struct orb_reg *retired = NULL;

    pthread_mutex_lock(&reg->writer);
    pthread_rwlock_wrlock(&reg->lock);
    struct id_slot *slot = find_id(reg, id);
    if (slot == NULL) {
        pthread_rwlock_unlock(&reg->lock);
        pthread_mutex_unlock(&reg->writer);
        return orb_fail(ORB_ENOENT, "unregister: no registration with id %llu", (unsigned long long)id);
    }
    struct orb_reg *r = slot->reg;
    if (--r->user_refs == 0) {
        int found;
        size_t pos = find_exact(reg, r->base, r->len, &found);
        memmove(&reg->by_addr[pos], &reg->by_addr[pos + 1],
                (reg->count - pos - 1) * sizeof *reg->by_addr);
        reg->count--;
        if (reg->count == 0)
            reg->max_len = 0;
        slot->reg = NULL;
        reg->id_holes++;
        if (reg->id_holes > 16 && reg->id_holes > reg->id_len / 2)
            compact_ids(reg);
        atomic_fetch_add_explicit(&reg->unpublished, 1, memory_order_release);
        retired = r;
    }
    pthread_rwlock_unlock(&reg->lock);
    pthread_mutex_unlock(&reg->writer);

    /* Drop the membership pin outside the lock: it may run the owner's release callback. */
    if (retired != NULL)
        reg_put(retired);
    return 0;
}

static int range_args(uint64_t addr, uint64_t len, const char *what)
{
    if (len == 0)
        return orb_fail(ORB_EINVAL, "%s: length is zero", what);
    if (len > UINT64_MAX - addr)
        return orb_fail(ORB_EINVAL, "%s: range 0x%llx + %llu overflows", what,
                        (unsigned long long)addr, (unsigned long long)len);
    return 0;
}

int orb_registry_resolve(struct orb_registry *reg, uint64_t addr, uint64_t len,
                         struct orb_local_region *out)
{
    if (reg == NULL || out == NULL)
        return orb_fail(ORB_EINVAL, "resolve: NULL argument");
    int rc = range_args(addr, len, "resolve");
    if (rc != 0)
        return rc;
    int contained;
    pthread_rwlock_rdlock(&reg->lock);
    struct orb_reg *r = lookup(reg, addr, len, ORB_PERM_LOCAL, &contained);
    struct orb_local_region region = { 0 };
    if (r != NULL) {
        region.id = r->id;
        region.base = r->base;
        region.length = r->len;
        region.perm = r->perm;
    }
    pthread_rwlock_unlock(&reg->lock);
    if (r == NULL)
        return orb_fail(ORB_ENOENT, "resolve: no registration contains 0x%llx + %llu",
                        (unsigned long long)addr, (unsigned long long)len);
    *out = region;
    return 0;
}

int orb_registry_acquire(struct orb_registry *reg, uint64_t addr, uint64_t len, enum orb_perm need,
                         struct orb_reg **out)
{
    if (reg == NULL || out == NULL)
        return orb_fail(ORB_EINVAL, "acquire: NULL argument");
    if (!perm_valid(need))
        return orb_fail(ORB_EINVAL, "acquire: invalid permission %d", (int)need);
    int rc = range_args(addr, len, "acquire");
    if (rc != 0)
        return rc;
    int contained;
    pthread_rwlock_rdlock(&reg->lock);
    struct orb_reg *r = lookup(reg, addr, len, need, &contained);
    if (r != NULL)
        atomic_fetch_add_explicit(&r->pins, 1, memory_order_relaxed);
    pthread_rwlock_unlock(&reg->lock);
    if (r != NULL) {
        *out = r;
        return 0;
    }
    if (contained)
        return orb_fail(ORB_EPERM, "acquire: no registration containing 0x%llx + %llu allows %s",
                        (unsigned long long)addr, (unsigned long long)len,
                        need == ORB_PERM_REMOTE_WRITE ? "remote WRITE" : "remote READ");
    return orb_fail(ORB_ENOENT, "acquire: no registration %scontains 0x%llx + %llu",
                    need == ORB_PERM_LOCAL ? "" : "open to peers ",
                    (unsigned long long)addr, (unsigned long long)len);
}

int orb_reg_admits(const struct orb_reg *r, uint64_t addr, uint64_t len, enum orb_perm need)
{
    if (r == NULL || len == 0 || len > UINT64_MAX - addr || !perm_valid(need))
        return 0;
    if (need != ORB_PERM_LOCAL && r->perm == ORB_PERM_LOCAL)
        return 0;
    return addr >= r->base && addr + len <= r->base + r->len && perm_allows(r->perm, need);
}

uint64_t orb_registry_unpublished(const struct orb_registry *reg)
{
    return atomic_load_explicit(&((struct orb_registry *)reg)->unpublished, memory_order_acquire);
}

void orb_registry_release(struct orb_reg *r)
{
    if (r != NULL)
        reg_put(r);
}

void orb_registry_retain(struct orb_reg *r)
{
    atomic_fetch_add(&r->pins, 1);
}

int orb_registry_describe_remote(struct orb_registry *reg, struct orb_region_desc **out, size_t *count)
{
    if (reg == NULL || out == NULL || count == NULL)
        return orb_fail(ORB_EINVAL, "describe: NULL argument");
    pthread_rwlock_rdlock(&reg->lock);
    size_t remote = 0;
    for (size_t i = 0; i < reg->count; i++)
        if (reg->by_addr[i]->perm != ORB_PERM_LOCAL)
            remote++;
    struct orb_region_desc *descs = NULL;
    if (remote > 0) {
        descs = calloc(remote, sizeof *descs);
        if (descs == NULL) {
            pthread_rwlock_unlock(&reg->lock);
            return orb_fail(ORB_ENOMEM, "describe: no memory for %zu regions", remote);
        }
        size_t w = 0;
        for (size_t i = 0; i < reg->count; i++) {
            const struct orb_reg *r = reg->by_addr[i];
            if (r->perm == ORB_PERM_LOCAL)
                continue;
            descs[w].addr = r->base;
            descs[w].length = r->len;
            descs[w].perm = r->perm;
            descs[w].memory_kind = r->kind->kind == ORB_MEM_CUDA ? ORB_MEMORY_CUDA : ORB_MEMORY_HOST;
            descs[w].gpu_direct_routes = r->gpu_routes;
            w++;
        }
    }
    pthread_rwlock_unlock(&reg->lock);
    *out = descs;
    *count = remote;
    return 0;
}

size_t orb_registry_count(struct orb_registry *reg)
{
    if (reg == NULL)
        return 0;
    pthread_rwlock_rdlock(&reg->lock);
    size_t n = reg->count;
    pthread_rwlock_unlock(&reg->lock);
    return n;
}
