/*
 * http_claims.c -- the HTTP worker's view of durable_steps.steps.
 *
 * The same two phases as the SQL executors' claims (step_claims.c): lock due rows, skipping
 * rows others hold; take each step's session lock, skipping steps someone is acting on; then
 * mark those running in one statement. SQL executors never claim kind 'http', and this never
 * claims anything else. HTTP steps are not served by queue: all of them sit in the queue
 * DS_HTTP_QUEUE at priority 0, one range of steps_due_idx read up to its first step not yet due,
 * and durable_steps.http_max_inflight bounds them.
 */
#include "base/compat.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "storage/proc.h"
#include "utils/array.h"
#include "utils/builtins.h"

#include "worker/http_claims.h"
#include "base/policy.h"
#include "http/http_request.h"
#include "ipc/due_floors.h"
#include "store/replay_cache.h"
#include "steps/step_exec.h"
#include "store/step_claim_store.h"
#include "store/step_lock.h"
#include "store/step_store.h"

/* HTTP claims in the order they are sent: earliest due first. */
static int
compare_due_times(const void *a, const void *b)
{
	TimestampTz x = ((const ClaimedStep *) a)->rec.next_attempt_at;
	TimestampTz y = ((const ClaimedStep *) b)->rec.next_attempt_at;

	return x < y ? -1 : x > y ? 1 : 0;
}

/* How many of role `owner`'s requests are counted in owners[0..*n-1]; adds it when new. */
static int *
owner_count(Oid *owners, int *counts, int *n, Oid owner)
{
	for (int i = 0; i < *n; i++)
		if (owners[i] == owner)
			return &counts[i];
	owners[*n] = owner;
	counts[*n] = 0;
	return &counts[(*n)++];
}

/*
 * Move the HTTP steps' floor up to their first waiting one (ipc/due_floors.h), before this
 * transaction claims any, and return it: the claim's read starts there.
 */
static LocalTransactionId claimed_lxid = InvalidLocalTransactionId;

static TimestampTz
raise_http_floor(void)
{
	DueFloorLook look;

	if (claimed_lxid != DS_MY_LXID && ds_due_floor_look(DS_HTTP_QUEUE, 0, &look))
		ds_due_floor_raise(&look, ds_store_first_waiting_time(DS_HTTP_QUEUE, 0, look.floor,
															  look.bound));
	claimed_lxid = DS_MY_LXID;
	return ds_due_floor(DS_HTTP_QUEUE, 0);
}

int
ds_claim_due_http_steps(int limit, const Oid *inflight_owners, int n_inflight, int per_role,
						MemoryContext cxt, ClaimedStep **claims)
{
	Datum	   *tids;
	Oid		   *owners;
	int		   *counts;
	Datum	   *capped;
	int			n_owners = 0;
	int			n_capped = 0;
	int			n_locked = 0;
	int			n_claimed;
	uint64		n_due;
	StoreSpi	spi;
	bool		isnull;

	*claims = NULL;

	/*
	 * the roles in flight, and those at their share already: the query passes
	 * them by
	 */
	owners = palloc(sizeof(Oid) * (n_inflight + 2 * limit + 1));
	counts = palloc(sizeof(int) * (n_inflight + 2 * limit + 1));
	capped = palloc(sizeof(Datum) * (n_inflight + 1));
	for (int i = 0; i < n_inflight; i++)
		(*owner_count(owners, counts, &n_owners, inflight_owners[i]))++;
	for (int i = 0; i < n_owners; i++)
		if (counts[i] >= per_role)
			capped[n_capped++] = ObjectIdGetDatum(owners[i]);
	ds_store_spi_begin(&spi);

	/*
	 * read past the first `limit`: those may be one role's, more than its
	 * share; `now`, not clock_timestamp(): the bound of the index range, not
	 * a filter
	 */
	n_due = ds_store_lock_due_http_steps(2 * limit, GetCurrentTimestamp(),
										 construct_array(capped, n_capped, OIDOID, sizeof(Oid),
														 true, TYPALIGN_INT),
										 raise_http_floor());
	if (n_due == 0)
	{
		ds_store_spi_end(&spi);
		return 0;
	}
	tids = palloc(sizeof(Datum) * n_due);
	for (uint64 i = 0; i < n_due && n_locked < limit; i++)
	{
		char	   *run_id = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1);
		char	   *step_id = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 2);
		Oid			owner = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[i],
														   SPI_tuptable->tupdesc, 4, &isnull));
		int		   *count = owner_count(owners, counts, &n_owners, owner);

		/*
		 * no role takes more than its share of the slots (docs/security.md)
		 */
		if (*count >= per_role)
			continue;
		/* ds_retry_step or ds_cancel_step may be acting on it right now */
		if (ds_step_lock_try_session(run_id, step_id))
		{
			tids[n_locked++] = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 3,
											 &isnull);
			(*count)++;
		}
	}
	if (n_locked == 0)
	{
		ds_store_spi_end(&spi);
		return 0;
	}
	n_claimed = ds_mark_steps_running(tids, n_locked, false, cxt, claims, compare_due_times);
	/* the rows are locked by this transaction: every locked one is claimed */
	if (n_claimed != n_locked)
		elog(ERROR, "claimed %d of %d locked HTTP steps", n_claimed, n_locked);
	ds_store_spi_end(&spi);
	return n_claimed;
}

TimestampTz
ds_next_http_due_time(void)
{
	StoreSpi	spi;
	TimestampTz next;

	ds_store_spi_begin(&spi);
	next = ds_store_next_due_http_time(ds_due_floor(DS_HTTP_QUEUE, 0));
	ds_store_spi_end(&spi);
	return next;
}
