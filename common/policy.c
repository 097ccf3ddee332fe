/* Loading the policy: directory listing, file checks, and the INI text through inih.
 *
 * inih does the tokenising; everything around it is ours so that nothing depends on how the
 * library was configured: lines reach inih one at a time through read_line(), which counts
 * lines exactly, strips leading blanks (so inih's continuation-line rule never applies), checks
 * and parses section headers itself (inih silently truncates long ones and never reports a
 * section without keys), refuses control characters and lines longer than inih's buffer (which
 * it would otherwise split into two lines), and stops the parse at the first error. */
#include "common/policy_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ini.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

/* ---- parse state ------------------------------------------------------------------------ */

struct parse_state {
    struct orb_policy *p;
    uint32_t file;
    const char *text;
    size_t len;
    size_t pos;
    uint32_t line;
    struct policy_section section;
    int status;               /* 0, ORB_ECONFIG (msg and where set) or ORB_ENOMEM */
    char msg[POLICY_MSG_MAX];
    char where[POLICY_WHERE_MAX];
};

__attribute__((format(printf, 2, 3)))
static void parse_fail(struct parse_state *st, const char *fmt, ...)
{
    if (st->status != 0)
        return;
    char why[POLICY_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    policy_format(st->msg, sizeof st->msg, "%s:%u: %s", st->p->files[st->file].display, st->line, why);
    policy_format(st->where, sizeof st->where, "%s:%u", st->p->files[st->file].name, st->line);
    st->status = ORB_ECONFIG;
}

static bool is_blank(char c)
{
    return c == ' ' || c == '\t';
}

/* A section header line "[...]" (already trimmed): the name is ours to check; after ']' only a
 * comment may follow. Returns the length of "[name]" or 0 after parse_fail(). */
static size_t take_section(struct parse_state *st, const char *line, size_t n)
{
    const char *close = memchr(line, ']', n);
    if (!close) {
        parse_fail(st, "section header without ']'");
        return 0;
    }
    for (const char *r = close + 1; r < line + n; r++) {
        if (*r == ';' || *r == '#')
            break;
        if (!is_blank(*r)) {
            parse_fail(st, "text after the section header");
            return 0;
        }
    }
    char why[POLICY_MSG_MAX / 2];
    struct policy_section s;
    if (policy_parse_section(line + 1, (size_t)(close - line - 1), &s, why, sizeof why) != 0) {
        parse_fail(st, "%s", why);
        return 0;
    }
    st->section = s;
    return (size_t)(close - line) + 1;
}

/* inih's fgets-style reader over the file in memory. */
static char *read_line(char *str, int num, void *stream)
{
    struct parse_state *st = stream;
    if (st->status != 0 || st->pos >= st->len)
        return NULL;
    if (num < 3) {
        parse_fail(st, "internal: line buffer of %d bytes", num);
        return NULL;
    }
    const char *line = st->text + st->pos;
    size_t left = st->len - st->pos;
    const char *nl = memchr(line, '\n', left);
    size_t n = nl ? (size_t)(nl - line) : left;
    st->pos += n + (nl ? 1u : 0u);
    st->line++;

    if (st->line == 1 && n >= 3 && memcmp(line, "\xEF\xBB\xBF", 3) == 0) {
        line += 3; /* a UTF-8 byte order mark */
        n -= 3;
    }
    while (n > 0 && (is_blank(line[n - 1]) || line[n - 1] == '\r'))
        n--;
    while (n > 0 && is_blank(line[0])) {
        line++;
        n--;
    }

    /* Comments never reach inih, whatever their length or bytes: only the line count matters. */
    if (n > 0 && (line[0] == ';' || line[0] == '#'))
        n = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)line[i];
        if ((c < 0x20 && c != '\t') || c == 0x7f) {
            parse_fail(st, "control character 0x%02x", c);
            return NULL;
        }
    }
    if (n > 0 && line[0] == '[') {
        n = take_section(st, line, n);
        if (n == 0)
            return NULL;
    } else if (n > 0 && !memchr(line, '=', n) && !memchr(line, ':', n)) {
        parse_fail(st, "syntax error: expected '[section]' or 'key = value'");
        return NULL;
    }
    if (n > (size_t)num - 2) {
        parse_fail(st, "line longer than %d characters", num - 2);
        return NULL;
    }
    memcpy(str, line, n);
    str[n] = '\0';
    return str;
}

static bool same_section(const struct policy_section *a, const struct policy_section *b)
{
    if (a->kind != b->kind)
        return false;
    if (a->kind == POLICY_SECTION_UID || a->kind == POLICY_SECTION_GID)
        return a->id == b->id;
    return strcmp(a->name, b->name) == 0;
}

static int append_setting(struct orb_policy *p, const struct policy_setting *s)
{
    if (p->nsettings == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 16;
        struct policy_setting *grown = realloc(p->settings, cap * sizeof *grown);
        if (!grown)
            return ORB_ENOMEM;
        p->settings = grown;
        p->cap = cap;
    }
    p->settings[p->nsettings++] = *s;
    return 0;
}

/* inih's handler: one "key = value" line (inih has trimmed both). */
static int on_key(void *user, const char *section, const char *name, const char *value)
{
    (void)section; /* ours is in st->section, checked and never truncated */
    struct parse_state *st = user;
    struct orb_policy *p = st->p;
    char q[80];
    char where[96];
    if (st->status != 0)
        return 0;
    if (st->section.kind == POLICY_SECTION_NONE) {
        policy_quote(name, 48, q, sizeof q);
        parse_fail(st, "'%s' outside any section", q);
        return 0;
    }
    policy_format_section(&st->section, where, sizeof where);
    int key = 0;
    while (key < POLICY_KEY_COUNT && strcmp(name, policy_key_names[key]) != 0)
        key++;
    if (key == POLICY_KEY_COUNT) {
        policy_quote(name, 48, q, sizeof q);
        parse_fail(st, "unknown key '%s' in %s", q, where);
        return 0;
    }
    for (size_t i = 0; i < p->nsettings; i++) {
        const struct policy_setting *o = &p->settings[i];
        if (o->key == key && same_section(&o->section, &st->section)) {
            parse_fail(st, "duplicate key '%s' in %s (first set at %s:%u)", name, where,
                       p->files[o->file].name, o->line);
            return 0;
        }
    }
    if (p->nsettings >= POLICY_MAX_SETTINGS) {
        parse_fail(st, "more than %u settings in the policy", POLICY_MAX_SETTINGS);
        return 0;
    }
    struct policy_setting s = {.section = st->section, .key = (uint8_t)key, .file = st->file, .line = st->line};
    char why[POLICY_MSG_MAX / 2];
    int rc = policy_parse_value((enum policy_key)key, value, &s, why, sizeof why);
    if (rc == ORB_ENOMEM) {
        st->status = ORB_ENOMEM;
        return 0;
    }
    if (rc != 0) {
        parse_fail(st, "bad value for '%s': %s", name, why);
        return 0;
    }
    if (append_setting(p, &s) != 0) {
        policy_setting_release(&s);
        st->status = ORB_ENOMEM;
        return 0;
    }
    return 1;
}

static void drop_settings_from(struct orb_policy *p, size_t first)
{
    for (size_t i = first; i < p->nsettings; i++)
        policy_setting_release(&p->settings[i]);
    if (first < p->nsettings)
        p->nsettings = first;
}

/* Parse one file's text into p. Returns 0, ORB_ECONFIG with msg and where set (the file's
 * settings are dropped), or ORB_ENOMEM. */
static int parse_text(struct orb_policy *p, uint32_t file, const char *text, size_t len, char *msg, size_t msg_len,
                      char *where, size_t where_len)
{
    struct parse_state st = {.p = p, .file = file, .text = text, .len = len};
    size_t first = p->nsettings;
    int rc = ini_parse_stream(read_line, &st, on_key, &st);
    if (st.status == 0 && rc == -2)
        st.status = ORB_ENOMEM;
    if (st.status == 0 && rc != 0) {
        /* Not expected: read_line() lets through only lines inih accepts. */
        policy_format(st.msg, sizeof st.msg, "%s:%d: syntax error", p->files[file].display, rc);
        policy_format(st.where, sizeof st.where, "%s:%d", p->files[file].name, rc);
        st.status = ORB_ECONFIG;
    }
    if (st.status != 0) {
        drop_settings_from(p, first);
        if (st.status == ORB_ECONFIG) {
            snprintf(msg, msg_len, "%s", st.msg);
            snprintf(where, where_len, "%s", st.where);
        }
    }
    return st.status;
}

/* ---- policy objects --------------------------------------------------------------------- */

static void policy_release_settings(struct orb_policy *p)
{
    drop_settings_from(p, 0);
    free(p->settings);
    p->settings = NULL;
    p->cap = 0;
}

void orb_policy_free(struct orb_policy *p)
{
    if (!p)
        return;
    policy_release_settings(p);
    for (uint32_t i = 0; i < p->nfiles; i++) {
        free(p->files[i].name);
        free(p->files[i].display);
    }
    free(p->files);
    free(p->error);
    free(p->error_where);
    free(p);
}

const char *orb_policy_error(const struct orb_policy *p)
{
    if (!p)
        return "no policy";
    return p->error;
}

size_t orb_policy_file_count(const struct orb_policy *p)
{
    return p ? p->nfiles : 0;
}

/* Add a file entry; returns its index or -1 (out of memory). */
static int64_t add_file(struct orb_policy *p, const char *name, const char *display)
{
    struct policy_file *grown = realloc(p->files, (p->nfiles + 1u) * sizeof *grown);
    if (!grown)
        return -1;
    p->files = grown;
    char *n = strdup(name);
    char *d = strdup(display);
    if (!n || !d) {
        free(n);
        free(d);
        return -1;
    }
    p->files[p->nfiles].name = n;
    p->files[p->nfiles].display = d;
    return p->nfiles++;
}

/* Make p deny everything because of `msg`, found at `where` (the first problem wins). */
static int policy_deny(struct orb_policy *p, const char *msg, const char *where)
{
    if (p->error)
        return 0;
    p->error = strdup(msg);
    p->error_where = strdup(where);
    return p->error && p->error_where ? 0 : ORB_ENOMEM;
}

int orb_policy_load_string(const char *text, const char *origin, struct orb_policy **out)
{
    if (!text || !out)
        return orb_fail(ORB_EINVAL, "policy: NULL text or out");
    if (!origin)
        origin = "(string)";
    struct orb_policy *p = calloc(1, sizeof *p);
    if (!p)
        return orb_fail(ORB_ENOMEM, "policy: out of memory");
    char msg[POLICY_MSG_MAX];
    char where[POLICY_WHERE_MAX];
    int rc;
    if (add_file(p, origin, origin) < 0) {
        rc = ORB_ENOMEM;
        goto free_policy;
    }
    size_t len = strnlen(text, POLICY_MAX_FILE_BYTES + 1u);
    if (len > POLICY_MAX_FILE_BYTES) {
        policy_format(msg, sizeof msg, "%s: larger than %u bytes", origin, POLICY_MAX_FILE_BYTES);
        policy_format(where, sizeof where, "%s", origin);
        rc = ORB_ECONFIG;
    } else {
        rc = parse_text(p, 0, text, len, msg, sizeof msg, where, sizeof where);
    }
    if (rc == ORB_ENOMEM)
        goto free_policy;
    if (rc == ORB_ECONFIG) {
        policy_release_settings(p);
        if (policy_deny(p, msg, where) != 0) {
            rc = ORB_ENOMEM;
            goto free_policy;
        }
        orb_fail(ORB_ECONFIG, "%s", msg);
    }
    *out = p;
    return rc;
free_policy:
    orb_policy_free(p);
    return orb_fail(ORB_ENOMEM, "policy: out of memory");
}

int orb_policy_deny_all(const char *origin, const char *reason, struct orb_policy **out)
{
    if (!origin || !reason || !out)
        return orb_fail(ORB_EINVAL, "policy: NULL origin, reason or out");
    struct orb_policy *p = calloc(1, sizeof *p);
    if (!p)
        return orb_fail(ORB_ENOMEM, "policy: out of memory");
    char msg[POLICY_MSG_MAX];
    policy_format(msg, sizeof msg, "%s: %s", origin, reason);
    if (policy_deny(p, msg, origin) != 0) {
        orb_policy_free(p);
        return orb_fail(ORB_ENOMEM, "policy: out of memory");
    }
    *out = p;
    return orb_fail(ORB_ECONFIG, "%s", msg);
}

/* ---- the directory ---------------------------------------------------------------------- */

static bool file_name_char(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.' || c == '-' || c == '@' || c == '+';
}

static bool ends_with_ini(const char *name)
{
    size_t n = strlen(name);
    return n > 4 && strcmp(name + n - 4, ".ini") == 0;
}

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void free_names(char **names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

/* The "*.ini" names of the directory (hidden files skipped), sorted bytewise. Returns 0,
 * ORB_ECONFIG with msg set, or ORB_ENOMEM. */
static int list_policy_files(int dirfd, const char *origin, char ***names_out, size_t *count_out, char *msg,
                             size_t msg_len)
{
    int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(msg, msg_len, "%s: cannot list: %s", origin, strerror(errno));
        return ORB_ECONFIG;
    }
    DIR *dir = fdopendir(fd);
    if (!dir) {
        snprintf(msg, msg_len, "%s: cannot list: %s", origin, strerror(errno));
        close(fd);
        return ORB_ECONFIG;
    }
    char **names = NULL;
    size_t n = 0;
    int rc = 0;
    for (;;) {
        errno = 0;
        struct dirent *e = readdir(dir);
        if (!e) {
            if (errno != 0) {
                snprintf(msg, msg_len, "%s: cannot list: %s", origin, strerror(errno));
                rc = ORB_ECONFIG;
            }
            break;
        }
        if (e->d_name[0] == '.' || !ends_with_ini(e->d_name))
            continue;
        if (n == POLICY_MAX_FILES) {
            snprintf(msg, msg_len, "%s: more than %u policy files", origin, POLICY_MAX_FILES);
            rc = ORB_ECONFIG;
            break;
        }
        char **grown = realloc(names, (n + 1) * sizeof *grown);
        if (!grown || !(grown[n] = strdup(e->d_name))) {
            names = grown ? grown : names;
            rc = ORB_ENOMEM;
            break;
        }
        names = grown;
        n++;
    }
    closedir(dir);
    if (rc != 0) {
        free_names(names, n);
        return rc;
    }
    if (n > 1)
        qsort(names, n, sizeof *names, compare_names);
    *names_out = names;
    *count_out = n;
    return 0;
}

/* Open and check one file, then read it whole into a new NUL-terminated buffer. Returns 0,
 * ORB_ECONFIG with msg set (reason only, no file name), or ORB_ENOMEM. */
static int read_policy_file(int dirfd, const char *name, uint32_t expected_owner, char **text_out, size_t *len_out,
                            char *msg, size_t msg_len)
{
    int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        if (errno == ELOOP)
            snprintf(msg, msg_len, "is a symbolic link");
        else
            snprintf(msg, msg_len, "cannot open: %s", strerror(errno));
        return ORB_ECONFIG;
    }
    int rc = ORB_ECONFIG;
    char *text = NULL;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        snprintf(msg, msg_len, "cannot stat: %s", strerror(errno));
        goto close_file;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(msg, msg_len, "not a regular file");
        goto close_file;
    }
    if (st.st_uid != expected_owner) {
        snprintf(msg, msg_len, "owned by uid %u, expected uid %u", (unsigned)st.st_uid, expected_owner);
        goto close_file;
    }
    if (st.st_mode & (S_IWGRP | S_IWOTH)) {
        snprintf(msg, msg_len, "%s (mode %04o)", (st.st_mode & S_IWOTH) ? "world-writable" : "group-writable",
                 (unsigned)(st.st_mode & 07777));
        goto close_file;
    }
    if (st.st_nlink != 1) {
        snprintf(msg, msg_len, "has %lu hard links, expected 1", (unsigned long)st.st_nlink);
        goto close_file;
    }
    if (st.st_size > (off_t)POLICY_MAX_FILE_BYTES) {
        snprintf(msg, msg_len, "larger than %u bytes", POLICY_MAX_FILE_BYTES);
        goto close_file;
    }
    text = malloc(POLICY_MAX_FILE_BYTES + 2u);
    if (!text) {
        rc = ORB_ENOMEM;
        goto close_file;
    }
    /* Read up to one byte past the limit: the file may have grown since fstat. */
    size_t len = 0;
    while (len <= POLICY_MAX_FILE_BYTES) {
        ssize_t got = read(fd, text + len, POLICY_MAX_FILE_BYTES + 1u - len);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            snprintf(msg, msg_len, "cannot read: %s", strerror(errno));
            goto free_text;
        }
        if (got == 0)
            break;
        len += (size_t)got;
    }
    if (len > POLICY_MAX_FILE_BYTES) {
        snprintf(msg, msg_len, "larger than %u bytes", POLICY_MAX_FILE_BYTES);
        goto free_text;
    }
    if (memchr(text, '\0', len)) {
        snprintf(msg, msg_len, "contains a NUL byte");
        goto free_text;
    }
    text[len] = '\0';
    *text_out = text;
    *len_out = len;
    close(fd);
    return 0;
free_text:
    free(text);
close_file:
    close(fd);
    return rc;
}

/* The directory itself must be the administrator's too: otherwise anyone allowed to write it
 * could replace a file between our listing and our open. */
static int check_directory(int dirfd, const char *origin, uint32_t expected_owner, char *msg, size_t msg_len)
{
    struct stat st;
    if (fstat(dirfd, &st) != 0) {
        snprintf(msg, msg_len, "%s: cannot stat: %s", origin, strerror(errno));
        return ORB_ECONFIG;
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(msg, msg_len, "%s: not a directory", origin);
        return ORB_ECONFIG;
    }
    if (st.st_uid != expected_owner) {
        snprintf(msg, msg_len, "%s: directory owned by uid %u, expected uid %u", origin, (unsigned)st.st_uid,
                 expected_owner);
        return ORB_ECONFIG;
    }
    if (st.st_mode & (S_IWGRP | S_IWOTH)) {
        snprintf(msg, msg_len, "%s: directory is %s (mode %04o)", origin,
                 (st.st_mode & S_IWOTH) ? "world-writable" : "group-writable", (unsigned)(st.st_mode & 07777));
        return ORB_ECONFIG;
    }
    return 0;
}

/* One file: name check, open + checks, parse. Returns 0, ORB_ECONFIG (msg and where set) or
 * ORB_ENOMEM. */
static int load_one_file(struct orb_policy *p, int dirfd, const char *origin, const char *name,
                         uint32_t expected_owner, char *display, size_t display_len, char *msg, size_t msg_len,
                         char *where, size_t where_len)
{
    bool name_ok = strlen(name) <= 128;
    for (const char *c = name; name_ok && *c; c++)
        name_ok = file_name_char(*c);
    if (!name_ok) {
        char q[80];
        policy_quote(name, 48, q, sizeof q);
        policy_format(display, display_len, "%s/%s", origin, q);
        policy_format(msg, msg_len, "%s: file name outside [A-Za-z0-9_.@+-]{1,128}", display);
        policy_format(where, where_len, "%s", q);
        return ORB_ECONFIG;
    }
    snprintf(display, display_len, "%s/%s", origin, name);
    int64_t file = add_file(p, name, display);
    if (file < 0)
        return ORB_ENOMEM;
    char *text = NULL;
    size_t len = 0;
    char why[POLICY_MSG_MAX / 2];
    int rc = read_policy_file(dirfd, name, expected_owner, &text, &len, why, sizeof why);
    if (rc == ORB_ECONFIG) {
        policy_format(msg, msg_len, "%s: %s", display, why);
        policy_format(where, where_len, "%s", name);
    }
    if (rc != 0)
        return rc;
    rc = parse_text(p, (uint32_t)file, text, len, msg, msg_len, where, where_len);
    free(text);
    return rc;
}

/* Load the directory into a new policy; with `report`, every file is checked (and reported)
 * even after a bad one, otherwise loading stops at the first problem. */
static int load_dir(int dirfd, const char *origin, uint32_t expected_owner, orb_policy_report_fn report, void *ctx,
                    struct orb_policy **out)
{
    if (!out || dirfd < 0)
        return orb_fail(ORB_EINVAL, "policy: bad directory fd or NULL out");
    if (!origin)
        origin = ".";
    struct orb_policy *p = calloc(1, sizeof *p);
    if (!p)
        return orb_fail(ORB_ENOMEM, "policy: out of memory");
    char msg[POLICY_MSG_MAX];
    char where[POLICY_WHERE_MAX];
    char display[POLICY_MSG_MAX / 2];
    char **names = NULL;
    size_t nnames = 0;
    int rc = check_directory(dirfd, origin, expected_owner, msg, sizeof msg);
    if (rc == 0)
        rc = list_policy_files(dirfd, origin, &names, &nnames, msg, sizeof msg);
    if (rc == ORB_ENOMEM)
        goto free_policy;
    if (rc == ORB_ECONFIG) {
        if (report)
            report(ctx, origin, msg);
        if (policy_deny(p, msg, origin) != 0)
            goto free_policy;
    }
    for (size_t i = 0; i < nnames; i++) {
        rc = load_one_file(p, dirfd, origin, names[i], expected_owner, display, sizeof display, msg, sizeof msg,
                           where, sizeof where);
        if (rc == ORB_ENOMEM)
            goto free_names;
        if (report)
            report(ctx, display, rc == 0 ? NULL : msg);
        if (rc == ORB_ECONFIG) {
            if (policy_deny(p, msg, where) != 0)
                goto free_names;
            if (!report)
                break;
        }
    }
    free_names(names, nnames);
    if (p->error) {
        policy_release_settings(p); /* a denying policy keeps no grant */
        orb_fail(ORB_ECONFIG, "%s", p->error);
        *out = p;
        return ORB_ECONFIG;
    }
    *out = p;
    return 0;
free_names:
    free_names(names, nnames);
free_policy:
    orb_policy_free(p);
    return orb_fail(ORB_ENOMEM, "policy: out of memory");
}

int orb_policy_load_dir(int dirfd, const char *origin, uint32_t expected_owner, struct orb_policy **out)
{
    return load_dir(dirfd, origin, expected_owner, NULL, NULL, out);
}

int orb_policy_check_dir(int dirfd, const char *origin, uint32_t expected_owner, orb_policy_report_fn report,
                         void *ctx)
{
    if (!report)
        return orb_fail(ORB_EINVAL, "policy: NULL report function");
    struct orb_policy *p = NULL;
    int rc = load_dir(dirfd, origin, expected_owner, report, ctx, &p);
    orb_policy_free(p);
    return rc;
}
