/* orbite-info: what an engine on this host would see and do.
 *
 *   orbite-info [--sysfs DIR] [--no-helper] [--rdma JSON] [--location LOC] [--json]
 *
 * The host's NICs (ports, states, GIDs, link and effective rates, NUMA, PCI), its GPUs with the
 * tier of each NIC for their memory, the NIC priority matrix the RDMA settings put in force,
 * what the administrator's policy grants the calling user (asked of orbite-helper, when it is
 * installed), GPUDirect RDMA's prerequisites (peer-memory module, dma-buf in libibverbs and in
 * each CUDA device), and for --location the NIC ranking the selector starts from. It opens no
 * NIC and moves no byte. Exit status: 0, 1 when the host could not be read, 2 on a usage error. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <orbite/orbite.h>

#include "core/error.h"
#include "core/rdma_config.h"
#include "cuda/cuda.h"
#include "helper/helper_client.h"
#include "rdma/gdr.h"
#include "rdma/verbs.h"
#include "topo/estimator.h"
#include "topo/location.h"
#include "topo/matrix.h"
#include "topo/sysfs.h"
#include "topo/tiers.h"
#include "topo/topo_config.h"

#define EXIT_HOST 1
#define EXIT_USAGE 2
#define HELPER_TIMEOUT_NS (5ull * 1000000000ull)

static const char usage_text[] =
    "usage: orbite-info [--sysfs DIR] [--no-helper] [--rdma JSON] [--location LOC] [--json]\n"
    "\n"
    "What an OrbiTE engine on this host would see: NICs, ports, GIDs and rates, GPUs and the\n"
    "tier of each NIC for their memory, the NIC priority matrix in force, what the policy\n"
    "grants you (through orbite-helper, when installed), GPUDirect RDMA prerequisites, and the\n"
    "NIC ranking for a memory location.\n"
    "\n"
    "  --sysfs DIR      read the host from this sysfs tree (default /sys); implies --no-helper\n"
    "  --no-helper      do not ask orbite-helper (inventory from sysfs, no policy)\n"
    "  --rdma JSON      RDMA settings as an engine would get them (filters, priority_matrix,\n"
    "                   custom_json_path), e.g. '{\"rdma_whitelist\":[\"mlx5_0\"]}'\n"
    "  --location LOC   the NIC ranking for memory at LOC: cuda:N, cpu:N or *\n"
    "  --json           one JSON object instead of text\n"
    "  -h, --help       this text\n"
    "\n"
    "Exit status: 0, 1 when the host could not be read, 2 on a usage error.\n";

struct options {
    const char *sysfs;
    bool no_helper;
    const char *rdma_json;
    const char *location;
    bool json;
};

/* Everything gathered, then printed in one of the two forms. */
struct host {
    struct orb_topo_inventory inv;
    const char *inventory_from;           /* "orbite-helper" or the sysfs path */
    bool have_policy;
    struct orb_hp_policy policy;
    char helper_why[256];                 /* why there is no policy ("" with one) */
    struct orb_topo_config filter;
    uint64_t eligible;
    struct orb_topo_ranks *ranks;         /* NULL: discovery decides */
    const char *ranks_from;               /* "priority_matrix", "custom_json_path" or NULL */
    struct orb_estimator_config est;
    uint32_t peermem;                     /* orb_gdr_probe_peermem() bits */
    int verbs_state;                      /* 0 absent, 1 loaded without dma-buf, 2 with */
    char verbs_why[256];
    int cuda_devices;                     /* -1: no driver */
    char cuda_why[256];
    int cuda_dmabuf[ORB_TOPO_MAX_GPUS];   /* -1 unknown, 0 no, 1 yes, by ordinal */
};

static int usage_error(const char *what)
{
    fprintf(stderr, "orbite-info: %s\n%s", what, usage_text);
    return EXIT_USAGE;
}

/* `arg` (as given) and what is wrong with it. */
static int usage_error_about(const char *what, const char *arg)
{
    fprintf(stderr, "orbite-info: '%s' %s\n%s", arg, what, usage_text);
    return EXIT_USAGE;
}

static int parse_options(int argc, char **argv, struct options *o)
{
    static const struct option longs[] = {
        {"sysfs", required_argument, NULL, 's'},   {"no-helper", no_argument, NULL, 'n'},
        {"rdma", required_argument, NULL, 'r'},    {"location", required_argument, NULL, 'l'},
        {"json", no_argument, NULL, 'j'},          {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    *o = (struct options){.sysfs = NULL};
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", longs, NULL)) != -1) {
        switch (c) {
        case 's': o->sysfs = optarg; o->no_helper = true; break;
        case 'n': o->no_helper = true; break;
        case 'r': o->rdma_json = optarg; break;
        case 'l': o->location = optarg; break;
        case 'j': o->json = true; break;
        case 'h': fputs(usage_text, stdout); exit(0);
        case ':': return usage_error_about("is missing its value", argv[optind - 1]);
        default: return usage_error_about("is not an option", argv[optind - 1]);
        }
    }
    if (optind != argc)
        return usage_error_about("is an unexpected argument", argv[optind]);
    return 0;
}

/* ---- gathering --------------------------------------------------------------------------------- */

static int read_inventory(const struct options *o, struct host *h)
{
    if (!o->no_helper) {
        struct orb_helper *helper = NULL;
        int rc = orb_helper_open(ORB_HELPER_AUTO, HELPER_TIMEOUT_NS, &helper);
        if (rc == 0 && (rc = orb_helper_inventory(helper, &h->inv)) == 0 &&
            (rc = orb_helper_policy(helper, &h->policy)) == 0) {
            orb_helper_close(helper);
            h->inventory_from = "orbite-helper";
            h->have_policy = true;
            return 0;
        }
        snprintf(h->helper_why, sizeof h->helper_why, "%s", orb_last_error());
        orb_helper_close(helper);
    } else {
        snprintf(h->helper_why, sizeof h->helper_why, "not asked (--no-helper or --sysfs)");
    }
    const char *root = o->sysfs != NULL ? o->sysfs : "/sys";
    int fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "orbite-info: cannot open %s: %s\n", root, strerror(errno));
        return EXIT_HOST;
    }
    /* A folder without class/ and devices/ is no sysfs tree: its "no NIC" would say nothing. */
    struct stat st;
    if (fstatat(fd, "class", &st, 0) != 0 || !S_ISDIR(st.st_mode) || fstatat(fd, "devices", &st, 0) != 0 ||
        !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "orbite-info: %s is not a sysfs tree (no class/ and devices/ in it)\n", root);
        close(fd);
        return EXIT_HOST;
    }
    int rc = orb_topo_load_sysfs(fd, &h->inv);
    close(fd);
    if (rc != 0) {
        fprintf(stderr, "orbite-info: reading %s: %s\n", root, orb_last_error());
        return EXIT_HOST;
    }
    h->inventory_from = root;
    return 0;
}

/* The peer-memory module's evidence, from the same sysfs tree. */
static void read_peermem(const struct options *o, struct host *h)
{
    int fd = open(o->sysfs != NULL ? o->sysfs : "/sys", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        h->peermem = orb_gdr_probe_peermem(fd);
        close(fd);
    }
}

static int read_settings(const struct options *o, struct host *h)
{
    orb_rdma_config *rdma = NULL;
    int rc = orb_rdma_config_new(&rdma);
    if (rc == 0 && o->rdma_json != NULL)
        rc = orb_rdma_config_load_json(rdma, o->rdma_json);
    if (rc == 0)
        rc = orb_topo_config_from_rdma(rdma, &h->filter);
    if (rc == 0)
        rc = orb_topo_filter(&h->inv, &h->filter, &h->eligible);
    if (rc == 0 && h->have_policy)
        h->eligible &= h->policy.nic_mask; /* the engine opens only what the policy grants */
    if (rc == 0)
        rc = orb_topo_ranks_load(rdma->priority_matrix, rdma->custom_json_path, &h->inv, h->eligible, &h->ranks);
    if (rc == 0 && h->ranks != NULL)
        h->ranks_from = rdma->priority_matrix != NULL ? "priority_matrix" : "custom_json_path";
    if (rc != 0)
        fprintf(stderr, "orbite-info: the RDMA settings: %s\n", orb_last_error());
    orb_rdma_config_free(rdma);
    return rc != 0 ? EXIT_USAGE : 0;
}

/* What GPUDirect RDMA would find: libibverbs with ibv_reg_dmabuf_mr, and each CUDA device's
 * dma-buf support (the driver loaded only to ask). */
static void read_gpudirect(const struct options *o, struct host *h)
{
    for (unsigned i = 0; i < ORB_TOPO_MAX_GPUS; i++)
        h->cuda_dmabuf[i] = -1;
    const struct orb_verbs *v = NULL;
    if (orb_verbs_get(&v) == 0) {
        h->verbs_state = v->reg_dmabuf_mr != NULL ? 2 : 1;
    } else {
        h->verbs_state = 0;
        snprintf(h->verbs_why, sizeof h->verbs_why, "%s", orb_last_error());
    }
    h->cuda_devices = -1;
    if (o->sysfs != NULL) { /* a fixture: this host's driver says nothing about it */
        snprintf(h->cuda_why, sizeof h->cuda_why, "not asked for a sysfs tree other than this host's");
        return;
    }
    const struct orb_cuda *c = NULL;
    int n = 0;
    if (orb_cuda_get(&c) != 0 || c->device_get_count(&n) != 0) {
        snprintf(h->cuda_why, sizeof h->cuda_why, "%s", c == NULL ? orb_last_error() : "the driver found no device");
        return;
    }
    h->cuda_devices = n;
    for (int d = 0; d < n && d < ORB_TOPO_MAX_GPUS; d++) {
        orb_cu_device dev;
        int value = 0;
        if (c->device_get(&dev, d) == 0 && c->device_get_attribute(&value, ORB_CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
                                                                    dev) == 0)
            h->cuda_dmabuf[d] = value != 0;
    }
}

/* ---- names ------------------------------------------------------------------------------------- */

static const char *state_name(uint8_t s)
{
    static const char *const names[] = {"NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"};
    return s < sizeof names / sizeof names[0] ? names[s] : "?";
}

static const char *link_name(uint8_t l)
{
    return l == ORB_LINK_INFINIBAND ? "InfiniBand" : l == ORB_LINK_ETHERNET ? "Ethernet" : "unknown";
}

static const char *gid_type_name(uint8_t t)
{
    return t == ORB_GID_ROCE_V2 ? "RoCEv2" : t == ORB_GID_ROCE_V1 ? "RoCEv1" : "IB";
}

static void gid_text(const struct orb_topo_gid *g, char *buf, size_t len)
{
    size_t o = 0;
    for (int i = 0; i < 16 && o + 6 < len; i += 2)
        o += (size_t)snprintf(buf + o, len - o, "%s%02x%02x", i ? ":" : "", g->raw[i], g->raw[i + 1]);
}

/* The best rate of a NIC's ports, in Mb/s (0 unknown). */
static uint64_t nic_rate(const struct orb_topo_nic *n)
{
    uint64_t best = 0;
    for (unsigned p = 0; p < n->nports && p < ORB_TOPO_MAX_PORTS; p++)
        if (n->ports[p].rate_mbps > best)
            best = n->ports[p].rate_mbps;
    return best;
}

/* Whether one of the NIC's ports is active: the selector places slices only on such NICs. */
static bool nic_up(const struct orb_topo_nic *n)
{
    for (unsigned p = 0; p < n->nports && p < ORB_TOPO_MAX_PORTS; p++)
        if (n->ports[p].state == ORB_PORT_ACTIVE || n->ports[p].state == ORB_PORT_ACTIVE_DEFER)
            return true;
    return false;
}

/* NIC ids in the order the selector starts from for `loc`: by tier, then by effective rate,
 * then by id; excluded NICs and NICs without an active port left out. Returns the count. */
static unsigned ranking(const struct host *h, struct orb_location loc, uint8_t order[ORB_TOPO_MAX_NICS],
                        uint8_t tier[ORB_TOPO_MAX_NICS], int *rc_out)
{
    *rc_out = orb_topo_tiers_ranked(&h->inv, &h->filter, h->eligible, h->ranks, loc, tier);
    if (*rc_out != 0)
        return 0;
    unsigned n = 0;
    for (uint32_t i = 0; i < h->inv.nnics; i++)
        if (tier[h->inv.nics[i].id] != ORB_TOPO_TIER_NONE && h->inv.nics[i].usable && nic_up(&h->inv.nics[i]))
            order[n++] = h->inv.nics[i].id;
    for (unsigned i = 1; i < n; i++) /* insertion sort: at most 64 */
        for (unsigned j = i; j > 0; j--) {
            uint8_t a = order[j - 1], b = order[j];
            double ra = orb_estimator_effective_gbps(&h->est, nic_rate(&h->inv.nics[a]));
            double rb = orb_estimator_effective_gbps(&h->est, nic_rate(&h->inv.nics[b]));
            bool swap = tier[b] < tier[a] || (tier[b] == tier[a] && (rb > ra || (rb == ra && b < a)));
            if (!swap)
                break;
            order[j - 1] = b;
            order[j] = a;
        }
    return n;
}

static const struct orb_topo_nic *nic_by_id(const struct host *h, uint8_t id)
{
    for (uint32_t i = 0; i < h->inv.nnics; i++)
        if (h->inv.nics[i].id == id)
            return &h->inv.nics[i];
    return NULL;
}

/* ---- text ---------------------------------------------------------------------------------------- */

static void print_text(const struct options *o, const struct host *h, struct orb_location loc)
{
    printf("Inventory: from %s\n\nNICs (%u):\n", h->inventory_from, h->inv.nnics);
    for (uint32_t i = 0; i < h->inv.nnics; i++) {
        const struct orb_topo_nic *n = &h->inv.nics[i];
        printf("  %-12s id %u  guid %016" PRIx64 "  pci %s  numa %d%s%s\n", n->name, n->id, n->node_guid,
               n->pci[0] ? n->pci : "?", n->numa_node, n->usable ? "" : "  (unusable: discovery failed)",
               (h->eligible >> n->id) & 1 ? "" : "  (excluded by the settings or the policy)");
        for (unsigned p = 0; p < n->nports && p < ORB_TOPO_MAX_PORTS; p++) {
            const struct orb_topo_port *pt = &n->ports[p];
            printf("    port %u: %s, %s, link %" PRIu32 " Mb/s, effective %.0f Gb/s, %u GIDs\n", pt->num,
                   state_name(pt->state), link_name(pt->link_layer), pt->rate_mbps,
                   orb_estimator_effective_gbps(&h->est, pt->rate_mbps), pt->ngids);
            for (unsigned g = 0; g < pt->ngids && g < ORB_TOPO_MAX_GIDS; g++) {
                char text[48];
                gid_text(&pt->gids[g], text, sizeof text);
                printf("      gid %u %s %s\n", pt->gids[g].index, gid_type_name(pt->gids[g].type), text);
            }
        }
    }
    printf("\nGPUs (%u):\n", h->inv.ngpus);
    for (uint32_t i = 0; i < h->inv.ngpus; i++) {
        const struct orb_topo_gpu *g = &h->inv.gpus[i];
        uint8_t tier[ORB_TOPO_MAX_NICS];
        printf("  cuda:%u  pci %s  numa %d", g->ordinal, g->pci[0] ? g->pci : "?", g->numa_node);
        if (orb_topo_tiers_gpu(&h->inv, &h->filter, h->eligible, g->ordinal, tier) == 0) {
            printf("  NIC tiers:");
            for (uint32_t k = 0; k < h->inv.nnics; k++) {
                uint8_t t = tier[h->inv.nics[k].id];
                if (t != ORB_TOPO_TIER_NONE)
                    printf(" %s=%u", h->inv.nics[k].name, t);
            }
        }
        printf("\n");
    }
    printf("\nNIC priority matrix: %s\n", h->ranks_from != NULL ? h->ranks_from : "none (discovery decides)");
    printf("\nPolicy: ");
    if (!h->have_policy) {
        printf("none read (%s)\n", h->helper_why);
    } else {
        const struct orb_hp_policy *p = &h->policy;
        printf("granted by orbite-helper\n  transports:%s%s%s\n  NICs:", (p->transports & ORB_HP_T_TCP) ? " tcp" : "",
               (p->transports & ORB_HP_T_RDMA) ? " rdma" : "", (p->transports & ORB_HP_T_NVLINK) ? " nvlink" : "");
        for (uint32_t k = 0; k < h->inv.nnics; k++)
            if ((p->nic_mask >> h->inv.nics[k].id) & 1)
                printf(" %s", h->inv.nics[k].name);
        printf("\n  GPUs:");
        for (uint32_t k = 0; k < h->inv.ngpus; k++)
            if (h->inv.gpus[k].ordinal < 64 && ((p->gpu_mask >> h->inv.gpus[k].ordinal) & 1))
                printf(" cuda:%u", h->inv.gpus[k].ordinal);
        printf("\n  GPUDirect routes:%s%s\n", (p->gpudirect_routes & ORB_HP_R_DMABUF) ? " dmabuf" : "",
               (p->gpudirect_routes & ORB_HP_R_PEERMEM) ? " peermem" : "");
        printf("  max registered bytes: %" PRIu64 ", endpoints: %u, grants: %u, slots: %u\n", p->max_registered_bytes,
               p->max_endpoints, p->max_grants, p->nslots);
    }
    printf("\nGPUDirect RDMA:\n  peer-memory module: %s\n", h->peermem != 0 ? "present" : "absent");
    printf("  libibverbs: %s\n", h->verbs_state == 2   ? "loaded, with ibv_reg_dmabuf_mr"
                                 : h->verbs_state == 1 ? "loaded, without ibv_reg_dmabuf_mr"
                                                       : h->verbs_why);
    if (h->cuda_devices < 0) {
        printf("  CUDA driver: %s\n", h->cuda_why);
    } else {
        printf("  CUDA driver: %d devices;", h->cuda_devices);
        for (int d = 0; d < h->cuda_devices && d < ORB_TOPO_MAX_GPUS; d++)
            printf(" cuda:%d dma-buf %s", d, h->cuda_dmabuf[d] == 1 ? "yes" : h->cuda_dmabuf[d] == 0 ? "no" : "?");
        printf("\n");
    }
    if (o->location != NULL) {
        uint8_t order[ORB_TOPO_MAX_NICS], tier[ORB_TOPO_MAX_NICS];
        int rc = 0;
        unsigned n = ranking(h, loc, order, tier, &rc);
        printf("\nNIC ranking for %s:", o->location);
        if (rc != 0)
            printf(" %s\n", orb_last_error());
        else if (n == 0)
            printf(" no eligible NIC\n");
        else
            printf("\n");
        for (unsigned k = 0; k < n; k++) {
            const struct orb_topo_nic *nic = nic_by_id(h, order[k]);
            printf("  %u. %-12s tier %u  %.0f Gb/s\n", k + 1, nic->name, tier[order[k]],
                   orb_estimator_effective_gbps(&h->est, nic_rate(nic)));
        }
        for (uint32_t k = 0; rc == 0 && k < h->inv.nnics; k++)
            if (tier[h->inv.nics[k].id] != ORB_TOPO_TIER_NONE && !nic_up(&h->inv.nics[k]))
                printf("  (%s: no active port, not used now)\n", h->inv.nics[k].name);
    }
}

/* ---- JSON ---------------------------------------------------------------------------------------- */

static json_t *json_text(const struct options *o, const struct host *h, struct orb_location loc)
{
    json_t *nics = json_array();
    for (uint32_t i = 0; i < h->inv.nnics; i++) {
        const struct orb_topo_nic *n = &h->inv.nics[i];
        char guid[20];
        snprintf(guid, sizeof guid, "%016" PRIx64, n->node_guid);
        json_t *ports = json_array();
        for (unsigned p = 0; p < n->nports && p < ORB_TOPO_MAX_PORTS; p++) {
            const struct orb_topo_port *pt = &n->ports[p];
            json_t *gids = json_array();
            for (unsigned g = 0; g < pt->ngids && g < ORB_TOPO_MAX_GIDS; g++) {
                char text[48];
                gid_text(&pt->gids[g], text, sizeof text);
                json_array_append_new(gids, json_pack("{s:i,s:s,s:s,s:b}", "index", pt->gids[g].index, "type",
                                                      gid_type_name(pt->gids[g].type), "gid", text, "ipv4",
                                                      pt->gids[g].is_ipv4));
            }
            json_array_append_new(ports, json_pack("{s:i,s:s,s:s,s:I,s:f,s:o}", "port", pt->num, "state",
                                                   state_name(pt->state), "link_layer", link_name(pt->link_layer),
                                                   "link_mbps", (json_int_t)pt->rate_mbps, "effective_gbps",
                                                   orb_estimator_effective_gbps(&h->est, pt->rate_mbps), "gids",
                                                   gids));
        }
        json_array_append_new(nics, json_pack("{s:s,s:i,s:s,s:s,s:i,s:b,s:b,s:o}", "name", n->name, "id", n->id,
                                              "guid", guid, "pci", n->pci, "numa", n->numa_node, "usable",
                                              n->usable, "eligible", (int)((h->eligible >> n->id) & 1), "ports",
                                              ports));
    }
    json_t *gpus = json_array();
    for (uint32_t i = 0; i < h->inv.ngpus; i++) {
        const struct orb_topo_gpu *g = &h->inv.gpus[i];
        uint8_t tier[ORB_TOPO_MAX_NICS];
        json_t *tiers = json_object();
        if (orb_topo_tiers_gpu(&h->inv, &h->filter, h->eligible, g->ordinal, tier) == 0)
            for (uint32_t k = 0; k < h->inv.nnics; k++)
                if (tier[h->inv.nics[k].id] != ORB_TOPO_TIER_NONE)
                    json_object_set_new(tiers, h->inv.nics[k].name, json_integer(tier[h->inv.nics[k].id]));
        json_t *dmabuf = g->ordinal < ORB_TOPO_MAX_GPUS && h->cuda_dmabuf[g->ordinal] >= 0
                             ? json_boolean(h->cuda_dmabuf[g->ordinal])
                             : json_null();
        json_array_append_new(gpus, json_pack("{s:i,s:s,s:i,s:o,s:o}", "ordinal", (int)g->ordinal, "pci", g->pci,
                                              "numa", g->numa_node, "nic_tiers", tiers, "dmabuf", dmabuf));
    }
    json_t *policy = json_null();
    if (h->have_policy) {
        const struct orb_hp_policy *p = &h->policy;
        json_t *pn = json_array(), *pg = json_array(), *pt = json_array(), *pr = json_array();
        for (uint32_t k = 0; k < h->inv.nnics; k++)
            if ((p->nic_mask >> h->inv.nics[k].id) & 1)
                json_array_append_new(pn, json_string(h->inv.nics[k].name));
        for (uint32_t k = 0; k < h->inv.ngpus; k++)
            if (h->inv.gpus[k].ordinal < 64 && ((p->gpu_mask >> h->inv.gpus[k].ordinal) & 1))
                json_array_append_new(pg, json_integer(h->inv.gpus[k].ordinal));
        if (p->transports & ORB_HP_T_TCP)
            json_array_append_new(pt, json_string("tcp"));
        if (p->transports & ORB_HP_T_RDMA)
            json_array_append_new(pt, json_string("rdma"));
        if (p->transports & ORB_HP_T_NVLINK)
            json_array_append_new(pt, json_string("nvlink"));
        if (p->gpudirect_routes & ORB_HP_R_DMABUF)
            json_array_append_new(pr, json_string("dmabuf"));
        if (p->gpudirect_routes & ORB_HP_R_PEERMEM)
            json_array_append_new(pr, json_string("peermem"));
        policy = json_pack("{s:o,s:o,s:o,s:o,s:I,s:i,s:i,s:i}", "nics", pn, "gpus", pg, "transports", pt,
                           "gpudirect_routes", pr, "max_registered_bytes", (json_int_t)p->max_registered_bytes,
                           "max_endpoints", (int)p->max_endpoints, "max_grants", (int)p->max_grants, "slots",
                           (int)p->nslots);
    }
    json_t *gpudirect = json_pack(
        "{s:b,s:o,s:o}", "peermem", h->peermem != 0, "verbs_dmabuf",
        h->verbs_state == 0 ? json_null() : json_boolean(h->verbs_state == 2), "cuda_devices",
        h->cuda_devices < 0 ? json_null() : json_integer(h->cuda_devices));
    json_t *doc = json_pack("{s:s,s:o,s:o,s:o,s:o,s:o}", "inventory_from", h->inventory_from, "nics", nics, "gpus",
                            gpus, "matrix", h->ranks_from != NULL ? json_string(h->ranks_from) : json_null(),
                            "policy", policy, "gpudirect", gpudirect);
    if (!h->have_policy)
        json_object_set_new(doc, "policy_why", json_string(h->helper_why));
    if (o->location != NULL) {
        uint8_t order[ORB_TOPO_MAX_NICS], tier[ORB_TOPO_MAX_NICS];
        int rc = 0;
        unsigned n = ranking(h, loc, order, tier, &rc);
        json_t *rank = json_array();
        for (unsigned k = 0; k < n; k++) {
            const struct orb_topo_nic *nic = nic_by_id(h, order[k]);
            json_array_append_new(rank, json_pack("{s:s,s:i,s:f}", "nic", nic->name, "tier", tier[order[k]],
                                                  "effective_gbps",
                                                  orb_estimator_effective_gbps(&h->est, nic_rate(nic))));
        }
        json_object_set_new(doc, "location", json_string(o->location));
        json_object_set_new(doc, "ranking", rc == 0 ? rank : (json_decref(rank), json_null()));
    }
    return doc;
}

int main(int argc, char **argv)
{
    struct options o;
    int rc = parse_options(argc, argv, &o);
    if (rc != 0)
        return rc;
    /* A tool's output is its report: the library's warnings (a CUDA driver missing, say) only
     * where ORBITE_LOG asks for them. */
    if (getenv("ORBITE_LOG") == NULL)
        orb_log_set_level(ORB_LOG_ERROR);
    struct orb_location loc = {.kind = ORB_LOC_ANY};
    if (o.location != NULL && orb_location_parse(o.location, &loc) != 0)
        return usage_error("--location takes cuda:N, cpu:N or *");
    static struct host h; /* large: off the stack */
    orb_estimator_config_default(&h.est);
    if ((rc = read_inventory(&o, &h)) != 0 || (rc = read_settings(&o, &h)) != 0)
        return rc;
    read_peermem(&o, &h);
    read_gpudirect(&o, &h);
    if (o.json) {
        json_t *doc = json_text(&o, &h, loc);
        char *text = doc != NULL ? json_dumps(doc, JSON_INDENT(2)) : NULL;
        json_decref(doc);
        if (text == NULL) {
            fprintf(stderr, "orbite-info: out of memory\n");
            return EXIT_HOST;
        }
        printf("%s\n", text);
        free(text);
    } else {
        print_text(&o, &h, loc);
    }
    orb_topo_ranks_free(h.ranks);
    return 0;
}
