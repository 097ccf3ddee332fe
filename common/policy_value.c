/* Policy values and section headers: strict parsers that accept exactly the documented forms
 * (docs/policy.md) and say what was wrong otherwise. */
#include "common/policy_internal.h"

#include <fnmatch.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/ascii.h"
#include "core/error.h"

const char *const policy_key_names[POLICY_KEY_COUNT] = {
    [POLICY_KEY_NICS] = "nics",
    [POLICY_KEY_GPUS] = "gpus",
    [POLICY_KEY_TRANSPORTS] = "transports",
    [POLICY_KEY_GPUDIRECT] = "gpudirect",
    [POLICY_KEY_SLOTS] = "slots",
    [POLICY_KEY_MAX_REGISTERED_BYTES] = "max_registered_bytes",
    [POLICY_KEY_MAX_ENDPOINTS] = "max_endpoints",
    [POLICY_KEY_MAX_GRANTS] = "max_grants",
};

__attribute__((format(printf, 3, 4)))
static int why_set(char *why, size_t why_len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, why_len, fmt, ap);
    va_end(ap);
    return -1;
}

void policy_format(char *buf, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, len, fmt, ap);
    va_end(ap);
}

void policy_quote(const char *text, size_t max, char *buf, size_t len)
{
    if (len == 0)
        return;
    size_t n = strnlen(text, max + 1);
    bool cut = n > max;
    if (cut)
        n = max;
    size_t o = 0;
    for (size_t i = 0; i < n && o + 1 < len; i++) {
        unsigned char c = (unsigned char)text[i];
        buf[o++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    for (size_t i = 0; cut && i < 3 && o + 1 < len; i++)
        buf[o++] = '.';
    buf[o] = '\0';
}

/* Quote a (ptr, len) piece of a value into a fixed buffer for messages. */
static const char *quote_piece(const char *p, size_t n, char buf[80])
{
    char tmp[72];
    size_t take = n < sizeof tmp - 1 ? n : sizeof tmp - 1;
    memcpy(tmp, p, take);
    tmp[take] = '\0';
    policy_quote(tmp, n > 48 ? 48 : n, buf, 80);
    if (n > 48 && strlen(buf) < 76)
        strcat(buf, "...");
    return buf;
}

static bool is_name_char(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || orb_ascii_is_digit(c) || c == '_' || c == '.' ||
           c == '-';
}

/* [A-Za-z0-9_.-]{1,max}, not "." or "..": device names (max 63) and slot names (max 64). */
static bool component_valid(const char *p, size_t n, size_t max)
{
    if (n == 0 || n > max)
        return false;
    if ((n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.'))
        return false;
    for (size_t i = 0; i < n; i++) {
        if (!is_name_char(p[i]))
            return false;
    }
    return true;
}

/* Strict decimal: 1..20 digits, no sign, no leading zero (except "0"), no overflow. */
static bool parse_decimal(const char *p, size_t n, uint64_t *out)
{
    if (n == 0 || n > 20 || (n > 1 && p[0] == '0'))
        return false;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (!orb_ascii_is_digit(p[i]))
            return false;
        if (__builtin_mul_overflow(v, 10u, &v) || __builtin_add_overflow(v, (uint64_t)(p[i] - '0'), &v))
            return false;
    }
    *out = v;
    return true;
}

static bool piece_is(const char *p, size_t n, const char *word)
{
    return strlen(word) == n && memcmp(p, word, n) == 0;
}

/* ---- section headers -------------------------------------------------------------------- */

/* A user or group name: [A-Za-z0-9_][A-Za-z0-9_.@-]* with an optional final '$' (machine
 * accounts), at most POLICY_ACCOUNT_MAX bytes. */
static bool account_name_valid(const char *p, size_t n)
{
    if (n == 0 || n > POLICY_ACCOUNT_MAX)
        return false;
    if (p[n - 1] == '$')
        n--;
    if (n == 0 || p[0] == '-' || p[0] == '.' || p[0] == '@')
        return false;
    for (size_t i = 0; i < n; i++) {
        if (!is_name_char(p[i]) && p[i] != '@')
            return false;
    }
    return true;
}

int policy_parse_section(const char *text, size_t len, struct policy_section *out, char *why, size_t why_len)
{
    char q[80];
    struct policy_section s = {0};
    const char *name;
    size_t name_len;
    bool is_user;
    if (piece_is(text, len, "defaults")) {
        s.kind = POLICY_SECTION_DEFAULTS;
        *out = s;
        return 0;
    }
    if (len > 5 && memcmp(text, "user:", 5) == 0) {
        is_user = true;
        name = text + 5;
        name_len = len - 5;
    } else if (len > 6 && memcmp(text, "group:", 6) == 0) {
        is_user = false;
        name = text + 6;
        name_len = len - 6;
    } else {
        return why_set(why, why_len, "unknown section [%s] (expected [defaults], [user:NAME] or [group:NAME])",
                       quote_piece(text, len, q));
    }
    if (name[0] == '#') {
        uint64_t id;
        /* (uint32_t)-1 is "no id" to the kernel (setresuid, chown): never a real account. */
        if (!parse_decimal(name + 1, name_len - 1, &id) || id >= UINT32_MAX)
            return why_set(why, why_len, "section [%s]: '%s' is not a numeric %s id", quote_piece(text, len, q),
                           is_user ? "#UID" : "#GID", is_user ? "user" : "group");
        s.kind = is_user ? POLICY_SECTION_UID : POLICY_SECTION_GID;
        s.id = (uint32_t)id;
    } else {
        if (!account_name_valid(name, name_len))
            return why_set(why, why_len, "section [%s]: not a valid %s name", quote_piece(text, len, q),
                           is_user ? "user" : "group");
        s.kind = is_user ? POLICY_SECTION_USER : POLICY_SECTION_GROUP;
        memcpy(s.name, name, name_len);
        s.name[name_len] = '\0';
    }
    *out = s;
    return 0;
}

void policy_format_section(const struct policy_section *s, char *buf, size_t len)
{
    switch (s->kind) {
    case POLICY_SECTION_DEFAULTS: snprintf(buf, len, "[defaults]"); break;
    case POLICY_SECTION_USER: snprintf(buf, len, "[user:%s]", s->name); break;
    case POLICY_SECTION_UID: snprintf(buf, len, "[user:#%u]", s->id); break;
    case POLICY_SECTION_GROUP: snprintf(buf, len, "[group:%s]", s->name); break;
    case POLICY_SECTION_GID: snprintf(buf, len, "[group:#%u]", s->id); break;
    default: snprintf(buf, len, "(no section)"); break;
    }
}

/* ---- lists ------------------------------------------------------------------------------ */

struct piece {
    const char *p;
    size_t n;
};

/* Split a comma list, trimming blanks around items. Empty items are errors. */
static int split_list(const char *value, struct piece items[POLICY_MAX_LIST], uint32_t *count, char *why,
                      size_t why_len)
{
    uint32_t n = 0;
    const char *p = value;
    for (;;) {
        const char *comma = strchr(p, ',');
        const char *end = comma ? comma : p + strlen(p);
        const char *a = p;
        const char *b = end;
        while (a < b && (*a == ' ' || *a == '\t'))
            a++;
        while (b > a && (b[-1] == ' ' || b[-1] == '\t'))
            b--;
        if (a == b)
            return why_set(why, why_len, "empty item in the list");
        if (n == POLICY_MAX_LIST)
            return why_set(why, why_len, "more than %u items", POLICY_MAX_LIST);
        items[n].p = a;
        items[n].n = (size_t)(b - a);
        n++;
        if (!comma)
            break;
        p = comma + 1;
    }
    *count = n;
    return 0;
}

/* "*" (when `star_ok`) and "none" stand alone. Returns 1 for "*", 2 for "none", 0 otherwise. */
static int list_special(const struct piece *items, uint32_t n, bool star_ok, char *why, size_t why_len)
{
    for (uint32_t i = 0; i < n; i++) {
        bool star = piece_is(items[i].p, items[i].n, "*");
        bool none = piece_is(items[i].p, items[i].n, "none");
        if (star && !star_ok)
            return why_set(why, why_len, "'*' is not allowed here: name every item");
        if ((star || none) && n != 1)
            return why_set(why, why_len, "'%s' must be the only item of the list", star ? "*" : "none");
        if (star)
            return 1;
        if (none)
            return 2;
    }
    return 0;
}

static int parse_guid(const char *p, size_t n, uint64_t *out)
{
    uint64_t v = 0;
    if (n > 2 && p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) {
        if (n - 2 > 16)
            return -1;
        for (size_t i = 2; i < n; i++) {
            int h = orb_ascii_hex_value(p[i]);
            if (h < 0)
                return -1;
            v = (v << 4) | (uint64_t)h;
        }
    } else if (n == 19) { /* the sysfs node_guid form: xxxx:xxxx:xxxx:xxxx */
        for (size_t i = 0; i < n; i++) {
            if (i % 5 == 4) {
                if (p[i] != ':')
                    return -1;
                continue;
            }
            int h = orb_ascii_hex_value(p[i]);
            if (h < 0)
                return -1;
            v = (v << 4) | (uint64_t)h;
        }
    } else {
        return -1;
    }
    if (v == 0)
        return -1; /* the inventory's "unknown": never a real GUID */
    *out = v;
    return 0;
}

/* dddd:bb:dd.f, hexadecimal, device <= 0x1f, function 0-7; written to `out` in lower case. */
static int parse_pci(const char *p, size_t n, char out[ORB_TOPO_PCI_MAX])
{
    static const char shape[] = "hhhh:hh:hh.f";
    if (n != sizeof shape - 1)
        return -1;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (shape[i] == 'h') {
            if (orb_ascii_hex_value(c) < 0)
                return -1;
            out[i] = (c >= 'A' && c <= 'F') ? (char)(c - 'A' + 'a') : c;
        } else if (shape[i] == 'f') {
            if (c < '0' || c > '7')
                return -1;
            out[i] = c;
        } else {
            if (c != shape[i])
                return -1;
            out[i] = c;
        }
    }
    out[n] = '\0';
    if (orb_ascii_hex_value(out[8]) * 16 + orb_ascii_hex_value(out[9]) > 0x1f)
        return -1;
    return 0;
}

static bool is_glob_char(char c)
{
    return c == '*' || c == '?' || c == '[';
}

static bool glob_valid(const char *p, size_t n)
{
    if (n == 0 || n > POLICY_PATTERN_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (!is_name_char(c) && !is_glob_char(c) && c != ']' && c != '!' && c != '^')
            return false;
    }
    return true;
}

static int parse_nic_item(const struct piece *it, struct policy_nic_pattern *pat, char *why, size_t why_len)
{
    char q[80];
    memset(pat, 0, sizeof *pat);
    if (it->n > POLICY_PATTERN_MAX)
        return why_set(why, why_len, "'%s' is longer than %u characters", quote_piece(it->p, it->n, q),
                       POLICY_PATTERN_MAX);
    if (it->n > 5 && memcmp(it->p, "guid:", 5) == 0) {
        if (parse_guid(it->p + 5, it->n - 5, &pat->guid) != 0)
            return why_set(why, why_len, "'%s' is not a GUID (guid:0x<1-16 hex digits> or guid:xxxx:xxxx:xxxx:xxxx, not 0)",
                           quote_piece(it->p, it->n, q));
        pat->kind = POLICY_NIC_GUID;
        memcpy(pat->text, it->p, it->n);
        return 0;
    }
    if (it->n > 4 && memcmp(it->p, "pci:", 4) == 0) {
        char bdf[ORB_TOPO_PCI_MAX];
        if (parse_pci(it->p + 4, it->n - 4, bdf) != 0)
            return why_set(why, why_len, "'%s' is not a PCI address (pci:dddd:bb:dd.f)", quote_piece(it->p, it->n, q));
        pat->kind = POLICY_NIC_PCI;
        snprintf(pat->text, sizeof pat->text, "pci:%s", bdf);
        return 0;
    }
    bool glob = false;
    for (size_t i = 0; i < it->n; i++)
        glob |= is_glob_char(it->p[i]);
    if (glob ? glob_valid(it->p, it->n) : component_valid(it->p, it->n, ORB_TOPO_NAME_MAX - 1)) {
        pat->kind = glob ? POLICY_NIC_GLOB : POLICY_NIC_NAME;
        memcpy(pat->text, it->p, it->n);
        return 0;
    }
    return why_set(why, why_len,
                   "'%s' is not a device name, glob, guid:0x... or pci:dddd:bb:dd.f", quote_piece(it->p, it->n, q));
}

static int parse_nics(const struct piece *items, uint32_t n, struct policy_setting *s, char *why, size_t why_len)
{
    struct policy_nic_pattern *pats = calloc(n, sizeof *pats);
    if (!pats)
        return ORB_ENOMEM;
    for (uint32_t i = 0; i < n; i++) {
        if (parse_nic_item(&items[i], &pats[i], why, why_len) != 0) {
            free(pats);
            return -1;
        }
    }
    s->nics = pats;
    s->count = n;
    return 0;
}

static int parse_gpus(const struct piece *items, uint32_t n, struct policy_setting *s, char *why, size_t why_len)
{
    char q[80];
    uint64_t mask = 0;
    for (uint32_t i = 0; i < n; i++) {
        const char *dash = memchr(items[i].p, '-', items[i].n);
        uint64_t lo, hi;
        bool ok;
        if (dash) {
            size_t left = (size_t)(dash - items[i].p);
            ok = parse_decimal(items[i].p, left, &lo) &&
                 parse_decimal(dash + 1, items[i].n - left - 1, &hi) && lo <= hi;
        } else {
            ok = parse_decimal(items[i].p, items[i].n, &lo);
            hi = lo;
        }
        if (!ok || hi >= ORB_TOPO_MAX_GPUS)
            return why_set(why, why_len, "'%s' is not a GPU ordinal or range (0-%u)",
                           quote_piece(items[i].p, items[i].n, q), ORB_TOPO_MAX_GPUS - 1);
        for (uint64_t g = lo; g <= hi; g++)
            mask |= 1ull << g;
    }
    s->gpus = mask;
    s->count = n;
    return 0;
}

struct word_bit {
    const char *word;
    uint32_t bit;
};

static int parse_words(const struct piece *items, uint32_t n, const struct word_bit *words, size_t nwords,
                       const char *what, const char *choices, struct policy_setting *s, char *why, size_t why_len)
{
    char q[80];
    uint32_t bits = 0;
    for (uint32_t i = 0; i < n; i++) {
        size_t w = 0;
        while (w < nwords && !piece_is(items[i].p, items[i].n, words[w].word))
            w++;
        if (w == nwords)
            return why_set(why, why_len, "'%s' is not a %s (%s)", quote_piece(items[i].p, items[i].n, q), what,
                           choices);
        bits |= words[w].bit;
    }
    s->bits = bits;
    s->count = n;
    return 0;
}

static int parse_slots(const struct piece *items, uint32_t n, struct policy_setting *s, char *why, size_t why_len)
{
    char q[80];
    if (n > ORB_HP_MAX_SLOTS)
        return why_set(why, why_len, "more than %u slot names", ORB_HP_MAX_SLOTS);
    for (uint32_t i = 0; i < n; i++) {
        if (!component_valid(items[i].p, items[i].n, ORB_HP_NAME_MAX))
            return why_set(why, why_len, "'%s' is not a slot name ([A-Za-z0-9_.-]{1,%u})",
                           quote_piece(items[i].p, items[i].n, q), ORB_HP_NAME_MAX);
    }
    char(*names)[ORB_HP_NAME_MAX + 1] = calloc(n, sizeof *names);
    if (!names)
        return ORB_ENOMEM;
    for (uint32_t i = 0; i < n; i++)
        memcpy(names[i], items[i].p, items[i].n);
    s->slots = names;
    s->count = n;
    return 0;
}

/* ---- budgets ---------------------------------------------------------------------------- */

static int parse_bytes(const char *value, uint64_t *out)
{
    size_t n = strlen(value);
    if (strcmp(value, "unlimited") == 0) {
        *out = UINT64_MAX;
        return 0;
    }
    unsigned shift = 0;
    if (n > 1) {
        switch (value[n - 1]) {
        case 'K': case 'k': shift = 10; break;
        case 'M': case 'm': shift = 20; break;
        case 'G': case 'g': shift = 30; break;
        case 'T': case 't': shift = 40; break;
        default: break;
        }
        if (shift)
            n--;
    }
    uint64_t v;
    if (!parse_decimal(value, n, &v))
        return -1;
    if (shift && v > (UINT64_MAX >> shift))
        return -2;
    v <<= shift;
    if (v == UINT64_MAX)
        return -2; /* reserved for "unlimited": say it in words */
    *out = v;
    return 0;
}

static int parse_count(const char *value, uint64_t *out)
{
    if (strcmp(value, "unlimited") == 0) {
        *out = UINT32_MAX;
        return 0;
    }
    uint64_t v;
    if (!parse_decimal(value, strlen(value), &v))
        return -1;
    if (v >= UINT32_MAX)
        return -2;
    *out = v;
    return 0;
}

/* ---- entry point ------------------------------------------------------------------------ */

int policy_parse_value(enum policy_key key, const char *value, struct policy_setting *s, char *why, size_t why_len)
{
    static const struct word_bit transports[] = {
        {"tcp", ORB_HP_T_TCP}, {"rdma", ORB_HP_T_RDMA}, {"nvlink", ORB_HP_T_NVLINK}};
    static const struct word_bit routes[] = {{"dmabuf", ORB_HP_R_DMABUF}, {"peermem", ORB_HP_R_PEERMEM}};
    char q[80];

    s->all = false;
    s->count = 0;
    if (value[0] == '\0')
        return why_set(why, why_len, "empty value (write '%s' to deny)",
                       key >= POLICY_KEY_MAX_REGISTERED_BYTES ? "0" : "none");

    if (key >= POLICY_KEY_MAX_REGISTERED_BYTES) {
        uint64_t v = 0;
        int rc = key == POLICY_KEY_MAX_REGISTERED_BYTES ? parse_bytes(value, &v) : parse_count(value, &v);
        if (rc == -2)
            return why_set(why, why_len, "'%s' is out of range (write 'unlimited' for no limit)",
                           quote_piece(value, strlen(value), q));
        if (rc != 0)
            return why_set(why, why_len, "'%s' is not %s", quote_piece(value, strlen(value), q),
                           key == POLICY_KEY_MAX_REGISTERED_BYTES
                               ? "a byte count (digits with an optional K, M, G or T suffix, or 'unlimited')"
                               : "a count (digits, or 'unlimited')");
        s->budget = v;
        return 0;
    }

    struct piece items[POLICY_MAX_LIST];
    uint32_t n = 0;
    if (split_list(value, items, &n, why, why_len) != 0)
        return -1;
    bool star_ok = key == POLICY_KEY_NICS || key == POLICY_KEY_GPUS;
    int special = list_special(items, n, star_ok, why, why_len);
    if (special < 0)
        return -1;
    if (special == 1) {
        s->all = true;
        return 0;
    }
    if (special == 2)
        return 0; /* "none": an empty list */

    switch (key) {
    case POLICY_KEY_NICS: return parse_nics(items, n, s, why, why_len);
    case POLICY_KEY_GPUS: return parse_gpus(items, n, s, why, why_len);
    case POLICY_KEY_TRANSPORTS:
        return parse_words(items, n, transports, sizeof transports / sizeof transports[0], "transport",
                           "tcp, rdma, nvlink or none", s, why, why_len);
    case POLICY_KEY_GPUDIRECT:
        return parse_words(items, n, routes, sizeof routes / sizeof routes[0], "GPUDirect route",
                           "dmabuf, peermem or none", s, why, why_len);
    case POLICY_KEY_SLOTS: return parse_slots(items, n, s, why, why_len);
    default: return why_set(why, why_len, "internal: unexpected key");
    }
}

void policy_setting_release(struct policy_setting *s)
{
    free(s->nics);
    free(s->slots);
    s->nics = NULL;
    s->slots = NULL;
}

bool policy_nic_matches(const struct policy_nic_pattern *pat, const struct orb_topo_nic *nic)
{
    switch (pat->kind) {
    case POLICY_NIC_NAME: return nic->name[0] != '\0' && strcmp(pat->text, nic->name) == 0;
    case POLICY_NIC_GLOB: return nic->name[0] != '\0' && fnmatch(pat->text, nic->name, 0) == 0;
    case POLICY_NIC_GUID: return nic->node_guid != 0 && nic->node_guid == pat->guid;
    case POLICY_NIC_PCI: return nic->pci[0] != '\0' && strcasecmp(pat->text + 4, nic->pci) == 0;
    default: return false;
    }
}
