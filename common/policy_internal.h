/* Private to common/policy*.c: the parsed form of the policy files. A policy is a flat list of
 * settings, one per "key = value" line, each remembering the section, file and line it came
 * from; decisions walk that list (see policy_decide.c). */
#ifndef ORB_COMMON_POLICY_INTERNAL_H
#define ORB_COMMON_POLICY_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/policy.h"

#define POLICY_MAX_FILE_BYTES (64u * 1024u) /* one policy file */
#define POLICY_MAX_FILES 256u               /* "*.ini" files in the directory */
#define POLICY_MAX_SETTINGS 4096u           /* "key = value" lines in all files together */
#define POLICY_MAX_LIST 64u                 /* items in one list value */
#define POLICY_ACCOUNT_MAX 64u              /* user and group names in section headers */
#define POLICY_PATTERN_MAX 64u              /* one NIC item as written */
#define POLICY_MSG_MAX 512u                 /* one error message */
#define POLICY_WHERE_MAX 160u               /* where an error is: "file.ini:12" */

enum policy_key {
    POLICY_KEY_NICS,
    POLICY_KEY_GPUS,
    POLICY_KEY_TRANSPORTS,
    POLICY_KEY_GPUDIRECT,
    POLICY_KEY_SLOTS,
    POLICY_KEY_MAX_REGISTERED_BYTES,
    POLICY_KEY_MAX_ENDPOINTS,
    POLICY_KEY_MAX_GRANTS,
    POLICY_KEY_COUNT
};

enum policy_section_kind {
    POLICY_SECTION_NONE,      /* before the first section header */
    POLICY_SECTION_DEFAULTS,
    POLICY_SECTION_USER,      /* [user:NAME] */
    POLICY_SECTION_UID,       /* [user:#UID] */
    POLICY_SECTION_GROUP,     /* [group:NAME] */
    POLICY_SECTION_GID        /* [group:#GID] */
};

struct policy_section {
    uint8_t kind;             /* enum policy_section_kind */
    uint32_t id;              /* UID / GID forms */
    char name[POLICY_ACCOUNT_MAX + 1]; /* NAME forms */
};

enum policy_nic_kind { POLICY_NIC_NAME, POLICY_NIC_GLOB, POLICY_NIC_GUID, POLICY_NIC_PCI };

struct policy_nic_pattern {
    uint8_t kind;             /* enum policy_nic_kind */
    uint64_t guid;            /* POLICY_NIC_GUID */
    char text[POLICY_PATTERN_MAX + 1]; /* as written (PCI: lower case) */
};

/* One "key = value" line. Lists: `all` for "*", count == 0 and !all for "none". */
struct policy_setting {
    struct policy_section section;
    uint8_t key;              /* enum policy_key */
    uint32_t file;            /* index into orb_policy.files */
    uint32_t line;
    bool all;
    uint32_t count;
    struct policy_nic_pattern *nics;       /* POLICY_KEY_NICS: count entries (owned) */
    char (*slots)[ORB_HP_NAME_MAX + 1];    /* POLICY_KEY_SLOTS: count entries (owned) */
    uint64_t gpus;            /* POLICY_KEY_GPUS: bit i = ordinal i */
    uint32_t bits;            /* transports / gpudirect: enum orb_hp_*_bits */
    uint64_t budget;          /* max_*: UINT64_MAX (or UINT32_MAX) = unlimited */
};

struct policy_file {
    char *name;               /* shown in decision reasons: the file's own name (owned) */
    char *display;            /* shown in error messages: origin/name (owned) */
};

struct orb_policy {
    char *error;              /* NULL, or why everything is denied (owned) */
    char *error_where;        /* with error: "file.ini:12", "file.ini" or the origin (owned) */
    uint32_t nfiles;
    struct policy_file *files;
    size_t nsettings;
    size_t cap;
    struct policy_setting *settings;
};

/* Key names, indexed by enum policy_key. */
extern const char *const policy_key_names[POLICY_KEY_COUNT];

/* Parse "defaults", "user:NAME", "user:#UID", "group:NAME" or "group:#GID" (the text between the
 * brackets, `len` bytes). Returns 0, or -1 with `why` filled. */
int policy_parse_section(const char *text, size_t len, struct policy_section *out, char *why, size_t why_len);

/* Format a section as written in a file: "[defaults]", "[group:#44]". */
void policy_format_section(const struct policy_section *s, char *buf, size_t len);

/* Parse `value` as the value of `key` into s (whose other fields are set by the caller).
 * Returns 0, -1 with `why` filled, or ORB_ENOMEM. On failure nothing is left allocated. */
int policy_parse_value(enum policy_key key, const char *value, struct policy_setting *s, char *why,
                       size_t why_len);

/* Free what a setting owns. */
void policy_setting_release(struct policy_setting *s);

/* Copy at most `max` bytes of `text` into buf for quoting in a message, replacing bytes that
 * are not printable ASCII with '?' and marking a cut with "...". */
void policy_quote(const char *text, size_t max, char *buf, size_t len);

/* snprintf for messages and reasons, which are bounded on purpose: a long value is cut. */
void policy_format(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Whether a NIC of the inventory matches a pattern. */
bool policy_nic_matches(const struct policy_nic_pattern *pat, const struct orb_topo_nic *nic);

#endif
