// Over 400 lines on purpose: a function per block of the file (the file, a route, identity, tls, limits, ...), each reading its fields in the README's order.
//! From bytes to [`Config`]: what each field of the file is. A YAML tree
//! with positions (saphyr's `MarkedYaml`) is walked by the walker of
//! `walk.rs`, which records every problem and goes on, so one run of
//! `check` names them all (better than serde's first-error stop, as
//! linkerd2-proxy also chose).
//!
//! Each mapping is read through `Walker::mapping` with the list of the
//! fields it knows: any other is a problem (serde's
//! `deny_unknown_fields`, without stopping at the first). The fields that
//! belong to one guard are the guard's own (`Guard::FIELDS`).

use std::net::SocketAddr;
use std::time::Duration;

use saphyr::{LoadableYamlNode, MarkedYaml, Scalar, YamlData};

use super::{
    AccessLog, Admin, Ambiguous, Config, DEFAULT_DRAIN_DELAY, DEFAULT_LISTEN,
    DEFAULT_MAX_REQUEST_BODY, DEFAULT_MAX_STORED_RESPONSE, DEFAULT_RETENTION, DEFAULT_TIMEOUT,
    DEFAULT_WINDOW, Guard, Identity, IdentitySource, IpNet, LimitBy, Limits, Lookup,
    MIN_TOKEN_SECRET, MediaType, OnStoreFailure, Problem, Problems, Quota, RateLimit, Route,
    RouteMatch, StoreUrl, TOKEN_SECRET_ENV, TokenSecret, Upstream, normalize_host,
};
use norepeat::fingerprint::DEFAULT_IGNORED_FIELDS;
use norepeat::ratelimit::Algorithm;

use super::walk::{Fields, Node, Walker, node_str};

const TOP: &[&str] = &[
    "listen",
    "upstream",
    "store",
    "identity",
    "token_secret",
    "limits",
    "routes",
    "tls",
    "upstream_ca",
    "drain_delay",
    "access_log",
    "admin",
    "token_ttl",
    "cors",
    "hosts",
    "upgrades",
    "records",
    "on_data_loss",
    "error_page",
    "health_check",
];
const HEALTH_CHECK: &[&str] = &["path", "interval"];
const TLS: &[&str] = &["cert", "key"];
const ADMIN: &[&str] = &["listen", "token_env", "public"];
const LIMITS: &[&str] = &[
    "header_timeout",
    "idle_timeout",
    "body_timeout",
    "request_timeout",
    "max_connections",
    "max_streams",
];
const ROUTE: &[&str] = &[
    "match",
    "host",
    "content_type",
    "guard",
    "rate_limit",
    "shadow",
    "upstream",
    "on_store_failure",
    "max_request_body",
    "max_stored_response",
    "timeout",
    "identity",
    "reconcile",
    "on_repeat",
    "wait",
];
const IDENTITY: &[&str] = &[
    "header",
    "cookie",
    "jwt",
    "introspect",
    "ip",
    "any_of",
    "trusted_proxies",
    "required",
];
/// The fields of one source (`identity`'s, or one entry of `any_of`).
const SOURCES: &[&str] = &["header", "cookie", "jwt", "introspect", "ip", "any_of"];
const INTROSPECT: &[&str] = &["path", "user", "cache", "timeout"];
const INTROSPECT_USER: &[&str] = &["header", "json"];
const JWT: &[&str] = &["claim", "secret_env", "public_keys", "issuer", "audiences"];
const CORS: &[&str] = &["allow_origins"];
const RATE_LIMIT: &[&str] = &["algorithm", "rate", "burst", "by"];

pub(super) fn parse(
    file: &str,
    bytes: &[u8],
    env: &dyn Fn(&str) -> Option<Vec<u8>>,
) -> Result<Config, Problems> {
    let mut w = Walker::default();
    let dir = std::path::Path::new(file)
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .map_or_else(|| ".".into(), std::path::Path::to_path_buf);
    let config = read(&mut w, bytes, &Ctx { env, dir });
    // In the order of the file; the environment's (no line) last.
    w.problems
        .sort_by_key(|p| (p.line.unwrap_or(usize::MAX), p.column.unwrap_or(0)));
    match config {
        Some(c) if w.problems.is_empty() => Ok(c),
        _ => Err(Problems {
            file: file.to_owned(),
            list: w.problems,
        }),
    }
}

/// What reading the file needs besides its text: the environment (by a
/// variable's name) and the directory a relative path is read from.
struct Ctx<'e> {
    env: &'e dyn Fn(&str) -> Option<Vec<u8>>,
    dir: std::path::PathBuf,
}

fn read(w: &mut Walker, bytes: &[u8], ctx: &Ctx) -> Option<Config> {
    let env_secret = (ctx.env)(TOKEN_SECRET_ENV);
    let text = match std::str::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => {
            let good = &bytes[..e.valid_up_to()];
            let line = 1 + good.iter().filter(|&&b| b == b'\n').count();
            let start = good.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            // The prefix is valid UTF-8, so the column counts characters.
            let column = 1 + String::from_utf8_lossy(&good[start..]).chars().count();
            w.problems.push(Problem {
                line: Some(line),
                column: Some(column),
                field: String::new(),
                message: format!(
                    "the file is not UTF-8 (byte 0x{:02x} at offset {})",
                    bytes[e.valid_up_to()],
                    e.valid_up_to()
                ),
            });
            return None;
        }
    };
    let mut docs = match MarkedYaml::load_from_str(text) {
        Ok(d) => d,
        Err(e) => {
            let m = e.marker();
            w.problems.push(Problem {
                line: Some(m.line()),
                column: Some(m.col() + 1),
                field: String::new(),
                message: format!("YAML syntax: {}", e.info()),
            });
            return None;
        }
    };
    for doc in &mut docs {
        expand_env(w, doc, ctx);
    }
    if let Some(second) = docs.get(1) {
        w.at(
            second,
            "",
            "a second YAML document (---): the file is one document",
        );
    }
    let Some(root) = docs
        .first()
        .filter(|r| !matches!(r.data, YamlData::Value(Scalar::Null)))
    else {
        w.problems.push(Problem {
            line: Some(1),
            column: None,
            field: "upstream".into(),
            message: "missing (the file is empty); it is required".into(),
        });
        return None;
    };
    let top = w.mapping(root, "", TOP)?;

    let listen = match top.get("listen") {
        None => Some(DEFAULT_LISTEN.parse::<SocketAddr>().ok()?),
        Some(n) => w.parse(n, "listen", |s| {
            s.parse::<SocketAddr>().map_err(|_| {
                format!("expected an address and port such as 127.0.0.1:8090, not {s:?}")
            })
        }),
    };
    let upstream = match top.get("upstream") {
        None => {
            w.at(
                root,
                "upstream",
                "missing; it is required (http://host:port)",
            );
            None
        }
        Some(n) => upstreams(w, n, "upstream"),
    };
    let health_check = match top.get("health_check") {
        None => Some(None),
        Some(n) => health_check(w, n).map(Some),
    };
    let store = match top.get("store") {
        None => Some(StoreUrl::Memory),
        Some(n) => w.parse(n, "store", store),
    };
    let identity = match top.get("identity") {
        None => Some(Identity::default()),
        Some(n) => identity(w, n, "identity", ctx, false),
    };
    let token_secret = match (top.get("token_secret"), env_secret) {
        (Some(n), _) => w
            .parse(n, "token_secret", |s| secret(s.as_bytes()))
            .map(Some),
        (None, Some(env)) => match secret(&env) {
            Ok(s) => Some(Some(s)),
            Err(e) => {
                w.problems.push(Problem {
                    line: None,
                    column: None,
                    field: TOKEN_SECRET_ENV.into(),
                    message: e,
                });
                None
            }
        },
        (None, None) => Some(None),
    };
    let limits = match top.get("limits") {
        None => Some(Limits::default()),
        Some(n) => limits(w, n),
    };
    let drain_delay = match top.get("drain_delay") {
        None => Some(DEFAULT_DRAIN_DELAY),
        // `0s` is a choice here (no drain: an instance behind no load
        // balancer), not a mistake as a zero window would be.
        Some(n) if node_str(n).is_some_and(|s| matches!(s.trim(), "0s" | "0ms")) => {
            Some(Duration::ZERO)
        }
        Some(n) => w.duration(n, "drain_delay"),
    };
    let access_log = match top.get("access_log") {
        None => Some(AccessLog::Off),
        Some(n) => w.parse(n, "access_log", |s| {
            Ok(match s {
                "off" => AccessLog::Off,
                "stdout" => AccessLog::Stdout,
                "stderr" => AccessLog::Stderr,
                "" => return Err("expected stdout, stderr, off or a file's path".to_owned()),
                path => AccessLog::File(ctx.dir.join(path)),
            })
        }),
    };
    let admin = match top.get("admin") {
        None => Some(None),
        Some(n) => admin(w, n, ctx).map(Some),
    };
    let mut routes = Some(Vec::new());
    if let Some(n) = top.get("routes") {
        match w.sequence(n, "routes") {
            None => routes = None,
            Some(items) => {
                let mut seen: Vec<Seen> = Vec::new();
                for (i, item) in items.iter().enumerate() {
                    let r = route(w, item, i, (upstream.as_ref(), ctx), &mut seen);
                    match (r, routes.as_mut()) {
                        (Some(r), Some(list)) => list.push(r),
                        _ => routes = None,
                    }
                }
            }
        }
    }
    // Transport: the listener's certificate and the upstreams' roots, their
    // files read now so a bad one is a problem of `check`.
    let tls = match top.get("tls") {
        None => Some(None),
        Some(n) => tls(w, n, &ctx.dir).map(Some),
    };
    let upstream_ca = match top.get("upstream_ca") {
        None => Some(None),
        Some(n) => w
            .parse(n, "upstream_ca", |s| {
                super::UpstreamCa::load(ctx.dir.join(s))
            })
            .map(Some),
    };
    let token_ttl = match top.get("token_ttl") {
        None => Some(super::DEFAULT_TOKEN_TTL),
        Some(n) => w.duration(n, "token_ttl"),
    };
    let cors = match top.get("cors") {
        None => Some(super::Cors::default()),
        Some(n) => cors(w, n),
    };
    let error_page = match top.get("error_page") {
        None => Some(None),
        Some(n) => w
            .parse(n, "error_page", |s| super::ErrorPage::load(ctx.dir.join(s)))
            .map(Some),
    };
    let hosts = match top.get("hosts") {
        None => Some(Vec::new()),
        Some(n) => hosts(w, n),
    };
    let records = match top.get("records") {
        None => Some(None),
        Some(n) => w.parse(n, "records", |s| records(s, &ctx.dir)).map(Some),
    };
    let on_data_loss = match top.get("on_data_loss") {
        None => Some(Duration::ZERO),
        Some(n) => w
            .mapping(n, "on_data_loss", &["hold"])
            .and_then(|f| match f.get("hold") {
                None => Some(Duration::ZERO),
                Some(h) if node_str(h).is_some_and(|s| matches!(s.trim(), "0s" | "0ms")) => {
                    Some(Duration::ZERO)
                }
                Some(h) => w.duration(h, "on_data_loss.hold"),
            }),
    };
    let upgrades = match top.get("upgrades") {
        None => Some(super::default_upgrades()),
        Some(n) => upgrades(w, n),
    };
    if let (Some(sites), Some(list), Some(up)) = (&hosts, &routes, &upstream) {
        unguarded_under_another_host(w, list, sites, up);
    }
    if let (Some(list), Some(up)) = (&routes, &upstream) {
        unguarded_under_another_type(w, list, up);
    }
    if let (Some(sites), Some(list)) = (&hosts, &routes)
        && !sites.is_empty()
    {
        // A route for a site the gateway answers 421 for is never reached.
        for (i, r) in list.iter().enumerate() {
            if let Some(h) = r.host.as_ref().filter(|h| !sites.contains(h)) {
                w.problems.push(Problem {
                    line: None,
                    column: None,
                    field: format!("routes[{i}].host"),
                    message: format!(
                        "{h} is not one of hosts ({}): the gateway answers its requests 421",
                        sites.join(", ")
                    ),
                });
            }
        }
    }
    // A route's own identity trusts the file's proxies.
    if let (Some(id), Some(list)) = (&identity, routes.as_mut()) {
        for r in list {
            if let Some(own) = &mut r.identity {
                own.trusted_proxies.clone_from(&id.trusted_proxies);
            }
        }
    }
    Some(Config {
        tls: tls?,
        upstream_ca: upstream_ca?,
        token_ttl: token_ttl?,
        cors: cors?,
        error_page: error_page?,
        listen: listen?,
        upstream: upstream?,
        health_check: health_check?,
        store: store?,
        identity: identity?,
        token_secret: token_secret?,
        limits: limits?,
        routes: routes?,
        routes_given: top.get("routes").is_some(),
        drain_delay: drain_delay?,
        access_log: access_log?,
        admin: admin?,
        hosts: hosts?,
        upgrades: upgrades?,
        records: records?,
        on_data_loss_hold: on_data_loss?,
    })
}

/// A guarded route for one `host` whose method and path another Host's
/// request takes to the same backend unguarded (through a route for every
/// site, or the pass-through): a client names another Host (`127.0.0.1`,
/// `www.` the site, an absolute-form target) and walks past the guard.
/// Another Host is any Host without `hosts`, else the other names listed.
/// A route naming that other host itself (`host: www.pay.example`, no
/// guard) says the operator meant it, and is no problem.
fn unguarded_under_another_host(
    w: &mut Walker,
    routes: &[Route],
    sites: &[String],
    file_upstream: &Upstream,
) {
    let same = |a: &Upstream, b: &Upstream| a.uri().authority() == b.uri().authority();
    for (i, r) in routes.iter().enumerate() {
        let Some(own) = &r.host else { continue };
        // A host `hosts` does not list is a problem of its own (below).
        if (r.guard.is_none() && r.rate_limit.is_none())
            || (!sites.is_empty() && !sites.contains(own))
        {
            continue;
        }
        // `None`: any Host not listed (no `hosts`).
        let others: Vec<Option<&String>> = if sites.is_empty() {
            vec![None]
        } else {
            sites.iter().filter(|s| *s != own).map(Some).collect()
        };
        for other in others {
            // What takes this route's requests under `other`: the first
            // route for every site or for `other` whose match covers it.
            let taken = routes.iter().enumerate().find(|(_, t)| {
                takes_every_type_of(t, r)
                    && match (&t.host, other) {
                        (None, _) => true,
                        (Some(h), Some(o)) => h == o,
                        (Some(_), None) => false,
                    }
            });
            let unguarded_to_same = match taken {
                Some((_, t)) if t.guard.is_some() || t.rate_limit.is_some() => false,
                Some((_, t)) if t.host.is_some() => false,
                Some((_, t)) => same(&t.upstream, &r.upstream),
                None => same(file_upstream, &r.upstream),
            };
            if unguarded_to_same {
                let under =
                    other.map_or_else(|| "any other Host".to_owned(), |o| format!("the Host {o}"));
                let by = match taken {
                    Some((j, _)) => format!("routes[{j}]"),
                    None => "the pass-through".to_owned(),
                };
                w.problems.push(Problem {
                    line: None,
                    column: None,
                    field: format!("routes[{i}].host"),
                    message: format!(
                        "{} is guarded only for {own}: under {under} it reaches the same upstream unguarded ({by}); list the site's names in `hosts` (other Hosts get 421), or guard it for every host",
                        r.matcher
                    ),
                });
                break;
            }
        }
    }
}

/// Whether route `t` takes every request route `r` takes, their hosts
/// aside: its `match` covers `r`'s, and it names no `content_type` or
/// `r`'s.
fn takes_every_type_of(t: &Route, r: &Route) -> bool {
    t.matcher.covers(&r.matcher) && (t.content_type.is_none() || t.content_type == r.content_type)
}

/// A guarded route for one `content_type` whose method and path a body of
/// another type (one no route names, or none) takes to the same backend
/// unguarded: through a route without a guard, or the pass-through. A
/// backend that reads its body whatever the `Content-Type` says (Flask's
/// `get_json(force=True)`, a form parser that also takes JSON) would run
/// it. Such a request goes to the first route of that path without a
/// `content_type`: that route must be guarded. A route for another named
/// type is the operator's own choice, and no problem.
fn unguarded_under_another_type(w: &mut Walker, routes: &[Route], file_upstream: &Upstream) {
    let same = |a: &Upstream, b: &Upstream| a.uri().authority() == b.uri().authority();
    for (i, r) in routes.iter().enumerate() {
        let Some(own) = &r.content_type else { continue };
        if r.guard.is_none() && r.rate_limit.is_none() {
            continue;
        }
        // For every site when the route is, else for its own.
        let taken = routes.iter().enumerate().find(|(_, t)| {
            t.content_type.is_none()
                && t.matcher.covers(&r.matcher)
                && (t.host.is_none() || t.host == r.host)
        });
        let unguarded_to_same = match taken {
            Some((_, t)) if t.guard.is_some() || t.rate_limit.is_some() => false,
            Some((_, t)) => same(&t.upstream, &r.upstream),
            None => same(file_upstream, &r.upstream),
        };
        if unguarded_to_same {
            let by = match taken {
                Some((j, _)) => format!("routes[{j}], which has no guard"),
                None => "the pass-through".to_owned(),
            };
            w.problems.push(Problem {
                line: None,
                column: None,
                field: format!("routes[{i}].content_type"),
                message: format!(
                    "{} is guarded only for {own}: a body of another type (or none) reaches the same upstream unguarded ({by}); add a guarded route for {} without content_type after it",
                    r.matcher, r.matcher
                ),
            });
        }
    }
}

/// `hosts: [shop.example, www.shop.example]`: the site's names, each in
/// [`normalize_host`]'s spelling, without a port.
fn hosts(w: &mut Walker, node: &Node) -> Option<Vec<String>> {
    let items = w.sequence(node, "hosts")?;
    let mut all = Some(Vec::new());
    for (i, item) in items.iter().enumerate() {
        let h = w.parse(item, &format!("hosts[{i}]"), |s| {
            if s.contains(['/', '*', ' ', '@']) {
                return Err(format!(
                    "expected a host name (shop.example; a port, if given, is not matched), not {s:?}"
                ));
            }
            normalize_host(s).ok_or_else(|| "expected a host name, not an empty one".to_owned())
        });
        match (h, all.as_mut()) {
            (Some(h), Some(v)) if !v.contains(&h) => v.push(h),
            (Some(_), Some(_)) => {}
            _ => all = None,
        }
    }
    all
}

/// `upgrades: [websocket]`: the `Upgrade` protocols forwarded, in lower
/// case. `h2c` never is: over it a client would speak HTTP/2 to the
/// backend itself, past every route and guard (as NGINX and Envoy refuse
/// it too).
fn upgrades(w: &mut Walker, node: &Node) -> Option<Vec<String>> {
    let items = w.sequence(node, "upgrades")?;
    let mut all = Some(Vec::new());
    for (i, item) in items.iter().enumerate() {
        let p = w.parse(item, &format!("upgrades[{i}]"), |s| {
            let name = s.trim().to_ascii_lowercase();
            if name == "h2c" || name.starts_with("h2c/") {
                Err("h2c is never forwarded: over it a client would speak HTTP/2 to the backend past every route and guard".to_owned())
            } else if name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic() && b != b',') {
                Err(format!("expected a protocol name such as websocket, not {s:?}"))
            } else {
                Ok(name)
            }
        });
        match (p, all.as_mut()) {
            (Some(p), Some(v)) => v.push(p),
            _ => all = None,
        }
    }
    all
}

/// `${NAME}` in every string value of the file, replaced by the
/// environment variable NAME (`$${` is a literal `${`): the Redis password,
/// the token secret and the like stay out of the file. A variable that is
/// not set (or not UTF-8) is a problem where it is named, in `check` as at
/// start.
fn expand_env(w: &mut Walker, node: &mut Node, ctx: &Ctx) {
    use saphyr::YamlData;
    let expanded = match &node.data {
        YamlData::Value(Scalar::String(s)) | YamlData::Representation(s, _, _)
            if s.contains('$') =>
        {
            match expand(s, ctx) {
                Ok(e) => Some(e),
                Err(msg) => {
                    w.at(node, "", &msg);
                    None
                }
            }
        }
        _ => None,
    };
    if let Some(e) = expanded {
        match &mut node.data {
            YamlData::Value(Scalar::String(s)) | YamlData::Representation(s, _, _) => {
                *s = e.into();
            }
            _ => {}
        }
        return;
    }
    match &mut node.data {
        YamlData::Sequence(items) => {
            for item in items {
                expand_env(w, item, ctx);
            }
        }
        YamlData::Mapping(map) => {
            for (_, value) in map.iter_mut() {
                expand_env(w, value, ctx);
            }
        }
        YamlData::Tagged(_, inner) => expand_env(w, inner, ctx),
        _ => {}
    }
}

/// `s` with each `${NAME}` replaced by the variable's value and each
/// `$${` by `${`; or why not.
fn expand(s: &str, ctx: &Ctx) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        if let Some(tail) = after.strip_prefix("$${") {
            out.push_str("${");
            rest = tail;
        } else if let Some(tail) = after.strip_prefix("${") {
            let Some(end) = tail.find('}') else {
                return Err(format!(
                    "`${{` without its `}}` in {s:?} (write `$${{` for a literal `${{`)"
                ));
            };
            let name = &tail[..end];
            if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Err(format!(
                    "`${{{name}}}` names no environment variable (letters, digits and _)"
                ));
            }
            let value = (ctx.env)(name).ok_or_else(|| {
                format!("the environment variable {name} is not set (named by `${{{name}}}`)")
            })?;
            let value = String::from_utf8(value)
                .map_err(|_| format!("the environment variable {name} is not UTF-8"))?;
            out.push_str(&value);
            rest = &tail[end + 1..];
        } else {
            out.push('$');
            rest = &after[1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// `admin: { listen, token_env }`.
fn admin(w: &mut Walker, node: &Node, ctx: &Ctx) -> Option<Admin> {
    let f = w.mapping(node, "admin", ADMIN)?;
    let listen = match f.get("listen") {
        None => {
            w.at(
                node,
                "admin.listen",
                "missing; the admin listener needs an address (127.0.0.1:9091)",
            );
            None
        }
        Some(n) => w.parse(n, "admin.listen", |s| {
            s.parse::<SocketAddr>()
                .map_err(|_| format!("expected an address such as 127.0.0.1:9091, not {s:?}"))
        }),
    };
    let token_env = match f.get("token_env") {
        None => Some(None),
        Some(n) => w
            .parse(n, "admin.token_env", |s| {
                if s.is_empty() || s.contains(['=', '\0']) {
                    return Err(format!(
                        "expected an environment variable's name, not {s:?}"
                    ));
                }
                // As at start: the gateway does not start without it.
                match (ctx.env)(s) {
                    None => Err(format!("{s} is not set (the admin token)")),
                    Some(t) if t.len() < 16 => Err(format!("{s} holds fewer than 16 characters")),
                    Some(_) => Ok(s.to_owned()),
                }
            })
            .map(Some),
    };
    let public = match f.get("public") {
        None => Some(Vec::new()),
        Some(n) => w.sequence(n, "admin.public").and_then(|items| {
            let mut all = Some(Vec::new());
            for (i, item) in items.iter().enumerate() {
                let name = w.parse(item, &format!("admin.public[{i}]"), |s| {
                    if super::Admin::PUBLISHABLE.contains(&s) {
                        Ok(s.to_owned())
                    } else {
                        Err(format!(
                            "expected one of {}, not {s:?} (the token route is always public)",
                            super::Admin::PUBLISHABLE.join(", ")
                        ))
                    }
                });
                match (name, all.as_mut()) {
                    (Some(n), Some(v)) => v.push(n),
                    _ => all = None,
                }
            }
            all
        }),
    };
    Some(Admin {
        listen: listen?,
        token_env: token_env?,
        public: public?,
    })
}

/// What a route before this one takes: its index, `match`, `host` and
/// `content_type`.
type Seen = (usize, RouteMatch, Option<String>, Option<MediaType>);

/// Route `index`; `seen` holds what the routes before it take, so a
/// route that none could reach (the first match wins) is named.
fn route(
    w: &mut Walker,
    node: &Node,
    index: usize,
    (upstream_default, ctx): (Option<&Upstream>, &Ctx),
    seen: &mut Vec<Seen>,
) -> Option<Route> {
    let path = &format!("routes[{index}]");
    // A route's own fields, then each guard's (`Guard::FIELDS`).
    let known: Vec<&str> = ROUTE
        .iter()
        .copied()
        .chain(Guard::FIELDS.iter().map(|(field, ..)| *field))
        .collect();
    let f = w.mapping(node, path, &known)?;
    let p = |name: &str| format!("{path}.{name}");
    let matcher = match f.get("match") {
        None => {
            w.at(
                node,
                &p("match"),
                "missing; every route needs one (METHOD PATH)",
            );
            None
        }
        Some(n) => w.parse(n, &p("match"), RouteMatch::parse),
    };
    let host = match f.get("host") {
        None => Some(None),
        Some(n) => w
            .parse(n, &p("host"), |s| {
                if s.contains(['/', '*', ' ']) {
                    return Err(format!(
                        "expected a host name (api.example.com; a port, if given, is not matched), not {s:?}"
                    ));
                }
                normalize_host(s).ok_or_else(|| "expected a host name, not an empty one".to_owned())
            })
            .map(Some),
    };
    let content_type = match f.get("content_type") {
        None => Some(None),
        Some(n) => w.parse(n, &p("content_type"), MediaType::parse).map(Some),
    };
    if let (Some(m), Some(n), Some(h), Some(t)) = (&matcher, f.get("match"), &host, &content_type) {
        // An earlier route takes every request of this one when its match
        // covers this match, it is for every site or for this one, and
        // for every body type or for this one.
        let covering = seen.iter().find(|(_, e, eh, et)| {
            e.covers(m) && (eh.is_none() || eh == h) && (et.is_none() || et == t)
        });
        if let Some((i, earlier, _, _)) = covering {
            w.at(
                n,
                &p("match"),
                &format!(
                    "never reached: routes[{i}] ({earlier}) takes every request it matches (the first match wins)"
                ),
            );
        }
        seen.push((index, m.clone(), h.clone(), t.clone()));
    }
    let guard_name = match f.get("guard") {
        None => Some(None),
        Some(n) => w
            .parse(n, &p("guard"), |s| {
                if Guard::NAMES.contains(&s) {
                    Ok(s.to_owned())
                } else {
                    Err(format!("expected {}, not {s:?}", Guard::NAMES.join(", ")))
                }
            })
            .map(Some),
    };
    let rate_limit = match f.get("rate_limit") {
        None => Some(None),
        Some(n) => rate_limit(w, n, &p("rate_limit")).map(Some),
    };
    let routing_only = f.get("guard").is_none() && f.get("rate_limit").is_none();
    if routing_only && f.get("upstream").is_none() {
        w.at(
            node,
            path,
            "a route needs a guard, a rate_limit or an upstream of its own (an unguarded request passes through to the file's upstream without a route)",
        );
    }
    // The fields of one guard (`Guard::FIELDS`), refused on the others.
    let named = guard_name.clone().flatten();
    for (field, guard, what) in Guard::FIELDS {
        let Some(n) = f.get(field) else { continue };
        if named.as_deref() != Some(guard) {
            let this = named
                .as_deref()
                .map_or("this route has no guard".to_owned(), |g| {
                    format!("this route's guard is {g}")
                });
            w.at(
                n,
                &p(field),
                &format!("only {} route has {what} ({this})", article(guard)),
            );
        }
    }
    let guard = match guard_name.clone() {
        None => None,
        Some(None) => Some(None),
        Some(Some(g)) => match g.as_str() {
            "token" => Some(Some(Guard::Token)),
            "fingerprint" => {
                let window = given(w, &f, path, "window", DEFAULT_WINDOW, Walker::duration);
                let listed = given(w, &f, path, "ignore_fields", Vec::new(), Walker::strings);
                let defaults = given(w, &f, path, "ignore_default_fields", true, Walker::bool);
                // The library's defaults first (unless the file makes them
                // count), then the file's.
                let ignore_fields = listed.zip(defaults).map(|(listed, defaults)| {
                    let defaults = DEFAULT_IGNORED_FIELDS
                        .iter()
                        .filter(|_| defaults)
                        .map(|f| (*f).to_owned());
                    let mut all: Vec<String> = defaults.collect();
                    for f in listed {
                        if !all.contains(&f) {
                            all.push(f);
                        }
                    }
                    all
                });
                // Combined, not `?`: a return here would leave the route's
                // later fields unchecked, one problem hiding the others.
                window.zip(ignore_fields).map(|(window, ignore_fields)| {
                    Some(Guard::Fingerprint {
                        window,
                        ignore_fields,
                    })
                })
            }
            _ => {
                let req = given(w, &f, path, "required", true, Walker::bool);
                let retention = given(
                    w,
                    &f,
                    path,
                    "retention",
                    DEFAULT_RETENTION,
                    Walker::duration,
                );
                let amb = given(w, &f, path, "ambiguous", Ambiguous::Keep, |w, n, at| {
                    w.parse(n, at, |s| match s {
                        "keep" => Ok(Ambiguous::Keep),
                        "release" => Ok(Ambiguous::Release),
                        _ => Err(format!("expected keep or release, not {s:?}")),
                    })
                });
                let reconcile = match f.get("reconcile") {
                    None => Some(None),
                    Some(n) => lookup(w, n, &p("reconcile")).map(Some),
                };
                if let (Some(Ambiguous::Release), Some(n)) = (amb, f.get("reconcile")) {
                    w.at(
                        n,
                        &p("reconcile"),
                        "reconcile needs ambiguous: keep (under release no outcome is kept unknown: a retry runs again)",
                    );
                }
                // Combined, not `?` (as above).
                (|| {
                    Some(Some(Guard::Idempotency {
                        required: req?,
                        retention: retention?,
                        ambiguous: amb?,
                        reconcile: reconcile?,
                    }))
                })()
            }
        },
    };
    let default_failure = Guard::default_on_store_failure(named.as_deref().unwrap_or_default());
    let on_store_failure = match f.get("on_store_failure") {
        None => Some(default_failure),
        Some(n) => w.parse(n, &p("on_store_failure"), |s| match s {
            "open" => Ok(OnStoreFailure::Open),
            "closed" => Ok(OnStoreFailure::Closed),
            _ => Err(format!("expected open or closed, not {s:?}")),
        }),
    };
    let shadow = match f.get("shadow") {
        None => Some(false),
        Some(n) => w.bool(n, &p("shadow")),
    };
    let upstream = match f.get("upstream") {
        None => upstream_default.cloned(),
        Some(n) => upstreams(w, n, &p("upstream")),
    };
    let size = |w: &mut Walker, field: &str, default: u64| match f.get(field) {
        None => Some(default),
        Some(n) => w.size(n, &p(field)),
    };
    // A route that only routes streams bodies of any size, as the
    // pass-through does, unless the file caps them.
    let body_default = if routing_only {
        u64::MAX
    } else {
        DEFAULT_MAX_REQUEST_BODY
    };
    let max_request_body = size(w, "max_request_body", body_default);
    let max_stored_response = size(w, "max_stored_response", DEFAULT_MAX_STORED_RESPONSE);
    let timeout = match f.get("timeout") {
        None => Some(DEFAULT_TIMEOUT),
        Some(n) => w.duration(n, &p("timeout")),
    };
    let identity = match f.get("identity") {
        None => Some(None),
        Some(_) if named.as_deref() == Some("token") => {
            w.at(
                f.get("identity")?,
                &p("identity"),
                "a token route takes the file's identity, for which GET /.norepeat/token issues its tokens: set it there (any_of for several sources)",
            );
            None
        }
        Some(n) => identity(w, n, &p("identity"), ctx, true).map(Some),
    };
    let on_repeat = on_repeat(w, &f, path, named.as_deref());
    let (guard, rate_limit, identity) = (guard?, rate_limit?, identity?);
    if routing_only && f.get("upstream").is_none() {
        return None;
    }
    Some(Route {
        matcher: matcher?,
        host: host?,
        content_type: content_type?,
        guard,
        rate_limit,
        shadow: shadow?,
        upstream: upstream?,
        on_store_failure: on_store_failure?,
        max_request_body: max_request_body?,
        max_stored_response: max_stored_response?,
        timeout: timeout?,
        identity,
        on_repeat: on_repeat?,
    })
}

/// `on_repeat: refuse | replay` (token and fingerprint routes) and its
/// `wait` (replay only, default 5 s): `Some(wait)` to replay.
fn on_repeat(
    w: &mut Walker,
    f: &Fields,
    path: &str,
    guard: Option<&str>,
) -> Option<Option<Duration>> {
    let p = |field: &str| format!("{path}.{field}");
    let replay = match f.get("on_repeat") {
        None => false,
        Some(n) => {
            let replay = w.parse(n, &p("on_repeat"), |s| match s {
                "refuse" => Ok(false),
                "replay" => Ok(true),
                _ => Err(format!("expected refuse or replay, not {s:?}")),
            })?;
            if !matches!(guard, Some("token" | "fingerprint")) {
                w.at(
                    n,
                    &p("on_repeat"),
                    "only a token or fingerprint route has on_repeat (an idempotency route always replays)",
                );
                return None;
            }
            replay
        }
    };
    match f.get("wait") {
        Some(n) if !replay => {
            w.at(n, &p("wait"), "only a route with on_repeat: replay waits");
            None
        }
        Some(n) => w.duration(n, &p("wait")).map(Some),
        None => Some(replay.then_some(DEFAULT_REPEAT_WAIT)),
    }
}

/// A route field's value: `default` when it is absent, `None` when it is
/// given and wrong (`read` recorded the problem at `path.name`).
fn given<T>(
    w: &mut Walker,
    f: &Fields,
    path: &str,
    name: &str,
    default: T,
    read: impl FnOnce(&mut Walker, &Node, &str) -> Option<T>,
) -> Option<T> {
    match f.get(name) {
        None => Some(default),
        Some(n) => read(w, n, &format!("{path}.{name}")),
    }
}

fn article(guard: &str) -> String {
    match guard {
        "idempotency" => "an idempotency".into(),
        g => format!("a {g}"),
    }
}

fn rate_limit(w: &mut Walker, node: &Node, path: &str) -> Option<RateLimit> {
    let f = w.mapping(node, path, RATE_LIMIT)?;
    let p = |name: &str| format!("{path}.{name}");
    let algorithm = match f.get("algorithm") {
        None => Some(Algorithm::Gcra),
        Some(n) => w.parse(n, &p("algorithm"), |s| match s {
            "gcra" => Ok(Algorithm::Gcra),
            "fixed" | "fixed_window" => Ok(Algorithm::FixedWindow),
            "sliding" | "sliding_window" => Ok(Algorithm::SlidingWindow),
            _ => Err(format!("expected gcra, fixed or sliding, not {s:?}")),
        }),
    };
    let rate = match f.get("rate") {
        None => {
            w.at(
                node,
                &p("rate"),
                "missing; a rate limit needs a rate such as 5/s",
            );
            None
        }
        Some(n) => w.parse(n, &p("rate"), |s| {
            Quota::parse(s).map_err(|e| e.to_string())
        }),
    };
    let burst = match f.get("burst") {
        None => Some(None),
        Some(n) => {
            if algorithm.is_some_and(|a| a != Algorithm::Gcra) {
                w.at(
                    n,
                    &p("burst"),
                    "only gcra has a burst (a window admits the rate's count per period)",
                );
                None
            } else {
                w.count(n, &p("burst")).map(Some)
            }
        }
    };
    let by = match f.get("by") {
        None => Some(LimitBy::Identity),
        Some(n) => w.parse(n, &p("by"), |s| match s {
            "identity" => Ok(LimitBy::Identity),
            "address" | "ip" => Ok(LimitBy::Address),
            _ => Err(format!("expected identity or address, not {s:?}")),
        }),
    };
    let rate = rate?;
    Some(RateLimit {
        algorithm: algorithm?,
        quota: match burst? {
            Some(b) => rate.allow_burst(b),
            None => rate,
        },
        by: by?,
    })
}

/// `tls: { cert, key }`: both files read, parsed and checked to match.
fn tls(w: &mut Walker, node: &Node, base: &std::path::Path) -> Option<super::Tls> {
    let f = w.mapping(node, "tls", TLS)?;
    let mut paths = Vec::new();
    for name in TLS {
        let field = format!("tls.{name}");
        match f.get(name) {
            None => {
                w.at(
                    node,
                    &field,
                    "missing; tls needs a cert and a key (PEM files)",
                );
            }
            Some(n) => {
                if let Some(p) = w.parse(n, &field, |s| Ok(base.join(s))) {
                    paths.push((n, p));
                }
            }
        }
    }
    let [(cert_node, cert), (key_node, key)] = <[_; 2]>::try_from(paths).ok()?;
    let tls = super::Tls { cert, key };
    match super::certified_key(&tls) {
        Ok(_) => Some(tls),
        Err((field, message)) => {
            let at = if field == "tls.cert" {
                cert_node
            } else {
                key_node
            };
            w.at(at, field, &message);
            None
        }
    }
}

fn limits(w: &mut Walker, node: &Node) -> Option<Limits> {
    let f = w.mapping(node, "limits", LIMITS)?;
    let mut limits = Limits::default();
    let mut ok = true;
    for (name, slot) in [
        ("header_timeout", &mut limits.header_timeout),
        ("idle_timeout", &mut limits.idle_timeout),
        ("body_timeout", &mut limits.body_timeout),
        ("request_timeout", &mut limits.request_timeout),
    ] {
        if let Some(n) = f.get(name) {
            match w.duration(n, &format!("limits.{name}")) {
                Some(d) => *slot = d,
                None => ok = false,
            }
        }
    }
    if let Some(n) = f.get("max_connections") {
        match w.count(n, "limits.max_connections") {
            Some(c) => limits.max_connections = c,
            None => ok = false,
        }
    }
    if let Some(n) = f.get("max_streams") {
        match w.count(n, "limits.max_streams") {
            Some(c) => limits.max_streams = c,
            None => ok = false,
        }
    }
    if ok && limits.request_timeout < limits.header_timeout {
        // The head is part of the request: a whole request shorter than
        // its head's limit would make that limit a lie.
        let at = f.get("request_timeout").or_else(|| f.get("header_timeout"));
        if let Some(n) = at {
            w.at(
                n,
                "limits.request_timeout",
                &format!(
                    "must be at least header_timeout ({:?}): the whole request includes its head",
                    limits.header_timeout
                ),
            );
        }
        ok = false;
    }
    ok.then_some(limits)
}

/// An `identity` block at `path` (`identity`, or a route's own, whose
/// `trusted_proxies` are the file's).
fn identity(
    w: &mut Walker,
    node: &Node,
    path: &str,
    ctx: &Ctx,
    of_route: bool,
) -> Option<Identity> {
    let p = |name: &str| format!("{path}.{name}");
    // `identity: ip` and `identity: { header: X-User-Id }` both read.
    if let Some(s) = node_str(node) {
        return if s == "ip" {
            Some(Identity::default())
        } else {
            w.at(
                node,
                path,
                &format!("expected ip or a mapping such as {{ header: X-User-Id }}, not {s:?}"),
            );
            None
        };
    }
    let f = w.mapping(node, path, IDENTITY)?;
    let source = source_of(w, &f, path, ctx);
    let trusted_proxies = match f.get("trusted_proxies") {
        None => Some(Vec::new()),
        Some(n) if of_route => {
            w.at(
                n,
                &p("trusted_proxies"),
                "the proxies are the file's: set trusted_proxies in the top-level identity",
            );
            None
        }
        Some(n) => w.sequence(n, &p("trusted_proxies")).and_then(|items| {
            let mut all = Some(Vec::new());
            for (i, item) in items.iter().enumerate() {
                let net = w.parse(item, &format!("{path}.trusted_proxies[{i}]"), cidr);
                match (net, all.as_mut()) {
                    (Some(n), Some(v)) => v.push(n),
                    _ => all = None,
                }
            }
            all
        }),
    };
    let required = match f.get("required") {
        None => Some(false),
        Some(n) => {
            let r = w.bool(n, &p("required"));
            let always = |s: &IdentitySource| matches!(s, IdentitySource::PeerAddress);
            let always_known = match &source {
                Some(IdentitySource::AnyOf(list)) => list.iter().any(always),
                Some(s) => always(s),
                None => false,
            };
            if r == Some(true) && always_known {
                w.at(
                    n,
                    &p("required"),
                    "the peer address is always known: required needs a header, a cookie or a jwt",
                );
                None
            } else {
                r
            }
        }
    };
    Some(Identity {
        source: source?,
        trusted_proxies: trusted_proxies?,
        required: required?,
    })
}

/// The one source a mapping names (`header`, `cookie`, `jwt`, `ip: true`
/// or `any_of`); none is the peer address.
fn source_of(w: &mut Walker, f: &Fields, path: &str, ctx: &Ctx) -> Option<IdentitySource> {
    let given: Vec<(&str, &Node)> = f
        .entries
        .iter()
        .filter(|(k, _)| SOURCES.contains(k))
        .map(|(k, v)| (*k, *v))
        .collect();
    let Some(&(first, n)) = given.first() else {
        return Some(IdentitySource::PeerAddress);
    };
    if let Some(&(second, m)) = given.get(1) {
        w.at(
            m,
            &format!("{path}.{second}"),
            &format!(
                "{first} and {second} name the caller twice: keep one (or any_of: [...], the first present wins)"
            ),
        );
        return None;
    }
    let at = format!("{path}.{first}");
    match first {
        "ip" => match w.bool(n, &at)? {
            true => Some(IdentitySource::PeerAddress),
            false => {
                w.at(
                    n,
                    &at,
                    "ip: false names no caller; give a header, a cookie or a jwt, or leave identity out",
                );
                None
            }
        },
        "header" => w.parse(n, &at, |s| {
            if s.eq_ignore_ascii_case("ip") {
                return Err(
                    "header: ip would read a header named ip; write `ip: true` for the peer address"
                        .into(),
                );
            }
            token(s)
                .then(|| IdentitySource::Header(s.to_ascii_lowercase()))
                .ok_or_else(|| format!("{s:?} is not a header name"))
        }),
        "cookie" => w.parse(n, &at, |s| {
            token(s)
                .then(|| IdentitySource::Cookie(s.to_owned()))
                .ok_or_else(|| format!("{s:?} is not a cookie name"))
        }),
        "jwt" => jwt(w, n, &at, ctx).map(IdentitySource::Jwt),
        "introspect" => introspect(w, n, &at).map(IdentitySource::Introspect),
        _ if path.contains("any_of[") => {
            w.at(
                n,
                &at,
                "an any_of inside an any_of: list the sources in one",
            );
            None
        }
        _ => {
            let items = w.sequence(n, &at)?;
            if items.is_empty() {
                w.at(n, &at, "an empty any_of names no caller");
                return None;
            }
            let mut all = Some(Vec::new());
            for (i, item) in items.iter().enumerate() {
                let item_path = format!("{at}[{i}]");
                let one = w.mapping(item, &item_path, SOURCES).and_then(|g| {
                    if g.entries.is_empty() {
                        w.at(
                            item,
                            &item_path,
                            "expected one source: header, cookie, jwt, introspect or ip",
                        );
                        return None;
                    }
                    source_of(w, &g, &item_path, ctx)
                });
                if one == Some(IdentitySource::PeerAddress) && i + 1 < items.len() {
                    w.at(
                        item,
                        &item_path,
                        "the peer address is always present: put ip last (the sources after it are never read)",
                    );
                    all = None;
                }
                let asks = |s: &IdentitySource| matches!(s, IdentitySource::Introspect(_));
                if one.as_ref().is_some_and(asks)
                    && all.as_ref().is_some_and(|v| v.iter().any(asks))
                {
                    w.at(
                        item,
                        &item_path,
                        "a second introspect: the backend is asked once per request; keep one",
                    );
                    all = None;
                }
                match (one, all.as_mut()) {
                    (Some(s), Some(v)) => v.push(s),
                    _ => all = None,
                }
            }
            all.map(IdentitySource::AnyOf)
        }
    }
}

/// An RFC 9110 token: a header's or a cookie's name.
fn token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// `jwt: { claim, secret_env | public_keys, issuer, audiences }`. The
/// secret is read from the environment and the key file read and checked
/// here, so `check` names a variable that is not set or a file that holds
/// no usable key.
fn jwt(w: &mut Walker, node: &Node, path: &str, ctx: &Ctx) -> Option<super::Jwt> {
    use super::{JwtKeys, JwtSecret};
    let f = w.mapping(node, path, JWT)?;
    let p = |name: &str| format!("{path}.{name}");
    let claim = match f.get("claim") {
        None => Some("sub".to_owned()),
        Some(n) => w.parse(n, &p("claim"), |s| {
            if s.is_empty() {
                Err("an empty claim name".to_owned())
            } else {
                Ok(s.to_owned())
            }
        }),
    };
    let keys = match (f.get("secret_env"), f.get("public_keys")) {
        (Some(_), Some(n)) => {
            w.at(
                n,
                &p("public_keys"),
                "secret_env and public_keys both verify: keep one (secret_env for HS256, public_keys for RS256 and ES256)",
            );
            None
        }
        (None, None) => {
            w.at(
                node,
                path,
                "missing secret_env (an HS256 secret's variable) or public_keys (a PEM or JWKS file: RS256, ES256)",
            );
            None
        }
        (Some(n), None) => {
            let name = w.parse(n, &p("secret_env"), |s| {
                if s.is_empty() || s.contains(['=', '\0']) {
                    Err(format!("{s:?} is not an environment variable's name"))
                } else {
                    Ok(s.to_owned())
                }
            })?;
            match (ctx.env)(&name) {
                None => {
                    w.at(n, &p("secret_env"), &format!("{name} is not set"));
                    None
                }
                Some(v) if v.len() < MIN_TOKEN_SECRET => {
                    w.at(
                        n,
                        &p("secret_env"),
                        &format!(
                            "{name} has {} bytes; an HS256 secret needs at least {MIN_TOKEN_SECRET} (RFC 7518 §3.2)",
                            v.len()
                        ),
                    );
                    None
                }
                Some(v) => Some(JwtKeys::Secret {
                    env: name,
                    secret: JwtSecret(v),
                }),
            }
        }
        (None, Some(n)) => w.parse(n, &p("public_keys"), |s| {
            let file = ctx.dir.join(s);
            crate::jwt::KeySet::read(&file)?;
            Ok(JwtKeys::PublicKeys(file))
        }),
    };
    let issuer = match f.get("issuer") {
        None => Some(None),
        Some(n) => w.parse(n, &p("issuer"), |s| Ok(s.to_owned())).map(Some),
    };
    let audiences = match f.get("audiences") {
        None => Some(Vec::new()),
        Some(n) => w.strings(n, &p("audiences")),
    };
    Some(super::Jwt {
        claim: claim?,
        keys: keys?,
        issuer: issuer?,
        audiences: audiences?,
    })
}

/// `introspect: { path, user: { header | json }, cache, timeout }`.
fn introspect(w: &mut Walker, node: &Node, path: &str) -> Option<super::Introspect> {
    use super::{DEFAULT_INTROSPECT_CACHE, DEFAULT_INTROSPECT_TIMEOUT};
    let f = w.mapping(node, path, INTROSPECT)?;
    let p = |name: &str| format!("{path}.{name}");
    let asked = match f.get("path") {
        None => {
            w.at(node, path, "missing path: what to GET on the upstream (/api/whoami)");
            None
        }
        Some(n) => w.parse(n, &p("path"), |s| {
            let fits = s.starts_with('/')
                && !s.contains('#')
                && http::uri::PathAndQuery::try_from(s).is_ok_and(|pq| pq.as_str() == s);
            if fits {
                Ok(s.to_owned())
            } else {
                Err(format!(
                    "expected a path on the upstream such as /api/whoami (a query may follow), not {s:?}"
                ))
            }
        }),
    };
    let user = match f.get("user") {
        None => {
            w.at(
                node,
                path,
                "missing user: { header: X-User-Id } or { json: /user/id }, where the 200 names the user",
            );
            None
        }
        Some(n) => introspect_user(w, n, &p("user")),
    };
    let cache = match f.get("cache") {
        None => Some(DEFAULT_INTROSPECT_CACHE),
        Some(n) => w.duration(n, &p("cache")),
    };
    let timeout = match f.get("timeout") {
        None => Some(DEFAULT_INTROSPECT_TIMEOUT),
        Some(n) => w.duration(n, &p("timeout")),
    };
    Some(super::Introspect {
        path: asked?,
        user: user?,
        cache: cache?,
        timeout: timeout?,
    })
}

/// `user: { header: NAME }` or `user: { json: /pointer }`.
fn introspect_user(w: &mut Walker, node: &Node, path: &str) -> Option<super::IntrospectUser> {
    use super::IntrospectUser;
    let f = w.mapping(node, path, INTROSPECT_USER)?;
    match (f.get("header"), f.get("json")) {
        (Some(_), Some(n)) => {
            w.at(
                n,
                &format!("{path}.json"),
                "header and json both name the user: keep one",
            );
            None
        }
        (None, None) => {
            w.at(
                node,
                path,
                "expected { header: X-User-Id } or { json: /user/id }",
            );
            None
        }
        (Some(n), None) => w.parse(n, &format!("{path}.header"), |s| {
            token(s)
                .then(|| IntrospectUser::Header(s.to_ascii_lowercase()))
                .ok_or_else(|| format!("{s:?} is not a header name"))
        }),
        (None, Some(n)) => w.parse(n, &format!("{path}.json"), |s| {
            json_pointer(s)
                .then(|| IntrospectUser::Json(s.to_owned()))
                .ok_or_else(|| {
                    format!(
                        "{s:?} is not a JSON pointer (RFC 6901): /user/id, each step after a /, ~0 for ~ and ~1 for /"
                    )
                })
        }),
    }
}

/// An RFC 6901 JSON pointer: empty (the whole document), or steps each
/// after a `/`, in which `~` is only `~0` or `~1`.
fn json_pointer(s: &str) -> bool {
    if s.is_empty() {
        return true;
    }
    s.starts_with('/')
        && s.split('~')
            .skip(1)
            .all(|after| after.starts_with(['0', '1']))
}

/// `cors: { allow_origins: [https://shop.example] }`.
fn cors(w: &mut Walker, node: &Node) -> Option<super::Cors> {
    let f = w.mapping(node, "cors", CORS)?;
    let Some(n) = f.get("allow_origins") else {
        return Some(super::Cors::default());
    };
    let items = w.sequence(n, "cors.allow_origins")?;
    let mut all = Some(Vec::new());
    for (i, item) in items.iter().enumerate() {
        let origin = w.parse(item, &format!("cors.allow_origins[{i}]"), origin);
        match (origin, all.as_mut()) {
            (Some(o), Some(v)) => v.push(o),
            _ => all = None,
        }
    }
    all.map(|allow_origins| super::Cors { allow_origins })
}

/// An origin, `scheme://host[:port]` (RFC 6454), in lower case.
fn origin(s: &str) -> Result<String, String> {
    if s == "*" || s == "null" {
        return Err(format!(
            "{s:?} is not allowed: the answer carries credentials (the caller's cookie), which a browser refuses for a wildcard; list the origins"
        ));
    }
    let lower = s.to_ascii_lowercase();
    let rest = lower
        .strip_prefix("https://")
        .or_else(|| lower.strip_prefix("http://"))
        .ok_or_else(|| format!("an origin is http:// or https:// and a host, not {s:?}"))?;
    if rest.contains(['/', '?', '#', '@']) {
        let scheme = if lower.starts_with("https") {
            "https"
        } else {
            "http"
        };
        let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
        return Err(format!(
            "an origin has no path, query or credentials; write {scheme}://{host}"
        ));
    }
    host_port(rest, true).map_err(|e| format!("{e} (expected https://host[:port])"))?;
    // A browser's `Origin` leaves the scheme's own port out.
    let default_port = if lower.starts_with("https") {
        ":443"
    } else {
        ":80"
    };
    Ok(lower
        .strip_suffix(default_port)
        .map_or_else(|| lower.clone(), str::to_owned))
}

fn cidr(s: &str) -> Result<IpNet, String> {
    s.parse::<IpNet>()
        .or_else(|_| s.parse::<std::net::IpAddr>().map(IpNet::from))
        .map_err(|_| format!("expected an address or a CIDR such as 10.0.0.0/8, not {s:?}"))
}

fn secret(bytes: &[u8]) -> Result<TokenSecret, String> {
    if bytes.len() < MIN_TOKEN_SECRET {
        Err(format!(
            "a token secret needs at least {MIN_TOKEN_SECRET} bytes, this one has {}",
            bytes.len()
        ))
    } else {
        Ok(TokenSecret(bytes.to_vec()))
    }
}

/// The most servers one upstream list names.
const MAX_SERVERS: usize = 64;

/// An upstream: one URL ([`upstream`]), or a list of them, each an
/// `http(s)://` URL, none twice, all with the same path (the
/// pass-through writes it once, before the server is chosen).
fn upstreams(w: &mut Walker, node: &Node, path: &str) -> Option<Upstream> {
    let YamlData::Sequence(items) = &super::walk::untag(node).data else {
        return w.parse(node, path, upstream);
    };
    if items.is_empty() {
        w.at(
            node,
            path,
            "an empty list; name at least one server (http://host:port)",
        );
        return None;
    }
    if items.len() > MAX_SERVERS {
        w.at(
            node,
            path,
            &format!("{} servers; at most {MAX_SERVERS}", items.len()),
        );
        return None;
    }
    let mut all = Some(Vec::new());
    for (i, item) in items.iter().enumerate() {
        let at = format!("{path}[{i}]");
        let Some(u) = w.parse(item, &at, upstream) else {
            all = None;
            continue;
        };
        let Some(list) = all.as_mut() else { continue };
        let first: Option<&Upstream> = list.first();
        if list.iter().any(|o: &Upstream| {
            o.uri().authority() == u.uri().authority() && o.uri().scheme() == u.uri().scheme()
        }) {
            w.at(item, &at, &format!("{u} is in the list twice"));
            all = None;
        } else if let Some(first) = first.filter(|f| {
            f.uri().path().trim_end_matches('/') != u.uri().path().trim_end_matches('/')
        }) {
            w.at(
                item,
                &at,
                &format!("every server of a list has the same path: {u} has not {first}'s"),
            );
            all = None;
        } else {
            list.push(u);
        }
    }
    let mut list = all?.into_iter();
    let first = list.next()?;
    Some(Upstream::list(first, list.collect()))
}

/// `health_check: {path: /health, interval: 5s}`.
fn health_check(w: &mut Walker, node: &Node) -> Option<super::HealthCheck> {
    let f = w.mapping(node, "health_check", HEALTH_CHECK)?;
    let path = match f.get("path") {
        None => {
            w.at(
                node,
                "health_check.path",
                "missing; it is required (/health)",
            );
            None
        }
        Some(n) => w.parse(n, "health_check.path", |s| {
            if s.starts_with('/') && s.parse::<http::uri::PathAndQuery>().is_ok() {
                Ok(s.to_owned())
            } else {
                Err(format!("expected a path such as /health, not {s:?}"))
            }
        }),
    };
    let interval = match f.get("interval") {
        None => Some(Duration::from_secs(5)),
        Some(n) => w.duration(n, "health_check.interval"),
    };
    Some(super::HealthCheck {
        path: path?,
        interval: interval?,
    })
}

/// `http://host[:port][/base]` (or `https://`): the scheme, a host, a port if any, no
/// credentials, query or fragment.
pub(super) fn upstream(s: &str) -> Result<Upstream, String> {
    let bad = |why: &str| format!("{why} (expected http://host:port, not {s:?})");
    let Some(rest) = s
        .strip_prefix("http://")
        .or_else(|| s.strip_prefix("https://"))
    else {
        return Err(bad("the upstream must be an http:// or https:// URL"));
    };
    if rest.contains(['?', '#']) {
        return Err(bad("an upstream has no query or fragment"));
    }
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.contains('@') {
        return Err(bad("an upstream has no credentials"));
    }
    host_port(authority, true).map_err(|e| bad(&e))?;
    let s = s.trim_end_matches('/');
    let uri: http::Uri = s.parse().map_err(|_| bad("not a URL"))?;
    Ok(Upstream(s.to_owned(), uri, Vec::new()))
}

/// `host[:port]`, a bracketed IPv6 address allowed.
fn host_port(s: &str, port_optional: bool) -> Result<(), String> {
    let (host, port) = if let Some(v6) = s.strip_prefix('[') {
        let Some((addr, after)) = v6.split_once(']') else {
            return Err("an IPv6 address needs its closing ]".into());
        };
        if addr.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!("{addr:?} is not an IPv6 address"));
        }
        (addr, after.strip_prefix(':'))
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    let host_ok = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-._:".contains(c));
    if !host_ok {
        return Err(format!("{host:?} is not a host"));
    }
    match port {
        Some(p) if p.parse::<u16>().is_ok_and(|p| p > 0) => Ok(()),
        Some(p) => Err(format!("{p:?} is not a port")),
        None if port_optional => Ok(()),
        None => Err(format!("{s:?} has no port")),
    }
}

/// How long a repeat on an `on_repeat: replay` route waits for the first
/// request's answer.
const DEFAULT_REPEAT_WAIT: Duration = Duration::from_secs(5);

/// `reconcile: { lookup: "GET /path/{key}" }`: a GET (a lookup changes
/// nothing), an absolute path holding `{key}` once and no other `{`.
fn lookup(w: &mut Walker, node: &Node, path: &str) -> Option<Lookup> {
    let f = w.mapping(node, path, &["lookup"])?;
    let at = format!("{path}.lookup");
    let Some(n) = f.get("lookup") else {
        w.at(node, &at, "reconcile needs a lookup: GET /path/{key}");
        return None;
    };
    w.parse(n, &at, |s| {
        let Some(rest) = s.strip_prefix("GET ") else {
            return Err(format!(
                "expected GET /path/{{key}} (a lookup is a GET: it changes nothing), not {s:?}"
            ));
        };
        let rest = rest.trim();
        if !rest.starts_with('/') || rest.contains(char::is_whitespace) {
            return Err(format!("expected an absolute path after GET, not {rest:?}"));
        }
        if rest.matches("{key}").count() != 1 || rest.replace("{key}", "").contains(['{', '}']) {
            return Err(format!(
                "the path must hold {{key}} once (where the client's key goes) and no other braces, not {rest:?}"
            ));
        }
        Ok(Lookup {
            path: rest.to_owned(),
        })
    })
}

/// `memory`, `redis://...`, `rediss://...`, `redis+sentinel://h:p,h:p/NAME`
/// or `redis+cluster://h:p,h:p`, each with the store's query if asked.
/// Credentials are never repeated in a message.
/// `records:`: `postgres://...` (or `postgresql://`) or `sqlite:FILE` (a
/// relative FILE is the configuration file's folder's).
fn records(s: &str, dir: &std::path::Path) -> Result<super::RecordsUrl, String> {
    let expected = "expected postgres://user@host[:port]/database or sqlite:FILE";
    if let Some(rest) = s
        .strip_prefix("postgres://")
        .or_else(|| s.strip_prefix("postgresql://"))
    {
        if rest.is_empty() {
            return Err(format!("no host; {expected}"));
        }
        return Ok(super::RecordsUrl(s.to_owned()));
    }
    if let Some(rest) = s.strip_prefix("sqlite:") {
        let rest = rest.strip_prefix("//").unwrap_or(rest);
        let (path, query) = rest
            .split_once('?')
            .map_or((rest, None), |(p, q)| (p, Some(q)));
        if path.is_empty() || path == ":memory:" {
            return Err(format!(
                "a file is needed (records kept in memory would not outlive the process); {expected}"
            ));
        }
        let path = dir.join(path);
        let mut url = format!("sqlite://{}", path.display());
        if let Some(q) = query {
            url.push('?');
            url.push_str(q);
        }
        return Ok(super::RecordsUrl(url));
    }
    Err(format!("not a database URL; {expected}"))
}

fn store(s: &str) -> Result<StoreUrl, String> {
    let expected = "expected memory, redis://host:port[/db], redis+sentinel://host:port,host:port/MASTER_NAME or redis+cluster://host:port,host:port (each may end with ?replicas=N&replicas_timeout=T)";
    let hosts = |rest: &str| rest.rsplit_once('@').map_or(rest, |(_, h)| h).to_owned();
    // The query (the store's `replicas` settings) and whatever else the
    // library refuses: checked by the library itself, nothing sent. Its
    // message names the URL with its password hidden.
    let library = |s: &str| {
        norepeat::store::AnyStore::check_url(s).map_err(|e| match e {
            norepeat::store::StoreError::InvalidUrl(why) => why,
            other => other.to_string(),
        })
    };
    if s == "memory" {
        return Ok(StoreUrl::Memory);
    }
    if let Some(rest) = s.strip_prefix("redis+cluster://") {
        let rest = rest.split_once('?').map_or(rest, |(r, _)| r);
        let nodes = hosts(rest.trim_end_matches('/'));
        if nodes.contains(['/', '#']) {
            return Err("a cluster URL has no path or database".into());
        }
        for node in nodes.split(',') {
            host_port(node, false).map_err(|e| format!("cluster node {e}; {expected}"))?;
        }
        library(s)?;
        return Ok(StoreUrl::Cluster(s.to_owned()));
    }
    if let Some(rest) = s
        .strip_prefix("redis+sentinel://")
        .or_else(|| s.strip_prefix("rediss+sentinel://"))
    {
        let rest = rest.split_once('?').map_or(rest, |(r, _)| r);
        let rest = hosts(rest);
        let Some((sentinels, master)) = rest.split_once('/') else {
            return Err(format!("no master name after the Sentinels; {expected}"));
        };
        for sentinel in sentinels.split(',') {
            host_port(sentinel, false).map_err(|e| format!("Sentinel {e}; {expected}"))?;
        }
        if master.trim_end_matches('/').is_empty() {
            return Err(format!("no master name after the Sentinels; {expected}"));
        }
        library(s)?;
        // One Redis to the routes: the library follows its master.
        return Ok(StoreUrl::Redis(s.to_owned()));
    }
    if let Some(rest) = s
        .strip_prefix("redis://")
        .or_else(|| s.strip_prefix("rediss://"))
    {
        let rest = rest.split_once('?').map_or(rest, |(r, _)| r);
        let rest = hosts(rest);
        let (authority, db) = rest.split_once('/').unwrap_or((&rest, ""));
        host_port(authority, true).map_err(|e| format!("{e}; {expected}"))?;
        if !db.is_empty() && db.parse::<u32>().is_err() {
            return Err(format!("the database must be a number, not {db:?}"));
        }
        library(s)?;
        return Ok(StoreUrl::Redis(s.to_owned()));
    }
    let scheme = s.split_once("://").map_or(s, |(scheme, _)| scheme);
    Err(format!("unknown store {scheme:?}; {expected}"))
}
