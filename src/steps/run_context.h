/*
 * run_context.h -- the state of the workflow turn running in this backend (docs/runs.md).
 */
#ifndef DS_RUN_CONTEXT_H
#define DS_RUN_CONTEXT_H

#include "base/compat.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

#include "store/run_store.h"

/* The step id of a turn's own context entry: step ids are never empty, so it names no step. */
#define DS_TURN_STEP_ID ""

/*
 * The work a suspended turn leaves to the executor, done after the turn's rollback in the turn's
 * transaction: a step attempt to run, or a wait to record.
 */
typedef enum TurnWork
{
	TURN_WORK_NONE,
	TURN_WORK_STEP,				/* run the next attempt of step `step_id`
								 * (call in step_call) */
	TURN_WORK_SLEEP,			/* record sleep step `step_id`, until `until` */
	TURN_WORK_EVENT_START,		/* record event step `step_id` waiting for
								 * `event` */
	TURN_WORK_EVENT_DONE,		/* record event step `step_id` succeeded with
								 * `payload` */
	TURN_WORK_EVENT_TIMEOUT,	/* record event step `step_id` failed: timed
								 * out */
	TURN_WORK_HTTP,				/* create HTTP step `step_id` (ds_http_step
								 * call in step_call) */
	TURN_WORK_PATCH,			/* record patch step `step_id` answering
								 * `patched` */
	TURN_WORK_TASK,				/* create task `step_id` (ds_task_step call in
								 * step_call) */
	TURN_WORK_MAP,				/* store map `step_id` and its items
								 * (ds_start_map call in `step_call`) */
	TURN_WORK_CHILD				/* start the child run of step `step_id`
								 * (ds_start_child call in `step_call`) */
} TurnWork;

/* How a turn ended when a call in it had to wait or had work to do. */
typedef struct TurnSuspension
{
	bool		suspended;
	bool		blocked;		/* run status blocked (a step waits for a
								 * person), else waiting */
	TimestampTz wake_at;		/* 0 = no time: woken by an event,
								 * ds_retry_step, ds_resume_run */
	char	   *reason;
	char	   *step_id;
	char	   *event;			/* the event awaited, or NULL */
	TurnWork	work;
	char	   *step_call;		/* TURN_WORK_STEP, _HTTP, _TASK, _MAP, _CHILD:
								 * ds_run_step's, ds_http_step's or
								 * ds_task_step's arguments, as jsonb text */
	int64		step_timeout;	/* TURN_WORK_STEP: the attempt's limit,
								 * microseconds */
	TimestampTz until;			/* TURN_WORK_SLEEP */
	int64		event_timeout;	/* TURN_WORK_EVENT_START: microseconds, 0 =
								 * none */
	char	   *payload;		/* TURN_WORK_EVENT_DONE: jsonb text, NULL =
								 * SQL NULL */
	bool		patched;		/* TURN_WORK_PATCH */
	Oid			owner;			/* the role the workflow called as */
	char	   *search_path;
} TurnSuspension;

/*
 * How often a run waiting to join a map or a child run looks again by itself (docs/runs.md):
 * the items' and the child's ends wake it at once; this is for a wake that came while one of
 * its turns was still in flight.
 */
#define DS_JOIN_RECHECK_USECS ((int64) 30 * USECS_PER_SEC)

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
pg_noreturn extern void ds_turn_suspend(bool blocked, TimestampTz wake_at, const char *reason,
										const char *step_id, const char *event);

/*
 * The turn has work to do that must commit on its own (a step attempt, a wait to record): end it
 * here like a suspension, and leave the work in `work` (its strings are copied). Never returns.
 */
pg_noreturn extern void ds_turn_suspend_for_work(const TurnSuspension *work);

/*
 * A call of the turn found step `step_id` of its run recorded (a replay, a wait, a patch): the
 * run's history reaches at least that far. ds_turn_visited: how many distinct steps so far.
 */
extern void ds_turn_visit(const char *step_id);
extern int	ds_turn_visited(void);

/* After the turn's transaction ended: forget the turn (its suspension and work). */
extern void ds_turn_release(void);

/*
 * The attempts that lost or interrupted turns may have run of the step a turn now runs (their
 * records rolled back with them): the executor hands them to that step's ds_run_step for as long
 * as the call runs (`n` 0 takes them back), and ds_run_step takes them -- once, for that step
 * only -- to record them before anything else (docs/runs.md): those that name the step always,
 * those that name none only on a step it creates. Returns how many, with *entries pointing at
 * the executor's array.
 */
extern void ds_turn_hand_unrecorded_attempts(const char *run_id, const char *step_id, int n,
											 const UnrecordedAttempt *entries);
extern int	ds_turn_take_unrecorded_attempts(const char *run_id, const char *step_id,
											 const UnrecordedAttempt **entries);

/* Text field `key` of a jsonb object (NULL: none); `absent` when it is missing or null. */
extern char *ds_jsonb_field_text(Jsonb *j, const char *key, char *absent);

#endif							/* DS_RUN_CONTEXT_H */
