-- SPEC v4, section 19: the record's latest send, so that a duplicate's
-- span (a replay, a 409, a 422, a reclaim) can link to the CLIENT span
-- that forwarded it. `send_trace` is written by every claim that wins (a
-- new record or a reclaim), as `<32 hex trace ID>-<16 hex span ID>`, NULL
-- when that send was not traced; `claimed_trace` is what a reclaim found
-- there (`claimed_trace = records.send_trace` in the claim's ON CONFLICT
-- SET, as `claimed_from = records.state`), so that the claim's RETURNING,
-- which gives new values only, names the send it replaced.
-- Columns without a default: no rewrite of `records`; a process of the
-- release before never names them (its claims leave them as they are, so
-- a record it reclaims keeps naming the send before, until a new process
-- claims it again).
ALTER TABLE records ADD COLUMN send_trace TEXT;
ALTER TABLE records ADD COLUMN claimed_trace TEXT;
