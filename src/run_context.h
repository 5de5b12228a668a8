/*
 * run_context.h -- the state of the workflow turn running in this backend (README, "Runs").
 */
#ifndef DS_RUN_CONTEXT_H
#define DS_RUN_CONTEXT_H

#include "compat.h"
#include "utils/timestamp.h"

/* The step id of a turn's own context entry: step ids are never empty, so it names no step. */
#define DS_TURN_STEP_ID ""

/* How a turn ended when a call in it had to wait. */
typedef struct TurnSuspension
{
	bool		suspended;
	bool		blocked;		/* run status blocked (a step waits for a person), else waiting */
	TimestampTz wake_at;		/* 0 = no time: woken by an event, ds_retry_step, ds_resume_run */
	char	   *reason;
	char	   *step_id;
	char	   *event;			/* the event awaited, or NULL */
} TurnSuspension;

/* The schema the extension's functions are in. */
extern Oid	ds_extension_schema(void);

/* Around the workflow's call in the worker: ds_step() and friends act on run `run_id`. */
extern void ds_turn_begin(const char *run_id, Oid owner);
extern void ds_turn_end(TurnSuspension *out);

/*
 * The run of the turn, for a call made directly by its workflow (not from a step body). Raises
 * DS105 outside a turn, and the suspension again when the turn has already suspended: a
 * workflow that caught it cannot go on running steps.
 */
extern const char *ds_turn_require(const char *function, Oid *owner);

/*
 * The turn must wait: remember why (in backend memory, which the turn's rollback does not
 * undo) and raise the suspension. Never returns.
 */
extern void ds_turn_suspend(bool blocked, TimestampTz wake_at, const char *reason,
							const char *step_id, const char *event) pg_attribute_noreturn();

/*
 * Step `step_id` of the current run holds records that must outlive the turn's rollback (failed
 * attempts, a sleep's wake-up time, an event wait's start): keep a copy of its row and its
 * attempts in backend memory, and hold its lock for the session until the turn has ended.
 */
extern void ds_turn_keep_step(const char *run_id, const char *step_id);

/*
 * After the turn, in the turn's transaction: write the kept steps and their attempts back as
 * they were kept, where a rollback took them -- the turn's, or that of an exception block of the
 * workflow that caught a step's failure and went on. Returns how many were written.
 */
extern int	ds_turn_restore_kept_steps(void);

/* After the turn's transaction ended: let go of the kept steps' locks and memory. */
extern void ds_turn_release(void);

#endif							/* DS_RUN_CONTEXT_H */
