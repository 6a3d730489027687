-- The failed records, newest first, without a scan: the admin API lists them
-- and the operator console asks every few seconds, when there may be none
-- among millions. Partial, so a delivery that never fails never touches it.
-- Building it blocks writes to `records` while it scans the table (about a
-- second per million records): on a large table, build it beforehand with
-- CREATE INDEX CONCURRENTLY and the same definition; this is then a no-op.
-- (Not CONCURRENTLY here: it would wait for the replicas queued on the
-- migrator's lock, which wait for it.)
CREATE INDEX IF NOT EXISTS records_failed ON records (first_seen_at) WHERE state = 'failed';
