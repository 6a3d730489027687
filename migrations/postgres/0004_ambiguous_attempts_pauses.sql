-- SPEC v3, sections 12-14: the `ambiguous` state, every attempt recorded,
-- routes paused in the store. Nothing here rewrites or scans `records`
-- (added columns without a volatile default are catalogue changes), so the
-- migration's brief lock is the same on a table of millions, and a replica
-- of the release before (a zero-downtime upgrade) keeps working: it never
-- names the new columns, and it meets an `ambiguous` record only as a state
-- it refuses to forward (503).

-- The state's CHECK, widened to 'ambiguous'. NOT VALID: existing rows are
-- not re-checked (every one satisfies the narrower rule it replaces), new
-- and updated rows are.
ALTER TABLE records DROP CONSTRAINT IF EXISTS records_state_check;
ALTER TABLE records ADD CONSTRAINT records_state_check
    CHECK (state IN ('processing', 'delivered', 'failed', 'ambiguous')) NOT VALID;

-- 1: the claim was taken on a route with `on_ambiguous: hold` (an ended
-- lease turns the record `ambiguous`, not claimable). The instance that
-- holds the claim, for the attempt history when the claim is lost.
ALTER TABLE records ADD COLUMN IF NOT EXISTS hold SMALLINT NOT NULL DEFAULT 0;
ALTER TABLE records ADD COLUMN IF NOT EXISTS claimed_by TEXT;

-- The ambiguous records wait for an operator: counted per route every 30 s,
-- listed on the console, released in bulk. Partial: no other record pays.
-- (On an empty partial index the build is instant: no record is ambiguous yet.)
CREATE INDEX IF NOT EXISTS records_ambiguous ON records (route, updated_at) WHERE state = 'ambiguous';

-- Section 13: one row per forward of a guarded request, the newest 20 of
-- each record, written in the settle's own statement.
CREATE TABLE IF NOT EXISTS record_attempts (
    route       TEXT   NOT NULL,
    event_id    TEXT   NOT NULL,
    attempt     BIGINT NOT NULL,
    started_at  BIGINT NOT NULL,
    ended_at    BIGINT,
    status      BIGINT,
    result      TEXT   NOT NULL
                CHECK (result IN ('delivered', 'released', 'ambiguous', 'stale', 'settle_error')),
    error       TEXT,
    duration_ms BIGINT,
    instance    TEXT,
    PRIMARY KEY (route, event_id, attempt)
);
ALTER TABLE record_attempts SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 10000,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_analyze_scale_factor = 0.05
);

-- A claim taken over after its lease ended (on_ambiguous: release): the
-- attempt that held it ended without an answer. Written in the takeover's
-- own statement, by whichever replica takes it over (one of the release
-- before too).
CREATE OR REPLACE FUNCTION idemgate_lease_lost() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO record_attempts
        (route, event_id, attempt, started_at, ended_at, status, result, error, duration_ms, instance)
    VALUES (OLD.route, OLD.event_id, OLD.attempts, OLD.updated_at, OLD.lease_until, NULL,
            'released', 'lease ended without an answer', NULL, OLD.claimed_by)
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS records_lease_lost ON records;
CREATE TRIGGER records_lease_lost AFTER UPDATE OF attempts ON records
    FOR EACH ROW WHEN (OLD.state = 'processing' AND NEW.attempts = OLD.attempts + 1)
    EXECUTE FUNCTION idemgate_lease_lost();

-- A record's attempts go with it, whoever deletes it (the sweeper of the
-- release before included): once per statement, over the deleted rows.
CREATE OR REPLACE FUNCTION idemgate_records_swept() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM record_attempts a USING swept s
     WHERE a.route = s.route AND a.event_id = s.event_id;
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS records_swept ON records;
CREATE TRIGGER records_swept AFTER DELETE ON records
    REFERENCING OLD TABLE AS swept
    FOR EACH STATEMENT EXECUTE FUNCTION idemgate_records_swept();

-- Section 14: a paused route, for every replica.
CREATE TABLE IF NOT EXISTS route_pauses (
    route     TEXT   NOT NULL PRIMARY KEY,
    paused_at BIGINT NOT NULL
);
