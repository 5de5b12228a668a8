/*
 * classify.c -- which class an attempt's error falls in (docs/steps.md, "Outcome classes"), and the
 * helpers that let a step body choose its class explicitly.
 *
 * Order of decision: the explicit helpers (DS001-DS003) always mean what they say; then an exact
 * SQLSTATE in fail_on or retry_on; then a two-character class in fail_on or retry_on; then the
 * default table. The most specific rule wins, and fail_on wins a tie because failing closed is
 * the safe side.
 */
#include "base/compat.h"

#include "catalog/pg_type.h"
#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"

#include "base/classify.h"
#include "base/ds_errcodes.h"
#include "base/policy.h"

PG_FUNCTION_INFO_V1(ds_non_retriable);
PG_FUNCTION_INFO_V1(ds_retry_after);
PG_FUNCTION_INFO_V1(ds_blocked);

static bool retry_after_set = false;
static int64 retry_after_usecs = 0;

const char *
ds_attempt_class_name(AttemptClass cls)
{
	switch (cls)
	{
		case ATTEMPT_COMPLETED:
			return "completed";
		case ATTEMPT_RETRYABLE:
			return "retryable";
		case ATTEMPT_CORRECTABLE:
			return "correctable";
		case ATTEMPT_PERMANENT:
			return "permanent";
		case ATTEMPT_CANCELLED:
			return "cancelled";
		case ATTEMPT_UNCERTAIN:
			return "uncertain";
	}
	return "permanent";
}

/* Is `c` one of the characters a SQLSTATE is made of (digits and upper-case letters)? */
static bool
is_sqlstate_char(char c)
{
	return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z');
}

void
ds_parse_sqlstate_list(ArrayType *arr, const char *argname, int *n, int **codes, bool **is_class)
{
	Datum	   *elems;
	bool	   *nulls;
	int			nelems;

	*n = 0;
	*codes = NULL;
	*is_class = NULL;
	if (arr == NULL)
		return;
	if (ARR_NDIM(arr) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be a one-dimensional array", argname)));
	deconstruct_array(arr, TEXTOID, -1, false, TYPALIGN_INT, &elems, &nulls, &nelems);
	*codes = palloc(sizeof(int) * Max(nelems, 1));
	*is_class = palloc(sizeof(bool) * Max(nelems, 1));
	for (int i = 0; i < nelems; i++)
	{
		char	   *s;
		int			len;
		bool		ok = true;

		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("%s element %d is null", argname, i + 1)));
		s = TextDatumGetCString(elems[i]);
		len = strlen(s);
		if (len != 2 && len != 5)
			ok = false;
		for (int j = 0; ok && j < len; j++)
			ok = is_sqlstate_char(s[j]);
		if (!ok)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s element %d \"%s\" is not a SQLSTATE or a SQLSTATE class", argname,
							i + 1, s),
					 errhint("Give five-character SQLSTATEs such as '40001' or two-character classes such as '08', in upper case.")));
		if (len == 2)
		{
			(*codes)[i] = MAKE_SQLSTATE(s[0], s[1], '0', '0', '0');
			(*is_class)[i] = true;
		}
		else
		{
			(*codes)[i] = MAKE_SQLSTATE(s[0], s[1], s[2], s[3], s[4]);
			(*is_class)[i] = false;
		}
	}
	*n = nelems;
}

/* Does the error match a code (or, with want_class, a class) of the list? */
static bool
list_matches(int n, const int *codes, const bool *is_class, int sqlerrcode, bool want_class)
{
	for (int i = 0; i < n; i++)
	{
		if (is_class[i] != want_class)
			continue;
		if (want_class ? ERRCODE_TO_CATEGORY(sqlerrcode) == codes[i] : sqlerrcode == codes[i])
			return true;
	}
	return false;
}

/* The class of an error no retry_on/fail_on list names (docs/steps.md, "Outcome classes"). */
static AttemptClass
default_class(int sqlerrcode)
{
	int			category = ERRCODE_TO_CATEGORY(sqlerrcode);

	switch (sqlerrcode)
	{
		case ERRCODE_T_R_SERIALIZATION_FAILURE:
		case ERRCODE_T_R_DEADLOCK_DETECTED:
		case ERRCODE_LOCK_NOT_AVAILABLE:
		case ERRCODE_OBJECT_IN_USE:
		case ERRCODE_RAISE_EXCEPTION:
		case ERRCODE_DS_STEP_TIMEOUT:
		case ERRCODE_DS_INVOCATION_LOST:
		case ERRCODE_DS_IN_PROGRESS:

			/*
			 * recorded only in the worker: an operator stopped the attempt,
			 * not the step
			 */
		case ERRCODE_QUERY_CANCELED:
			return ATTEMPT_RETRYABLE;
		case ERRCODE_INSUFFICIENT_PRIVILEGE:
			return ATTEMPT_CORRECTABLE;
		default:
			break;
	}
	if (category == ERRCODE_CONNECTION_EXCEPTION ||
		category == ERRCODE_INSUFFICIENT_RESOURCES ||
		category == ERRCODE_SYSTEM_ERROR)
		return ATTEMPT_RETRYABLE;
	if (category == ERRCODE_DATA_EXCEPTION ||
		category == ERRCODE_INTEGRITY_CONSTRAINT_VIOLATION)
		return ATTEMPT_CORRECTABLE;
	return ATTEMPT_PERMANENT;
}

AttemptClass
ds_classify_sqlstate(int sqlerrcode, const ClassOverrides *o)
{
	switch (sqlerrcode)
	{
		case ERRCODE_DS_NON_RETRIABLE:
		case ERRCODE_DS_RESULT_TOO_LARGE:
		case ERRCODE_DS_TOO_MANY_ROWS:
			return ATTEMPT_PERMANENT;
		case ERRCODE_DS_RETRY_AFTER:
			return ATTEMPT_RETRYABLE;
		case ERRCODE_DS_BLOCKED:
		case ERRCODE_DS_NO_ROW:
			return ATTEMPT_CORRECTABLE;
		case ERRCODE_DS_STEP_TIMEOUT:
			if (o != NULL && o->timeout_fails)
				return ATTEMPT_PERMANENT;
			break;
		default:
			break;
	}
	if (o != NULL)
	{
		if (list_matches(o->n_fail, o->fail_on, o->fail_is_class, sqlerrcode, false))
			return ATTEMPT_PERMANENT;
		if (list_matches(o->n_retry, o->retry_on, o->retry_is_class, sqlerrcode, false))
			return ATTEMPT_RETRYABLE;
		if (list_matches(o->n_fail, o->fail_on, o->fail_is_class, sqlerrcode, true))
			return ATTEMPT_PERMANENT;
		if (list_matches(o->n_retry, o->retry_on, o->retry_is_class, sqlerrcode, true))
			return ATTEMPT_RETRYABLE;
	}
	return default_class(sqlerrcode);
}

void
ds_retry_after_clear(void)
{
	retry_after_set = false;
	retry_after_usecs = 0;
}

bool
ds_retry_after_get(int64 *usecs)
{
	if (retry_after_set)
		*usecs = retry_after_usecs;
	return retry_after_set;
}

/* The message argument of a DS helper, which must not be NULL. */
static char *
message_arg(FunctionCallInfo fcinfo, int argno)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("message must not be null")));
	return text_to_cstring(PG_GETARG_TEXT_PP(argno));
}

/* ds_non_retriable(message): fail the step at once. */
Datum
ds_non_retriable(PG_FUNCTION_ARGS)
{
	char	   *message = message_arg(fcinfo, 0);

	ereport(ERROR, (errcode(ERRCODE_DS_NON_RETRIABLE), errmsg_internal("%s", message)));
	PG_RETURN_VOID();
}

/* ds_retry_after(message, delay): retry, with exactly this delay instead of the backoff once. */
Datum
ds_retry_after(PG_FUNCTION_ARGS)
{
	char	   *message = message_arg(fcinfo, 0);
	int64		usecs;

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("delay must not be null")));
	usecs = ds_interval_to_usecs(PG_GETARG_INTERVAL_P(1));
	if (usecs < 0 || usecs > DS_MAX_DELAY_USECS)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("retry delay must be between 0 and 24 hours")));
	retry_after_set = true;
	retry_after_usecs = usecs;
	ereport(ERROR,
			(errcode(ERRCODE_DS_RETRY_AFTER),
			 errmsg_internal("%s", message),
			 errdetail("Retry after %s.",
					   DatumGetCString(DirectFunctionCall1(interval_out,
														   IntervalPGetDatum(PG_GETARG_INTERVAL_P(1)))))));
	PG_RETURN_VOID();
}

/* ds_blocked(message, remediation): the step waits for corrected input; the hint carries the fix. */
Datum
ds_blocked(PG_FUNCTION_ARGS)
{
	char	   *message = message_arg(fcinfo, 0);
	char	   *remediation;

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("remediation must not be null"),
				 errhint("Say what must change before the step can be re-armed with ds_retry_step.")));
	remediation = text_to_cstring(PG_GETARG_TEXT_PP(1));
	ereport(ERROR,
			(errcode(ERRCODE_DS_BLOCKED),
			 errmsg_internal("%s", message),
			 errhint("%s", remediation)));
	PG_RETURN_VOID();
}
