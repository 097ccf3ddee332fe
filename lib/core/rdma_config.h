/* Internal: the RDMA transport's settings behind the public orb_rdma_config handle.
 *
 * Every key is one row of a table (rdma_config.c): its name, type, range and default. Text
 * (orb_rdma_config_set) and JSON (orb_rdma_config_load_json) go through the same row, so both
 * ways in accept exactly the same values. The engine keeps its own copy (orb_rdma_config_dup):
 * the caller's handle may be changed or freed once the engine exists. */
#ifndef ORB_CORE_RDMA_CONFIG_H
#define ORB_CORE_RDMA_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <orbite/orbite.h>

#define ORB_RDMA_NAME_MAX 64        /* device names: [A-Za-z0-9_.-]{1,63} + NUL */
#define ORB_RDMA_NAMES_MAX 64       /* entries of a whitelist or blacklist */
#define ORB_RDMA_MATRIX_MAX (1u << 20)
#define ORB_RDMA_PATH_MAX 4096

enum orb_rdma_host_memory { ORB_RDMA_HOST_DIRECT = 0, ORB_RDMA_HOST_STAGED = 1 };
enum orb_rdma_progress { ORB_RDMA_PROGRESS_POLLING = 0, ORB_RDMA_PROGRESS_EVENT_DRIVEN = 1 };
/* Device memory: through the transport's staging, or registered with the NICs (GPUDirect). */
enum orb_rdma_cuda_memory { ORB_RDMA_CUDA_STAGED = 0, ORB_RDMA_CUDA_DIRECT = 1 };
/* How Direct registers device memory: the route rules of lib/rdma/gdr.h. */
enum orb_rdma_gdr_registration { ORB_RDMA_GDR_AUTO = 0, ORB_RDMA_GDR_DMABUF = 1, ORB_RDMA_GDR_PEERMEM = 2 };

struct orb_rdma_names {
    uint32_t count;
    char name[ORB_RDMA_NAMES_MAX][ORB_RDMA_NAME_MAX];
};

struct orb_rdma_config {
    /* discovery and pins */
    char device[ORB_RDMA_NAME_MAX];      /* "" = discovery chooses */
    uint32_t port;                       /* 0 = not pinned */
    int32_t gid_index;                   /* -1 = not pinned */
    struct orb_rdma_names whitelist, blacklist;
    uint64_t device_mask;
    int32_t preferred_numa_node;         /* -1 = none */
    bool strict_local_numa;
    char *priority_matrix;               /* NULL = none; owned */
    char *custom_json_path;              /* NULL = none; owned */
    /* scheduling */
    bool smart_selection;
    bool deadline_bw_arbitration;
    bool log_slice_affinity;
    uint64_t priority_promotion_timeout_ns;
    bool priority_promotion_per_entry;
    char *shared_quota_shm_path;         /* NULL = local scheduling; owned */
    uint64_t slot_rotation_interval_ns;
    /* memory, progress, queue pairs */
    uint32_t host_memory;                /* enum orb_rdma_host_memory */
    uint32_t cuda_memory;                /* enum orb_rdma_cuda_memory */
    bool disable_gpu_direct_rdma;        /* no device MR ever: cuda_memory direct is then a configuration error */
    bool gpu_source_reuse;               /* GPU sources under direct grant on connected QPs by DevX keys */
    uint32_t gpu_direct_registration;    /* enum orb_rdma_gdr_registration */
    uint32_t progress_mode;              /* enum orb_rdma_progress */
    uint32_t num_lanes;
    uint32_t signal_interval;
    uint32_t max_rd_atomic;
    uint32_t max_dest_rd_atomic;
    uint32_t ack_timeout;                /* IB local ACK timeout exponent: 4.096 us * 2^N; 0: none */
    uint32_t retry_count;                /* transport retries before an error completion (0..7) */
    uint32_t read_replays;               /* times a READ whose rail's path failed is asked again */
    /* budgets */
    uint32_t max_endpoints;
    uint32_t max_grants;
    uint32_t max_send_wr;
    uint32_t max_cqes;
    uint64_t max_direct_bytes;
    uint64_t max_staging_bytes;
    uint32_t max_cached_mrs;
    uint64_t max_cached_mr_bytes;
    uint32_t max_window_key_indices;
    /* rail health */
    uint32_t rail_error_threshold;
    uint64_t rail_error_window_ns;
    uint64_t rail_cooldown_ns;
    uint64_t rail_probe_interval_ns;
    uint32_t max_rail_pairs;
};

/* A deep copy of `src` (strings included). Errors: ORB_EINVAL, ORB_ENOMEM. */
int orb_rdma_config_dup(const struct orb_rdma_config *src, struct orb_rdma_config **out);

/* Checks across keys (a port or GID pin needs ... ), run when an engine takes the settings.
 * Errors: ORB_ECONFIG naming the keys. */
int orb_rdma_config_check(const struct orb_rdma_config *cfg);

#endif
