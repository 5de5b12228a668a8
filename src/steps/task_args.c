/*
 * task_args.c -- the checked arguments of the calls of tasks (task_args.h).
 */
#include "base/compat.h"

#include "catalog/pg_type.h"
#include "utils/array.h"
#include "utils/builtins.h"

#include "base/policy.h"
#include "steps/step_call.h"
#include "steps/task_args.h"

char *
ds_task_name_arg(FunctionCallInfo fcinfo, int argno)
{
	char	   *name;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("task must not be null")));
	name = text_to_cstring(PG_GETARG_TEXT_PP(argno));
	ds_check_task_name(name);
	return name;
}

void
ds_check_task_name(const char *name)
{
	if (name[0] == '\0' || strlen(name) > DS_MAX_TASK_NAME)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a task name must be 1 to %d bytes", DS_MAX_TASK_NAME)));
}

/* Argument `argno`, an interval in (0, 24 hours] in microseconds; `if_null` for NULL. */
int64
ds_task_interval_arg(FunctionCallInfo fcinfo, int argno, const char *name, int64 if_null)
{
	int64		usecs;

	if (PG_ARGISNULL(argno))
		return if_null;
	usecs = ds_interval_to_usecs(PG_GETARG_INTERVAL_P(argno));
	if (usecs <= 0 || usecs > DS_MAX_DELAY_USECS)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be more than 0 and at most 24 hours", name)));
	return usecs;
}

/* A text[] argument: not NULL (unless `may_be_null`), no NULL or invalid element. */
ArrayType *
ds_task_names_arg(FunctionCallInfo fcinfo, int argno, const char *name, bool may_be_null)
{
	ArrayType  *a;
	Datum	   *elems;
	bool	   *nulls;
	int			n;

	if (PG_ARGISNULL(argno))
	{
		if (may_be_null)
			return NULL;
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", name)));
	}
	a = PG_GETARG_ARRAYTYPE_P_COPY(argno);
	if (ARR_NDIM(a) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be a one-dimensional array", name)));
	deconstruct_array(a, TEXTOID, -1, false, TYPALIGN_INT, &elems, &nulls, &n);
	if (n == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must name at least one", name)));
	for (int i = 0; i < n; i++)
	{
		char	   *s;

		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("%s must not contain nulls", name)));
		s = TextDatumGetCString(elems[i]);
		if (s[0] == '\0' || strlen(s) > DS_MAX_TASK_NAME)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("each of %s must be 1 to %d bytes", name, DS_MAX_TASK_NAME)));
	}
	return a;
}

char *
ds_task_fingerprint(const char *task, bool expect_row, Jsonb *input, const char *on_success,
					const char *on_failure)
{
	/*
	 * as a SQL step's (ds_sql_step_fingerprint): one without it hashes as
	 * before
	 */
	return ds_step_fingerprint(psprintf("%stask %s", expect_row ? "expect row\n" : "", task),
							   input, on_success, on_failure);
}
