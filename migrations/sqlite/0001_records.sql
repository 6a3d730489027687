-- One record per (route, event ID): the claim, its lease and its outcome.
-- Times are Unix milliseconds. No request payload is ever stored here.
CREATE TABLE IF NOT EXISTS records (
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
    -- the state the last reclaim took the record from (claims_total{kind})
    claimed_from        TEXT,
    -- only with replay_body: the settled response to replay
    replay_status       INTEGER,
    replay_content_type TEXT,
    replay_body         BLOB,
    PRIMARY KEY (route, event_id)
) WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS records_expires_at ON records (expires_at);
CREATE INDEX IF NOT EXISTS records_first_seen_at ON records (first_seen_at);
CREATE INDEX IF NOT EXISTS records_processing ON records (route, updated_at) WHERE state = 'processing';
