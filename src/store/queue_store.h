/*
 * queue_store.h -- the statements on durable_steps.queues of ds_set_queue (queue_store.c); the
 * claims' statements on a queue's row are step_claim_store.h's.
 */
#ifndef DS_QUEUE_STORE_H
#define DS_QUEUE_STORE_H

#include "base/compat.h"

/*
 * Set queue `name`'s concurrency (`unlimited`: NULL), adding its row when it has none. In the
 * caller's SPI connection (ds_store_spi_begin).
 */
extern void ds_store_set_queue(const char *name, int32 concurrency, bool unlimited);

#endif							/* DS_QUEUE_STORE_H */
