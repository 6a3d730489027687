-- SPEC v4, section 22: the delivered response's `replay_headers`, kept with
-- the record and sent again with every replay. Written by the delivered
-- settle alone, as `name: value` lines; NULL where there are none.
-- A column without a default: no rewrite of `records`; a process of the
-- release before never names it (its settles leave it NULL, and its
-- replays go without the headers, as before).
-- The schema as the file holds it, as 0005 does (harmless when 0004 did
-- not run in this transaction).
PRAGMA writable_schema = RESET;
ALTER TABLE records ADD COLUMN replay_headers TEXT;
