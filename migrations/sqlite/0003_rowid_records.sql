-- Records in arrival order, and their key in an index of its own.
--
-- Until now `records` was a WITHOUT ROWID table: every record lived in the
-- B-tree of its (route, event ID) key. Event IDs are random, so each claim
-- inserted into a random leaf of the whole table, and each settle rewrote
-- that leaf again: on a store of 5 million records (1.4 GiB) two scattered
-- pages of the file per event, nearly none of them in the page cache, each
-- written to the WAL and back. Here the records go into a rowid table, in
-- the order they arrive (a claim appends to its last pages, and a settle
-- finds the record among them); only the key's index (route, event ID and a
-- rowid: about a sixth of a record) takes random inserts, and a settle does
-- not change it.
--
-- The columns are 0001's; the other indexes are 0001's and 0002's. The copy
-- keeps arrival order (first_seen_at), so the sweeper's deletions stay
-- together. It rewrites every record in one transaction, about 14 s per
-- million records (5.1 million in 69 s on a 2-vCPU VM), during which other
-- processes' writes on the file wait; the file keeps its size and reuses
-- the old table's pages. See the README, "Upgrading a large SQLite store".
CREATE TABLE records_by_arrival (
    route               TEXT    NOT NULL,
    event_id            TEXT    NOT NULL,
    body_sha256         TEXT    NOT NULL,
    state               TEXT    NOT NULL CHECK (state IN ('processing', 'delivered', 'failed')),
    attempts            INTEGER NOT NULL CHECK (attempts >= 1),
    lease_until         INTEGER,
    last_status         INTEGER,
    last_error          TEXT,
    first_seen_at       INTEGER NOT NULL,
    updated_at          INTEGER NOT NULL,
    delivered_at        INTEGER,
    expires_at          INTEGER NOT NULL,
    claimed_from        TEXT,
    replay_status       INTEGER,
    replay_content_type TEXT,
    replay_body         BLOB
);

INSERT INTO records_by_arrival
SELECT route, event_id, body_sha256, state, attempts, lease_until, last_status, last_error,
       first_seen_at, updated_at, delivered_at, expires_at, claimed_from,
       replay_status, replay_content_type, replay_body
FROM records ORDER BY first_seen_at;

DROP TABLE records;
ALTER TABLE records_by_arrival RENAME TO records;

CREATE UNIQUE INDEX records_key ON records (route, event_id);
CREATE INDEX records_expires_at ON records (expires_at);
CREATE INDEX records_first_seen_at ON records (first_seen_at);
CREATE INDEX records_processing ON records (route, updated_at) WHERE state = 'processing';
CREATE INDEX records_failed ON records (first_seen_at) WHERE state = 'failed';
