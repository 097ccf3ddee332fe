/* Host inventory discovery from a sysfs tree: bounded reads, strict parsers, fail closed. */
#include "topo/sysfs.h"

#include <dirent.h>
#include <stdarg.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/ascii.h"
#include "core/error.h"
#include "core/log.h"

#define ATTR_BUF 128           /* one attribute value; a longer file fails closed */
#define DISTANCE_BUF 1024      /* a distance row: ORB_TOPO_MAX_NUMA entries of at most "255 " */
#define LINK_BUF 1024          /* a symlink target */
#define PATH_BUF 512           /* a relative path we build */
#define DIRENT_NAME_MAX 256    /* d_name as the kernel returns it */
#define DIR_ENTRIES_MAX 65536  /* entries examined per directory: bounds the work on a hostile tree */
#define GID_TABLE_MAX 4096     /* GID table entries accepted per port (real tables: 128 or 256) */
#define PORT_NUM_MAX 255
#define GID_INDEX_MAX 65535
#define NUMA_ID_MAX 65535
#define RATE_MBPS_MAX 100000000u /* 100 Tb/s: far above any link; larger values are damage */

#define PCI_VENDOR_NVIDIA 0x10deu
#define PCI_CLASS_DISPLAY_VGA 0x0300u
#define PCI_CLASS_DISPLAY_3D 0x0302u

/* Outcome of reading one attribute, link or directory. */
enum attr_status { ATTR_OK = 0, ATTR_ABSENT = 1, ATTR_BAD = -1 };

/* ---------------------------------------------------------------------------------------------
 * Bounded reads */

/* Read the whole regular file `path` (relative to `dirfd`) into `buf` as a NUL-terminated string
 * without its one trailing newline. ATTR_ABSENT: the file does not exist, or the kernel refused
 * to produce a value (a read error such as EINVAL on an unset GID type). ATTR_BAD: anything else,
 * including a file that does not fit in `cap - 1` bytes, an embedded NUL, a symlink loop or a
 * file that is not a regular file (O_NONBLOCK so that a FIFO cannot block the open). */
static int read_attr(int dirfd, const char *path, char *buf, size_t cap)
{
    int fd = openat(dirfd, path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0)
        return errno == ENOENT ? ATTR_ABSENT : ATTR_BAD;
    int status = ATTR_BAD;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        goto out_close;
    size_t used = 0;
    for (;;) {
        char spill;
        char *dst = used < cap - 1 ? buf + used : &spill;
        size_t room = used < cap - 1 ? cap - 1 - used : 1;
        ssize_t n = read(fd, dst, room);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            status = errno == EISDIR ? ATTR_BAD : ATTR_ABSENT;
            goto out_close;
        }
        if (n == 0)
            break;
        if (dst == &spill)
            goto out_close; /* more than cap - 1 bytes: oversized */
        used += (size_t)n;
    }
    if (memchr(buf, '\0', used) != NULL)
        goto out_close;
    if (used > 0 && buf[used - 1] == '\n')
        used--;
    buf[used] = '\0';
    status = ATTR_OK;
out_close:
    close(fd);
    return status;
}

/* readlinkat() into `buf` (NUL-terminated). ATTR_ABSENT: no such entry, or not a symlink. */
static int read_link(int dirfd, const char *path, char *buf, size_t cap)
{
    ssize_t n = readlinkat(dirfd, path, buf, cap);
    if (n < 0)
        return (errno == ENOENT || errno == EINVAL) ? ATTR_ABSENT : ATTR_BAD;
    if ((size_t)n >= cap)
        return ATTR_BAD;
    buf[n] = '\0';
    return ATTR_OK;
}

/* snprintf that reports truncation as failure. */
static bool format_path(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool format_path(char *buf, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
    return n >= 0 && (size_t)n < cap;
}

typedef int (*entry_visitor)(const char *name, void *ctx);

/* Call `visit` for each entry of directory `path` (relative to `dirfd`) except "." and "..",
 * stopping at the first visitor result other than ATTR_OK and returning it. ATTR_ABSENT: no such
 * directory. ATTR_BAD: it cannot be opened or read, or has more than DIR_ENTRIES_MAX entries. */
static int for_each_entry(int dirfd, const char *path, entry_visitor visit, void *ctx)
{
    int fd = openat(dirfd, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? ATTR_ABSENT : ATTR_BAD;
    DIR *dir = fdopendir(fd); /* owns fd from here */
    if (dir == NULL) {
        close(fd);
        return ATTR_BAD;
    }
    int status = ATTR_OK;
    size_t seen = 0;
    for (;;) {
        errno = 0;
        struct dirent *de = readdir(dir);
        if (de == NULL) {
            if (errno != 0)
                status = ATTR_BAD;
            break;
        }
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        if (++seen > DIR_ENTRIES_MAX) {
            status = ATTR_BAD;
            break;
        }
        status = visit(de->d_name, ctx);
        if (status != ATTR_OK)
            break;
    }
    closedir(dir);
    return status;
}

/* ---------------------------------------------------------------------------------------------
 * Strict parsers */

/* A decimal number with no sign, no leading zero (except "0"), nothing after it, at most `max`. */
static bool parse_decimal(const char *s, uint32_t max, uint32_t *out)
{
    if (!orb_ascii_is_digit(s[0]) || (s[0] == '0' && s[1] != '\0'))
        return false;
    uint64_t v = 0;
    for (size_t i = 0; s[i] != '\0'; i++) {
        if (!orb_ascii_is_digit(s[i]) || i >= 10)
            return false;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    if (v > max)
        return false;
    *out = (uint32_t)v;
    return true;
}

/* Exactly `ndigits` hex digits at `s`; returns false if any is not a hex digit. */
static bool parse_hex_run(const char *s, size_t ndigits, uint64_t *out)
{
    uint64_t v = 0;
    for (size_t i = 0; i < ndigits; i++) {
        int d = orb_ascii_hex_value(s[i]);
        if (d < 0)
            return false;
        v = (v << 4) | (uint64_t)d;
    }
    *out = v;
    return true;
}

/* "-1" (unknown) or a node id up to NUMA_ID_MAX. */
static bool parse_numa_node(const char *s, int32_t *out)
{
    if (strcmp(s, "-1") == 0) {
        *out = ORB_TOPO_NUMA_UNKNOWN;
        return true;
    }
    uint32_t v;
    if (!parse_decimal(s, NUMA_ID_MAX, &v))
        return false;
    *out = (int32_t)v;
    return true;
}

/* node_guid: "xxxx:xxxx:xxxx:xxxx". */
static bool parse_node_guid(const char *s, uint64_t *out)
{
    if (strlen(s) != 19)
        return false;
    uint64_t guid = 0;
    for (size_t g = 0; g < 4; g++) {
        uint64_t part;
        if (!parse_hex_run(s + g * 5, 4, &part) || (g < 3 && s[g * 5 + 4] != ':'))
            return false;
        guid = (guid << 16) | part;
    }
    *out = guid;
    return true;
}

/* A GID as the kernel prints it: eight groups of four hex digits separated by ':'. */
static bool parse_gid(const char *s, uint8_t raw[16])
{
    if (strlen(s) != 39)
        return false;
    for (size_t g = 0; g < 8; g++) {
        uint64_t part;
        if (!parse_hex_run(s + g * 5, 4, &part) || (g < 7 && s[g * 5 + 4] != ':'))
            return false;
        raw[2 * g] = (uint8_t)(part >> 8);
        raw[2 * g + 1] = (uint8_t)part;
    }
    return true;
}

/* "0x" followed by exactly `ndigits` hex digits (PCI vendor: 4, class: 6). */
static bool parse_prefixed_hex(const char *s, size_t ndigits, uint32_t *out)
{
    uint64_t v;
    if (strlen(s) != ndigits + 2 || s[0] != '0' || s[1] != 'x' || !parse_hex_run(s + 2, ndigits, &v))
        return false;
    *out = (uint32_t)v;
    return true;
}

/* Port state: "<n>: <NAME>" with the name the kernel prints for that number. */
static bool parse_port_state(const char *s, uint8_t *out)
{
    static const char *const names[] = {"NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"};
    if (!orb_ascii_is_digit(s[0]) || s[1] != ':' || s[2] != ' ')
        return false;
    unsigned n = (unsigned)(s[0] - '0');
    if (n >= sizeof names / sizeof names[0] || strcmp(s + 3, names[n]) != 0)
        return false;
    *out = (uint8_t)n;
    return true;
}

static bool parse_link_layer(const char *s, uint8_t *out)
{
    if (strcmp(s, "InfiniBand") == 0)
        *out = ORB_LINK_INFINIBAND;
    else if (strcmp(s, "Ethernet") == 0)
        *out = ORB_LINK_ETHERNET;
    else if (strcmp(s, "Unknown") == 0)
        *out = ORB_LINK_UNKNOWN;
    else
        return false;
    return true;
}

/* Port rate: "<whole>[.<1-3 digits>] Gb/sec" optionally followed by " (<width>X[ <SPEED>])",
 * e.g. "100 Gb/sec (4X EDR)", "2.5 Gb/sec (1X SDR)", "10 Gb/sec (4X)". Result in Mb/s. */
static bool parse_rate_mbps(const char *s, uint32_t *out)
{
    size_t i = 0;
    uint64_t whole = 0;
    if (!orb_ascii_is_digit(s[0]) || (s[0] == '0' && orb_ascii_is_digit(s[1])))
        return false;
    for (; orb_ascii_is_digit(s[i]); i++) {
        if (i >= 6)
            return false;
        whole = whole * 10 + (uint64_t)(s[i] - '0');
    }
    uint64_t thousandths = 0;
    if (s[i] == '.') {
        i++;
        size_t digits = 0;
        for (; orb_ascii_is_digit(s[i]); i++, digits++) {
            if (digits >= 3)
                return false;
            thousandths = thousandths * 10 + (uint64_t)(s[i] - '0');
        }
        if (digits == 0)
            return false;
        for (; digits < 3; digits++)
            thousandths *= 10;
    }
    static const char unit[] = " Gb/sec";
    if (strncmp(s + i, unit, sizeof unit - 1) != 0)
        return false;
    i += sizeof unit - 1;
    if (s[i] != '\0') {
        /* " (4X EDR)": a width, 'X', an optional speed name in capitals and digits. */
        if (s[i] != ' ' || s[i + 1] != '(' || !orb_ascii_is_digit(s[i + 2]))
            return false;
        i += 2;
        size_t wdigits = 0;
        for (; orb_ascii_is_digit(s[i]); i++)
            if (++wdigits > 2)
                return false;
        if (s[i++] != 'X')
            return false;
        if (s[i] == ' ') {
            i++;
            size_t letters = 0;
            for (; (s[i] >= 'A' && s[i] <= 'Z') || orb_ascii_is_digit(s[i]); i++)
                if (++letters > 8)
                    return false;
            if (letters == 0)
                return false;
        }
        if (s[i] != ')' || s[i + 1] != '\0')
            return false;
    }
    uint64_t mbps = whole * 1000 + thousandths;
    if (mbps > RATE_MBPS_MAX)
        return false;
    *out = (uint32_t)mbps;
    return true;
}

/* A canonical PCI bus id "dddd:bb:dd.f" (lowercase, 4-8 domain digits, device <= 0x1f, function
 * <= 7). `key` orders bus ids numerically (domain, bus, device, function). */
static bool parse_bus_id(const char *s, uint64_t *key)
{
    size_t len = strlen(s);
    if (len < 12 || len > 16 || len >= ORB_TOPO_PCI_MAX)
        return false;
    size_t dlen = len - 8; /* "bb:dd.f" plus the ':' after the domain */
    for (size_t i = 0; i < len; i++)
        if (s[i] >= 'A' && s[i] <= 'F')
            return false; /* sysfs names are lowercase: anything else is not a canonical name */
    uint64_t domain, bus, dev, fn;
    if (!parse_hex_run(s, dlen, &domain) || s[dlen] != ':' || !parse_hex_run(s + dlen + 1, 2, &bus) ||
        s[dlen + 3] != ':' || !parse_hex_run(s + dlen + 4, 2, &dev) || s[dlen + 6] != '.' ||
        !orb_ascii_is_digit(s[dlen + 7]) || s[dlen + 7] > '7' || dev > 0x1f)
        return false;
    fn = (uint64_t)(s[dlen + 7] - '0');
    if (key != NULL)
        *key = (domain << 16) | (bus << 8) | (dev << 3) | fn;
    return true;
}

/* A root complex directory "pcidddd:bb" (lowercase). */
static bool is_pci_root(const char *s, size_t len)
{
    if (len < 10 || len > 15 || strncmp(s, "pci", 3) != 0)
        return false;
    size_t dlen = len - 6; /* "pci" + domain + ":bb" */
    if (s[3 + dlen] != ':')
        return false;
    for (size_t i = 3; i < len; i++) {
        if (i == 3 + dlen)
            continue;
        if (!orb_ascii_is_digit(s[i]) && !(s[i] >= 'a' && s[i] <= 'f'))
            return false;
    }
    return true;
}

/* Outcome of parsing a PCI path out of a symlink target. */
enum path_status { PATH_KNOWN, PATH_UNKNOWN, PATH_INCONSISTENT };

/* Extract the chain root complex -> bridges -> device from a sysfs symlink target such as
 * "../../devices/pci0000:00/0000:00:01.0/0000:01:00.0/infiniband/mlx5_0": the first "pci..."
 * component starts the chain and it runs while components are bus ids. PATH_UNKNOWN: no root,
 * no device, or deeper than ORB_TOPO_PCI_DEPTH. PATH_INCONSISTENT: the last bus id is not
 * `leaf`. */
static int parse_pci_path(const char *target, const char *leaf, struct orb_pci_path *out)
{
    struct orb_pci_path path;
    memset(&path, 0, sizeof path);
    bool in_chain = false;
    const char *p = target;
    while (*p != '\0') {
        const char *slash = strchr(p, '/');
        size_t len = slash != NULL ? (size_t)(slash - p) : strlen(p);
        char comp[ORB_TOPO_PCI_MAX];
        bool fits = len < sizeof comp;
        if (fits) {
            memcpy(comp, p, len);
            comp[len] = '\0';
        }
        if (!in_chain) {
            if (fits && is_pci_root(comp, len)) {
                in_chain = true;
                memcpy(path.hops[path.depth++], comp, len + 1);
            }
        } else {
            if (!fits || !parse_bus_id(comp, NULL))
                break;
            if (path.depth >= ORB_TOPO_PCI_DEPTH)
                return PATH_UNKNOWN;
            memcpy(path.hops[path.depth++], comp, len + 1);
        }
        p += len;
        if (*p == '/')
            p++;
    }
    if (path.depth < 2)
        return PATH_UNKNOWN;
    if (strcmp(path.hops[path.depth - 1], leaf) != 0)
        return PATH_INCONSISTENT;
    *out = path;
    return PATH_KNOWN;
}

bool orb_topo_name_valid(const char *name)
{
    size_t len = strnlen(name, ORB_TOPO_NAME_MAX);
    if (len == 0 || len >= ORB_TOPO_NAME_MAX || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return false;
    for (size_t i = 0; i < len; i++) {
        char c = name[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || orb_ascii_is_digit(c) || c == '_' || c == '.' ||
              c == '-'))
            return false;
    }
    return true;
}

/* Natural order: digit runs compare by value, so mlx5_2 sorts before mlx5_10. A total order: equal
 * under that rule (mlx5_01 vs mlx5_1) falls back to byte order. */
static int natural_cmp(const char *a, const char *b)
{
    const char *pa = a, *pb = b;
    while (*pa != '\0' && *pb != '\0') {
        if (orb_ascii_is_digit(*pa) && orb_ascii_is_digit(*pb)) {
            while (*pa == '0')
                pa++;
            while (*pb == '0')
                pb++;
            size_t la = 0, lb = 0;
            while (orb_ascii_is_digit(pa[la]))
                la++;
            while (orb_ascii_is_digit(pb[lb]))
                lb++;
            if (la != lb)
                return la < lb ? -1 : 1;
            int c = memcmp(pa, pb, la);
            if (c != 0)
                return c < 0 ? -1 : 1;
            pa += la;
            pb += lb;
        } else {
            if (*pa != *pb)
                return (unsigned char)*pa < (unsigned char)*pb ? -1 : 1;
            pa++;
            pb++;
        }
    }
    if (*pa != '\0' || *pb != '\0')
        return *pa != '\0' ? 1 : -1;
    int c = strcmp(a, b);
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
}

/* ---------------------------------------------------------------------------------------------
 * Scratch state (heap: the inventory alone is ~140 KiB) */

struct gpu_candidate {
    uint64_t key; /* bus id order */
    char pci[ORB_TOPO_PCI_MAX];
};

struct scratch {
    struct orb_topo_inventory inv;
    /* NIC names in natural order, the lowest ORB_TOPO_MAX_NICS of them. */
    char nic_names[ORB_TOPO_MAX_NICS][DIRENT_NAME_MAX];
    uint32_t nnic_names;
    uint32_t nic_names_dropped;
    /* GPUs in bus id order, the lowest ORB_TOPO_MAX_GPUS of them. */
    struct gpu_candidate gpus[ORB_TOPO_MAX_GPUS];
    uint32_t ngpus;
    bool gpu_identity_failed;
    char gpu_failure[PATH_BUF];
    /* NUMA node ids, ascending, the lowest ORB_TOPO_MAX_NUMA of them; total seen. */
    int32_t numa_ids[ORB_TOPO_MAX_NUMA];
    uint32_t nnuma_ids;
    uint32_t numa_total;
    /* One port's GID table indexes (ascending after sorting). */
    uint16_t gid_indexes[GID_TABLE_MAX];
    uint32_t ngid_indexes;
    /* Port numbers of the NIC being read (ascending), the lowest ORB_TOPO_MAX_PORTS. */
    uint8_t port_nums[ORB_TOPO_MAX_PORTS];
    uint32_t nport_nums;
    int sysfs_fd;
};

/* ---------------------------------------------------------------------------------------------
 * NICs */

static int collect_nic_name(const char *name, void *ctx)
{
    struct scratch *s = ctx;
    size_t len = strnlen(name, DIRENT_NAME_MAX);
    if (len >= DIRENT_NAME_MAX)
        return ATTR_BAD;
    uint32_t pos = s->nnic_names;
    while (pos > 0 && natural_cmp(name, s->nic_names[pos - 1]) < 0)
        pos--;
    if (pos >= ORB_TOPO_MAX_NICS) {
        s->nic_names_dropped++;
        return ATTR_OK;
    }
    if (s->nnic_names == ORB_TOPO_MAX_NICS)
        s->nic_names_dropped++; /* the largest name falls off the end */
    else
        s->nnic_names++;
    memmove(s->nic_names[pos + 1], s->nic_names[pos], (size_t)(s->nnic_names - 1 - pos) * DIRENT_NAME_MAX);
    memcpy(s->nic_names[pos], name, len + 1);
    return ATTR_OK;
}

static int collect_port_num(const char *name, void *ctx)
{
    struct scratch *s = ctx;
    uint32_t num;
    if (!parse_decimal(name, PORT_NUM_MAX, &num) || num == 0)
        return ATTR_BAD;
    uint32_t pos = s->nport_nums;
    while (pos > 0 && num < s->port_nums[pos - 1])
        pos--;
    if (pos >= ORB_TOPO_MAX_PORTS)
        return ATTR_OK; /* keep the lowest-numbered ports */
    if (s->nport_nums < ORB_TOPO_MAX_PORTS)
        s->nport_nums++;
    memmove(&s->port_nums[pos + 1], &s->port_nums[pos], (size_t)(s->nport_nums - 1 - pos));
    s->port_nums[pos] = (uint8_t)num;
    return ATTR_OK;
}

static int collect_gid_index(const char *name, void *ctx)
{
    struct scratch *s = ctx;
    uint32_t index;
    if (!parse_decimal(name, GID_INDEX_MAX, &index) || s->ngid_indexes >= GID_TABLE_MAX)
        return ATTR_BAD;
    s->gid_indexes[s->ngid_indexes++] = (uint16_t)index;
    return ATTR_OK;
}

static int cmp_u16(const void *a, const void *b)
{
    uint16_t x = *(const uint16_t *)a, y = *(const uint16_t *)b;
    return (x > y) - (x < y);
}

/* Why a NIC failed, for the warning. */
struct nic_failure {
    char why[PATH_BUF];
};

static bool nic_fail(struct nic_failure *f, const char *what, const char *path)
{
    snprintf(f->why, sizeof f->why, "%.400s: %.80s", path, what);
    return false;
}

/* Read one attribute that must exist and be well formed. */
static bool read_required(int dirfd, const char *path, char *buf, size_t cap, struct nic_failure *f)
{
    int rc = read_attr(dirfd, path, buf, cap);
    if (rc == ATTR_OK)
        return true;
    return nic_fail(f, rc == ATTR_ABSENT ? "missing" : "unreadable or oversized", path);
}

/* Read an optional attribute: false only when it exists but cannot be read safely. */
static bool read_optional(int dirfd, const char *path, char *buf, size_t cap, bool *present,
                          struct nic_failure *f)
{
    int rc = read_attr(dirfd, path, buf, cap);
    *present = rc == ATTR_OK;
    if (rc == ATTR_BAD)
        return nic_fail(f, "unreadable or oversized", path);
    return true;
}

static bool load_gids(struct scratch *s, int nicfd, struct orb_topo_port *port, struct nic_failure *f)
{
    char path[PATH_BUF], buf[ATTR_BUF];
    s->ngid_indexes = 0;
    if (!format_path(path, sizeof path, "ports/%u/gids", port->num))
        return nic_fail(f, "path too long", "gids");
    int rc = for_each_entry(nicfd, path, collect_gid_index, s);
    if (rc == ATTR_ABSENT)
        return true; /* no GID table: a port without addresses */
    if (rc != ATTR_OK)
        return nic_fail(f, "bad GID table", path);
    qsort(s->gid_indexes, s->ngid_indexes, sizeof s->gid_indexes[0], cmp_u16);
    for (uint32_t k = 0; k < s->ngid_indexes && port->ngids < ORB_TOPO_MAX_GIDS; k++) {
        unsigned index = s->gid_indexes[k];
        bool present;
        if (!format_path(path, sizeof path, "ports/%u/gids/%u", port->num, index) ||
            !read_optional(nicfd, path, buf, sizeof buf, &present, f))
            return false;
        if (!present)
            continue;
        struct orb_topo_gid gid;
        memset(&gid, 0, sizeof gid);
        if (!parse_gid(buf, gid.raw))
            return nic_fail(f, "malformed", path);
        static const uint8_t zero[16];
        if (memcmp(gid.raw, zero, sizeof zero) == 0)
            continue; /* an unset table entry */
        /* Type after value: the kernel refuses to show the type of an unset entry. */
        if (!format_path(path, sizeof path, "ports/%u/gid_attrs/types/%u", port->num, index) ||
            !read_optional(nicfd, path, buf, sizeof buf, &present, f))
            return false;
        if (!present)
            continue; /* entry removed between the two reads, or no type: not usable */
        if (strcmp(buf, "RoCE v2") == 0)
            gid.type = ORB_GID_ROCE_V2;
        else if (strcmp(buf, "IB/RoCE v1") == 0)
            gid.type = port->link_layer == ORB_LINK_ETHERNET ? ORB_GID_ROCE_V1 : ORB_GID_IB;
        else
            return nic_fail(f, "malformed", path);
        static const uint8_t v4_prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        gid.is_ipv4 = memcmp(gid.raw, v4_prefix, sizeof v4_prefix) == 0;
        gid.index = (uint16_t)index;
        port->gids[port->ngids++] = gid;
    }
    return true;
}

static bool load_port(struct scratch *s, int nicfd, struct orb_topo_port *port, struct nic_failure *f)
{
    char path[PATH_BUF], buf[ATTR_BUF];
    bool present;
    if (!format_path(path, sizeof path, "ports/%u/state", port->num) ||
        !read_required(nicfd, path, buf, sizeof buf, f))
        return false;
    if (!parse_port_state(buf, &port->state))
        return nic_fail(f, "malformed", path);
    if (!format_path(path, sizeof path, "ports/%u/link_layer", port->num) ||
        !read_optional(nicfd, path, buf, sizeof buf, &present, f))
        return false;
    if (present && !parse_link_layer(buf, &port->link_layer))
        return nic_fail(f, "malformed", path);
    if (!format_path(path, sizeof path, "ports/%u/rate", port->num) ||
        !read_optional(nicfd, path, buf, sizeof buf, &present, f))
        return false;
    if (present && !parse_rate_mbps(buf, &port->rate_mbps))
        return nic_fail(f, "malformed", path);
    return load_gids(s, nicfd, port, f);
}

/* Fill `nic` (id and name already set) from class/infiniband/<name>. */
static bool load_nic(struct scratch *s, struct orb_topo_nic *nic, struct nic_failure *f)
{
    char path[PATH_BUF], buf[ATTR_BUF], link[LINK_BUF];
    bool ok = false;
    bool present;
    if (!format_path(path, sizeof path, "class/infiniband/%s", nic->name))
        return nic_fail(f, "path too long", "class/infiniband");
    int nicfd = openat(s->sysfs_fd, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (nicfd < 0)
        return nic_fail(f, "cannot open", path);

    if (!read_required(nicfd, "node_guid", buf, sizeof buf, f))
        goto out_close;
    if (!parse_node_guid(buf, &nic->node_guid)) {
        nic_fail(f, "malformed", "node_guid");
        goto out_close;
    }

    /* PCI address from the device link; absent for virtual devices (no locality known). */
    int rc = read_link(nicfd, "device", link, sizeof link);
    if (rc == ATTR_BAD) {
        nic_fail(f, "unreadable link", "device");
        goto out_close;
    }
    if (rc == ATTR_OK) {
        const char *base = strrchr(link, '/');
        base = base != NULL ? base + 1 : link;
        if (!parse_bus_id(base, NULL)) {
            nic_fail(f, "target is not a PCI function", "device");
            goto out_close;
        }
        memcpy(nic->pci, base, strlen(base) + 1);
        if (!read_optional(nicfd, "device/numa_node", buf, sizeof buf, &present, f))
            goto out_close;
        if (present && !parse_numa_node(buf, &nic->numa_node)) {
            nic_fail(f, "malformed", "device/numa_node");
            goto out_close;
        }
        /* The class symlink's target holds the chain of bridges down to the function. */
        rc = read_link(s->sysfs_fd, path, link, sizeof link);
        if (rc == ATTR_BAD) {
            nic_fail(f, "unreadable link", path);
            goto out_close;
        }
        if (rc == ATTR_OK && parse_pci_path(link, nic->pci, &nic->path) == PATH_INCONSISTENT) {
            nic_fail(f, "PCI path does not end at the device link's function", path);
            goto out_close;
        }
    }

    s->nport_nums = 0;
    rc = for_each_entry(nicfd, "ports", collect_port_num, s);
    if (rc != ATTR_OK || s->nport_nums == 0) {
        nic_fail(f, rc == ATTR_OK || rc == ATTR_ABSENT ? "no ports" : "bad port directory", "ports");
        goto out_close;
    }
    for (uint32_t i = 0; i < s->nport_nums; i++) {
        struct orb_topo_port *port = &nic->ports[i];
        port->num = s->port_nums[i];
        if (!load_port(s, nicfd, port, f))
            goto out_close;
    }
    nic->nports = (uint8_t)s->nport_nums;
    nic->usable = 1;
    ok = true;
out_close:
    close(nicfd);
    return ok;
}

static int load_nics(struct scratch *s)
{
    int rc = for_each_entry(s->sysfs_fd, "class/infiniband", collect_nic_name, s);
    if (rc == ATTR_ABSENT)
        return 0;
    if (rc != ATTR_OK)
        return orb_fail(ORB_EUNAVAILABLE, "topology: cannot list class/infiniband");
    if (s->nic_names_dropped > 0)
        ORB_LOGW("topology: %u RDMA devices beyond the first %u are ignored", s->nic_names_dropped,
                 ORB_TOPO_MAX_NICS);
    for (uint32_t i = 0; i < s->nnic_names; i++) {
        struct orb_topo_nic *nic = &s->inv.nics[i];
        struct nic_failure failure = {{0}};
        memset(nic, 0, sizeof *nic);
        nic->id = (uint8_t)i;
        nic->numa_node = ORB_TOPO_NUMA_UNKNOWN;
        bool ok;
        if (orb_topo_name_valid(s->nic_names[i])) {
            memcpy(nic->name, s->nic_names[i], strlen(s->nic_names[i]) + 1);
            ok = load_nic(s, nic, &failure);
        } else {
            ok = nic_fail(&failure, "invalid device name", "class/infiniband");
        }
        if (!ok) {
            /* Keep the slot and its name (when valid); drop everything half-read. */
            char name[ORB_TOPO_NAME_MAX];
            memcpy(name, nic->name, sizeof name);
            memset(nic, 0, sizeof *nic);
            nic->id = (uint8_t)i;
            nic->numa_node = ORB_TOPO_NUMA_UNKNOWN;
            memcpy(nic->name, name, sizeof name);
            ORB_LOGW("topology: NIC slot %u (%s): %s; the slot stays unusable", i,
                     name[0] != '\0' ? name : "invalid name", failure.why);
        }
    }
    s->inv.nnics = s->nnic_names;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * GPUs */

static void gpu_identity_failed(struct scratch *s, const char *name, const char *what)
{
    if (!s->gpu_identity_failed)
        snprintf(s->gpu_failure, sizeof s->gpu_failure, "%.40s: %s", name, what);
    s->gpu_identity_failed = true;
}

static int visit_pci_device(const char *name, void *ctx)
{
    struct scratch *s = ctx;
    uint64_t key;
    char path[PATH_BUF], buf[ATTR_BUF];
    uint32_t vendor, class_code;
    if (!parse_bus_id(name, &key)) {
        gpu_identity_failed(s, name, "not a PCI bus id");
        return ATTR_OK;
    }
    if (!format_path(path, sizeof path, "bus/pci/devices/%s/vendor", name) ||
        read_attr(s->sysfs_fd, path, buf, sizeof buf) != ATTR_OK || !parse_prefixed_hex(buf, 4, &vendor)) {
        gpu_identity_failed(s, name, "bad vendor");
        return ATTR_OK;
    }
    if (!format_path(path, sizeof path, "bus/pci/devices/%s/class", name) ||
        read_attr(s->sysfs_fd, path, buf, sizeof buf) != ATTR_OK || !parse_prefixed_hex(buf, 6, &class_code)) {
        gpu_identity_failed(s, name, "bad class");
        return ATTR_OK;
    }
    uint32_t subclass = class_code >> 8;
    if (vendor != PCI_VENDOR_NVIDIA || (subclass != PCI_CLASS_DISPLAY_VGA && subclass != PCI_CLASS_DISPLAY_3D))
        return ATTR_OK;
    uint32_t pos = s->ngpus;
    while (pos > 0 && key < s->gpus[pos - 1].key)
        pos--;
    if (pos >= ORB_TOPO_MAX_GPUS)
        return ATTR_OK; /* ordinals 0..63 are the lowest bus ids */
    if (s->ngpus < ORB_TOPO_MAX_GPUS)
        s->ngpus++;
    memmove(&s->gpus[pos + 1], &s->gpus[pos], (size_t)(s->ngpus - 1 - pos) * sizeof s->gpus[0]);
    s->gpus[pos].key = key;
    memcpy(s->gpus[pos].pci, name, strlen(name) + 1);
    return ATTR_OK;
}

static void load_gpus(struct scratch *s)
{
    int rc = for_each_entry(s->sysfs_fd, "bus/pci/devices", visit_pci_device, s);
    if (rc == ATTR_ABSENT)
        return;
    if (rc != ATTR_OK)
        gpu_identity_failed(s, "bus/pci/devices", "cannot be listed");
    if (s->gpu_identity_failed) {
        ORB_LOGW("topology: GPU list dropped (%s): ordinals cannot be established", s->gpu_failure);
        return;
    }
    for (uint32_t i = 0; i < s->ngpus; i++) {
        struct orb_topo_gpu *gpu = &s->inv.gpus[i];
        char path[PATH_BUF], buf[ATTR_BUF], link[LINK_BUF];
        memset(gpu, 0, sizeof *gpu);
        gpu->ordinal = i;
        gpu->numa_node = ORB_TOPO_NUMA_UNKNOWN;
        memcpy(gpu->pci, s->gpus[i].pci, sizeof gpu->pci);
        /* Both paths fit: bus ids are at most 15 characters. */
        if (format_path(path, sizeof path, "bus/pci/devices/%s/numa_node", gpu->pci)) {
            rc = read_attr(s->sysfs_fd, path, buf, sizeof buf);
            if (rc == ATTR_BAD || (rc == ATTR_OK && !parse_numa_node(buf, &gpu->numa_node))) {
                gpu->numa_node = ORB_TOPO_NUMA_UNKNOWN;
                ORB_LOGW("topology: GPU %s: bad numa_node; locality unknown", gpu->pci);
            }
        }
        if (format_path(path, sizeof path, "bus/pci/devices/%s", gpu->pci) &&
            read_link(s->sysfs_fd, path, link, sizeof link) == ATTR_OK)
            (void)parse_pci_path(link, gpu->pci, &gpu->path); /* unknown or inconsistent: depth 0 */
    }
    s->inv.ngpus = s->ngpus;
}

/* ---------------------------------------------------------------------------------------------
 * NUMA nodes */

static int collect_numa_node(const char *name, void *ctx)
{
    struct scratch *s = ctx;
    uint32_t id;
    if (strncmp(name, "node", 4) != 0 || !parse_decimal(name + 4, NUMA_ID_MAX, &id))
        return ATTR_OK; /* "online", "possible", "power", ...: not a node */
    s->numa_total++;
    uint32_t pos = s->nnuma_ids;
    while (pos > 0 && (int32_t)id < s->numa_ids[pos - 1])
        pos--;
    if (pos >= ORB_TOPO_MAX_NUMA)
        return ATTR_OK;
    if (s->nnuma_ids < ORB_TOPO_MAX_NUMA)
        s->nnuma_ids++;
    memmove(&s->numa_ids[pos + 1], &s->numa_ids[pos], (size_t)(s->nnuma_ids - 1 - pos) * sizeof s->numa_ids[0]);
    s->numa_ids[pos] = (int32_t)id;
    return ATTR_OK;
}

/* Parse a distance row of exactly `count` space-separated values (0..255). */
static bool parse_distance_row(const char *row, uint32_t count, uint8_t *out)
{
    const char *p = row;
    for (uint32_t j = 0; j < count; j++) {
        /* Distances fit in 3 digits; the buffer is sized for parse_decimal's own 10-digit
         * bound so that the compiler can see every read stays inside it. */
        char token[12];
        size_t len = 0;
        while (orb_ascii_is_digit(p[len]))
            if (++len > 3)
                return false;
        if (len == 0)
            return false;
        memcpy(token, p, len);
        token[len] = '\0';
        uint32_t v;
        if (!parse_decimal(token, 255, &v))
            return false;
        out[j] = (uint8_t)v;
        p += len;
        if (j + 1 < count) {
            if (*p != ' ')
                return false;
            p++;
        }
    }
    return *p == '\0';
}

static void load_numa(struct scratch *s)
{
    int rc = for_each_entry(s->sysfs_fd, "devices/system/node", collect_numa_node, s);
    if (rc != ATTR_OK) {
        if (rc == ATTR_BAD)
            ORB_LOGW("topology: devices/system/node cannot be listed; NUMA locality unknown");
        return;
    }
    for (uint32_t i = 0; i < s->nnuma_ids; i++) {
        struct orb_topo_numa *node = &s->inv.numa[i];
        char path[PATH_BUF], row[DISTANCE_BUF];
        memset(node, 0, sizeof *node);
        node->id = s->numa_ids[i];
        if (s->numa_total != s->nnuma_ids ||
            !format_path(path, sizeof path, "devices/system/node/node%d/distance", node->id))
            continue; /* rows cannot be mapped onto the kept nodes */
        rc = read_attr(s->sysfs_fd, path, row, sizeof row);
        if (rc == ATTR_OK && parse_distance_row(row, s->nnuma_ids, node->distance))
            node->ndistances = (uint8_t)s->nnuma_ids;
        else if (rc != ATTR_ABSENT)
            ORB_LOGW("topology: %s: malformed; distances from node %d unknown", path, node->id);
    }
    s->inv.nnuma = s->nnuma_ids;
}

int orb_topo_load_sysfs(int sysfs_dirfd, struct orb_topo_inventory *out)
{
    struct stat st;
    if (out == NULL)
        return orb_fail(ORB_EINVAL, "topology: inventory is NULL");
    if (sysfs_dirfd < 0 || fstat(sysfs_dirfd, &st) != 0 || !S_ISDIR(st.st_mode))
        return orb_fail(ORB_EINVAL, "topology: sysfs fd is not an open directory");
    struct scratch *s = calloc(1, sizeof *s);
    if (s == NULL)
        return orb_fail(ORB_ENOMEM, "topology: no memory for discovery");
    s->sysfs_fd = sysfs_dirfd;
    int rc = load_nics(s);
    if (rc == 0) {
        load_gpus(s);
        load_numa(s);
        memcpy(out, &s->inv, sizeof *out);
    }
    free(s);
    return rc;
}

/* Whether `nic` (a valid name) has no parent device but rdma_rxe's `parent` attribute (the netdev
 * it runs over, into parent[ORB_TOPO_NAME_MAX]); siw has neither. *driver_rc: how reading its
 * device/driver link went (ATTR_OK: it has a driver, whose link is in link[link_len]). */
static bool rxe_parent(int sysfs_dirfd, const char *nic, char *link, size_t link_len, int *driver_rc,
                       char parent[ORB_TOPO_NAME_MAX])
{
    char path[ORB_TOPO_NAME_MAX + 64];
    int rc = ATTR_ABSENT;
    if (format_path(path, sizeof path, "class/infiniband/%s/device/driver", nic))
        rc = read_link(sysfs_dirfd, path, link, link_len);
    *driver_rc = rc;
    return rc == ATTR_ABSENT && format_path(path, sizeof path, "class/infiniband/%s/parent", nic) &&
           read_attr(sysfs_dirfd, path, parent, ORB_TOPO_NAME_MAX) == ATTR_OK && orb_topo_name_valid(parent);
}

bool orb_topo_nic_is_rxe(int sysfs_dirfd, const char *nic)
{
    char link[256], parent[ORB_TOPO_NAME_MAX];
    int driver_rc;
    return nic != NULL && orb_topo_name_valid(nic) &&
           rxe_parent(sysfs_dirfd, nic, link, sizeof link, &driver_rc, parent);
}

int orb_topo_nic_provider(int sysfs_dirfd, const char *nic, char *buf, size_t len)
{
    if (nic == NULL || buf == NULL || len == 0)
        return orb_fail(ORB_EINVAL, "topology: NULL NIC name or buffer");
    if (!orb_topo_name_valid(nic))
        return orb_fail(ORB_EINVAL, "topology: invalid NIC name");
    char link[256], parent[ORB_TOPO_NAME_MAX];
    int rc;
    bool rxe = rxe_parent(sysfs_dirfd, nic, link, sizeof link, &rc, parent);
    if (rc == ATTR_OK) {
        const char *base = strrchr(link, '/');
        base = base != NULL ? base + 1 : link;
        if (orb_topo_name_valid(base) && (size_t)snprintf(buf, len, "kernel driver %s", base) < len)
            return 0;
        return orb_fail(ORB_ENOENT, "topology: %s: its driver's name is not valid or too long", nic);
    }
    if (rxe) {
        if ((size_t)snprintf(buf, len, "rxe (soft-RoCE over %s)", parent) < len)
            return 0;
        return orb_fail(ORB_ENOENT, "topology: %s: the buffer is too small for its provider", nic);
    }
    return orb_fail(ORB_ENOENT, "topology: %s: no kernel driver or software parent in sysfs", nic);
}

int orb_topo_node_cpus(int sysfs_dirfd, int32_t node, struct orb_cpuset *out)
{
    if (out == NULL || node < 0)
        return orb_fail(ORB_EINVAL, "topology: node CPUs: NULL output or negative node");
    char path[64];
    static _Thread_local char text[ORB_CPULIST_MAX_BYTES + 1];
    if (!format_path(path, sizeof path, "devices/system/node/node%d/cpulist", (int)node))
        return orb_fail(ORB_EINVAL, "topology: node %d: path too long", (int)node);
    int rc = read_attr(sysfs_dirfd, path, text, sizeof text);
    if (rc != ATTR_OK)
        return orb_fail(ORB_ENOENT, "topology: node %d: %s is %s", (int)node, path,
                        rc == ATTR_ABSENT ? "absent" : "unreadable or oversized");
    return orb_cpulist_parse(text, strlen(text), out);
}
