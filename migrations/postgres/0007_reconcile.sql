-- SPEC v4, section 21: reconciliation with the consumer. Additive only: a
-- replica of the release before never names the new column or table, and
-- keeps working on a migrated database.

-- 1: the background's mark (SPEC §21: at most one question per record per
-- `every` across every replica). A record is asked about when this is NULL
-- or past; the replica that asks sets it to now + `every` first, as a
-- compare-and-set. Nullable, no default: a catalogue change, no rewrite.
ALTER TABLE records ADD COLUMN IF NOT EXISTS reconcile_after BIGINT;

-- 2: each question, an attempt of its record (SPEC §13) with result
-- `reconciled` or `reconcile_unknown`. In a table of its own, not in
-- `record_attempts`: that table's key is (route, event_id, attempt), which
-- the release before names in its `ON CONFLICT`, and a question does not
-- count as an attempt (several questions ask about one attempt). The
-- newest 20 of each record are kept.
CREATE TABLE IF NOT EXISTS record_questions (
    id          BIGSERIAL PRIMARY KEY,
    route       TEXT   NOT NULL,
    event_id    TEXT   NOT NULL,
    attempt     BIGINT NOT NULL,
    started_at  BIGINT NOT NULL,
    ended_at    BIGINT,
    status      BIGINT,
    result      TEXT   NOT NULL CHECK (result IN ('reconciled', 'reconcile_unknown')),
    error       TEXT,
    duration_ms BIGINT,
    instance    TEXT
);
CREATE INDEX IF NOT EXISTS record_questions_record ON record_questions (route, event_id, id);

-- The questions go with their record, whoever deletes it (the sweeper of
-- the release before included): once per statement, over the deleted rows.
CREATE OR REPLACE FUNCTION idemgate_questions_swept() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM record_questions q USING swept s
     WHERE q.route = s.route AND q.event_id = s.event_id;
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS records_swept_questions ON records;
CREATE TRIGGER records_swept_questions AFTER DELETE ON records
    REFERENCING OLD TABLE AS swept
    FOR EACH STATEMENT EXECUTE FUNCTION idemgate_questions_swept();
