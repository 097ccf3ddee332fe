/* Internal: proving that a peer engine runs on this host, for the same-host transport.
 *
 * Guessing from addresses is not proof (a loopback endpoint may be forwarded, a container has its
 * own network namespace, a host name says nothing). The proof is the kernel's:
 *  - both engines read this boot's id (/proc/sys/kernel/random/boot_id, a UUID the kernel draws
 *    at boot) and advertise it; equal ids make a same-host path worth trying, nothing more;
 *  - the requester then connects to the source's Unix socket, which only a process under the
 *    same kernel can reach, and each side sends a HELLO (its boot id, its source epoch or the
 *    epoch it expects, its pid); each side reads the other's pid and uid from the kernel
 *    (SO_PEERCRED) and orb_samehost_check() accepts the peer only when the HELLO agrees with the
 *    kernel and with what the TCP handshake proved (the epoch).
 *
 * HELLO, 80 bytes, integers little-endian:
 *   magic "ORBSHM\0\1" (8) | u16 version (1) | u16 flags (0) | u32 0 |
 *   boot id, 36 ASCII bytes (lower-case hex and '-', 8-4-4-4-12) | u32 0 |
 *   epoch (16) | u32 pid (> 0) | u32 0
 * A decoder takes exactly that length and fails closed (ORB_EPROTO) on anything else. */
#ifndef ORB_SAMEHOST_PROOF_H
#define ORB_SAMEHOST_PROOF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <orbite/orbite.h>

#define ORB_BOOT_ID_LEN 36u
#define ORB_SAMEHOST_HELLO_LEN 80u
#define ORB_SAMEHOST_VERSION 1u

struct orb_samehost_hello {
    char boot_id[ORB_BOOT_ID_LEN + 1]; /* NUL-terminated */
    struct orb_epoch epoch;
    uint32_t pid;
};

/* Whether s[0..n) is a boot id: 36 bytes, lower-case hex in groups 8-4-4-4-12 joined by '-'. */
bool orb_samehost_boot_id_valid(const char *s, size_t n);

/* This boot's id, read from sys/kernel/random/boot_id under the procfs directory `proc_dirfd`
 * (the library passes an fd of /proc; tests a fixture), into out (NUL-terminated). The file is
 * opened without following a final symlink and must be a regular file holding the id and one
 * newline. Errors: ORB_EUNAVAILABLE (no such file: not Linux procfs), ORB_EPROTO (not an id),
 * ORB_EINVAL. */
int orb_samehost_boot_id_at(int proc_dirfd, char out[ORB_BOOT_ID_LEN + 1]);

/* The same from /proc. */
int orb_samehost_boot_id(char out[ORB_BOOT_ID_LEN + 1]);

/* Encode `h` into buf (exactly ORB_SAMEHOST_HELLO_LEN bytes). Errors: ORB_EINVAL (NULL, a boot
 * id that is not one, pid 0). */
int orb_samehost_hello_encode(const struct orb_samehost_hello *h, uint8_t buf[ORB_SAMEHOST_HELLO_LEN]);

/* Decode a HELLO of `len` bytes into *out (written only on success). Errors: ORB_EPROTO (a length
 * other than ORB_SAMEHOST_HELLO_LEN, another magic or version, flags or reserved bytes not 0, a
 * boot id that is not one, pid 0), ORB_EINVAL (NULL). */
int orb_samehost_hello_decode(const uint8_t *buf, size_t len, struct orb_samehost_hello *out);

/* The pid and uid the kernel recorded for the other end of the connected Unix socket `fd`
 * (SO_PEERCRED). Errors: ORB_EINVAL (not a connected Unix socket), ORB_EUNAVAILABLE. */
int orb_samehost_peer_cred(int fd, uint32_t *pid_out, uint32_t *uid_out);

/* Accept `peer`'s HELLO when it was sent under this boot (`own_boot_id`), by the process the
 * kernel names (`cred_pid`), with `expected` as its epoch (the source's, as the TCP handshake
 * proved it; a source checks the requester's expectation of its own). Errors, each naming both
 * sides' values: ORB_EUNAVAILABLE (another boot: not this host, or the host rebooted), ORB_EPERM
 * (the HELLO's pid is not the connecting process's), ORB_ESTALE (another epoch), ORB_EINVAL. */
int orb_samehost_check(const struct orb_samehost_hello *peer, const char *own_boot_id, uint32_t cred_pid,
                       const struct orb_epoch *expected);

#endif
