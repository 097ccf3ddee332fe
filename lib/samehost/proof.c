/* Same-host proof: boot id, HELLO codec, kernel credentials (see proof.h). */
#include "samehost/proof.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

static const uint8_t hello_magic[8] = {'O', 'R', 'B', 'S', 'H', 'M', 0, 1};

/* Byte offsets of the HELLO's fields. */
#define H_VERSION 8u
#define H_FLAGS 10u
#define H_RESERVED0 12u
#define H_BOOT 16u
#define H_RESERVED1 52u
#define H_EPOCH 56u
#define H_PID 72u
#define H_RESERVED2 76u

bool orb_samehost_boot_id_valid(const char *s, size_t n)
{
    if (s == NULL || n != ORB_BOOT_ID_LEN)
        return false;
    for (size_t i = 0; i < n; i++) {
        bool dash = i == 8 || i == 13 || i == 18 || i == 23;
        char c = s[i];
        if (dash ? c != '-' : !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
            return false;
    }
    return true;
}

int orb_samehost_boot_id_at(int proc_dirfd, char out[ORB_BOOT_ID_LEN + 1])
{
    if (out == NULL)
        return orb_fail(ORB_EINVAL, "samehost: NULL boot id");
    int fd = openat(proc_dirfd, "sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY);
    if (fd < 0)
        return orb_fail(errno == ENOENT || errno == ENOTDIR ? ORB_EUNAVAILABLE : ORB_EINVAL,
                        "samehost: cannot open the boot id: %s", strerror(errno));
    struct stat st;
    char buf[ORB_BOOT_ID_LEN + 2];
    ssize_t n = -1;
    int rc = 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = orb_fail(ORB_EPROTO, "samehost: the boot id is not a regular file");
        goto close_fd;
    }
    /* One read: procfs answers it whole. A longer file is not a boot id. */
    do
        n = read(fd, buf, sizeof buf);
    while (n < 0 && errno == EINTR);
    if (n != (ssize_t)ORB_BOOT_ID_LEN + 1 || buf[ORB_BOOT_ID_LEN] != '\n' ||
        !orb_samehost_boot_id_valid(buf, ORB_BOOT_ID_LEN)) {
        rc = orb_fail(ORB_EPROTO, "samehost: the boot id file does not hold a boot id (%zd bytes)", n);
        goto close_fd;
    }
    memcpy(out, buf, ORB_BOOT_ID_LEN);
    out[ORB_BOOT_ID_LEN] = '\0';
close_fd:
    (void)close(fd);
    return rc;
}

int orb_samehost_boot_id(char out[ORB_BOOT_ID_LEN + 1])
{
    int proc = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (proc < 0)
        return orb_fail(ORB_EUNAVAILABLE, "samehost: no /proc: %s", strerror(errno));
    int rc = orb_samehost_boot_id_at(proc, out);
    (void)close(proc);
    return rc;
}

static void put_le16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static bool all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != 0)
            return false;
    return true;
}

int orb_samehost_hello_encode(const struct orb_samehost_hello *h, uint8_t buf[ORB_SAMEHOST_HELLO_LEN])
{
    if (h == NULL || buf == NULL)
        return orb_fail(ORB_EINVAL, "samehost: NULL hello or buffer");
    if (!orb_samehost_boot_id_valid(h->boot_id, strnlen(h->boot_id, sizeof h->boot_id)) || h->pid == 0)
        return orb_fail(ORB_EINVAL, "samehost: a hello needs a boot id and a pid");
    memset(buf, 0, ORB_SAMEHOST_HELLO_LEN);
    memcpy(buf, hello_magic, sizeof hello_magic);
    put_le16(buf + H_VERSION, ORB_SAMEHOST_VERSION);
    memcpy(buf + H_BOOT, h->boot_id, ORB_BOOT_ID_LEN);
    memcpy(buf + H_EPOCH, h->epoch.bytes, sizeof h->epoch.bytes);
    put_le32(buf + H_PID, h->pid);
    return 0;
}

int orb_samehost_hello_decode(const uint8_t *buf, size_t len, struct orb_samehost_hello *out)
{
    if (buf == NULL || out == NULL)
        return orb_fail(ORB_EINVAL, "samehost: NULL hello or buffer");
    if (len != ORB_SAMEHOST_HELLO_LEN)
        return orb_fail(ORB_EPROTO, "samehost: a hello of %zu bytes (it has %u)", len, ORB_SAMEHOST_HELLO_LEN);
    if (memcmp(buf, hello_magic, sizeof hello_magic) != 0)
        return orb_fail(ORB_EPROTO, "samehost: not a hello");
    uint16_t version = (uint16_t)(buf[H_VERSION] | buf[H_VERSION + 1] << 8);
    if (version != ORB_SAMEHOST_VERSION)
        return orb_fail(ORB_EPROTO, "samehost: hello version %u (this side speaks %u)", version, ORB_SAMEHOST_VERSION);
    if (!all_zero(buf + H_FLAGS, 6) || !all_zero(buf + H_RESERVED1, 4) || !all_zero(buf + H_RESERVED2, 4))
        return orb_fail(ORB_EPROTO, "samehost: a hello with flags or reserved bytes set");
    if (!orb_samehost_boot_id_valid((const char *)buf + H_BOOT, ORB_BOOT_ID_LEN))
        return orb_fail(ORB_EPROTO, "samehost: a hello whose boot id is not one");
    uint32_t pid = get_le32(buf + H_PID);
    if (pid == 0)
        return orb_fail(ORB_EPROTO, "samehost: a hello without a pid");
    struct orb_samehost_hello h;
    memcpy(h.boot_id, buf + H_BOOT, ORB_BOOT_ID_LEN);
    h.boot_id[ORB_BOOT_ID_LEN] = '\0';
    memcpy(h.epoch.bytes, buf + H_EPOCH, sizeof h.epoch.bytes);
    h.pid = pid;
    *out = h;
    return 0;
}

int orb_samehost_peer_cred(int fd, uint32_t *pid_out, uint32_t *uid_out)
{
    if (pid_out == NULL || uid_out == NULL)
        return orb_fail(ORB_EINVAL, "samehost: NULL credential outputs");
    struct ucred cred;
    socklen_t len = sizeof cred;
    memset(&cred, 0, sizeof cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
        return orb_fail(errno == EBADF || errno == ENOTSOCK || errno == ENOPROTOOPT ? ORB_EINVAL : ORB_EUNAVAILABLE,
                        "samehost: no peer credentials on descriptor %d: %s", fd, strerror(errno));
    /* A socket that is not a connected Unix socket reports no process. */
    if (len != sizeof cred || cred.pid <= 0)
        return orb_fail(ORB_EINVAL, "samehost: descriptor %d is not a connected Unix socket", fd);
    *pid_out = (uint32_t)cred.pid;
    *uid_out = (uint32_t)cred.uid;
    return 0;
}

int orb_samehost_check(const struct orb_samehost_hello *peer, const char *own_boot_id, uint32_t cred_pid,
                       const struct orb_epoch *expected)
{
    if (peer == NULL || own_boot_id == NULL || expected == NULL)
        return orb_fail(ORB_EINVAL, "samehost: NULL hello, boot id or epoch");
    if (strncmp(peer->boot_id, own_boot_id, ORB_BOOT_ID_LEN + 1) != 0)
        return orb_fail(ORB_EUNAVAILABLE, "samehost: the peer runs under boot %s, this process under %s: not this "
                        "host", peer->boot_id, own_boot_id);
    if (peer->pid != cred_pid)
        return orb_fail(ORB_EPERM, "samehost: the hello says pid %u, the kernel says the peer is pid %u", peer->pid,
                        cred_pid);
    if (memcmp(peer->epoch.bytes, expected->bytes, sizeof expected->bytes) != 0)
        return orb_fail(ORB_ESTALE, "samehost: the peer's epoch is not the one the handshake proved");
    return 0;
}
