-- SPEC v4, section 21: reconciliation with the consumer. Additive only: a
-- process of the release before never names the new column or table, and
-- keeps working on a migrated file.

-- 1: the background's mark (SPEC §21: at most one question per record per
-- `every` across every process). A record is asked about when this is
-- NULL or past; the process that asks sets it to now + `every` first, as a
-- compare-and-set. No default: a catalogue change, no rewrite.
ALTER TABLE records ADD COLUMN reconcile_after INTEGER;

-- 2: each question, an attempt of its record (SPEC §13) with result
-- `reconciled` or `reconcile_unknown`. In a table of its own, not in
-- `record_attempts`: that table's key is (route, event_id, attempt), which
-- the release before names in its `ON CONFLICT`, and a question does not
-- count as an attempt (several questions ask about one attempt). The
-- newest 20 of each record are kept.
CREATE TABLE record_questions (
    id          INTEGER PRIMARY KEY,
    route       TEXT    NOT NULL,
    event_id    TEXT    NOT NULL,
    attempt     INTEGER NOT NULL,
    started_at  INTEGER NOT NULL,
    ended_at    INTEGER,
    status      INTEGER,
    result      TEXT    NOT NULL CHECK (result IN ('reconciled', 'reconcile_unknown')),
    error       TEXT,
    duration_ms INTEGER,
    instance    TEXT
);
CREATE INDEX record_questions_record ON record_questions (route, event_id, id);

-- The questions go with their record, whoever deletes it (the sweeper of
-- the release before included).
CREATE TRIGGER records_swept_questions AFTER DELETE ON records
BEGIN
    DELETE FROM record_questions WHERE route = OLD.route AND event_id = OLD.event_id;
END;
