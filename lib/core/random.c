/* Random bytes from the kernel (see random.h). */
#include "random.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include "clock.h"
#include "error.h"

int orb_random_bytes(void *buf, size_t n)
{
    uint8_t *b = buf;
    size_t got = 0;
    while (got < n) {
        ssize_t r = getrandom(b + got, n - got, 0);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return orb_fail(ORB_EUNAVAILABLE, "getrandom failed: %s", strerror(errno));
        }
        got += (size_t)r;
    }
    return 0;
}

uint64_t orb_random_u64(void)
{
    uint64_t v = 0;
    if (orb_random_bytes(&v, sizeof v) != 0)
        v = orb_now_ns() ^ (uint64_t)(uintptr_t)&v;
    return v;
}
