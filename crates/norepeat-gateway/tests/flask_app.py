"""A Flask shop whose session cookie changes on every answer, for
tests/it/introspect.rs (the gateway's `identity.introspect`).

Flask re-signs its session cookie whenever the session changes; here every
request counts itself in the session (`n`), so every answer carries a new
`Set-Cookie: session=...` for the same user, as a rotating session does.

Routes:
  POST /login?user=NAME   the session's user is NAME
  GET  /whoami            200 {"user": {"id": NAME}} and `X-User-Id: NAME`,
                          or 401 without a user; counted. Its behaviour is
                          set by POST /control?whoami=MODE: ok, down (500),
                          slow (2 s, then ok), gate (waits for
                          POST /control?open=1, then ok)
  POST /payments          a charge for the session's user (401 without one): 201
  GET  /form              the order form: a page that fetches its repeat token
  GET  /favicon.ico       204 (what a browser asks beside the page)
  POST /orders            an order (the form's post): 201
  GET  /counts            {"whoami": N, "charges": N, "orders": N, "whoami_headers": [...]}

argv[1] is the port (0 for any); it prints `listening on http://127.0.0.1:PORT`
once it listens, as the test kit expects.
"""

import sys
import threading
import time

from flask import Flask, jsonify, request, session
from werkzeug.serving import make_server

app = Flask(__name__)
app.secret_key = "introspect-test-secret-not-for-use"

LOCK = threading.Lock()
COUNTS = {"whoami": 0, "charges": 0, "orders": 0}
WHOAMI_HEADERS = []
MODE = {"whoami": "ok"}
GATE = threading.Event()

FORM = """<!doctype html>
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


def count(name):
    with LOCK:
        COUNTS[name] += 1
        return COUNTS[name]


@app.before_request
def rotate():
    # The test's own reads and switches leave the session alone.
    if request.path not in ("/counts", "/control"):
        session["n"] = session.get("n", 0) + 1


@app.post("/login")
def login():
    session["user"] = request.args["user"]
    return jsonify(user=session["user"])


@app.get("/whoami")
def whoami():
    count("whoami")
    with LOCK:
        WHOAMI_HEADERS.append(sorted(k.lower() for k in request.headers.keys()))
    mode = MODE["whoami"]
    if mode == "down":
        return jsonify(error="down"), 500
    if mode == "slow":
        time.sleep(2)
    if mode == "gate":
        GATE.wait(30)
    user = session.get("user")
    if user is None:
        return jsonify(error="who are you?"), 401
    return jsonify(user={"id": user}), 200, {"X-User-Id": user}


@app.post("/payments")
def payments():
    if "user" not in session:
        return jsonify(error="log in first"), 401
    return jsonify(charge=count("charges")), 201


@app.get("/form")
def form():
    return FORM, 200, {"Content-Type": "text/html; charset=utf-8"}


@app.get("/favicon.ico")
def favicon():
    return "", 204


@app.post("/orders")
def orders():
    return jsonify(order=count("orders"), sku=request.form.get("sku")), 201


@app.get("/counts")
def counts():
    with LOCK:
        return jsonify(whoami_headers=WHOAMI_HEADERS, **COUNTS)


@app.post("/control")
def control():
    if "whoami" in request.args:
        MODE["whoami"] = request.args["whoami"]
        GATE.clear()
    if "open" in request.args:
        GATE.set()
    return jsonify(MODE)


if __name__ == "__main__":
    server = make_server("127.0.0.1", int(sys.argv[1]), app, threaded=True)
    print(f"listening on http://127.0.0.1:{server.server_port}", flush=True)
    server.serve_forever()
