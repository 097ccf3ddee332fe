/* Internal: TENT NIC priority matrices, compiled against the discovered inventory.
 *
 * Two JSON forms are accepted:
 *
 *   classic  {"cpu:0": [["mlx5_0"], ["mlx5_1"]], "cuda:0": [["mlx5_1"], []], ...}
 *            Every key is a location (topo/location.h); every value is exactly two lists of NIC
 *            names: rank 0 (preferred) and rank 1 (available).
 *
 *   native   {"nics": [{"name": "mlx5_1", "type": 0}, ...],
 *             "mems": [{"name": "cuda:0", "type": 1,
 *                       "device_list": {"rank0": [0], "rank1": [1], "rank2": []}}, ...]}
 *            device_list holds indices into this file's "nics" order; rank0..rank2 are each
 *            optional (absent = empty). Known keys only: nics entries take "name" (required),
 *            "type", "pci_bus_id", "numa_node", "device_attrs"; mems entries take "name" and
 *            "device_list" (required), "type", "pci_bus_id", "numa_node". pci_bus_id,
 *            numa_node and device_attrs are type-checked and otherwise ignored: discovered
 *            PCI/NUMA metadata is never replaced by the file.
 *
 * A document is native when its top-level object has a "nics" or "mems" key (neither can be a
 * location), classic otherwise.
 *
 * Validation (every failure is ORB_ECONFIG, with a message naming the input -- "priority_matrix"
 * or the file -- the JSON key and the reason; nothing ever falls back to discovery):
 *  - names must be NICs of the inventory that are usable and set in the caller's eligible mask
 *    (the whitelist/blacklist outcome); a native NIC "type", when given, must be 0 (RDMA);
 *  - a memory "type", when given, must match the location: 0 host (cpu:N), 1 CUDA (cuda:N),
 *    4 for "*";
 *  - cpu:N must be a discovered NUMA node (a host without NUMA data has only cpu:0); cuda:N
 *    must be a discovered CUDA ordinal;
 *  - a NIC appears at most once per location, across all its ranks; a location appears once;
 *  - wrong JSON types, unknown keys in native objects, numbers out of range, duplicate JSON keys,
 *    an empty document, a document that lists no location, and inputs over 1 MiB are refused.
 *
 * Rows: a location whose ranks are all empty is disabled (no NIC may serve it; it does not fall
 * through to "*"). An explicit "*" row governs every location without a row of its own. When a
 * classic matrix has no "*" row, one is synthesised from all named NICs, matching TENT: for each
 * rank r, the distinct NICs of the rank-r lists of all rows (disabled rows contribute nothing),
 * in order of first appearance, walking the rows in document order and each list left to right.
 * A NIC may therefore sit in both rank lists of the synthesised row (TENT's vector
 * {"cpu:0":[[a],[b]], "cpu:1":[[b],[a]], "cuda:0":[[a],[b]]} gives "*" rank0 [a,b], rank1
 * [b,a]); its effective rank, as rank[] reports it, is the lowest one. (TENT's JSON library
 * walks keys in sorted order rather than document order; that changes only the order inside the
 * synthesised lists, never a NIC's effective rank.) The native form never synthesises "*": a
 * location it does not cover has no row (orb_topo_ranks_row returns NULL), and the caller uses
 * discovered tiers for it.
 *
 * Sources: an inline priority_matrix (classic form only) wins over custom_json_path (either
 * form); when the inline matrix is set the path is not read at all. The file is opened once and
 * sized with fstat: it must be a regular file of 1 byte to 1 MiB. Symbolic links are followed
 * (configuration mounts commonly use them); the target must still be a regular file.
 *
 * The compiled struct orb_topo_ranks is immutable: there are no setters, so ranks are frozen
 * once initialisation has compiled them, and any number of threads may look rows up
 * concurrently without locks. */
#ifndef ORB_TOPO_MATRIX_H
#define ORB_TOPO_MATRIX_H

#include <stddef.h>
#include <stdint.h>

#include "topo/inventory.h"
#include "topo/location.h"

#define ORB_TOPO_RANKS 3                      /* rank0, rank1 (classic), rank2 (native only) */
#define ORB_TOPO_RANK_NONE 255                /* rank[] value of a NIC the row does not list */
#define ORB_TOPO_MATRIX_MAX_BYTES (1u << 20)  /* inline strings and files alike */

enum orb_matrix_form { ORB_MATRIX_CLASSIC = 1, ORB_MATRIX_NATIVE = 2 };

/* Which forms a parse accepts (a bit set of 1 << form). */
#define ORB_MATRIX_ACCEPT_CLASSIC (1u << ORB_MATRIX_CLASSIC)
#define ORB_MATRIX_ACCEPT_ANY ((1u << ORB_MATRIX_CLASSIC) | (1u << ORB_MATRIX_NATIVE))

enum orb_rank_row_origin {
    ORB_ROW_LISTED = 1,      /* the location's own row */
    ORB_ROW_WILDCARD = 2,    /* an explicit "*" row */
    ORB_ROW_SYNTHESIZED = 3  /* "*" built from a classic matrix without one */
};

/* The NIC ranks of one location. NIC ids are the inventory's stable ids (struct orb_topo_nic.id). */
struct orb_topo_rank_row {
    uint8_t rank[ORB_TOPO_MAX_NICS];  /* rank of NIC id i, or ORB_TOPO_RANK_NONE */
    uint64_t listed;                  /* bit i set when NIC id i has a rank; 0: disabled */
    uint8_t origin;                   /* enum orb_rank_row_origin */
    uint8_t count[ORB_TOPO_RANKS];    /* entries of nics[r] */
    uint8_t nics[ORB_TOPO_RANKS][ORB_TOPO_MAX_NICS]; /* NIC ids of each rank, as listed */
};

struct orb_topo_ranks;

/* Compile the matrix document `json` (`len` bytes, need not be NUL-terminated) against `inv`.
 * `accept` is ORB_MATRIX_ACCEPT_CLASSIC or ORB_MATRIX_ACCEPT_ANY. `origin` names the input in
 * messages (e.g. "priority_matrix"). `eligible` has bit i set for each NIC id i that survived
 * the filters. On success `*out` is a new compiled matrix the caller owns (orb_topo_ranks_free).
 * Errors: ORB_EINVAL (NULL argument, unknown accept bits), ORB_ECONFIG (any invalid content,
 * see above), ORB_ENOMEM. */
int orb_topo_ranks_parse(const char *json, size_t len, unsigned accept, const char *origin,
                         const struct orb_topo_inventory *inv, uint64_t eligible,
                         struct orb_topo_ranks **out);

/* Read and compile the file at `path` (either form); messages name the file.
 * Errors: ORB_EINVAL (NULL argument), ORB_ECONFIG (empty path, cannot open, not a regular file,
 * empty, over 1 MiB, changed size while read, or invalid content), ORB_ENOMEM. */
int orb_topo_ranks_read_file(const char *path, const struct orb_topo_inventory *inv,
                             uint64_t eligible, struct orb_topo_ranks **out);

/* The configuration entry point. `priority_matrix` (NUL-terminated, classic form) wins when
 * non-NULL, even when invalid; otherwise `custom_json_path` is read when non-NULL. NULL means
 * "not configured"; an empty string is configured and invalid. With neither configured,
 * returns 0 and sets `*out` to NULL: discovery decides. Errors: as orb_topo_ranks_parse and
 * orb_topo_ranks_read_file. */
int orb_topo_ranks_load(const char *priority_matrix, const char *custom_json_path,
                        const struct orb_topo_inventory *inv, uint64_t eligible,
                        struct orb_topo_ranks **out);

/* The row that governs `loc`: its own row, else the "*" row (explicit or synthesised), else NULL
 * (a native matrix without "*", or a location outside the grammar). The row lives as long as
 * `ranks`. Looking up "*" itself returns the "*" row. */
const struct orb_topo_rank_row *orb_topo_ranks_row(const struct orb_topo_ranks *ranks,
                                                   struct orb_location loc);

/* Copy the governing row's rank[] for `loc` into `rank`. Errors: ORB_EINVAL (NULL argument),
 * ORB_ENOENT (no row governs `loc`: use discovered tiers). */
int orb_topo_ranks_lookup(const struct orb_topo_ranks *ranks, struct orb_location loc,
                          uint8_t rank[ORB_TOPO_MAX_NICS]);

/* The form the matrix was written in (enum orb_matrix_form). */
int orb_topo_ranks_form(const struct orb_topo_ranks *ranks);

/* Release a compiled matrix. NULL is accepted. */
void orb_topo_ranks_free(struct orb_topo_ranks *ranks);

#endif
