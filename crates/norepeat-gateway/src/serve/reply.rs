//! The answer as its client asked for it, the answer phase's last step:
//! what the request said of its client is read before it is routed
//! ([`ForClient::of`]), and its answer shaped by it ([`ForClient::shape`]):
//!
//! - `cors`: a route's answer, and each of the gateway's own refusals,
//!   carries the CORS headers for a listed `Origin` (`cors.rs`);
//! - a refusal (the gateway's or a guard's problem+json) to a browser's
//!   navigation is an HTML page with the same status and headers
//!   (`page.rs`).
//!
//! A request with neither an `Origin` (under `cors`) nor an `Accept` that
//! prefers HTML costs two header lookups.

use crate::config::ErrorPage;
use crate::serve::cors;
use crate::serve::page::{Refusal, back_link, prefers_html, render};
use crate::serve::route::table::Routes;
use crate::serve::upstream::pool::Secure;
use axum::body::Body;
use http::{HeaderValue, Request, Response, header};
use norepeat::problem::Problem;

/// What a request said of how its answer is to be given.
pub(crate) struct ForClient {
    cors: Option<Origin>,
    page: Option<Page>,
}

/// An `Origin` under `cors`.
struct Origin {
    value: HeaderValue,
    /// One of `cors.allow_origins`.
    listed: bool,
}

/// A browser's navigation: what its refusal's page needs.
struct Page {
    referer: Option<HeaderValue>,
    authority: Option<String>,
    secure: bool,
    template: Option<ErrorPage>,
}

impl ForClient {
    /// Reads `req`, before it is routed.
    pub(crate) fn of<B>(live: &Routes, req: &Request<B>) -> Self {
        let h = req.headers();
        let origin = (!live.cors.is_empty())
            .then(|| h.get(header::ORIGIN))
            .flatten();
        let cors = origin.map(|value| Origin {
            listed: cors::listed(&live.cors, Some(value)).is_some(),
            value: value.clone(),
        });
        // An API client's `*/*` or `application/json` names no text type:
        // one scan, and its `q`-values are never read.
        let html = h
            .get(header::ACCEPT)
            .filter(|a| names_text(a.as_bytes()))
            .and_then(|a| a.to_str().ok())
            .is_some_and(prefers_html);
        let page = html.then(|| Page {
            referer: h.get(header::REFERER).cloned(),
            authority: req
                .uri()
                .authority()
                .map(|a| a.as_str().to_owned())
                .or_else(|| {
                    h.get(header::HOST)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned)
                }),
            secure: req.extensions().get::<Secure>().is_some(),
            template: live.error_page.clone(),
        });
        Self { cors, page }
    }

    /// `res` as the client asked for it.
    /// `routed`: a route took the request (its answers are the gateway's
    /// to give CORS headers; an unmatched request's are the backend's), as
    /// the route phase chose it: not chosen again here.
    pub(crate) fn shape(self, mut res: Response<Body>, routed: bool) -> Response<Body> {
        if self.cors.is_none() && self.page.is_none() {
            return res;
        }
        let problem = res.extensions().get::<Problem>().cloned();
        if let Some(o) = &self.cors
            && (routed || problem.is_some())
        {
            if o.listed {
                cors::for_listed(&o.value, res.headers_mut());
            } else {
                cors::vary_origin(res.headers_mut());
            }
        }
        if let (Some(page), Some(problem)) = (&self.page, &problem) {
            let back = back_link(
                page.referer.as_ref().and_then(|r| r.to_str().ok()),
                page.authority.as_deref(),
                page.secure,
            );
            let html = render(
                page.template.as_ref().map(ErrorPage::text),
                &Refusal {
                    status: res.status().as_u16(),
                    title: problem.code.title(),
                    detail: &problem.detail,
                    code: problem.code.as_str(),
                    back,
                },
            );
            let h = res.headers_mut();
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            );
            h.remove(header::CONTENT_LENGTH);
            // The same refusal is JSON to another client: no cache hands
            // one the other's.
            h.append(header::VARY, HeaderValue::from_static("Accept"));
            *res.body_mut() = Body::from(html);
        }
        res
    }
}

/// Whether an `Accept` value names a text type (`text/html`, `text/*`):
/// the only kind a page may be for. With an `Origin` under `cors`, what
/// tells, from the head, that an answer may be shaped here: a reader that
/// writes its own refusals (the lane's pass-through: its 502 and 504)
/// reads such a request's [`ForClient`] too, so that a browser gets one
/// answer on every way in.
pub(crate) fn names_text(accept: &[u8]) -> bool {
    accept.windows(5).any(|w| w.eq_ignore_ascii_case(b"text/"))
}
