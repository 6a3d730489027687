-- Every record is inserted, updated once or twice (no update is HOT: a
-- settle changes indexed columns) and deleted by the sweeper after its
-- retention, so the table turns over entirely every retention period. With
-- the server's defaults autovacuum waits until a fifth of the table is
-- dead, and then runs throttled; until it runs, deleted records' space is
-- not reused and the table and its indexes grow. Vacuumed sooner and
-- unthrottled (issue 24's steady state, 8,500 claims/s with a 60 s
-- retention: the table levelled off at 418-449 MiB once vacuum ran; with
-- autovacuum off it grew without end). Storage parameters only: no
-- rewrite, and the lock taken does not block reads or writes.
ALTER TABLE records SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 10000,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_analyze_scale_factor = 0.05
);
