/*
 * http_transfer.c -- HTTP requests in libcurl's hands (http_transfer.h).
 *
 * One multi handle for the process, so that connections are kept alive and reused across
 * requests. libcurl's callbacks only copy bytes into malloc'd buffers under fixed caps: no
 * palloc, no ereport, nothing that can jump out of libcurl. Addresses are checked at the socket
 * (http_addresses.c): after the host name was resolved, before the connection is opened, and
 * again before each request on a kept-alive connection.
 */
#include "base/compat.h"

#include <arpa/inet.h>
#include <curl/curl.h>

#include "miscadmin.h"
#include "utils/guc.h"
#include "utils/timestamp.h"

#include "http/http_addresses.h"
#include "http/http_transfer.h"

static int	max_response_size = 1024 * 1024;
static char *http_proxy = NULL;

/* The process's one multi handle: every transfer, and the connections kept alive. */
static CURLM * multi_handle = NULL;

void
ds_http_transfer_init_module(void)
{
	DefineCustomIntVariable("durable_steps.http_max_response_size",
							"Largest HTTP response body an HTTP step accepts, in bytes.",
							"A larger response fails the step closed (SQLSTATE DS013).",
							&max_response_size,
							1024 * 1024,
							1024,
							64 * 1024 * 1024,
							PGC_SIGHUP,
							GUC_UNIT_BYTE,
							NULL, NULL, NULL);

	/*
	 * postmaster settings can only be defined while the postmaster loads the
	 * library
	 */
	if (!process_shared_preload_libraries_in_progress)
		return;
	DefineCustomStringVariable("durable_steps.http_proxy",
							   "Proxy that HTTP steps' requests go through; empty sends them directly.",
							   "A libcurl proxy URL (http://host:port, socks5h://host:port). The http_proxy, https_proxy, all_proxy and no_proxy variables of the server's environment are never used.",
							   &http_proxy,
							   "",
							   PGC_POSTMASTER,
							   GUC_SUPERUSER_ONLY,	/* its URL may hold a
													 * password */
							   NULL, NULL, NULL);
}

int
ds_http_max_response_size(void)
{
	return max_response_size;
}

bool
ds_http_proxy_set(void)
{
	return http_proxy != NULL && http_proxy[0] != '\0';
}

void
ds_http_transfers_init(long max_connections)
{
	if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
		ereport(ERROR, (errmsg("durable_steps: could not initialize libcurl")));
	multi_handle = curl_multi_init();
	if (multi_handle == NULL)
		ereport(ERROR, (errcode(ERRCODE_OUT_OF_MEMORY), errmsg("out of memory")));
	ds_http_transfers_set_max_connections(max_connections);
}

void
ds_http_transfers_set_max_connections(long max_connections)
{
	(void) curl_multi_setopt(multi_handle, CURLMOPT_MAXCONNECTS, max_connections);
}

/* Append bytes to a buffer; false (nothing changed) when over its limit or out of memory. */
static bool
buffer_append(CurlBuffer *b, const char *data, size_t n)
{
	if (b->len + n > b->limit)
	{
		b->over = true;
		return false;
	}
	if (b->len + n + 1 > b->cap)
	{
		size_t		cap = Max(b->cap * 2, b->len + n + 1);
		char	   *grown;

		cap = Max(cap, 1024);
		grown = realloc(b->data, cap);
		if (grown == NULL)
			return false;
		b->data = grown;
		b->cap = cap;
	}
	memcpy(b->data + b->len, data, n);
	b->len += n;
	b->data[b->len] = '\0';
	return true;
}

/* libcurl's write callback: the body, capped by durable_steps.http_max_response_size. */
static size_t
on_body(char *ptr, size_t size, size_t nmemb, void *arg)
{
	HttpTransfer *transfer = (HttpTransfer *) arg;

	return buffer_append(&transfer->body, ptr, size * nmemb) ? size * nmemb : 0;
}

/*
 * libcurl's header callback: the header lines of the last response (a 100 Continue before it,
 * or any interim response, starts the lines again).
 */
static size_t
on_header(char *ptr, size_t size, size_t nmemb, void *arg)
{
	HttpTransfer *transfer = (HttpTransfer *) arg;
	size_t		n = size * nmemb;

	if (n >= 5 && strncmp(ptr, "HTTP/", 5) == 0)
		transfer->head.len = 0;
	return buffer_append(&transfer->head, ptr, n) ? n : 0;
}

void
ds_http_transfer_release(HttpTransfer *transfer)
{
	if (transfer->easy != NULL)
	{
		(void) curl_multi_remove_handle(multi_handle, transfer->easy);
		curl_easy_cleanup(transfer->easy);
		transfer->easy = NULL;
	}
	curl_slist_free_all(transfer->headers);
	transfer->headers = NULL;
	free(transfer->body.data);
	free(transfer->head.data);
	transfer->body.data = transfer->head.data = NULL;
}

void
ds_http_transfer_not_started(HttpTransfer *transfer)
{
	ds_http_transfer_release(transfer);
	transfer->started_at = transfer->finished_at = GetCurrentTimestamp();
}

/* Add "Name: value" to a header list; an empty value needs libcurl's "Name;" form. */
static bool
add_header(struct curl_slist **list, const char *name, const char *value)
{
	char	   *line = value[0] == '\0' ? psprintf("%s;", name) : psprintf("%s: %s", name, value);
	struct curl_slist *grown = curl_slist_append(*list, line);

	pfree(line);
	if (grown == NULL)
		return false;
	*list = grown;
	return true;
}

/* Does the request set header `name` itself? */
static bool
request_has_header(const HttpRequest *request, const char *name)
{
	for (int i = 0; i < request->n_headers; i++)
		if (pg_strcasecmp(request->header_names[i], name) == 0)
			return true;
	return false;
}

/*
 * libcurl's CURLOPT_OPENSOCKETFUNCTION: every connection of a transfer is checked at the address
 * its host resolved to, before it is opened (durable_steps.http_denied_addresses, and the
 * address entries of http_allowed_hosts). Runs inside libcurl: no palloc, no ereport.
 */
static curl_socket_t
open_checked_socket(void *data, curlsocktype purpose, struct curl_sockaddr *address)
{
	HttpTransfer *transfer = (HttpTransfer *) data;

	if (transfer->check_addresses &&
		!ds_http_connection_allowed(&address->addr, transfer->by_name))
	{
		const void *a = address->family == AF_INET6 ?
			(const void *) &((const struct sockaddr_in6 *) &address->addr)->sin6_addr :
			(const void *) &((const struct sockaddr_in *) &address->addr)->sin_addr;

		transfer->address_refused = true;
		if (inet_ntop(address->family, a, transfer->refused_address,
					  sizeof(transfer->refused_address)) == NULL)
			strlcpy(transfer->refused_address, "?", sizeof(transfer->refused_address));
		return CURL_SOCKET_BAD;
	}
	return socket(address->family, address->socktype, address->protocol);
}

/*
 * libcurl's CURLOPT_PREREQFUNCTION: before each request, on a new or a reused connection, its
 * peer is checked again -- a kept-alive connection may predate a change of the settings.
 */
static int
check_peer_before_request(void *data, char *primary_ip, char *local_ip, int primary_port,
						  int local_port)
{
	HttpTransfer *transfer = (HttpTransfer *) data;

	if (!transfer->check_addresses ||
		ds_http_peer_allowed(primary_ip, primary_port, transfer->by_name))
	{
		transfer->request_passed = true;
		return CURL_PREREQFUNC_OK;
	}
	transfer->address_refused = true;
	strlcpy(transfer->refused_address, primary_ip, sizeof(transfer->refused_address));
	return CURL_PREREQFUNC_ABORT;
}

bool
ds_http_transfer_start(HttpTransfer *transfer, const HttpRequest *request,
					   const HttpTransferOptions *options, void *owner)
{
	CURL	   *easy = curl_easy_init();
	bool		ok = true;

	transfer->owner = owner;
	transfer->check_addresses = options->check_addresses;
	transfer->by_name = options->by_name;
	if (easy == NULL)
		return false;
	transfer->easy = easy;
	transfer->body.limit = (size_t) max_response_size;
	transfer->head.limit = DS_HTTP_MAX_HEADER_BYTES;
	for (int i = 0; ok && i < request->n_headers; i++)
		ok = add_header(&transfer->headers, request->header_names[i], request->header_values[i]);
	if (ok && options->idempotency_key != NULL)
		ok = add_header(&transfer->headers, options->idempotency_header, options->idempotency_key);
	if (ok && request->body != NULL && !request_has_header(request, "Content-Type"))
		ok = add_header(&transfer->headers, "Content-Type",
						request->body_is_json ? "application/json" : "text/plain; charset=utf-8");
	/* no 100-continue round trip: the whole request goes at once */
	if (ok)
		ok = (transfer->headers = curl_slist_append(transfer->headers, "Expect:")) != NULL;
	if (!ok)
		return false;

	curl_easy_setopt(easy, CURLOPT_PRIVATE, transfer);
	curl_easy_setopt(easy, CURLOPT_URL, request->url);
	curl_easy_setopt(easy, CURLOPT_OPENSOCKETFUNCTION, open_checked_socket);
	curl_easy_setopt(easy, CURLOPT_OPENSOCKETDATA, transfer);
	curl_easy_setopt(easy, CURLOPT_PREREQFUNCTION, check_peer_before_request);
	curl_easy_setopt(easy, CURLOPT_PREREQDATA, transfer);
	curl_easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "http,https");

	/*
	 * Only the superuser's setting names a proxy: libcurl would otherwise
	 * take one from the postmaster's environment, and send every role's
	 * requests, Authorization and all, there.
	 */
	curl_easy_setopt(easy, CURLOPT_PROXY, http_proxy != NULL ? http_proxy : "");
	curl_easy_setopt(easy, CURLOPT_NOPROXY, "");
	curl_easy_setopt(easy, CURLOPT_FOLLOWLOCATION, 0L);
	curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(easy, CURLOPT_TCP_KEEPALIVE, 1L);
	curl_easy_setopt(easy, CURLOPT_USERAGENT, "durable_steps/0.1.0");
	curl_easy_setopt(easy, CURLOPT_HTTPHEADER, transfer->headers);
	curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, transfer->errbuf);
	curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(easy, CURLOPT_WRITEDATA, transfer);
	curl_easy_setopt(easy, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(easy, CURLOPT_HEADERDATA, transfer);
	curl_easy_setopt(easy, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t) max_response_size);
	curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, (long) Max(options->timeout_ms, 1));
	curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, (long) request->connect_timeout_ms);

	/*
	 * libcurl sends a request again by itself when a reused connection turns
	 * out closed before any answer came. Harmless with an idempotency key or
	 * an idempotent method; otherwise the request gets a connection of its
	 * own, so that libcurl never repeats it.
	 */
	if (!options->repeat_safe)
		curl_easy_setopt(easy, CURLOPT_FRESH_CONNECT, 1L);
	if (strcmp(request->method, "HEAD") == 0)
		curl_easy_setopt(easy, CURLOPT_NOBODY, 1L);
	else if (request->body != NULL || strcmp(request->method, "POST") == 0)
	{
		curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t) request->body_len);
		curl_easy_setopt(easy, CURLOPT_POSTFIELDS, request->body ? request->body : "");
	}
	if (strcmp(request->method, "GET") != 0 && strcmp(request->method, "HEAD") != 0 &&
		strcmp(request->method, "POST") != 0)
		curl_easy_setopt(easy, CURLOPT_CUSTOMREQUEST, request->method);
	else if (strcmp(request->method, "GET") == 0 && request->body != NULL)
		curl_easy_setopt(easy, CURLOPT_CUSTOMREQUEST, "GET");
	transfer->started_at = GetCurrentTimestamp();
	return curl_multi_add_handle(multi_handle, easy) == CURLM_OK;
}

void
ds_http_transfers_perform(void)
{
	int			running;

	(void) curl_multi_perform(multi_handle, &running);
}

/* What a finished transfer received, as libcurl left it; its easy handle is let go. */
static void
capture_response(HttpTransfer *transfer, CURLcode result)
{
	curl_off_t	pretransfer = 0;

	transfer->finished_at = GetCurrentTimestamp();
	transfer->resp.code = result;
	(void) curl_easy_getinfo(transfer->easy, CURLINFO_RESPONSE_CODE, &transfer->resp.status);
	(void) curl_easy_getinfo(transfer->easy, CURLINFO_PRETRANSFER_TIME_T, &pretransfer);
	transfer->resp.sent = pretransfer > 0 || transfer->resp.status > 0;
	transfer->resp.too_large = transfer->body.over || transfer->head.over;
	transfer->resp.body = transfer->body.data ? transfer->body.data : "";
	transfer->resp.body_len = transfer->body.len;
	transfer->resp.head = transfer->head.data;
	transfer->resp.head_len = transfer->head.len;
	transfer->resp.error = transfer->errbuf;
	(void) curl_multi_remove_handle(multi_handle, transfer->easy);
	curl_easy_cleanup(transfer->easy);
	transfer->easy = NULL;
}

HttpTransfer *
ds_http_transfer_next_finished(void)
{
	int			queued;
	CURLMsg    *msg;

	while ((msg = curl_multi_info_read(multi_handle, &queued)) != NULL)
	{
		HttpTransfer *transfer;

		if (msg->msg != CURLMSG_DONE)
			continue;
		(void) curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **) &transfer);
		capture_response(transfer, msg->data.result);
		return transfer;
	}
	return NULL;
}

bool
ds_http_transfer_refused_at_address(const HttpTransfer *transfer)
{
	return transfer->resp.code != CURLE_OK && transfer->address_refused &&
		!transfer->request_passed;
}

void
ds_http_transfers_wait(int timeout_ms)
{
	int			numfds;

	(void) curl_multi_wait(multi_handle, NULL, 0, timeout_ms, &numfds);
}
