// Over 400 lines on purpose: a route's `match` (its grammar, how it covers another, how it matches a path, the table of paths each rule takes) and its `content_type`.
//! `match: METHOD PATH` and `content_type: TYPE`: which requests a route
//! takes.

use std::fmt;

/// The methods a route may name: `ANY` is every method. `CONNECT` and
/// `TRACE` are left out: a guard has nothing to do with either (`ANY`
/// takes them, to route them).
pub const METHODS: [&str; 8] = [
    "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "ANY",
];

/// A route's `match`: one method (or `ANY`) and a path template whose
/// `{name}` segments match any one non-empty segment, and whose last
/// segment may be `{*name}`: the rest of the path, any number of segments
/// (none too), so `ANY /api/{*rest}` takes `/api`, `/api/` and everything
/// under it.
///
/// The gateway matches a request's path once it is normalized
/// ([`normalize_path`](super::normalize_path)), and a match ignores a
/// trailing slash (on both sides: `POST /orders` and `POST /orders/` are
/// one route, taking `/orders` and `/orders/`) and the parameters a
/// segment may carry after `;` (`/payments;jsessionid=1` is `/payments`),
/// since the backends behind a gateway (Spring's `UrlPathHelper`, Tomcat,
/// Express, Django with `APPEND_SLASH`) often take those for the same
/// resource: a spelling a backend serves alike must not pass unguarded.
///
/// ```
/// use norepeat_gateway::config::RouteMatch;
///
/// let m: RouteMatch = "POST /flash-sale/{sku}".parse()?;
/// assert!(m.matches("POST", "/flash-sale/42"));
/// assert!(!m.matches("GET", "/flash-sale/42"));
/// assert!(!m.matches("POST", "/flash-sale/42/more"));
/// assert!(!m.matches("POST", "/flash-sale/"));
/// assert!(m.matches("POST", "/flash-sale/42/"));
/// assert!(m.matches("POST", "/flash-sale/42;v=1"));
/// assert_eq!(m.params(), vec!["sku"]);
/// assert_eq!(m.to_string(), "POST /flash-sale/{sku}");
///
/// let api: RouteMatch = "ANY /api/{*rest}".parse()?;
/// assert!(api.matches("DELETE", "/api/v1/users/7"));
/// assert!(api.matches("GET", "/api"));
/// assert!(!api.matches("GET", "/apis"));
/// # Ok::<(), String>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteMatch {
    method: String,
    template: String,
    segments: Vec<Segment>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Param(String),
    /// `{*name}`, the last segment: the rest of the path.
    Rest(String),
}

impl RouteMatch {
    /// Reads `METHOD PATH`, as a route's `match` writes it.
    ///
    /// # Errors
    /// A message naming what is wrong: not two words, a method not in
    /// [`METHODS`] (they are upper case, as HTTP writes them), a path not
    /// starting with `/`, an empty segment inside the path, a query, a
    /// brace outside a whole `{name}` segment, a name that is not an
    /// identifier, a name used twice, a `{*name}` that is not the last
    /// segment, or another router's syntax (`:id`, `*`: the message says
    /// to write `{id}` or `{*rest}`).
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut words = text.split_whitespace();
        let (Some(method), Some(template), None) = (words.next(), words.next(), words.next())
        else {
            return Err(format!(
                "expected METHOD PATH, such as \"POST /orders\", not {text:?}"
            ));
        };
        if !METHODS.contains(&method) {
            return Err(format!(
                "unknown method {method:?}; expected one of {}",
                METHODS.join(", ")
            ));
        }
        let Some(rest) = template.strip_prefix('/') else {
            return Err(format!("the path must start with '/', not {template:?}"));
        };
        if template.contains(['?', '#']) {
            return Err(format!(
                "the path {template:?} has a query or fragment; a route matches the path only"
            ));
        }
        let mut segments = Vec::new();
        // A trailing slash is no segment: matches ignore it.
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if !rest.is_empty() {
            let parts: Vec<&str> = rest.split('/').collect();
            let last = parts.len() - 1;
            for (i, part) in parts.into_iter().enumerate() {
                segments.push(segment(part, i == last, template)?);
            }
        }
        let mut names: Vec<&str> = Vec::new();
        for s in &segments {
            if let Segment::Param(name) | Segment::Rest(name) = s {
                if names.contains(&name.as_str()) {
                    return Err(format!("{{{name}}} is used twice in {template:?}"));
                }
                names.push(name);
            }
        }
        Ok(Self {
            method: method.to_owned(),
            template: template.to_owned(),
            segments,
        })
    }

    /// Whether a request with this method and path (without its query,
    /// normalized by [`normalize_path`](super::normalize_path)) is this
    /// route's. A trailing slash and each segment's `;` parameters are
    /// ignored (see above).
    #[must_use]
    pub fn matches(&self, method: &str, path: &str) -> bool {
        self.matches_with(method, path, |l, p| l == p)
    }

    /// Whether `path` is this route's whatever the method: a preflight
    /// (`OPTIONS`) asks about the route its method names.
    #[must_use]
    pub fn matches_path(&self, path: &str) -> bool {
        self.matches_with(&self.method, path, |l, p| l == p)
    }

    /// [`matches`](Self::matches) with the path's literal segments compared
    /// in any case: whether a backend that folds case (IIS, ASP.NET, a
    /// case-insensitive file system) would take `path` for this route.
    #[must_use]
    pub fn matches_ignoring_case(&self, method: &str, path: &str) -> bool {
        self.matches_with(method, path, str::eq_ignore_ascii_case)
    }

    fn matches_with(&self, method: &str, path: &str, same: impl Fn(&str, &str) -> bool) -> bool {
        if method != self.method && self.method != "ANY" {
            return false;
        }
        let Some(rest) = path.strip_prefix('/') else {
            return false;
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        let mut parts = rest
            .split('/')
            .map(|p| p.split_once(';').map_or(p, |(name, _)| name))
            .filter(|_| !rest.is_empty());
        for s in &self.segments {
            match (s, parts.next()) {
                (Segment::Rest(_), _) => return true,
                (Segment::Literal(l), Some(p)) if same(l, p) => {}
                (Segment::Param(_), Some(p)) if !p.is_empty() => {}
                _ => return false,
            }
        }
        parts.next().is_none()
    }

    /// Whether every request `other` matches is matched by `self` too: a
    /// route after `self` with such a match could never be reached.
    ///
    /// ```
    /// use norepeat_gateway::config::RouteMatch;
    ///
    /// let any: RouteMatch = "POST /orders/{id}".parse()?;
    /// assert!(any.covers(&"POST /orders/quick".parse()?));
    /// assert!(!any.covers(&"PUT /orders/quick".parse()?));
    /// assert!(!"POST /orders/quick".parse::<RouteMatch>()?.covers(&any));
    /// # Ok::<(), String>(())
    /// ```
    #[must_use]
    pub fn covers(&self, other: &RouteMatch) -> bool {
        if self.method != other.method && self.method != "ANY" {
            return false;
        }
        let mut theirs = other.segments.iter();
        for mine in &self.segments {
            match (mine, theirs.next()) {
                (Segment::Rest(_), _) => return true,
                (Segment::Param(_), Some(Segment::Literal(l))) if !l.is_empty() => {}
                (Segment::Param(_), Some(Segment::Param(_))) => {}
                (Segment::Literal(a), Some(Segment::Literal(b))) if a == b => {}
                _ => return false,
            }
        }
        theirs.next().is_none()
    }

    /// The method, upper case (`ANY` for every method).
    #[must_use]
    pub fn method(&self) -> &str {
        &self.method
    }

    /// The path template as written (`/orders/{id}`).
    #[must_use]
    pub fn template(&self) -> &str {
        &self.template
    }

    /// The names of the `{name}` and `{*name}` segments, in order.
    #[must_use]
    pub fn params(&self) -> Vec<&str> {
        self.segments
            .iter()
            .filter_map(|s| match s {
                Segment::Param(n) | Segment::Rest(n) => Some(n.as_str()),
                Segment::Literal(_) => None,
            })
            .collect()
    }
}

/// A route's `content_type`: the one media type (`type/subtype`) of the
/// request bodies it takes, so one path can have a route for forms and
/// another for JSON. It is compared in any case, and the request's
/// parameters (`; charset=utf-8`) are ignored, as a backend's framework
/// reads the type (werkzeug's `mimetype`, Express's `type-is`).
///
/// A request whose `Content-Type` is another type, is missing, or is sent
/// twice is taken by none of the routes that name one.
///
/// ```
/// use norepeat_gateway::config::MediaType;
///
/// let form = MediaType::parse("application/x-www-form-urlencoded")?;
/// assert!(form.takes(Some("application/x-www-form-urlencoded")));
/// assert!(form.takes(Some("Application/X-WWW-Form-Urlencoded; charset=UTF-8")));
/// assert!(!form.takes(Some("application/json")));
/// assert!(!form.takes(None));
/// assert_eq!(form.to_string(), "application/x-www-form-urlencoded");
/// assert!(MediaType::parse("application/json; charset=utf-8").is_err());
/// assert!(MediaType::parse("*/*").is_err());
/// # Ok::<(), String>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MediaType(String);

impl MediaType {
    /// Reads `type/subtype` as a route's `content_type` writes it (kept in
    /// lower case).
    ///
    /// # Errors
    /// A message naming what is wrong: not `type/subtype` of RFC 9110
    /// tokens, a wildcard (`*`), or parameters (which a match ignores).
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.contains(';') {
            let essence = text.split(';').next().unwrap_or_default().trim();
            return Err(format!(
                "write the media type without parameters ({essence}): a request's parameters (charset=...) are ignored"
            ));
        }
        let Some((kind, sub)) = text.split_once('/') else {
            return Err(format!(
                "expected a media type such as application/json, not {text:?}"
            ));
        };
        if kind == "*" || sub == "*" {
            return Err(format!(
                "{text:?}: a route names one media type, not a wildcard (a route without content_type takes every type)"
            ));
        }
        if !is_token(kind) || !is_token(sub) {
            return Err(format!(
                "expected a media type such as application/json, not {text:?}"
            ));
        }
        Ok(Self(text.to_ascii_lowercase()))
    }

    /// Whether a request whose `Content-Type` is `content_type` (`None`:
    /// none, or more than one) is one this route takes: its type and
    /// subtype, in any case, parameters ignored.
    #[must_use]
    pub fn takes(&self, content_type: Option<&str>) -> bool {
        content_type.is_some_and(|v| essence(v).eq_ignore_ascii_case(&self.0))
    }

    /// The media type, lower case.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for MediaType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A `Content-Type` value's `type/subtype`, without parameters or the
/// space around it.
fn essence(value: &str) -> &str {
    value.split(';').next().unwrap_or_default().trim()
}

/// Whether `s` is an RFC 9110 token (`tchar`s, at least one).
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// One segment of a template (never empty: a trailing slash was taken
/// off before).
fn segment(part: &str, last: bool, template: &str) -> Result<Segment, String> {
    if part.is_empty() {
        return Err(format!("the path {template:?} has an empty segment (//)"));
    }
    // Other routers' syntax, which would otherwise be a literal that no
    // request is ever spelled as: say what to write instead.
    if let Some(name) = part.strip_prefix(':') {
        return Err(format!(
            "{part:?} in {template:?}: write {{{name}}} for a segment that matches anything (not Express's :name)"
        ));
    }
    if part == "*" || part == "**" {
        return Err(format!(
            "{part:?} in {template:?}: write {{*rest}} as the last segment for the rest of the path"
        ));
    }
    let rest = part.strip_prefix("{*").and_then(|p| p.strip_suffix('}'));
    if let Some(name) = rest {
        if !last {
            return Err(format!(
                "{part:?} in {template:?}: {{*{name}}} takes the rest of the path, so it must be the last segment"
            ));
        }
        if !is_ident(name) {
            return Err(format!(
                "{{*{name}}} in {template:?}: a segment's name is letters, digits and '_', not starting with a digit"
            ));
        }
        return Ok(Segment::Rest(name.to_owned()));
    }
    if let Some(name) = part.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
        if !is_ident(name) {
            return Err(format!(
                "{{{name}}} in {template:?}: a segment's name is letters, digits and '_', not starting with a digit"
            ));
        }
        return Ok(Segment::Param(name.to_owned()));
    }
    if part == "." || part == ".." {
        return Err(format!(
            "{part:?} in {template:?}: a dot segment never matches (request paths are normalized)"
        ));
    }
    if part.contains([';', '%']) {
        return Err(format!(
            "{part:?} in {template:?}: write the path decoded, without ';' parameters"
        ));
    }
    if part.contains(['{', '}']) {
        return Err(format!(
            "{part:?} in {template:?}: a {{name}} must be a whole segment"
        ));
    }
    Ok(Segment::Literal(part.to_owned()))
}

/// Whether `name` is letters, digits and `_`, not starting with a digit.
fn is_ident(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl std::str::FromStr for RouteMatch {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for RouteMatch {
    /// `METHOD PATH`, the label metrics use for the route.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.method, self.template)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(s: &str) -> RouteMatch {
        RouteMatch::parse(s).expect(s)
    }

    #[test]
    fn literals_match_exactly() {
        let r = m("POST /orders");
        assert!(r.matches("POST", "/orders"));
        assert!(r.matches("POST", "/orders/"), "a trailing slash is ignored");
        assert!(
            r.matches("POST", "/orders;jsessionid=1"),
            "so are ;parameters"
        );
        assert!(!r.matches("POST", "/orders;x/y"));
        assert!(!r.matches("POST", "/order"));
        assert!(!r.matches("POST", "/orders/quick"));
        assert!(!r.matches("post", "/orders"));
        assert!(!r.matches("PUT", "/orders"));
        assert!(!r.matches("POST", "orders"));
    }

    #[test]
    fn params_match_one_non_empty_segment() {
        let r = m("POST /coupons/{id}/redeem");
        assert!(r.matches("POST", "/coupons/abc/redeem"));
        assert!(r.matches("POST", "/coupons/%20/redeem"));
        assert!(!r.matches("POST", "/coupons//redeem"));
        assert!(!r.matches("POST", "/coupons/a/b/redeem"));
        assert!(!r.matches("POST", "/coupons/abc"));
        assert_eq!(r.params(), vec!["id"]);
    }

    #[test]
    fn the_root_and_a_trailing_slash() {
        let root = m("GET /");
        assert!(root.matches("GET", "/"));
        assert!(!root.matches("GET", "/a"));
        // A trailing slash is ignored on both sides.
        let slash = m("PUT /a/");
        assert!(slash.matches("PUT", "/a/"));
        assert!(slash.matches("PUT", "/a"));
        assert!(m("PUT /a").covers(&slash));
    }

    #[test]
    fn spaces_around_and_between_are_one_separator() {
        assert_eq!(m("  POST \t /orders "), m("POST /orders"));
        assert_eq!(m("DELETE /a/{b}").to_string(), "DELETE /a/{b}");
    }

    #[test]
    fn bad_matches_say_why() {
        for (text, want) in [
            ("POST", "expected METHOD PATH"),
            ("", "expected METHOD PATH"),
            ("POST /a /b", "expected METHOD PATH"),
            ("post /a", "unknown method \"post\""),
            ("FETCH /a", "unknown method"),
            ("TRACE /a", "unknown method"),
            ("POST orders", "must start with '/'"),
            ("POST /a//b", "empty segment"),
            ("POST /a?b=1", "query"),
            ("POST /a/{", "whole segment"),
            ("POST /a/x{id}", "whole segment"),
            ("POST /a/{id}x", "whole segment"),
            ("POST /a/{}", "a segment's name"),
            ("POST /a/{1x}", "a segment's name"),
            ("POST /a/{b-c}", "a segment's name"),
            ("POST /{id}/{id}", "used twice"),
            ("POST /a/../b", "dot segment"),
            ("POST /./b", "dot segment"),
            ("POST /a;v=1", "without ';'"),
            ("POST /orders/:id", "write {id}"),
            ("GET /api/*", "write {*rest}"),
            ("GET /api/{*rest}/x", "must be the last segment"),
            ("GET /api/{*1}", "a segment's name"),
            ("GET /{*a}/{*a}", "last segment"),
            ("any /a", "unknown method"),
            ("POST /pay%6Dents", "decoded"),
        ] {
            let err = RouteMatch::parse(text).expect_err(text);
            assert!(err.contains(want), "{text:?}: {err}");
        }
    }

    #[test]
    fn covers_is_matching_every_request_of_the_other() {
        assert!(m("POST /a").covers(&m("POST /a")));
        assert!(m("POST /{x}/b").covers(&m("POST /a/b")));
        assert!(m("POST /{x}").covers(&m("POST /{y}")));
        assert!(!m("POST /{x}").covers(&m("POST /a/b")));
        assert!(!m("POST /a/{x}").covers(&m("POST /a/")));
        assert!(!m("POST /a").covers(&m("POST /b")));
        assert!(!m("POST /a").covers(&m("GET /a")));
    }

    #[test]
    fn a_rest_segment_takes_the_rest_of_the_path() {
        let r = m("GET /api/{*rest}");
        for p in ["/api", "/api/", "/api/a", "/api/a/b/c", "/api;v=1/x"] {
            assert!(r.matches("GET", p), "{p}");
        }
        assert!(!r.matches("GET", "/apis"));
        assert!(!r.matches("GET", "/"));
        assert!(!r.matches("POST", "/api/a"));
        let all = m("ANY /{*all}");
        assert!(all.matches("PATCH", "/"));
        assert!(all.matches("GET", "/x/y"));
        assert_eq!(r.params(), vec!["rest"]);
    }

    #[test]
    fn any_is_every_method() {
        let r = m("ANY /a");
        for method in ["GET", "POST", "DELETE", "PROPFIND", "CONNECT"] {
            assert!(r.matches(method, "/a"), "{method}");
        }
        assert!(!r.matches("GET", "/b"));
    }

    #[test]
    fn covers_knows_any_and_the_rest() {
        assert!(m("ANY /a").covers(&m("POST /a")));
        assert!(!m("POST /a").covers(&m("ANY /a")));
        assert!(m("GET /api/{*r}").covers(&m("GET /api/x/{y}")));
        assert!(m("GET /api/{*r}").covers(&m("GET /api")));
        assert!(m("GET /api/{*r}").covers(&m("GET /api/{*s}")));
        assert!(!m("GET /api/{x}").covers(&m("GET /api/{*s}")));
        assert!(!m("GET /api/x/{*r}").covers(&m("GET /api/{*s}")));
        assert!(m("ANY /{*all}").covers(&m("DELETE /a/b")));
    }

    #[test]
    fn every_listed_method_is_accepted() {
        for method in METHODS {
            assert_eq!(m(&format!("{method} /x")).method(), method);
        }
    }

    #[test]
    fn a_path_matches_whatever_the_method() {
        assert!(m("POST /orders/{id}").matches_path("/orders/7/"));
        assert!(!m("POST /orders/{id}").matches_path("/orders"));
        assert!(m("ANY /api/{*rest}").matches_path("/api/x"));
    }

    #[test]
    fn a_media_type_is_its_essence_in_any_case() {
        let json = MediaType::parse(" Application/JSON ").unwrap();
        assert_eq!(json.as_str(), "application/json");
        for sent in [
            "application/json",
            "APPLICATION/JSON",
            "application/json;charset=utf-8",
            " application/json ; charset=\"utf-8\"",
        ] {
            assert!(json.takes(Some(sent)), "{sent}");
        }
        for sent in [
            "application/jsonx",
            "text/json",
            "application/json+x",
            "",
            "application",
        ] {
            assert!(!json.takes(Some(sent)), "{sent}");
        }
        assert!(!json.takes(None));
        for (text, want) in [
            ("application/json; charset=utf-8", "without parameters"),
            ("json", "expected a media type"),
            ("application/", "expected a media type"),
            ("text/*", "not a wildcard"),
            ("*/*", "not a wildcard"),
            ("a b/c", "expected a media type"),
            ("a/b/c", "expected a media type"),
        ] {
            let err = MediaType::parse(text).expect_err(text);
            assert!(err.contains(want), "{text:?}: {err}");
        }
    }

    /// `content_type` in a file: one path, a route per body type, and
    /// `check`'s rule that a guarded path is not reachable unguarded by a
    /// body of another type.
    mod in_a_file {
        use crate::config::{Config, Guard};

        const UP: &str = "upstream: http://127.0.0.1:9000\nroutes:\n";
        const FORM: &str = "  - match: POST /orders\n    content_type: application/x-www-form-urlencoded\n    guard: token\n";
        const JSON: &str =
            "  - match: POST /orders\n    content_type: Application/JSON\n    guard: fingerprint\n";

        fn problems(routes: &str) -> Vec<String> {
            match Config::parse("t.yaml", format!("{UP}{routes}").as_bytes()) {
                Ok(_) => Vec::new(),
                Err(p) => p
                    .list()
                    .iter()
                    .map(|p| format!("{}: {}", p.field, p.message))
                    .collect(),
            }
        }

        #[test]
        fn a_route_per_type_and_a_guarded_one_for_the_rest() {
            let rest = "  - match: POST /orders\n    guard: token\n";
            let c = Config::parse("t.yaml", format!("{UP}{FORM}{JSON}{rest}").as_bytes())
                .unwrap_or_else(|p| panic!("{p}"));
            let types: Vec<Option<&str>> = c
                .routes
                .iter()
                .map(|r| r.content_type.as_ref().map(super::MediaType::as_str))
                .collect();
            assert_eq!(
                types,
                [
                    Some("application/x-www-form-urlencoded"),
                    Some("application/json"),
                    None
                ]
            );
            assert!(matches!(c.routes[1].guard, Some(Guard::Fingerprint { .. })));
        }

        #[test]
        fn a_guarded_type_with_the_rest_unguarded_is_refused() {
            // The rest passes through.
            let got = problems(&format!("{FORM}{JSON}"));
            assert_eq!(got.len(), 2, "{got:#?}");
            assert!(
                got[0].starts_with("routes[0].content_type: POST /orders is guarded only for application/x-www-form-urlencoded: a body of another type (or none) reaches the same upstream unguarded (the pass-through)"),
                "{got:#?}"
            );
            assert!(got[1].starts_with("routes[1].content_type: "), "{got:#?}");
            // The rest through a route that only routes, to the same
            // backend.
            let routing = "  - match: ANY /{*all}\n    upstream: http://127.0.0.1:9000\n";
            let got = problems(&format!("{JSON}{routing}"));
            assert_eq!(got.len(), 1, "{got:#?}");
            assert!(
                got[0].contains("(routes[1], which has no guard)"),
                "{got:#?}"
            );
            // To another backend, or guarded: no problem.
            let elsewhere = "  - match: ANY /{*all}\n    upstream: http://127.0.0.1:9001\n";
            assert!(problems(&format!("{JSON}{elsewhere}")).is_empty());
            let limited = "  - match: POST /{x}\n    rate_limit: { rate: 5/s }\n";
            assert!(problems(&format!("{JSON}{limited}")).is_empty());
            // A typed route that only routes is the operator's choice.
            let plain = "  - match: POST /orders\n    content_type: text/plain\n    upstream: http://127.0.0.1:9001\n";
            assert!(problems(plain).is_empty());
        }

        #[test]
        fn a_route_another_takes_whole_is_never_reached() {
            let rest = "  - match: POST /orders\n    guard: token\n";
            let got = problems(&format!("{rest}{JSON}"));
            assert_eq!(got.len(), 1, "{got:#?}");
            assert!(
                got[0].starts_with("routes[1].match: never reached: routes[0]"),
                "{got:#?}"
            );
            let got = problems(&format!("{JSON}{JSON}{rest}"));
            assert_eq!(got.len(), 1, "{got:#?}");
            assert!(
                got[0].starts_with("routes[1].match: never reached"),
                "{got:#?}"
            );
            let got = problems(
                "  - match: POST /orders\n    content_type: application/json; charset=utf-8\n    guard: token\n",
            );
            assert_eq!(got.len(), 1, "{got:#?}");
            assert!(
                got[0]
                    .starts_with("routes[0].content_type: write the media type without parameters"),
                "{got:#?}"
            );
        }
    }
}
