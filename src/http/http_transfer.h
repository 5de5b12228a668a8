/*
 * http_transfer.h -- HTTP requests in libcurl's hands (http_transfer.c): the process's one
 * multi handle, an easy handle set up from each request, libcurl's callbacks, the address
 * checks' hooks into libcurl, and the response each transfer captures. The settings of the
 * transfers themselves (durable_steps.http_max_response_size, durable_steps.http_proxy) are
 * defined here.
 *
 * Nothing here reads or writes a table, and nothing knows a step: which requests to send is the
 * HTTP worker's (worker/http_worker.c), and what a finished transfer means for its step is
 * worker/http_outcomes.c's.
 */
#ifndef DS_HTTP_TRANSFER_H
#define DS_HTTP_TRANSFER_H

#include "base/compat.h"

#include <arpa/inet.h>
#include <curl/curl.h>

#include "utils/timestamp.h"

#include "http/http_request.h"
#include "http/http_response.h"

/* A growing byte buffer of libcurl's callbacks: malloc'd, NUL-terminated, capped. */
typedef struct CurlBuffer
{
	char	   *data;
	size_t		len;
	size_t		cap;
	size_t		limit;
	bool		over;			/* more than `limit` bytes came: the transfer
								 * was stopped */
} CurlBuffer;

/* How a request is sent, besides the request itself. */
typedef struct HttpTransferOptions
{
	const char *idempotency_header; /* NULL: none */
	const char *idempotency_key;	/* its value */

	/*
	 * sending the request twice is safe (an idempotency key, an idempotent
	 * method); else it gets a connection of its own, so that libcurl never
	 * sends it again by itself
	 */
	bool		repeat_safe;
	int64		timeout_ms;		/* of the whole transfer */

	/*
	 * no proxy: the connections go to the request's host, and are checked
	 * (with one, to the proxy)
	 */
	bool		check_addresses;

	/*
	 * the host was allowed by name: its connections are checked against
	 * denied addresses only
	 */
	bool		by_name;
} HttpTransferOptions;

/*
 * One request in libcurl's hands, from its start to its finished response. The caller
 * allocates it zeroed and reads it; only this module writes it.
 */
typedef struct HttpTransfer
{
	void	   *owner;			/* the caller's, given to
								 * ds_http_transfer_start() */
	bool		check_addresses;
	bool		by_name;

	/*
	 * A connection was refused at the address it would have gone to
	 * (http_addresses.h): nothing was sent unless a request was let go on
	 * another connection (request_passed).
	 */
	bool		address_refused;
	bool		request_passed; /* a request was let go on a connection: it
								 * may have been sent */
	char		refused_address[INET6_ADDRSTRLEN];
	CURL	   *easy;
	struct curl_slist *headers;
	CurlBuffer	body;
	CurlBuffer	head;
	char		errbuf[CURL_ERROR_SIZE];
	HttpResponse resp;			/* complete once the transfer finished */
	TimestampTz started_at;
	TimestampTz finished_at;
} HttpTransfer;

/* From ds_http_worker_init_module: durable_steps.http_max_response_size and http_proxy. */
extern void ds_http_transfer_init_module(void);

/* durable_steps.http_max_response_size, in bytes. */
extern int	ds_http_max_response_size(void);

/* Does durable_steps.http_proxy name a proxy? */
extern bool ds_http_proxy_set(void);

/*
 * Once per process: set up libcurl and the multi handle, which keeps up to `max_connections`
 * connections alive for the next requests. ERROR when libcurl cannot.
 */
extern void ds_http_transfers_init(long max_connections);

/* Keep up to `max_connections` connections alive (after a reload of the settings). */
extern void ds_http_transfers_set_max_connections(long max_connections);

/*
 * Set up the easy handle of `transfer` for `request` and hand it to the multi handle; false
 * when libcurl could not (nothing was sent; ds_http_transfer_not_started() releases what was
 * set up). `owner` is the caller's, kept in the transfer.
 */
extern bool ds_http_transfer_start(HttpTransfer *transfer, const HttpRequest *request,
								   const HttpTransferOptions *options, void *owner);

/*
 * A transfer that is not started (its request refused, or libcurl could not set it up): what it
 * holds is released, and it starts and finishes now.
 */
extern void ds_http_transfer_not_started(HttpTransfer *transfer);

/* Let libcurl move every transfer along. */
extern void ds_http_transfers_perform(void);

/*
 * After ds_http_transfers_perform(): a transfer libcurl finished, its response captured and
 * its easy handle gone, or NULL when there is none (more).
 */
extern HttpTransfer *ds_http_transfer_next_finished(void);

/*
 * Did a finished transfer fail because a connection was refused at its address
 * (durable_steps.http_denied_addresses, the address entries of http_allowed_hosts), before any
 * request went out? Its request was not sent.
 */
extern bool ds_http_transfer_refused_at_address(const HttpTransfer *transfer);

/* Wait on the transfers' sockets for at most `timeout_ms`. */
extern void ds_http_transfers_wait(int timeout_ms);

/* Release what a transfer holds outside PostgreSQL's memory (its buffers, headers, handle). */
extern void ds_http_transfer_release(HttpTransfer *transfer);

#endif							/* DS_HTTP_TRANSFER_H */
