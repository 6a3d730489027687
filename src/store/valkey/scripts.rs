//! The server-side scripts: each transition of SPEC §3 as one Lua script
//! on one slot (the record, its attempts and its bucket's indexes share a
//! hash tag), so it is atomic on its shard whatever else runs. They mirror
//! the SQL of `store::sql` clause for clause; the comments name the SQL
//! constant each one follows. Optional values are sent as `""` (absent) or
//! `"=" + value`, so that an empty body stays apart from none.
//!
//! Retention: the sweeper deletes a record when its `expires_at` passes,
//! as on the SQL stores (and trims its index entries); the key's own
//! expiry (`PEXPIRE`) is set an hour past that as a backstop for a
//! sweeper that lags, and never ends a live lease.
//!
//! Lua's numbers are doubles: exact for the millisecond times and counts
//! used here (below 2^53). Times written back are formatted with `%.0f`.

/// Helpers every script starts with.
macro_rules! prelude {
    () => {
        r#"
local function opt(s) if s == '' then return false end return string.sub(s, 2) end
local function num(x) return string.format('%.0f', x) end
-- the key's own expiry: an hour past the later of its expiry and its lease
-- (the sweeper deletes it on time; this is the backstop, and never ends a
-- live lease)
local function ttl(expires_at, now, lease)
  local until_ = math.max(tonumber(expires_at), tonumber(lease or 0))
  return num(math.max(until_ - tonumber(now), 0) + 3600000)
end
local LOST = 'lease ended without an answer'
-- an attempt's row; never replaces a delivered one (ATTEMPT_UPSERT's WHERE)
local function put_attempt(key, n, row, only_new)
  local old = redis.call('HGET', key, n)
  if old then
    if only_new then return end
    if cjson.decode(old).result == 'delivered' then return end
  end
  redis.call('HSET', key, n, cjson.encode(row))
end
-- keeps the newest 20 rows (ATTEMPTS_TRIM)
local function trim(key, newest)
  for _, f in ipairs(redis.call('HKEYS', key)) do
    if tonumber(f) <= newest - 20 then redis.call('HDEL', key, f) end
  end
end
-- (PEXPIRE of a key that does not exist does nothing and is not
-- replicated: no EXISTS first)
local function expire(rec, att, expires_at, now, lease)
  local t = ttl(expires_at, now, lease)
  redis.call('PEXPIRE', rec, t)
  redis.call('PEXPIRE', att, t)
end
"#
    };
}

/// The claim (`sql::CLAIM` with the lease-lost trigger, and under `hold`
/// `HOLD_LOST_ATTEMPT` + `HOLD_EXPIRED`), in one step.
/// KEYS: record, attempts, by_first_seen, by_expiry, processing, ambiguous.
/// ARGV: event_id, digest, now, lease_until, expires_at, hold (0/1),
/// instance, token, send? (SPEC §19: the claim's send, which a winning
/// claim keeps as the record's `send_trace`, or removes it when absent; a
/// field the release before's script neither writes nor reads, so no new
/// format: a record it reclaims keeps naming the send before).
/// Returns `{'claimed', attempts, claimed_from|nil, replaced send|nil}`,
/// `{'held', send_trace|nil}`, or `{'existing', state, lease_until,
/// body_sha256, last_status, replay_status, replay_content_type,
/// replay_body, replay_headers, send_trace}` (`decode::READBACK_FIELDS`).
pub const CLAIM: &str = concat!(
    prelude!(),
    r#"
local rec, att = KEYS[1], KEYS[2]
local id, digest, now = ARGV[1], ARGV[2], ARGV[3]
local r = redis.call('HMGET', rec, 'state', 'lease_until', 'body_sha256', 'attempts', 'updated_at',
  'claimed_by', 'claim_token', 'last_status', 'replay_status', 'replay_content_type', 'replay_body', 'expires_at', 'replay_headers',
  'send_trace')
local state = r[1]
local function take(attempts, from)
  redis.call('HSET', rec, 'state', 'processing', 'attempts', attempts, 'lease_until', ARGV[4],
    'updated_at', now, 'expires_at', ARGV[5], 'hold', ARGV[6], 'claimed_by', ARGV[7], 'claim_token', ARGV[8])
  if from then redis.call('HSET', rec, 'claimed_from', from) else redis.call('HDEL', rec, 'claimed_from') end
  -- the claim's send is the latest now; the one it replaced is answered
  local send = opt(ARGV[9] or '')
  if send then redis.call('HSET', rec, 'send_trace', send) else redis.call('HDEL', rec, 'send_trace') end
  expire(rec, att, ARGV[5], now, ARGV[4])
  redis.call('ZADD', KEYS[4], ARGV[5], id)
  redis.call('ZADD', KEYS[5], now, id)
  return {'claimed', attempts, from, from and r[14]}
end
if not state then
  redis.call('HSET', rec, 'body_sha256', digest, 'first_seen_at', now)
  redis.call('ZADD', KEYS[3], now, id)
  return take(1, false)
end
if r[3] == digest then
  if state == 'failed' then return take(tonumber(r[4]) + 1, 'failed') end
  if state == 'processing' and (not r[2] or tonumber(r[2]) <= tonumber(now)) then
    local lost = {started_at = r[5], ended_at = r[2] or nil, error = LOST, instance = r[6] or nil}
    if ARGV[6] == '1' then
      lost.result = 'ambiguous'
      put_attempt(att, r[4], lost, true)
      local expires_at = num(tonumber(now) + tonumber(r[12]) - tonumber(r[5]))
      redis.call('HSET', rec, 'state', 'ambiguous', 'last_error', LOST, 'updated_at', now, 'expires_at', expires_at)
      redis.call('HDEL', rec, 'lease_until')
      expire(rec, att, expires_at, now)
      redis.call('ZADD', KEYS[4], expires_at, id)
      redis.call('ZREM', KEYS[5], id)
      redis.call('SADD', KEYS[6], id)
      return {'held', r[14]}
    end
    lost.result = 'released'
    put_attempt(att, r[4], lost, true)
    return take(tonumber(r[4]) + 1, 'processing')
  end
end
return {'existing', state, r[2], r[3], r[8], r[9], r[10], r[11], r[13], r[14]}
"#
);

/// A settle (`sql::SETTLE_DELIVERED`, `SETTLE_FAILED`, `SETTLE_AMBIGUOUS`
/// with `ATTEMPT_UPSERT` and `ATTEMPTS_TRIM`): delivered is final and the
/// first wins; failed and ambiguous are fenced by the attempt.
/// KEYS: record, attempts, by_expiry, processing, ambiguous.
/// ARGV: event_id, outcome (delivered|failed|ambiguous), attempt, now,
/// expires_at, status?, error?, replay_status?, content_type?, body?,
/// started_at, instance, attempt_error?, replay_headers? (SPEC §22: a
/// field of its own, which the release before's script neither writes nor
/// reads).
/// Returns 1 when the record changed, else 0.
pub const SETTLE: &str = concat!(
    prelude!(),
    r#"
local rec, att = KEYS[1], KEYS[2]
local id, outcome, attempt, now = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local r = redis.call('HMGET', rec, 'state', 'attempts')
local state = r[1]
if not state then return 0 end
local changed = 0
if outcome == 'delivered' then
  if state ~= 'delivered' then
    redis.call('HSET', rec, 'state', 'delivered', 'last_status', opt(ARGV[6]), 'delivered_at', now,
      'updated_at', now, 'expires_at', ARGV[5])
    redis.call('HDEL', rec, 'last_error', 'lease_until', 'replay_status', 'replay_content_type', 'replay_body',
      'replay_headers')
    local rs, ct, body, rh = opt(ARGV[8]), opt(ARGV[9]), opt(ARGV[10]), opt(ARGV[14] or '')
    if rh then redis.call('HSET', rec, 'replay_headers', rh) end
    if rs then redis.call('HSET', rec, 'replay_status', rs) end
    if ct then redis.call('HSET', rec, 'replay_content_type', ct) end
    if body then redis.call('HSET', rec, 'replay_body', body) end
    changed = 1
  end
elseif state == 'processing' and r[2] == attempt then
  redis.call('HSET', rec, 'state', outcome, 'updated_at', now, 'expires_at', ARGV[5])
  redis.call('HDEL', rec, 'lease_until', 'last_status', 'last_error')
  local s, e = opt(ARGV[6]), opt(ARGV[7])
  if s then redis.call('HSET', rec, 'last_status', s) end
  if e then redis.call('HSET', rec, 'last_error', e) end
  changed = 1
end
if changed == 1 then
  expire(rec, att, ARGV[5], now)
  redis.call('ZADD', KEYS[3], ARGV[5], id)
  redis.call('ZREM', KEYS[4], id)
  -- the set holds exactly the records in `ambiguous`
  if outcome == 'ambiguous' then redis.call('SADD', KEYS[5], id)
  elseif state == 'ambiguous' then redis.call('SREM', KEYS[5], id) end
end
-- the attempt's row; none for the first attempt of a record it delivered:
-- that attempt is the record's own fields (as `store::memory` keeps it)
local first_delivered = r[2] == '1' and (state == 'delivered' or (changed == 1 and outcome == 'delivered'))
if not (attempt == '1' and first_delivered) then
  local result = 'stale'
  if changed == 1 then
    if outcome == 'failed' then result = 'released' else result = outcome end
  end
  local started = tonumber(ARGV[11])
  put_attempt(att, attempt, {started_at = ARGV[11], ended_at = now, status = opt(ARGV[6]) or nil,
    result = result, error = opt(ARGV[13]) or nil, duration_ms = num(tonumber(now) - started),
    instance = ARGV[12]}, false)
  trim(att, tonumber(attempt))
  local left = redis.call('PTTL', rec)
  if left > 0 then redis.call('PEXPIRE', att, left) end
end
return changed
"#
);

/// The start of an operator's change of one record (release, resolve):
/// KEYS record, attempts; ARGV event_id, now; the record's state and
/// retention span (`r`: state, expires_at, updated_at) read, and
/// `{'not_found'}` without it.
macro_rules! one_record_head {
    () => {
        r#"
local rec, att, id, now = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
local r = redis.call('HMGET', rec, 'state', 'expires_at', 'updated_at')
if not r[1] then return {'not_found'} end
"#
    };
}

/// The end of that change, the record out of `processing` and `ambiguous`
/// for good: its keys' expiry and the bucket's index of expiry follow its
/// new `expires_at`. KEYS[3..5]: by_expiry, processing, ambiguous.
macro_rules! one_record_indexes {
    () => {
        r#"expire(rec, att, expires_at, now)
redis.call('ZADD', KEYS[3], expires_at, id)
redis.call('ZREM', KEYS[4], id)
redis.call('SREM', KEYS[5], id)
"#
    };
}

/// Operator release (`sql::RELEASE` with `MATERIALISE_FIRST`: a first
/// attempt that delivered, kept as the record's own fields, gets its row
/// first): to `failed` with no lease, keeping the record's retention span
/// from now; a delivered record only when forced.
/// KEYS: record, attempts, by_expiry, processing, ambiguous. ARGV: event_id, now,
/// force (0/1).
/// Returns `{'released', previous}`, `{'not_found'}` or `{'refused'}`.
pub const RELEASE: &str = concat!(
    prelude!(),
    one_record_head!(),
    r#"if r[1] == 'delivered' and ARGV[3] ~= '1' then return {'refused'} end
local f = redis.call('HMGET', rec, 'attempts', 'first_seen_at', 'delivered_at', 'last_status', 'claimed_by')
if r[1] == 'delivered' and f[1] == '1' then
  put_attempt(att, '1', {started_at = f[2], ended_at = f[3] or nil, status = f[4] or nil,
    result = 'delivered', duration_ms = f[3] and num(tonumber(f[3]) - tonumber(f[2])) or nil,
    instance = f[5] or nil}, true)
end
local expires_at = num(tonumber(now) + tonumber(r[2]) - tonumber(r[3]))
redis.call('HSET', rec, 'state', 'failed', 'last_error', 'released by operator', 'updated_at', now,
  'expires_at', expires_at)
redis.call('HDEL', rec, 'lease_until')
"#,
    one_record_indexes!(),
    r#"return {'released', r[1]}
"#
);

/// One bucket's page of the operator list: walks the bucket's records
/// newest first from `max_score` and returns, with every field, those the
/// filter keeps, until `limit` of them are older than `max_score`, and the
/// ties of the last of those (records at `max_score` exactly are all
/// returned: the caller orders ties by route and event ID, byte for byte,
/// which Lua's comparison may not do, and drops what precedes its key).
/// KEYS: by_first_seen. ARGV: record key prefix, max_score (or `+inf`),
/// state?, id_prefix?, lease_ended_by?, limit.
/// Returns a flat list: event_id, then its `HGETALL`, for each record.
pub const LIST_BUCKET: &str = r#"
local function opt(s) if s == '' then return false end return string.sub(s, 2) end
local prefix, max = ARGV[1], ARGV[2]
local state, idp, ended = opt(ARGV[3]), opt(ARGV[4]), opt(ARGV[5])
local limit = tonumber(ARGV[6])
if limit < 1 then return {} end
local out, counted, offset, last, done = {}, 0, 0, false, false
while not done do
  local page = redis.call('ZREVRANGEBYSCORE', KEYS[1], max, '-inf', 'WITHSCORES', 'LIMIT', offset, 200)
  if #page == 0 then break end
  offset = offset + #page / 2
  for i = 1, #page, 2 do
    local id, score = page[i], tonumber(page[i + 1])
    -- past `limit`, only the ties of the last one counted (ordered by the caller)
    if counted >= limit and last and score < last then done = true break end
    local keep = not idp or string.sub(id, 1, #idp) == idp
    local fields = false
    if keep then
      fields = redis.call('HGETALL', prefix .. id)
      keep = #fields > 0
    end
    if keep and (state or ended) then
      local h = {}
      for j = 1, #fields, 2 do h[fields[j]] = fields[j + 1] end
      if state and h.state ~= state then keep = false end
      if ended and not (h.state == 'processing' and (not h.lease_until or tonumber(h.lease_until) <= tonumber(ended))) then keep = false end
    end
    if keep then
      out[#out + 1] = id
      out[#out + 1] = fields
      if max == '+inf' or score < tonumber(max) then counted = counted + 1 last = score end
    end
  end
end
return out
"#;

/// Deletes the given records of one bucket that are expired by `now` and
/// hold no live lease (`sql::SWEEP`'s condition, checked again here), with
/// their attempts and index entries; an entry whose record the server
/// expired already is dropped too (not counted).
/// KEYS: by_first_seen, by_expiry, processing, ambiguous, then record,
/// attempts and questions of each event. ARGV: now, then the event IDs.
/// Returns how many records it deleted.
pub const SWEEP_BUCKET: &str = r#"
local now = tonumber(ARGV[1])
local deleted = 0
for i = 2, #ARGV do
  local id, rec, att, q = ARGV[i], KEYS[3 * i - 1], KEYS[3 * i], KEYS[3 * i + 1]
  local r = redis.call('HMGET', rec, 'state', 'lease_until', 'expires_at')
  local gone = not r[1]
  if not gone and tonumber(r[3]) <= now and not (r[1] == 'processing' and r[2] and tonumber(r[2]) > now) then
    redis.call('DEL', rec, att, q)
    deleted = deleted + 1
    gone = true
  end
  if gone then
    redis.call('ZREM', KEYS[1], id)
    redis.call('ZREM', KEYS[2], id)
    redis.call('ZREM', KEYS[3], id)
    redis.call('SREM', KEYS[4], id)
  end
end
return deleted
"#;

/// An operator's resolve of an `ambiguous` record (`sql_operator`'s
/// `RESOLVE_DELIVERED` / `RESOLVE_FAILED`), a compare-and-set on its state,
/// keeping its retention span from now.
/// KEYS: record, attempts, by_expiry, processing, ambiguous.
/// ARGV: event_id, now, how (delivered|failed), status (for delivered).
/// Returns `{'resolved'}`, `{'not_found'}` or `{'not_ambiguous', state}`.
pub const RESOLVE: &str = concat!(
    prelude!(),
    one_record_head!(),
    r#"if r[1] ~= 'ambiguous' then return {'not_ambiguous', r[1]} end
local expires_at = num(tonumber(now) + tonumber(r[2]) - tonumber(r[3]))
if ARGV[3] == 'delivered' then
  redis.call('HSET', rec, 'state', 'delivered', 'last_status', ARGV[4], 'delivered_at', now,
    'updated_at', now, 'expires_at', expires_at)
  redis.call('HDEL', rec, 'last_error', 'lease_until')
else
  redis.call('HSET', rec, 'state', 'failed', 'last_error', 'resolved by an operator as not done',
    'updated_at', now, 'expires_at', expires_at)
  redis.call('HDEL', rec, 'lease_until')
end
"#,
    one_record_indexes!(),
    r#"return {'resolved'}
"#
);

/// The proxy's release of a claim whose commit was not acknowledged
/// (`sql_operator`'s `RELEASE_UNACKNOWLEDGED`): fenced by the claim token,
/// so a later claim of the record is never released by it.
/// KEYS: record, processing. ARGV: event_id, token, now.
/// Returns 1 when it released the record, else 0.
pub const RELEASE_UNACKNOWLEDGED: &str = r#"
local r = redis.call('HMGET', KEYS[1], 'state', 'claim_token')
if r[1] ~= 'processing' or r[2] ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 'state', 'failed', 'updated_at', ARGV[3],
  'last_error', 'the claim was not acknowledged by the store; released before any forward')
redis.call('HDEL', KEYS[1], 'lease_until')
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
"#;

/// Whether a bulk release takes a record (`sql_operator`'s
/// `bulk_condition!`): its state, a `processing` lease ended, in the
/// window, and changed before the release began (so a batch never takes
/// what an earlier one released). `h` is `HMGET state updated_at
/// lease_until`; `after` and `before` are `false` when not given.
macro_rules! bulk_selects {
    () => {
        r#"
local function selects(h, state, now, after, before)
  if h[1] ~= state then return false end
  local upd = tonumber(h[2])
  if state == 'processing' and h[3] and tonumber(h[3]) > now then return false end
  if after and upd < tonumber(after) then return false end
  if before and upd >= tonumber(before) then return false end
  return upd < now
end
"#
    };
}

/// Ends a record's lease for good, for the scripts that do it to many
/// records of one bucket (bulk release, held leases' end). KEYS[1..3]:
/// by_expiry, processing, ambiguous.
macro_rules! end_lease {
    () => {
        r#"
-- the record `id` (`rec`, `att`) leaves its lease as of `now`: `state`
-- with `err`, its retention span (`updated_at` to `expires_at` before)
-- kept from now; its keys' expiry and the bucket's indexes follow
local function end_lease(rec, att, id, now, state, err, expires_at, updated_at)
  local until_ = num(tonumber(now) + tonumber(expires_at) - tonumber(updated_at))
  redis.call('HSET', rec, 'state', state, 'last_error', err, 'updated_at', now,
    'expires_at', until_)
  redis.call('HDEL', rec, 'lease_until')
  expire(rec, att, until_, now)
  redis.call('ZADD', KEYS[1], until_, id)
  redis.call('ZREM', KEYS[2], id)
  if state == 'ambiguous' then
    redis.call('SADD', KEYS[3], id)
  else
    redis.call('SREM', KEYS[3], id)
  end
end
"#
    };
}

/// One bucket's share of a bulk release, read only: how many records it
/// selects (`limit` 0), or up to `limit` of their IDs.
/// KEYS: by_first_seen. ARGV: record key prefix, state, now, after?,
/// before?, limit. Returns `{count, id...}` (no IDs when counting).
pub const BULK_SELECT: &str = concat!(
    prelude!(),
    bulk_selects!(),
    r#"
local prefix, state, now = ARGV[1], ARGV[2], tonumber(ARGV[3])
local after, before, limit = opt(ARGV[4]), opt(ARGV[5]), tonumber(ARGV[6])
local out, n, offset = {0}, 0, 0
while true do
  local page = redis.call('ZRANGE', KEYS[1], offset, offset + 199)
  if #page == 0 then break end
  offset = offset + #page
  for _, id in ipairs(page) do
    local h = redis.call('HMGET', prefix .. id, 'state', 'updated_at', 'lease_until')
    if h[1] and selects(h, state, now, after, before) then
      n = n + 1
      if limit > 0 then out[#out + 1] = id end
      if limit > 0 and n >= limit then out[1] = n return out end
    end
  end
end
out[1] = n
return out
"#
);

/// Releases the given records of one bucket to `failed` (`sql_operator`'s
/// bulk `UPDATE`), each checked again: a record that changed meanwhile is
/// left. KEYS: by_expiry, processing, ambiguous, then record and attempts
/// of each event. ARGV: state, now, after?, before?, then the event IDs.
/// Returns how many it released.
pub const BULK_RELEASE: &str = concat!(
    prelude!(),
    bulk_selects!(),
    end_lease!(),
    r#"
local state, now = ARGV[1], ARGV[2]
local after, before = opt(ARGV[3]), opt(ARGV[4])
local released = 0
for i = 5, #ARGV do
  local id, rec, att = ARGV[i], KEYS[2 * i - 6], KEYS[2 * i - 5]
  local h = redis.call('HMGET', rec, 'state', 'updated_at', 'lease_until', 'expires_at')
  if h[1] and selects(h, state, tonumber(now), after, before) then
    end_lease(rec, att, id, now, 'failed', 'released by operator', h[4], h[2])
    released = released + 1
  end
end
return released
"#
);

/// One bucket's `processing` records claimed under `hold` whose lease
/// ended by `now`, oldest change first, at most `limit`; read only.
/// KEYS: processing. ARGV: record key prefix, now, limit.
/// Returns a flat list: event ID, `updated_at`, for each.
pub const HOLD_SELECT: &str = r#"
local prefix, now, limit = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local out, offset = {}, 0
while #out < 2 * limit do
  local page = redis.call('ZRANGE', KEYS[1], offset, offset + 199, 'WITHSCORES')
  if #page == 0 then break end
  offset = offset + #page / 2
  for i = 1, #page, 2 do
    local h = redis.call('HMGET', prefix .. page[i], 'state', 'hold', 'lease_until')
    if h[1] == 'processing' and h[2] == '1' and (not h[3] or tonumber(h[3]) <= now) then
      out[#out + 1] = page[i]
      out[#out + 1] = page[i + 1]
      if #out >= 2 * limit then break end
    end
  end
end
return out
"#;

/// Turns the given held records of one bucket whose lease ended
/// `ambiguous`, each checked again, its lost attempt recorded in the same
/// step (`sql_operator`'s `HELD_LOST_ATTEMPTS` + `HOLD_ENDED`, the claim's
/// `held` branch). KEYS: by_expiry, processing, ambiguous, then record and
/// attempts of each event. ARGV: now, then the event IDs.
/// Returns how many turned.
pub const HOLD_ENDED: &str = concat!(
    prelude!(),
    end_lease!(),
    r#"
local now = ARGV[1]
local turned = 0
for i = 2, #ARGV do
  local id, rec, att = ARGV[i], KEYS[2 * i], KEYS[2 * i + 1]
  local r = redis.call('HMGET', rec, 'state', 'hold', 'lease_until', 'attempts', 'updated_at',
    'claimed_by', 'expires_at')
  if r[1] == 'processing' and r[2] == '1' and (not r[3] or tonumber(r[3]) <= tonumber(now)) then
    put_attempt(att, r[4], {started_at = r[5], ended_at = r[3] or nil, error = LOST,
      instance = r[6] or nil, result = 'ambiguous'}, true)
    end_lease(rec, att, id, now, 'ambiguous', LOST, r[7], r[5])
    turned = turned + 1
  end
end
return turned
"#
);

/// A question's answer recorded and acted on (`sql_operator`'s
/// `QUESTION_ROW`, `RECONCILED_DELIVERED` / `RECONCILED_FAILED` and
/// `QUESTIONS_TRIM`), fenced by the state and the attempt count.
/// KEYS: record, attempts, questions, by_expiry, processing, ambiguous.
/// ARGV: event_id, attempts, now, how (delivered|failed|unknown), status
/// (for delivered), the question's row (JSON).
/// Returns `{'resolved'}`, `{'not_found'}` or `{'not_ambiguous', state}`.
pub const RECONCILED: &str = concat!(
    prelude!(),
    r#"
local rec, att, q, id, now = KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[3]
local r = redis.call('HMGET', rec, 'state', 'attempts', 'expires_at', 'updated_at')
if not r[1] then return {'not_found'} end
if r[1] ~= 'ambiguous' or tonumber(r[2]) ~= tonumber(ARGV[2]) then
  return {'not_ambiguous', r[1]}
end
redis.call('RPUSH', q, ARGV[6])
redis.call('LTRIM', q, -20, -1)
local expires_at = r[3]
if ARGV[4] ~= 'unknown' then
  expires_at = num(tonumber(now) + tonumber(r[3]) - tonumber(r[4]))
  if ARGV[4] == 'delivered' then
    redis.call('HSET', rec, 'state', 'delivered', 'last_status', ARGV[5], 'delivered_at', now,
      'updated_at', now, 'expires_at', expires_at)
    redis.call('HDEL', rec, 'last_error', 'lease_until')
  else
    redis.call('HSET', rec, 'state', 'failed',
      'last_error', 'the consumer said it never acted on it (reconciled)',
      'updated_at', now, 'expires_at', expires_at)
    redis.call('HDEL', rec, 'lease_until')
  end
  redis.call('ZADD', KEYS[4], expires_at, id)
  redis.call('ZREM', KEYS[5], id)
  redis.call('SREM', KEYS[6], id)
end
expire(rec, att, expires_at, now)
redis.call('PEXPIRE', q, ttl(expires_at, now))
return {'resolved'}
"#
);

/// A bucket's ambiguous records whose mark passed (`sql_operator`'s
/// `QUESTIONS_DUE`), a read. KEYS: the bucket's ambiguous set. ARGV: the
/// record key prefix, now. The records share the set's slot (one bucket).
pub const DUE_QUESTIONS: &str = r#"
local out = {}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local after = redis.call('HGET', ARGV[1] .. id, 'reconcile_after')
  if not after or tonumber(after) <= tonumber(ARGV[2]) then out[#out + 1] = id end
end
return out
"#;

/// The background's mark of one record (`sql_operator`'s `TAKE_QUESTION`),
/// a compare-and-set. KEYS: record. ARGV: now, next_at.
/// Returns 1 when it took the record, else 0.
pub const TAKE_QUESTION: &str = r#"
local r = redis.call('HMGET', KEYS[1], 'state', 'reconcile_after')
if r[1] ~= 'ambiguous' then return 0 end
if r[2] and tonumber(r[2]) > tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'reconcile_after', ARGV[2])
return 1
"#;
