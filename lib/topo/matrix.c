/* TENT priority matrices: JSON (both forms) compiled into immutable per-location NIC ranks. */
#include "topo/matrix.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

/* Rows are stored directly indexed by location; a present bit says a location has its own row. */
struct orb_topo_ranks {
    uint8_t form;              /* enum orb_matrix_form */
    uint8_t has_wildcard;      /* the "*" row exists (explicit or synthesised) */
    uint64_t cpu_present;      /* bit N: cpu:N has its own row */
    uint64_t cuda_present;     /* bit N: cuda:N has its own row */
    struct orb_topo_rank_row wildcard;
    struct orb_topo_rank_row cpu[ORB_LOCATION_CPU_MAX + 1];
    struct orb_topo_rank_row cuda[ORB_LOCATION_CUDA_MAX + 1];
};

/* At most one row per location, plus "*". */
#define MATRIX_MAX_ROWS (ORB_LOCATION_CPU_MAX + 1 + ORB_LOCATION_CUDA_MAX + 1 + 1)
#define QUOTE_NAME_MAX 72    /* a quoted NIC name or location in a message */
#define KEY_TEXT_MAX 160     /* the JSON key path in a message */
#define ORIGIN_TEXT_MAX 200  /* "priority_matrix" or custom_json_path "<file>" */
#define ORIGIN_PATH_SHOWN 150

/* One compilation: the inputs, the output under construction and the classic rows' order. */
struct compile {
    const char *origin;
    const struct orb_topo_inventory *inv;
    uint64_t eligible;
    struct orb_topo_ranks *ranks;
    size_t nrows;
    struct orb_topo_rank_row *row_order[MATRIX_MAX_ROWS]; /* explicit rows in document order */
};

/* Fail with ORB_ECONFIG: "<origin>: <key>: <reason>". The reason is formatted first into a
 * local buffer, so that it may quote orb_last_error() of a callee. */
__attribute__((format(printf, 3, 4))) static int bad(const struct compile *c, const char *key,
                                                     const char *fmt, ...)
{
    char reason[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    return orb_fail(ORB_ECONFIG, "%s: %s: %s", c->origin, key, reason);
}

/* Write a JSON key path for a message; a cut is harmless (the reason follows separately). */
__attribute__((format(printf, 3, 4))) static void key_text(char *buf, size_t len, const char *fmt,
                                                          ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, len, fmt, ap);
    va_end(ap);
}

static const char *json_type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "an unknown JSON value";
}

/* ---- rows ------------------------------------------------------------------------------------ */

static void row_init(struct orb_topo_rank_row *row, uint8_t origin)
{
    memset(row, 0, sizeof *row);
    memset(row->rank, ORB_TOPO_RANK_NONE, sizeof row->rank);
    row->origin = origin;
}

/* The row slot of `loc`, or NULL when the location is outside the grammar. */
static struct orb_topo_rank_row *row_slot(struct orb_topo_ranks *r, struct orb_location loc,
                                          uint64_t **present_out, uint64_t *bit_out)
{
    switch (loc.kind) {
    case ORB_LOC_CPU:
        if (loc.index > ORB_LOCATION_CPU_MAX)
            return NULL;
        *present_out = &r->cpu_present;
        *bit_out = UINT64_C(1) << loc.index;
        return &r->cpu[loc.index];
    case ORB_LOC_CUDA:
        if (loc.index > ORB_LOCATION_CUDA_MAX)
            return NULL;
        *present_out = &r->cuda_present;
        *bit_out = UINT64_C(1) << loc.index;
        return &r->cuda[loc.index];
    default:
        return NULL;
    }
}

/* Create the row of `loc` (which check_location accepted). Fails on a second row for it. */
static int claim_row(struct compile *c, const char *key, struct orb_location loc,
                     struct orb_topo_rank_row **row_out)
{
    char shown[ORB_LOCATION_STR_MAX];
    if (orb_location_format(loc, shown, sizeof shown) != 0)
        return bad(c, key, "internal: location cannot be formatted");
    struct orb_topo_rank_row *row;
    if (loc.kind == ORB_LOC_ANY) {
        if (c->ranks->has_wildcard)
            return bad(c, key, "location \"*\" is listed twice");
        c->ranks->has_wildcard = 1;
        row = &c->ranks->wildcard;
        row_init(row, ORB_ROW_WILDCARD);
    } else {
        uint64_t *present = NULL;
        uint64_t bit = 0;
        row = row_slot(c->ranks, loc, &present, &bit);
        if (!row)
            return bad(c, key, "internal: location %s has no row slot", shown);
        if (*present & bit)
            return bad(c, key, "location %s is listed twice", shown);
        *present |= bit;
        row_init(row, ORB_ROW_LISTED);
    }
    if (c->nrows >= MATRIX_MAX_ROWS)
        return bad(c, key, "internal: more than %d rows", MATRIX_MAX_ROWS);
    c->row_order[c->nrows++] = row;
    *row_out = row;
    return 0;
}

/* Give NIC `id` rank `rank` in an explicit row: a NIC has one rank per location. */
static int row_add(const struct compile *c, const char *key, struct orb_topo_rank_row *row,
                   unsigned rank, uint8_t id, const char *shown_name)
{
    uint64_t bit = UINT64_C(1) << id;
    if (row->listed & bit)
        return bad(c, key, "NIC \"%s\" is listed twice for this location (already rank %u)",
                   shown_name, row->rank[id]);
    row->listed |= bit;
    row->rank[id] = (uint8_t)rank;
    row->nics[rank][row->count[rank]++] = id;
    return 0;
}

/* The classic form's "*" when the document has none: see matrix.h. */
static void synthesize_wildcard(struct compile *c)
{
    struct orb_topo_rank_row *w = &c->ranks->wildcard;
    row_init(w, ORB_ROW_SYNTHESIZED);
    for (unsigned rank = 0; rank < ORB_TOPO_RANKS; rank++) {
        uint64_t seen = 0;
        for (size_t i = 0; i < c->nrows; i++) {
            const struct orb_topo_rank_row *row = c->row_order[i];
            for (unsigned k = 0; k < row->count[rank]; k++) {
                uint8_t id = row->nics[rank][k];
                uint64_t bit = UINT64_C(1) << id;
                if (seen & bit)
                    continue;
                seen |= bit;
                w->nics[rank][w->count[rank]++] = id;
                w->listed |= bit;
                if (w->rank[id] > rank)
                    w->rank[id] = (uint8_t)rank;
            }
        }
    }
    c->ranks->has_wildcard = 1;
}

/* ---- names and locations against the inventory ---------------------------------------------- */

/* Resolve NIC name `v` (a JSON value) to its stable id; it must be usable and eligible. */
static int resolve_nic(const struct compile *c, const char *key, const json_t *v, uint8_t *id_out,
                       char shown[QUOTE_NAME_MAX])
{
    if (!json_is_string(v))
        return bad(c, key, "a NIC name must be a string, not %s", json_type_name(v));
    const char *name = json_string_value(v);
    orb_topo_quote_text(name, shown, QUOTE_NAME_MAX);
    uint32_t n = c->inv->nnics < ORB_TOPO_MAX_NICS ? c->inv->nnics : ORB_TOPO_MAX_NICS;
    for (uint32_t i = 0; i < n; i++) {
        const struct orb_topo_nic *nic = &c->inv->nics[i];
        if (strncmp(nic->name, name, sizeof nic->name) != 0)
            continue;
        if (nic->id >= ORB_TOPO_MAX_NICS)
            return bad(c, key, "NIC \"%s\" has no valid id in the inventory", shown);
        if (!nic->usable)
            return bad(c, key, "NIC \"%s\" failed discovery and cannot be used", shown);
        if (!(c->eligible & (UINT64_C(1) << nic->id)))
            return bad(c, key, "NIC \"%s\" is excluded by the NIC filters", shown);
        *id_out = nic->id;
        return 0;
    }
    return bad(c, key, "NIC \"%s\" is not in the discovered inventory", shown);
}

/* Parse location text `text` and check it names discovered memory. */
static int resolve_location(const struct compile *c, const char *key, const char *text,
                            struct orb_location *loc_out)
{
    struct orb_location loc;
    if (orb_location_parse(text, &loc) != 0)
        return bad(c, key, "%s", orb_last_error());
    uint32_t n;
    int found = 0;
    switch (loc.kind) {
    case ORB_LOC_CPU:
        n = c->inv->nnuma < ORB_TOPO_MAX_NUMA ? c->inv->nnuma : ORB_TOPO_MAX_NUMA;
        /* A host without NUMA data has one implicit node, 0. */
        found = n == 0 && loc.index == 0;
        for (uint32_t i = 0; i < n && !found; i++)
            found = c->inv->numa[i].id == (int32_t)loc.index;
        if (!found)
            return bad(c, key, "cpu:%u is not a discovered NUMA node", loc.index);
        break;
    case ORB_LOC_CUDA:
        n = c->inv->ngpus < ORB_TOPO_MAX_GPUS ? c->inv->ngpus : ORB_TOPO_MAX_GPUS;
        for (uint32_t i = 0; i < n && !found; i++)
            found = c->inv->gpus[i].ordinal == loc.index;
        if (!found)
            return bad(c, key, "cuda:%u is not a discovered GPU (%u discovered)", loc.index,
                       (unsigned)n);
        break;
    default:
        break;
    }
    *loc_out = loc;
    return 0;
}

/* ---- classic form ----------------------------------------------------------------------------- */

static int compile_classic(struct compile *c, json_t *root)
{
    const char *k;
    json_t *v;
    int rc;
    json_object_foreach(root, k, v) {
        char shown_loc[QUOTE_NAME_MAX];
        char key[KEY_TEXT_MAX];
        orb_topo_quote_text(k, shown_loc, sizeof shown_loc);
        key_text(key, sizeof key, "key \"%s\"", shown_loc);

        struct orb_location loc;
        if ((rc = resolve_location(c, key, k, &loc)) != 0)
            return rc;
        if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_array(json_array_get(v, 0)) ||
            !json_is_array(json_array_get(v, 1))) {
            if (json_is_array(v))
                return bad(c, key,
                           "a row must be [[preferred NIC names], [available NIC names]]: got an "
                           "array of %zu element(s) that is not two lists",
                           json_array_size(v));
            return bad(c, key,
                       "a row must be [[preferred NIC names], [available NIC names]], not %s",
                       json_type_name(v));
        }
        struct orb_topo_rank_row *row;
        if ((rc = claim_row(c, key, loc, &row)) != 0)
            return rc;
        for (unsigned rank = 0; rank < 2; rank++) {
            json_t *list = json_array_get(v, rank);
            size_t i;
            json_t *name;
            json_array_foreach(list, i, name) {
                char entry_key[KEY_TEXT_MAX];
                key_text(entry_key, sizeof entry_key, "key \"%s\" rank %u entry %zu", shown_loc,
                         rank, i);
                char shown_name[QUOTE_NAME_MAX];
                uint8_t id;
                if ((rc = resolve_nic(c, entry_key, name, &id, shown_name)) != 0)
                    return rc;
                if ((rc = row_add(c, entry_key, row, rank, id, shown_name)) != 0)
                    return rc;
            }
        }
    }
    if (c->nrows == 0)
        return bad(c, "(document)", "the matrix lists no location");
    if (!c->ranks->has_wildcard)
        synthesize_wildcard(c);
    return 0;
}

/* ---- native form ------------------------------------------------------------------------------ */

/* An optional integer field in [lo, hi]; `*value_out` untouched when absent. */
static int optional_int(const struct compile *c, const char *key, const json_t *obj,
                        const char *field, json_int_t lo, json_int_t hi, json_int_t *value_out,
                        int *present_out)
{
    const json_t *v = json_object_get(obj, field);
    *present_out = v != NULL;
    if (!v)
        return 0;
    if (!json_is_integer(v))
        return bad(c, key, "\"%s\" must be an integer, not %s", field, json_type_name(v));
    json_int_t value = json_integer_value(v);
    if (value < lo || value > hi)
        return bad(c, key, "\"%s\" is %lld, outside [%lld, %lld]", field, (long long)value,
                   (long long)lo, (long long)hi);
    *value_out = value;
    return 0;
}

/* Every key of `obj` must be one of the NULL-terminated `known`. */
static int known_keys_only(const struct compile *c, const char *key, const json_t *obj,
                           const char *const *known)
{
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)obj, k, v) {
        size_t i = 0;
        while (known[i] && strcmp(known[i], k) != 0)
            i++;
        if (!known[i]) {
            char shown[QUOTE_NAME_MAX];
            orb_topo_quote_text(k, shown, sizeof shown);
            return bad(c, key, "unknown key \"%s\"", shown);
        }
    }
    return 0;
}

/* The fields shared by nics and mems entries that the file may carry but never overrides. */
static int check_ignored_metadata(const struct compile *c, const char *key, const json_t *obj)
{
    const json_t *pci = json_object_get(obj, "pci_bus_id");
    if (pci && !json_is_string(pci))
        return bad(c, key, "\"pci_bus_id\" must be a string, not %s", json_type_name(pci));
    json_int_t numa = 0;
    int present;
    return optional_int(c, key, obj, "numa_node", -1, INT32_MAX, &numa, &present);
}

static int compile_native_nics(struct compile *c, const json_t *nics, uint8_t *file_ids,
                               char (*shown_names)[QUOTE_NAME_MAX], size_t *nfile_out)
{
    static const char *const known[] = {"name", "type", "pci_bus_id", "numa_node", "device_attrs",
                                        NULL};
    if (!json_is_array(nics))
        return bad(c, "nics", "must be an array, not %s", json_type_name(nics));
    if (json_array_size(nics) > ORB_TOPO_MAX_NICS)
        return bad(c, "nics", "lists %zu NICs, more than the %d an inventory holds",
                   json_array_size(nics), ORB_TOPO_MAX_NICS);
    uint64_t seen = 0;
    size_t i;
    const json_t *nic;
    int rc;
    json_array_foreach(nics, i, nic) {
        char key[KEY_TEXT_MAX];
        key_text(key, sizeof key, "nics[%zu]", i);
        if (!json_is_object(nic))
            return bad(c, key, "must be an object, not %s", json_type_name(nic));
        if ((rc = known_keys_only(c, key, nic, known)) != 0)
            return rc;
        const json_t *name = json_object_get(nic, "name");
        if (!name)
            return bad(c, key, "\"name\" is missing");
        char name_key[KEY_TEXT_MAX];
        key_text(name_key, sizeof name_key, "nics[%zu].name", i);
        char *shown = shown_names[i];
        uint8_t id;
        if ((rc = resolve_nic(c, name_key, name, &id, shown)) != 0)
            return rc;
        if (seen & (UINT64_C(1) << id))
            return bad(c, name_key, "NIC \"%s\" is listed twice in \"nics\"", shown);
        seen |= UINT64_C(1) << id;
        json_int_t type = 0;
        int present;
        if ((rc = optional_int(c, key, nic, "type", INT32_MIN, INT32_MAX, &type, &present)) != 0)
            return rc;
        if (present && type != 0)
            return bad(c, key, "\"type\" is %lld: only 0 (an RDMA NIC) is accepted",
                       (long long)type);
        if ((rc = check_ignored_metadata(c, key, nic)) != 0)
            return rc;
        const json_t *attrs = json_object_get(nic, "device_attrs");
        if (attrs) {
            if (!json_is_object(attrs))
                return bad(c, key, "\"device_attrs\" must be an object, not %s",
                           json_type_name(attrs));
            const char *ak;
            const json_t *av;
            json_object_foreach((json_t *)attrs, ak, av) {
                if (!json_is_string(av)) {
                    char shown_attr[QUOTE_NAME_MAX];
                    orb_topo_quote_text(ak, shown_attr, sizeof shown_attr);
                    return bad(c, key, "\"device_attrs\" value \"%s\" must be a string, not %s",
                               shown_attr, json_type_name(av));
                }
            }
        }
        file_ids[i] = id;
    }
    *nfile_out = json_array_size(nics);
    return 0;
}

static int compile_native_mem(struct compile *c, size_t index, const json_t *mem,
                              const uint8_t *file_ids, char (*shown_names)[QUOTE_NAME_MAX],
                              size_t nfile)
{
    static const char *const known[] = {"name", "type", "pci_bus_id", "numa_node", "device_list",
                                        NULL};
    static const char *const rank_keys[] = {"rank0", "rank1", "rank2", NULL};
    char key[KEY_TEXT_MAX];
    int rc;
    key_text(key, sizeof key, "mems[%zu]", index);
    if (!json_is_object(mem))
        return bad(c, key, "must be an object, not %s", json_type_name(mem));
    /* The name first, so that every later message can show which location it is about. */
    const json_t *name = json_object_get(mem, "name");
    if (!name)
        return bad(c, key, "\"name\" is missing");
    if (!json_is_string(name))
        return bad(c, key, "\"name\" must be a location string, not %s", json_type_name(name));
    char shown_loc[QUOTE_NAME_MAX];
    orb_topo_quote_text(json_string_value(name), shown_loc, sizeof shown_loc);
    key_text(key, sizeof key, "mems[%zu] (\"%s\")", index, shown_loc);
    if ((rc = known_keys_only(c, key, mem, known)) != 0)
        return rc;
    struct orb_location loc;
    if ((rc = resolve_location(c, key, json_string_value(name), &loc)) != 0)
        return rc;
    json_int_t type = 0;
    int present;
    if ((rc = optional_int(c, key, mem, "type", INT32_MIN, INT32_MAX, &type, &present)) != 0)
        return rc;
    int expected = orb_location_mem_type(loc);
    if (present && type != expected)
        return bad(c, key, "\"type\" is %lld but %s memory is type %d", (long long)type,
                   shown_loc, expected);
    if ((rc = check_ignored_metadata(c, key, mem)) != 0)
        return rc;
    const json_t *list = json_object_get(mem, "device_list");
    if (!list)
        return bad(c, key, "\"device_list\" is missing");
    if (!json_is_object(list))
        return bad(c, key, "\"device_list\" must be an object, not %s", json_type_name(list));
    char list_key[KEY_TEXT_MAX];
    key_text(list_key, sizeof list_key, "%s.device_list", key);
    if ((rc = known_keys_only(c, list_key, list, rank_keys)) != 0)
        return rc;
    struct orb_topo_rank_row *row;
    if ((rc = claim_row(c, key, loc, &row)) != 0)
        return rc;
    for (unsigned rank = 0; rank < ORB_TOPO_RANKS; rank++) {
        const json_t *ids = json_object_get(list, rank_keys[rank]);
        if (!ids)
            continue;
        char rank_key[KEY_TEXT_MAX];
        key_text(rank_key, sizeof rank_key, "%s.device_list.%s", key, rank_keys[rank]);
        if (!json_is_array(ids))
            return bad(c, rank_key, "must be an array of NIC indices, not %s",
                       json_type_name(ids));
        size_t i;
        const json_t *v;
        json_array_foreach(ids, i, v) {
            char entry_key[KEY_TEXT_MAX];
            key_text(entry_key, sizeof entry_key, "%s[%zu]", rank_key, i);
            if (!json_is_integer(v))
                return bad(c, entry_key, "a NIC index must be an integer, not %s",
                           json_type_name(v));
            json_int_t at = json_integer_value(v);
            if (at < 0 || (size_t)at >= nfile)
                return bad(c, entry_key, "NIC index %lld is outside \"nics\" (%zu entries)",
                           (long long)at, nfile);
            uint8_t id = file_ids[at];
            if ((rc = row_add(c, entry_key, row, rank, id, shown_names[at])) != 0)
                return rc;
        }
    }
    return 0;
}

static int compile_native(struct compile *c, json_t *root)
{
    static const char *const known[] = {"nics", "mems", NULL};
    int rc;
    if ((rc = known_keys_only(c, "(document)", root, known)) != 0)
        return rc;
    const json_t *nics = json_object_get(root, "nics");
    const json_t *mems = json_object_get(root, "mems");
    if (!nics)
        return bad(c, "(document)", "the native form needs \"nics\"");
    if (!mems)
        return bad(c, "(document)", "the native form needs \"mems\"");
    /* The file's NIC order: inventory id and quoted name (for messages) of each entry. */
    uint8_t file_ids[ORB_TOPO_MAX_NICS];
    char shown_names[ORB_TOPO_MAX_NICS][QUOTE_NAME_MAX];
    size_t nfile = 0;
    if ((rc = compile_native_nics(c, nics, file_ids, shown_names, &nfile)) != 0)
        return rc;
    if (!json_is_array(mems))
        return bad(c, "mems", "must be an array, not %s", json_type_name(mems));
    if (json_array_size(mems) == 0)
        return bad(c, "mems", "the matrix lists no location");
    if (json_array_size(mems) > MATRIX_MAX_ROWS)
        return bad(c, "mems", "lists %zu locations, more than the %d that exist",
                   json_array_size(mems), MATRIX_MAX_ROWS);
    size_t i;
    const json_t *mem;
    json_array_foreach(mems, i, mem) {
        if ((rc = compile_native_mem(c, i, mem, file_ids, shown_names, nfile)) != 0)
            return rc;
    }
    return 0;
}

/* ---- entry points ---------------------------------------------------------------------------- */

int orb_topo_ranks_parse(const char *json, size_t len, unsigned accept, const char *origin,
                         const struct orb_topo_inventory *inv, uint64_t eligible,
                         struct orb_topo_ranks **out)
{
    if (!json || !origin || !inv || !out)
        return orb_fail(ORB_EINVAL, "matrix parse: NULL argument");
    if (accept == 0 || (accept & ~ORB_MATRIX_ACCEPT_ANY) != 0)
        return orb_fail(ORB_EINVAL, "matrix parse: unknown accepted forms 0x%x", accept);
    struct compile *c = calloc(1, sizeof *c);
    if (!c)
        return orb_fail(ORB_ENOMEM, "%s: out of memory", origin);
    c->origin = origin;
    c->inv = inv;
    c->eligible = eligible;
    int rc;
    json_t *root = NULL;
    if (len == 0) {
        rc = bad(c, "(document)", "the input is empty");
        goto free_compile;
    }
    if (len > ORB_TOPO_MATRIX_MAX_BYTES) {
        rc = bad(c, "(document)", "the input is %zu bytes, over the %u-byte limit", len,
                 ORB_TOPO_MATRIX_MAX_BYTES);
        goto free_compile;
    }
    json_error_t err;
    root = json_loadb(json, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &err);
    if (!root) {
        char shown[sizeof err.text];
        orb_topo_quote_text(err.text, shown, sizeof shown);
        rc = bad(c, "(document)", "invalid JSON at line %d column %d: %s", err.line, err.column,
                 shown);
        goto free_compile;
    }
    if (!json_is_object(root)) {
        rc = bad(c, "(document)", "the matrix must be a JSON object, not %s",
                 json_type_name(root));
        goto release_json;
    }
    int native = json_object_get(root, "nics") != NULL || json_object_get(root, "mems") != NULL;
    if (native && !(accept & (1u << ORB_MATRIX_NATIVE))) {
        rc = bad(c, "(document)",
                 "the native {\"nics\", \"mems\"} form is accepted only from custom_json_path");
        goto release_json;
    }
    c->ranks = calloc(1, sizeof *c->ranks);
    if (!c->ranks) {
        rc = orb_fail(ORB_ENOMEM, "%s: out of memory", origin);
        goto release_json;
    }
    c->ranks->form = native ? ORB_MATRIX_NATIVE : ORB_MATRIX_CLASSIC;
    rc = native ? compile_native(c, root) : compile_classic(c, root);
    if (rc != 0) {
        free(c->ranks);
        goto release_json;
    }
    *out = c->ranks;
release_json:
    json_decref(root);
free_compile:
    free(c);
    return rc;
}

/* "custom_json_path \"<path>\"", keeping the end of a long path (the file name). */
static void format_file_origin(const char *path, char *buf, size_t len)
{
    char shown[ORIGIN_PATH_SHOWN + 1];
    size_t plen = strlen(path);
    if (plen <= ORIGIN_PATH_SHOWN) {
        orb_topo_quote_text(path, shown, sizeof shown);
    } else {
        memcpy(shown, "...", 3);
        orb_topo_quote_text(path + plen - (ORIGIN_PATH_SHOWN - 3), shown + 3, sizeof shown - 3);
    }
    snprintf(buf, len, "custom_json_path \"%s\"", shown);
}

static const char *file_kind(mode_t mode)
{
    if (S_ISDIR(mode))
        return "a directory";
    if (S_ISFIFO(mode))
        return "a FIFO";
    if (S_ISSOCK(mode))
        return "a socket";
    if (S_ISCHR(mode))
        return "a character device";
    if (S_ISBLK(mode))
        return "a block device";
    return "not a regular file";
}

/* Read all of `path` (1 byte to 1 MiB, a regular file) into a new buffer the caller frees. */
static int read_bounded(const char *path, const char *origin, char **text_out, size_t *len_out)
{
    /* O_NONBLOCK: opening a FIFO must not wait for a writer; fstat rejects it right after. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0)
        return orb_fail(ORB_ECONFIG, "%s: cannot open: %s", origin, strerror(errno));
    int rc;
    char *text = NULL;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rc = orb_fail(ORB_ECONFIG, "%s: cannot stat: %s", origin, strerror(errno));
        goto close_fd;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = orb_fail(ORB_ECONFIG, "%s: is %s, not a regular file", origin, file_kind(st.st_mode));
        goto close_fd;
    }
    if (st.st_size <= 0) {
        rc = orb_fail(ORB_ECONFIG, "%s: the file is empty", origin);
        goto close_fd;
    }
    if ((uint64_t)st.st_size > ORB_TOPO_MATRIX_MAX_BYTES) {
        rc = orb_fail(ORB_ECONFIG, "%s: the file is %lld bytes, over the %u-byte limit", origin,
                      (long long)st.st_size, ORB_TOPO_MATRIX_MAX_BYTES);
        goto close_fd;
    }
    size_t size = (size_t)st.st_size;
    /* One byte more than fstat said, to notice a file that grows while it is read. */
    text = malloc(size + 1);
    if (!text) {
        rc = orb_fail(ORB_ENOMEM, "%s: out of memory for %zu bytes", origin, size);
        goto close_fd;
    }
    size_t got = 0;
    while (got < size + 1) {
        ssize_t n = read(fd, text + got, size + 1 - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = orb_fail(ORB_ECONFIG, "%s: cannot read: %s", origin, strerror(errno));
            goto free_text;
        }
        if (n == 0)
            break;
        got += (size_t)n;
    }
    if (got > size) {
        rc = orb_fail(ORB_ECONFIG, "%s: the file grew while it was read", origin);
        goto free_text;
    }
    if (got == 0) {
        rc = orb_fail(ORB_ECONFIG, "%s: the file is empty", origin);
        goto free_text;
    }
    *text_out = text;
    *len_out = got;
    rc = 0;
    goto close_fd;
free_text:
    free(text);
close_fd:
    close(fd);
    return rc;
}

int orb_topo_ranks_read_file(const char *path, const struct orb_topo_inventory *inv,
                             uint64_t eligible, struct orb_topo_ranks **out)
{
    if (!path || !inv || !out)
        return orb_fail(ORB_EINVAL, "matrix file: NULL argument");
    if (path[0] == '\0')
        return orb_fail(ORB_ECONFIG, "custom_json_path: the path is empty");
    char origin[ORIGIN_TEXT_MAX];
    format_file_origin(path, origin, sizeof origin);
    char *text = NULL;
    size_t len = 0;
    int rc = read_bounded(path, origin, &text, &len);
    if (rc != 0)
        return rc;
    rc = orb_topo_ranks_parse(text, len, ORB_MATRIX_ACCEPT_ANY, origin, inv, eligible, out);
    free(text);
    return rc;
}

int orb_topo_ranks_load(const char *priority_matrix, const char *custom_json_path,
                        const struct orb_topo_inventory *inv, uint64_t eligible,
                        struct orb_topo_ranks **out)
{
    if (!inv || !out)
        return orb_fail(ORB_EINVAL, "matrix load: NULL argument");
    if (priority_matrix) {
        /* strnlen: a longer string is refused without walking all of it. */
        size_t len = strnlen(priority_matrix, (size_t)ORB_TOPO_MATRIX_MAX_BYTES + 1);
        return orb_topo_ranks_parse(priority_matrix, len, ORB_MATRIX_ACCEPT_CLASSIC,
                                    "priority_matrix", inv, eligible, out);
    }
    if (custom_json_path)
        return orb_topo_ranks_read_file(custom_json_path, inv, eligible, out);
    *out = NULL;
    return 0;
}

const struct orb_topo_rank_row *orb_topo_ranks_row(const struct orb_topo_ranks *ranks,
                                                   struct orb_location loc)
{
    if (!ranks)
        return NULL;
    switch (loc.kind) {
    case ORB_LOC_CPU:
        if (loc.index > ORB_LOCATION_CPU_MAX)
            return NULL;
        if (ranks->cpu_present & (UINT64_C(1) << loc.index))
            return &ranks->cpu[loc.index];
        break;
    case ORB_LOC_CUDA:
        if (loc.index > ORB_LOCATION_CUDA_MAX)
            return NULL;
        if (ranks->cuda_present & (UINT64_C(1) << loc.index))
            return &ranks->cuda[loc.index];
        break;
    case ORB_LOC_ANY:
        if (loc.index != 0)
            return NULL;
        break;
    default:
        return NULL;
    }
    return ranks->has_wildcard ? &ranks->wildcard : NULL;
}

int orb_topo_ranks_lookup(const struct orb_topo_ranks *ranks, struct orb_location loc,
                          uint8_t rank[ORB_TOPO_MAX_NICS])
{
    if (!ranks || !rank)
        return orb_fail(ORB_EINVAL, "matrix lookup: NULL argument");
    const struct orb_topo_rank_row *row = orb_topo_ranks_row(ranks, loc);
    if (!row) {
        char shown[ORB_LOCATION_STR_MAX];
        if (orb_location_format(loc, shown, sizeof shown) != 0)
            return orb_fail(ORB_EINVAL, "matrix lookup: invalid location");
        return orb_fail(ORB_ENOENT, "the priority matrix has no row for %s and no \"*\" row",
                        shown);
    }
    memcpy(rank, row->rank, ORB_TOPO_MAX_NICS);
    return 0;
}

int orb_topo_ranks_form(const struct orb_topo_ranks *ranks)
{
    if (!ranks)
        return orb_fail(ORB_EINVAL, "matrix form: NULL argument");
    return ranks->form;
}

void orb_topo_ranks_free(struct orb_topo_ranks *ranks)
{
    free(ranks);
}
