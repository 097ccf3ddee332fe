/* Shared slot objects: creation, the checks on every open, refusals of squatted, linked or
 * damaged objects, the read-only descriptor for the library, and publisher takeover. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "helper/helper.h"
#include "helper_test_util.h"

#define NAME "orbite-slots-test"
#define INTERVAL ORB_SLOTS_DEFAULT_INTERVAL_NS

struct fixture {
    char dir[256];
    struct orb_helper_state a, b; /* two helpers attached to the same directory */
};

/* A state on the fixture directory, its private directory not yet prepared. */
static void state_init_only(struct fixture *f, struct orb_helper_state *st)
{
    orb_helper_state_init(st, -1, NULL);
    st->shm_fd = open(f->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    assert_true(st->shm_fd >= 0);
    st->admin_uid = getuid();
    st->admin_gid = (gid_t)-1;
}

static void state_for(struct fixture *f, struct orb_helper_state *st)
{
    orb_helper_state_init(st, -1, NULL);
    st->shm_fd = open(f->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    assert_true(st->shm_fd >= 0);
    st->uid = getuid();
    st->gid = getgid();
    st->admin_uid = getuid(); /* the test is the administrator of its own directory */
    st->admin_gid = (gid_t)-1;
    assert_int_equal(orb_clock_domain_current(&st->domain), 0);
    st->domain_ok = true;
    assert_int_equal(orb_helper_slots_prepare(st), 0);
}

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    snprintf(f->dir, sizeof f->dir, "/tmp/orbite-slots-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    state_for(f, &f->a);
    state_for(f, &f->b);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    orb_helper_state_release(&f->a);
    orb_helper_state_release(&f->b);
    hp_remove_tree(f->dir);
    free(f);
    return 0;
}

static int path_in(const struct fixture *f, const char *name, char *buf, size_t len)
{
    return snprintf(buf, len, "%s/%s", f->dir, name);
}

/* A regular file at NAME with `mode` and `size` bytes of `fill`. */
static void plant(struct fixture *f, mode_t mode, size_t size, uint8_t fill)
{
    char path[512];
    path_in(f, NAME, path, sizeof path);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    uint8_t *buf = malloc(size ? size : 1);
    memset(buf, fill, size);
    assert_int_equal(write(fd, buf, size), (ssize_t)size);
    free(buf);
    assert_int_equal(fchmod(fd, mode), 0);
    close(fd);
}

/* ---- arguments -------------------------------------------------------------------------------- */

static void test_bad_arguments(void **state)
{
    struct fixture *f = *state;
    int fd = -1;
    assert_int_equal(orb_helper_slot_open_shared(&f->a, "../x", INTERVAL, &fd), ORB_EINVAL);
    assert_int_equal(orb_helper_slot_open_shared(&f->a, NAME, ORB_SLOTS_MIN_INTERVAL_NS - 1, &fd), ORB_EINVAL);
    assert_int_equal(orb_helper_slot_open_shared(&f->a, NAME, ORB_SLOTS_MAX_INTERVAL_NS + 1, &fd), ORB_EINVAL);
    assert_int_equal(orb_helper_slot_open_shared(&f->a, NAME, INTERVAL, NULL), ORB_EINVAL);
    f->a.domain_ok = false;
    assert_int_equal(orb_helper_slot_open_shared(&f->a, NAME, INTERVAL, &fd), ORB_EUNAVAILABLE);
    f->a.domain_ok = true;
    close(f->a.shm_fd);
    f->a.shm_fd = -1;
    assert_int_equal(orb_helper_slot_open_shared(&f->a, NAME, INTERVAL, &fd), ORB_EUNAVAILABLE);
    assert_int_equal(fd, -1);
}

/* ---- refusals -------------------------------------------------------------------------------- */

static void test_symlink_is_refused(void **state)
{
    struct fixture *f = *state;
    char path[512];
    path_in(f, NAME, path, sizeof path);
    assert_int_equal(symlink("/etc/passwd", path), 0);
    int fd = -1;
    assert_int_equal(orb_helper_slot_open_shared(&f->a, NAME, INTERVAL, &fd), ORB_EPERM);
    assert_int_equal(fd, -1);
}

static void test_squatted_private_file_is_refused(void **state)
{
    struct fixture *f = *state;
    plant(f, 0600, ORB_HELPER_SLOT_SIZE, 0);
    int fd = -1;
    assert_int_equal(orb_helper_slot_open_shared(&f->a, NAME, INTERVAL, &fd), ORB_EPERM);
}

static void test_wrong_mode_size_links_type_are_refused(void **state)
{
    struct fixture *f = *state;
    char path[512], original[512];
    path_in(f, NAME, path, sizeof path);
    int fd = -1;
    plant(f, 0666, ORB_HELPER_SLOT_SIZE, 0);
    assert_int_equal(orb_helper_slot_open_shared(&f->a, NAME, INTERVAL, &fd), ORB_EPERM);
    assert_int_equal(unlink(path), 0);
    plant(f, 0644, ORB_HELPER_SLOT_SIZE / 2, 0);
    assert_int_equal(orb_helper_slot_open_shared(&f->a, NAME, INTERVAL, &fd), ORB_EPERM);
    assert_int_equal(unlink(path), 0);
    /* A second name for a valid object: another helper's, hard-linked by someone. */
    assert_int_equal(orb_helper_slot_open_shared(&f->b, "original", INTERVAL, &fd), 0);
    close(fd);
    path_in(f, "original", original, sizeof original);
    assert_int_equal(link(original, path), 0);
    assert_int_equal(orb_helper_slot_open_shared(&f->a, NAME, INTERVAL, &fd), ORB_EPERM);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(mkdir(path, 0755), 0);
    fd = -1;
    assert_int_equal(orb_helper_slot_open_shared(&f->a, NAME, INTERVAL, &fd), ORB_EPERM);
    assert_int_equal(fd, -1); /* written only on success */
}

static void test_foreign_and_damaged_headers_are_refused(void **state)
{
    struct fixture *f = *state;
    char path[512];
    path_in(f, NAME, path, sizeof path);
    int fd = -1;
    plant(f, 0644, ORB_HELPER_SLOT_SIZE, 0xA5); /* right owner, mode and size: someone else's data */
    assert_int_equal(orb_helper_slot_open_shared(&f->a, NAME, INTERVAL, &fd), ORB_EPERM);
    /* Even with a valid header and two links, an object no helper linked is refused. */
    struct orb_slots_params params = {.interval_ns = INTERVAL, .domain = f->a.domain, .now_ns = orb_helper_now_ns(),
                                      .publisher_epoch = 42};
    uint8_t page[ORB_HELPER_SLOT_SIZE];
    memset(page, 0, sizeof page);
    assert_int_equal(orb_slots_encode(page, sizeof page, &params), 0);
    int raw_fd = open(path, O_WRONLY | O_CLOEXEC);
    assert_true(raw_fd >= 0);
    assert_int_equal(pwrite(raw_fd, page, sizeof page, 0), (ssize_t)sizeof page);
    close(raw_fd);
    char second[512];
    path_in(f, "second-name", second, sizeof second);
    assert_int_equal(link(path, second), 0);
    assert_int_equal(orb_helper_slot_open_shared(&f->a, NAME, INTERVAL, &fd), ORB_EPERM);
    assert_int_equal(unlink(second), 0);
    assert_int_equal(unlink(path), 0);
    /* A genuine helper object of another slot, renamed to this slot's name (what a hijacked
     * helper granted only "other" could do): its link is in the other slot's directory. */
    char other[512];
    path_in(f, "other", other, sizeof other);
    assert_int_equal(orb_helper_slot_open_shared(&f->b, "other", INTERVAL, &fd), 0);
    close(fd);
    assert_int_equal(rename(other, path), 0);
    assert_int_equal(orb_helper_slot_open_shared(&f->a, NAME, INTERVAL, &fd), ORB_EPERM);
    assert_int_equal(unlink(path), 0);

    assert_int_equal(orb_helper_slot_open_shared(&f->b, NAME, INTERVAL, &fd), 0);
    close(fd);
    int raw = open(path, O_WRONLY | O_CLOEXEC);
    assert_true(raw >= 0);
    uint8_t junk = 0x7F;
    assert_int_equal(pwrite(raw, &junk, 1, 20), 1); /* inside interval_ns: the checksum breaks */
    close(raw);
    fd = -1;
    assert_int_equal(orb_helper_slot_open_shared(&f->a, NAME, INTERVAL, &fd), ORB_EPROTO);
    assert_int_equal(fd, -1);
}

static void test_interval_must_match(void **state)
{
    struct fixture *f = *state;
    int fd = -1;
    assert_int_equal(orb_helper_slot_open_shared(&f->a, NAME, INTERVAL, &fd), 0);
    close(fd);
    fd = -1;
    assert_int_equal(orb_helper_slot_open_shared(&f->b, NAME, INTERVAL * 2, &fd), ORB_ECONFIG);
    assert_int_equal(orb_helper_slot_open_shared(&f->a, NAME, INTERVAL * 2, &fd), ORB_ECONFIG);
    assert_int_equal(fd, -1);
}

static void test_slot_table_is_bounded(void **state)
{
    struct fixture *f = *state;
    for (unsigned i = 0; i < ORB_HP_MAX_SLOTS; i++) {
        char name[32];
        snprintf(name, sizeof name, "slot-%u", i);
        int fd = -1;
        assert_int_equal(orb_helper_slot_open_shared(&f->a, name, INTERVAL, &fd), 0);
        close(fd);
    }
    int fd = -1;
    assert_int_equal(orb_helper_slot_open_shared(&f->a, "one-too-many", INTERVAL, &fd), ORB_ERESOURCE);
    /* Already attached names still work. */
    assert_int_equal(orb_helper_slot_open_shared(&f->a, "slot-3", INTERVAL, &fd), 0);
    close(fd);
}

/* ---- creation, the library's descriptor, publishing ------------------------------------------ */

static void test_create_gives_a_read_only_valid_object(void **state)
{
    struct fixture *f = *state;
    int fd = -1;
    assert_int_equal(orb_helper_slot_open_shared(&f->a, NAME, INTERVAL, &fd), 0);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    assert_int_equal(st.st_mode & 07777, ORB_HELPER_SLOT_MODE);
    assert_int_equal(st.st_uid, getuid());
    /* Its name, and its link in its slot's directory through which helpers open it. */
    assert_int_equal(st.st_nlink, 2);
    char link[600];
    snprintf(link, sizeof link, "%s/" ORB_HELPER_PRIVATE_DIR "/" NAME "/obj+%llx", f->dir,
             (unsigned long long)st.st_ino);
    struct stat ls;
    assert_int_equal(lstat(link, &ls), 0);
    assert_int_equal(ls.st_ino, st.st_ino);
    assert_int_equal(st.st_size, ORB_HELPER_SLOT_SIZE);
    assert_int_equal(fcntl(fd, F_GETFL) & O_ACCMODE, O_RDONLY);
    assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
    uint8_t b = 0;
    assert_int_equal(write(fd, &b, 1), -1);
    assert_ptr_equal(mmap(NULL, ORB_HELPER_SLOT_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), MAP_FAILED);
    void *map = mmap(NULL, ORB_HELPER_SLOT_SIZE, PROT_READ, MAP_SHARED, fd, 0);
    assert_ptr_not_equal(map, MAP_FAILED);
    struct orb_slots_reader r;
    assert_int_equal(orb_slots_reader_open(map, ORB_HELPER_SLOT_SIZE, &f->a.domain, INTERVAL, 0, &r), 0);
    assert_true(f->a.slots[0].publisher);

    /* The serve loop's tick publishes the current slot. */
    uint64_t now = orb_helper_now_ns();
    assert_true(orb_helper_slots_tick(&f->a, now));
    uint32_t slot = 9;
    assert_int_equal(orb_slots_read(&r, now, &slot), ORB_SLOTS_PUBLISHED);
    assert_int_equal(slot, orb_slots_slot_at(INTERVAL, now));
    munmap(map, ORB_HELPER_SLOT_SIZE);
    close(fd);

    /* The same session asking again gets another descriptor of the same object. */
    int again = -1;
    assert_int_equal(orb_helper_slot_open_shared(&f->a, NAME, INTERVAL, &again), 0);
    struct stat st2;
    assert_int_equal(fstat(again, &st2), 0);
    assert_int_equal(st2.st_ino, st.st_ino);
    close(again);
}

static void test_one_publisher_and_takeover_when_it_goes(void **state)
{
    struct fixture *f = *state;
    int fa = -1, fb = -1;
    assert_int_equal(orb_helper_slot_open_shared(&f->a, NAME, INTERVAL, &fa), 0);
    assert_int_equal(orb_helper_slot_open_shared(&f->b, NAME, INTERVAL, &fb), 0);
    assert_true(f->a.slots[0].publisher);
    assert_false(f->b.slots[0].publisher); /* the lock is taken */
    assert_true(f->b.slots[0].writable);
    uint64_t now = orb_helper_now_ns();
    assert_true(orb_helper_slots_tick(&f->b, now));
    assert_false(f->b.slots[0].publisher);

    /* Any reader can flock() the 0644 object itself: that must not hold publication up, since
     * the lock helpers use lives in the private directory. */
    char path[512];
    path_in(f, NAME, path, sizeof path);
    int reader = open(path, O_RDONLY | O_CLOEXEC);
    assert_true(reader >= 0);
    assert_int_equal(flock(reader, LOCK_EX | LOCK_NB), 0);

    /* The publisher exits: its lock goes with it and the next attempt takes over. */
    orb_helper_state_release(&f->a);
    assert_true(orb_helper_slots_tick(&f->b, now + 1)); /* within the retry interval: not yet */
    assert_false(f->b.slots[0].publisher);
    now += 20000000ull;
    assert_true(orb_helper_slots_tick(&f->b, now));
    assert_true(f->b.slots[0].publisher);

    void *map = mmap(NULL, ORB_HELPER_SLOT_SIZE, PROT_READ, MAP_SHARED, fb, 0);
    assert_ptr_not_equal(map, MAP_FAILED);
    struct orb_slots_reader r;
    assert_int_equal(orb_slots_reader_open(map, ORB_HELPER_SLOT_SIZE, &f->b.domain, INTERVAL, 0, &r), 0);
    uint32_t slot = 9;
    assert_int_equal(orb_slots_read(&r, now, &slot), ORB_SLOTS_PUBLISHED);
    munmap(map, ORB_HELPER_SLOT_SIZE);
    close(reader);
    close(fa);
    close(fb);
}

/* The private directory is accepted only as the administrator's mode 0700 directory. */
static void test_private_directory_must_be_the_administrators(void **state)
{
    struct fixture *f = *state;
    char priv[512];
    path_in(f, ORB_HELPER_PRIVATE_DIR, priv, sizeof priv);
    struct orb_helper_state st;
    /* The fixture made it: a second helper opens it as it is. */
    struct stat sb;
    assert_int_equal(lstat(priv, &sb), 0);
    assert_true(S_ISDIR(sb.st_mode));
    assert_int_equal(sb.st_mode & 07777, 0700);
    /* Wrong mode, a symbolic link, a plain file: refused, and nothing is created over them. */
    assert_int_equal(chmod(priv, 0755), 0);
    state_init_only(f, &st);
    assert_int_equal(orb_helper_slots_prepare(&st), ORB_EPERM);
    orb_helper_state_release(&st);
    assert_int_equal(rmdir(priv), 0);
    assert_int_equal(symlink("/tmp", priv), 0);
    state_init_only(f, &st);
    assert_int_equal(orb_helper_slots_prepare(&st), ORB_EPERM);
    orb_helper_state_release(&st);
    assert_int_equal(unlink(priv), 0);
    assert_int_equal(hp_write_file(f->dir, ORB_HELPER_PRIVATE_DIR, "", 0600), 0);
    state_init_only(f, &st);
    assert_int_equal(orb_helper_slots_prepare(&st), ORB_EPERM);
    orb_helper_state_release(&st);
    assert_int_equal(unlink(priv), 0);
    if (getuid() == 0) {
        /* Another user's directory (a tenant's squat). */
        assert_int_equal(mkdir(priv, 0700), 0);
        assert_int_equal(chown(priv, 12345, 12345), 0);
        state_init_only(f, &st);
        assert_int_equal(orb_helper_slots_prepare(&st), ORB_EPERM);
        orb_helper_state_release(&st);
        assert_int_equal(rmdir(priv), 0);
    }
    /* Absent: created, with mode 0700 whatever the umask. */
    mode_t old = umask(0777);
    state_init_only(f, &st);
    assert_int_equal(orb_helper_slots_prepare(&st), 0);
    umask(old);
    assert_int_equal(lstat(priv, &sb), 0);
    assert_int_equal(sb.st_mode & 07777, 0700);
    orb_helper_state_release(&st);
}

static void test_no_slots_no_ticking(void **state)
{
    struct fixture *f = *state;
    assert_false(orb_helper_slots_tick(&f->a, orb_helper_now_ns()));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_bad_arguments, setup, teardown),
        cmocka_unit_test_setup_teardown(test_symlink_is_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_squatted_private_file_is_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wrong_mode_size_links_type_are_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_foreign_and_damaged_headers_are_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_interval_must_match, setup, teardown),
        cmocka_unit_test_setup_teardown(test_slot_table_is_bounded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_slots_no_ticking, setup, teardown),
        cmocka_unit_test_setup_teardown(test_private_directory_must_be_the_administrators, setup, teardown),
        cmocka_unit_test_setup_teardown(test_create_gives_a_read_only_valid_object, setup, teardown),
        cmocka_unit_test_setup_teardown(test_one_publisher_and_takeover_when_it_goes, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
