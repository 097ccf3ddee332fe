/* Internal: what the engine offers to transports and the other core modules. */
#ifndef ORB_CORE_ENGINE_H
#define ORB_CORE_ENGINE_H

#include <stddef.h>
#include <stdint.h>
#include <orbite/orbite.h>

#include "registry.h"

const struct orb_engine_config *orb_engine_cfg(const orb_engine *engine);
struct orb_registry *orb_engine_registry(orb_engine *engine);
/* The engine's staging pool (stage_pool.h), shared by its stager and transports; it outlives the
 * transports. */
struct orb_stage_pool *orb_engine_stage_pool(orb_engine *engine);
const struct orb_epoch *orb_engine_epoch(const orb_engine *engine);
/* The engine's RDMA settings, NULL when it was created without (no RDMA transport wanted). */
const struct orb_rdma_config *orb_engine_rdma_config(const orb_engine *engine);

/* Queue a notification received by the source. ORB_ERESOURCE when max_notifications are queued,
 * ORB_ECLOSED when the source is fenced. */
int orb_engine_deliver_notification(orb_engine *engine, const struct orb_epoch *sender,
                                    const uint8_t *data, uint32_t len);

/* Hand a control message from engine `sender`'s `transport` to this engine's same transport
 * (its ops->control). Errors: ORB_EUNAVAILABLE (this engine runs no such transport, or it takes
 * no control messages), ORB_ECLOSED (the source is fenced), the transport's refusal. */
int orb_engine_control(orb_engine *engine, uint8_t transport, const struct orb_epoch *sender,
                       const uint8_t *req, size_t len, uint8_t *resp, size_t cap, size_t *resp_len);

/* Register `n` ranges of any memory kind, all or nothing, for the public call named `call`
 * (a memory kind's own registration entry point). Errors: as orb_register_host_memory(). */
int orb_engine_register_ranges(orb_engine *engine, const char *call, const struct orb_reg_range *ranges,
                               size_t n, orb_reg_id *ids_out);

/* 1 while source admission is open. */
int orb_engine_source_open(const orb_engine *engine);

/* Count a peer's request, or a piece of one, that this engine's source served on transport `tp`
 * (its id): `op` an enum orb_op, `status` 0 when its `bytes` moved (`ends` 1 for the request's
 * last piece, which counts the request), negative when it was refused or failed. For
 * orb_engine_metrics(); a few relaxed atomic adds, callable from any thread. */
void orb_engine_count_served(orb_engine *engine, unsigned tp, unsigned op, uint64_t bytes, int ends, int status);

#endif
