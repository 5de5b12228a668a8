/*
 * http_request.c -- the request of an HTTP step (docs/http.md).
 *
 * A request is checked completely when ds_http_step() is called, so that a malformed one is an
 * error to its caller and stores nothing; the worker parses the stored request again before
 * sending it (the setting of allowed hosts may have changed since). URLs are parsed by libcurl's
 * own URL parser, the one that will send them: a URL another parser reads differently can not
 * slip past the scheme and host checks.
 */
#include "base/compat.h"

#include <ctype.h>
#include <math.h>

#include <curl/curl.h>

#include "mb/pg_wchar.h"
#include "catalog/pg_type_d.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/varlena.h"

#include "fmgr.h"
#include "http/http_addresses.h"
#include "http/http_request.h"
#include "base/policy.h"

PG_FUNCTION_INFO_V1(ds_http_mask_request);

static char *allowed_hosts = NULL;
static char *secret_headers = NULL;

void
ds_http_request_init_module(void)
{
	DefineCustomStringVariable("durable_steps.http_allowed_hosts",
							   "Hosts that HTTP steps may reach; empty allows every host.",
							   "A comma-separated list of host names, *.domain for a domain's hosts, * for all, and address ranges (10.0.0.0/8); each may end in :port. Checked when a step is created, before every send, and at the address each connection goes to.",
							   &allowed_hosts,
							   "",
							   PGC_SUSET,
							   GUC_LIST_INPUT,
							   NULL, NULL, NULL);
	DefineCustomStringVariable("durable_steps.http_secret_headers",
							   "Request headers, besides Authorization, whose values are secrets.",
							   "The views show their values masked to roles other than the step's owner.",
							   &secret_headers,
							   "",
							   PGC_SUSET,
							   GUC_LIST_INPUT,
							   NULL, NULL, NULL);
}

/* A malformed request: 22023 naming the field. */
static void
request_error(const char *field, const char *problem)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("invalid HTTP request field \"%s\": %s", field, problem)));
}

/* A JSON string value as a C string; NUL bytes are refused (they cannot be sent). */
static char *
string_value(const JsonbValue *v, const char *field)
{
	if (v->type != jbvString)
		request_error(field, "must be a string");
	if (memchr(v->val.string.val, '\0', v->val.string.len) != NULL)
		request_error(field, "must not contain NUL characters");
	return pnstrdup(v->val.string.val, v->val.string.len);
}

static const char *const methods[] = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"};

bool
ds_http_method_is_idempotent(const char *method)
{
	return strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0 ||
		strcmp(method, "PUT") == 0 || strcmp(method, "DELETE") == 0 ||
		strcmp(method, "OPTIONS") == 0;
}

bool
ds_http_is_token_char(char c)
{
	/* ASCII only, whatever the locale */
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		(c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

/* RFC 9110 token characters: what a header name is made of. */
static bool
is_token(const char *s)
{
	if (*s == '\0')
		return false;
	for (; *s; s++)
		if (!ds_http_is_token_char(*s))
			return false;
	return true;
}

/* Header names that libcurl sets from the request itself; given by hand they would disagree. */
static bool
is_framing_header(const char *name)
{
	return pg_strcasecmp(name, "Content-Length") == 0 ||
		pg_strcasecmp(name, "Transfer-Encoding") == 0 ||
		pg_strcasecmp(name, "Host") == 0 || pg_strcasecmp(name, "Connection") == 0;
}

/* The url field, parsed by libcurl: http or https, a host, no credentials. */
static void
parse_url(const char *url, HttpRequest *out)
{
	CURLU	   *u = curl_url();
	char	   *scheme = NULL;
	char	   *host = NULL;
	char	   *user = NULL;
	char	   *port = NULL;
	CURLUcode	rc;
	const char *problem = NULL;

	if (u == NULL)
		ereport(ERROR, (errcode(ERRCODE_OUT_OF_MEMORY), errmsg("out of memory")));
	/* no guessing of a scheme: "example.com/x" is not a URL */
	rc = curl_url_set(u, CURLUPART_URL, url, 0);
	if (rc != CURLUE_OK)
		problem = "is not a valid URL";
	else if (curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
			 (strcmp(scheme, "http") != 0 && strcmp(scheme, "https") != 0))
		problem = "must be an http or https URL";
	else if (curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK || host[0] == '\0')
		problem = "must name a host";
	else if (curl_url_get(u, CURLUPART_USER, &user, 0) == CURLUE_OK)
		problem = "must not carry credentials: send them in an Authorization header";
	else if (curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) != CURLUE_OK)
		problem = "has no port";
	if (problem == NULL)
	{
		out->port = atoi(port);
		out->scheme = pstrdup(scheme);
		out->host = pstrdup(host);
		for (char *p = out->host; *p; p++)
			*p = pg_tolower((unsigned char) *p);
	}
	curl_free(scheme);
	curl_free(host);
	curl_free(user);
	curl_free(port);
	curl_url_cleanup(u);
	if (problem != NULL)
		request_error("url", problem);
}

/* The headers field: an object of string values, names that are tokens, no line breaks. */
static void
parse_headers(JsonbValue *v, HttpRequest *out)
{
	JsonbIterator *it;
	JsonbValue	k;
	JsonbIteratorToken tok;
	int			cap;

	if (v->type != jbvBinary || !JsonContainerIsObject(v->val.binary.data))
		request_error("headers", "must be an object of strings");
	cap = Max(JsonContainerSize(v->val.binary.data), 1);
	out->header_names = palloc(sizeof(char *) * cap);
	out->header_values = palloc(sizeof(char *) * cap);
	it = JsonbIteratorInit(v->val.binary.data);
	while ((tok = JsonbIteratorNext(&it, &k, true)) != WJB_DONE)
	{
		JsonbValue	val;
		char	   *name;
		char	   *value;

		if (tok != WJB_KEY)
			continue;
		name = pnstrdup(k.val.string.val, k.val.string.len);
		(void) JsonbIteratorNext(&it, &val, true);
		if (!is_token(name))
			request_error("headers", "a header name must be a non-empty token (letters, digits and !#$%&'*+-.^_`|~)");
		if (is_framing_header(name))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("invalid HTTP request field \"headers\": header \"%s\" is set by the extension", name)));
		if (val.type != jbvString)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("invalid HTTP request field \"headers\": the value of header \"%s\" must be a string", name)));
		/* the value is not named in the message: it may be a secret */
		value = pnstrdup(val.val.string.val, val.val.string.len);
		if (strlen(value) != val.val.string.len || strpbrk(value, "\r\n") != NULL)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("invalid HTTP request field \"headers\": the value of header \"%s\" must not contain line breaks or NUL characters", name)));
		out->header_names[out->n_headers] = name;
		out->header_values[out->n_headers] = value;
		out->n_headers++;
	}
}

/* The connect_timeout field: milliseconds, or interval text; more than 0, at most 5 minutes. */
static int
parse_connect_timeout(JsonbValue *v)
{
	int64		usecs = 0;

	if (v->type == jbvNumeric)
		usecs = (int64) rint(DatumGetFloat8(DirectFunctionCall1(numeric_float8,
																NumericGetDatum(v->val.numeric))) * 1000.0);
	else if (v->type == jbvString)
	{
		char	   *text = string_value(v, "connect_timeout");
		Interval   *interval = NULL;
		MemoryContext oldcxt = CurrentMemoryContext;

		/*
		 * interval_in raises 22007 for bad text; a malformed request is 22023
		 * naming the field
		 */
		PG_TRY();
		{
			interval = DatumGetIntervalP(DirectFunctionCall3(interval_in, CStringGetDatum(text),
															 ObjectIdGetDatum(InvalidOid),
															 Int32GetDatum(-1)));
		}
		PG_CATCH();
		{
			MemoryContextSwitchTo(oldcxt);
			FlushErrorState();
			request_error("connect_timeout", "must be an interval or a number of milliseconds");
		}
		PG_END_TRY();
		usecs = ds_interval_to_usecs(interval);
	}
	else
		request_error("connect_timeout", "must be an interval or a number of milliseconds");
	if (usecs < 1000 || usecs > (int64) DS_HTTP_MAX_CONNECT_TIMEOUT_MS * 1000)
		request_error("connect_timeout", "must be at least 1 millisecond and at most 5 minutes");
	return (int) (usecs / 1000);
}

/*
 * One entry of retry_on_status / fail_on_status: a status (402, or "402") or a class ("4xx").
 * Statuses are 100-599; a 2xx completes its step and is no entry.
 */
static void
parse_status_entry(const JsonbValue *v, const char *field, HttpStatusList *list)
{
	int			code = -1;
	bool		is_class = false;

	if (v->type == jbvNumeric)
	{
		Datum		d = DirectFunctionCall1(numeric_float8, NumericGetDatum(v->val.numeric));
		double		f = DatumGetFloat8(d);

		if (f == rint(f) && f >= 100 && f <= 599)
			code = (int) f;
	}
	else if (v->type == jbvString && v->val.string.len == 3 &&
			 v->val.string.val[0] >= '1' && v->val.string.val[0] <= '5')
	{
		const char *s = v->val.string.val;

		if (isdigit((unsigned char) s[1]) && isdigit((unsigned char) s[2]))
			code = (s[0] - '0') * 100 + (s[1] - '0') * 10 + (s[2] - '0');
		else if ((s[1] == 'x' || s[1] == 'X') && (s[2] == 'x' || s[2] == 'X'))
		{
			code = s[0] - '0';
			is_class = true;
		}
	}
	if (code < 0)
		request_error(field, "entries must be HTTP statuses (402 or \"402\") or classes (\"4xx\"), from 100 to 599");
	if (is_class ? code == 2 : code / 100 == 2)
		request_error(field, "a 2xx status completes its step: it cannot be retried or failed on");
	if (list->n >= DS_HTTP_MAX_STATUS_RULES)
		request_error(field, psprintf("must have at most %d entries", DS_HTTP_MAX_STATUS_RULES));
	list->codes[list->n] = code;
	list->is_class[list->n] = is_class;
	list->n++;
}

/* The retry_on_status or fail_on_status field: an array of statuses and classes. */
static void
parse_status_list(JsonbValue *v, const char *field, HttpStatusList *list)
{
	JsonbIterator *it;
	JsonbValue	e;
	JsonbIteratorToken tok;

	if (v->type != jbvBinary || !JsonContainerIsArray(v->val.binary.data) ||
		JsonContainerIsScalar(v->val.binary.data))
		request_error(field, "must be an array of HTTP statuses or classes, such as [402, \"5xx\"]");
	list->n = 0;
	it = JsonbIteratorInit(v->val.binary.data);
	while ((tok = JsonbIteratorNext(&it, &e, true)) != WJB_DONE)
		if (tok == WJB_ELEM)
			parse_status_entry(&e, field, list);
}

/* Push `field`: the text array `arr` as a JSON array of strings, onto an object being built. */
static void
push_status_argument(DsJsonbBuilder *b, Jsonb *request, const char *field, ArrayType *arr)
{
	JsonbValue	v;
	Datum	   *elems;
	bool	   *nulls;
	int			n;

	v.type = jbvString;
	v.val.string.val = (char *) field;
	v.val.string.len = strlen(field);
	if (findJsonbValueFromContainer(&request->root, JB_FOBJECT, &v) != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s is given both as an argument and as a field of the request", field),
				 errhint("Give it once.")));
	(void) ds_jsonb_push(b, WJB_KEY, &v);
	if (ARR_NDIM(arr) > 1)
		request_error(field, "must be a one-dimensional array");
	deconstruct_array(arr, TEXTOID, -1, false, TYPALIGN_INT, &elems, &nulls, &n);
	(void) ds_jsonb_push(b, WJB_BEGIN_ARRAY, NULL);
	for (int i = 0; i < n; i++)
	{
		if (nulls[i])
			request_error(field, "entries must not be null");
		v.type = jbvString;
		v.val.string.val = TextDatumGetCString(elems[i]);
		v.val.string.len = strlen(v.val.string.val);
		(void) ds_jsonb_push(b, WJB_ELEM, &v);
	}
	(void) ds_jsonb_push(b, WJB_END_ARRAY, NULL);
}

Jsonb *
ds_http_request_with_status_lists(Jsonb *request, ArrayType *retry_on_status,
								  ArrayType *fail_on_status)
{
	DsJsonbBuilder b = {0};
	Jsonb	   *lists;

	if (request == NULL || (retry_on_status == NULL && fail_on_status == NULL) ||
		!JB_ROOT_IS_OBJECT(request) || JB_ROOT_IS_SCALAR(request))
		return request;			/* ds_http_parse_request() says what is wrong */
	(void) ds_jsonb_push(&b, WJB_BEGIN_OBJECT, NULL);
	if (retry_on_status != NULL)
		push_status_argument(&b, request, "retry_on_status", retry_on_status);
	if (fail_on_status != NULL)
		push_status_argument(&b, request, "fail_on_status", fail_on_status);
	lists = JsonbValueToJsonb(ds_jsonb_push(&b, WJB_END_OBJECT, NULL));
	return DatumGetJsonbP(DirectFunctionCall2(jsonb_concat, JsonbPGetDatum(request),
											  JsonbPGetDatum(lists)));
}

void
ds_http_parse_request(Jsonb *request, HttpRequest *out)
{
	JsonbIterator *it;
	JsonbValue	k;
	JsonbIteratorToken tok;
	bool		has_json = false;
	bool		has_body = false;

	memset(out, 0, sizeof(*out));
	out->method = "GET";
	out->connect_timeout_ms = DS_HTTP_DEFAULT_CONNECT_TIMEOUT_MS;
	if (request == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("request must not be null")));
	if (!JB_ROOT_IS_OBJECT(request) || JB_ROOT_IS_SCALAR(request))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("request must be a JSON object"),
				 errhint("For example {\"method\": \"POST\", \"url\": \"https://api.example.com/charges\", \"json\": {...}}.")));
	it = JsonbIteratorInit(&request->root);
	while ((tok = JsonbIteratorNext(&it, &k, true)) != WJB_DONE)
	{
		JsonbValue	v;
		char	   *key;

		if (tok != WJB_KEY)
			continue;
		key = pnstrdup(k.val.string.val, k.val.string.len);
		(void) JsonbIteratorNext(&it, &v, true);
		if (strcmp(key, "method") == 0)
		{
			char	   *m = string_value(&v, "method");

			out->method = NULL;
			for (int i = 0; i < lengthof(methods); i++)
				if (strcmp(m, methods[i]) == 0)
					out->method = (char *) methods[i];
			if (out->method == NULL)
				request_error("method", "must be one of GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS");
		}
		else if (strcmp(key, "url") == 0)
		{
			out->url = string_value(&v, "url");
			parse_url(out->url, out);
		}
		else if (strcmp(key, "headers") == 0)
			parse_headers(&v, out);
		else if (strcmp(key, "json") == 0)
		{
			JsonbValue *copy = palloc(sizeof(JsonbValue));
			Jsonb	   *j;

			*copy = v;
			j = JsonbValueToJsonb(copy);
			out->body = JsonbToCString(NULL, &j->root, VARSIZE(j));
			out->body_len = strlen(out->body);
			out->body_is_json = true;
			has_json = true;
		}
		else if (strcmp(key, "body") == 0)
		{
			out->body = string_value(&v, "body");
			out->body_len = strlen(out->body);
			has_body = true;
		}
		else if (strcmp(key, "expect") == 0)
		{
			char	   *e = string_value(&v, "expect");

			if (strcmp(e, "json") != 0 && strcmp(e, "text") != 0)
				request_error("expect", "must be \"json\" or \"text\"");
			out->expect_json = strcmp(e, "json") == 0;
		}
		else if (strcmp(key, "connect_timeout") == 0)
			out->connect_timeout_ms = parse_connect_timeout(&v);
		else if (strcmp(key, "retry_on_status") == 0)
			parse_status_list(&v, key, &out->status_rules.retry_on);
		else if (strcmp(key, "fail_on_status") == 0)
			parse_status_list(&v, key, &out->status_rules.fail_on);
		else
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("invalid HTTP request field \"%s\": unknown field", key),
					 errhint("The fields are method, url, headers, json, body, expect, connect_timeout, retry_on_status and fail_on_status.")));
	}
	if (out->url == NULL)
		request_error("url", "is required");
	if (has_json && has_body)
		request_error("body", "cannot be given together with json");
	if (out->body != NULL && strcmp(out->method, "HEAD") == 0)
		request_error("method", "HEAD requests have no body");
}

/* Does the name `host` match `pattern` (exact, *.domain, or *)? */
static bool
host_name_matches(const char *host, const char *pattern)
{
	size_t		hl = strlen(host);
	size_t		pl = strlen(pattern);

	if (strcmp(pattern, "*") == 0)
		return true;
	if (pl > 2 && pattern[0] == '*' && pattern[1] == '.')
		/* *.example.com: any host under example.com, not example.com itself */
		return hl > pl - 1 && pg_strcasecmp(host + hl - (pl - 1), pattern + 1) == 0;
	return pg_strcasecmp(host, pattern) == 0;
}

HostVerdict
ds_http_host_allowed(const char *host, int port)
{
	char	   *copy;
	List	   *items;
	ListCell   *lc;
	AddressRule literal;
	bool		is_literal;
	HostVerdict verdict = HOST_REFUSED;

	if (allowed_hosts == NULL || allowed_hosts[0] == '\0')
		return HOST_ALLOWED;

	/*
	 * a URL's address literal ([::1] in brackets) is matched by the address
	 * entries
	 */
	is_literal = ds_http_parse_address(host, port, &literal);
	copy = pstrdup(allowed_hosts);

	/*
	 * not SplitIdentifierString: it would cut names at NAMEDATALEN, and host
	 * names are longer
	 */
	if (!SplitGUCList(copy, ',', &items))
		return HOST_REFUSED;	/* the setting's check accepts only lists */
	foreach(lc, items)
	{
		char	   *entry = pstrdup((const char *) lfirst(lc));
		int			entry_port = ds_http_split_port(entry);
		AddressRule rule;

		if (ds_http_parse_address(entry, entry_port, &rule))
		{
			if (is_literal && ds_http_address_matches(&rule, literal.family, literal.addr, port))
				verdict = HOST_ALLOWED;
			else if (!is_literal)

				/*
				 * a name may resolve into the range: the connection's address
				 * decides
				 */
				verdict = HOST_IF_ADDRESS_ALLOWED;
		}
		else if (!is_literal && (entry_port == 0 || entry_port == port) && host_name_matches(host, entry))
			verdict = HOST_ALLOWED;
		if (verdict == HOST_ALLOWED)
			break;
	}
	list_free(items);
	pfree(copy);
	return verdict;
}

const char *
ds_http_allowed_hosts(void)
{
	return allowed_hosts;
}

/* Is `name` one of the comma-separated entries of `list`, by `match`? */
static bool
list_has(const char *list, const char *name, bool (*match) (const char *, const char *))
{
	char	   *copy;
	List	   *items;
	ListCell   *lc;
	bool		found = false;

	if (list == NULL || list[0] == '\0')
		return false;
	copy = pstrdup(list);
	if (!SplitGUCList(copy, ',', &items))
		return false;			/* the setting's check accepts only lists */
	foreach(lc, items)
		if (match(name, (const char *) lfirst(lc)))
	{
		found = true;
		break;
	}
	list_free(items);
	pfree(copy);
	return found;
}

/* Header names compare without case. */
static bool
name_matches(const char *name, const char *entry)
{
	return pg_strcasecmp(name, entry) == 0;
}

bool
ds_http_header_is_secret(const char *name)
{
	return pg_strcasecmp(name, "Authorization") == 0 ||
		pg_strcasecmp(name, "Proxy-Authorization") == 0 ||
		list_has(secret_headers, name, name_matches);
}

bool
ds_http_repeat_is_safe(const char *idempotency_header, Jsonb *request)
{
	JsonbValue *m;

	if (idempotency_header != NULL && idempotency_header[0] != '\0')
		return true;
	if (request == NULL)
		return false;
	m = getKeyJsonValueFromContainer(&request->root, "method", 6, NULL);
	/* no method is a GET */
	if (m == NULL)
		return true;
	if (m->type != jbvString)
		return false;
	return ds_http_method_is_idempotent(pnstrdup(m->val.string.val, m->val.string.len));
}

/* What the views show instead of a secret header value. */
#define MASKED_VALUE "********"

/*
 * ds_http_mask_request(request jsonb) -> jsonb: the request with the values of secret headers
 * replaced, for the views to show to roles other than the step's owner.
 */
Datum
ds_http_mask_request(PG_FUNCTION_ARGS)
{
	Jsonb	   *request = PG_GETARG_JSONB_P(0);
	DsJsonbBuilder state = {0};
	JsonbIterator *it;
	JsonbValue	k;
	JsonbValue *res = NULL;
	JsonbIteratorToken tok;

	if (!JB_ROOT_IS_OBJECT(request) || JB_ROOT_IS_SCALAR(request))
		PG_RETURN_JSONB_P(request);
	it = JsonbIteratorInit(&request->root);
	while ((tok = JsonbIteratorNext(&it, &k, true)) != WJB_DONE)
	{
		JsonbValue	v;

		if (tok != WJB_KEY)
		{
			res = ds_jsonb_push(&state, tok, tok < WJB_BEGIN_ARRAY ? &k : NULL);
			continue;
		}
		(void) ds_jsonb_push(&state, WJB_KEY, &k);
		(void) JsonbIteratorNext(&it, &v, true);
		if (k.val.string.len == 7 && strncmp(k.val.string.val, "headers", 7) == 0 &&
			v.type == jbvBinary && JsonContainerIsObject(v.val.binary.data))
		{
			JsonbIterator *hit = JsonbIteratorInit(v.val.binary.data);
			JsonbValue	hk;
			JsonbIteratorToken htok;

			while ((htok = JsonbIteratorNext(&hit, &hk, true)) != WJB_DONE)
			{
				JsonbValue	hv;

				if (htok != WJB_KEY)
				{
					(void) ds_jsonb_push(&state, htok, htok < WJB_BEGIN_ARRAY ? &hk : NULL);
					continue;
				}
				(void) ds_jsonb_push(&state, WJB_KEY, &hk);
				(void) JsonbIteratorNext(&hit, &hv, true);
				if (ds_http_header_is_secret(pnstrdup(hk.val.string.val, hk.val.string.len)))
				{
					hv.type = jbvString;
					hv.val.string.val = MASKED_VALUE;
					hv.val.string.len = strlen(MASKED_VALUE);
				}
				(void) ds_jsonb_push(&state, WJB_VALUE, &hv);
			}
		}
		else
			(void) ds_jsonb_push(&state, WJB_VALUE, &v);
	}
	PG_RETURN_JSONB_P(JsonbValueToJsonb(res));
}
