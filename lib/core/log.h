/* Internal: the log facade behind orb_log_set_handler(). */
#ifndef ORB_CORE_LOG_H
#define ORB_CORE_LOG_H

#include <orbite/orbite.h>

/* Non-zero when `level` would be emitted (cheap: one relaxed atomic load). */
int orb_log_enabled(enum orb_log_level level);

/* Format and emit one line (no trailing newline needed) if `level` is enabled. */
void orb_log(enum orb_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define ORB_LOGE(...) orb_log(ORB_LOG_ERROR, __VA_ARGS__)
#define ORB_LOGW(...) orb_log(ORB_LOG_WARN, __VA_ARGS__)
#define ORB_LOGI(...) orb_log(ORB_LOG_INFO, __VA_ARGS__)
#define ORB_LOGD(...) do { if (orb_log_enabled(ORB_LOG_DEBUG)) orb_log(ORB_LOG_DEBUG, __VA_ARGS__); } while (0)

#endif
