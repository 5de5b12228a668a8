/*
 * outcome_json.c -- an attempt's outcome as jsonb (outcome_json.h).
 *
 * Written as JSON text and parsed by jsonb_in, read back key by key. Times and the retry delay
 * are int64 microseconds, kept as strings so that no precision goes through numeric.
 */
#include "base/compat.h"

#include "fmgr.h"
#include "lib/stringinfo.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/numeric.h"

#include "store/outcome_json.h"

static void
add_text(StringInfo buf, const char *key, const char *value)
{
	if (value == NULL)
		return;
	appendStringInfo(buf, ", \"%s\": ", key);
	escape_json(buf, value);
}

static void
add_int64(StringInfo buf, const char *key, int64 value)
{
	appendStringInfo(buf, ", \"%s\": \"" INT64_FORMAT "\"", key, value);
}

Jsonb *
ds_outcome_to_jsonb(const KeptOutcome *kept)
{
	const AttemptOutcome *o = &kept->outcome;
	StringInfoData buf;

	initStringInfo(&buf);
	appendStringInfo(&buf, "{\"class\": %d, \"sqlstate\": %d, \"pid\": %d", (int) o->cls,
					 o->sqlerrcode, kept->pid);
	add_text(&buf, "message", o->message);
	add_text(&buf, "detail", o->detail);
	add_text(&buf, "hint", o->hint);
	if (o->has_retry_after)
		add_int64(&buf, "retry_after", o->retry_after);
	add_int64(&buf, "started_at", o->started_at);
	add_int64(&buf, "finished_at", o->finished_at);
	add_int64(&buf, "claimed_at", kept->claimed_at);
	if (o->result != NULL)
		appendStringInfo(&buf, ", \"result\": %s",
						 JsonbToCString(NULL, &o->result->root, VARSIZE(o->result)));
	appendStringInfoChar(&buf, '}');
	return DatumGetJsonbP(DirectFunctionCall1(jsonb_in, CStringGetDatum(buf.data)));
}

/* The value of `key`; NULL when it is absent. */
static JsonbValue *
field(Jsonb *j, const char *key)
{
	return getKeyJsonValueFromContainer(&j->root, key, strlen(key), NULL);
}

static char *
text_field(Jsonb *j, const char *key)
{
	JsonbValue *v = field(j, key);

	if (v == NULL)
		return NULL;
	if (v->type != jbvString)
		elog(ERROR, "kept outcome field \"%s\" is not a string", key);
	return pnstrdup(v->val.string.val, v->val.string.len);
}

static int64
int64_field(Jsonb *j, const char *key, bool *present)
{
	char	   *s = text_field(j, key);

	if (present != NULL)
		*present = s != NULL;
	if (s == NULL)
	{
		if (present == NULL)
			elog(ERROR, "kept outcome has no \"%s\"", key);
		return 0;
	}
	return pg_strtoint64(s);
}

static int
int_field(Jsonb *j, const char *key)
{
	JsonbValue *v = field(j, key);

	if (v == NULL || v->type != jbvNumeric)
		elog(ERROR, "kept outcome field \"%s\" is not a number", key);
	return DatumGetInt32(DirectFunctionCall1(numeric_int4, NumericGetDatum(v->val.numeric)));
}

void
ds_outcome_from_jsonb(Jsonb *j, KeptOutcome *kept)
{
	AttemptOutcome *o = &kept->outcome;
	JsonbValue *result = field(j, "result");

	memset(kept, 0, sizeof(*kept));
	o->cls = (AttemptClass) int_field(j, "class");
	o->sqlerrcode = int_field(j, "sqlstate");
	kept->pid = int_field(j, "pid");
	o->message = text_field(j, "message");
	o->detail = text_field(j, "detail");
	o->hint = text_field(j, "hint");
	o->retry_after = int64_field(j, "retry_after", &o->has_retry_after);
	o->started_at = int64_field(j, "started_at", NULL);
	o->finished_at = int64_field(j, "finished_at", NULL);
	kept->claimed_at = int64_field(j, "claimed_at", NULL);
	o->result = result != NULL ? JsonbValueToJsonb(result) : NULL;
}
