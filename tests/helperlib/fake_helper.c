/* A stand-in for orbite-helper that speaks the protocol through the real codec, well or badly.
 *
 *   fake_helper MODE [REPORT]
 *
 * MODE picks the behaviour (see `modes` below); every fault hits one request type and the rest
 * of the session is served normally. With REPORT, the process first writes what it inherited
 * (argv[0], environment size, open descriptors, what fds 0-3 are, the signal mask) to that file
 * for the tests to check. It serves fd 3 until EOF. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <orbite/orbite.h>

#include "common/helper_proto.h"
#include "fake_data.h"

extern char **environ;

enum fault {
    F_NONE,
    F_EMPTY_INVENTORY,  /* INVENTORY: no items of any kind (ORB_ENOENT for index 0) */
    F_HELLO_HANG,       /* HELLO: never answered */
    F_HELLO_DIE,        /* exits before reading HELLO */
    F_HELLO_VERSION,    /* HELLO_REPLY carries version 2 */
    F_HELLO_UID,        /* HELLO_REPLY names another uid */
    F_HELLO_REFUSE,     /* HELLO_REPLY status ORB_EPERM */
    F_HELLO_TYPE,       /* HELLO answered with a POLICY_REPLY */
    F_WRONG_TYPE,       /* POLICY answered with a PEERMEM_REPLY */
    F_WRONG_SEQ,        /* POLICY answered with sequence + 1 */
    F_OVERSIZED,        /* POLICY answered with a datagram above ORB_HP_MAX_MSG */
    F_SHORT,            /* POLICY answered with 8 bytes */
    F_HANG,             /* POLICY never answered */
    F_DIE,              /* exits on POLICY */
    F_TWO_FDS,          /* OPEN_DEVICE: declares 1, sends 2 */
    F_NO_FD,            /* OPEN_DEVICE: declares 1, sends none */
    F_FD_ON_REFUSAL,    /* OPEN_DEVICE: status ORB_EPERM (declares 0) with an fd */
    F_FD_ON_PEERMEM,    /* PEERMEM_REPLY (declares no fds) with an fd */
    F_BAD_STATUS,       /* PEERMEM_REPLY status +5 */
    F_PEERMEM_BITS,     /* PEERMEM_REPLY with bit 3 set (patched past the encoder) */
    F_COUNT_CHANGES,    /* INVENTORY: NIC total 2 on page 0, 3 on page 1 */
    F_MISORDERED,       /* INVENTORY: NIC ids 1 then 0 */
    F_LINGER,           /* ignores EOF (close must kill it) */
    F_TRAILING,         /* DEVX_REPLY with four extra bytes */
};

static const struct {
    const char *name;
    enum fault fault;
} modes[] = {
    { "good", F_NONE },
    { "empty-inventory", F_EMPTY_INVENTORY },
    { "hello-hang", F_HELLO_HANG },
    { "hello-die", F_HELLO_DIE },
    { "hello-version", F_HELLO_VERSION },
    { "hello-uid", F_HELLO_UID },
    { "hello-refuse", F_HELLO_REFUSE },
    { "hello-type", F_HELLO_TYPE },
    { "wrong-type", F_WRONG_TYPE },
    { "wrong-seq", F_WRONG_SEQ },
    { "oversized", F_OVERSIZED },
    { "short", F_SHORT },
    { "hang", F_HANG },
    { "die", F_DIE },
    { "two-fds", F_TWO_FDS },
    { "no-fd", F_NO_FD },
    { "fd-on-refusal", F_FD_ON_REFUSAL },
    { "fd-on-peermem", F_FD_ON_PEERMEM },
    { "bad-status", F_BAD_STATUS },
    { "peermem-bits", F_PEERMEM_BITS },
    { "count-changes", F_COUNT_CHANGES },
    { "misordered", F_MISORDERED },
    { "linger", F_LINGER },
    { "trailing", F_TRAILING },
};

static enum fault fault;

static void die(const char *what)
{
    fprintf(stderr, "fake_helper: %s\n", what);
    exit(2);
}

static void hang(void)
{
    for (;;)
        pause();
}

/* sendmsg with any number of descriptors: the codec's sender refuses more than the protocol
 * allows, and some faults need exactly that. */
static void send_raw(const uint8_t *buf, size_t len, const int *fds, size_t nfds)
{
    struct iovec iov = { .iov_base = (void *)(uintptr_t)buf, .iov_len = len };
    union {
        struct cmsghdr align;
        char bytes[CMSG_SPACE(sizeof(int) * 4)];
    } control;
    memset(&control, 0, sizeof control);
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (nfds > 0) {
        msg.msg_control = control.bytes;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
        struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
        memcpy(CMSG_DATA(cm), fds, sizeof(int) * nfds);
    }
    if (sendmsg(ORB_HP_FD, &msg, MSG_NOSIGNAL) != (ssize_t)len)
        exit(0); /* the library hung up: nothing left to serve */
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* ---- what the process inherited -------------------------------------------------------------- */

static int is_devnull(int fd)
{
    struct stat st;
    return fstat(fd, &st) == 0 && S_ISCHR(st.st_mode) && major(st.st_rdev) == 1 &&
           minor(st.st_rdev) == 3;
}

static void write_report(const char *path, const char *argv0)
{
    FILE *f = fopen(path, "we");
    if (f == NULL)
        die("cannot write the report");
    size_t nenv = 0;
    while (environ != NULL && environ[nenv] != NULL)
        nenv++;
    fprintf(f, "argv0=%s\nenv=%zu\nfds=", argv0, nenv);
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL)
        die("cannot list /proc/self/fd");
    int listed[64], nlisted = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        int fd = atoi(e->d_name);
        if (fd == dirfd(d) || fd == fileno(f) || nlisted == 64)
            continue;
        listed[nlisted++] = fd;
    }
    closedir(d);
    /* readdir order is not numeric order. */
    for (int i = 1; i < nlisted; i++)
        for (int j = i; j > 0 && listed[j - 1] > listed[j]; j--) {
            int t = listed[j];
            listed[j] = listed[j - 1];
            listed[j - 1] = t;
        }
    for (int i = 0; i < nlisted; i++)
        fprintf(f, "%s%d", i ? "," : "", listed[i]);
    int type = 0;
    socklen_t tlen = sizeof type;
    if (getsockopt(ORB_HP_FD, SOL_SOCKET, SO_TYPE, &type, &tlen) != 0)
        type = -1;
    int fdflags = fcntl(ORB_HP_FD, F_GETFD);
    sigset_t mask;
    sigprocmask(SIG_SETMASK, NULL, &mask);
    int blocked = 0;
    for (int sig = 1; sig < NSIG; sig++)
        if (sigismember(&mask, sig) == 1)
            blocked++;
    struct sigaction sa;
    sigaction(SIGPIPE, NULL, &sa);
    fprintf(f, "\nstdio_devnull=%d\nfd3_seqpacket=%d\nfd3_cloexec=%d\nblocked_signals=%d\n"
               "sigpipe_default=%d\n",
            is_devnull(0) && is_devnull(1) && is_devnull(2), type == SOCK_SEQPACKET,
            fdflags >= 0 && (fdflags & FD_CLOEXEC) != 0, blocked, sa.sa_handler == SIG_DFL);
    if (fclose(f) != 0)
        die("cannot close the report");
}

/* ---- serving --------------------------------------------------------------------------------- */

static uint8_t out[2 * ORB_HP_MAX_MSG];

/* Send the reply just encoded into `out`: `len` is read after the encoder ran. */
static void reply(const char *what, int rc, const size_t *len)
{
    if (rc != 0)
        die(what);
    send_raw(out, *len, NULL, 0);
}

static void serve_hello(const struct orb_hp_msg *m)
{
    uint32_t version = 0;
    size_t len = 0;
    if (orb_hp_decode_hello(m, &version) != 0)
        die("bad HELLO");
    uint32_t seq = m->hdr.sequence;
    switch (fault) {
    case F_HELLO_HANG: hang(); break;
    case F_HELLO_REFUSE:
        reply("hello", orb_hp_encode_status(ORB_HP_HELLO_REPLY, seq, ORB_EPERM, out, &len), &len);
        return;
    case F_HELLO_TYPE: {
        struct orb_hp_policy p;
        fake_policy(&p);
        reply("hello", orb_hp_encode_policy_reply(seq, 0, &p, out, &len), &len);
        return;
    }
    default: break;
    }
    uint32_t uid = (uint32_t)getuid() + (fault == F_HELLO_UID ? 1u : 0u);
    if (orb_hp_encode_hello_reply(seq, 0, uid, (uint32_t)getgid(), 0, out, &len) != 0)
        die("encode HELLO_REPLY");
    if (fault == F_HELLO_VERSION) {
        /* Header u16 version at offset 4, body u32 version after the status. */
        out[4] = 2;
        put_u32(out + ORB_HP_HEADER_LEN + 4, 2);
    }
    send_raw(out, len, NULL, 0);
}

static void serve_inventory(const struct orb_hp_msg *m, const struct orb_topo_inventory *inv)
{
    uint8_t kind = 0;
    uint32_t index = 0;
    size_t len = 0;
    if (orb_hp_decode_inventory(m, &kind, &index) != 0)
        die("bad INVENTORY");
    uint32_t seq = m->hdr.sequence;
    uint32_t total = kind == ORB_HP_INV_NIC   ? inv->nnics
                     : kind == ORB_HP_INV_GPU ? inv->ngpus
                                              : inv->nnuma;
    if (fault == F_EMPTY_INVENTORY)
        total = 0;
    if (index >= total) {
        reply("inventory",
              orb_hp_encode_status(ORB_HP_INVENTORY_REPLY, seq, ORB_ENOENT, out, &len), &len);
        return;
    }
    struct orb_topo_nic nic = inv->nics[index];
    if (kind == ORB_HP_INV_NIC && fault == F_COUNT_CHANGES && index == 1)
        total = 3;
    if (kind == ORB_HP_INV_NIC && fault == F_MISORDERED)
        nic.id = (uint8_t)(1 - index);
    reply("inventory",
          orb_hp_encode_inventory_reply(seq, 0, total, kind, &nic, &inv->gpus[index],
                                        &inv->numa[index], out, &len),
          &len);
}

static void serve_policy(const struct orb_hp_msg *m)
{
    uint32_t seq = m->hdr.sequence;
    size_t len = 0;
    struct orb_hp_policy p;
    fake_policy(&p);
    switch (fault) {
    case F_HANG: hang(); break;
    case F_DIE: exit(0);
    case F_WRONG_TYPE:
        reply("policy", orb_hp_encode_peermem_reply(seq, 0, 1, out, &len), &len);
        return;
    case F_WRONG_SEQ: seq++; break;
    case F_OVERSIZED:
        if (orb_hp_encode_policy_reply(seq, 0, &p, out, &len) != 0)
            die("encode POLICY_REPLY");
        memset(out + len, 0, sizeof out - len);
        put_u32(out + 8, ORB_HP_MAX_MSG + 16);
        send_raw(out, ORB_HP_MAX_MSG + 16, NULL, 0);
        return;
    case F_SHORT:
        if (orb_hp_encode_policy_reply(seq, 0, &p, out, &len) != 0)
            die("encode POLICY_REPLY");
        send_raw(out, 8, NULL, 0);
        return;
    default: break;
    }
    reply("policy", orb_hp_encode_policy_reply(seq, 0, &p, out, &len), &len);
}

static void serve_fd_request(const struct orb_hp_msg *m)
{
    char name[ORB_HP_NAME_MAX + 1];
    uint64_t interval = 0;
    uint16_t type = m->hdr.type;
    uint32_t seq = m->hdr.sequence;
    int rc = type == ORB_HP_OPEN_DEVICE ? orb_hp_decode_open_device(m, name)
                                        : orb_hp_decode_slot_attach(m, name, &interval);
    if (rc != 0)
        die("bad fd request");
    uint16_t rtype = (uint16_t)(type + 1);
    size_t len = 0;
    const char *expected = type == ORB_HP_OPEN_DEVICE ? FAKE_NIC_OK : FAKE_SLOT;
    int fds[2] = { open("/dev/null", O_RDONLY | O_CLOEXEC),
                   open("/dev/zero", O_RDONLY | O_CLOEXEC) };
    if (fds[0] < 0 || fds[1] < 0)
        die("cannot open /dev/null");
    int32_t status = 0;
    if (strcmp(name, expected) != 0)
        status = type == ORB_HP_OPEN_DEVICE && strcmp(name, FAKE_NIC_DENIED) == 0 ? ORB_EPERM
                                                                                  : ORB_ENOENT;
    if (type == ORB_HP_OPEN_DEVICE && fault == F_FD_ON_REFUSAL) {
        if (orb_hp_encode_status(rtype, seq, ORB_EPERM, out, &len) != 0)
            die("encode fd reply");
        send_raw(out, len, fds, 1);
    } else if (status != 0) {
        reply("fd reply", orb_hp_encode_status(rtype, seq, status, out, &len), &len);
    } else {
        if (orb_hp_encode_fd_reply(rtype, seq, 0, 1, out, &len) != 0)
            die("encode fd reply");
        size_t nfds = 1;
        if (type == ORB_HP_OPEN_DEVICE && fault == F_TWO_FDS)
            nfds = 2;
        if (type == ORB_HP_OPEN_DEVICE && fault == F_NO_FD)
            nfds = 0;
        send_raw(out, len, fds, nfds);
    }
    close(fds[0]);
    close(fds[1]);
}

static void serve_peermem(const struct orb_hp_msg *m)
{
    uint32_t seq = m->hdr.sequence;
    size_t len = 0;
    if (orb_hp_encode_peermem_reply(seq, 0, FAKE_PEERMEM_FOUND, out, &len) != 0)
        die("encode PEERMEM_REPLY");
    if (fault == F_BAD_STATUS) {
        if (orb_hp_encode_status(ORB_HP_PEERMEM_REPLY, seq, ORB_EPERM, out, &len) != 0)
            die("encode PEERMEM_REPLY");
        put_u32(out + ORB_HP_HEADER_LEN, 5);
    }
    if (fault == F_PEERMEM_BITS)
        put_u32(out + ORB_HP_HEADER_LEN + 4, FAKE_PEERMEM_FOUND | 0x8u);
    if (fault == F_FD_ON_PEERMEM) {
        int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        send_raw(out, len, &fd, 1);
        close(fd);
        return;
    }
    send_raw(out, len, NULL, 0);
}

static void serve_devx(const struct orb_hp_msg *m)
{
    struct orb_hp_devx_verify v;
    size_t len = 0;
    if (orb_hp_decode_devx_verify(m, &v) != 0)
        die("bad DEVX_VERIFY");
    int32_t status = strcmp(v.nic, FAKE_NIC_OK) != 0                                 ? ORB_EUNAVAILABLE
                     : v.key == FAKE_DEVX_KEY_OK && v.obj_handle == FAKE_DEVX_HANDLE_OK ? 0
                                                                                      : ORB_EPERM;
    if (orb_hp_encode_status(ORB_HP_DEVX_REPLY, m->hdr.sequence, status, out, &len) != 0)
        die("encode DEVX_REPLY");
    if (fault == F_TRAILING) {
        memset(out + len, 0, 4);
        len += 4;
        put_u32(out + 8, (uint32_t)len);
    }
    send_raw(out, len, NULL, 0);
}

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 3)
        die("usage: fake_helper MODE [REPORT]");
    size_t i;
    for (i = 0; i < sizeof modes / sizeof modes[0]; i++)
        if (strcmp(argv[1], modes[i].name) == 0)
            break;
    if (i == sizeof modes / sizeof modes[0])
        die("unknown mode");
    fault = modes[i].fault;
    if (argc == 3)
        write_report(argv[2], argv[0]);
    if (fault == F_HELLO_DIE)
        return 0;

    static struct orb_topo_inventory inv;
    fake_inventory(&inv);
    static uint8_t in[ORB_HP_MAX_MSG];
    for (;;) {
        size_t len = 0, nfds = 0;
        int rc = orb_hp_recv(ORB_HP_FD, in, &len, NULL, 0, &nfds, -1);
        if (rc == ORB_EPEER) {
            if (fault == F_LINGER)
                hang();
            return 0;
        }
        struct orb_hp_msg m;
        if (rc != 0 || orb_hp_parse(in, len, &m) != 0)
            die("bad datagram from the library");
        switch (m.hdr.type) {
        case ORB_HP_HELLO: serve_hello(&m); break;
        case ORB_HP_INVENTORY: serve_inventory(&m, &inv); break;
        case ORB_HP_POLICY: serve_policy(&m); break;
        case ORB_HP_OPEN_DEVICE:
        case ORB_HP_SLOT_ATTACH: serve_fd_request(&m); break;
        case ORB_HP_PEERMEM_PROBE: serve_peermem(&m); break;
        case ORB_HP_DEVX_VERIFY: serve_devx(&m); break;
        default: die("unexpected request type");
        }
    }
}
