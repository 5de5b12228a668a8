/*
 * http_request.h -- the request of an HTTP step (docs/http.md): its shape, checked at
 * call time and again before it is sent, the hosts it may reach, and the header values that are
 * secrets.
 */
#ifndef DS_HTTP_REQUEST_H
#define DS_HTTP_REQUEST_H

#include "base/compat.h"
#include "utils/array.h"
#include "utils/jsonb.h"

#include "http/http_response.h"

/* Default and longest per-request connect timeout, in milliseconds. */
#define DS_HTTP_DEFAULT_CONNECT_TIMEOUT_MS 10000
#define DS_HTTP_MAX_CONNECT_TIMEOUT_MS (5 * 60 * 1000)


typedef struct HttpRequest
{
	char	   *method;			/* GET, HEAD, POST, PUT, PATCH, DELETE or
								 * OPTIONS */
	char	   *url;			/* as given; its scheme is http or https */
	char	   *scheme;			/* "http" or "https" */
	char	   *host;			/* lower case, as libcurl parsed it */
	int			port;			/* given, or the scheme's */
	int			n_headers;
	char	  **header_names;	/* as given */
	char	  **header_values;
	char	   *body;			/* the bytes to send; NULL: no body */
	size_t		body_len;
	bool		body_is_json;	/* sent with Content-Type: application/json
								 * unless a header says */
	bool		expect_json;	/* parse the response body as JSON */
	int			connect_timeout_ms;
	HttpStatusRules status_rules;	/* retry_on_status, fail_on_status */
} HttpRequest;

/* From _PG_init: the settings of this file. */
extern void ds_http_request_init_module(void);

/*
 * Check `request` (22023 naming the field for a malformed one, 22023 for a URL that is not
 * http or https) and fill *out, allocated in the current memory context.
 */
extern void ds_http_parse_request(Jsonb *request, HttpRequest *out);

/*
 * `request` with the retry_on_status / fail_on_status arguments of ds_http_step() as its fields
 * of those names (text arrays of statuses and classes; NULL: not given). 22023 when the request
 * names a field its argument gives too. The entries are checked by ds_http_parse_request().
 */
extern Jsonb *ds_http_request_with_status_lists(Jsonb *request, ArrayType *retry_on_status,
												ArrayType *fail_on_status);

/* Is `c` a character of an RFC 9110 token (a header name)? */
extern bool ds_http_is_token_char(char c);

/* What durable_steps.http_allowed_hosts says of a request's host. */
typedef enum HostVerdict
{
	HOST_REFUSED,
	HOST_ALLOWED,				/* by name (or the list is empty): only denied
								 * addresses apply */
	HOST_IF_ADDRESS_ALLOWED		/* no name entry matches, an address entry
								 * may: see the connection */
} HostVerdict;

/* Is `host` (lower case) on `port` allowed by durable_steps.http_allowed_hosts? */
extern HostVerdict ds_http_host_allowed(const char *host, int port);

/* The setting's value, for the connection check (http_addresses.h). */
extern const char *ds_http_allowed_hosts(void);


/* GET, HEAD, PUT, DELETE and OPTIONS: sending them twice has the effect of sending them once. */
extern bool ds_http_method_is_idempotent(const char *method);

/*
 * Is a second send of this stored HTTP step safe after an uncertain first one? Yes when it
 * carries an idempotency header or its method is idempotent.
 */
extern bool ds_http_repeat_is_safe(const char *idempotency_header, Jsonb *request);

/* Does the value of header `name` hold a secret (Authorization, durable_steps.http_secret_headers)? */
extern bool ds_http_header_is_secret(const char *name);

/* The queue of every HTTP step, at priority 0 (docs/http.md). */
#define DS_HTTP_QUEUE "default"

/*
 * The SQL of every HTTP step's fingerprint: no SQL step has it (ds_run_step refuses SQL without
 * a statement), so an HTTP step and a SQL step never share a definition.
 */
#define DS_HTTP_FINGERPRINT_SQL ""

#endif							/* DS_HTTP_REQUEST_H */
