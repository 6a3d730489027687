-- SPEC v3, sections 12-14: the `ambiguous` state, every attempt recorded,
-- routes paused in the store. Nothing here rewrites `records`, so a store
-- of millions migrates in milliseconds, and a process of the release
-- before (a zero-downtime upgrade) keeps working on the file: it never
-- names the new columns, and it meets an `ambiguous` record only as a
-- state it refuses to forward (503).

-- 1: the claim was taken on a route with `on_ambiguous: hold` (an ended
-- lease turns the record `ambiguous`, not claimable). The instance that
-- holds the claim, for the attempt history when the claim is lost.
ALTER TABLE records ADD COLUMN hold INTEGER NOT NULL DEFAULT 0;
ALTER TABLE records ADD COLUMN claimed_by TEXT;

-- The ambiguous records wait for an operator: counted per route every 30 s,
-- listed on the console, released in bulk. Partial: no other record pays.
CREATE INDEX records_ambiguous ON records (route, updated_at) WHERE state = 'ambiguous';

-- Section 13: one row per forward of a guarded request, the newest 20 of
-- each record, written in the settle's own commit.
CREATE TABLE record_attempts (
    route       TEXT    NOT NULL,
    event_id    TEXT    NOT NULL,
    attempt     INTEGER NOT NULL,
    started_at  INTEGER NOT NULL,
    ended_at    INTEGER,
    status      INTEGER,
    result      TEXT    NOT NULL
                CHECK (result IN ('delivered', 'released', 'ambiguous', 'stale', 'settle_error')),
    error       TEXT,
    duration_ms INTEGER,
    instance    TEXT,
    PRIMARY KEY (route, event_id, attempt)
) WITHOUT ROWID;

-- A claim taken over after its lease ended (on_ambiguous: release): the
-- attempt that held it ended without an answer. Written here, in the
-- takeover's own statement, by whichever process takes it over (one of the
-- release before too).
CREATE TRIGGER records_lease_lost AFTER UPDATE OF attempts ON records
WHEN OLD.state = 'processing' AND NEW.attempts = OLD.attempts + 1
BEGIN
    INSERT OR IGNORE INTO record_attempts
        (route, event_id, attempt, started_at, ended_at, status, result, error, duration_ms, instance)
    VALUES (OLD.route, OLD.event_id, OLD.attempts, OLD.updated_at, OLD.lease_until, NULL,
            'released', 'lease ended without an answer', NULL, OLD.claimed_by);
END;

-- A record's attempts go with it, whoever deletes it (the sweeper of the
-- release before included).
CREATE TRIGGER records_swept AFTER DELETE ON records
BEGIN
    DELETE FROM record_attempts WHERE route = OLD.route AND event_id = OLD.event_id;
END;

-- The state's CHECK, widened to 'ambiguous' in place: SQLite's documented
-- way to change a CHECK constraint without a table rebuild ("Making Other
-- Kinds Of Table Schema Changes"). Every existing row satisfies the wider
-- constraint. It comes after the ALTERs (which edit the table's text by
-- the positions they parsed), and the CREATE after it changes the schema's
-- cookie, so every open connection reads the new text.
PRAGMA writable_schema = ON;
UPDATE sqlite_schema
   SET sql = replace(sql,
                     'CHECK (state IN (''processing'', ''delivered'', ''failed''))',
                     'CHECK (state IN (''processing'', ''delivered'', ''failed'', ''ambiguous''))')
 WHERE type = 'table' AND name = 'records';
PRAGMA writable_schema = OFF;

-- Section 14: a paused route, for every process on the file.
CREATE TABLE route_pauses (
    route     TEXT    NOT NULL PRIMARY KEY,
    paused_at INTEGER NOT NULL
);
