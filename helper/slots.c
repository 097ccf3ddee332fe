/* Shared slot objects in /dev/shm: creation, checked attachment, and the one publisher.
 *
 * An object is created only by a helper: O_CREAT|O_EXCL|O_NOFOLLOW through the held directory
 * fd, the header written, then mode 0644 and the administrator as owner set on the fd. Any
 * other object under a slot name (a symlink, another owner or mode, a hard link, a short file)
 * is refused, so a tenant cannot squat a name: it cannot produce an administrator-owned object.
 * While a creator is between its O_EXCL open and its fchown, others see the wrong owner and
 * retry briefly before refusing.
 *
 * Publishing: whoever holds the non-blocking flock() of the object publishes it from
 * CLOCK_MONOTONIC every millisecond. The kernel drops the lock when its holder exits, and every
 * other helper attached read-write tries to take it over every ORB_SLOT_TAKEOVER_NS. The
 * library's descriptor is a separate read-only open (a different open file description), so it
 * can neither write the object nor hold the lock. */
#include "helper/helper.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "helper/sandbox.h"

#define ORB_SLOT_TAKEOVER_NS 10000000ull /* idle publisher check: every 10 ms */
#define ORB_SLOT_SETTLE_TRIES 20         /* ~20 ms for a concurrent creator to finish */

uint64_t orb_helper_now_ns(void)
{
    struct timespec ts;
    (void)clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The checks made on every open: regular file, the administrator's, mode 0644, one link,
 * exactly one page. Returns 0 or ORB_EPERM naming the first failure. */
static int check_object(const struct orb_helper_state *st, int fd, const char *name, struct stat *out)
{
    struct stat s;
    if (fstat(fd, &s) != 0)
        return orb_fail(ORB_EUNAVAILABLE, "slot %s: fstat: %s", name, strerror(errno));
    if (!S_ISREG(s.st_mode))
        return orb_fail(ORB_EPERM, "slot %s: not a regular file", name);
    if (s.st_uid != st->admin_uid)
        return orb_fail(ORB_EPERM, "slot %s: owned by uid %u, expected %u", name, (unsigned)s.st_uid,
                        (unsigned)st->admin_uid);
    if ((s.st_mode & 07777) != ORB_HELPER_SLOT_MODE)
        return orb_fail(ORB_EPERM, "slot %s: mode %04o, expected %04o", name, (unsigned)(s.st_mode & 07777),
                        ORB_HELPER_SLOT_MODE);
    if (s.st_nlink != 1)
        return orb_fail(ORB_EPERM, "slot %s: %lu links", name, (unsigned long)s.st_nlink);
    if (s.st_size != (off_t)ORB_HELPER_SLOT_SIZE)
        return orb_fail(ORB_EPERM, "slot %s: %lld bytes, expected %u", name, (long long)s.st_size,
                        ORB_HELPER_SLOT_SIZE);
    if (out)
        *out = s;
    return 0;
}

static struct orb_helper_slot *find_slot(struct orb_helper_state *st, const char *name)
{
    for (unsigned i = 0; i < ORB_HP_MAX_SLOTS; i++)
        if (st->slots[i].name[0] != '\0' && strcmp(st->slots[i].name, name) == 0)
            return &st->slots[i];
    return NULL;
}

static struct orb_helper_slot *unused_slot(struct orb_helper_state *st)
{
    for (unsigned i = 0; i < ORB_HP_MAX_SLOTS; i++)
        if (st->slots[i].name[0] == '\0')
            return &st->slots[i];
    return NULL;
}

static int random_epoch(uint64_t *out)
{
    uint64_t v = 0;
    for (int tries = 0; tries < 8 && v == 0; tries++) {
        if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v)
            v = 0;
    }
    if (v == 0)
        return orb_fail(ORB_EUNAVAILABLE, "slot: no random publisher epoch");
    *out = v;
    return 0;
}

/* Validate a mapped object against our clock domain and the requested interval. */
static int validate_header(const struct orb_helper_state *st, const void *map, uint64_t interval_ns)
{
    struct orb_slots_reader r;
    return orb_slots_reader_open(map, ORB_HELPER_SLOT_SIZE, &st->domain, interval_ns, 0, &r);
}

/* Remove the object we created under `name`, but only if the name still refers to it. */
static void unlink_ours(const struct orb_helper_state *st, const char *name, int fd)
{
    struct stat ours, there;
    if (fstat(fd, &ours) == 0 && fstatat(st->shm_fd, name, &there, AT_SYMLINK_NOFOLLOW) == 0 &&
        ours.st_dev == there.st_dev && ours.st_ino == there.st_ino)
        (void)unlinkat(st->shm_fd, name, 0);
}

/* Create the object. 1: it already exists (nothing done); 0: created, locked and published by
 * us, `slot` filled; negative: failed (nothing left behind). */
/* Record an attached object in `slot` (a free entry); `s` is the object's checked identity. */
static void slot_set(struct orb_helper_slot *slot, const char *name, int fd, bool writable, bool publisher,
                     void *map, uint64_t interval_ns, const struct stat *s)
{
    memset(slot, 0, sizeof *slot);
    memcpy(slot->name, name, strlen(name) + 1);
    slot->fd = fd;
    slot->writable = writable;
    slot->publisher = publisher;
    slot->map = map;
    slot->interval_ns = interval_ns;
    slot->dev = s->st_dev;
    slot->ino = s->st_ino;
}

static int create_object(struct orb_helper_state *st, const char *name, uint64_t interval_ns,
                         struct orb_helper_slot *slot)
{
    int fd = openat(st->shm_fd, name, ORB_SANDBOX_SLOT_CREATE_FLAGS, 0600);
    if (fd < 0) {
        if (errno == EEXIST)
            return 1; /* a file, a symlink or anything else: attach_existing() decides */
        return orb_fail(ORB_EUNAVAILABLE, "slot %s: create: %s", name, strerror(errno));
    }
    int rc;
    void *map = MAP_FAILED;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        rc = orb_fail(ORB_EUNAVAILABLE, "slot %s: cannot lock the new object: %s", name, strerror(errno));
        goto remove_object;
    }
    if (ftruncate(fd, ORB_HELPER_SLOT_SIZE) != 0) {
        rc = orb_fail(ORB_EUNAVAILABLE, "slot %s: ftruncate: %s", name, strerror(errno));
        goto remove_object;
    }
    map = mmap(NULL, ORB_HELPER_SLOT_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        rc = orb_fail(ORB_EUNAVAILABLE, "slot %s: mmap: %s", name, strerror(errno));
        goto remove_object;
    }
    struct orb_slots_params params = {.interval_ns = interval_ns, .domain = st->domain, .now_ns = orb_helper_now_ns()};
    if ((rc = random_epoch(&params.publisher_epoch)) != 0)
        goto unmap;
    if ((rc = orb_slots_encode(map, ORB_HELPER_SLOT_SIZE, &params)) != 0)
        goto unmap;
    /* Mode first, while we still own it; then the owner, which makes the object valid. */
    if (fchmod(fd, ORB_HELPER_SLOT_MODE) != 0) {
        rc = orb_fail(ORB_EUNAVAILABLE, "slot %s: fchmod: %s", name, strerror(errno));
        goto unmap;
    }
    if (st->admin_uid != geteuid() || st->admin_gid != (gid_t)-1) {
        int raised = orb_sandbox_raise(CAP_CHOWN);
        int ok = raised >= 0 && fchown(fd, st->admin_uid, st->admin_gid) == 0;
        int err = errno;
        if (raised > 0)
            orb_sandbox_lower();
        if (!ok) {
            rc = orb_fail(ORB_EUNAVAILABLE, "slot %s: cannot give the object to uid %u (CAP_CHOWN): %s", name,
                          (unsigned)st->admin_uid, strerror(err));
            goto unmap;
        }
    }
    struct stat s;
    if ((rc = check_object(st, fd, name, &s)) != 0)
        goto unmap;
    slot_set(slot, name, fd, true, true, map, interval_ns, &s);
    return 0;
unmap:
    munmap(map, ORB_HELPER_SLOT_SIZE);
remove_object:
    unlink_ours(st, name, fd);
    close(fd);
    return rc;
}

/* Attach an existing object. ORB_EAGAIN: it vanished or is still being created (retry). */
static int attach_existing(struct orb_helper_state *st, const char *name, uint64_t interval_ns,
                           struct orb_helper_slot *slot)
{
    const int base = O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK;
    int raised = orb_sandbox_raise(CAP_DAC_OVERRIDE);
    int fd = raised >= 0 ? openat(st->shm_fd, name, O_RDWR | base) : -1;
    int err = errno;
    if (raised > 0)
        orb_sandbox_lower();
    bool writable = fd >= 0;
    if (fd < 0 && err == EACCES) {
        /* Not ours and no override: attach read-only, never publish. */
        fd = openat(st->shm_fd, name, O_RDONLY | base);
        err = errno;
    }
    if (fd < 0) {
        if (err == ENOENT)
            return ORB_EAGAIN;
        if (err == ELOOP)
            return orb_fail(ORB_EPERM, "slot %s: is a symbolic link", name);
        if (err == EISDIR || err == ENXIO || err == ENODEV)
            return orb_fail(ORB_EPERM, "slot %s: not a regular file", name);
        if (err == EACCES)
            return ORB_EAGAIN; /* a creator's private 0600 object, or a squatter's */
        return orb_fail(ORB_EUNAVAILABLE, "slot %s: open: %s", name, strerror(err));
    }
    struct stat s;
    int rc = check_object(st, fd, name, &s);
    if (rc != 0) {
        close(fd);
        /* A creator between its O_EXCL open and its fchown looks exactly like a squatter:
         * retry for a while either way. */
        return rc == ORB_EPERM ? ORB_EAGAIN : rc;
    }
    void *map = mmap(NULL, ORB_HELPER_SLOT_SIZE, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        rc = orb_fail(ORB_EUNAVAILABLE, "slot %s: mmap: %s", name, strerror(errno));
        close(fd);
        return rc;
    }
    bool publisher = writable && flock(fd, LOCK_EX | LOCK_NB) == 0;
    rc = validate_header(st, map, interval_ns);
    if (rc != 0) {
        munmap(map, ORB_HELPER_SLOT_SIZE);
        close(fd); /* also drops the lock if we took it */
        return rc;
    }
    slot_set(slot, name, fd, writable, publisher, map, interval_ns, &s);
    if (publisher)
        orb_slots_publish(map, orb_helper_now_ns());
    return 0;
}

/* The library's descriptor: a second, read-only open of the same object. */
static int open_for_library(const struct orb_helper_state *st, const struct orb_helper_slot *slot, int *out)
{
    int fd = openat(st->shm_fd, slot->name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0)
        return orb_fail(ORB_EPERM, "slot %s: re-open: %s", slot->name, strerror(errno));
    struct stat s;
    int rc = check_object(st, fd, slot->name, &s);
    if (rc == 0 && (s.st_dev != slot->dev || s.st_ino != slot->ino))
        rc = orb_fail(ORB_EPERM, "slot %s: replaced while attaching", slot->name);
    if (rc != 0) {
        close(fd);
        return rc;
    }
    *out = fd;
    return 0;
}

int orb_helper_slot_open_shared(struct orb_helper_state *st, const char *name, uint64_t interval_ns, int *ro_fd)
{
    if (st == NULL || name == NULL || ro_fd == NULL || !orb_hp_name_valid(name, strlen(name)))
        return orb_fail(ORB_EINVAL, "slot: bad arguments");
    if (interval_ns < ORB_SLOTS_MIN_INTERVAL_NS || interval_ns > ORB_SLOTS_MAX_INTERVAL_NS)
        return orb_fail(ORB_EINVAL, "slot %s: interval %llu ns out of bounds", name, (unsigned long long)interval_ns);
    if (st->shm_fd < 0)
        return orb_fail(ORB_EUNAVAILABLE, "slot %s: no shared memory directory", name);
    if (!st->domain_ok)
        return orb_fail(ORB_EUNAVAILABLE, "slot %s: the clock domain is unknown", name);

    struct orb_helper_slot *slot = find_slot(st, name);
    if (slot != NULL) {
        if (slot->interval_ns != interval_ns)
            return orb_fail(ORB_ECONFIG, "slot %s: attached with interval %llu ns", name,
                            (unsigned long long)slot->interval_ns);
        if (slot->dead)
            return orb_fail(ORB_EPROTO, "slot %s: the object was damaged", name);
        return open_for_library(st, slot, ro_fd);
    }
    slot = unused_slot(st);
    if (slot == NULL)
        return orb_fail(ORB_ERESOURCE, "slot %s: %u slot objects already attached", name, ORB_HP_MAX_SLOTS);

    struct orb_helper_slot fresh;
    int rc = ORB_EAGAIN;
    for (int attempt = 0; attempt < ORB_SLOT_SETTLE_TRIES && rc == ORB_EAGAIN; attempt++) {
        if (attempt > 0)
            (void)poll(NULL, 0, 1); /* let a concurrent creator finish */
        rc = create_object(st, name, interval_ns, &fresh);
        if (rc == 1)
            rc = attach_existing(st, name, interval_ns, &fresh);
    }
    if (rc == ORB_EAGAIN)
        rc = orb_fail(ORB_EPERM, "slot %s: the name is held by an object this helper cannot accept", name);
    if (rc != 0)
        return rc;
    rc = open_for_library(st, &fresh, ro_fd);
    if (rc != 0) {
        munmap(fresh.map, ORB_HELPER_SLOT_SIZE);
        close(fresh.fd);
        return rc;
    }
    *slot = fresh;
    return 0;
}

bool orb_helper_slots_tick(struct orb_helper_state *st, uint64_t now_ns)
{
    bool any = false;
    bool takeover = now_ns >= st->next_takeover_ns;
    if (takeover)
        st->next_takeover_ns = now_ns + ORB_SLOT_TAKEOVER_NS;
    for (unsigned i = 0; i < ORB_HP_MAX_SLOTS; i++) {
        struct orb_helper_slot *s = &st->slots[i];
        if (s->name[0] == '\0')
            continue;
        any = true;
        if (s->publisher) {
            orb_slots_publish(s->map, now_ns);
            continue;
        }
        if (!takeover || !s->writable || s->dead || flock(s->fd, LOCK_EX | LOCK_NB) != 0)
            continue;
        /* The previous publisher is gone. Publish only into an object that is still sound. */
        if (validate_header(st, s->map, s->interval_ns) != 0) {
            s->dead = true;
            (void)flock(s->fd, LOCK_UN);
            continue;
        }
        s->publisher = true;
        orb_slots_publish(s->map, now_ns);
    }
    return any;
}
