// Over 400 lines on purpose: a route's `match`: its grammar, how it covers another, how it matches a path, and the table of paths each rule takes.
//! `match: METHOD PATH`: which requests a route takes.

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
}
