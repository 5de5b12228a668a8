/*
 * http_response.h -- what a finished HTTP transfer means for its step (docs/http.md,
 * "Classification").
 */
#ifndef DS_HTTP_RESPONSE_H
#define DS_HTTP_RESPONSE_H

#include "base/compat.h"

#include <curl/curl.h>

#include "utils/jsonb.h"

#include "base/attempt_outcome.h"

/* Longest response header section kept, in bytes; a longer one is an oversized response. */
#define DS_HTTP_MAX_HEADER_BYTES (64 * 1024)

/*
 * A step's retry_on_status / fail_on_status (docs/http.md, "Status codes the step decides"):
 * statuses (402) and classes (4xx, stored as 4 with is_class) whose outcome class overrides the
 * default table. An exact status beats a class, a list beats the table, fail_on_status wins a tie.
 */
#define DS_HTTP_MAX_STATUS_RULES 64

typedef struct HttpStatusList
{
	int			n;
	int			codes[DS_HTTP_MAX_STATUS_RULES];
	bool		is_class[DS_HTTP_MAX_STATUS_RULES];
} HttpStatusList;

typedef struct HttpStatusRules
{
	HttpStatusList retry_on;
	HttpStatusList fail_on;
} HttpStatusRules;

/* A finished transfer, as libcurl left it. */
typedef struct HttpResponse
{
	CURLcode	code;			/* CURLE_OK: a whole response arrived */
	long		status;			/* HTTP status; 0 when none arrived */
	bool		sent;			/* the request may have left (libcurl reached
								 * its pre-transfer stage): a failure from
								 * here on is uncertain */
	bool		too_large;		/* body or headers over their limit: the
								 * transfer was stopped */
	const char *body;			/* NUL-terminated; body_len bytes */
	size_t		body_len;
	const char *head;			/* the raw header lines of the last response */
	size_t		head_len;
	const char *error;			/* libcurl's message for a failed transfer */
} HttpResponse;

/*
 * Classify a finished transfer into *outcome (class, SQLSTATE, message, result, Retry-After).
 * `rules`: the step's retry_on_status / fail_on_status, over the default table of statuses.
 * `repeat_safe`: the request carries an idempotency header or has an idempotent method, so an
 * uncertain outcome may be retried. *kept: the response to keep on a step that did not succeed
 * (blocked, retrying or failed with a response), else NULL.
 */
extern void ds_http_classify(const HttpResponse *resp, bool expect_json,
							 const HttpStatusRules *rules, bool repeat_safe,
							 int max_response_size, AttemptOutcome *outcome, Jsonb **kept);

/* The delay a Retry-After value asks for, in microseconds, capped at 24 h; -1 if malformed. */
extern int64 ds_http_retry_after_usecs(const char *value, TimestampTz now);

/*
 * How long a 429 asks its sender to wait (docs/limits.md, "When the receiver says 429"): its
 * Retry-After, or else its X-RateLimit-Reset (seconds from now, or the Unix time when the
 * number is that of a date), capped at 24 hours; -1 when it says neither.
 */
extern int64 ds_http_rate_limit_wait_usecs(const HttpResponse *resp, TimestampTz now);

#endif							/* DS_HTTP_RESPONSE_H */
