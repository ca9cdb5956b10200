#!/usr/bin/env python3
"""The gateway and its anchors under wrk, as `norepeat bench`'s gateway rows
but with wrk as the load and NGINX as the backend (see BENCHMARKS.md,
"Under wrk").

Usage: anchors.py GATEWAY_BIN IDEMPOTENT_PROXY_BIN REDIS_PORT [ROUNDS [DURATION]]
(ROWS=a,b to run only those rows; GW_BEFORE=OTHER_GATEWAY_BIN runs each
gateway row again right after it with that binary, as `<row>_before`, and
pairs the two: an earlier commit against this one, in the same run). Each
proxy runs in front of one NGINX backend (`return 200`/`201` from memory,
one worker) and the Redis on REDIS_PORT: the gateway (its default
workers, one a core), NGINX `proxy_pass` and NGINX with the fingerprint
guard in Lua (as many workers as cores), idempotent-proxy-server. wrk
-t2 -c64 runs in its own process with fresh.lua (a new body or key each
request, or one of 64 completed keys); a 1 s run warms each proxy first.
Two rows are floors, not peers: `passthrough_post` (the gateway
forwarding the POST with no guard) and `nginx_direct` (wrk straight at the
backend: no proxy, no Redis). Beside each figure, the CPU per request of
the proxy (with its children), the backend, Redis, wrk and the machine,
from /proc. Rows alternate within a round. Prints one line of JSON a row
on stderr, then the rows, their medians, the pairs' ratios and `goals`
(each of issue 53's ratios as the CPU a request the proxy, and its guard
above the floor, may spend) on stdout."""
import json, os, re, socket, subprocess, sys, tempfile, time, shutil, statistics

GW = sys.argv[1]          # norepeat-gateway
IP = sys.argv[2]          # idempotent-proxy-server
REDIS_PORT = int(sys.argv[3])
ROUNDS = int(sys.argv[4]) if len(sys.argv) > 4 else 3
DUR = sys.argv[5] if len(sys.argv) > 5 else "6s"
LUA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fresh.lua")
TICK = os.sysconf("SC_CLK_TCK")
WORKERS = os.cpu_count()

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

def wait_port(port, proc, what):
    t = time.time() + 15
    while time.time() < t:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close(); return
        except OSError:
            if proc.poll() is not None: raise SystemExit(f"{what} exited")
            time.sleep(0.05)
    raise SystemExit(f"{what} not listening")

def ticks(pid):
    try:
        s = open(f"/proc/{pid}/stat").read()
    except OSError:
        return 0
    f = s[s.rfind(")") + 2:].split()
    return int(f[11]) + int(f[12])

def tree_ticks(pid):
    total = ticks(pid)
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                s = open(f"/proc/{d}/stat").read()
            except OSError:
                continue
            if int(s[s.rfind(")") + 2:].split()[1]) == pid:
                total += ticks(int(d))
    return total

def busy():
    f = open("/proc/stat").readline().split()[1:]
    v = list(map(int, f))
    return sum(v[:3]) + sum(v[5:8]), v[7]  # busy, steal

NGINX_HEAD = """daemon off; master_process on; worker_processes {w}; pid {p}/nginx.pid;
error_log {p}/error.log warn; events {{ worker_connections 4096; }}
"""
HTTP_HEAD = """  access_log off; client_body_temp_path {p}/body; proxy_temp_path {p}/proxy;
  fastcgi_temp_path {p}/f; uwsgi_temp_path {p}/u; scgi_temp_path {p}/s; keepalive_requests 100000000;
"""

def start_nginx(conf_body, w, modules=""):
    p = tempfile.mkdtemp(prefix="wrkb-nginx-")
    conf = modules + NGINX_HEAD.format(w=w, p=p) + "http {\n" + HTTP_HEAD.format(p=p) + conf_body + "}\n"
    open(f"{p}/nginx.conf", "w").write(conf)
    proc = subprocess.Popen(["nginx", "-p", p, "-c", f"{p}/nginx.conf", "-e", f"{p}/error.log"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, p

def backend():
    port = free_port()
    body = f"""  server {{ listen 127.0.0.1:{port};
    location / {{ if ($request_method = GET) {{ return 200 '{{"created":true}}'; }} return 201 '{{"created":true}}'; }} }}
"""
    proc, p = start_nginx(body, 1)
    wait_port(port, proc, "backend")
    return proc, p, port

def proxy_nginx(bport, lua):
    port = free_port()
    mods, lua_http, access = "", "", ""
    if lua:
        mods = "load_module /usr/lib/nginx/modules/ndk_http_module.so;\nload_module /usr/lib/nginx/modules/ngx_http_lua_module.so;\n"
        lua_http = '  lua_package_path "/usr/share/lua/5.1/?.lua;;";\n  init_by_lua_block { redis = require "nginx.redis" }\n'
        access = """access_by_lua_block {
      if ngx.req.get_method() ~= "POST" then return end
      ngx.req.read_body()
      local body = ngx.req.get_body_data() or ""
      local caller = ngx.var.http_x_user_id or ngx.var.remote_addr
      local key = "nginxlua:" .. ngx.md5(caller .. "\\n" .. ngx.req.get_method() .. "\\n" .. ngx.var.uri .. "\\n" .. body)
      local red = redis:new()
      red:set_timeout(1000)
      local ok, err = red:connect("127.0.0.1", %d)
      if not ok then return ngx.exit(503) end
      local res, err = red:set(key, "1", "NX", "PX", 3000)
      if not res then return ngx.exit(503) end
      red:set_keepalive(60000, 256)
      if res == ngx.null then ngx.status = 409; ngx.print('{"status":409}'); return ngx.exit(409) end
    }""" % REDIS_PORT
    body = f"""{lua_http}  upstream backend {{ server 127.0.0.1:{bport}; keepalive 256; keepalive_requests 100000000; }}
  server {{ listen 127.0.0.1:{port};
    location / {{ {access}
      proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection "";
      proxy_set_header Host $http_host; proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto $scheme; }} }}
"""
    proc, p = start_nginx(body, WORKERS, mods)
    wait_port(port, proc, "nginx")
    return proc, p, port

ROUTES = {
    "elsewhere": ("/elsewhere", "guard: fingerprint\n    window: 3s"),
    "fingerprint": ("/orders", "guard: fingerprint\n    window: 3s"),
    "idempotency": ("/orders", "guard: idempotency\n    required: true\n    retention: 60s"),
}

def proxy_gateway(bport, route, binary=GW):
    path, guard = ROUTES[route]
    d = tempfile.mkdtemp(prefix="wrkb-gw-")
    port = free_port()
    open(f"{d}/gw.yaml", "w").write(
        f"upstream: http://127.0.0.1:{bport}\nstore: redis://127.0.0.1:{REDIS_PORT}\nidentity:\n  header: X-User-Id\nroutes:\n  - match: POST {path}\n    {guard}\n")
    proc = subprocess.Popen([binary, "--config", f"{d}/gw.yaml", "--listen", f"127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=open(f"{d}/err", "w"), env={**os.environ, "RUST_LOG": "warn"})
    wait_port(port, proc, "gateway")
    return proc, d, port

def proxy_ip(bport):
    d = tempfile.mkdtemp(prefix="wrkb-ip-")
    port = free_port()
    env = {"SERVER_ADDR": f"127.0.0.1:{port}", "URL_BE": f"http://127.0.0.1:{bport}/orders",
           "LOG_LEVEL": "warn", "REQUEST_TIMEOUT": "10000", "REDIS_URL": f"redis://127.0.0.1:{REDIS_PORT}"}
    open(f"{d}/.env", "w").write("".join(f"{k}={v}\n" for k, v in env.items()))
    proc = subprocess.Popen([IP], cwd=d, env=env, stdout=subprocess.DEVNULL, stderr=open(f"{d}/err", "w"))
    wait_port(port, proc, "idempotent-proxy")
    return proc, d, port

ROWS = [  # name, proxy, mode, path
    ("nginx", "nginx", "get", "/orders"),
    ("passthrough", "gw:elsewhere", "get", "/orders"),
    ("nginx_post", "nginx", "body", "/orders"),
    ("passthrough_post", "gw:elsewhere", "body", "/orders"),
    ("nginx_lua", "nginx_lua", "body", "/orders"),
    ("guarded", "gw:fingerprint", "body", "/orders"),
    ("idempotent_proxy", "ip", "key", "/URL_BE"),
    ("idempotency", "gw:idempotency", "key", "/orders"),
    ("idempotent_proxy_replay", "ip", "replay", "/URL_BE"),
    ("replay", "gw:idempotency", "replay", "/orders"),
    ("nginx_direct", "direct", "replay", "/orders"),
]

if os.environ.get("ROWS"):
    ROWS = [r for r in ROWS if r[0] in os.environ["ROWS"].split(",")]

BEFORE = os.environ.get("GW_BEFORE")
if BEFORE:
    ROWS = [x for r in ROWS for x in ([r, (r[0] + "_before", "before:" + r[1][3:], r[2], r[3])]
                                      if r[1].startswith("gw:") else [r])]

def wrk(port, mode, base, path, dur):
    out = subprocess.Popen(["wrk", "-t2", "-c64", f"-d{dur}", "-s", LUA, f"http://127.0.0.1:{port}{path}", "--", mode, base, path],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    text = out.stdout.read()
    _, status, ru = os.wait4(out.pid, 0)
    out.returncode = status
    req = int(re.search(r"(\d+) requests in", text).group(1))
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    errs = re.search(r"Socket errors:.*", text)
    return req, rps, int(bad.group(1)) if bad else 0, (errs.group(0) if errs else None), ru.ru_utime + ru.ru_stime

def prewarm(port, base, path):
    for i in range(64):
        subprocess.run(["curl", "-s", "-o", "/dev/null", "-X", "POST", "-H", "Content-Type: application/json",
                        "-H", "X-User-Id: bench-user", "-H", f"Idempotency-Key: {base}-r-{i}",
                        "--data", '{"sku":"SKU-1","quantity":1,"note":"%s-r-%d"}' % (base, i),
                        f"http://127.0.0.1:{port}{path}"], check=False)

def redis_pid():
    out = subprocess.run(["redis-cli", "-p", str(REDIS_PORT), "info", "server"], capture_output=True, text=True).stdout
    return int(re.search(r"process_id:(\d+)", out).group(1))

def main():
    rpid = redis_pid()
    bproc, bdir, bport = backend()
    results = []
    run = os.urandom(4).hex()
    for rnd in range(ROUNDS):
        for name, proxy, mode, path in ROWS:
            if proxy == "direct": proc, d, port = bproc, None, bport
            elif proxy == "nginx": proc, d, port = proxy_nginx(bport, False)
            elif proxy == "nginx_lua": proc, d, port = proxy_nginx(bport, True)
            elif proxy == "ip": proc, d, port = proxy_ip(bport)
            elif proxy.startswith("before:"): proc, d, port = proxy_gateway(bport, proxy.split(":")[1], BEFORE)
            else: proc, d, port = proxy_gateway(bport, proxy.split(":")[1])
            base = f"{run}-{rnd}-{name}"
            if mode == "replay" and proxy != "direct": prewarm(port, base, path)
            wrk(port, mode, base + "w", path, "1s") if mode != "replay" else wrk(port, mode, base, path, "1s")
            before = (tree_ticks(proc.pid), tree_ticks(bproc.pid), ticks(rpid), busy())
            req, rps, bad, errs, loader = wrk(port, mode, base, path, DUR)
            after = (tree_ticks(proc.pid), tree_ticks(bproc.pid), ticks(rpid), busy())
            us = lambda t: t * 1e6 / TICK / max(req, 1)
            # Only the backend's answers count (as the bench's rows count
            # them): a 503 of a guard that could not decide is not served.
            ok = rps * (req - bad) / max(req, 1)
            if proxy == "direct":  # the backend is the server: its CPU once, as the proxy's
                after = (after[0], before[1]) + after[2:]
            row = {"round": rnd, "name": name, "requests": req, "rps": rps, "ok_rps": ok, "non2xx": bad, "socket_errors": errs,
                   "proxy_us": us(after[0] - before[0]), "backend_us": us(after[1] - before[1]),
                   "redis_us": us(after[2] - before[2]), "loader_us": loader * 1e6 / max(req, 1),
                   "machine_us": us(after[3][0] - before[3][0]), "steal_ticks": after[3][1] - before[3][1],
                   "load": open("/proc/loadavg").read().split()[0]}
            results.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
            if proxy == "direct": continue
            proc.terminate()
            try: proc.wait(5)
            except subprocess.TimeoutExpired: proc.kill(); proc.wait()
            shutil.rmtree(d, ignore_errors=True)
    bproc.terminate(); bproc.wait(); shutil.rmtree(bdir, ignore_errors=True)
    print(json.dumps({"rows": results, "summary": summary(results)}))

PAIRS = [("passthrough", "nginx"), ("guarded", "nginx_lua"), ("idempotency", "idempotent_proxy"),
         ("replay", "idempotent_proxy_replay"), ("idempotency", "nginx_post"), ("guarded", "nginx_post"),
         ("passthrough_post", "nginx_post")]
if BEFORE:
    PAIRS += [(r[0][:-len("_before")], r[0]) for r in ROWS if r[0].endswith("_before")]

def summary(results):
    """Each row's medians; each pair's ratio taken within each round, then
    their median and range."""
    rounds = sorted({r["round"] for r in results})
    by = {(r["round"], r["name"]): r for r in results}
    out = {"rows": {}, "ratios": {}}
    for name in dict.fromkeys(r["name"] for r in results):
        rs = [by[(k, name)] for k in rounds if (k, name) in by]
        med = lambda f: statistics.median(r[f] for r in rs)
        out["rows"][name] = {f: med(f) for f in ["ok_rps", "proxy_us", "backend_us", "redis_us", "loader_us", "machine_us"]}
        out["rows"][name]["ok_rps_range"] = [min(r["ok_rps"] for r in rs), max(r["ok_rps"] for r in rs)]
        out["rows"][name]["non2xx"] = [r["non2xx"] for r in rs]
    for a, b in PAIRS:
        rate = [by[(k, a)]["ok_rps"] / by[(k, b)]["ok_rps"] for k in rounds if (k, a) in by and (k, b) in by]
        cpu = [by[(k, a)]["proxy_us"] / by[(k, b)]["proxy_us"] for k in rounds if (k, a) in by and (k, b) in by]
        if rate:
            out["ratios"][f"{a}/{b}"] = {"rate": statistics.median(rate), "rate_range": [min(rate), max(rate)],
                                         "cpu": statistics.median(cpu), "cpu_range": [min(cpu), max(cpu)]}
    out["goals"] = goals(rounds, by)
    return out

# Issue 53's goals: (ours, anchor, rate ratio asked, the row that is ours
# without the guard's work). On two saturated cores a row's rate is about
# the inverse of the machine's CPU a request, so a goal is a budget: the
# anchor's machine CPU over the ratio asked. Of ours, what the proxy does
# not spend (wrk, the backend, Redis) is taken from it; what is left is
# what the proxy may spend, and the floor row says how much of that the
# same request costs it without a guard (the gateway forwarding the POST, or
# for a replay NGINX answering from memory, no proxy, no Redis).
GOALS = [("guarded", "nginx_lua", 1.5, "passthrough_post"), ("idempotency", "idempotent_proxy", 3.0, "passthrough_post"),
         ("replay", "idempotent_proxy_replay", 6.0, "nginx_direct"), ("idempotency", "nginx_post", 0.5, "passthrough_post")]

def goals(rounds, by):
    out = {}
    for a, b, goal, floor in GOALS:
        rs = [(by[(k, a)], by[(k, b)], by[(k, floor)]) for k in rounds if all((k, x) in by for x in (a, b, floor))]
        if not rs:
            continue
        med = lambda f: statistics.median(f(o, n, fl) for o, n, fl in rs)
        budget = lambda o, n, fl: n["machine_us"] / goal
        others = lambda o, n, fl: o["loader_us"] + o["backend_us"] + o["redis_us"]
        out[f"{a}/{b}"] = {
            "goal": goal, "budget_machine_us": med(budget), "machine_us": med(lambda o, n, fl: o["machine_us"]),
            "others_us": med(others), "proxy_may_spend_us": med(lambda o, n, fl: budget(o, n, fl) - others(o, n, fl)),
            "proxy_us": med(lambda o, n, fl: o["proxy_us"]), "floor": floor, "floor_proxy_us": med(lambda o, n, fl: fl["proxy_us"]),
            "guard_may_spend_us": med(lambda o, n, fl: budget(o, n, fl) - others(o, n, fl) - fl["proxy_us"]),
            "guard_spends_us": med(lambda o, n, fl: o["proxy_us"] - fl["proxy_us"])}
    return out

if __name__ == "__main__":
    main()
