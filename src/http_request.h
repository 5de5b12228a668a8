/*
 * http_request.h -- the request of an HTTP step (README, "HTTP steps"): its shape, checked at
 * call time and again before it is sent, the hosts it may reach, and the header values that are
 * secrets.
 */
#ifndef DS_HTTP_REQUEST_H
#define DS_HTTP_REQUEST_H

#include "compat.h"
#include "utils/jsonb.h"

/* Default and longest per-request connect timeout, in milliseconds. */
#define DS_HTTP_DEFAULT_CONNECT_TIMEOUT_MS 10000
#define DS_HTTP_MAX_CONNECT_TIMEOUT_MS (5 * 60 * 1000)

typedef struct HttpRequest
{
	char	   *method;			/* GET, HEAD, POST, PUT, PATCH, DELETE or OPTIONS */
	char	   *url;			/* as given; its scheme is http or https */
	char	   *scheme;			/* "http" or "https" */
	char	   *host;			/* lower case, as libcurl parsed it */
	int			n_headers;
	char	  **header_names;	/* as given */
	char	  **header_values;
	char	   *body;			/* the bytes to send; NULL: no body */
	size_t		body_len;
	bool		body_is_json;	/* sent with Content-Type: application/json unless a header says */
	bool		expect_json;	/* parse the response body as JSON */
	int			connect_timeout_ms;
} HttpRequest;

/* From _PG_init: the settings of this file. */
extern void ds_http_request_init_module(void);

/*
 * Check `request` (22023 naming the field for a malformed one, 22023 for a URL that is not
 * http or https) and fill *out, allocated in the current memory context.
 */
extern void ds_http_parse_request(Jsonb *request, HttpRequest *out);

/* Is `c` a character of an RFC 9110 token (a header name)? */
extern bool ds_http_is_token_char(char c);

/* Is `host` (lower case) allowed by durable_steps.http_allowed_hosts? */
extern bool ds_http_host_allowed(const char *host);

/* GET, HEAD, PUT, DELETE and OPTIONS: sending them twice has the effect of sending them once. */
extern bool ds_http_method_is_idempotent(const char *method);

/*
 * Is a second send of this stored HTTP step safe after an uncertain first one? Yes when it
 * carries an idempotency header or its method is idempotent.
 */
extern bool ds_http_repeat_is_safe(const char *idempotency_header, Jsonb *request);

/* Does the value of header `name` hold a secret (Authorization, durable_steps.http_secret_headers)? */
extern bool ds_http_header_is_secret(const char *name);

#endif							/* DS_HTTP_REQUEST_H */
