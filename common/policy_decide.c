/* Decisions: what one tenant may use on one inventory, key by key, with the line that decided
 * each item.
 *
 * Precedence, per key (docs/policy.md): a matching [user:...] section that sets the key; else
 * every matching [group:...] section that sets it, combined (lists: union, budgets: maximum);
 * else [defaults]; else the built-in default. Two matching user sections setting the same key
 * (by name and by uid) are a conflict: the key is denied. */
#include "common/policy_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"

#define SOURCE_MAX sizeof(((struct orb_policy_reason *)0)->source)

enum level {
    LEVEL_ERROR,    /* the policy failed to load: deny */
    LEVEL_USER,
    LEVEL_CONFLICT, /* several matching user sections set the key: deny */
    LEVEL_GROUPS,
    LEVEL_DEFAULTS,
    LEVEL_BUILTIN
};

struct key_level {
    enum level level;
    const struct policy_setting *first;  /* USER, DEFAULTS; first of CONFLICT */
    const struct policy_setting *second; /* CONFLICT */
};

/* Which levels a setting takes part in for this subject: computed once per decision, so that
 * a tenant with many groups costs one pass over its groups per setting, not per item. */
enum { APPLIES_USER = 1u << 0, APPLIES_GROUP = 1u << 1, APPLIES_DEFAULTS = 1u << 2 };

struct decider {
    const struct orb_policy *p;
    const struct orb_policy_subject *who;
    uint8_t applies[POLICY_MAX_SETTINGS];
    struct key_level keys[POLICY_KEY_COUNT];
    struct orb_policy_reason *reasons;
    size_t cap;
    size_t n;
};

static bool user_matches(const struct policy_section *s, const struct orb_policy_subject *who)
{
    if (s->kind == POLICY_SECTION_UID)
        return s->id == who->uid;
    if (s->kind == POLICY_SECTION_USER)
        return who->user != NULL && strcmp(s->name, who->user) == 0;
    return false;
}

static bool group_matches(const struct policy_section *s, const struct orb_policy_subject *who)
{
    for (uint32_t i = 0; i < who->ngroups; i++) {
        if (s->kind == POLICY_SECTION_GID && who->gids[i] == s->id)
            return true;
        if (s->kind == POLICY_SECTION_GROUP && who->group_names != NULL && who->group_names[i] != NULL &&
            strcmp(s->name, who->group_names[i]) == 0)
            return true;
    }
    return false;
}

static void compute_applies(struct decider *d)
{
    for (size_t i = 0; i < d->p->nsettings && i < POLICY_MAX_SETTINGS; i++) {
        const struct policy_section *sec = &d->p->settings[i].section;
        uint8_t a = 0;
        if (user_matches(sec, d->who))
            a |= APPLIES_USER;
        if (group_matches(sec, d->who))
            a |= APPLIES_GROUP;
        if (sec->kind == POLICY_SECTION_DEFAULTS)
            a |= APPLIES_DEFAULTS;
        d->applies[i] = a;
    }
}

/* Whether setting s takes part in the decision of its key at `level`. */
static bool at_level(const struct decider *d, const struct policy_setting *s, enum level level)
{
    uint8_t a = d->applies[s - d->p->settings];
    switch (level) {
    case LEVEL_USER: return (a & APPLIES_USER) != 0;
    case LEVEL_GROUPS: return (a & APPLIES_GROUP) != 0;
    case LEVEL_DEFAULTS: return (a & APPLIES_DEFAULTS) != 0;
    default: return false;
    }
}

static void resolve_key(struct decider *d, enum policy_key key)
{
    struct key_level *k = &d->keys[key];
    *k = (struct key_level){.level = LEVEL_BUILTIN};
    if (d->p->error) {
        k->level = LEVEL_ERROR;
        return;
    }
    static const enum level order[] = {LEVEL_USER, LEVEL_GROUPS, LEVEL_DEFAULTS};
    for (size_t o = 0; o < sizeof order / sizeof order[0]; o++) {
        for (size_t i = 0; i < d->p->nsettings; i++) {
            const struct policy_setting *s = &d->p->settings[i];
            if (s->key != key || !at_level(d, s, order[o]))
                continue;
            if (!k->first) {
                k->first = s;
                k->level = order[o];
            } else if (order[o] == LEVEL_USER && !k->second) {
                k->second = s;
                k->level = LEVEL_CONFLICT;
            }
        }
        if (k->first)
            return;
    }
}

/* ---- reasons ---------------------------------------------------------------------------- */

/* "file.ini:12 [group:gpu]" */
static void where(const struct decider *d, const struct policy_setting *s, char *buf, size_t len)
{
    char section[96];
    policy_format_section(&s->section, section, sizeof section);
    snprintf(buf, len, "%s:%u %s", d->p->files[s->file].name, s->line, section);
}

__attribute__((format(printf, 3, 4)))
static void append(char *buf, size_t len, const char *fmt, ...)
{
    size_t used = strnlen(buf, len);
    if (used + 1 >= len)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + used, len - used, fmt, ap);
    va_end(ap);
}

__attribute__((format(printf, 4, 5)))
static void emit(struct decider *d, const char *item, const char *source, const char *verdict_fmt, ...)
{
    if (!d->reasons || d->n >= d->cap)
        return;
    struct orb_policy_reason *r = &d->reasons[d->n++];
    memset(r, 0, sizeof *r); /* every byte defined: reasons may be copied into messages */
    snprintf(r->item, sizeof r->item, "%s", item);
    va_list ap;
    va_start(ap, verdict_fmt);
    vsnprintf(r->verdict, sizeof r->verdict, verdict_fmt, ap);
    va_end(ap);
    snprintf(r->source, sizeof r->source, "%s", source);
}

/* `prefix` followed by every group setting of `key` that applies ("a.ini:3 [group:x], ..."). */
static void list_groups(const struct decider *d, enum policy_key key, const char *prefix, char *buf, size_t len)
{
    snprintf(buf, len, "%s", prefix);
    bool first = true;
    for (size_t i = 0; i < d->p->nsettings; i++) {
        const struct policy_setting *s = &d->p->settings[i];
        if (s->key != key || !at_level(d, s, LEVEL_GROUPS))
            continue;
        char w[SOURCE_MAX];
        where(d, s, w, sizeof w);
        append(buf, len, "%s%s", first ? "" : ", ", w);
        first = false;
    }
}

/* The source of a decision that no setting made: error, conflict or built-in default. */
static void fixed_source(const struct decider *d, const struct key_level *k, char *buf, size_t len)
{
    char a[SOURCE_MAX];
    char b[SOURCE_MAX];
    switch (k->level) {
    case LEVEL_ERROR: policy_format(buf, len, "policy error at %s", d->p->error_where); break;
    case LEVEL_CONFLICT:
        where(d, k->first, a, sizeof a);
        where(d, k->second, b, sizeof b);
        policy_format(buf, len, "conflict: %s and %s both set it", a, b);
        break;
    default: snprintf(buf, len, "built-in default"); break;
    }
}

/* ---- list keys -------------------------------------------------------------------------- */

/* Whether setting s allows `item`; `via` may name the pattern that matched. */
typedef bool (*allows_fn)(const struct policy_setting *s, const void *item, char *via, size_t via_len);

/* Decide one item of a list key and record why. */
static bool decide_item(struct decider *d, enum policy_key key, allows_fn allows, const void *item,
                        bool builtin, const char *item_text)
{
    const struct key_level *k = &d->keys[key];
    char src[SOURCE_MAX] = "";
    char via[96] = "";
    bool ok = false;
    if (k->level == LEVEL_USER || k->level == LEVEL_DEFAULTS) {
        ok = allows(k->first, item, via, sizeof via);
        where(d, k->first, src, sizeof src);
        if (ok && via[0])
            append(src, sizeof src, " matches %s", via);
        else if (!ok)
            append(src, sizeof src, k->first->count == 0 && !k->first->all ? ": none" : ": not listed");
    } else if (k->level == LEVEL_GROUPS) {
        for (size_t i = 0; i < d->p->nsettings && !ok; i++) {
            const struct policy_setting *s = &d->p->settings[i];
            if (s->key != key || !at_level(d, s, LEVEL_GROUPS) || !allows(s, item, via, sizeof via))
                continue;
            ok = true;
            where(d, s, src, sizeof src);
            if (via[0])
                append(src, sizeof src, " matches %s", via);
        }
        if (!ok)
            list_groups(d, key, "not listed by ", src, sizeof src);
    } else {
        ok = k->level == LEVEL_BUILTIN && builtin;
        fixed_source(d, k, src, sizeof src);
    }
    emit(d, item_text, src, "%s", ok ? "allowed" : "denied");
    return ok;
}

static bool allows_nic(const struct policy_setting *s, const void *item, char *via, size_t via_len)
{
    const struct orb_topo_nic *nic = item;
    if (s->all) {
        snprintf(via, via_len, "*");
        return true;
    }
    for (uint32_t i = 0; i < s->count; i++) {
        if (policy_nic_matches(&s->nics[i], nic)) {
            snprintf(via, via_len, "%s", s->nics[i].text);
            return true;
        }
    }
    return false;
}

static bool allows_gpu(const struct policy_setting *s, const void *item, char *via, size_t via_len)
{
    (void)via;
    (void)via_len;
    uint32_t ordinal = *(const uint32_t *)item;
    return s->all || (ordinal < 64 && (s->gpus >> ordinal) & 1u);
}

static bool allows_bit(const struct policy_setting *s, const void *item, char *via, size_t via_len)
{
    (void)via;
    (void)via_len;
    return (s->bits & *(const uint32_t *)item) != 0;
}

static bool allows_slot(const struct policy_setting *s, const void *item, char *via, size_t via_len)
{
    (void)via;
    (void)via_len;
    for (uint32_t i = 0; i < s->count; i++) {
        if (strcmp(s->slots[i], item) == 0)
            return true;
    }
    return false;
}

static uint32_t decide_bits(struct decider *d, enum policy_key key, const char *prefix, const char *const *names,
                            const uint32_t *bits, size_t n, uint32_t builtin)
{
    uint32_t out = 0;
    for (size_t i = 0; i < n; i++) {
        char item[96];
        snprintf(item, sizeof item, "%s %s", prefix, names[i]);
        if (decide_item(d, key, allows_bit, &bits[i], (builtin & bits[i]) != 0, item))
            out |= bits[i];
    }
    return out;
}

/* Slots have no inventory: the candidates are the names the deciding settings list, in order. */
static void decide_slots(struct decider *d, struct orb_hp_policy *out)
{
    const struct key_level *k = &d->keys[POLICY_KEY_SLOTS];
    enum level level = k->level;
    uint32_t dropped = 0;
    char dropped_src[SOURCE_MAX] = "";
    if (level == LEVEL_USER || level == LEVEL_DEFAULTS || level == LEVEL_GROUPS) {
        for (size_t i = 0; i < d->p->nsettings; i++) {
            const struct policy_setting *s = &d->p->settings[i];
            bool part = level == LEVEL_GROUPS ? (s->key == POLICY_KEY_SLOTS && at_level(d, s, LEVEL_GROUPS))
                                              : s == k->first;
            for (uint32_t j = 0; part && j < s->count; j++) {
                bool seen = false;
                for (uint32_t m = 0; m < out->nslots && !seen; m++)
                    seen = strcmp(out->slots[m], s->slots[j]) == 0;
                if (seen)
                    continue;
                if (out->nslots == ORB_HP_MAX_SLOTS) {
                    if (dropped++ == 0)
                        where(d, s, dropped_src, sizeof dropped_src);
                    continue;
                }
                snprintf(out->slots[out->nslots++], sizeof out->slots[0], "%s", s->slots[j]);
            }
        }
    }
    for (uint32_t m = 0; m < out->nslots; m++) {
        char item[96];
        snprintf(item, sizeof item, "slot %s", out->slots[m]);
        decide_item(d, POLICY_KEY_SLOTS, allows_slot, out->slots[m], false, item);
    }
    if (dropped) {
        char src[SOURCE_MAX + 64]; /* room for the prefix: emit() keeps what fits */
        snprintf(src, sizeof src, "more than %u names; first dropped at %s", ORB_HP_MAX_SLOTS, dropped_src);
        emit(d, "slots", src, "%u dropped", dropped);
    }
    if (out->nslots == 0) {
        char src[SOURCE_MAX];
        if (level == LEVEL_USER || level == LEVEL_DEFAULTS) {
            where(d, k->first, src, sizeof src);
        } else if (level == LEVEL_GROUPS) {
            list_groups(d, POLICY_KEY_SLOTS, "none in ", src, sizeof src);
        } else {
            fixed_source(d, k, src, sizeof src);
        }
        emit(d, "slots", src, "none");
    }
}

/* ---- budgets ---------------------------------------------------------------------------- */

/* A budget as a number; byte counts that are whole K/M/G/T also in that unit. */
static void format_budget(uint64_t v, uint64_t unlimited, bool bytes, char *buf, size_t len)
{
    static const char suffix[] = "KMGT";
    if (v == unlimited) {
        snprintf(buf, len, "unlimited");
        return;
    }
    int best = -1;
    for (int i = 0; bytes && i < 4; i++) {
        if (v != 0 && v % (1ull << (10 * (i + 1))) == 0)
            best = i;
    }
    if (best >= 0)
        snprintf(buf, len, "%llu (%llu%c)", (unsigned long long)v,
                 (unsigned long long)(v >> (10 * (best + 1))), suffix[best]);
    else
        snprintf(buf, len, "%llu", (unsigned long long)v);
}

static uint64_t decide_budget(struct decider *d, enum policy_key key, uint64_t unlimited)
{
    const struct key_level *k = &d->keys[key];
    char src[SOURCE_MAX];
    uint64_t v = 0;
    if (k->level == LEVEL_USER || k->level == LEVEL_DEFAULTS) {
        v = k->first->budget;
        where(d, k->first, src, sizeof src);
    } else if (k->level == LEVEL_GROUPS) {
        const struct policy_setting *best = NULL;
        for (size_t i = 0; i < d->p->nsettings; i++) {
            const struct policy_setting *s = &d->p->settings[i];
            if (s->key == key && at_level(d, s, LEVEL_GROUPS) && (!best || s->budget > best->budget))
                best = s;
        }
        v = best->budget;
        where(d, best, src, sizeof src);
        append(src, sizeof src, " (largest of the groups)");
    } else {
        fixed_source(d, k, src, sizeof src);
    }
    char verdict[64];
    format_budget(v, unlimited, key == POLICY_KEY_MAX_REGISTERED_BYTES, verdict, sizeof verdict);
    emit(d, policy_key_names[key], src, "%s", verdict);
    return v;
}

/* ---- entry point ------------------------------------------------------------------------ */

int orb_policy_decide(const struct orb_policy *p, const struct orb_policy_subject *who,
                      const struct orb_topo_inventory *inv, struct orb_hp_policy *out,
                      struct orb_policy_reason *reasons, size_t cap, size_t *nreasons)
{
    if (!p || !who || !inv || !out || (who->ngroups > 0 && !who->gids) || (reasons && cap > 0 && !nreasons))
        return orb_fail(ORB_EINVAL, "policy decide: NULL argument");
    if (inv->nnics > ORB_TOPO_MAX_NICS || inv->ngpus > ORB_TOPO_MAX_GPUS)
        return orb_fail(ORB_EINVAL, "policy decide: inventory counts out of range");

    if (p->nsettings > POLICY_MAX_SETTINGS)
        return orb_fail(ORB_EINVAL, "policy decide: corrupt policy");
    struct decider d = {.p = p, .who = who, .reasons = reasons, .cap = reasons ? cap : 0};
    compute_applies(&d);
    for (int key = 0; key < POLICY_KEY_COUNT; key++)
        resolve_key(&d, (enum policy_key)key);

    struct orb_hp_policy result;
    memset(&result, 0, sizeof result);

    static const char *const transport_names[] = {"tcp", "rdma", "nvlink"};
    static const uint32_t transport_bits[] = {ORB_HP_T_TCP, ORB_HP_T_RDMA, ORB_HP_T_NVLINK};
    result.transports = decide_bits(&d, POLICY_KEY_TRANSPORTS, "transport", transport_names, transport_bits, 3,
                                    ORB_HP_T_TCP);
    static const char *const route_names[] = {"dmabuf", "peermem"};
    static const uint32_t route_bits[] = {ORB_HP_R_DMABUF, ORB_HP_R_PEERMEM};
    result.gpudirect_routes = decide_bits(&d, POLICY_KEY_GPUDIRECT, "gpudirect", route_names, route_bits, 2, 0);

    for (uint32_t i = 0; i < inv->nnics; i++) {
        const struct orb_topo_nic *nic = &inv->nics[i];
        char item[96];
        if (nic->name[0] != '\0')
            snprintf(item, sizeof item, "nic %.*s", ORB_TOPO_NAME_MAX - 1, nic->name);
        else
            snprintf(item, sizeof item, "nic #%u", nic->id);
        if (decide_item(&d, POLICY_KEY_NICS, allows_nic, nic, false, item) && nic->id < 64)
            result.nic_mask |= 1ull << nic->id;
    }
    /* The helper opens a NIC only for RDMA: say so where the NICs alone would mislead. */
    if (result.nic_mask != 0 && !(result.transports & ORB_HP_T_RDMA))
        emit(&d, "nics", "transports: rdma denied", "listed in the inventory, never opened (needs transport rdma)");
    for (uint32_t i = 0; i < inv->ngpus; i++) {
        uint32_t ordinal = inv->gpus[i].ordinal;
        char item[96];
        snprintf(item, sizeof item, "gpu %u", ordinal);
        if (decide_item(&d, POLICY_KEY_GPUS, allows_gpu, &ordinal, false, item) && ordinal < 64)
            result.gpu_mask |= 1ull << ordinal;
    }
    decide_slots(&d, &result);

    result.max_registered_bytes = decide_budget(&d, POLICY_KEY_MAX_REGISTERED_BYTES, UINT64_MAX);
    result.max_endpoints = (uint32_t)decide_budget(&d, POLICY_KEY_MAX_ENDPOINTS, UINT32_MAX);
    result.max_grants = (uint32_t)decide_budget(&d, POLICY_KEY_MAX_GRANTS, UINT32_MAX);

    *out = result;
    if (nreasons)
        *nreasons = d.n;
    return 0;
}
