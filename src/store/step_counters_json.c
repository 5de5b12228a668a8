/*
 * step_counters_json.c -- the counters of the steps and the state of this database's workers,
 * as one jsonb value for ds_stats() (docs/operations.md, "Numbers for operators").
 *
 * durable_steps.ds_step_counters() reads shared memory only: no table, no lock, a few
 * microseconds, whatever the size of the history. ds_stats(), in SQL, adds what the indexes
 * tell of the steps and runs in flight and turns both into rows.
 */
#include "base/compat.h"

#include "fmgr.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "utils/jsonb.h"
#include "utils/fmgrprotos.h"
#include "utils/timestamp.h"

#include "base/classify.h"
#include "base/step_kind.h"
#include "ipc/executor_slot.h"
#include "ipc/step_counters.h"
#include "store/step_store.h"

PG_FUNCTION_INFO_V1(ds_step_counters);

/* "name": {"a": n, ...} over the kinds of step, `per` values each, named by `name_of`. */
static void
append_by_kind(StringInfo buf, const char *name, const uint64 *values, int per,
			   const char *(*name_of) (int))
{
	appendStringInfo(buf, ", \"%s\": {", name);
	for (int k = 0; k < N_STEP_KINDS; k++)
	{
		appendStringInfo(buf, "%s\"%s\": {", k > 0 ? ", " : "", ds_step_kinds[k].name);
		for (int i = 0; i < per; i++)
			appendStringInfo(buf, "%s\"%s\": " UINT64_FORMAT, i > 0 ? ", " : "", name_of(i),
							 values[k * per + i]);
		appendStringInfoChar(buf, '}');
	}
	appendStringInfoChar(buf, '}');
}

static const char *
class_name(int i)
{
	return ds_attempt_class_name((AttemptClass) i);
}

static const char *
status_name(int i)
{
	return ds_step_status_name((StepStatus) i);
}

Datum
ds_step_counters(PG_FUNCTION_ARGS)
{
	StepCounters c;
	StringInfoData buf;
	int			executors;
	int			busy;
	int			http_workers;
	static const char *const http_names[DS_COUNTED_HTTP_CLASSES] = {
		"none", "1xx", "2xx", "3xx", "4xx", "5xx"
	};

	initStringInfo(&buf);
	if (!ds_read_step_counters(&c))
		PG_RETURN_NULL();		/* not preloaded: nothing is counted */
	appendStringInfo(&buf, "{\"since\": %.6f",
					 (double) (c.since - SetEpochTimestamp()) / USECS_PER_SEC);
	append_by_kind(&buf, "attempts", &c.attempts[0][0], DS_COUNTED_CLASSES, class_name);
	append_by_kind(&buf, "recent", &c.recent[0][0], DS_COUNTED_CLASSES, class_name);
	append_by_kind(&buf, "outcomes", &c.outcomes[0][0], DS_COUNTED_STATUSES, status_name);
	appendStringInfoString(&buf, ", \"lost\": {");
	for (int k = 0; k < N_STEP_KINDS; k++)
		appendStringInfo(&buf, "%s\"%s\": " UINT64_FORMAT, k > 0 ? ", " : "",
						 ds_step_kinds[k].name, c.lost[k]);
	appendStringInfoString(&buf, "}, \"http\": {");
	for (int h = 0; h < DS_COUNTED_HTTP_CLASSES; h++)
		appendStringInfo(&buf, "%s\"%s\": " UINT64_FORMAT, h > 0 ? ", " : "", http_names[h],
						 c.http[h]);
	appendStringInfoChar(&buf, '}');

	/* the minutes of the last hour with attempts, by their Unix time */
	appendStringInfoString(&buf, ", \"minutes\": {");
	for (int i = 0, first = 1; i < DS_RECENT_MINUTES; i++)
	{
		if (c.minute_of[i] == 0)
			continue;
		appendStringInfo(&buf, "%s\"" INT64_FORMAT "\": {", first ? "" : ", ",
						 c.minute_of[i] * 60 - SetEpochTimestamp() / USECS_PER_SEC);
		first = 0;
		for (int k = 0; k < DS_COUNTED_CLASSES; k++)
			appendStringInfo(&buf, "%s\"%s\": " UINT64_FORMAT, k > 0 ? ", " : "", class_name(k),
							 c.minutes[i][k]);
		appendStringInfoChar(&buf, '}');
	}
	appendStringInfoChar(&buf, '}');

	/*
	 * this database's workers, as their slots say (written without a lock: a
	 * glance)
	 */
	ds_count_workers(MyDatabaseId, &executors, &busy, &http_workers);
	appendStringInfo(&buf, ", \"executors\": %d, \"executors_busy\": %d, \"http_workers\": %d}",
					 executors, busy, http_workers);
	PG_RETURN_DATUM(DirectFunctionCall1(jsonb_in, CStringGetDatum(buf.data)));
}
