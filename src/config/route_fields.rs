//! The one list of the route fields that `defaults` may also set: every
//! route key except a route's identity (name, match, upstream, provider and
//! verify). Each entry says, in one place, what the field means (its doc
//! becomes the model's), how the file writes it, what the model holds, its
//! built-in default and the function that parses it:
//!
//! ```text
//! /// doc
//! key: type in the file => type in the model = built-in default, parse with_fn;
//! ```
//!
//! `route_fields!(build)` hands the list to a macro `build` that makes
//! something of it: the raw structs (`raw.rs`), a level's parsed values and
//! their resolution (`layer.rs`), the model's `Route` (`model.rs`) and its
//! assembly (`route.rs`). So a new route key is one entry here, plus its
//! parser and any check that binds it to other fields (`route.rs`).
//!
//! Names in the entries are resolved where a builder expands them (types in
//! `raw.rs`, `layer.rs` and `model.rs`; defaults and parsers in `layer.rs`),
//! so this file imports nothing.

/// Calls `$build!` with every route field (see the module doc).
macro_rules! route_fields {
    ($build:ident) => {
        $build! {
            /// Remove `path_prefix` from the forwarded path.
            strip_prefix: bool => bool = false, parse plain;
            /// Where the event ID comes from (explicit, else the provider's
            /// preset, else `defaults`). A pass-through route (no
            /// `guard_methods`) that names no source keeps the built-in
            /// `idempotency-key` header placeholder, which is never read; a
            /// guarded one must name one.
            event_id: RawEventId => EventIdSource = idempotency_key_placeholder(), parse event_id_source;
            /// How the payload digest is computed.
            digest: DigestMode => DigestMode = DigestMode::Raw, parse plain;
            /// JSON pointers removed before hashing (`digest: json` only), parsed.
            digest_ignore: Vec<String> => Vec<JsonPointer> = Vec::new(), parse pointers;
            /// Methods that are guarded; others pass through. Empty: a pass-through route.
            guard_methods: Vec<String> => Vec<http::Method> = vec![http::Method::POST], parse methods;
            /// With `verify`: methods forwarded (unguarded) without a signature
            /// check; every other method is verified. Never a guarded method.
            unverified_methods: Vec<String> => Vec<http::Method> = Vec::new(), parse methods;
            /// What to do with a guarded request that has no event ID (explicit,
            /// else `forward` for the slack preset, else `defaults`).
            on_missing_id: OnMissingId => OnMissingId = OnMissingId::Reject, parse plain;
            /// What to do when the store cannot be reached.
            on_store_error: OnStoreError => OnStoreError = OnStoreError::Reject, parse plain;
            /// What a duplicate gets while the first delivery is in flight.
            in_flight: InFlight => InFlight = InFlight::Conflict, parse plain;
            /// What an outcome idemgate cannot know does to the claim (SPEC §12).
            on_ambiguous: OnAmbiguous => OnAmbiguous = OnAmbiguous::Release, parse plain;
            /// Most duplicates held at once on this route (all its events together)
            /// with `in_flight: wait`; past it a duplicate gets 409.
            max_waiters: u64 => usize = 64, parse max_waiters;
            /// Upstream statuses that settle a claim as delivered.
            settle_on: Vec<Text> => SettleOn = SettleOn::default(), parse statuses;
            /// Store the settled response body and replay it to duplicates.
            replay_body: bool => bool = false, parse plain;
            /// Largest response body stored for replay.
            replay_body_limit: Text => u64 = 64 * 1024, parse size;
            /// Header carrying the event ID to the upstream; `None` when
            /// disabled (`null` in the file).
            #[serde(default, deserialize_with = "explicit_null")]
            idempotency_key_header: Option<String> => Option<http::HeaderName> = Some(idempotency_key()), parse key_header;
            /// How long a claim is held while the upstream works, in the
            /// store's milliseconds.
            lease: Text => DurationMs = DurationMs::from_secs(60), parse duration_ms;
            /// How long a record is kept after its last transition, in the
            /// store's milliseconds.
            retention: Text => DurationMs = DurationMs::from_secs(7 * 86_400), parse duration_ms;
            /// Largest request body accepted.
            max_body: Text => u64 = 1024 * 1024, parse size;
            /// Deadline for the upstream's answer; always shorter than `lease`.
            upstream_timeout: Text => Duration = Duration::from_secs(30), parse duration;
            /// At most this many of the route's requests in flight to the
            /// upstream at once, in this process (SPEC §15); `None`: no bound.
            upstream_concurrency: u64 => Option<u32> = None, parse concurrency;
            /// `"N/s"` or `"N/m"`: requests sent to the upstream, in this
            /// process, as a token bucket of one second's worth (SPEC §15).
            upstream_rate: Text => Option<Rate> = None, parse rate;
            /// `{failures: F, open: D}`: after F consecutive failed attempts
            /// nothing is forwarded for D, then one delivery tries (SPEC §15).
            upstream_breaker: RawBreaker => Option<BreakerCfg> = None, parse breaker;
            /// The senders' source addresses (SPEC §22): a list of ranges, or
            /// `file:PATH` (one a line, `#` comments), read at load (so again
            /// on every reload); a client outside them gets 403 before its
            /// body is read. `None` (unset, or `null` on a route): any source.
            #[serde(default, deserialize_with = "explicit_null")]
            allow_from: Option<RawAllowFrom> => Option<Arc<Ranges>> = None, parse allow_from;
            /// Response headers kept with a delivered record and sent again
            /// with every replay (SPEC §22): at most 8, lowercased, never
            /// `Set-Cookie`, a hop-by-hop or a framing header.
            replay_headers: Vec<String> => Vec<http::HeaderName> = Vec::new(), parse replay_headers;
            /// How long a request past `upstream_concurrency` or
            /// `upstream_rate` may wait, in this process, for a slot or a
            /// token before its 503 (unset: refused at once, SPEC §15).
            upstream_wait: Text => Option<Duration> = None, parse wait;
            /// The SERVER span continues a valid `traceparent` from the
            /// sender instead of starting a trace (SPEC §19).
            trust_inbound_trace: bool => bool = false, parse plain;
        }
    };
}
pub(super) use route_fields;
