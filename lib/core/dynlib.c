/* Native libraries loaded with dlopen (see dynlib.h). */
#include "core/dynlib.h"

#include <dlfcn.h>
#include <string.h>

#include "core/error.h"

#define GROUP_MAX 16u

int orb_dl_open(const char *what, const char *path, const struct orb_dl_symbol *symbols, size_t n, void *table,
                size_t table_size, const char *hint, void **handle_out)
{
    if (what == NULL || path == NULL || (symbols == NULL && n > 0) || table == NULL || handle_out == NULL)
        return orb_fail(ORB_EINVAL, "dynlib: NULL argument");
    for (size_t i = 0; i < n; i++)
        if (symbols[i].name == NULL || symbols[i].offset > table_size ||
            table_size - symbols[i].offset < sizeof(void *))
            return orb_fail(ORB_EINVAL, "%s: symbol %zu lies outside its table", what, i);
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) {
        const char *why = dlerror();
        return orb_fail(ORB_EUNAVAILABLE, "%s: cannot load %s: %s", what, path, why != NULL ? why : "unknown error");
    }
    for (size_t i = 0; i < n; i++) {
        void *address = dlsym(handle, symbols[i].name);
        if (address == NULL && symbols[i].required) {
            /* Every required symbol or none: the handle is not used at all. */
            memset(table, 0, table_size);
            (void)dlclose(handle);
            return orb_fail(ORB_EUNAVAILABLE, "%s: %s does not export %s%s", what, path, symbols[i].name,
                            hint != NULL ? hint : "");
        }
        /* POSIX lets a function pointer hold what dlsym returns. */
        memcpy((char *)table + symbols[i].offset, &address, sizeof address);
    }
    *handle_out = handle;
    return 0;
}

bool orb_dl_group(void *handle, const struct orb_dl_symbol *symbols, size_t n, void *table, const char **missing)
{
    void *found[GROUP_MAX];
    if (handle == NULL || symbols == NULL || table == NULL || n > GROUP_MAX) {
        if (missing != NULL)
            *missing = "(a malformed group)";
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        if ((found[i] = dlsym(handle, symbols[i].name)) == NULL) {
            if (missing != NULL)
                *missing = symbols[i].name;
            return false;
        }
    }
    for (size_t i = 0; i < n; i++)
        memcpy((char *)table + symbols[i].offset, &found[i], sizeof found[i]);
    return true;
}
