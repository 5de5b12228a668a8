/*
 * http_response.c -- the classification of HTTP outcomes (docs/http.md).
 *
 *   2xx                                    completed: the response is the step's result
 *   408 425 429 500 502 503 504            retryable (Retry-After, capped at 24 h, sets the delay)
 *   other 1xx 3xx 4xx                      correctable: blocked, the response kept
 *   other 5xx                              permanent: failed, the response kept
 *   (a step's retry_on_status / fail_on_status override these rows for the statuses they name)
 *   oversized, or not the JSON expected    permanent: fail closed
 *   no connection, request never sent      retryable
 *   timeout or connection lost after the request may have been sent:
 *                                          retryable when a repeat is safe, else uncertain
 *
 * Runs in the worker, outside libcurl's callbacks, in a transaction: errors here are errors.
 */
#include "base/compat.h"

#include "mb/pg_wchar.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/numeric.h"
#include "utils/timestamp.h"

#include "base/ds_errcodes.h"
#include "http/http_response.h"
#include "base/policy.h"

/* Does `list` name `status` exactly (exact) or by its class (!exact)? */
static bool
status_listed(const HttpStatusList *list, long status, bool exact)
{
	for (int i = 0; i < list->n; i++)
		if (list->is_class[i] != exact &&
			list->codes[i] == (exact ? status : status / 100))
			return true;
	return false;
}

/*
 * The class the step's own lists give a status: an exact status beats a class, and
 * fail_on_status wins a tie (as retry_on / fail_on do for SQLSTATEs). -1: the lists are silent.
 */
static int
status_class_by_rules(const HttpStatusRules *rules, long status)
{
	if (rules == NULL)
		return -1;
	for (int exact = 1; exact >= 0; exact--)
	{
		if (status_listed(&rules->fail_on, status, exact))
			return ATTEMPT_PERMANENT;
		if (status_listed(&rules->retry_on, status, exact))
			return ATTEMPT_RETRYABLE;
	}
	return -1;
}

/* Is this status worth sending again as it is? */
static bool
status_is_retryable(long status)
{
	return status == 408 || status == 425 || status == 429 || status == 500 ||
		status == 502 || status == 503 || status == 504;
}

int64
ds_http_retry_after_usecs(const char *value, TimestampTz now)
{
	const char *p = value;
	int64		usecs;

	while (*p == ' ' || *p == '\t')
		p++;
	if (*p >= '0' && *p <= '9')
	{
		/* delay-seconds: digits only */
		int64		secs = 0;

		for (; *p >= '0' && *p <= '9'; p++)
			if ((secs = secs * 10 + (*p - '0')) > 24 * 3600)
				secs = 24 * 3600 + 1;
		while (*p == ' ' || *p == '\t')
			p++;
		if (*p != '\0')
			return -1;
		usecs = secs * USECS_PER_SEC;
	}
	else
	{
		/* an HTTP-date, read by libcurl's date parser */
		time_t		t = curl_getdate(p, NULL);

		if (t == (time_t) -1)
			return -1;
		usecs = time_t_to_timestamptz(t) - now;
		if (usecs < 0)
			usecs = 0;
	}
	return Min(usecs, DS_MAX_DELAY_USECS);
}

/* A string as a jsonb string value; false when it is not valid in the database encoding. */
static bool
text_value(const char *s, size_t len, JsonbValue *v)
{
	if (memchr(s, '\0', len) != NULL || !pg_verifymbstr(s, (int) len, true))
		return false;
	v->type = jbvString;
	v->val.string.val = (char *) s;
	v->val.string.len = (int) len;
	return true;
}

/* Push one key of an object. */
static void
push_key(DsJsonbBuilder *state, const char *key)
{
	JsonbValue	k;

	k.type = jbvString;
	k.val.string.val = (char *) key;
	k.val.string.len = strlen(key);
	(void) ds_jsonb_push(state, WJB_KEY, &k);
}

/* The value of header `name` (lower case) in `head`, trimmed; NULL when it has none. */
static char *
header_value(const char *head, size_t len, const char *name)
{
	char	   *copy = pnstrdup(head ? head : "", len);
	char	   *save = NULL;
	size_t		name_len = strlen(name);

	for (char *line = strtok_r(copy, "\r\n", &save); line != NULL;
		 line = strtok_r(NULL, "\r\n", &save))
	{
		char	   *value;
		char	   *end;

		if (strlen(line) <= name_len || line[name_len] != ':' ||
			pg_strncasecmp(line, name, name_len) != 0)
			continue;
		value = line + name_len + 1;
		while (*value == ' ' || *value == '\t')
			value++;
		end = value + strlen(value);
		while (end > value && (end[-1] == ' ' || end[-1] == '\t'))
			*--end = '\0';
		return value;
	}
	return NULL;
}

int64
ds_http_rate_limit_wait_usecs(const HttpResponse *resp, TimestampTz now)
{
	char	   *value = header_value(resp->head, resp->head_len, "retry-after");
	int64		secs = 0;
	const char *p;

	if (value != NULL)
		return ds_http_retry_after_usecs(value, now);
	value = header_value(resp->head, resp->head_len, "x-ratelimit-reset");
	if (value == NULL || *value < '0' || *value > '9')
		return -1;
	for (p = value; *p >= '0' && *p <= '9'; p++)
		if ((secs = secs * 10 + (*p - '0')) > INT64CONST(100000000000))
			return -1;
	if (*p != '\0')
		return -1;
	/* a number past a year of seconds is a Unix time */
	if (secs > 365 * 24 * 3600)
	{
		int64		usecs = time_t_to_timestamptz((pg_time_t) secs) - now;

		return Min(Max(usecs, 0), DS_MAX_DELAY_USECS);
	}
	return Min(secs * USECS_PER_SEC, DS_MAX_DELAY_USECS);
}

/*
 * The header lines as an object: names in lower case, repeated headers joined with ", " (as
 * RFC 9110 allows), lines that are not valid text left out. *retry_after: its value, or NULL.
 */
static Jsonb *
headers_jsonb(const char *head, size_t len, char **retry_after)
{
	DsJsonbBuilder state = {0};
	char	   *copy = pnstrdup(head ? head : "", len);
	char	   *line;
	char	   *save = NULL;
	int			n = 0;
	int			cap = 16;
	char	  **names = palloc(sizeof(char *) * cap);
	StringInfoData *values = palloc(sizeof(StringInfoData) * cap);

	*retry_after = NULL;
	for (line = strtok_r(copy, "\r\n", &save); line != NULL; line = strtok_r(NULL, "\r\n", &save))
	{
		char	   *colon = strchr(line, ':');
		char	   *value;
		int			i;

		if (colon == NULL || colon == line)
			continue;			/* the status line, or not a header */
		*colon = '\0';
		for (char *c = line; *c; c++)
			*c = pg_tolower((unsigned char) *c);
		value = colon + 1;
		while (*value == ' ' || *value == '\t')
			value++;
		for (i = 0; i < n; i++)
			if (strcmp(names[i], line) == 0)
				break;
		if (i == n)
		{
			if (n == cap)
			{
				cap *= 2;
				names = repalloc(names, sizeof(char *) * cap);
				values = repalloc(values, sizeof(StringInfoData) * cap);
			}
			names[n] = line;
			initStringInfo(&values[n]);
			n++;
		}
		else
			appendStringInfoString(&values[i], ", ");
		appendStringInfoString(&values[i], value);
	}
	(void) ds_jsonb_push(&state, WJB_BEGIN_OBJECT, NULL);
	for (int i = 0; i < n; i++)
	{
		JsonbValue	v;

		/* trailing blanks are not part of a value */
		while (values[i].len > 0 && (values[i].data[values[i].len - 1] == ' ' ||
									 values[i].data[values[i].len - 1] == '\t'))
			values[i].data[--values[i].len] = '\0';
		if (!text_value(names[i], strlen(names[i]), &v) ||
			!text_value(values[i].data, values[i].len, &v))
			continue;
		if (strcmp(names[i], "retry-after") == 0)
			*retry_after = values[i].data;
		push_key(&state, names[i]);
		(void) ds_jsonb_push(&state, WJB_VALUE, &v);
	}
	return JsonbValueToJsonb(ds_jsonb_push(&state, WJB_END_OBJECT, NULL));
}

/* The body as JSON; NULL (no error) when it is not valid JSON. */
static Jsonb *
parse_json_body(const char *body, size_t len)
{
	MemoryContext oldcxt = CurrentMemoryContext;
	Jsonb	   *volatile parsed = NULL;

	if (memchr(body, '\0', len) != NULL)
		return NULL;

	/*
	 * jsonb_in only allocates and raises: its error can be caught without a
	 * subtransaction
	 */
	PG_TRY();
	{
		parsed = DatumGetJsonbP(DirectFunctionCall1(jsonb_in, CStringGetDatum(body)));
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(oldcxt);
		FlushErrorState();
		parsed = NULL;
	}
	PG_END_TRY();
	return parsed;
}

/*
 * {"status": .., "headers": {..}, "body": ..}: the body as JSON when expected and valid, else
 * as text when it is valid text, else null; an empty body is null. *body_ok: the body is what
 * was expected.
 */
static Jsonb *
response_jsonb(const HttpResponse *resp, bool expect_json, bool *body_ok, char **retry_after)
{
	DsJsonbBuilder state = {0};
	JsonbValue	v;
	Jsonb	   *headers = headers_jsonb(resp->head, resp->head_len, retry_after);
	Jsonb	   *json = NULL;

	*body_ok = true;
	(void) ds_jsonb_push(&state, WJB_BEGIN_OBJECT, NULL);
	push_key(&state, "status");
	v.type = jbvNumeric;
	v.val.numeric = int64_to_numeric(resp->status);
	(void) ds_jsonb_push(&state, WJB_VALUE, &v);
	push_key(&state, "headers");
	v.type = jbvBinary;
	v.val.binary.data = &headers->root;
	v.val.binary.len = VARSIZE(headers) - VARHDRSZ;
	(void) ds_jsonb_push(&state, WJB_VALUE, &v);
	push_key(&state, "body");
	if (resp->body_len == 0)
	{
		v.type = jbvNull;
		(void) ds_jsonb_push(&state, WJB_VALUE, &v);
	}
	else if (expect_json && (json = parse_json_body(resp->body, resp->body_len)) != NULL)
	{
		v.type = jbvBinary;
		v.val.binary.data = &json->root;
		v.val.binary.len = VARSIZE(json) - VARHDRSZ;
		(void) ds_jsonb_push(&state, WJB_VALUE, &v);
	}
	else
	{
		*body_ok = !expect_json;
		if (!text_value(resp->body, resp->body_len, &v))
		{
			*body_ok = false;
			v.type = jbvNull;
		}
		(void) ds_jsonb_push(&state, WJB_VALUE, &v);
	}
	return JsonbValueToJsonb(ds_jsonb_push(&state, WJB_END_OBJECT, NULL));
}

/* Set the failure fields of *outcome. */
static void
fail(AttemptOutcome *outcome, AttemptClass cls, int sqlerrcode, char *message, char *detail,
	 char *hint)
{
	outcome->cls = cls;
	outcome->sqlerrcode = sqlerrcode;
	outcome->message = message;
	outcome->detail = detail;
	outcome->hint = hint;
}

void
ds_http_classify(const HttpResponse *resp, bool expect_json, const HttpStatusRules *rules,
				 bool repeat_safe, int max_response_size, AttemptOutcome *outcome, Jsonb **kept)
{
	Jsonb	   *response;
	bool		body_ok;
	char	   *retry_after;
	int			by_rules;

	*kept = NULL;
	if (resp->too_large || resp->code == CURLE_FILESIZE_EXCEEDED)
	{
		fail(outcome, ATTEMPT_PERMANENT, ERRCODE_DS_HTTP_BAD_RESPONSE,
			 pstrdup("HTTP response is too large"),
			 psprintf("durable_steps.http_max_response_size is %d bytes; headers may take %d bytes.",
					  max_response_size, DS_HTTP_MAX_HEADER_BYTES),
			 NULL);
		return;
	}
	if (resp->code != CURLE_OK || resp->status == 0)
	{
		const char *why = resp->error && resp->error[0] ? resp->error : curl_easy_strerror(resp->code);

		if (!resp->sent)
			fail(outcome, ATTEMPT_RETRYABLE, ERRCODE_DS_HTTP_NOT_SENT,
				 psprintf("HTTP request was not sent: %s", why), NULL, NULL);
		else
			fail(outcome, repeat_safe ? ATTEMPT_RETRYABLE : ATTEMPT_UNCERTAIN,
				 ERRCODE_DS_HTTP_UNCERTAIN,
				 psprintf("HTTP request may have been received, but no whole response came back: %s", why),
				 repeat_safe ?
				 pstrdup("It is sent again with the same idempotency key, or is idempotent by its method.") :
				 pstrdup("It carries no idempotency header and its method is not idempotent, so it is not sent again by itself."),
				 NULL);
		return;
	}

	response = response_jsonb(resp, expect_json, &body_ok, &retry_after);
	if (resp->status >= 200 && resp->status < 300)
	{
		if (!body_ok)
		{
			fail(outcome, ATTEMPT_PERMANENT, ERRCODE_DS_HTTP_BAD_RESPONSE,
				 expect_json ? pstrdup("HTTP response body is not valid JSON") :
				 pstrdup("HTTP response body is not valid text in the database encoding"),
				 psprintf("The receiver answered %ld; the response is kept in the step's error_detail.",
						  resp->status),
				 NULL);
			*kept = response;
			return;
		}
		outcome->cls = ATTEMPT_COMPLETED;
		outcome->result = response;
		return;
	}
	*kept = response;
	by_rules = status_class_by_rules(rules, resp->status);
	if (by_rules == ATTEMPT_PERMANENT)
		fail(outcome, ATTEMPT_PERMANENT, ERRCODE_DS_HTTP_STATUS,
			 psprintf("HTTP %ld", resp->status),
			 pstrdup("The step's fail_on_status names this status."),
			 NULL);
	else if (by_rules == ATTEMPT_RETRYABLE || (by_rules < 0 && status_is_retryable(resp->status)))
	{
		int64		delay = retry_after ? ds_http_retry_after_usecs(retry_after, GetCurrentTimestamp()) : -1;

		fail(outcome, ATTEMPT_RETRYABLE, ERRCODE_DS_HTTP_STATUS,
			 psprintf("HTTP %ld", resp->status),
			 delay >= 0 ? psprintf("Retry-After: %s", retry_after) : NULL, NULL);
		if (delay >= 0)
		{
			outcome->has_retry_after = true;
			outcome->retry_after = delay;
		}
	}
	else if (resp->status >= 500)
		fail(outcome, ATTEMPT_PERMANENT, ERRCODE_DS_HTTP_STATUS,
			 psprintf("HTTP %ld", resp->status), NULL, NULL);
	else
		fail(outcome, ATTEMPT_CORRECTABLE, ERRCODE_DS_HTTP_STATUS,
			 psprintf("HTTP %ld", resp->status),
			 resp->status >= 300 && resp->status < 400 ?
			 pstrdup("Redirects are not followed.") : NULL,
			 pstrdup("The receiver refused the request; the response is kept in the step's error_detail. Correct what it depends on, then send it again with ds_retry_step()."));
}
