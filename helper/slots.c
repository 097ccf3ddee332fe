/* Shared slot objects in /dev/shm: creation, checked attachment, and the one publisher. This
 * runs in the monitor (sandbox.h), the only process of a helper that holds the capabilities.
 *
 * The private directory. Every helper of the host shares one directory in /dev/shm,
 * ORB_HELPER_PRIVATE_DIR, owned by the administrator with mode 0700: no tenant can enter it.
 * It holds objects under construction and the publication locks.
 *
 * Creation. A new object is created under a random name in the private directory, its header
 * written, then given mode 0644 and the administrator as owner, and only then moved to its
 * final name in /dev/shm with renameat2(RENAME_NOREPLACE). So it is never reachable under any
 * name a tenant can open before it is complete and the administrator's, and an existing name
 * is never replaced. Any other object under a slot name (a symlink, another owner or mode, a
 * hard link, a short file) is refused: a tenant cannot squat a name, because it cannot produce
 * an administrator-owned object.
 *
 * Publishing. Whoever holds the non-blocking flock() of the object's lock file publishes it from
 * CLOCK_MONOTONIC every millisecond. The lock file lives in the private directory, named after
 * the object's inode, so that only helpers can take it (a flock() on the 0644 object itself
 * would be open to any reader). The kernel drops the lock when its holder exits, and every
 * other helper attached read-write tries to take it over every ORB_SLOT_TAKEOVER_NS. The
 * library's descriptor is a separate read-only open, which can neither write the object nor
 * reach its lock. */
#include "helper/helper.h"

#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <poll.h>
#include <stdio.h>
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
#define ORB_SLOT_SETTLE_TRIES 20         /* attempts when the name appears and vanishes under us */

uint64_t orb_helper_now_ns(void)
{
    struct timespec ts;
    (void)clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The name of an object's second link, in the private directory: "obj+<inode, hex>". */
static void object_link(ino_t ino, char *buf, size_t len)
{
    snprintf(buf, len, "obj+%llx", (unsigned long long)ino);
}

/* The checks made on every object: regular file, the administrator's, mode 0644, exactly one
 * page, and two links: its name and its link in the private directory, which only a helper can
 * have made. Returns 0 or ORB_EPERM naming the first failure. */
static int check_stat(const struct orb_helper_state *st, int dir, const struct stat *s, const char *name)
{
    if (S_ISLNK(s->st_mode))
        return orb_fail(ORB_EPERM, "slot %s: is a symbolic link", name);
    if (!S_ISREG(s->st_mode))
        return orb_fail(ORB_EPERM, "slot %s: not a regular file", name);
    if (s->st_uid != st->admin_uid)
        return orb_fail(ORB_EPERM, "slot %s: owned by uid %u, expected %u", name, (unsigned)s->st_uid,
                        (unsigned)st->admin_uid);
    if ((s->st_mode & 07777) != ORB_HELPER_SLOT_MODE)
        return orb_fail(ORB_EPERM, "slot %s: mode %04o, expected %04o", name, (unsigned)(s->st_mode & 07777),
                        ORB_HELPER_SLOT_MODE);
    if (s->st_size != (off_t)ORB_HELPER_SLOT_SIZE)
        return orb_fail(ORB_EPERM, "slot %s: %lld bytes, expected %u", name, (long long)s->st_size,
                        ORB_HELPER_SLOT_SIZE);
    if (s->st_nlink != 2)
        return orb_fail(ORB_EPERM, "slot %s: %lu links, expected 2", name, (unsigned long)s->st_nlink);
    char link[32];
    object_link(s->st_ino, link, sizeof link);
    struct stat l;
    if (fstatat(dir, link, &l, AT_SYMLINK_NOFOLLOW) != 0 || l.st_dev != s->st_dev || l.st_ino != s->st_ino)
        return orb_fail(ORB_EPERM, "slot %s: not made by a helper of this name (no link in %s/%s)", name,
                        ORB_HELPER_PRIVATE_DIR, name);
    return 0;
}

static int check_object(const struct orb_helper_state *st, int dir, int fd, const char *name, struct stat *out)
{
    struct stat s;
    if (fstat(fd, &s) != 0)
        return orb_fail(ORB_EUNAVAILABLE, "slot %s: fstat: %s", name, strerror(errno));
    int rc = check_stat(st, dir, &s, name);
    if (rc == 0 && out)
        *out = s;
    return rc;
}

/* What `name` in /dev/shm is now, without opening it for reading or writing (O_PATH): the
 * monitor never reads or writes a file of /dev/shm through its name. 0, ORB_EAGAIN (absent),
 * or ORB_EUNAVAILABLE. */
static int stat_name(const struct orb_helper_state *st, const char *name, struct stat *out)
{
    int fd = openat(st->shm_fd, name, ORB_SANDBOX_SLOT_NAME_FLAGS);
    if (fd < 0)
        return errno == ENOENT ? ORB_EAGAIN : orb_fail(ORB_EUNAVAILABLE, "slot %s: open: %s", name, strerror(errno));
    int rc = fstat(fd, out) == 0 ? 0 : orb_fail(ORB_EUNAVAILABLE, "slot %s: fstat: %s", name, strerror(errno));
    (void)close(fd);
    return rc;
}

/* A listing of the directory open at `fd`, through a duplicate (readdir moves the offset, and
 * closedir closes the descriptor it was given): NULL with errno when it cannot be had. */
static DIR *list_dir(int fd)
{
    int walk = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    DIR *d = walk >= 0 ? fdopendir(walk) : NULL;
    if (d == NULL && walk >= 0) {
        int err = errno;
        close(walk);
        errno = err;
    }
    return d;
}

/* Remove the private links of objects whose name is gone (an administrator removed them): a
 * link count of 1 is the private link alone. Best effort. */
static void collect_orphans(int dir)
{
    DIR *d = list_dir(dir);
    if (d == NULL)
        return;
    struct dirent *e;
    for (unsigned seen = 0; seen < 4096 && (e = readdir(d)) != NULL; seen++) {
        struct stat s;
        if (strncmp(e->d_name, "obj+", 4) == 0 && fstatat(dir, e->d_name, &s, AT_SYMLINK_NOFOLLOW) == 0 &&
            S_ISREG(s.st_mode) && s.st_nlink == 1)
            (void)unlinkat(dir, e->d_name, 0);
    }
    closedir(d);
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

/* Record an attached object in `slot` (a free entry); `s` is the object's checked identity. */
static void slot_set(struct orb_helper_slot *slot, const char *name, int fd, int lock_fd, bool writable,
                     bool publisher, void *map, uint64_t interval_ns, const struct stat *s)
{
    memset(slot, 0, sizeof *slot);
    memcpy(slot->name, name, strlen(name) + 1);
    slot->fd = fd;
    slot->lock_fd = lock_fd;
    slot->writable = writable;
    slot->publisher = publisher;
    slot->map = map;
    slot->interval_ns = interval_ns;
    slot->dev = s->st_dev;
    slot->ino = s->st_ino;
}

/* The lock file of the object with inode `ino`, opened (created when first needed) in its
 * directory. Inode numbers are not reused while any helper still holds the object, so a lock
 * file left by a removed object is never held by a live publisher of another. */
static int open_lock(int dir, const char *name, ino_t ino, int *out)
{
    char lock[32];
    snprintf(lock, sizeof lock, "lock+%llx", (unsigned long long)ino);
    int fd = openat(dir, lock, ORB_SANDBOX_LOCK_FLAGS, 0600);
    if (fd < 0)
        return orb_fail(ORB_EUNAVAILABLE, "slot %s: lock file: %s", name, strerror(errno));
    *out = fd;
    return 0;
}

/* Create the object. 1: the name exists already (nothing done); 0: created, `slot` filled;
 * negative: failed (nothing left behind). */
static int create_object(struct orb_helper_state *st, int dir, const char *name, uint64_t interval_ns,
                         struct orb_helper_slot *slot)
{
    uint64_t salt = 0;
    int rc = random_epoch(&salt);
    if (rc != 0)
        return rc;
    char tmp[32];
    snprintf(tmp, sizeof tmp, "new+%016llx", (unsigned long long)salt);
    collect_orphans(dir);
    int fd = openat(dir, tmp, ORB_SANDBOX_SLOT_CREATE_FLAGS, 0600);
    if (fd < 0)
        return orb_fail(ORB_EUNAVAILABLE, "slot %s: create in the private directory: %s", name, strerror(errno));
    void *map = MAP_FAILED;
    int lock_fd = -1;
    char link[32] = "";
    struct stat fresh;
    if (fstat(fd, &fresh) != 0) {
        rc = orb_fail(ORB_EUNAVAILABLE, "slot %s: fstat: %s", name, strerror(errno));
        goto remove_new;
    }
    /* The second link, by which helpers (and only they) open the object later. */
    object_link(fresh.st_ino, link, sizeof link);
    if (linkat(dir, tmp, dir, link, 0) != 0) {
        rc = orb_fail(ORB_EUNAVAILABLE, "slot %s: link in the private directory: %s", name, strerror(errno));
        link[0] = '\0';
        goto remove_new;
    }
    if (ftruncate(fd, ORB_HELPER_SLOT_SIZE) != 0) {
        rc = orb_fail(ORB_EUNAVAILABLE, "slot %s: ftruncate: %s", name, strerror(errno));
        goto remove_new;
    }
    map = mmap(NULL, ORB_HELPER_SLOT_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        rc = orb_fail(ORB_EUNAVAILABLE, "slot %s: mmap: %s", name, strerror(errno));
        goto remove_new;
    }
    struct orb_slots_params params = {.interval_ns = interval_ns, .domain = st->domain, .now_ns = orb_helper_now_ns()};
    if ((rc = random_epoch(&params.publisher_epoch)) != 0)
        goto unmap;
    if ((rc = orb_slots_encode(map, ORB_HELPER_SLOT_SIZE, &params)) != 0)
        goto unmap;
    /* Mode first, while it is still ours; then the owner, which makes the object valid. */
    if (fchmod(fd, ORB_HELPER_SLOT_MODE) != 0) {
        rc = orb_fail(ORB_EUNAVAILABLE, "slot %s: fchmod: %s", name, strerror(errno));
        goto unmap;
    }
    if (st->admin_uid != geteuid() || st->admin_gid != (gid_t)-1) {
        if (fchown(fd, st->admin_uid, st->admin_gid) != 0) {
            rc = orb_fail(ORB_EUNAVAILABLE, "slot %s: cannot give the object to uid %u (CAP_CHOWN): %s", name,
                          (unsigned)st->admin_uid, strerror(errno));
            goto unmap;
        }
    }
    struct stat s;
    if ((rc = check_object(st, dir, fd, name, &s)) != 0)
        goto unmap;
    if ((rc = open_lock(dir, name, s.st_ino, &lock_fd)) != 0)
        goto unmap;
    bool publisher = flock(lock_fd, LOCK_EX | LOCK_NB) == 0;
    /* Complete and the administrator's: now it may have a name, if the name is still free. */
    if (renameat2(dir, tmp, st->shm_fd, name, RENAME_NOREPLACE) != 0) {
        int err = errno;
        rc = err == EEXIST ? 1 : orb_fail(ORB_EUNAVAILABLE, "slot %s: publish the name: %s", name, strerror(err));
        goto close_lock;
    }
    slot_set(slot, name, fd, lock_fd, true, publisher, map, interval_ns, &s);
    slot->dir_fd = dir;
    return 0;
close_lock:
    close(lock_fd);
unmap:
    munmap(map, ORB_HELPER_SLOT_SIZE);
remove_new:
    if (link[0] != '\0')
        (void)unlinkat(dir, link, 0);
    (void)unlinkat(dir, tmp, 0);
    close(fd);
    return rc;
}

/* Attach an existing object. ORB_EAGAIN: it vanished (retry). */
static int attach_existing(struct orb_helper_state *st, int dir, const char *name, uint64_t interval_ns,
                           struct orb_helper_slot *slot)
{
    struct stat named;
    int rc = stat_name(st, name, &named);
    if (rc != 0)
        return rc;
    if ((rc = check_stat(st, dir, &named, name)) != 0)
        return rc;
    /* Open it through its private link: read-write to publish, read-only without the override. */
    char link[32];
    object_link(named.st_ino, link, sizeof link);
    int fd = openat(dir, link, O_RDWR | ORB_SANDBOX_SLOT_OPEN_BASE);
    int err = errno;
    bool writable = fd >= 0;
    if (fd < 0 && err == EACCES) {
        fd = openat(dir, link, O_RDONLY | ORB_SANDBOX_SLOT_OPEN_BASE);
        err = errno;
    }
    if (fd < 0)
        return err == ENOENT ? ORB_EAGAIN : orb_fail(ORB_EUNAVAILABLE, "slot %s: open: %s", name, strerror(err));
    struct stat s;
    rc = check_object(st, dir, fd, name, &s);
    if (rc == 0 && (s.st_dev != named.st_dev || s.st_ino != named.st_ino))
        rc = ORB_EAGAIN; /* replaced in between: look again */
    if (rc != 0) {
        close(fd);
        return rc;
    }
    void *map = mmap(NULL, ORB_HELPER_SLOT_SIZE, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        rc = orb_fail(ORB_EUNAVAILABLE, "slot %s: mmap: %s", name, strerror(errno));
        close(fd);
        return rc;
    }
    int lock_fd = -1;
    if (writable && (rc = open_lock(dir, name, s.st_ino, &lock_fd)) != 0) {
        munmap(map, ORB_HELPER_SLOT_SIZE);
        close(fd);
        return rc;
    }
    bool publisher = lock_fd >= 0 && flock(lock_fd, LOCK_EX | LOCK_NB) == 0;
    rc = validate_header(st, map, interval_ns);
    if (rc != 0) {
        munmap(map, ORB_HELPER_SLOT_SIZE);
        if (lock_fd >= 0)
            close(lock_fd); /* also drops the lock if we took it */
        close(fd);
        return rc;
    }
    slot_set(slot, name, fd, lock_fd, writable, publisher, map, interval_ns, &s);
    slot->dir_fd = dir;
    if (publisher)
        orb_slots_publish(map, orb_helper_now_ns());
    return 0;
}

/* ---- the private directory -------------------------------------------------------------- */

static int check_private_dir(const struct orb_helper_state *st, int fd)
{
    struct stat s;
    if (fstat(fd, &s) != 0)
        return orb_fail(ORB_EUNAVAILABLE, "slots: fstat of %s: %s", ORB_HELPER_PRIVATE_DIR, strerror(errno));
    if (!S_ISDIR(s.st_mode) || s.st_uid != st->admin_uid || (s.st_mode & 07777) != 0700)
        return orb_fail(ORB_EPERM, "slots: %s is not the administrator's mode 0700 directory (uid %u, mode %04o)",
                        ORB_HELPER_PRIVATE_DIR, (unsigned)s.st_uid, (unsigned)(s.st_mode & 07777));
    return 0;
}

/* Whether the directory open at `fd` has entries besides . and .. (1), none (0), or cannot be
 * read (negative). */
static int private_dir_has_entries(int fd)
{
    DIR *d = list_dir(fd);
    if (d == NULL)
        return orb_fail(ORB_EUNAVAILABLE, "slots: cannot list %s: %s", ORB_HELPER_PRIVATE_DIR, strerror(errno));
    int found = 0;
    struct dirent *e;
    while (found == 0 && (e = readdir(d)) != NULL)
        found = strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return found;
}

/* Make the directory we just created with mkdirat() the administrator's. Until the fchown()
 * it belongs to the tenant, whose other processes may have put entries in it: it is accepted
 * only empty, once nobody but the administrator can add any. */
static int finish_private_dir(const struct orb_helper_state *st, int fd)
{
    struct stat s;
    if (fstat(fd, &s) != 0 || !S_ISDIR(s.st_mode) || s.st_uid != geteuid())
        return orb_fail(ORB_EPERM, "slots: %s changed while being created", ORB_HELPER_PRIVATE_DIR);
    if (fchmod(fd, 0700) != 0)
        return orb_fail(ORB_EUNAVAILABLE, "slots: fchmod of %s: %s", ORB_HELPER_PRIVATE_DIR, strerror(errno));
    if ((st->admin_uid != geteuid() || st->admin_gid != (gid_t)-1) && fchown(fd, st->admin_uid, st->admin_gid) != 0)
        return orb_fail(ORB_EUNAVAILABLE, "slots: cannot give %s to uid %u (CAP_CHOWN): %s", ORB_HELPER_PRIVATE_DIR,
                        (unsigned)st->admin_uid, strerror(errno));
    int entries = private_dir_has_entries(fd);
    if (entries < 0)
        return entries;
    if (entries > 0)
        return orb_fail(ORB_EPERM, "slots: %s was tampered with while being created; an administrator must remove it",
                        ORB_HELPER_PRIVATE_DIR);
    return check_private_dir(st, fd);
}

int orb_helper_slots_prepare(struct orb_helper_state *st)
{
    if (st->shm_fd < 0)
        return orb_fail(ORB_EUNAVAILABLE, "slots: no shared memory directory");
    if (st->priv_fd >= 0)
        return 0;
    const int flags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
    for (int attempt = 0; attempt < 8; attempt++) {
        int fd = openat(st->shm_fd, ORB_HELPER_PRIVATE_DIR, flags);
        if (fd >= 0) {
            int rc = check_private_dir(st, fd);
            if (rc != 0) {
                close(fd);
                return rc;
            }
            st->priv_fd = fd;
            return 0;
        }
        if (errno == ELOOP || errno == ENOTDIR)
            return orb_fail(ORB_EPERM, "slots: %s is not a directory", ORB_HELPER_PRIVATE_DIR);
        if (errno != ENOENT)
            return orb_fail(ORB_EUNAVAILABLE, "slots: open %s: %s", ORB_HELPER_PRIVATE_DIR, strerror(errno));
        if (mkdirat(st->shm_fd, ORB_HELPER_PRIVATE_DIR, 0700) != 0) {
            if (errno == EEXIST)
                continue; /* another helper made it: open and check it */
            return orb_fail(ORB_EUNAVAILABLE, "slots: create %s: %s", ORB_HELPER_PRIVATE_DIR, strerror(errno));
        }
        fd = openat(st->shm_fd, ORB_HELPER_PRIVATE_DIR, flags);
        if (fd < 0)
            return orb_fail(ORB_EPERM, "slots: %s vanished while being created", ORB_HELPER_PRIVATE_DIR);
        int rc = finish_private_dir(st, fd);
        if (rc != 0) {
            /* Leave no half-made directory behind (it goes only while empty). */
            close(fd);
            (void)unlinkat(st->shm_fd, ORB_HELPER_PRIVATE_DIR, AT_REMOVEDIR);
            return rc;
        }
        st->priv_fd = fd;
        return 0;
    }
    return orb_fail(ORB_EUNAVAILABLE, "slots: %s keeps changing", ORB_HELPER_PRIVATE_DIR);
}

/* The library's descriptor: a second, read-only open of the same object. */
static int open_for_library(const struct orb_helper_state *st, const struct orb_helper_slot *slot, int *out)
{
    struct stat named;
    int rc = stat_name(st, slot->name, &named);
    if (rc == ORB_EAGAIN || (rc == 0 && (named.st_dev != slot->dev || named.st_ino != slot->ino)))
        return orb_fail(ORB_EPERM, "slot %s: replaced or removed while attached", slot->name);
    if (rc != 0)
        return rc;
    char link[32];
    object_link(slot->ino, link, sizeof link);
    int fd = openat(slot->dir_fd, link, O_RDONLY | ORB_SANDBOX_SLOT_OPEN_BASE);
    if (fd < 0)
        return orb_fail(ORB_EPERM, "slot %s: re-open: %s", slot->name, strerror(errno));
    struct stat s;
    rc = check_object(st, slot->dir_fd, fd, slot->name, &s);
    if (rc == 0 && (s.st_dev != slot->dev || s.st_ino != slot->ino))
        rc = orb_fail(ORB_EPERM, "slot %s: replaced while attaching", slot->name);
    if (rc != 0) {
        close(fd);
        return rc;
    }
    *out = fd;
    return 0;
}

/* The directory of slot `name` in the private one, from st->slot_dirs, opened (and created) here
 * when it is not there yet, which only an unsealed helper may do. */
static int slot_dir(struct orb_helper_state *st, const char *name, int *out)
{
    struct orb_helper_slot_dir *free_entry = NULL;
    for (unsigned i = 0; i < ORB_HP_MAX_SLOTS; i++) {
        struct orb_helper_slot_dir *d = &st->slot_dirs[i];
        if (d->name[0] != '\0' && strcmp(d->name, name) == 0) {
            *out = d->fd;
            return 0;
        }
        if (d->name[0] == '\0' && free_entry == NULL)
            free_entry = d;
    }
    if (st->sealed)
        return orb_fail(ORB_EUNAVAILABLE, "slot %s: its directory was not prepared at start-up", name);
    if (free_entry == NULL)
        return orb_fail(ORB_ERESOURCE, "slot %s: %u slot directories already open", name, ORB_HP_MAX_SLOTS);
    const int flags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
    int fd = openat(st->priv_fd, name, flags);
    if (fd < 0 && errno == ENOENT) {
        /* Only helpers can write here: a directory another helper made at the same time is as
         * good as ours. */
        if (mkdirat(st->priv_fd, name, 0700) != 0 && errno != EEXIST)
            return orb_fail(ORB_EUNAVAILABLE, "slot %s: create its directory: %s", name, strerror(errno));
        fd = openat(st->priv_fd, name, flags);
        struct stat s;
        if (fd >= 0 && fstat(fd, &s) == 0 && s.st_uid == geteuid())
            (void)fchmod(fd, 0700); /* whatever the umask made of it */
    }
    if (fd < 0)
        return orb_fail(errno == ELOOP || errno == ENOTDIR ? ORB_EPERM : ORB_EUNAVAILABLE,
                        "slot %s: its directory: %s", name, strerror(errno));
    memcpy(free_entry->name, name, strlen(name) + 1);
    free_entry->fd = fd;
    *out = fd;
    return 0;
}

int orb_helper_slots_prepare_names(struct orb_helper_state *st)
{
    if (st->priv_fd < 0)
        return orb_fail(ORB_EUNAVAILABLE, "slots: no private directory");
    int first = 0;
    for (uint32_t i = 0; i < st->allowed.nslots && i < ORB_HP_MAX_SLOTS; i++) {
        int fd = -1;
        int rc = slot_dir(st, st->allowed.slots[i], &fd);
        if (rc != 0 && first == 0)
            first = rc;
    }
    return first;
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
    if (st->priv_fd < 0)
        return orb_fail(ORB_EUNAVAILABLE, "slot %s: no private directory (%s)", name, ORB_HELPER_PRIVATE_DIR);

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

    int dir = -1;
    int rc = slot_dir(st, name, &dir);
    if (rc != 0)
        return rc;
    struct orb_helper_slot fresh;
    rc = ORB_EAGAIN;
    for (int attempt = 0; attempt < ORB_SLOT_SETTLE_TRIES && rc == ORB_EAGAIN; attempt++) {
        if (attempt > 0)
            (void)poll(NULL, 0, 1); /* the name appeared and vanished: an administrator at work */
        rc = create_object(st, dir, name, interval_ns, &fresh);
        if (rc == 1)
            rc = attach_existing(st, dir, name, interval_ns, &fresh);
    }
    if (rc == ORB_EAGAIN)
        rc = orb_fail(ORB_EUNAVAILABLE, "slot %s: the name keeps appearing and vanishing", name);
    if (rc != 0)
        return rc;
    rc = open_for_library(st, &fresh, ro_fd);
    if (rc != 0) {
        munmap(fresh.map, ORB_HELPER_SLOT_SIZE);
        if (fresh.lock_fd >= 0)
            close(fresh.lock_fd);
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
        if (!takeover || !s->writable || s->dead || s->lock_fd < 0 || flock(s->lock_fd, LOCK_EX | LOCK_NB) != 0)
            continue;
        /* The previous publisher is gone. Publish only into an object that is still sound. */
        if (validate_header(st, s->map, s->interval_ns) != 0) {
            s->dead = true;
            (void)flock(s->lock_fd, LOCK_UN);
            continue;
        }
        s->publisher = true;
        orb_slots_publish(s->map, now_ns);
    }
    return any;
}
