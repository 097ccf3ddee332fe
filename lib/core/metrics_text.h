/* Internal: an engine's metrics as Prometheus text (the exposition format 0.0.4), for the HTTP
 * exporter (metrics_http.c). */
#ifndef ORB_CORE_METRICS_TEXT_H
#define ORB_CORE_METRICS_TEXT_H

#include <stddef.h>

#include <orbite/orbite.h>

/* A new text (the caller frees *text_out) of *len_out bytes, not NUL-terminated.
 * Errors: those of orb_engine_metrics(), ORB_ENOMEM. */
int orb_metrics_prometheus(const orb_engine *engine, char **text_out, size_t *len_out);

#endif
