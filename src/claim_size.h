/*
 * claim_size.h -- how much work an executor claims at a time (README, "The background worker").
 */
#ifndef DS_CLAIM_SIZE_H
#define DS_CLAIM_SIZE_H

#include "compat.h"
#include "utils/timestamp.h"

/* queues whose pace an executor remembers; the least recently claimed one is forgotten first */
#define CLAIM_SIZER_QUEUES 16

/* How long one item of a queue took to run, lately (moving average). */
typedef struct QueuePace
{
	char		queue[NAMEDATALEN];	/* the queue's name, cut to fit; "" = a free entry */
	double		usecs_per_item;
	TimestampTz last_claim;		/* when a claim from it last ended */
} QueuePace;

/* The recent pace of one kind of claim (steps, run turns), queue by queue. */
typedef struct ClaimSizer
{
	QueuePace	queues[CLAIM_SIZER_QUEUES];
} ClaimSizer;

/*
 * How many items the next claim from `queue` may take: at most `most` (durable_steps.batch_size),
 * at most this executor's share of the server's lock table (each claimed item holds a lock until
 * its outcome commits), and about CLAIM_BUDGET_MS of work at the queue's recent pace. At least 1.
 */
extern int	ds_claim_size(const ClaimSizer *sizer, const char *queue, int most);

/* A claim of n items of `queue` ran from `started` until now: update the queue's pace. */
extern void ds_claim_size_ran(ClaimSizer *sizer, const char *queue, int n, TimestampTz started);

/* The most locks this executor's claims may hold at once: its share of the lock table. */
extern int	ds_claim_lock_share(void);

#endif							/* DS_CLAIM_SIZE_H */
