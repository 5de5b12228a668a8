/*
 * policy.h -- retry policies (docs/steps.md, "Retry policy"): validation, precedence and the backoff schedule.
 */
#ifndef DS_POLICY_H
#define DS_POLICY_H

#include "base/compat.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

/* The longest delay or timeout anything in the extension accepts. */
#define DS_MAX_DELAY_USECS	((int64) 24 * USECS_PER_HOUR)

/* Which keys a (partial) policy sets; keys left out keep the value of the layer below. */
#define POLICY_MAX_ATTEMPTS		(1 << 0)
#define POLICY_INITIAL_DELAY	(1 << 1)
#define POLICY_MAX_DELAY		(1 << 2)
#define POLICY_BACKOFF			(1 << 3)
#define POLICY_MULTIPLIER		(1 << 4)
#define POLICY_JITTER			(1 << 5)
#define POLICY_ALL_KEYS			0x3F
/* A step's limit (docs/limits.md): its own policy's keys, never a run's or the setting's. */
#define POLICY_LIMIT			(1 << 6)

/* The longest limit name, and the longest key a step may name within a limit, in bytes. */
#define DS_MAX_LIMIT_NAME		(NAMEDATALEN - 1)
#define DS_MAX_LIMIT_KEY		200

typedef struct RetryPolicy
{
	uint32		set;			/* POLICY_* bits of the keys this policy sets */
	int			max_attempts;	/* total attempts, not retries */
	int64		initial_delay;	/* microseconds */
	int64		max_delay;		/* microseconds */
	bool		exponential;
	double		multiplier;
	double		jitter;			/* fraction removed at random, 0..1 */

	/*
	 * The limit the step is admitted by ("limit") and its key within it
	 * ("limit_key", "" when none); NULL when the policy names none.
	 */
	char	   *limit_name;
	char	   *limit_key;
} RetryPolicy;

extern void ds_policy_init_module(void);

/* Parse and validate a partial policy; raises 22023 naming the field on bad input. */
extern void ds_policy_parse(Jsonb *policy, RetryPolicy *out);

/* A layer that may not name a limit (22023): a run's policy, the setting under every step. */
extern void ds_policy_refuse_limit(const RetryPolicy *layer, const char *where);

/* builtin < durable_steps.default_retry_policy < run policy < step policy; NULL layers skipped. */
extern void ds_policy_resolve(Jsonb *run_policy, Jsonb *step_policy, RetryPolicy *out);

/* Normalized jsonb of the keys the policy sets (delays in milliseconds). */
extern Jsonb *ds_policy_to_jsonb(const RetryPolicy *policy);

/* Delay after failed attempt n (1-based) of a resolved policy, jitter applied. */
extern int64 ds_policy_backoff_delay(const RetryPolicy *policy, int failed_attempt);

/* Shared by the timeout and retry-after arguments. */
extern int64 ds_interval_to_usecs(const Interval *interval);
extern Interval *ds_usecs_to_interval(int64 usecs);

#endif							/* DS_POLICY_H */
