-- HTTP steps (docs/http.md): what ds_http_step and ds_resolve_step check when called.
-- Nothing is sent here: every step stored is due in 2100 (an HTTP worker may serve this database).
-- Each refused call is followed by its SQLSTATE.
\set SHOW_CONTEXT never

CREATE ROLE http_alice IN ROLE durable_steps_http;
CREATE ROLE http_bob IN ROLE durable_steps_http;
CREATE ROLE http_carol;                                  -- not allowed to create HTTP steps
CREATE ROLE http_admin IN ROLE durable_steps_admin;

SET ROLE http_alice;
-- malformed requests: 22023 naming the field (22004 for a NULL request), nothing stored
SELECT ds_http_step('h', 'bad', NULL);
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '[1]');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '"http://x"');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{}');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "file:///etc/passwd"}');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "gopher://127.0.0.1:70/x"}');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "ftp://127.0.0.1/x"}');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "127.0.0.1/x"}');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "http://"}');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "http://user:pw@api.example.com/"}');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": 42}');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "http://a.example/", "method": "post"}');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "http://a.example/", "method": "TRACE"}');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "http://a.example/", "headers": ["a"]}');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "http://a.example/", "headers": {"A": 1}}');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "http://a.example/", "headers": {"A B": "x"}}');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "http://a.example/", "headers": {"X-Evil": "a\r\nHost: b"}}');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "http://a.example/", "headers": {"Content-Length": "5"}}');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "http://a.example/", "json": {}, "body": "x"}');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "http://a.example/", "body": 5}');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "http://a.example/", "method": "HEAD", "body": "x"}');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "http://a.example/", "expect": "xml"}');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "http://a.example/", "connect_timeout": "soon"}');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "http://a.example/", "connect_timeout": 0}');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "http://a.example/", "connect_timeout": "1 hour"}');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "http://a.example/", "follow": true}');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "http://a.example/"}', idempotency_header => 'Bad Name');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "http://a.example/", "headers": {"idempotency-key": "k"}}');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "http://a.example/"}', timeout => '0 s');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "http://a.example/"}', timeout => '25 hours');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "http://a.example/"}', policy => '{"max_attempts": 0}');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "http://a.example/"}', nowait => NULL);
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "http://a.example/"}', on_success => 'SELEC 1');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "http://a.example/"}', on_failure => ' ');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "http://a.example/"}', run_at => 'infinity');
\echo :SQLSTATE
SELECT ds_http_step('h', '', '{"url": "http://a.example/"}');
\echo :SQLSTATE
SELECT ds_http_step(NULL, 'bad', '{"url": "http://a.example/"}');
\echo :SQLSTATE
-- retry_on_status / fail_on_status: statuses 100-599 or classes such as '4xx', never 2xx; given
-- once, as an argument or as a field of the request
SELECT ds_http_step('h', 'bad', '{"url": "http://a.example/"}', fail_on_status => '{abc}');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "http://a.example/"}', fail_on_status => '{600}');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "http://a.example/"}', retry_on_status => '{99}');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "http://a.example/"}', retry_on_status => '{200}');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "http://a.example/"}', fail_on_status => '{2xx}');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "http://a.example/"}', fail_on_status => '{4x}');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "http://a.example/"}', fail_on_status => '{402,NULL}');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "http://a.example/"}', fail_on_status => '{{402},{403}}');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "http://a.example/", "fail_on_status": "4xx"}');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "http://a.example/", "fail_on_status": [402.5]}');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "http://a.example/", "fail_on_status": [true]}');
\echo :SQLSTATE
SELECT ds_http_step('h', 'bad', '{"url": "http://a.example/", "fail_on_status": [402]}',
                    fail_on_status => '{403}');
\echo :SQLSTATE
SELECT count(*) AS stored_after_bad_input FROM ds_steps;

-- a well-formed request is stored pending; nothing is sent in the caller's transaction
SELECT run_id, step_id, status, attempt, max_attempts, replayed
  FROM ds_http_step('h', 'charge',
       '{"method": "POST", "url": "https://api.example.com/charges", "expect": "json",
         "headers": {"Authorization": "Bearer sk_live_secret", "X-Api-Key": "k-secret", "X-Trace": "t1"},
         "json": {"amount": 4200, "currency": "EUR"}, "connect_timeout": "2 s"}',
       run_at => '2100-01-01');
SELECT kind, status, idempotency_header, timeout, request->>'url' AS url,
       request->'headers'->>'Authorization' AS owner_sees
  FROM ds_steps WHERE step_id = 'charge';
-- the same call again: the stored step answers (replayed); a different request conflicts
SELECT status, replayed
  FROM ds_http_step('h', 'charge',
       '{"method": "POST", "url": "https://api.example.com/charges", "expect": "json",
         "headers": {"Authorization": "Bearer sk_live_secret", "X-Api-Key": "k-secret", "X-Trace": "t1"},
         "json": {"amount": 4200, "currency": "EUR"}, "connect_timeout": "2 s"}',
       run_at => '2100-01-01');
SELECT ds_http_step('h', 'charge', '{"method": "POST", "url": "https://api.example.com/charges", "json": {"amount": 1}}');
\echo :SQLSTATE
-- a SQL step under the same identity is another definition
SELECT ds_run_step('h', 'charge', 'SELECT 1');
\echo :SQLSTATE
-- no idempotency header
SELECT status FROM ds_http_step('h', 'no-key', '{"url": "http://a.example/"}', idempotency_header => NULL,
                                run_at => '2100-01-01');
SELECT status FROM ds_http_step('h', 'empty-key', '{"url": "http://a.example/"}', idempotency_header => '',
                                run_at => '2100-01-01');
SELECT step_id, idempotency_header IS NULL AS sends_no_key FROM ds_steps
 WHERE step_id IN ('charge', 'no-key', 'empty-key') ORDER BY step_id;
-- the status lists are part of the stored request: the same lists replay, other lists conflict
SELECT status FROM ds_http_step('h', 'decline', '{"method": "POST", "url": "https://api.example.com/charges"}',
                                fail_on_status => '{402,4XX}', retry_on_status => '{409}',
                                run_at => '2100-01-01');
SELECT request->'fail_on_status' AS fail_on_status, request->'retry_on_status' AS retry_on_status
  FROM ds_steps WHERE step_id = 'decline';
SELECT status, replayed FROM ds_http_step('h', 'decline',
       '{"method": "POST", "url": "https://api.example.com/charges", "retry_on_status": ["409"]}',
       fail_on_status => '{402,4XX}', run_at => '2100-01-01');
SELECT ds_http_step('h', 'decline', '{"method": "POST", "url": "https://api.example.com/charges"}',
                    fail_on_status => '{402}', run_at => '2100-01-01');
\echo :SQLSTATE
SELECT status FROM ds_http_step('h', 'decline-in-request',
       '{"url": "https://api.example.com/x", "retry_on_status": [409, "5xx"], "fail_on_status": []}',
       run_at => '2100-01-01');
-- a rolled-back caller leaves nothing to send
BEGIN;
SELECT status FROM ds_http_step('h', 'rolled-back', '{"url": "http://a.example/"}', run_at => '2100-01-01');
ROLLBACK;
SELECT count(*) AS rolled_back_steps FROM ds_steps WHERE step_id = 'rolled-back';
RESET ROLE;

-- another member of durable_steps_http: the identity is taken, and the answer is not hers
SET ROLE http_bob;
SELECT ds_http_step('h', 'charge', '{"method": "POST", "url": "https://api.example.com/charges", "expect": "json", "headers": {"Authorization": "Bearer sk_live_secret", "X-Api-Key": "k-secret", "X-Trace": "t1"}, "json": {"amount": 4200, "currency": "EUR"}, "connect_timeout": "2 s"}');
\echo :SQLSTATE
SELECT count(*) AS bob_sees FROM ds_steps WHERE run_id = 'h';
RESET ROLE;

-- a role without durable_steps_http is refused, and nothing is stored
SET ROLE http_carol;
SELECT ds_http_step('h', 'carol', '{"url": "http://a.example/"}');
\echo :SQLSTATE
RESET ROLE;
SELECT count(*) AS carol_steps FROM durable_steps.steps WHERE step_id = 'carol';

-- an admin sees other roles' steps with secret header values masked: Authorization always,
-- others named in durable_steps.http_secret_headers
SET durable_steps.http_secret_headers = 'x-api-key';
SET ROLE http_admin;
SELECT request->'headers' AS admin_sees FROM ds_steps WHERE step_id = 'charge';
-- nor the fingerprint, a hash of the unmasked request that would confirm a guessed secret
SELECT fingerprint IS NULL AS admin_sees_no_fingerprint FROM ds_steps WHERE step_id = 'charge';
RESET ROLE;
RESET durable_steps.http_secret_headers;
-- the setting is a superuser's
SET ROLE http_alice;
SET durable_steps.http_secret_headers = '';
\echo :SQLSTATE
SET durable_steps.http_allowed_hosts = '*';
\echo :SQLSTATE
RESET ROLE;

-- durable_steps.http_allowed_hosts: names, *.domain, or *; other hosts are refused with 42501
SET durable_steps.http_allowed_hosts = 'api.example.com, *.hooks.example';
SET ROLE http_alice;
SELECT status FROM ds_http_step('hosts', 'exact', '{"url": "https://API.example.com/x"}', run_at => '2100-01-01');
SELECT status FROM ds_http_step('hosts', 'sub', '{"url": "https://a.hooks.example/x"}', run_at => '2100-01-01');
SELECT ds_http_step('hosts', 'bare-domain', '{"url": "https://hooks.example/x"}');
\echo :SQLSTATE
SELECT ds_http_step('hosts', 'other', '{"url": "http://127.0.0.1:8080/x"}');
\echo :SQLSTATE
SELECT ds_http_step('hosts', 'suffix-trick', '{"url": "https://evilapi.example.com/x"}');
\echo :SQLSTATE
SELECT step_id FROM ds_steps WHERE run_id = 'hosts' ORDER BY step_id;
RESET ROLE;
RESET durable_steps.http_allowed_hosts;

-- ds_resolve_step: only uncertain steps, by their owner or an admin
SET ROLE http_alice;
SELECT ds_resolve_step('h', 'charge', 'done', NULL);
\echo :SQLSTATE
SELECT ds_resolve_step('h', 'charge', NULL, NULL);
\echo :SQLSTATE
SELECT ds_resolve_step('h', 'charge', 'succeeded', NULL);
\echo :SQLSTATE
SELECT ds_resolve_step('h', 'charge', 'succeeded', '{"status": 200}');
\echo :SQLSTATE
SELECT ds_resolve_step('h', 'nope', 'failed');
\echo :SQLSTATE
RESET ROLE;
-- (an uncertain step is made by hand here; TAP 043 makes one by a timeout)
UPDATE durable_steps.steps SET status = 'uncertain', attempts = 1, error_class = 'uncertain'
 WHERE step_id IN ('charge', 'no-key');
SET ROLE http_bob;
SELECT ds_resolve_step('h', 'charge', 'failed');
\echo :SQLSTATE
RESET ROLE;
-- input can only be replaced for SQL steps
SET ROLE http_alice;
SELECT ds_retry_step('h', 'charge', '{}');
\echo :SQLSTATE
RESET ROLE;
SET ROLE http_alice;
SELECT run_id, step_id, status, result, attempt, error_class
  FROM ds_resolve_step('h', 'charge', 'succeeded', '{"status": 200, "body": {"id": "ch_1"}}');
SELECT ds_resolve_step('h', 'charge', 'failed');
\echo :SQLSTATE
RESET ROLE;
SET ROLE http_admin;
SELECT status, result, error_detail, attempt, error_class, error_code
  FROM ds_resolve_step('h', 'no-key', 'failed', '{"note": "never arrived"}');
RESET ROLE;
SELECT step_id, attempt, class, error_code, error_message, executor, role
  FROM ds_attempts WHERE run_id = 'h' ORDER BY step_id, attempt;
-- a replay of the resolved step answers its resolution
SET ROLE http_alice;
SELECT status, result, replayed
  FROM ds_http_step('h', 'charge',
       '{"method": "POST", "url": "https://api.example.com/charges", "expect": "json",
         "headers": {"Authorization": "Bearer sk_live_secret", "X-Api-Key": "k-secret", "X-Trace": "t1"},
         "json": {"amount": 4200, "currency": "EUR"}, "connect_timeout": "2 s"}',
       run_at => '2100-01-01');
RESET ROLE;

-- nor does an admin resolve a superuser's step: its hooks would run with the superuser's rights
-- on the admin's finding, and admins may not re-arm a superuser's step either
SELECT status FROM ds_http_step('h', 'su-charge', '{"url": "https://api.example.com/su"}',
                                run_at => '2100-01-01', on_success => 'SELECT 1');
UPDATE durable_steps.steps SET status = 'uncertain', attempts = 1, error_class = 'uncertain'
 WHERE step_id = 'su-charge';
SET ROLE http_admin;
SELECT ds_resolve_step('h', 'su-charge', 'succeeded', '{"status": 200}');
\echo :SQLSTATE
SELECT ds_resolve_step('h', 'su-charge', 'failed');
\echo :SQLSTATE
RESET ROLE;
SELECT status, attempt FROM ds_resolve_step('h', 'su-charge', 'failed');

DELETE FROM durable_steps.steps WHERE run_id IN ('h', 'hosts');
DROP ROLE http_alice, http_bob, http_carol, http_admin;
