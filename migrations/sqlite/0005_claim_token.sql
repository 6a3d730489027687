-- SPEC v3, section 16: each claim carries a random token, kept with the
-- record, so that a claim whose commit was not acknowledged can be released
-- by the process that made it (fenced by the token), and by nothing else.
-- A column without a default: no rewrite of `records`; a process of the
-- release before never names it (its claims leave it NULL, which no
-- release matches).
-- First the schema as the file holds it: migration 0004 edits the records
-- table's text (writable_schema), and a connection that ran it in the same
-- transaction still holds the old text, whose length ADD COLUMN goes by.
PRAGMA writable_schema = RESET;
ALTER TABLE records ADD COLUMN claim_token INTEGER;
