/* Internal: engine configuration checks. */
#ifndef ORB_CORE_CONFIG_H
#define ORB_CORE_CONFIG_H

#include <orbite/orbite.h>

/* Check every field of `cfg` against its documented range (endpoint parses as host:port with a
 * numeric port 0..65535, reserved fields zero, ...). Errors: ORB_EINVAL (NULL), ORB_ECONFIG
 * (message names the field and the reason). */
int orb_engine_config_validate(const struct orb_engine_config *cfg);

/* Parse `json` (NUL-terminated, at most `max` bytes) as one JSON object, duplicate keys
 * refused; `what` prefixes every message ("config JSON"). The caller owns `*out` (json_decref).
 * Errors: ORB_ECONFIG (too large, a syntax error with its position, or not an object). */
struct json_t;
int orb_json_load_object(const char *json, size_t max, const char *what, struct json_t **out);

/* Split "host:port" (host may be "[v6addr]") into its parts. Errors: ORB_ECONFIG. */
int orb_endpoint_split(const char *endpoint, char *host, size_t host_cap, uint16_t *port);

#endif
