/* Device context creation against a real kernel's uverbs ioctl layer, with a soft-RoCE (rxe)
 * device inside a throw-away VM (run-rxe-check.sh). Built with ORB_UCTX_DRIVER_ID set to rxe's
 * driver id: the kernel refuses a header that names another driver than the device's. rxe
 * ignores mlx5's driver data, so this checks everything of the request but the mlx5 part, and
 * the premise of OPEN_DEVICE: a fresh uverbs file has no context until one is created. */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <rdma/ib_user_ioctl_cmds.h>
#include <rdma/ib_user_ioctl_verbs.h>

#include "core/error.h"
#include "helper/uctx.h"
#include "common/uverbs.h"

static int failures;

static void expect(bool ok, const char *what, int err)
{
    printf("%s %s: %s\n", ok ? "ok  " : "FAIL", what, err ? strerror(err) : "success");
    failures += !ok;
}

/* UVERBS_METHOD_QUERY_CONTEXT: what the provider's import step asks first. */
static int query_context(int fd)
{
    uint32_t comp_vectors = 0;
    uint64_t core_support = 0;
    struct orb_uverbs_attr attrs[] = {
        {UVERBS_ATTR_QUERY_CONTEXT_NUM_COMP_VECTORS, sizeof comp_vectors, orb_uverbs_ptr(&comp_vectors)},
        {UVERBS_ATTR_QUERY_CONTEXT_CORE_SUPPORT, sizeof core_support, orb_uverbs_ptr(&core_support)},
    };
    return orb_uverbs_call(fd, ORB_UCTX_DRIVER_ID, UVERBS_OBJECT_DEVICE, UVERBS_METHOD_QUERY_CONTEXT, attrs, 2);
}

int main(int argc, char **argv)
{
    const char *node = argc > 1 ? argv[1] : "/dev/infiniband/uverbs0";
    int fd = open(node, O_RDWR | O_CLOEXEC);
    expect(fd >= 0, "open the uverbs node", fd >= 0 ? 0 : errno);
    if (fd < 0)
        return 1;
    int err = query_context(fd);
    expect(err == EINVAL, "a fresh file has no context (QUERY_CONTEXT refused with EINVAL)", err);
    err = orb_uctx_kernel_ops.create(NULL, fd, true);
    expect(err == 0, "GET_CONTEXT as OPEN_DEVICE sends it", err);
    /* Now the core finds the context and asks the driver, which answers (mlx5) or says it has
     * no query (rxe: EOPNOTSUPP); EINVAL would mean no context. */
    err = query_context(fd);
    expect(err == 0 || err == EOPNOTSUPP, "the context is there (QUERY_CONTEXT reaches the driver)", err);
    err = orb_uctx_kernel_ops.create(NULL, fd, false);
    expect(err == EINVAL, "a second GET_CONTEXT on the file is refused with EINVAL", err);

    int fresh = open(node, O_RDWR | O_CLOEXEC);
    bool devx = false;
    int status = orb_uctx_create(&orb_uctx_kernel_ops, NULL, fresh, "rxe0", &devx);
    expect(status == 0 && devx, "orb_uctx_create on a fresh file", status == 0 ? 0 : EPROTO);
    if (status != 0)
        printf("     %s\n", orb_last_error());

    close(fresh);
    close(fd);
    printf("%s\n", failures ? "RXE-CHECK-FAILED" : "RXE-CHECK-PASSED");
    return failures ? 1 : 0;
}
