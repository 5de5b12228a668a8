# Property: the trigger patterns of docs/triggers.md hold, against the real HTTP worker and a
# provider on 127.0.0.1. An AFTER ROW trigger is an outbox: its HTTP step exists, and is sent,
# exactly when the row commits (a rolled-back statement or savepoint sends nothing). Roles that
# may not make HTTP steps insert through a SECURITY DEFINER trigger function owned by one that
# may, with its search_path pinned. A SQL step in a trigger runs at once and commits with the
# statement; a failing one either lets the row commit and leaves its retry to the worker, or,
# unwrapped, fails the statement and leaves nothing. A step made in a BEFORE trigger outlives
# a row that a later BEFORE trigger skips: outboxes go in AFTER triggers.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../perl";
use DurableSteps::Http;
use DurableSteps::Test;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $p = DurableSteps::Http::Provider->start;
my $node = http_node('trigger_patterns');
my $hook = $p->url('orders');
$node->safe_psql(
	'postgres', qq{
CREATE ROLE outbox NOLOGIN IN ROLE durable_steps_http;
CREATE TABLE orders (id int PRIMARY KEY, amount int NOT NULL);
GRANT INSERT, SELECT ON orders TO plain, app;

-- the README's outbox, as the inserting role: only members of durable_steps_http may use it
CREATE FUNCTION order_webhook_as_caller() RETURNS trigger LANGUAGE plpgsql AS \$\$
BEGIN
    PERFORM ds_http_step('order:' || NEW.id, 'webhook',
        jsonb_build_object('method', 'POST', 'url', '$hook', 'json', to_jsonb(NEW)));
    RETURN NEW;
END \$\$;

-- the outbox for every role: SECURITY DEFINER, owned by a member of durable_steps_http, every
-- name qualified and the search_path pinned (pg_temp last), so that a caller's objects are never
-- picked up in its place
CREATE FUNCTION order_webhook() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS \$\$
BEGIN
    PERFORM public.ds_http_step('order:' || NEW.id, 'webhook',
        pg_catalog.jsonb_build_object('method', 'POST', 'url', '$hook', 'json', pg_catalog.to_jsonb(NEW)));
    RETURN NEW;
END \$\$;
ALTER FUNCTION order_webhook() OWNER TO outbox;
REVOKE ALL ON FUNCTION order_webhook() FROM PUBLIC;
});

# 1. the README's trigger, as a role outside durable_steps_http: the insert is refused
$node->safe_psql('postgres',
	q{CREATE TRIGGER orders_webhook_as_caller AFTER INSERT ON orders FOR EACH ROW EXECUTE FUNCTION order_webhook_as_caller()});
my ($rc, $out, $err) = psql_as($node, 'plain', q{INSERT INTO orders VALUES (1, 10)});
like($err, qr/42501/, 'a trigger calling ds_http_step as a role outside durable_steps_http: 42501');
is($node->safe_psql('postgres', 'SELECT count(*) FROM orders'), '0', '... and the order is not stored');
$node->safe_psql('postgres', q{DROP TRIGGER orders_webhook_as_caller ON orders});

# 2. the SECURITY DEFINER outbox: any role inserts; the step is the outbox role's
$node->safe_psql('postgres',
	q{CREATE TRIGGER orders_webhook AFTER INSERT ON orders FOR EACH ROW EXECUTE FUNCTION order_webhook()});
psql_as_ok($node, 'plain', q{INSERT INTO orders VALUES (1, 10)});
is(settle_http($node, 'order:1', 'webhook'), 'succeeded', 'the committed order\'s webhook is sent');
is($node->safe_psql('postgres', q{SELECT owner FROM ds_steps WHERE run_id = 'order:1'}),
	'outbox', 'the step belongs to the trigger function\'s owner');

# a caller cannot slip its own ds_http_step in front of the outbox's: its search_path does not
# reach the pinned function (unpinned, this look-alike would run as the outbox role)
$node->safe_psql('postgres', q{GRANT CREATE ON DATABASE postgres TO plain});
psql_as_ok(
	$node, 'plain', q{
CREATE SCHEMA evil;
CREATE TABLE evil.ran_as (who text);
GRANT INSERT ON evil.ran_as TO PUBLIC;
GRANT USAGE ON SCHEMA evil TO PUBLIC;
CREATE FUNCTION evil.ds_http_step(text, text, jsonb) RETURNS void LANGUAGE sql
    AS 'INSERT INTO evil.ran_as VALUES (current_user)';
GRANT EXECUTE ON FUNCTION evil.ds_http_step(text, text, jsonb) TO PUBLIC;
SET search_path = evil, public;
INSERT INTO orders VALUES (2, 20);
});
is(settle_http($node, 'order:2', 'webhook'), 'succeeded', 'the outbox made its own step');
is($node->safe_psql('postgres', 'SELECT count(*) FROM evil.ran_as'), '0',
	'the caller\'s look-alike in its search_path never ran');

# 3. rolled back: no step, nothing sent
psql_as_ok($node, 'plain', q{BEGIN; INSERT INTO orders VALUES (3, 30); ROLLBACK;});

# 4. savepoints: the step goes with the row it was made for
psql_as_ok(
	$node, 'plain', q{
BEGIN;
INSERT INTO orders VALUES (4, 40);
SAVEPOINT s;
INSERT INTO orders VALUES (5, 50);
ROLLBACK TO SAVEPOINT s;
COMMIT;
});
is(settle_http($node, 'order:4', 'webhook'), 'succeeded', 'the order kept by the savepoint is sent');
is( $node->safe_psql('postgres', q{SELECT string_agg(run_id, ',' ORDER BY run_id) FROM ds_steps WHERE step_id = 'webhook'}),
	'order:1,order:2,order:4', 'no step for the rolled-back order nor the rolled-back savepoint');
is($p->charges('orders'), 3, 'three committed orders, three requests: one each');
is( join(',', sort split /,/, $p->keys_seen('orders')),
	$node->safe_psql('postgres',
		q{SELECT string_agg(DISTINCT idempotency_key, ',' ORDER BY idempotency_key) FROM ds_attempts WHERE step_id = 'webhook'}),
	'each with its own order\'s idempotency key');

# 5. a SQL step in an AFTER ROW trigger runs at once and commits with the statement
$node->safe_psql(
	'postgres', q{
CREATE TABLE ledger (order_id int, note text);
CREATE TABLE gate (open boolean);
INSERT INTO gate VALUES (false);
CREATE FUNCTION order_ledger() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- a failing step does not fail the insert: its retry is left to the worker
    PERFORM ds_run_step('ledger:' || NEW.id, 'book',
        format($q$WITH w AS (INSERT INTO ledger VALUES (%s, 'booked') RETURNING 1)
                  SELECT CASE WHEN (SELECT open FROM gate) THEN 'booked'
                              ELSE ds_retry_after('gate closed', '1 s')::text END FROM w$q$, NEW.id),
        policy => '{"max_attempts": 30}');
    RETURN NEW;
END $$;
CREATE TABLE strict_orders (id int PRIMARY KEY);
CREATE FUNCTION strict_ledger() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- unwrapped: a step that did not succeed fails the statement, and nothing of it is kept
    PERFORM ds_unwrap(ds_run_step('strict:' || NEW.id, 'book',
        $q$SELECT ds_non_retriable('refused')$q$));
    RETURN NEW;
END $$;
GRANT INSERT ON strict_orders TO app;
CREATE TRIGGER orders_ledger AFTER INSERT ON orders FOR EACH ROW EXECUTE FUNCTION order_ledger();
CREATE TRIGGER strict_orders_ledger AFTER INSERT ON strict_orders FOR EACH ROW EXECUTE FUNCTION strict_ledger();
});
# (the WITH ... INSERT is the step body's own write: that of a failed attempt rolls back with it)
$node->safe_psql('postgres', q{UPDATE gate SET open = true; INSERT INTO orders VALUES (6, 60);});
is( $node->safe_psql('postgres',
		q{SELECT s.status || ' ' || s.attempt || ' ' || (SELECT count(*) FROM ledger WHERE order_id = 6) FROM ds_steps s WHERE run_id = 'ledger:6'}),
	'succeeded 1 1', 'a SQL step in the trigger ran at once; its write committed with the row');
$node->safe_psql('postgres', q{UPDATE gate SET open = false; INSERT INTO orders VALUES (7, 70);});
is( $node->safe_psql('postgres',
		q{SELECT status || ' ' || (SELECT count(*) FROM orders WHERE id = 7) || ' ' || (SELECT count(*) FROM ledger WHERE order_id = 7) FROM ds_steps WHERE run_id = 'ledger:7'}),
	'retrying 1 0', 'a failing step: the row commits, the step waits for its retry, its write rolled back');
$node->safe_psql('postgres', q{UPDATE gate SET open = true});
ok(poll_until($node, 'postgres', q{SELECT status FROM ds_steps WHERE run_id = 'ledger:7'}, 'succeeded'),
	'the worker retries it');
is($node->safe_psql('postgres', q{SELECT count(*) FROM ledger WHERE order_id = 7}),
	'1', 'once, with its write');
($rc, $out, $err) = psql_as($node, 'app', q{INSERT INTO strict_orders VALUES (1)});
like($err, qr/DS102/, 'an unwrapped failing step fails the statement (DS102)');
is( $node->safe_psql('postgres',
		q{SELECT (SELECT count(*) FROM strict_orders) || ' ' || (SELECT count(*) FROM ds_steps WHERE run_id = 'strict:1')}),
	'0 0', '... and neither the row nor the step is kept');

# 6. a BEFORE trigger runs before the row is kept: a later BEFORE trigger that skips the row
# leaves the step without its row
$node->safe_psql(
	'postgres', q{
CREATE TABLE drafts (id int PRIMARY KEY, final boolean);
CREATE FUNCTION draft_step() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM ds_run_step('draft:' || NEW.id, 'notice', 'SELECT 1', defer => true);
    RETURN NEW;
END $$;
CREATE FUNCTION skip_non_final() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RETURN CASE WHEN NEW.final THEN NEW END;
END $$;
-- BEFORE triggers fire in name order: a_ first
CREATE TRIGGER a_draft_step BEFORE INSERT ON drafts FOR EACH ROW EXECUTE FUNCTION draft_step();
CREATE TRIGGER b_skip BEFORE INSERT ON drafts FOR EACH ROW EXECUTE FUNCTION skip_non_final();
INSERT INTO drafts VALUES (1, false);
});
is( $node->safe_psql('postgres',
		q{SELECT (SELECT count(*) FROM drafts) || ' ' || (SELECT count(*) FROM ds_steps WHERE run_id = 'draft:1')}),
	'0 1', 'a step made in a BEFORE trigger outlives the row a later BEFORE trigger skipped');

unlike(slurp_file($node->logfile), $crash_re, 'no server process crashed');
$node->stop;
done_testing();
