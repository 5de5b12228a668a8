/*
 * step_call.h -- what every kind of step call shares (step_call.c): checked identities,
 * fingerprints, the answer of a stored step, the step's lock (docs/steps.md, "How a step behaves").
 */
#ifndef DS_STEP_CALL_H
#define DS_STEP_CALL_H

#include "base/compat.h"
#include "fmgr.h"
#include "utils/jsonb.h"

#include "http/http_request.h"

#include "store/step_store.h"

/* Argument `argno`, a run_id or step_id: not NULL, not empty, at most 255 characters. */
extern char *ds_step_identity_arg(FunctionCallInfo fcinfo, int argno, const char *name);

/*
 * Argument `argno`, the run_id of a step call: as ds_step_identity_arg, and of a partition this
 * server owns (DS201, docs/partitions.md). Every call naming a run reads its run_id through here.
 */
extern char *ds_run_id_arg(FunctionCallInfo fcinfo, int argno);

/*
 * A new step or run under `run_id`: a run id of a schedule's slot, ds_key('schedule', job_name,
 * slot), is for the firings of that schedule alone (docs/schedules.md): 42501 unless the caller
 * has the privileges of the schedule's owner, and for everyone when there is no such schedule.
 */
extern void ds_check_slot_run_id(const char *run_id);

/* Argument `argno`, a step timeout, in microseconds: 0 for NULL, else in (0, 24 hours]. */
extern int64 ds_step_timeout_arg(FunctionCallInfo fcinfo, int argno);

/*
 * A SQL step's expect argument (argument `argno`): NULL, or 'row' (true): a body that returns no
 * row fails (22023 for anything else).
 */
extern bool ds_expect_row_arg(FunctionCallInfo fcinfo, int argno);

/*
 * The fingerprint of a SQL step's definition: its SQL, whether it expects a row, its input and
 * hooks. One that expects no row hashes as ds_step_fingerprint of its SQL.
 */
extern char *ds_sql_step_fingerprint(const char *sql, bool expect_row, Jsonb *input,
									 const char *on_success, const char *on_failure);

/* The fingerprint of a definition: `sql` (never NULL), `input` and the hooks (may be NULL). */
extern char *ds_step_fingerprint(const char *sql, Jsonb *input, const char *on_success,
								 const char *on_failure);

/* The ds_step_result of the step as `rec` holds it. */
extern Datum ds_step_result_datum(FunctionCallInfo fcinfo, const StepRecord *rec, bool replayed);

/*
 * Only the step's owner is answered (42501); a different fingerprint is a conflict (DS422).
 * True when the stored state is the answer, false when an attempt is due now.
 */
extern bool ds_step_answer_from_store(const StepRecord *rec, const char *fingerprint);

/*
 * The calls that store a step for a worker to run (an outbox entry: ds_http_step, ds_task_step).
 * First: the step (run_id, step_id) already stored answers the call -- an owner's replay, or
 * 42501, or a DS422 conflict with `fingerprint` -- in *answer; false when there is none yet (its
 * lock is then held, waiting or with nowait DS409, until the transaction ends).
 */
extern bool ds_outbox_step_stored(FunctionCallInfo fcinfo, const char *run_id, const char *step_id,
								  bool nowait, const char *fingerprint, Datum *answer);

/*
 * Then: a new step of `kind` under that identity in *rec, owned by the current user under the
 * current search_path, pending and due now (or at `run_at` if not 0), its policy resolved from
 * `policy` over its run's; the caller sets what its kind adds, then stores it.
 */
extern void ds_outbox_step_init(StepRecord *rec, const char *run_id, const char *step_id,
								StepKind kind, Jsonb *policy, bool nowait, char *fingerprint,
								TimestampTz run_at);

/* 42501 unless the current user is the step's owner. */
extern void ds_step_check_owner(const StepRecord *rec);

/* HTTP steps (docs/http.md), as ds_http_step and ds_retry_step check them: */
/* the calling role may create HTTP steps (42501) */
extern void ds_http_step_check_role(void);

/*
 * the request is well formed (22023 naming the field), not too large (54000), its host allowed
 * (42501); fills *req
 */
extern void ds_http_step_check_request(Jsonb *request, HttpRequest *req);

/* the request's headers do not set the step's idempotency header `name` (22023) */
extern void ds_http_step_check_idempotency_header(const HttpRequest *req, const char *name);

/* The same for step (run_id, step_id) owned by `owner` (a replay remembered without its row). */
extern void ds_step_check_owner_id(Oid owner, const char *run_id, const char *step_id);

/*
 * A new step is about to be stored under run_id `run_id`: if that is a run's, raises 42501 unless
 * the caller may add steps to that run (docs/security.md). Serialized with ds_start_run
 * by the run_id's lock (docs/runs.md); with nowait, a run being started in another transaction
 * raises DS409 instead of being waited for. Returns the run's default policy, or NULL.
 */
extern Jsonb *ds_new_step_run_policy(const char *run_id, bool nowait);

/*
 * Take the step's transaction lock (waiting, or with nowait DS409) and read it locked; false
 * when there is no such step.
 */
extern bool ds_step_lock_and_read(const char *run_id, const char *step_id, bool nowait,
								  StepRecord *rec);

/*
 * Lock and read a step the caller may see (its owner's roles and durable_steps_admin); DS404
 * for any other, at once. With stop_running, an attempt a worker runs is asked to stop first,
 * so that its lock comes free soon.
 */
extern void ds_step_lock_visible(const char *run_id, const char *step_id, bool stop_running,
								 StepRecord *rec);

/*
 * A map's item (ds_start_map): true when (run_id, step_id) is stored already, answered as a
 * repeat call is (another role's 42501, another definition DS422). No identity lock is taken:
 * the caller made the map's row in this transaction, and nobody else stores its items.
 */
extern bool ds_map_item_stored(const char *run_id, const char *step_id, const char *fingerprint);

/* Store new item `rec` of map `map_step`, admitted by limit `limit_name` when not NULL. */
extern void ds_map_item_insert(StepRecord *rec, const char *map_step, const char *limit_name);

#endif							/* DS_STEP_CALL_H */
