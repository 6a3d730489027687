-- The failed records, newest first, without a scan: the admin API lists them
-- and the operator console asks every few seconds, when there may be none
-- among millions. Partial, so a delivery that never fails never touches it.
CREATE INDEX IF NOT EXISTS records_failed ON records (first_seen_at) WHERE state = 'failed';
