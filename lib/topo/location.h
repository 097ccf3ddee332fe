/* Internal: memory location strings, as TENT writes them: "cpu:N" (host memory on NUMA node N),
 * "cuda:N" (memory of the GPU with CUDA-visible ordinal N) and "*" (any location). The grammar
 * is strict so that one location has exactly one spelling (matrix keys compare as locations):
 * lower-case prefix, a decimal index without sign, spaces or leading zeros ("0" itself is
 * fine), bounded by the inventory's fixed maxima. Pure functions; thread-safe. */
#ifndef ORB_TOPO_LOCATION_H
#define ORB_TOPO_LOCATION_H

#include <stddef.h>
#include <stdint.h>

#include "topo/inventory.h"

enum orb_location_kind { ORB_LOC_ANY = 0, ORB_LOC_CPU = 1, ORB_LOC_CUDA = 2 };

/* TENT's memory type numbers, as the native matrix form writes them in a "type" field. */
enum orb_mem_type { ORB_MEM_TYPE_HOST = 0, ORB_MEM_TYPE_CUDA = 1, ORB_MEM_TYPE_ANY = 4 };

#define ORB_LOCATION_CPU_MAX (ORB_TOPO_MAX_NUMA - 1)  /* highest N accepted in "cpu:N" */
#define ORB_LOCATION_CUDA_MAX (ORB_TOPO_MAX_GPUS - 1) /* highest N accepted in "cuda:N" */
#define ORB_LOCATION_STR_MAX 8                        /* "cuda:63" plus NUL */

struct orb_location {
    uint8_t kind;  /* enum orb_location_kind */
    uint8_t index; /* NUMA node or CUDA ordinal; 0 for ORB_LOC_ANY */
};

/* Parse the NUL-terminated `text` into `*out`. Errors: ORB_EINVAL (NULL argument, or text
 * that is not a location; the message quotes the text and says why). */
int orb_location_parse(const char *text, struct orb_location *out);

/* Write the canonical spelling of `loc` into `buf` (NUL-terminated). Errors: ORB_EINVAL (NULL
 * buffer, `len` too small, or a kind or index outside the grammar). */
int orb_location_format(struct orb_location loc, char *buf, size_t len);

/* The TENT memory type of `loc` (enum orb_mem_type), or ORB_EINVAL for an invalid kind. */
int orb_location_mem_type(struct orb_location loc);

/* Copy untrusted `text` into `buf` for an error message: at most `len` - 1 bytes, printable
 * ASCII kept, anything else shown as '?', and "..." marking a cut. `buf` is always terminated
 * (when `len` > 0). Shared by the matrix compiler, whose inputs are up to 1 MiB long. */
void orb_topo_quote_text(const char *text, char *buf, size_t len);

#endif
