/* NIC eligibility: configuration defaults, validation and the inventory filter. */
#include "topo/topo_config.h"

#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "core/rdma_config.h"
#include "topo/sysfs.h"

void orb_topo_config_defaults(struct orb_topo_config *cfg)
{
    if (cfg == NULL)
        return;
    memset(cfg, 0, sizeof *cfg);
    cfg->pin.gid_index = ORB_TOPO_PIN_NONE;
    cfg->device_mask = ORB_TOPO_DEVICE_MASK_ALL;
    cfg->preferred_numa_node = ORB_TOPO_NUMA_UNKNOWN;
}

static int list_add(char (*list)[ORB_TOPO_NAME_MAX], uint32_t *count, const char *which, const char *name)
{
    if (!orb_topo_name_valid(name))
        return orb_fail(ORB_ECONFIG, "rdma_%s: invalid device name (expected [A-Za-z0-9_.-]{1,63})", which);
    if (*count >= ORB_TOPO_FILTER_NAMES_MAX)
        return orb_fail(ORB_ECONFIG, "rdma_%s: more than %u names", which, ORB_TOPO_FILTER_NAMES_MAX);
    memcpy(list[*count], name, strlen(name) + 1);
    (*count)++;
    return 0;
}

int orb_topo_config_whitelist_add(struct orb_topo_config *cfg, const char *name)
{
    if (cfg == NULL || name == NULL)
        return orb_fail(ORB_EINVAL, "rdma_whitelist: NULL argument");
    return list_add(cfg->whitelist, &cfg->nwhitelist, "whitelist", name);
}

int orb_topo_config_blacklist_add(struct orb_topo_config *cfg, const char *name)
{
    if (cfg == NULL || name == NULL)
        return orb_fail(ORB_EINVAL, "rdma_blacklist: NULL argument");
    return list_add(cfg->blacklist, &cfg->nblacklist, "blacklist", name);
}

/* A name stored in a fixed field must be NUL-terminated inside it before it is used as a string. */
static bool field_name_valid(const char name[ORB_TOPO_NAME_MAX])
{
    return memchr(name, '\0', ORB_TOPO_NAME_MAX) != NULL && orb_topo_name_valid(name);
}

static int validate_list(const char (*list)[ORB_TOPO_NAME_MAX], uint32_t count, const char *which)
{
    if (count > ORB_TOPO_FILTER_NAMES_MAX)
        return orb_fail(ORB_ECONFIG, "rdma_%s: more than %u names", which, ORB_TOPO_FILTER_NAMES_MAX);
    for (uint32_t i = 0; i < count; i++)
        if (!field_name_valid(list[i]))
            return orb_fail(ORB_ECONFIG, "rdma_%s: entry %u is not a valid device name", which, i);
    return 0;
}

int orb_topo_config_validate(const struct orb_topo_config *cfg)
{
    if (cfg == NULL)
        return orb_fail(ORB_EINVAL, "topology configuration is NULL");
    int rc = validate_list(cfg->whitelist, cfg->nwhitelist, "whitelist");
    if (rc == 0)
        rc = validate_list(cfg->blacklist, cfg->nblacklist, "blacklist");
    if (rc != 0)
        return rc;
    if (memchr(cfg->pin.device, '\0', sizeof cfg->pin.device) == NULL ||
        (cfg->pin.device[0] != '\0' && !orb_topo_name_valid(cfg->pin.device)))
        return orb_fail(ORB_ECONFIG, "device: pinned device name is not a valid device name");
    if (cfg->pin.gid_index < ORB_TOPO_PIN_NONE || cfg->pin.gid_index > ORB_TOPO_GID_INDEX_MAX)
        return orb_fail(ORB_ECONFIG, "gid_index: %d is out of range (0..%d)", (int)cfg->pin.gid_index,
                        ORB_TOPO_GID_INDEX_MAX);
    if (cfg->device_mask == 0)
        return orb_fail(ORB_ECONFIG, "device_mask: 0 excludes every NIC");
    if (cfg->preferred_numa_node < ORB_TOPO_NUMA_UNKNOWN)
        return orb_fail(ORB_ECONFIG, "preferred_numa_node: %d is not a node (-1 for none)",
                        (int)cfg->preferred_numa_node);
    return 0;
}

int orb_topo_find_nic(const struct orb_topo_inventory *inv, const char *name)
{
    if (inv == NULL || name == NULL || name[0] == '\0')
        return -1;
    uint32_t n = inv->nnics < ORB_TOPO_MAX_NICS ? inv->nnics : ORB_TOPO_MAX_NICS;
    for (uint32_t i = 0; i < n; i++)
        if (strncmp(inv->nics[i].name, name, ORB_TOPO_NAME_MAX) == 0)
            return (int)i;
    return -1;
}

static bool name_listed(const char (*list)[ORB_TOPO_NAME_MAX], uint32_t count, const char *name)
{
    for (uint32_t i = 0; i < count; i++)
        if (strncmp(list[i], name, ORB_TOPO_NAME_MAX) == 0)
            return true;
    return false;
}

static const struct orb_topo_port *nic_port(const struct orb_topo_nic *nic, uint8_t num)
{
    for (uint32_t p = 0; p < nic->nports && p < ORB_TOPO_MAX_PORTS; p++)
        if (nic->ports[p].num == num)
            return &nic->ports[p];
    return NULL;
}

static bool port_has_gid(const struct orb_topo_port *port, int32_t index)
{
    for (uint32_t g = 0; g < port->ngids && g < ORB_TOPO_MAX_GIDS; g++)
        if (port->gids[g].index == index)
            return true;
    return false;
}

/* Whether `nic` satisfies the port and GID pins (either may be absent). */
static bool nic_has_pinned_route(const struct orb_topo_nic *nic, const struct orb_topo_pin *pin)
{
    if (pin->port != 0) {
        const struct orb_topo_port *port = nic_port(nic, pin->port);
        return port != NULL && (pin->gid_index == ORB_TOPO_PIN_NONE || port_has_gid(port, pin->gid_index));
    }
    if (pin->gid_index == ORB_TOPO_PIN_NONE)
        return true;
    for (uint32_t p = 0; p < nic->nports && p < ORB_TOPO_MAX_PORTS; p++)
        if (port_has_gid(&nic->ports[p], pin->gid_index))
            return true;
    return false;
}

/* Apply the device pin to `mask`, failing with the reason a pinned device cannot be honoured. */
static int apply_device_pin(const struct orb_topo_inventory *inv, const struct orb_topo_pin *pin,
                            uint64_t *mask)
{
    int id = orb_topo_find_nic(inv, pin->device);
    if (id < 0)
        return orb_fail(ORB_ECONFIG, "device: pinned NIC %s is not present on this host", pin->device);
    const struct orb_topo_nic *nic = &inv->nics[id];
    if (!nic->usable)
        return orb_fail(ORB_ECONFIG, "device: pinned NIC %s failed discovery", pin->device);
    if ((*mask & (1ull << id)) == 0)
        return orb_fail(ORB_ECONFIG, "device: pinned NIC %s is excluded by the whitelist, blacklist or device_mask",
                        pin->device);
    if (pin->port != 0 && nic_port(nic, pin->port) == NULL)
        return orb_fail(ORB_ECONFIG, "port: pinned NIC %s has no port %u", pin->device, pin->port);
    if (!nic_has_pinned_route(nic, pin)) {
        if (pin->port != 0)
            return orb_fail(ORB_ECONFIG, "gid_index: pinned NIC %s port %u has no valid GID at index %d",
                            pin->device, pin->port, (int)pin->gid_index);
        return orb_fail(ORB_ECONFIG, "gid_index: pinned NIC %s has no valid GID at index %d", pin->device,
                        (int)pin->gid_index);
    }
    *mask = 1ull << id;
    return 0;
}

int orb_topo_filter(const struct orb_topo_inventory *inv, const struct orb_topo_config *cfg,
                    uint64_t *out_eligible_mask)
{
    if (inv == NULL || cfg == NULL || out_eligible_mask == NULL)
        return orb_fail(ORB_EINVAL, "topology filter: NULL argument");
    int rc = orb_topo_config_validate(cfg);
    if (rc != 0)
        return rc;
    uint32_t nnics = inv->nnics < ORB_TOPO_MAX_NICS ? inv->nnics : ORB_TOPO_MAX_NICS;

    for (uint32_t i = 0; i < cfg->nwhitelist; i++)
        if (orb_topo_find_nic(inv, cfg->whitelist[i]) < 0)
            return orb_fail(ORB_ECONFIG, "rdma_whitelist: NIC %s is not present on this host", cfg->whitelist[i]);

    uint64_t mask = 0;
    for (uint32_t i = 0; i < nnics; i++) {
        const struct orb_topo_nic *nic = &inv->nics[i];
        if (!nic->usable)
            continue;
        if (cfg->nwhitelist > 0 ? !name_listed(cfg->whitelist, cfg->nwhitelist, nic->name)
                                : name_listed(cfg->blacklist, cfg->nblacklist, nic->name))
            continue;
        mask |= 1ull << i;
    }
    mask &= cfg->device_mask;

    const struct orb_topo_pin *pin = &cfg->pin;
    if (pin->device[0] != '\0') {
        rc = apply_device_pin(inv, pin, &mask);
        if (rc != 0)
            return rc;
    } else if (pin->port != 0 || pin->gid_index != ORB_TOPO_PIN_NONE) {
        for (uint32_t i = 0; i < nnics; i++)
            if ((mask & (1ull << i)) != 0 && !nic_has_pinned_route(&inv->nics[i], pin))
                mask &= ~(1ull << i);
        if (mask == 0) {
            if (pin->port != 0 && pin->gid_index != ORB_TOPO_PIN_NONE)
                return orb_fail(ORB_ECONFIG, "port/gid_index: no eligible NIC has port %u with a valid GID at index %d",
                                pin->port, (int)pin->gid_index);
            if (pin->port != 0)
                return orb_fail(ORB_ECONFIG, "port: no eligible NIC has port %u", pin->port);
            return orb_fail(ORB_ECONFIG, "gid_index: no eligible NIC has a valid GID at index %d",
                            (int)pin->gid_index);
        }
    }

    bool explicit_filters = cfg->nwhitelist > 0 || cfg->nblacklist > 0 || cfg->device_mask != ORB_TOPO_DEVICE_MASK_ALL;
    if (mask == 0 && explicit_filters)
        return orb_fail(ORB_ECONFIG, "rdma_whitelist/rdma_blacklist/device_mask: no usable NIC is left");

    if (cfg->preferred_numa_node != ORB_TOPO_NUMA_UNKNOWN && inv->nnuma > 0) {
        bool known = false;
        for (uint32_t n = 0; n < inv->nnuma && n < ORB_TOPO_MAX_NUMA; n++)
            known = known || inv->numa[n].id == cfg->preferred_numa_node;
        if (!known)
            return orb_fail(ORB_ECONFIG, "preferred_numa_node: node %d does not exist on this host",
                            (int)cfg->preferred_numa_node);
    }
    *out_eligible_mask = mask;
    return 0;
}

int orb_topo_config_from_rdma(const struct orb_rdma_config *rdma, struct orb_topo_config *cfg)
{
    if (rdma == NULL || cfg == NULL)
        return orb_fail(ORB_EINVAL, "topo: NULL RDMA settings or filter");
    orb_topo_config_defaults(cfg);
    for (uint32_t i = 0; i < rdma->whitelist.count; i++) {
        int rc = orb_topo_config_whitelist_add(cfg, rdma->whitelist.name[i]);
        if (rc != 0)
            return rc;
    }
    for (uint32_t i = 0; i < rdma->blacklist.count; i++) {
        int rc = orb_topo_config_blacklist_add(cfg, rdma->blacklist.name[i]);
        if (rc != 0)
            return rc;
    }
    snprintf(cfg->pin.device, sizeof cfg->pin.device, "%s", rdma->device);
    cfg->pin.port = (uint8_t)rdma->port;
    cfg->pin.gid_index = rdma->gid_index;
    cfg->device_mask = rdma->device_mask;
    cfg->preferred_numa_node = rdma->preferred_numa_node;
    cfg->strict_local_numa = rdma->strict_local_numa;
    return orb_topo_config_validate(cfg);
}
