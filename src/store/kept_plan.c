/*
 * kept_plan.c -- the extension's statements as kept plans (kept_plan.h).
 *
 * Every statement the extension runs on its own tables is prepared once per backend
 * (SPI_keepplan) and run here, so that each goes through ds_store_relations(), the one point
 * that checks the extension is installed; that check is cached per backend.
 */
#include "base/compat.h"

#include "lib/stringinfo.h"

#include "ipc/due_floors.h"
#include "store/store_relations.h"
#include "store/kept_plan.h"

SPIPlanPtr
ds_prepare_kept(SPIPlanPtr *slot, const char *sql, int nargs, Oid *argtypes)
{
	if (*slot == NULL)
	{
		SPIPlanPtr	plan = SPI_prepare(sql, nargs, argtypes);

		if (plan == NULL)
			elog(ERROR, "SPI_prepare failed for \"%s\": %s", sql,
				 SPI_result_code_string(SPI_result));
		if (SPI_keepplan(plan) != 0)
			elog(ERROR, "SPI_keepplan failed");
		*slot = plan;
	}
	return *slot;
}

uint64
ds_store_execute(SPIPlanPtr *slot, const char *sql, int nargs, Oid *argtypes, Datum *args,
				 const char *nulls, bool read_only, long count, int expected,
				 const char *what_fmt,...)
{
	volatile int rc = 0;

	(void) ds_store_relations();

	/*
	 * the extension's own statements note the steps and runs they make wait
	 * themselves; the statement triggers are for SQL written by others
	 * (ipc/due_floors.h)
	 */
	ds_due_floor_own_statement(true);
	PG_TRY();
	{
		rc = SPI_execute_plan(ds_prepare_kept(slot, sql, nargs, argtypes), args, nulls, read_only,
							  count);
	}
	PG_FINALLY();
	{
		ds_due_floor_own_statement(false);
	}
	PG_END_TRY();
	if (expected == DS_SPI_OK_ANY ? rc < 0 : rc != expected)
	{
		StringInfoData what;

		initStringInfo(&what);
		for (;;)
		{
			va_list		ap;
			int			needed;

			va_start(ap, what_fmt);
			needed = appendStringInfoVA(&what, what_fmt, ap);
			va_end(ap);
			if (needed == 0)
				break;
			enlargeStringInfo(&what, needed);
		}
		elog(ERROR, "%s failed: %s", what.data, SPI_result_code_string(rc));
	}
	return SPI_processed;
}
