// idemgate operator console. Plain JavaScript, no build step, no library.
//
// Safety rules this file keeps (the page's Content-Security-Policy enforces
// the first two: no inline script, and Trusted Types, so an HTML sink such as
// innerHTML throws):
// - every value is put in the page as text (textContent / text nodes), never
//   parsed as HTML: event IDs come from webhook senders;
// - nothing is loaded from anywhere but this admin listener;
// - the admin token lives in this tab's memory, or in sessionStorage if the
//   operator asks, and travels only as an Authorization header (never a cookie).
'use strict';

(() => {
  const REFRESH_MS = 3000;
  const TOKEN_KEY = 'idemgate.admin-token';
  const $ = (id) => document.getElementById(id);

  // ---- tiny DOM builder: text only --------------------------------------
  function el(tag, props, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (v === undefined || v === null) continue;
      if (k === 'class') e.className = v;
      else if (k === 'text') e.textContent = String(v);
      else if (k === 'data') Object.assign(e.dataset, v);
      else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, String(v));
    }
    for (const kid of kids) {
      if (kid === undefined || kid === null) continue;
      e.append(kid instanceof Node ? kid : String(kid));
    }
    return e;
  }

  const dash = (v) => (v === null || v === undefined || v === '' ? '—' : String(v));

  // ---- the API -------------------------------------------------------------
  class ApiError extends Error {
    constructor(status, problem) {
      super((problem && (problem.detail || problem.title)) || ('HTTP ' + status));
      this.status = status;
      this.problem = problem;
    }
  }

  async function api(path, opts) {
    const r = await fetch(path, Object.assign({ cache: 'no-store', credentials: 'omit', redirect: 'error' }, opts || {}));
    let body = null;
    try { body = await r.json(); } catch (_) { body = null; }
    if (!r.ok) throw new ApiError(r.status, body);
    return body;
  }

  const seg = (s) => encodeURIComponent(s);
  const eventPath = (route, id) => '/api/events/' + seg(route) + '/' + seg(id);
  const eventHash = (route, id) => '#/event/' + seg(route) + '/' + seg(id);
  // "." and ".." are dot segments: every URL parser removes them from a path
  // (encoded or not), so such an ID can only be read through the list.
  const isDotSegment = (id) => id === '.' || id === '..';

  function showError(e) {
    const box = $('error');
    if (!e) { box.hidden = true; box.textContent = ''; return; }
    box.textContent = e instanceof ApiError ? e.message : ('The admin API cannot be reached: ' + e.message);
    box.hidden = false;
  }

  // ---- the token -----------------------------------------------------------
  let token = sessionStorage.getItem(TOKEN_KEY);

  function showToken() {
    $('token-state').textContent = token
      ? (sessionStorage.getItem(TOKEN_KEY) ? 'admin token kept for this tab' : 'admin token held in memory')
      : 'no admin token held';
    $('token-forget').hidden = !token;
  }

  function forgetToken() {
    token = null;
    sessionStorage.removeItem(TOKEN_KEY);
    showToken();
  }

  // ---- time ----------------------------------------------------------------
  function relative(iso) {
    const ms = Date.parse(iso) - Date.now();
    const abs = Math.abs(ms);
    const units = [['d', 86400000], ['h', 3600000], ['min', 60000], ['s', 1000]];
    let text = 'now';
    for (const [u, n] of units) {
      if (abs >= n) { text = Math.floor(abs / n) + ' ' + u; break; }
    }
    if (text === 'now') return 'now';
    return ms < 0 ? text + ' ago' : 'in ' + text;
  }

  function span(ms) {
    if (ms < 0) return '-' + span(-ms);
    if (ms < 1000) return ms + ' ms';
    return relative(new Date(Date.now() + ms).toISOString()).replace(/^in /, '');
  }

  function seconds(s) {
    if (!s) return '0 s';
    if (s < 120) return s.toFixed(s < 10 ? 1 : 0) + ' s';
    if (s < 7200) return (s / 60).toFixed(0) + ' min';
    return (s / 3600).toFixed(1) + ' h';
  }

  function millis(s) {
    if (s === null || s === undefined || !isFinite(s)) return '—';
    const ms = s * 1000;
    return (ms < 10 ? ms.toFixed(2) : ms.toFixed(0)) + ' ms';
  }

  // ---- overview --------------------------------------------------------------
  let previous = null; // the last /api/routes answer and when it came

  function counterList(kind, route, now, before, dt) {
    const names = Object.keys(now).sort();
    if (!names.length) return el('span', { class: 'muted', text: 'none yet' });
    const ul = el('ul', { class: 'counters' });
    for (const name of names) {
      const n = now[name];
      const was = before && before[name] !== undefined ? before[name] : null;
      const rate = was !== null && dt > 0 && n > was ? ((n - was) / dt).toFixed(1) + '/s' : null;
      ul.append(el('li', null,
        el('span', { class: 'label', text: name }),
        el('span', { class: 'n', text: n, data: { counter: kind, route: route, label: name } }),
        rate ? el('span', { class: 'rate', text: rate }) : null));
    }
    return ul;
  }

  function eventSource(src) {
    if (!src) return 'none (pass-through)';
    if (src.header) return 'header ' + src.header + (src.or_header ? ' or ' + src.or_header : '');
    return 'JSON ' + src.json_pointer;
  }

  function renderRoutes(doc, at) {
    const before = previous && previous.doc;
    const dt = previous ? (at - previous.at) / 1000 : 0;
    const byName = {};
    for (const r of (before ? before.routes : [])) byName[r.name] = r;
    const rows = doc.routes.map((r) => {
      const old = byName[r.name] && byName[r.name].counters;
      const age = r.counters.processing_oldest_age_seconds;
      return el('tr', { data: { route: r.name } },
        el('td', null, el('strong', { text: r.name }),
          r.provider ? el('div', { class: 'muted', text: 'provider ' + r.provider }) : null,
          el('div', { class: 'muted', text: 'lease ' + r.lease + ', retention ' + r.retention }),
          el('div', { class: 'muted', text: 'on ambiguous: ' + r.on_ambiguous }),
          r.ambiguous_records > 0
            ? el('div', { class: 'hot', data: { counter: 'ambiguous', route: r.name }, text: r.ambiguous_records + ' outcome unknown' })
            : null),
        forwardingCell(r),
        el('td', { class: 'mono', text: (r.match.host || '') + r.match.path_prefix }),
        el('td', { class: 'mono', text: r.upstream }),
        limitsCell(r),
        el('td', { text: eventSource(r.event_id) }),
        el('td', null, counterList('requests', r.name, r.counters.requests, old && old.requests, dt)),
        el('td', null, counterList('upstream', r.name, r.counters.upstream_responses, old && old.upstream_responses, dt)),
        el('td', { class: age > 0 ? 'hot' : null, data: { counter: 'oldest', route: r.name }, text: seconds(age) }));
    });
    $('routes').tBodies[0].replaceChildren(...rows);

    const unrouted = Object.entries(doc.unrouted.requests).filter(([, n]) => n > 0);
    $('unrouted').textContent = unrouted.length
      ? 'Requests no route took: ' + unrouted.map(([k, n]) => k + ' ' + n).join(', ')
      : '';

    const oldStore = before ? before.store.duration_seconds : {};
    const ops = Object.keys(doc.store.duration_seconds).sort();
    $('store').tBodies[0].replaceChildren(...ops.map((op) => {
      const h = doc.store.duration_seconds[op];
      const o = oldStore[op];
      const dn = o ? h.count - o.count : 0;
      const mean = dn > 0 ? (h.sum - o.sum) / dn : null;
      return el('tr', { data: { operation: op } },
        el('td', { text: op }),
        el('td', { text: h.count, data: { counter: 'store-count', label: op } }),
        el('td', { text: millis(mean) }),
        el('td', { text: dn > 0 ? quantile(h.buckets, o.buckets, dn, 0.99) : '—' }),
        el('td', { text: h.count ? millis(h.sum / h.count) : '—' }));
    }));
    previous = { doc: doc, at: at };
  }

  // What protects the consumer (SPEC §15): the limits, the requests in
  // flight to it in this idemgate, and its breaker.
  function limitsCell(r) {
    const l = r.limits || {};
    const st = r.upstream_state || {};
    const set = [];
    if (l.concurrency) set.push('at most ' + l.concurrency + ' at once');
    if (l.rate) set.push(l.rate);
    if (l.wait) set.push('waits up to ' + l.wait);
    if (l.breaker) set.push('breaker ' + l.breaker.failures + ' failures → ' + l.breaker.open);
    const breaker = st.breaker || 'closed';
    return el('td', { class: 'limits', data: { route: r.name, breaker: breaker } },
      el('div', { data: { limit: 'limits', route: r.name }, text: set.length ? set.join(', ') : 'no limits' }),
      st.in_flight !== null && st.in_flight !== undefined
        ? el('div', { data: { limit: 'in-flight', route: r.name }, text: st.in_flight + ' in flight' })
        : null,
      st.waiting !== null && st.waiting !== undefined
        ? el('div', { data: { limit: 'waiting', route: r.name }, text: st.waiting + ' waiting' })
        : null,
      el('div', { class: breaker === 'closed' ? 'muted' : 'hot', data: { limit: 'breaker', route: r.name },
        text: 'breaker ' + breaker + (st.breaker_open_seconds ? ' (' + st.breaker_open_seconds + ' s left)' : '') }));
  }

  // Paused or not, since when, and the control that changes it.
  function forwardingCell(r) {
    if (r.paused === null || r.paused === undefined) {
      return el('td', { class: 'forwarding muted', data: { paused: 'unknown' }, text: 'unknown: the store does not answer' });
    }
    const button = el('button', {
      type: 'button', class: 'pause-toggle' + (r.paused ? '' : ' danger'), data: { route: r.name },
      text: r.paused ? 'Resume' : 'Pause', onclick: () => askPause(r.name, !r.paused, r.paused_at),
    });
    return el('td', { class: 'forwarding', data: { paused: String(r.paused) } },
      r.paused ? el('span', { class: 'paused', text: 'paused' }) : el('span', { text: 'forwarding' }),
      r.paused ? el('div', { class: 'muted', text: 'since ' + r.paused_at + ' (' + relative(r.paused_at) + ')' }) : null,
      el('div', null, button));
  }

  // The bucket whose upper bound holds the q-quantile of the observations
  // made between two scrapes.
  function quantile(now, before, total, q) {
    const want = total * q;
    for (let i = 0; i < now.length; i++) {
      const n = now[i][1] - (before[i] ? before[i][1] : 0);
      if (n >= want) return '≤ ' + millis(now[i][0]);
    }
    return '> ' + millis(now[now.length - 1][0]);
  }

  function eventLink(r) {
    return el('a', { class: 'event-link', href: eventHash(r.route, r.event_id), text: r.event_id });
  }

  function stateBadge(s) {
    return el('span', { class: 'state state-' + s, text: s });
  }

  function fillEvents(tbody, records, columns, emptyText) {
    if (!records.length) {
      tbody.replaceChildren(el('tr', null, el('td', { class: 'empty', colspan: columns.length, text: emptyText })));
      return;
    }
    tbody.replaceChildren(...records.map((r) => el('tr', { data: { route: r.route } },
      ...columns.map((c) => c(r)))));
  }

  const col = {
    route: (r) => el('td', { text: r.route }),
    id: (r) => el('td', { class: 'id' }, eventLink(r)),
    state: (r) => el('td', null, stateBadge(r.state)),
    attempts: (r) => el('td', { text: r.attempts }),
    status: (r) => el('td', { text: dash(r.last_status) }),
    error: (r) => el('td', { text: dash(r.last_error) }),
    lease: (r) => el('td', { class: 'mono', text: dash(r.lease_until) }),
    first: (r) => el('td', { class: 'mono', text: r.first_seen_at }),
    updated: (r) => el('td', { class: 'mono', text: r.updated_at }),
  };

  async function refreshOverview() {
    const at = Date.now();
    const [routes, ambiguous, stuck, failed] = await Promise.all([
      api('/api/routes'),
      api('/api/events?state=ambiguous&limit=20'),
      api('/api/events?stuck=true&limit=20'),
      api('/api/events?state=failed&limit=20'),
    ]);
    renderRoutes(routes, at);
    fillEvents($('ambiguous').tBodies[0], ambiguous.events,
      [col.route, col.id, col.attempts, col.error, col.updated], 'No event waits for a decision.');
    fillEvents($('stuck').tBodies[0], stuck.events,
      [col.route, col.id, col.attempts, col.lease, col.error], 'No claim is past its lease.');
    fillEvents($('failed').tBodies[0], failed.events,
      [col.route, col.id, col.attempts, col.status, col.error, col.updated], 'No failed event.');
    fillRouteChoice(routes.routes.map((r) => r.name));
    $('refreshed').textContent = 'refreshed ' + new Date(at).toLocaleTimeString();
  }

  function fillRouteChoice(names) {
    const select = $('search-route');
    const have = Array.from(select.options).map((o) => o.value);
    for (const n of names) if (!have.includes(n)) select.append(el('option', { value: n, text: n }));
  }

  // ---- search ----------------------------------------------------------------
  let nextCursor = null;
  let lastQuery = null;

  function searchParams() {
    const p = new URLSearchParams();
    const route = $('search-route').value;
    const state = $('search-state').value;
    const prefix = $('search-prefix').value;
    if (route) p.set('route', route);
    if (state) p.set('state', state);
    if (prefix) p.set('prefix', prefix);
    if ($('search-stuck').checked) p.set('stuck', 'true');
    return p;
  }

  function formFrom(p) {
    const route = p.get('route') || '';
    if (route) fillRouteChoice([route]);
    $('search-route').value = route;
    $('search-state').value = p.get('state') || '';
    $('search-prefix').value = p.get('prefix') || '';
    $('search-stuck').checked = p.get('stuck') === 'true';
  }

  const resultColumns = [col.route, col.id, col.state, col.attempts, col.status, col.first, col.updated];

  async function search(p, append) {
    const q = new URLSearchParams(p);
    q.set('limit', '50');
    if (append && nextCursor) q.set('before', nextCursor);
    const page = await api('/api/events?' + q.toString());
    const tbody = $('results').tBodies[0];
    if (append) {
      const holder = el('tbody');
      fillEvents(holder, page.events, resultColumns, '');
      tbody.append(...holder.children);
    } else {
      fillEvents(tbody, page.events, resultColumns, 'No record matches.');
    }
    nextCursor = page.next;
    lastQuery = p;
    $('more').hidden = !nextCursor;
    $('results-note').textContent = nextCursor ? 'Newest first; older records follow.' : '';
  }

  // ---- one event ---------------------------------------------------------------
  let shown = null; // the record on screen
  const FIELD_ORDER = ['route', 'event_id', 'body_sha256', 'state', 'attempts', 'lease_until', 'last_status',
    'last_error', 'first_seen_at', 'updated_at', 'delivered_at', 'expires_at',
    'replay_status', 'replay_content_type', 'replay_body_bytes', 'trace_id', 'span_id'];

  // a record's trace ID, linked to `telemetry.trace_url` when the API gave one
  // (only an http(s) link: the API builds it from the config and a hex ID)
  function traceCell(rec) {
    const url = rec.trace_url;
    if (!rec.trace_id || !url || !/^https?:\/\//.test(url)) return el('td', { text: dash(rec.trace_id) });
    return el('td', null, el('a', { class: 'trace-link', href: url, target: '_blank', rel: 'noopener noreferrer', text: rec.trace_id }));
  }

  async function loadEvent(route, id) {
    if (!isDotSegment(id)) return api(eventPath(route, id));
    const page = await api('/api/events?' + new URLSearchParams({ route: route, prefix: id, limit: '500' }));
    const rec = page.events.find((r) => r.event_id === id);
    if (!rec) throw new ApiError(404, { detail: 'route ' + route + ' has no record of this event ID' });
    return rec;
  }

  function renderEvent(rec) {
    shown = rec;
    $('detail-id').textContent = rec.event_id;
    $('detail-route').textContent = rec.route;
    // SPEC §3's order, then anything else the record has
    // (the attempts have a table of their own)
    const keys = FIELD_ORDER.filter((k) => k in rec)
      .concat(Object.keys(rec).filter((k) => !FIELD_ORDER.includes(k) && k !== 'history' && k !== 'trace_url'));
    $('fields').tBodies[0].replaceChildren(...keys.map((k) => [k, rec[k]]).map(([k, v]) =>
      el('tr', { data: { field: k } },
        el('th', { text: k }),
        k === 'state' ? el('td', null, stateBadge(v))
          : k === 'trace_id' ? traceCell(rec) : el('td', { text: dash(v) }))));

    const attempts = rec.history || [];
    renderAttempts(attempts);
    const moments = [
      ['first seen', rec.first_seen_at],
      ...attempts.map((a) => ['attempt ' + a.attempt, a.started_at, a.result]),
      ['last change', rec.updated_at],
      ['lease ends', rec.lease_until],
      ['delivered', rec.delivered_at],
      ['record expires', rec.expires_at],
    ].filter(([, t]) => t).map(([what, t, result]) => ({ what: what, t: t, ms: Date.parse(t), result: result }));
    moments.push({ what: 'now', t: new Date().toISOString(), ms: Date.now(), now: true });
    moments.sort((a, b) => a.ms - b.ms);
    const first = Date.parse(rec.first_seen_at);
    $('timeline').replaceChildren(...moments.map((m) => el('li',
      { class: m.now ? 'now' : (m.ms > Date.now() ? 'future' : null), data: { moment: m.what } },
      el('span', { class: 'what', text: m.what }),
      m.result ? el('span', { class: 'result-' + m.result, text: ' ' + m.result }) : null,
      m.now ? null : el('span', { class: 'muted', text: ' ' + relative(m.t) }),
      !m.now && m.what !== 'first seen' ? el('span', { class: 'muted', text: ' (' + span(m.ms - first) + ' after first seen)' }) : null,
      el('span', { class: 'when', text: m.t }))));

    $('release').hidden = !(rec.state === 'processing' || rec.state === 'failed');
    $('force-release').hidden = rec.state !== 'delivered';
    $('resolve-delivered').hidden = rec.state !== 'ambiguous';
    $('resolve-failed').hidden = rec.state !== 'ambiguous';
    $('ask-consumer').hidden = rec.state !== 'ambiguous';
  }

  function duration(ms) {
    if (ms === null || ms === undefined) return '—';
    return ms < 1000 ? ms + ' ms' : (ms / 1000).toFixed(ms < 10000 ? 2 : 1) + ' s';
  }

  function renderAttempts(attempts) {
    const tbody = $('attempts').tBodies[0];
    if (!attempts.length) {
      tbody.replaceChildren(el('tr', null, el('td', { class: 'empty', colspan: 7, text: 'No attempt recorded.' })));
      return;
    }
    tbody.replaceChildren(...attempts.map((a) => el('tr', { data: { attempt: a.attempt } },
      el('td', { text: a.attempt }),
      el('td', { class: 'mono', text: a.started_at }),
      el('td', { text: dash(a.status) }),
      el('td', null, el('span', { class: 'result-' + a.result, text: a.result })),
      el('td', { text: duration(a.duration_ms) }),
      el('td', { class: 'mono', text: dash(a.instance) }),
      el('td', { text: dash(a.error) }))));
  }

  async function showEvent(route, id) {
    $('action-result').textContent = '';
    $('action-result').className = '';
    $('detail-id').textContent = id;
    $('detail-route').textContent = route;
    $('fields').tBodies[0].replaceChildren();
    $('timeline').replaceChildren();
    $('attempts').tBodies[0].replaceChildren();
    for (const b of ['release', 'force-release', 'resolve-delivered', 'resolve-failed', 'ask-consumer']) $(b).hidden = true;
    renderEvent(await loadEvent(route, id));
  }

  // ---- actions, each after a confirmation that asks for the token ----------
  // pending: { run(token, status) → the success text, withStatus, result (the
  // element that shows it) } while the dialog is open
  let pending = null;

  function ask(opts) {
    pending = opts;
    $('confirm-title').textContent = opts.title;
    $('confirm-text').replaceChildren(...opts.text);
    $('confirm-status-row').hidden = !opts.withStatus;
    $('confirm-status').value = '200';
    $('confirm-token').value = '';
    $('confirm-token').placeholder = token ? 'using the token this tab holds' : 'admin.token';
    $('confirm-keep').checked = Boolean(sessionStorage.getItem(TOKEN_KEY));
    $('confirm-error').textContent = '';
    $('confirm-ok').textContent = opts.ok;
    $('confirm').showModal();
    $(opts.withStatus ? 'confirm-status' : (token ? 'confirm-ok' : 'confirm-token')).focus();
  }

  // "Event X on route R (state). " as text nodes
  function aboutEvent(rec, what) {
    return [el('span', { text: 'Event ' }), el('code', { text: rec.event_id }),
      el('span', { text: ' on route ' }), el('code', { text: rec.route }),
      el('span', { text: ' (' + rec.state + '). ' + what })];
  }

  function post(path, use, body) {
    const opts = { method: 'POST', headers: { Authorization: 'Bearer ' + use } };
    if (body !== undefined) {
      opts.headers['Content-Type'] = 'application/json';
      opts.body = JSON.stringify(body);
    }
    return api(path, opts);
  }

  // An action on the event on screen: the record after is shown.
  function eventAction(rec, path, body, done) {
    return async (use) => {
      if (isDotSegment(rec.event_id)) {
        throw new ApiError(0, { detail: 'This event ID cannot be written in a URL path; use `idemgate events` for it.' });
      }
      renderEvent(await post(eventPath(rec.route, rec.event_id) + path, use, body));
      return done;
    };
  }

  function askRelease(force) {
    if (!shown) return;
    const rec = shown;
    const what = force
      ? 'This event was delivered to the consumer. After a force release the next delivery of it is forwarded and reaches the consumer AGAIN.'
      : (rec.state === 'processing'
        ? 'The record becomes failed with its lease cleared, so the next delivery is forwarded. An attempt that is still running keeps running.'
        : 'The record stays failed with its lease cleared; the next delivery is forwarded.');
    ask({
      title: force ? 'Force release a delivered event?' : 'Release this event?',
      text: aboutEvent(rec, what),
      ok: force ? 'Force release' : 'Release',
      result: 'action-result',
      run: eventAction(rec, '/release' + (force ? '?force=true' : ''), undefined,
        (force ? 'Force released' : 'Released') + ': the next delivery of this event is forwarded.'),
    });
  }

  function askResolve(delivered) {
    if (!shown) return;
    const rec = shown;
    const what = delivered
      ? 'Resolve it as delivered only once you know the consumer acted on it (its records, its logs). Later deliveries of this event are answered with the status below and never reach the consumer.'
      : 'Resolve it as failed only once you know the consumer did NOT act on it. The next delivery of this event is forwarded to the consumer again (same Idempotency-Key).';
    ask({
      title: delivered ? 'Resolve as delivered?' : 'Resolve as failed?',
      text: aboutEvent(rec, what),
      ok: delivered ? 'Resolve as delivered' : 'Resolve as failed',
      withStatus: delivered,
      result: 'action-result',
      run: async (use, status) => {
        const body = delivered ? { as: 'delivered', status: status } : { as: 'failed' };
        const done = delivered
          ? 'Resolved as delivered: later deliveries are replayed with ' + status + '.'
          : 'Resolved as failed: the next delivery of this event is forwarded.';
        return eventAction(rec, '/resolve', body, done)(use);
      },
    });
  }

  // SPEC §21: the route's `reconcile` asks the consumer now; the record
  // after is shown, the question in its attempts.
  function askConsumer() {
    if (!shown) return;
    const rec = shown;
    ask({
      title: 'Ask the consumer?',
      text: aboutEvent(rec, 'idemgate asks the consumer what it did with this event, as the route\'s reconcile says. Found done, it is resolved as delivered; found not done, as failed (the next delivery is forwarded); any other answer leaves it as it is.'),
      ok: 'Ask the consumer',
      result: 'action-result',
      run: async (use) => {
        if (isDotSegment(rec.event_id)) {
          throw new ApiError(0, { detail: 'This event ID cannot be written in a URL path; use `idemgate events reconcile` for it.' });
        }
        const { asked = {}, ...record } = await post(eventPath(rec.route, rec.event_id) + '/reconcile', use);
        renderEvent(record);
        return 'Asked the consumer: ' + (asked.detail || asked.learned) + (asked.recorded === false ? ' (the record changed meanwhile: left as it is)' : '') + '.';
      },
    });
  }

  function askPause(route, pause, since) {
    const what = pause
      ? 'Every idemgate on this store stops forwarding this route within 2 s: new events, failed ones and expired leases get 503 route-paused (the senders retry later); duplicates of delivered events are still replayed. No record changes.'
      : 'Every idemgate on this store forwards this route again within 2 s; the senders\' next retries go through.';
    ask({
      title: pause ? 'Pause this route?' : 'Resume this route?',
      text: [el('span', { text: 'Route ' }), el('code', { text: route }),
        el('span', { text: (since ? ' (paused since ' + since + '). ' : '. ') + what })],
      ok: pause ? 'Pause' : 'Resume',
      result: 'overview-result',
      run: async (use) => {
        const doc = await post('/api/routes/' + seg(route) + '/' + (pause ? 'pause' : 'resume'), use);
        refreshOverview().catch(showError);
        return doc.paused
          ? 'Route ' + doc.name + ' paused since ' + doc.paused_at + ': nothing is forwarded.'
          : 'Route ' + doc.name + ' resumed: deliveries are forwarded.';
      },
    });
  }

  async function confirmPending() {
    if (!pending) return;
    const typed = $('confirm-token').value.trim();
    const use = typed || token;
    if (!use) { $('confirm-error').textContent = 'Enter the admin token (admin.token in the config).'; return; }
    let status = null;
    if (pending.withStatus) {
      status = Number($('confirm-status').value);
      if (!Number.isInteger(status) || status < 100 || status > 599) {
        $('confirm-error').textContent = 'The status is a whole number from 100 to 599.';
        return;
      }
    }
    const action = pending;
    try {
      const done = await action.run(use, status);
      token = use;
      if ($('confirm-keep').checked) sessionStorage.setItem(TOKEN_KEY, use);
      else sessionStorage.removeItem(TOKEN_KEY);
      showToken();
      pending = null;
      $('confirm').close();
      $(action.result).className = 'ok';
      $(action.result).textContent = done;
    } catch (e) {
      if (e.status === 401) {
        if (!typed) forgetToken();
        $('confirm-error').textContent = 'The token was refused: ' + e.message;
      } else if (e.status === 403) {
        $('confirm-error').textContent = 'Actions are disabled on this idemgate: ' + e.message;
      } else {
        $('confirm-error').textContent = e instanceof ApiError ? e.message : 'The admin API cannot be reached: ' + e.message;
      }
    }
  }

  // ---- views -------------------------------------------------------------------
  function view(name) {
    for (const v of ['overview', 'events', 'event']) $('view-' + v).hidden = v !== name;
    $('nav-overview').classList.toggle('current', name === 'overview');
    $('nav-events').classList.toggle('current', name !== 'overview');
  }

  async function route() {
    const h = location.hash || '#/';
    showError(null);
    try {
      if (h.startsWith('#/event/')) {
        const [r, id] = h.slice('#/event/'.length).split('/');
        view('event');
        await showEvent(decodeURIComponent(r || ''), decodeURIComponent(id || ''));
      } else if (h.startsWith('#/events')) {
        view('events');
        const q = h.indexOf('?');
        const p = new URLSearchParams(q >= 0 ? h.slice(q + 1) : '');
        formFrom(p);
        await search(p, false);
      } else {
        view('overview');
        $('overview-result').textContent = '';
        await refreshOverview();
      }
    } catch (e) {
      showError(e);
    }
  }

  async function tick() {
    if (document.hidden || $('view-overview').hidden) return;
    try {
      await refreshOverview();
      showError(null);
    } catch (e) {
      showError(e);
    }
  }

  function start() {
    $('interval').textContent = String(REFRESH_MS / 1000);
    showToken();
    $('token-forget').addEventListener('click', forgetToken);
    $('search').addEventListener('submit', (ev) => {
      ev.preventDefault();
      const target = '#/events?' + searchParams().toString();
      if (location.hash === target) route(); else location.hash = target;
    });
    $('more').addEventListener('click', () => search(lastQuery, true).catch(showError));
    $('release').addEventListener('click', () => askRelease(false));
    $('force-release').addEventListener('click', () => askRelease(true));
    $('resolve-delivered').addEventListener('click', () => askResolve(true));
    $('resolve-failed').addEventListener('click', () => askResolve(false));
    $('ask-consumer').addEventListener('click', askConsumer);
    $('detail-reload').addEventListener('click', () => route());
    $('confirm-ok').addEventListener('click', confirmPending);
    $('confirm-cancel').addEventListener('click', () => { pending = null; $('confirm').close(); });
    for (const input of ['confirm-token', 'confirm-status']) {
      $(input).addEventListener('keydown', (ev) => { if (ev.key === 'Enter') confirmPending(); });
    }
    window.addEventListener('hashchange', route);
    setInterval(tick, REFRESH_MS);
    route();
    // the search's route choice, whichever view the page opened on
    api('/api/routes').then((d) => fillRouteChoice(d.routes.map((r) => r.name))).catch(showError);
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start);
  else start();
})();
