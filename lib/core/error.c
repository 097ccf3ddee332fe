/* Status codes, their text, and the thread-local detail message. */
#include "error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define ORB_ERROR_TEXT_MAX 512

static _Thread_local char last_error[ORB_ERROR_TEXT_MAX];

ORB_EXPORT const char *orb_strerror(int status)
{
    switch (status) {
    case ORB_OK: return "success";
    case ORB_EINVAL: return "invalid argument";
    case ORB_ECONFIG: return "invalid configuration";
    case ORB_EUNAVAILABLE: return "not available";
    case ORB_EPERM: return "permission denied by the registration";
    case ORB_ENOENT: return "no such registration, range or peer";
    case ORB_EEXIST: return "already exists";
    case ORB_EBUSY: return "busy: conflicting access or live work";
    case ORB_ERESOURCE: return "budget exhausted";
    case ORB_ETIMEDOUT: return "timed out";
    case ORB_ESTALE: return "stale or wrong source epoch";
    case ORB_EPEER: return "peer failed or disconnected";
    case ORB_EPROTO: return "protocol error";
    case ORB_EUNQUIESCED: return "cleanup not proven complete";
    case ORB_ECLOSED: return "closed";
    case ORB_ENOMEM: return "out of memory";
    case ORB_EAGAIN: return "not ready, try again";
    default: return "unknown status";
    }
}

ORB_EXPORT const char *orb_last_error(void)
{
    return last_error;
}

void orb_clear_error(void)
{
    last_error[0] = '\0';
}

int orb_fail(int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

int orb_fail_wrap(int status, const char *fmt, ...)
{
    char previous[ORB_ERROR_TEXT_MAX];
    memcpy(previous, last_error, sizeof previous);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    size_t used = n < 0 ? 0 : (size_t)n;
    if (used + 2 < sizeof last_error && previous[0] != '\0') {
        /* Truncation of the appended cause is acceptable; copy by hand to say so explicitly. */
        size_t room = sizeof last_error - used - 1;
        size_t plen = strnlen(previous, sizeof previous);
        char *dst = last_error + used;
        dst[0] = ':';
        dst[1] = ' ';
        size_t take = plen < room - 2 ? plen : room - 2;
        memcpy(dst + 2, previous, take);
        dst[2 + take] = '\0';
    }
    return status;
}

int orb_status_from_errno(int err)
{
    switch (err) {
    case 0: return ORB_OK;
    /* The other end, or the network to it, failed. */
    case ECONNRESET:
    case ECONNREFUSED:
    case ECONNABORTED:
    case EPIPE:
    case ENOTCONN:
    case ESHUTDOWN:
    case ENETRESET:
    case ENETDOWN:
    case ENETUNREACH:
    case EHOSTDOWN:
    case EHOSTUNREACH: return ORB_EPEER;
    case EPROTO:
    case EBADMSG: return ORB_EPROTO;
    case ETIMEDOUT: return ORB_ETIMEDOUT;
    /* This process or this host ran short. */
    case ENOMEM:
    case ENOBUFS: return ORB_ENOMEM;
    case EMFILE:
    case ENFILE:
    case EMLINK:
    case ENOSPC:
    case EDQUOT: return ORB_ERESOURCE;
    case EAGAIN: return ORB_EAGAIN;
    case EINTR: return ORB_EAGAIN;
    /* A call the library made was malformed: a bug here, never the peer's doing. */
    case EINVAL:
    case EFAULT:
    case EBADF:
    case ENOTSOCK:
    case EDESTADDRREQ:
    case EMSGSIZE:
    case EISCONN:
    case EALREADY:
    case EINPROGRESS:
    case ERANGE:
    case E2BIG: return ORB_EINVAL;
    case ENOENT: return ORB_ENOENT;
    case EEXIST: return ORB_EEXIST;
    case EBUSY:
    case ETXTBSY: return ORB_EBUSY;
    /* The system does not offer or allow what was asked. EPERM and EACCES here are the
     * operating system's refusals (a firewall rule, a security module, a missing capability),
     * not a registration's permission. */
    case EPERM:
    case EACCES:
    case EADDRINUSE:
    case EADDRNOTAVAIL:
    case EAFNOSUPPORT:
    case EPFNOSUPPORT:
    case EPROTONOSUPPORT:
    case ESOCKTNOSUPPORT:
    case EPROTOTYPE:
    case EOPNOTSUPP:
    case ENOPROTOOPT:
    case ENOSYS:
    case ENODEV:
    case ENXIO:
    case ENOEXEC:
    case ELIBBAD:
    case EIO:
    case EROFS:
    default: return ORB_EUNAVAILABLE;
    }
}
