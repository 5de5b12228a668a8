/*
 * interval_bounds.c -- a timestamp plus or minus an interval, without an error past the range of
 * timestamptz (interval_bounds.h).
 *
 * PostgreSQL's timestamptz_pl_interval and timestamptz_mi_interval are the arithmetic a user's
 * SQL would do (months and days in the session's time zone), so they are called as they are;
 * their one range error is caught and answered as false.
 */
#include "base/compat.h"

#include "fmgr.h"
#include "utils/elog.h"
#include "utils/fmgrprotos.h"
#include "utils/timestamp.h"

#include "base/interval_bounds.h"

bool
ds_timestamptz_shift(TimestampTz t, const Interval *i, int sign, TimestampTz *out)
{
	MemoryContext cxt = CurrentMemoryContext;
	volatile bool in_range = true;

	PG_TRY();
	{
		*out = DatumGetTimestampTz(DirectFunctionCall2(sign >= 0 ? timestamptz_pl_interval :
													   timestamptz_mi_interval,
													   TimestampTzGetDatum(t),
													   IntervalPGetDatum(i)));
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		if (edata->sqlerrcode != ERRCODE_DATETIME_VALUE_OUT_OF_RANGE)
			PG_RE_THROW();
		FlushErrorState();
		FreeErrorData(edata);
		in_range = false;
	}
	PG_END_TRY();

	/*
	 * an infinite interval (PostgreSQL 17 and later) reaches past every
	 * timestamp too
	 */
	return in_range && !TIMESTAMP_NOT_FINITE(*out);
}
