"""A small order service in Python's standard library: the backend that is
not ours, for tests/serve.rs.

Every POST counts one effect for its path (before any delay), then waits
X-Delay seconds if sent, then answers 201 with a JSON body naming the
count (and the Host it was sent), with the headers `X-Order: <count>`, `X-Backend: py` and a
`Set-Cookie` (with X-Echo-Body, the request body as received, in `body`; with X-Status: N, that status instead of 201; 2 MiB of `x` instead with X-Big; with X-Stall, the head and
11 of the 100 bytes it announces, then nothing for 30 s; with X-Break, the
same head and 11 bytes, then the connection closed). GET /effects answers
the counters (`lookups`: the GETs of `/.../by-key/KEY`, which answer what
the POST with that Idempotency-Key did, 404 when none did; X-No-Effect:
a POST that waits X-Delay and does nothing), GET /attempts the `Idempotency-Attempt` header of each
POST by path (`null` when absent), GET /form a plain HTML form with a repeat token (the browser test), GET
/slow-form the same posting to POST /slow-orders (one effect, then a 303
a second later to GET /order-page?n=N, an HTML page), GET /echo the request's headers (and two hop-by-hop headers
of its own), GET /upgrade (or any path ending so) 101 to the protocol of its `Upgrade` and then an
echo of every byte (426 without `Upgrade`), GET /switch 101 to h2c whatever was asked, GET /big 2 MiB, GET /break a broken answer, GET /health its health (200, or
the status set by GET /health/set/N). It prints
`listening on http://127.0.0.1:PORT` once it listens (argv[1]: the port,
0 for any), as the test kit's ShopProcess expects.
"""

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

EFFECTS = {}
ATTEMPTS = {}
# The answers of POSTs with an Idempotency-Key, by key: what
# GET /.../by-key/KEY (a reconciliation's lookup) finds.
KEYED = {}
LOCK = threading.Lock()
HEALTH = {"status": 200}
BIG = b"x" * (2 * 1024 * 1024)
FORM = b"""<!doctype html>
<html><head><title>order</title></head><body>
<form method="post" action="/orders">
  <input type="hidden" name="repeatToken" id="token" value="">
  <input name="sku" value="A1">
  <button id="buy" type="submit">Buy</button>
</form>
<script>
fetch('/.norepeat/token', {credentials: 'same-origin'})
  .then((r) => r.json())
  .then((j) => { document.getElementById('token').value = j.repeatToken; });
</script>
</body></html>
"""


# The same form, posting to a slow order service that answers 303 to the
# order's page (the browser test of `on_repeat: replay`).
SLOW_FORM = FORM.replace(b'action="/orders"', b'action="/slow-orders"')


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):
        pass

    def answer(self, status, body, extra=(), content_type="application/json"):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def read_body(self):
        """The request body, whole: by Content-Length, or chunk by chunk."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            body = b""
            while True:
                line = self.rfile.readline()
                if not line:
                    # The connection closed before the last chunk: a body
                    # cut off, not an empty one.
                    raise ConnectionError("body cut off")
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return body
                body += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def do_POST(self):
        try:
            received = self.read_body()
        except (ValueError, ConnectionError):
            # A body cut off half-way: nothing was asked of this service.
            self.close_connection = True
            return
        path = self.path.split("?")[0]
        if path == "/slow-orders":
            # A slow order service behind a form: one effect, a second
            # later a 303 to the order's page.
            with LOCK:
                EFFECTS[path] = EFFECTS.get(path, 0) + 1
                n = EFFECTS[path]
            time.sleep(1)
            self.answer(303, b"", [("Location", f"/order-page?n={n}")])
            return
        if self.headers.get("X-No-Effect"):
            # A request that had no effect before it stalled: its
            # lookup finds nothing.
            time.sleep(float(self.headers.get("X-Delay") or 0))
            self.answer(201, b"{}")
            return
        with LOCK:
            EFFECTS[path] = EFFECTS.get(path, 0) + 1
            n = EFFECTS[path]
            ATTEMPTS.setdefault(path, []).append(self.headers.get("Idempotency-Attempt"))
            key = self.headers.get("Idempotency-Key")
            if key:
                KEYED[key] = {"path": path, "effect": n, "found": True}
        delay = float(self.headers.get("X-Delay") or 0)
        if delay:
            time.sleep(delay)
        if self.headers.get("X-Break"):
            self.broken()
            return
        if self.headers.get("X-Stall"):
            # The head and a first piece of the body, then nothing: a
            # backend that stalls half-way through its answer.
            self.send_response(201)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "100")
            self.end_headers()
            self.wfile.write(b'{"stalled":')
            self.wfile.flush()
            time.sleep(30)
            return
        extra = [
            ("X-Order", str(n)),
            ("X-Backend", "py"),
            ("Set-Cookie", f"session=s{n}; HttpOnly"),
        ]
        if self.headers.get("X-Big"):
            self.answer(201, BIG, extra)
            return
        answer = {"path": path, "effect": n, "host": self.headers.get("Host"), "at": time.time()}
        if self.headers.get("X-Echo-Body"):
            answer["body"] = received.decode("latin-1")
        body = json.dumps(answer).encode()
        self.answer(int(self.headers.get("X-Status") or 201), body, extra)

    def broken(self):
        """The head and 11 of the 100 bytes it announces, then the
        connection closed: a backend that dies half-way through its answer."""
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "100")
        self.end_headers()
        self.wfile.write(b'{"broken":1')
        self.wfile.flush()
        self.close_connection = True

    def upgraded(self):
        """101 to the protocol asked in Upgrade, then every byte echoed
        until the client closes; 426 without Upgrade."""
        protocol = self.headers.get("Upgrade")
        if not protocol:
            self.answer(426, b'{"error":"upgrade required"}', [("Upgrade", "echo")])
            return
        self.send_response(101)
        self.send_header("Upgrade", protocol)
        self.send_header("Connection", "Upgrade")
        self.end_headers()
        self.wfile.flush()
        while True:
            data = self.rfile.read1(4096)
            if not data:
                break
            self.wfile.write(data)
            self.wfile.flush()
        self.close_connection = True

    def do_GET(self):
        if "/by-key/" in self.path:
            # A reconciliation's lookup: X-Lookup: N answers N (the
            # backend cannot tell), else 200 with what the key's POST
            # did, or 404.
            from urllib.parse import unquote
            key = unquote(self.path.split("/by-key/", 1)[1])
            with LOCK:
                EFFECTS["lookups"] = EFFECTS.get("lookups", 0) + 1
                found = KEYED.get(key)
            forced = self.headers.get("X-Lookup")
            if forced:
                self.answer(int(forced), b"{}")
            elif found is None:
                self.answer(404, b"{}")
            else:
                self.answer(200, json.dumps(found).encode(), [("Set-Cookie", "lookup=1")])
            return
        if self.path == "/slow-form":
            self.answer(200, SLOW_FORM, [("Set-Cookie", "sid=browser-2; Path=/; SameSite=Lax")],
                        content_type="text/html; charset=utf-8")
            return
        if self.path.startswith("/order-page"):
            n = self.path.split("n=", 1)[-1]
            page = f"<!doctype html><title>Order {n}</title><h1>Order {n}</h1>".encode()
            self.answer(200, page, content_type="text/html; charset=utf-8")
            return
        if self.path.startswith("/health/set/"):
            HEALTH["status"] = int(self.path.rsplit("/", 1)[1])
            self.answer(200, b"{}")
            return
        if self.path == "/health":
            self.answer(HEALTH["status"], b"{}")
            return
        if self.path == "/effects":
            with LOCK:
                body = json.dumps(EFFECTS).encode()
            self.answer(200, body)
        elif self.path == "/attempts":
            with LOCK:
                body = json.dumps(ATTEMPTS).encode()
            self.answer(200, body)
        elif self.path == "/form":
            # A plain HTML form (the browser test, tests/browser/
            # gateway_form.test.mjs): the caller's cookie, a repeat token
            # fetched from the gateway into a hidden field, a form POST.
            self.answer(200, FORM, [("Set-Cookie", "sid=browser-1; Path=/; SameSite=Lax")],
                        content_type="text/html; charset=utf-8")
        elif self.path == "/echo":
            body = json.dumps({k.lower(): v for k, v in self.headers.items()}).encode()
            self.answer(200, body, [("Keep-Alive", "timeout=5"), ("Proxy-Connection", "keep-alive")])
        elif self.path.endswith("/upgrade"):
            self.upgraded()
        elif self.path.endswith("/switch"):
            # 101 whatever was asked (h2c, as a backend that speaks it
            # would): a proxy must not join the two connections.
            self.send_response(101)
            self.send_header("Upgrade", "h2c")
            self.send_header("Connection", "Upgrade")
            self.end_headers()
            self.wfile.flush()
            self.close_connection = True
        elif self.path == "/break":
            self.broken()
        elif self.path == "/big":
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(BIG)))
            self.end_headers()
            self.wfile.write(BIG)
        else:
            self.answer(404, b'{"error":"not found"}')


def main():
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    print(f"listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
