-- Every record is inserted, updated once or twice (no update is HOT: a
-- settle changes indexed columns) and deleted by the sweeper after its
-- retention, so the table turns over entirely every retention period. With
-- the server's defaults autovacuum waits until a fifth of the table is
-- dead and then runs throttled: in issue 24's steady state (4,900 claims/s,
-- retention 60 s) the table and its indexes grew from 220 to 596 MiB in
-- 200 s while the live records stayed flat. Vacuumed sooner and unthrottled,
-- the space of deleted records is reused instead. Storage parameters only:
-- no rewrite, and the lock taken does not block reads or writes.
ALTER TABLE records SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 10000,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_analyze_scale_factor = 0.05
);
