-- SPEC v3, section 16: each claim carries a random token, kept with the
-- record, so that a claim whose commit was not acknowledged can be released
-- by the process that made it (fenced by the token), and by nothing else.
-- A nullable column without a default: a catalog change only, no rewrite
-- of `records`; a process of the release before never names it (its
-- claims leave it NULL, which no release matches).
ALTER TABLE records ADD COLUMN claim_token bigint;
