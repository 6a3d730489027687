"""A webhook consumer on Python's standard http.server, written as many are.

It speaks HTTP/1.1 (`protocol_version`): an HTTP/1.1 request keeps the
connection alive; an HTTP/1.0 request gets an HTTP/1.1 answer without
`Connection: close` and the connection is then closed -- what Go's net/http
server does too (it never says `Connection: close` to an HTTP/1.0 client).
An HTTP/1.1 `Expect: 100-continue` is answered with `100 Continue`
(http.server's own handle_expect_100).

Usage: http_server.py LOG [CLOSE_DELAY_SECONDS]. Prints its port on the first
line of stdout, then serves on 127.0.0.1 until killed. Each request is
appended to LOG as one JSON line: version, method, path, headers. A close
delay holds the close of a finished HTTP/1.0 connection back: the window in
which a proxy may already have taken the connection for its next request
(under load it is there anyway; the delay makes a test deterministic).
"""

import http.server
import json
import socketserver
import sys
import time

LOG = sys.argv[1]
CLOSE_DELAY = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def answer(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        with open(LOG, "a") as f:
            f.write(json.dumps({
                "version": self.request_version,
                "method": self.command,
                "path": self.path,
                "headers": [[k, v] for k, v in self.headers.items()],
                "body_len": len(body),
            }) + "\n")
        out = b"ok"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)
        self.wfile.flush()

    do_GET = do_POST = do_PUT = do_DELETE = answer

    def finish(self):
        if self.close_connection and CLOSE_DELAY:
            time.sleep(CLOSE_DELAY)
        super().finish()

    def log_message(self, *args):
        pass


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


server = Server(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
