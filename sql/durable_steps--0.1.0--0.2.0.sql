-- durable_steps 0.1.0 to 0.2.0: the changes of 0.2.0 to an installed extension, in place.
\echo Use "ALTER EXTENSION durable_steps UPDATE" to load this file. \quit

-- Released scripts (sql/RELEASES) are never edited: every change to the schema of 0.2.0 goes
-- into this file, and a fresh CREATE EXTENSION runs durable_steps--0.1.0.sql and then this one,
-- so that a fresh install and an upgraded one are the same (docs/operations.md, "Upgrades").
--
-- The library of 0.2.0 reads and writes nothing of an extension still installed at 0.1.0 (DS426)
-- and its background worker waits: this script is what lets them carry on. It runs in the
-- transaction of the ALTER EXTENSION, so a failure leaves 0.1.0 as it was.

-- A holder of an idempotency key renews its lease while its work goes on
-- (docs/idempotent-requests.md, "Application code").
CREATE FUNCTION @extschema@.ds_idempotent_renew(
        scope text, key text, token uuid, lease interval DEFAULT '5 minutes')
    RETURNS timestamptz
    AS 'MODULE_PATHNAME', 'ds_idempotent_renew' LANGUAGE C VOLATILE;
