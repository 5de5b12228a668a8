/*
 * policy.c -- retry policies (docs/steps.md, "Retry policy").
 *
 * A policy is jsonb. Every layer (the setting, a run's default, a step's own) may set any subset
 * of the keys; the layers are laid over the built-in defaults in order of precedence and the
 * result is checked as a whole (max_delay >= initial_delay).
 */
#include "base/compat.h"

#include <math.h>

#include "common/pg_prng.h"
#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/numeric.h"

#include "base/policy.h"

static char *default_retry_policy_text = NULL;

/* the setting, parsed once by its check hook */
static RetryPolicy *default_retry_policy = NULL;

PG_FUNCTION_INFO_V1(ds_retry_policy);
PG_FUNCTION_INFO_V1(ds_backoff_delay);

/* The built-in policy: 5 attempts, exponential from 1 s to 10 min, no jitter. */
static void
policy_builtin(RetryPolicy *p)
{
	p->set = POLICY_ALL_KEYS;
	p->max_attempts = 5;
	p->initial_delay = USECS_PER_SEC;
	p->max_delay = 10 * USECS_PER_MINUTE;
	p->exponential = true;
	p->multiplier = 2.0;
	p->jitter = 0.0;
	p->limit_name = NULL;
	p->limit_key = NULL;
}

/* Raise the error of an invalid policy field. */
pg_noreturn static void
policy_field_error(const char *field, const char *problem)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("invalid retry policy field \"%s\": %s", field, problem)));
}

int64
ds_interval_to_usecs(const Interval *interval)
{
	/*
	 * months count as 30 days, as EXTRACT(epoch) does; overflow is checked by
	 * the caller's range
	 */
	double		usecs = (double) interval->time +
		(double) interval->day * USECS_PER_DAY +
		(double) interval->month * DAYS_PER_MONTH * USECS_PER_DAY;

	if (usecs > (double) PG_INT64_MAX / 2)
		return PG_INT64_MAX / 2;
	if (usecs < (double) PG_INT64_MIN / 2)
		return PG_INT64_MIN / 2;
	return (int64) usecs;
}

Interval *
ds_usecs_to_interval(int64 usecs)
{
	Interval   *result = palloc0(sizeof(Interval));

	result->time = usecs;
	return result;
}

/* The numeric value of policy field `field`, which must be a JSON number. */
static double
jsonb_number(JsonbValue *v, const char *field)
{
	double		d;

	if (v->type != jbvNumeric)
		policy_field_error(field, "must be a number");
	d = DatumGetFloat8(DirectFunctionCall1(numeric_float8_no_overflow,
										   NumericGetDatum(v->val.numeric)));
	if (isnan(d) || isinf(d))
		policy_field_error(field, "must be a finite number");
	return d;
}

/* A delay is interval text ("1 s", "00:05:00") or a number of milliseconds. */
static int64
jsonb_delay(JsonbValue *v, const char *field)
{
	int64		usecs;

	if (v->type == jbvNumeric)
	{
		double		ms = jsonb_number(v, field);

		if (ms < 0)
			policy_field_error(field, "must not be negative");
		if (ms * 1000.0 > (double) DS_MAX_DELAY_USECS)
			policy_field_error(field, "must be at most 24 hours");
		usecs = (int64) rint(ms * 1000.0);
	}
	else if (v->type == jbvString)
	{
		char	   *text = pnstrdup(v->val.string.val, v->val.string.len);
		Interval   *interval = NULL;
		MemoryContext oldcxt = CurrentMemoryContext;

		/*
		 * interval_in raises 22007 for bad text; the contract wants 22023
		 * naming the field
		 */
		PG_TRY();
		{
			interval = DatumGetIntervalP(DirectFunctionCall3(interval_in,
															 CStringGetDatum(text),
															 ObjectIdGetDatum(InvalidOid),
															 Int32GetDatum(-1)));
		}
		PG_CATCH();
		{
			MemoryContextSwitchTo(oldcxt);
			FlushErrorState();
			policy_field_error(field, "must be an interval or a number of milliseconds");
		}
		PG_END_TRY();
		usecs = ds_interval_to_usecs(interval);
		if (usecs < 0)
			policy_field_error(field, "must not be negative");
		if (usecs > DS_MAX_DELAY_USECS)
			policy_field_error(field, "must be at most 24 hours");
	}
	else
		policy_field_error(field, "must be an interval or a number of milliseconds");
	return usecs;
}

void
ds_policy_parse(Jsonb *policy, RetryPolicy *out)
{
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;

	memset(out, 0, sizeof(*out));
	if (policy == NULL)
		return;
	if (!JB_ROOT_IS_OBJECT(policy))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("retry policy must be a JSON object")));

	it = JsonbIteratorInit(&policy->root);
	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		char	   *key;
		JsonbValue	val;

		if (tok != WJB_KEY)
			continue;
		key = pnstrdup(v.val.string.val, v.val.string.len);
		tok = JsonbIteratorNext(&it, &val, true);
		Assert(tok == WJB_VALUE);

		if (strcmp(key, "max_attempts") == 0)
		{
			double		d = jsonb_number(&val, key);

			if (d != floor(d))
				policy_field_error(key, "must be a whole number");
			if (d < 1 || d > 100)
				policy_field_error(key, "must be between 1 and 100");
			out->max_attempts = (int) d;
			out->set |= POLICY_MAX_ATTEMPTS;
		}
		else if (strcmp(key, "initial_delay") == 0)
		{
			out->initial_delay = jsonb_delay(&val, key);
			out->set |= POLICY_INITIAL_DELAY;
		}
		else if (strcmp(key, "max_delay") == 0)
		{
			out->max_delay = jsonb_delay(&val, key);
			out->set |= POLICY_MAX_DELAY;
		}
		else if (strcmp(key, "backoff") == 0)
		{
			if (val.type != jbvString)
				policy_field_error(key, "must be \"fixed\" or \"exponential\"");
			if (val.val.string.len == 5 && strncmp(val.val.string.val, "fixed", 5) == 0)
				out->exponential = false;
			else if (val.val.string.len == 11 &&
					 strncmp(val.val.string.val, "exponential", 11) == 0)
				out->exponential = true;
			else
				policy_field_error(key, "must be \"fixed\" or \"exponential\"");
			out->set |= POLICY_BACKOFF;
		}
		else if (strcmp(key, "multiplier") == 0)
		{
			double		d = jsonb_number(&val, key);

			if (d < 1 || d > 10)
				policy_field_error(key, "must be between 1 and 10");
			out->multiplier = d;
			out->set |= POLICY_MULTIPLIER;
		}
		else if (strcmp(key, "jitter") == 0)
		{
			double		d = jsonb_number(&val, key);

			if (d < 0 || d > 1)
				policy_field_error(key, "must be between 0 and 1");
			out->jitter = d;
			out->set |= POLICY_JITTER;
		}
		else if (strcmp(key, "limit") == 0)
		{
			if (val.type != jbvString || val.val.string.len < 1 ||
				val.val.string.len > DS_MAX_LIMIT_NAME)
				policy_field_error(key, psprintf("must be the name of a limit, 1 to %d bytes",
												 DS_MAX_LIMIT_NAME));
			out->limit_name = pnstrdup(val.val.string.val, val.val.string.len);
			out->set |= POLICY_LIMIT;
		}
		else if (strcmp(key, "limit_key") == 0)
		{
			if (val.type != jbvString || val.val.string.len > DS_MAX_LIMIT_KEY)
				policy_field_error(key, psprintf("must be a string of at most %d bytes",
												 DS_MAX_LIMIT_KEY));
			out->limit_key = pnstrdup(val.val.string.val, val.val.string.len);
			out->set |= POLICY_LIMIT;
		}
		else
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("invalid retry policy field \"%s\": unknown field", key),
					 errhint("Known fields are max_attempts, initial_delay, max_delay, backoff, multiplier, jitter, limit and limit_key.")));
	}
	if (out->limit_key != NULL && out->limit_name == NULL)
		policy_field_error("limit_key", "needs \"limit\", the limit it is a key of");
	if (out->limit_name != NULL && out->limit_key == NULL)
		out->limit_key = "";

	/*
	 * Within one layer both delays are known: check them against each other
	 * right away.
	 */
	if ((out->set & POLICY_INITIAL_DELAY) && (out->set & POLICY_MAX_DELAY) &&
		out->max_delay < out->initial_delay)
		policy_field_error("max_delay", "must not be less than initial_delay");
}

/* Copy the fields `upper` sets over those of `base`. */
static void
policy_overlay(RetryPolicy *base, const RetryPolicy *upper)
{
	if (upper->set & POLICY_MAX_ATTEMPTS)
		base->max_attempts = upper->max_attempts;
	if (upper->set & POLICY_INITIAL_DELAY)
		base->initial_delay = upper->initial_delay;
	if (upper->set & POLICY_MAX_DELAY)
		base->max_delay = upper->max_delay;
	if (upper->set & POLICY_BACKOFF)
		base->exponential = upper->exponential;
	if (upper->set & POLICY_MULTIPLIER)
		base->multiplier = upper->multiplier;
	if (upper->set & POLICY_JITTER)
		base->jitter = upper->jitter;
	base->set |= upper->set;
}

/*
 * A limit admits one step's attempts (docs/limits.md): a run's policy, or the setting under
 * every step, naming one would hold back every step under it, synchronous ones included.
 */
void
ds_policy_refuse_limit(const RetryPolicy *layer, const char *where)
{
	if (layer->set & POLICY_LIMIT)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid retry policy field \"limit\": not allowed in %s", where),
				 errhint("Name a limit in the policy of each step it admits.")));
}

void
ds_policy_resolve(Jsonb *run_policy, Jsonb *step_policy, RetryPolicy *out)
{
	RetryPolicy layer;

	policy_builtin(out);
	if (default_retry_policy != NULL)
		policy_overlay(out, default_retry_policy);
	if (run_policy != NULL)
	{
		ds_policy_parse(run_policy, &layer);
		ds_policy_refuse_limit(&layer, "a run's policy");
		policy_overlay(out, &layer);
	}
	if (step_policy != NULL)
	{
		ds_policy_parse(step_policy, &layer);
		policy_overlay(out, &layer);
		/* the step's own: a limit is never inherited (docs/limits.md) */
		out->limit_name = layer.limit_name;
		out->limit_key = layer.limit_key;
	}
	if (out->max_delay < out->initial_delay)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid retry policy field \"max_delay\": must not be less than initial_delay"),
				 errdetail("After precedence the policy has initial_delay %lld ms and max_delay %lld ms.",
						   (long long) (out->initial_delay / 1000),
						   (long long) (out->max_delay / 1000)),
				 errhint("Set max_delay together with initial_delay.")));
}

/* Add key `key` to the jsonb object being built. */
static void
push_key(DsJsonbBuilder *state, const char *key)
{
	JsonbValue	k;

	k.type = jbvString;
	k.val.string.val = (char *) key;
	k.val.string.len = strlen(key);
	ds_jsonb_push(state, WJB_KEY, &k);
}

/* Add `key`: a JSON number given as text. */
static void
push_number(DsJsonbBuilder *state, const char *key, const char *number)
{
	JsonbValue	v;

	push_key(state, key);
	v.type = jbvNumeric;
	v.val.numeric = DatumGetNumeric(DirectFunctionCall3(numeric_in, CStringGetDatum(number),
														ObjectIdGetDatum(InvalidOid),
														Int32GetDatum(-1)));
	ds_jsonb_push(state, WJB_VALUE, &v);
}

/* Add `key`: a delay, as an interval's text. */
static void
push_delay(DsJsonbBuilder *state, const char *key, int64 usecs)
{
	char		buf[64];

	if (usecs % 1000 == 0)
		snprintf(buf, sizeof(buf), INT64_FORMAT, usecs / 1000);
	else
		snprintf(buf, sizeof(buf), "%.3f", (double) usecs / 1000.0);
	push_number(state, key, buf);
}

Jsonb *
ds_policy_to_jsonb(const RetryPolicy *p)
{
	DsJsonbBuilder state = {0};
	JsonbValue *res;
	char		buf[64];

	ds_jsonb_push(&state, WJB_BEGIN_OBJECT, NULL);
	if (p->set & POLICY_MAX_ATTEMPTS)
	{
		snprintf(buf, sizeof(buf), "%d", p->max_attempts);
		push_number(&state, "max_attempts", buf);
	}
	if (p->set & POLICY_INITIAL_DELAY)
		push_delay(&state, "initial_delay", p->initial_delay);
	if (p->set & POLICY_MAX_DELAY)
		push_delay(&state, "max_delay", p->max_delay);
	if (p->set & POLICY_BACKOFF)
	{
		JsonbValue	v;

		push_key(&state, "backoff");
		v.type = jbvString;
		v.val.string.val = p->exponential ? "exponential" : "fixed";
		v.val.string.len = strlen(v.val.string.val);
		ds_jsonb_push(&state, WJB_VALUE, &v);
	}
	if (p->set & POLICY_MULTIPLIER)
	{
		snprintf(buf, sizeof(buf), "%.15g", p->multiplier);
		push_number(&state, "multiplier", buf);
	}
	if (p->set & POLICY_JITTER)
	{
		snprintf(buf, sizeof(buf), "%.15g", p->jitter);
		push_number(&state, "jitter", buf);
	}
	if (p->limit_name != NULL)
	{
		JsonbValue	v;

		push_key(&state, "limit");
		v.type = jbvString;
		v.val.string.val = p->limit_name;
		v.val.string.len = strlen(p->limit_name);
		ds_jsonb_push(&state, WJB_VALUE, &v);
		push_key(&state, "limit_key");
		v.val.string.val = p->limit_key;
		v.val.string.len = strlen(p->limit_key);
		ds_jsonb_push(&state, WJB_VALUE, &v);
	}
	res = ds_jsonb_push(&state, WJB_END_OBJECT, NULL);
	return JsonbValueToJsonb(res);
}

int64
ds_policy_backoff_delay(const RetryPolicy *p, int failed_attempt)
{
	double		delay;

	if (!p->exponential || failed_attempt <= 1)
		delay = (double) p->initial_delay;
	else
	{
		/*
		 * initial × multiplier^(n-1); pow() saturates to +inf, which the cap
		 * absorbs
		 */
		delay = (double) p->initial_delay * pow(p->multiplier, failed_attempt - 1);
	}
	if (delay > (double) p->max_delay)
		delay = (double) p->max_delay;
	/* jitter applies after the cap: a draw from [d × (1 − jitter), d] */
	if (p->jitter > 0)
		delay -= delay * p->jitter * pg_prng_double(&pg_global_prng_state);
	return (int64) rint(delay);
}

/*
 * The setting is parsed by its check hook so that a bad value is refused where it is set
 * (SET, ALTER SYSTEM, the config file), not discovered later by a step.
 */
static bool
check_default_retry_policy(char **newval, void **extra, GucSource source)
{
	MemoryContext oldcxt = CurrentMemoryContext;
	RetryPolicy parsed;
	RetryPolicy *result;
	volatile bool ok = true;	/* set in PG_CATCH, read after it */

	memset(&parsed, 0, sizeof(parsed));
	if (*newval != NULL && (*newval)[0] != '\0')
	{
		/*
		 * json parsing and validation only allocate memory: safe to catch
		 * without a subxact
		 */
		PG_TRY();
		{
			Jsonb	   *j = DatumGetJsonbP(DirectFunctionCall1(jsonb_in,
															   CStringGetDatum(*newval)));
			RetryPolicy merged;

			ds_policy_parse(j, &parsed);
			ds_policy_refuse_limit(&parsed, "durable_steps.default_retry_policy");
			policy_builtin(&merged);
			policy_overlay(&merged, &parsed);
			if (merged.max_delay < merged.initial_delay)
				policy_field_error("max_delay", "must not be less than initial_delay");
		}
		PG_CATCH();
		{
			ErrorData  *edata;

			MemoryContextSwitchTo(oldcxt);
			edata = CopyErrorData();
			FlushErrorState();
			GUC_check_errdetail("%s", edata->message);
			FreeErrorData(edata);
			ok = false;
		}
		PG_END_TRY();
	}
	if (!ok)
		return false;
	result = (RetryPolicy *) ds_guc_extra_malloc(sizeof(RetryPolicy));
	if (result == NULL)
		return false;
	*result = parsed;
	*extra = result;
	return true;
}

/* Make the checked durable_steps.default_retry_policy the one in force. */
static void
assign_default_retry_policy(const char *newval, void *extra)
{
	RetryPolicy *p = (RetryPolicy *) extra;

	default_retry_policy = (p != NULL && p->set != 0) ? p : NULL;
}

void
ds_policy_init_module(void)
{
	DefineCustomStringVariable("durable_steps.default_retry_policy",
							   "Retry policy keys applied to every step below its run's and its own policy.",
							   "A JSON object with any of max_attempts, initial_delay, max_delay, backoff, multiplier and jitter.",
							   &default_retry_policy_text,
							   "",
							   PGC_USERSET,
							   0,
							   check_default_retry_policy,
							   assign_default_retry_policy,
							   NULL);
}

/* ds_retry_policy(max_attempts, initial_delay, max_delay, backoff, multiplier, jitter) → jsonb */
Datum
ds_retry_policy(PG_FUNCTION_ARGS)
{
	DsJsonbBuilder state = {0};
	JsonbValue *res;
	Jsonb	   *built;
	RetryPolicy parsed;
	char		buf[64];

	/*
	 * Build the jsonb a user would have written, then validate it through the
	 * one parser.
	 */
	ds_jsonb_push(&state, WJB_BEGIN_OBJECT, NULL);
	if (!PG_ARGISNULL(0))
	{
		snprintf(buf, sizeof(buf), "%d", PG_GETARG_INT32(0));
		push_number(&state, "max_attempts", buf);
	}
	if (!PG_ARGISNULL(1))
	{
		int64		usecs = ds_interval_to_usecs(PG_GETARG_INTERVAL_P(1));

		if (usecs < 0)
			policy_field_error("initial_delay", "must not be negative");
		push_delay(&state, "initial_delay", usecs);
	}
	if (!PG_ARGISNULL(2))
	{
		int64		usecs = ds_interval_to_usecs(PG_GETARG_INTERVAL_P(2));

		if (usecs < 0)
			policy_field_error("max_delay", "must not be negative");
		push_delay(&state, "max_delay", usecs);
	}
	if (!PG_ARGISNULL(3))
	{
		JsonbValue	v;
		text	   *t = PG_GETARG_TEXT_PP(3);

		push_key(&state, "backoff");
		v.type = jbvString;
		v.val.string.val = VARDATA_ANY(t);
		v.val.string.len = VARSIZE_ANY_EXHDR(t);
		ds_jsonb_push(&state, WJB_VALUE, &v);
	}
	if (!PG_ARGISNULL(4))
	{
		double		d = PG_GETARG_FLOAT8(4);

		if (isnan(d) || isinf(d))
			policy_field_error("multiplier", "must be a finite number");
		snprintf(buf, sizeof(buf), "%.15g", d);
		push_number(&state, "multiplier", buf);
	}
	if (!PG_ARGISNULL(5))
	{
		double		d = PG_GETARG_FLOAT8(5);

		if (isnan(d) || isinf(d))
			policy_field_error("jitter", "must be a finite number");
		snprintf(buf, sizeof(buf), "%.15g", d);
		push_number(&state, "jitter", buf);
	}
	res = ds_jsonb_push(&state, WJB_END_OBJECT, NULL);
	built = JsonbValueToJsonb(res);

	ds_policy_parse(built, &parsed);
	PG_RETURN_JSONB_P(ds_policy_to_jsonb(&parsed));
}

/* ds_backoff_delay(policy, attempt) → the delay after failed attempt `attempt` */
Datum
ds_backoff_delay(PG_FUNCTION_ARGS)
{
	RetryPolicy resolved;
	int32		attempt;

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("attempt must not be null")));
	attempt = PG_GETARG_INT32(1);
	if (attempt < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("attempt must be at least 1"),
				 errdetail("Attempt %d was given; attempts are numbered from 1.", attempt)));
	ds_policy_resolve(NULL, PG_ARGISNULL(0) ? NULL : PG_GETARG_JSONB_P(0), &resolved);
	PG_RETURN_INTERVAL_P(ds_usecs_to_interval(ds_policy_backoff_delay(&resolved, attempt)));
}
