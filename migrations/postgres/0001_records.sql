-- One record per (route, event ID): the claim, its lease and its outcome.
-- Times are Unix milliseconds. No request payload is ever stored here.
CREATE TABLE IF NOT EXISTS records (
    route               TEXT     NOT NULL,
    event_id            TEXT     NOT NULL,
    body_sha256         TEXT     NOT NULL,
    state               TEXT     NOT NULL CHECK (state IN ('processing', 'delivered', 'failed')),
    attempts            BIGINT   NOT NULL CHECK (attempts >= 1),
    lease_until         BIGINT,
    last_status         BIGINT,
    last_error          TEXT,
    first_seen_at       BIGINT   NOT NULL,
    updated_at          BIGINT   NOT NULL,
    delivered_at        BIGINT,
    expires_at          BIGINT   NOT NULL,
    -- the state the last reclaim took the record from (claims_total{kind})
    claimed_from        TEXT,
    -- only with replay_body: the settled response to replay
    replay_status       BIGINT,
    replay_content_type TEXT,
    replay_body         BYTEA,
    PRIMARY KEY (route, event_id)
);

CREATE INDEX IF NOT EXISTS records_expires_at ON records (expires_at);
CREATE INDEX IF NOT EXISTS records_first_seen_at ON records (first_seen_at);
CREATE INDEX IF NOT EXISTS records_processing ON records (route, updated_at) WHERE state = 'processing';
