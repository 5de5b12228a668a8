/*
 * claim_size.h -- how much work an executor claims at a time (docs/worker.md).
 */
#ifndef DS_CLAIM_SIZE_H
#define DS_CLAIM_SIZE_H

#include "base/compat.h"
#include "utils/timestamp.h"

/* queues whose pace an executor remembers; the least recently claimed one is forgotten first */
#define CLAIM_SIZER_QUEUES 16

/* How long one item of a queue took to run, lately (moving average). */
typedef struct QueuePace
{
	char		queue[NAMEDATALEN]; /* the queue's name, cut to fit; "" = a
									 * free entry */
	double		usecs_per_item;
	TimestampTz last_claim;		/* when a claim from it last ended */
} QueuePace;

/* The recent pace of one kind of claim (steps, run turns), queue by queue. */
typedef struct ClaimSizer
{
	QueuePace	queues[CLAIM_SIZER_QUEUES];
} ClaimSizer;

/*
 * The size of a claim whose pace is not known yet. Steps: one, because a step may take a second
 * or an hour, and each one an executor claims waits for that executor while another may be idle.
 * Run turns: a few, because a turn runs until its workflow waits, most often for a step, which
 * the turn leaves to a claim of its own.
 */
#define FIRST_STEP_CLAIM_SIZE 1
#define FIRST_TURN_CLAIM_SIZE 10

/*
 * How many items the next claim from `queue` may take: at most `most` (durable_steps.batch_size),
 * at most this executor's share of the server's lock table (each claimed item holds a lock until
 * its outcome commits), and about CLAIM_BUDGET_MS of work at the queue's recent pace, or `first`
 * when the pace is not known. At least 1.
 */
extern int	ds_claim_size(const ClaimSizer *sizer, const char *queue, int most, int first);

/* A claim of n items of `queue` ran from `started` until now: update the queue's pace. */
extern void ds_claim_size_ran(ClaimSizer *sizer, const char *queue, int n, TimestampTz started);

/* The most locks this executor's claims may hold at once: its share of the lock table. */
extern int	ds_claim_lock_share(void);

/*
 * Executors claiming from the same queue at once (docs/worker.md): the one that
 * holds the queue's claim lock (step_lock.c) takes its first due steps, and says how many
 * (ds_claim_announce); one that comes meanwhile reads past them (ds_claims_in_progress) instead
 * of waiting for its turn, and says how many it takes in its own turn. An announcement lasts
 * until the claim commits (ds_claim_announce_end).
 */
extern void ds_claim_announce(const char *queue, int n);
extern void ds_claim_announce_end(void);

/* Steps other executors of this database are claiming from `queue` now; 0 when none. */
extern int	ds_claims_in_progress(const char *queue);

#endif							/* DS_CLAIM_SIZE_H */
