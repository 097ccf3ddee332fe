/* The log facade: a replaceable sink, a level read once from ORBITE_LOG. */
#include "log.h"

#include "error.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define ORB_LOG_LINE_MAX 1024

static atomic_int log_level = -1; /* -1: not read from the environment yet */
static pthread_mutex_t sink_lock = PTHREAD_MUTEX_INITIALIZER;
static orb_log_fn sink_fn;
static void *sink_ctx;

static const char *const level_names[] = {"error", "warn", "info", "debug", "trace"};

static int level_from_env(void)
{
    const char *v = getenv("ORBITE_LOG");
    if (v != NULL) {
        for (int i = 0; i <= ORB_LOG_TRACE; i++)
            if (strcasecmp(v, level_names[i]) == 0)
                return i;
    }
    return ORB_LOG_WARN;
}

static int current_level(void)
{
    int level = atomic_load_explicit(&log_level, memory_order_relaxed);
    if (level < 0) {
        int expected = -1;
        level = level_from_env();
        if (!atomic_compare_exchange_strong(&log_level, &expected, level))
            level = expected;
    }
    return level;
}

int orb_log_enabled(enum orb_log_level level)
{
    return (int)level <= current_level();
}

ORB_EXPORT void orb_log_set_handler(orb_log_fn fn, void *ctx)
{
    pthread_mutex_lock(&sink_lock);
    sink_fn = fn;
    sink_ctx = ctx;
    pthread_mutex_unlock(&sink_lock);
}

ORB_EXPORT void orb_log_set_level(enum orb_log_level level)
{
    if ((int)level < ORB_LOG_ERROR)
        level = ORB_LOG_ERROR;
    if ((int)level > ORB_LOG_TRACE)
        level = ORB_LOG_TRACE;
    atomic_store(&log_level, (int)level);
}

ORB_EXPORT enum orb_log_level orb_log_get_level(void)
{
    return (enum orb_log_level)current_level();
}

void orb_log(enum orb_log_level level, const char *fmt, ...)
{
    if (!orb_log_enabled(level))
        return;
    char line[ORB_LOG_LINE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    /* The lock keeps a handler from being swapped out (and its ctx freed) mid-call. */
    pthread_mutex_lock(&sink_lock);
    if (sink_fn != NULL)
        sink_fn(level, line, sink_ctx);
    else
        fprintf(stderr, "orbite[%s]: %s\n", level_names[level], line);
    pthread_mutex_unlock(&sink_lock);
}
