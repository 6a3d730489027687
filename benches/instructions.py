#!/usr/bin/env python3
"""Instructions per request on the hot paths, counted by callgrind: a
measure that a busy or noisy machine does not move (the same binary and
inputs give the same count), for A/B comparisons of two builds when the
load harness's wall-clock ratios sit inside their spread.

    python3 benches/instructions.py BIN [BIN ...]

For each binary and path: a loopback consumer (Python, keep-alive, answers
200), the binary under `valgrind --tool=callgrind` with an SQLite store in a
temp dir, one kept client connection, 100 warm-up requests, then none or N
(INSTR_REQUESTS, 2000) more; the difference of the two lives' instructions
over N is the path's cost per request, start-up and stop cancelled out:
(a) unguarded pass-through, (b) a unique event per request (claim, forward,
settle), (c) replays of one delivered event. All threads of the proxy count
(the SQLite writer's too; fsync's wait is not an instruction); the timers'
work (about a second of the sweeper's per run) is noise of a few thousand
instructions in millions. Loopback only; bounded in time; stops what it
starts.
"""

import http.client
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

N = int(os.environ.get("INSTR_REQUESTS", "2000"))
WARMUP = 100
BODY = b'{"id":"evt","type":"invoice.paid","data":{"object":{"amount":4200,"currency":"eur"}},' \
       b'"livemode":false,"created":1733500000,"pad":"' + b"x" * 96 + b'"}'


class Consumer(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port, deadline):
    while time.time() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/readyz")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit("idemgate did not become ready")


def config(dirname, listen, admin, upstream):
    return f"""listen: "127.0.0.1:{listen}"
admin_listen: "127.0.0.1:{admin}"
store:
  url: "sqlite://{dirname}/instr.db"
routes:
  - name: guarded
    match: {{path_prefix: /hooks}}
    upstream: "http://127.0.0.1:{upstream}"
    event_id: {{header: X-Event-ID}}
    verify: none
  - name: pass
    match: {{path_prefix: /pass}}
    upstream: "http://127.0.0.1:{upstream}"
    guard_methods: []
"""


def send(conn, path, event_id):
    headers = {"Content-Type": "application/json", "Host": "hooks.test"}
    if event_id is not None:
        headers["X-Event-ID"] = event_id
    conn.request("POST", path, body=BODY, headers=headers)
    r = conn.getresponse()
    r.read()
    if r.status != 200:
        raise SystemExit(f"{path} {event_id}: status {r.status}")


def run_once(binary, upstream, path_and_id, n):
    """Instructions of one process's whole life with `n` requests of one
    path after 100 warm-up ones."""
    d = tempfile.mkdtemp(prefix="instr-")
    listen, admin = free_port(), free_port()
    cfg = os.path.join(d, "c.yaml")
    with open(cfg, "w") as f:
        f.write(config(d, listen, admin, upstream))
    out = os.path.join(d, "callgrind.out")
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
         binary, "serve", "--config", cfg],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=d)
    try:
        wait_ready(admin, time.time() + 120)
        conn = http.client.HTTPConnection("127.0.0.1", listen, timeout=60)
        path, event_id = path_and_id
        for i in range(WARMUP + n):
            send(conn, path, event_id(i))
        conn.close()
        proc.terminate()
        proc.wait(timeout=120)
        with open(out) as f:
            for line in f:
                if line.startswith("summary:") or line.startswith("totals:"):
                    return int(line.split()[1])
        raise SystemExit(f"no summary in {out}")
    finally:
        if proc.poll() is None:
            proc.kill()
        shutil.rmtree(d, ignore_errors=True)


PATHS = {
    "(a) unguarded": ("/pass", lambda i: None),
    "(b) unique": ("/hooks", lambda i: f"u-{i}"),
    "(c) replay": ("/hooks", lambda i: "same"),
}


def measure(binary, upstream):
    """Per request: the difference of two lives, one with N requests more
    than the other, over N (start-up and stop cancel out)."""
    per = {}
    for name, path_and_id in PATHS.items():
        short = run_once(binary, upstream, path_and_id, 0)
        long = run_once(binary, upstream, path_and_id, N)
        per[name] = (long - short) / N
    return per


def main():
    if len(sys.argv) < 2 or not shutil.which("valgrind"):
        raise SystemExit(__doc__)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Consumer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    upstream = server.server_address[1]
    rows = [(b, measure(b, upstream)) for b in sys.argv[1:]]
    server.shutdown()
    names = list(rows[0][1])
    print("binary".ljust(40) + "".join(n.rjust(16) for n in names))
    for b, r in rows:
        print(b[-40:].ljust(40) + "".join(f"{r[n]:16,.0f}" for n in names))
    if len(rows) > 1:
        base = rows[0][1]
        for b, r in rows[1:]:
            print(f"{b[-40:]} / {rows[0][0][-30:]}: " +
                  ", ".join(f"{n} {r[n] / base[n]:.3f}" for n in names))


if __name__ == "__main__":
    main()
