/* Native libraries loaded with dlopen: every required symbol or none.
 *
 * Each loader (verbs, CUDA's driver, libmicrohttpd, libcurl) describes its table of function
 * pointers with orb_dl_symbol entries and loads it once per process. */
#ifndef ORB_CORE_DYNLIB_H
#define ORB_CORE_DYNLIB_H

#include <stdbool.h>
#include <stddef.h>

struct orb_dl_symbol {
    const char *name; /* the export */
    size_t offset;    /* of its function pointer in the caller's table */
    bool required;    /* false: left NULL where the library lacks it */
};

/* Load `path` (RTLD_NOW: a library that cannot bind its own dependencies fails here, not in a
 * transfer; RTLD_LOCAL: nothing of it is visible to later loads) and write the address of each
 * of the `n` symbols into `table` (of `table_size` bytes) at its offset.
 * On success returns 0 and the handle in *handle_out: the caller keeps it (the loaders here keep
 * it for the process's lifetime, since what the library made outlives any one user).
 * On failure the handle is closed, `table` is zeroed, *handle_out untouched, and the return is
 * ORB_EUNAVAILABLE with the message "<what>: cannot load <path>: <why>" or
 * "<what>: <path> does not export <name><hint>" (`hint` may be NULL); ORB_EINVAL for a NULL
 * argument or an offset outside the table. */
int orb_dl_open(const char *what, const char *path, const struct orb_dl_symbol *symbols, size_t n, void *table,
                size_t table_size, const char *hint, void **handle_out);

/* Resolve an optional group of `n` (at most 16) symbols of `handle` into `table`: all of them,
 * or none. Returns true when all were found; otherwise writes nothing to `table`, sets *missing
 * (when not NULL) to the first name absent and returns false. */
bool orb_dl_group(void *handle, const struct orb_dl_symbol *symbols, size_t n, void *table, const char **missing);

#endif
