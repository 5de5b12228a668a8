/*
 * http_worker.c -- the HTTP worker: one process per served database that sends the requests of
 * HTTP steps through libcurl's multi interface (README, "HTTP steps", "The HTTP worker").
 *
 * One pass of the loop:
 *   1. let libcurl move every transfer along (one multi handle: connections are kept alive
 *      and reused across requests); no transaction is open while the network is waited for;
 *   2. in one transaction: record the finished transfers' outcomes, each in a subtransaction
 *      of its own so that one step's failure to record loses no other's, and -- when woken by
 *      a commit or when a step is due, and slots are free -- claim due HTTP steps as started
 *      (status running, attempt counted, this process the claimant, each step's session lock
 *      held); COMMIT; then let go of the recorded steps' locks and start the claimed requests:
 *      an attempt is durable before its request leaves. Outcomes and claims are batched (a
 *      quarter of the slots, or a few milliseconds), so that one commit serves many steps;
 *   3. wait: on the transfers' sockets while any is in flight, else on the latch until the next
 *      step is due or the polling backstop.
 *
 * libcurl's callbacks only copy bytes into malloc'd buffers under fixed caps: no palloc, no
 * ereport, nothing that can jump out of libcurl. A worker that dies leaves its attempts running
 * with their locks gone: the executors' recovery records them as lost (README, "The background
 * worker"), and they are sent again with the same idempotency key, or end uncertain when a
 * repeat would not be safe.
 */
#include "compat.h"

#include <curl/curl.h>

#include "access/xact.h"
#include "access/xlog.h"
#include "lib/ilist.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "replication/syncrep.h"
#include "replication/walsender.h"
#include "replication/walsender_private.h"
#include "storage/lwlock.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/pmsignal.h"
#include "tcop/tcopprot.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "ds_errcodes.h"
#include "http_claims.h"
#include "http_request.h"
#include "http_response.h"
#include "key.h"
#include "served_databases.h"
#include "step_attempt.h"
#include "step_exec.h"
#include "step_isolation.h"
#include "step_lock.h"
#include "store.h"
#include "worker.h"
#include "runs.h"
#include "worker_wakeup.h"

static int	max_inflight = 64;
static int	max_response_size = 1024 * 1024;
static int	http_poll_interval_ms = 1000;
static char *http_proxy = NULL;

/* Longest wait on the sockets before looking at the latch again. */
#define SOCKET_WAIT_MS 20
/* Longest time a finished transfer waits for others to share its outcome's commit. */
#define RECORD_DELAY_MS 5

void
ds_http_worker_init_module(void)
{
	DefineCustomIntVariable("durable_steps.http_max_inflight",
							"Most HTTP requests the HTTP worker has in flight at once.",
							NULL,
							&max_inflight,
							64,
							1,
							1024,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);
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
	/* postmaster settings can only be defined while the postmaster loads the library */
	if (!process_shared_preload_libraries_in_progress)
		return;
	DefineCustomStringVariable("durable_steps.http_proxy",
							   "Proxy that HTTP steps' requests go through; empty sends them directly.",
							   "A libcurl proxy URL (http://host:port, socks5h://host:port). The http_proxy, https_proxy, all_proxy and no_proxy variables of the server's environment are never used.",
							   &http_proxy,
							   "",
							   PGC_POSTMASTER,
							   GUC_SUPERUSER_ONLY,	/* its URL may hold a password */
							   NULL, NULL, NULL);
}

/* A growing byte buffer of libcurl's callbacks: malloc'd, NUL-terminated, capped. */
typedef struct CurlBuffer
{
	char	   *data;
	size_t		len;
	size_t		cap;
	size_t		limit;
	bool		over;			/* more than `limit` bytes came: the transfer was stopped */
} CurlBuffer;

/* A claim batch's memory: freed when its last transfer has been recorded. */
typedef struct ClaimBatch
{
	MemoryContext cxt;
	int			pending;
} ClaimBatch;

/* One claimed attempt, from its claim to its recorded outcome. */
typedef struct HttpTransfer
{
	dlist_node	node;
	ClaimBatch *batch;
	StepRecord	rec;			/* the step as claimed */
	TimestampTz claimed_at;
	HttpRequest req;
	bool		repeat_safe;
	/* a request refused before sending (stored request invalid, host no longer allowed) */
	bool		refused;
	AttemptOutcome refusal;
	char	   *idempotency_key;
	CURL	   *easy;
	struct curl_slist *headers;
	CurlBuffer	body;
	CurlBuffer	head;
	char		errbuf[CURL_ERROR_SIZE];
	HttpResponse resp;
	TimestampTz started_at;
	TimestampTz finished_at;
} HttpTransfer;

static CURLM *multi = NULL;
static dlist_head inflight = DLIST_STATIC_INIT(inflight);
static dlist_head finished = DLIST_STATIC_INIT(finished);
static int	n_inflight = 0;
/* an outcome of this cycle could not be recorded: its step is left running (record_transfer) */
static bool unrecorded_transfers = false;
static int	n_finished = 0;
static MemoryContext record_cxt = NULL;

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
	HttpTransfer *t = (HttpTransfer *) arg;

	return buffer_append(&t->body, ptr, size * nmemb) ? size * nmemb : 0;
}

/*
 * libcurl's header callback: the header lines of the last response (a 100 Continue before it,
 * or any interim response, starts the lines again).
 */
static size_t
on_header(char *ptr, size_t size, size_t nmemb, void *arg)
{
	HttpTransfer *t = (HttpTransfer *) arg;
	size_t		n = size * nmemb;

	if (n >= 5 && strncmp(ptr, "HTTP/", 5) == 0)
		t->head.len = 0;
	return buffer_append(&t->head, ptr, n) ? n : 0;
}

/* Release what a transfer holds outside PostgreSQL's memory. */
static void
free_curl_parts(HttpTransfer *t)
{
	if (t->easy != NULL)
	{
		(void) curl_multi_remove_handle(multi, t->easy);
		curl_easy_cleanup(t->easy);
		t->easy = NULL;
	}
	curl_slist_free_all(t->headers);
	t->headers = NULL;
	free(t->body.data);
	free(t->head.data);
	t->body.data = t->head.data = NULL;
}

/* A transfer is done with: its memory goes with its batch's last one. */
static void
free_transfer(HttpTransfer *t)
{
	ClaimBatch *batch = t->batch;

	free_curl_parts(t);
	if (--batch->pending == 0)
	{
		MemoryContextDelete(batch->cxt);
		pfree(batch);
	}
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
request_has_header(const HttpRequest *req, const char *name)
{
	for (int i = 0; i < req->n_headers; i++)
		if (pg_strcasecmp(req->header_names[i], name) == 0)
			return true;
	return false;
}

/* Set up the easy handle of a claimed transfer and hand it to the multi handle. */
static bool
start_transfer(HttpTransfer *t)
{
	const HttpRequest *req = &t->req;
	CURL	   *e = curl_easy_init();
	int64		limit_ms = ds_worker_attempt_limit_usecs(t->rec.timeout) / 1000;
	bool		ok = true;

	if (e == NULL)
		return false;
	t->easy = e;
	t->body.limit = (size_t) max_response_size;
	t->head.limit = DS_HTTP_MAX_HEADER_BYTES;
	for (int i = 0; ok && i < req->n_headers; i++)
		ok = add_header(&t->headers, req->header_names[i], req->header_values[i]);
	if (ok && t->idempotency_key != NULL)
		ok = add_header(&t->headers, t->rec.idempotency_header, t->idempotency_key);
	if (ok && req->body != NULL && !request_has_header(req, "Content-Type"))
		ok = add_header(&t->headers, "Content-Type",
						req->body_is_json ? "application/json" : "text/plain; charset=utf-8");
	/* no 100-continue round trip: the whole request goes at once */
	if (ok)
		ok = (t->headers = curl_slist_append(t->headers, "Expect:")) != NULL;
	if (!ok)
		return false;

	curl_easy_setopt(e, CURLOPT_PRIVATE, t);
	curl_easy_setopt(e, CURLOPT_URL, req->url);
	curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
	/*
	 * Only the superuser's setting names a proxy: libcurl would otherwise take one from the
	 * postmaster's environment, and send every role's requests, Authorization and all, there.
	 */
	curl_easy_setopt(e, CURLOPT_PROXY, http_proxy != NULL ? http_proxy : "");
	curl_easy_setopt(e, CURLOPT_NOPROXY, "");
	curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
	curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
	curl_easy_setopt(e, CURLOPT_USERAGENT, "durable_steps/0.1.0");
	curl_easy_setopt(e, CURLOPT_HTTPHEADER, t->headers);
	curl_easy_setopt(e, CURLOPT_ERRORBUFFER, t->errbuf);
	curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(e, CURLOPT_WRITEDATA, t);
	curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(e, CURLOPT_HEADERDATA, t);
	curl_easy_setopt(e, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t) max_response_size);
	curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long) Max(limit_ms, 1));
	curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long) req->connect_timeout_ms);

	/*
	 * libcurl sends a request again by itself when a reused connection turns out closed before
	 * any answer came. Harmless with an idempotency key or an idempotent method; otherwise the
	 * request gets a connection of its own, so that libcurl never repeats it.
	 */
	if (!t->repeat_safe)
		curl_easy_setopt(e, CURLOPT_FRESH_CONNECT, 1L);
	if (strcmp(req->method, "HEAD") == 0)
		curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
	else if (req->body != NULL || strcmp(req->method, "POST") == 0)
	{
		curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t) req->body_len);
		curl_easy_setopt(e, CURLOPT_POSTFIELDS, req->body ? req->body : "");
	}
	if (strcmp(req->method, "GET") != 0 && strcmp(req->method, "HEAD") != 0 &&
		strcmp(req->method, "POST") != 0)
		curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, req->method);
	else if (strcmp(req->method, "GET") == 0 && req->body != NULL)
		curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, "GET");
	t->started_at = GetCurrentTimestamp();
	return curl_multi_add_handle(multi, e) == CURLM_OK;
}

/* A transfer that could not be handed to libcurl: nothing was sent; try it again later. */
static void
refuse_transfer(HttpTransfer *t, AttemptClass cls, int sqlerrcode, char *message, char *detail,
				char *hint)
{
	t->refused = true;
	t->refusal.cls = cls;
	t->refusal.sqlerrcode = sqlerrcode;
	t->refusal.message = message;
	t->refusal.detail = detail;
	t->refusal.hint = hint;
}

/* The idempotency key of the step, header-safe, as ds_idempotency_key() hands it (key.h). */
static char *
step_idempotency_key(const StepRecord *rec)
{
	StringInfoData buf;

	initStringInfo(&buf);
	ds_append_step_key(&buf, rec->run_id, rec->step_id);
	return buf.data;
}

/*
 * In the claim's transaction: read the claimed step's stored request (it may be TOASTed) and
 * check it again; a request that can no longer be sent is refused without sending.
 */
static void
prepare_transfer(HttpTransfer *t)
{
	MemoryContext oldcxt = CurrentMemoryContext;
	Jsonb	   *request = DatumGetJsonbP(PointerGetDatum(t->rec.request));

	t->repeat_safe = ds_http_repeat_is_safe(t->rec.idempotency_header, request);
	if (t->rec.idempotency_header != NULL)
		t->idempotency_key = step_idempotency_key(&t->rec);
	/* the parser only allocates and raises: its error is caught without a subtransaction */
	PG_TRY();
	{
		ds_http_parse_request(request, &t->req);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(oldcxt);
		edata = CopyErrorData();
		FlushErrorState();
		refuse_transfer(t, ATTEMPT_PERMANENT, edata->sqlerrcode,
						psprintf("stored HTTP request is invalid: %s", edata->message), NULL, NULL);
		return;
	}
	PG_END_TRY();
	/*
	 * The owner's right to send ends with the role or its membership: a step is sent only while
	 * its owner exists and has the privileges of durable_steps_http, checked as the host is.
	 */
	if (!SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(t->rec.owner)))
		refuse_transfer(t, ATTEMPT_CORRECTABLE, ERRCODE_INSUFFICIENT_PRIVILEGE,
						pstrdup("the role that created the step no longer exists"),
						psprintf("Role OID %u was dropped; nothing was sent.", t->rec.owner),
						pstrdup("A superuser can give the step to a role that may send it (UPDATE durable_steps.steps SET owner = ...); then re-arm it with ds_retry_step()."));
	else if (!has_privs_of_role(t->rec.owner, get_role_oid("durable_steps_http", true)))
		refuse_transfer(t, ATTEMPT_CORRECTABLE, ERRCODE_INSUFFICIENT_PRIVILEGE,
						psprintf("role %s may no longer send HTTP steps",
								 GetUserNameFromId(t->rec.owner, false)),
						pstrdup("It no longer has the privileges of durable_steps_http; nothing was sent."),
						pstrdup("GRANT durable_steps_http TO the role; then re-arm the step with ds_retry_step()."));
	else if (!ds_http_host_allowed(t->req.host))
		refuse_transfer(t, ATTEMPT_CORRECTABLE, ERRCODE_INSUFFICIENT_PRIVILEGE,
						psprintf("host \"%s\" is not allowed for HTTP steps", t->req.host),
						pstrdup("durable_steps.http_allowed_hosts no longer lists it; nothing was sent."),
						pstrdup("A superuser can add the host to durable_steps.http_allowed_hosts; then re-arm the step with ds_retry_step()."));
}

/*
 * In the current transaction: claim up to `free_slots` due HTTP steps and prepare their
 * transfers; returns how many (*transfers is allocated in their batch's memory).
 */
static int
claim_batch(int free_slots, HttpTransfer ***transfers)
{
	ClaimedStep *claims;
	ClaimBatch *batch;
	int			n;

	batch = MemoryContextAllocZero(TopMemoryContext, sizeof(ClaimBatch));
	batch->cxt = AllocSetContextCreate(TopMemoryContext, "durable_steps HTTP claims",
									   ALLOCSET_DEFAULT_SIZES);
	n = ds_claim_due_http_steps(free_slots, batch->cxt, &claims);
	*transfers = MemoryContextAlloc(batch->cxt, sizeof(HttpTransfer *) * Max(n, 1));
	for (int i = 0; i < n; i++)
	{
		MemoryContext oldcxt = MemoryContextSwitchTo(batch->cxt);
		HttpTransfer *t = palloc0(sizeof(HttpTransfer));

		t->batch = batch;
		t->rec = claims[i].rec;
		/* the claim wrote the row last: its updated_at is the claim's time */
		t->claimed_at = t->rec.updated_at;
		prepare_transfer(t);
		MemoryContextSwitchTo(oldcxt);
		(*transfers)[i] = t;
	}
	batch->pending = n;
	if (n == 0)
	{
		MemoryContextDelete(batch->cxt);
		pfree(batch);
	}
	return n;
}

/* After the claims committed: start their requests (only now may they leave). */
static void
start_batch(HttpTransfer **transfers, int n)
{
	for (int i = 0; i < n; i++)
	{
		HttpTransfer *t = transfers[i];

		if (!t->refused && !start_transfer(t))
			refuse_transfer(t, ATTEMPT_RETRYABLE, ERRCODE_DS_HTTP_NOT_SENT,
							pstrdup("HTTP request was not sent: libcurl could not set it up"),
							NULL, NULL);
		if (t->refused)
		{
			free_curl_parts(t);
			t->started_at = t->finished_at = GetCurrentTimestamp();
			dlist_push_tail(&finished, &t->node);
			n_finished++;
		}
		else
		{
			dlist_push_tail(&inflight, &t->node);
			n_inflight++;
		}
	}
}

/* Let libcurl move every transfer along, and move those it finished to `finished`. */
static void
drive_transfers(void)
{
	int			running;
	int			queued;
	CURLMsg    *msg;

	(void) curl_multi_perform(multi, &running);
	while ((msg = curl_multi_info_read(multi, &queued)) != NULL)
	{
		HttpTransfer *t;
		curl_off_t	pretransfer = 0;

		if (msg->msg != CURLMSG_DONE)
			continue;
		(void) curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **) &t);
		t->finished_at = GetCurrentTimestamp();
		t->resp.code = msg->data.result;
		(void) curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &t->resp.status);
		(void) curl_easy_getinfo(t->easy, CURLINFO_PRETRANSFER_TIME_T, &pretransfer);
		t->resp.sent = pretransfer > 0 || t->resp.status > 0;
		t->resp.too_large = t->body.over || t->head.over;
		(void) curl_multi_remove_handle(multi, t->easy);
		curl_easy_cleanup(t->easy);
		t->easy = NULL;
		dlist_delete(&t->node);
		n_inflight--;
		dlist_push_tail(&finished, &t->node);
		n_finished++;
	}
}

/* The outcome of a finished transfer; *kept: a response to keep on a step that did not succeed. */
static void
transfer_outcome(HttpTransfer *t, AttemptOutcome *outcome, Jsonb **kept)
{
	*kept = NULL;
	if (t->refused)
		*outcome = t->refusal;
	else
	{
		memset(outcome, 0, sizeof(*outcome));
		t->resp.body = t->body.data ? t->body.data : "";
		t->resp.body_len = t->body.len;
		t->resp.head = t->head.data;
		t->resp.head_len = t->head.len;
		t->resp.error = t->errbuf;
		ds_http_classify(&t->resp, t->req.expect_json, t->repeat_safe, max_response_size,
						 outcome, kept);
	}
	outcome->started_at = t->started_at;
	outcome->finished_at = t->finished_at;
}

/*
 * The detail of an attempt that got a response but did not succeed: the response itself, as
 * JSON text cut to DS_MAX_ERROR_TEXT bytes. (A step's result is its success's alone.)
 */
static char *
response_detail(const char *detail, Jsonb *response)
{
	char	   *text = JsonbToCString(NULL, &response->root, VARSIZE(response));
	char	   *full = psprintf("%s%sResponse: %s", detail ? detail : "", detail ? " " : "", text);
	int			len = strlen(full);

	if (len <= DS_MAX_ERROR_TEXT)
		return full;
	len = pg_mbcliplen(full, len, DS_MAX_ERROR_TEXT - 4);
	return psprintf("%.*s ...", len, full);
}

/* Record one transfer's outcome in the current transaction; false when it could not be. */
static bool
record_transfer(HttpTransfer *t)
{
	MemoryContext oldcxt = CurrentMemoryContext;
	ResourceOwner oldowner = CurrentResourceOwner;
	bool		recorded = true;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(oldcxt);
	PG_TRY();
	{
		AttemptOutcome outcome;
		Jsonb	   *kept;
		StepRecord *rec = &t->rec;

		transfer_outcome(t, &outcome, &kept);
		if (kept != NULL)
			outcome.detail = response_detail(outcome.detail, kept);
		/* runs the step's outcome hook, as its owner, in this transaction (step_hooks.c) */
		ds_apply_attempt_outcome(rec, rec->attempts, &outcome);
		ds_store_finish_claimed_attempt(rec, rec->attempts, t->claimed_at, &outcome);
		/* a run waiting for the step (ds_http) goes on, but not for a retry: that is ours */
		if (rec->status != STEP_RETRYING && rec->status != STEP_PENDING)
			ds_run_wake_for_http_step(rec->run_id, rec->step_id);
		ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(oldcxt);
		CurrentResourceOwner = oldowner;
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(oldcxt);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(oldcxt);
		CurrentResourceOwner = oldowner;
		/* the step stays running: once its lock is let go, recovery counts the attempt lost */
		ereport(WARNING,
				(errmsg("durable_steps: could not record attempt %d of HTTP step %s/%s: %s",
						t->rec.attempts, t->rec.run_id, t->rec.step_id, edata->message)));
		recorded = false;
		unrecorded_transfers = true;
	}
	PG_END_TRY();
	return recorded;
}

/*
 * After outcome hooks ran, before the commit: let go of every session-level advisory lock of
 * this process -- a hook's pg_advisory_lock() must not outlive its transaction, as a body's does
 * not (worker.c) -- but those of the steps still in flight, which are pinned to the transaction
 * and taken again.
 */
static void
release_hook_advisory_locks(void)
{
	dlist_iter	it;

	dlist_foreach(it, &inflight)
	{
		HttpTransfer *t = dlist_container(HttpTransfer, node, it.cur);

		ds_step_lock_pin(t->rec.run_id, t->rec.step_id);
	}
	ds_step_lock_release_all_session();
	dlist_foreach(it, &inflight)
	{
		HttpTransfer *t = dlist_container(HttpTransfer, node, it.cur);

		if (!ds_step_lock_try_session(t->rec.run_id, t->rec.step_id))
			elog(ERROR, "could not keep the lock of HTTP step %s/%s in flight",
				 t->rec.run_id, t->rec.step_id);
	}
}

/*
 * Is the commit that ended at `lsn` as durable as the server promises a commit to be? With
 * synchronous replication, a commit whose wait for the standby was cancelled ("canceling wait
 * for synchronous replication ... committed locally") is not: a failover would lose it.
 */
static bool
commit_is_replicated(XLogRecPtr lsn)
{
	int			mode;
	bool		defined;
	bool		done;

	if (!SyncRepRequested())
		return true;
	mode = synchronous_commit == SYNCHRONOUS_COMMIT_REMOTE_WRITE ? SYNC_REP_WAIT_WRITE :
		synchronous_commit == SYNCHRONOUS_COMMIT_REMOTE_APPLY ? SYNC_REP_WAIT_APPLY :
		SYNC_REP_WAIT_FLUSH;
	LWLockAcquire(SyncRepLock, LW_SHARED);
	defined = (WalSndCtl->sync_standbys_status & SYNC_STANDBY_INIT) ?
		(WalSndCtl->sync_standbys_status & SYNC_STANDBY_DEFINED) != 0 :
		SyncRepStandbyNames != NULL && SyncRepStandbyNames[0] != '\0';
	done = !defined || lsn <= WalSndCtl->lsn[mode];
	LWLockRelease(SyncRepLock);
	return done;
}

/*
 * No request may leave before the claim that records it is as durable as a commit: a request
 * sent on a claim that a failover loses would be sent again by the promoted server under the
 * same attempt (README, "HTTP steps"). A cancelled wait for the synchronous standby is waited
 * again; a shutdown ends the process here, before anything is sent.
 */
static void
wait_until_claims_are_durable(void)
{
	XLogRecPtr	lsn = XactLastCommitEnd;

	while (!commit_is_replicated(lsn))
	{
		CHECK_FOR_INTERRUPTS();
		pgstat_report_activity(STATE_RUNNING,
							   "durable_steps: waiting for the synchronous standby before sending");
		/* as a commit waits: interrupts held, cancel and die seen by the wait itself */
		HOLD_INTERRUPTS();
		SyncRepWaitForLSN(lsn, false);
		RESUME_INTERRUPTS();
	}
}

/*
 * One transaction: record every finished transfer (each in its own subtransaction) and, with
 * `claim_slots` > 0, claim that many due steps more; commit; then let go of the recorded steps'
 * locks and memory, and start the new claims' requests. One commit serves both. Returns how many
 * were claimed; -1 when the extension is not installed.
 */
static int
cycle(int claim_slots)
{
	dlist_iter	it;
	dlist_mutable_iter mit;
	HttpTransfer **claimed = NULL;
	int			n_claimed = -1;
	bool		hooks_ran = false;

	if (ds_worker_begin_work("durable_steps: recording and claiming HTTP steps"))
	{
		MemoryContext oldcxt = MemoryContextSwitchTo(record_cxt);

		dlist_foreach(it, &finished)
		{
			HttpTransfer *t = dlist_container(HttpTransfer, node, it.cur);

			CHECK_FOR_INTERRUPTS();
			hooks_ran |= t->rec.on_success != NULL || t->rec.on_failure != NULL;
			(void) record_transfer(t);
		}
		MemoryContextSwitchTo(oldcxt);
		if (hooks_ran)
			release_hook_advisory_locks();
		n_claimed = claim_slots > 0 ? claim_batch(claim_slots, &claimed) : 0;
		ds_worker_commit();
	}
	/* the outcomes are committed (or the tables are gone): the steps are no longer in flight */
	dlist_foreach_modify(mit, &finished)
	{
		HttpTransfer *t = dlist_container(HttpTransfer, node, mit.cur);

		dlist_delete(&t->node);
		/* (a hook's turn let go of every session lock but those still in flight) */
		if (!hooks_ran)
			ds_step_lock_release_session(t->rec.run_id, t->rec.step_id);
		free_transfer(t);
	}
	n_finished = 0;
	MemoryContextReset(record_cxt);
	/* their locks are let go: the executors record the attempts not recorded here as lost */
	if (unrecorded_transfers)
		ds_attempts_may_be_lost();
	unrecorded_transfers = false;
	if (n_claimed > 0)
	{
		wait_until_claims_are_durable();
		start_batch(claimed, n_claimed);
	}
	return n_claimed;
}

/* Apply a reload of the configuration file, if one was asked for. */
static void
reload_settings_if_asked(void)
{
	if (!ConfigReloadPending)
		return;
	ConfigReloadPending = false;
	ProcessConfigFile(PGC_SIGHUP);
	(void) curl_multi_setopt(multi, CURLMOPT_MAXCONNECTS, (long) max_inflight);
}

/* When to look for due steps next: the next due time, at most a poll interval away. */
static TimestampTz
next_look_time(void)
{
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz backstop = TimestampTzPlusMilliseconds(now, http_poll_interval_ms);
	TimestampTz next_due;

	if (!ds_worker_begin_work("durable_steps: looking for the next due HTTP step"))
		return backstop;
	next_due = ds_next_http_due_time();
	ds_worker_commit();
	if (next_due == 0 || next_due > backstop)
		return backstop;
	/* due but not claimed: held by a transaction acting on it; look again soon, never spin */
	return Max(next_due, TimestampTzPlusMilliseconds(now, 5));
}

/* Connect to the database whose OID is in bgw_extra and set up libcurl. */
static void
start_http_worker(void)
{
	Oid			dbid;

	pqsignal(SIGTERM, die);
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	BackgroundWorkerUnblockSignals();
	memcpy(&dbid, MyBgworkerEntry->bgw_extra, sizeof(Oid));
	BackgroundWorkerInitializeConnectionByOid(dbid, InvalidOid, 0);
	pgstat_report_appname("durable_steps http");
	/* one HTTP worker per database: a second one (a launcher restarted under it) leaves */
	if (!ds_http_worker_take_slot())
	{
		ereport(LOG, (errmsg("durable_steps: database %u has an HTTP worker already", dbid)));
		proc_exit(0);
	}
	SetConfigOption("search_path", "pg_catalog", PGC_SUSET, PGC_S_OVERRIDE);
	/* outcome hooks run as their steps' owners in this session (step_hooks.c) */
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	ds_isolation_init_session();
	CommitTransactionCommand();

	if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
		ereport(ERROR, (errmsg("durable_steps: could not initialize libcurl")));
	multi = curl_multi_init();
	if (multi == NULL)
		ereport(ERROR, (errcode(ERRCODE_OUT_OF_MEMORY), errmsg("out of memory")));
	/* every in-flight request may keep its connection for the next one */
	(void) curl_multi_setopt(multi, CURLMOPT_MAXCONNECTS, (long) max_inflight);
	record_cxt = AllocSetContextCreate(TopMemoryContext, "durable_steps HTTP outcomes",
									   ALLOCSET_DEFAULT_SIZES);
	ereport(LOG, (errmsg("durable_steps: HTTP worker started in database %u", dbid)));
}

void
ds_http_worker_main(Datum arg)
{
	TimestampTz next_look = 0;	/* at once */

	start_http_worker();
	for (;;)
	{
		int			free_slots;
		int			batch = Max(1, max_inflight / 4);
		bool		claim;
		bool		record;
		TimestampTz now;

		CHECK_FOR_INTERRUPTS();
		if (!PostmasterIsAlive())
			proc_exit(1);
		/* a commit that made an HTTP step due (or a signal) set the latch */
		if (MyLatch->is_set)
		{
			ResetLatch(MyLatch);
			next_look = 0;
		}
		reload_settings_if_asked();
		if (n_inflight > 0)
			drive_transfers();

		/*
		 * Outcomes and claims go in batches, a quarter of the slots at least, so that a commit
		 * serves many steps -- sooner when nothing else is in flight, or an outcome has waited
		 * RECORD_DELAY_MS.
		 */
		now = GetCurrentTimestamp();
		free_slots = max_inflight - n_inflight;
		record = n_finished > 0 &&
			(n_inflight == 0 || n_finished >= batch ||
			 TimestampDifferenceExceeds(dlist_container(HttpTransfer, node,
														dlist_head_node(&finished))->finished_at,
										now, RECORD_DELAY_MS));
		claim = now >= next_look && free_slots > 0 && (n_inflight == 0 || free_slots >= batch);
		if ((record || claim) && ds_worker_must_wait())
		{
			/*
			 * Paused, or on a read-only server: nothing is claimed, and the finished transfers
			 * keep their outcomes (and their steps' locks) in memory until the wait is over.
			 */
			record = claim = false;
			next_look = TimestampTzPlusMilliseconds(now, http_poll_interval_ms);
		}
		if (record || claim)
		{
			int			want = (claim || now >= next_look) ? free_slots : 0;
			int			claimed = cycle(want);

			if (claimed < 0 && ds_serves_every_database() && n_inflight == 0)
			{
				/* no extension here (any more): like the executors, leave; the launcher knows */
				ereport(LOG,
						(errmsg("durable_steps: extension is not installed in database %u; its HTTP worker stops",
								MyDatabaseId)));
				proc_exit(0);
			}
			if (claimed < 0)
				next_look = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
														http_poll_interval_ms);
			else if (want > 0 && claimed < want)
				next_look = next_look_time();
			/* a full batch: there may be more due; look again as slots free up */
			continue;
		}

		if (n_inflight > 0)
		{
			int			numfds;

			pgstat_report_activity(STATE_IDLE, NULL);
			(void) curl_multi_wait(multi, NULL, 0,
								   n_finished > 0 ? RECORD_DELAY_MS : SOCKET_WAIT_MS, &numfds);
		}
		else
		{
			long		sleep_ms;

			now = GetCurrentTimestamp();
			sleep_ms = next_look <= now ? 0 :
				(long) ((next_look - now + 999) / 1000);
			if (sleep_ms > 0)
				(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
								 Min(sleep_ms, http_poll_interval_ms), PG_WAIT_EXTENSION);
		}
	}
}

BackgroundWorkerHandle *
ds_http_worker_register(Oid dbid, const char *dbname)
{
	BackgroundWorker worker;
	BackgroundWorkerHandle *handle;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "durable_steps");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "ds_http_worker_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "durable_steps http %s", dbname);
	snprintf(worker.bgw_type, BGW_MAXLEN, "durable_steps http");
	memcpy(worker.bgw_extra, &dbid, sizeof(Oid));
	worker.bgw_notify_pid = MyProcPid;
	if (!RegisterDynamicBackgroundWorker(&worker, &handle))
	{
		ereport(WARNING,
				(errmsg("durable_steps: could not start the HTTP worker of database \"%s\"", dbname),
				 errhint("Raise max_worker_processes: the HTTP worker needs a slot besides the executors.")));
		return NULL;
	}
	return handle;
}
