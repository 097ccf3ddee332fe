/* Internal: what the endpoint directory stores, and the checks of what it reads back. A stored
 * value comes from etcd, which anyone with write access to the prefix can fill: it is decoded
 * fail-closed (bounded sizes, exact types, every field checked), never trusted. */
#ifndef ORB_DIRECTORY_ENTRY_H
#define ORB_DIRECTORY_ENTRY_H

#include <stddef.h>
#include <stdint.h>

#include <orbite/orbite.h>

#define ORB_DIR_VALUE_MAX (64u * 1024u)  /* a stored value's bytes: more is refused unread */
#define ORB_DIR_PREFIX_MAX 128u
#define ORB_DIR_DEFAULT_PREFIX "/orbite/"

/* 0 when `name` is 1..127 bytes of [A-Za-z0-9._:-]; else ORB_EINVAL naming the problem. */
int orb_dir_check_name(const char *name);

/* 0 when `prefix` starts and ends with '/', is at most ORB_DIR_PREFIX_MAX bytes of
 * [A-Za-z0-9._:/-] with no empty, "." or ".." component; else ORB_EINVAL. */
int orb_dir_check_prefix(const char *prefix);

/* The stored value of `e` (its name is the key's, not stored): a new NUL-terminated JSON text the
 * caller frees, or NULL with ORB_ENOMEM / ORB_EINVAL set. */
char *orb_dir_entry_encode(const struct orb_directory_entry *e);

/* Decode `len` bytes of a stored value into *out (name and revision untouched). 0, or
 * ORB_EPROTO naming what is wrong (too long, not JSON, a missing or ill-typed field, an endpoint
 * or host too long, an epoch that is not 32 hex digits, too many regions, a region that is not
 * [address, length, permission, kind, routes] with a peer permission). *out is written only on
 * success. */
int orb_dir_entry_decode(const uint8_t *value, size_t len, struct orb_directory_entry *out);

/* Standard base64 with padding (etcd's HTTP gateway carries keys and values so). encode: a new
 * NUL-terminated text, or NULL (no memory). decode: 0 with a new buffer (*out, *out_len; the
 * caller frees), ORB_EPROTO for anything that is not canonical base64, ORB_ENOMEM. */
char *orb_dir_b64_encode(const uint8_t *in, size_t len);
int orb_dir_b64_decode(const char *in, size_t len, uint8_t **out, size_t *out_len);

#endif
