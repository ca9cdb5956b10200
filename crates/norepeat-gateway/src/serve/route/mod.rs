//! The route phase: which route a request takes ([`choose`]: the first
//! that matches its normalized path, its site and its body's type, or a
//! refusal of a spelling that would pass a guard by, or a preflight the
//! gateway answers), the compiled routes a reload swaps whole
//! ([`table`]), and each route's stack ([`stack`]).

pub(crate) mod stack;
pub(crate) mod table;

use crate::config::{with_slashes_decoded, without_format_suffix};
use crate::serve::cors;
use crate::serve::route::table::{Compiled, Routes};
use http::{HeaderMap, header};
use std::sync::Arc;

/// Which way a request goes, from its method, its normalized path and
/// its site: what [`route_request`] and the pass-through's lane
/// (`listen/lane.rs`) both decide by.
pub(crate) enum Choice {
    /// Refused 400 `invalid_request`: a spelling of a guarded route that
    /// would pass it by ([`other_spelling`]).
    Refused(&'static str),
    /// No route: straight through.
    Passthrough,
    /// The route at `at` in the list; `keyed`: the spelling without a
    /// format suffix it was found by, if it was.
    Route { at: usize, keyed: Option<String> },
    /// A preflight of a listed origin (`cors`) for a route: the gateway's
    /// to answer ([`cors::route_preflight`]). From the lane, which has not
    /// read the headers: an `OPTIONS` on a route's path, which may be one
    /// (`dispatch` reads them and decides).
    Preflight,
}

impl Choice {
    /// Whether the request's headers cannot change this choice made
    /// without them ([`choose`]): no route of `live` names a
    /// `content_type`, and it is not a preflight (which the headers say).
    pub(crate) fn settled(&self, live: &Routes) -> bool {
        !live.by_type && !matches!(self, Self::Preflight)
    }
}

/// A choice the lane made from the head ([`choose`]) that the headers
/// cannot change ([`Choice::settled`]), with what it was made on: handed
/// to `dispatch` with the routes it was made in ([`ChosenIn`]), and
/// `dispatch` does not choose again. The route is chosen once, on one
/// load of the routes.
pub(crate) struct Chosen {
    /// The path normalized, when that changed it.
    pub(crate) normalized: Option<String>,
    /// The site, when the routes read it (`host`, `hosts`).
    pub(crate) site: Option<String>,
    pub(crate) choice: Choice,
}

/// A [`Chosen`] with the routes it was made in: they serve the request,
/// whatever a reload swapped in meanwhile (its `at` indexes their list).
pub(crate) type ChosenIn = (Arc<Routes>, Chosen);

/// What the route phase has of the request's headers.
#[derive(Clone, Copy)]
enum Headers<'a> {
    /// None: the lane chooses from the head's method and target. A route
    /// that names a `content_type` may take the request, and an `OPTIONS`
    /// may be a preflight: either goes to `dispatch`, which reads them.
    Unread,
    /// The request's.
    Read(&'a HeaderMap),
}

/// The route `method` and `path` (normalized; `sent`, as the client sent
/// it) take on `site`, the first that matches; or the pass-through; or a
/// refusal. The lane's choice, from the head's method and target: see
/// [`Choice::Preflight`], and a route with a `content_type` is taken as
/// one that may match (the lane passes through only a request no route
/// may take).
pub(crate) fn choose(
    live: &Routes,
    method: &str,
    path: &str,
    sent: &str,
    site: Option<&String>,
) -> Choice {
    choose_by(live, (method, path, sent), site, Headers::Unread)
}

/// [`choose`], with the request's `headers`: a route's `content_type` is
/// matched against its `Content-Type`, and a preflight is one when it
/// comes from a listed origin and asks for a method a route takes.
pub(crate) fn choose_request(
    live: &Routes,
    (method, path, sent): (&str, &str, &str),
    site: Option<&String>,
    headers: &HeaderMap,
) -> Choice {
    choose_by(live, (method, path, sent), site, Headers::Read(headers))
}

fn choose_by(
    live: &Routes,
    (method, path, sent): (&str, &str, &str),
    site: Option<&String>,
    headers: Headers<'_>,
) -> Choice {
    if method == "OPTIONS" && !live.cors.is_empty() && is_preflight(live, path, site, headers) {
        return Choice::Preflight;
    }
    // Sent once: a type sent twice is no type (the backend's framework
    // might read either).
    let content_type = match headers {
        Headers::Unread => None,
        Headers::Read(h) => {
            let mut all = h.get_all(header::CONTENT_TYPE).iter();
            match (all.next(), all.next()) {
                (Some(v), None) => v.to_str().ok(),
                _ => None,
            }
        }
    };
    let takes_type = |r: &Compiled| match (&r.content_type, headers) {
        (None, _) | (Some(_), Headers::Unread) => true,
        (Some(t), Headers::Read(_)) => t.takes(content_type),
    };
    let find = |p: &str| {
        live.list.iter().position(|r| {
            r.matcher.matches(method, p)
                && r.host.as_ref().is_none_or(|h| site == Some(h))
                && takes_type(r)
        })
    };
    // No route, or one that only routes (`ANY /api/{*rest}`): another
    // spelling of a guarded route listed before it must not pass by it.
    let unguarded = |at: Option<usize>| at.is_none_or(|i| !live.list[i].guarded);
    // A format suffix the back end drops (`/payments.json`) is the route
    // too, keyed as its spelling without it: the route that spelling
    // takes, when it is guarded or when nothing took the suffixed one.
    let mut keyed = None;
    let mut found_at = find(path);
    if unguarded(found_at)
        && let Some(plain) = without_format_suffix(path)
    {
        let plain_at = find(&plain);
        if !unguarded(plain_at) || (found_at.is_none() && plain_at.is_some()) {
            found_at = plain_at;
            keyed = Some(plain);
        }
    }
    if unguarded(found_at) {
        let before = found_at.unwrap_or(live.list.len());
        if let Some(why) = other_spelling(live, before, site, method, path, sent) {
            return Choice::Refused(why);
        }
    }
    match found_at {
        Some(at) => Choice::Route { at, keyed },
        None => Choice::Passthrough,
    }
}

/// Whether an `OPTIONS` on `path` is a preflight for a route of `site`:
/// from a listed origin, for the method it asks (`Access-Control-Request-
/// Method`). Unread (the lane): whether a route of `site` has this path,
/// whatever its method.
fn is_preflight(live: &Routes, path: &str, site: Option<&String>, headers: Headers<'_>) -> bool {
    let ours = |r: &&Compiled| r.host.as_ref().is_none_or(|h| site == Some(h));
    match headers {
        Headers::Unread => live
            .list
            .iter()
            .filter(ours)
            .any(|r| r.matcher.matches_path(path)),
        Headers::Read(h) => {
            let asked = h
                .get(header::ACCESS_CONTROL_REQUEST_METHOD)
                .and_then(|m| m.to_str().ok());
            match asked {
                Some(asked) if cors::listed(&live.cors, h.get(header::ORIGIN)).is_some() => live
                    .list
                    .iter()
                    .filter(ours)
                    .any(|r| r.matcher.matches(asked, path)),
                _ => false,
            }
        }
    }
}

/// Why a path that matches no route is refused: a spelling that a back
/// end would take for a route's path, and so run unguarded. An encoded
/// slash (`%2F`) that decodes onto a route (Flask and Express decode it;
/// Envoy can be told to refuse these too), or a path that is a route's in
/// another case (a back end that folds case serves it as the route).
fn other_spelling(
    live: &Routes,
    before: usize,
    site: Option<&String>,
    method: &str,
    path: &str,
    sent: &str,
) -> Option<&'static str> {
    const SLASH: &str = "The path has an encoded slash (%2F) or a backslash (\\ or %5C) that a back end reads as a slash onto a guarded route: refused, as it would reach the route unguarded.";
    const CASE: &str = "The path is a guarded route's in another case: refused, as a back end that folds case would run it unguarded. Use the route's own spelling.";
    // The guarded routes of this request's site listed before `before`
    // (the route that took the request, if any: one after it is not
    // reached by any spelling): another site's route is not this
    // request's to pass by.
    let guarded = || {
        live.list
            .iter()
            .take(before)
            .filter(|r| r.guarded && r.host.as_ref().is_none_or(|h| site == Some(h)))
    };
    let folded = |p: &str| guarded().any(|r| r.matcher.matches_ignoring_case(method, p));
    // The common case, a path that is no route's in any spelling, costs no
    // allocation: one look per route, and the rest only for a path with a
    // suffix or an encoded slash.
    if folded(path) {
        return Some(CASE);
    }
    if let Some(plain) = without_format_suffix(path)
        && folded(&plain)
    {
        return Some(CASE);
    }
    // From the path as sent: a back end resolves `..` after it has read
    // a backslash as a slash (`/payments\x/..` is its `/payments/`).
    let decoded = with_slashes_decoded(sent)?;
    let plain = without_format_suffix(&decoded);
    for p in std::iter::once(decoded.as_str()).chain(plain.as_deref()) {
        if guarded().any(|r| r.matcher.matches(method, p)) {
            return Some(SLASH);
        }
        if folded(p) {
            return Some(CASE);
        }
    }
    None
}
