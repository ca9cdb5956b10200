//! A refusal as a page a browser shows: when a browser's navigation (a
//! form's POST, a link) meets a refusal of the gateway or its guards, a
//! page of problem+json is a wall of text; this is a small HTML page with
//! the same status and headers instead, or the operator's `error_page`.
//!
//! | request's `Accept` | a refusal is |
//! |---|---|
//! | prefers `text/html` to `application/json` (a browser's navigation: `text/html,...,*/*;q=0.8`) | this page, `text/html` |
//! | `*/*`, `application/json`, none, `text/html` no higher than JSON | problem+json, as ever |
//!
//! The page says what happened (the problem's title and detail) and
//! links back: to the `Referer` when it is the same origin as the request
//! (the form the refusal came from), else to `/`. Every value put in it
//! is HTML-escaped.

use std::borrow::Cow;

/// The gateway's own page, with the placeholders an `error_page` may use.
const DEFAULT_PAGE: &str = r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{status} {title}</title>
<style>body{font-family:system-ui,sans-serif;max-width:36rem;margin:4rem auto;padding:0 1rem;line-height:1.5;color:#222}small{color:#666}</style>
</head>
<body>
<h1>{title}</h1>
<p>{detail}</p>
<p><a href="{back}">Go back</a></p>
<p><small>{status} &middot; {code}</small></p>
</body>
</html>
"#;

/// Whether a client whose `Accept` is `accept` prefers `text/html` to
/// JSON: the quality of `text/html` (its most specific range: `text/html`,
/// else `text/*`, else `*/*`) above that of `application/json` and
/// `application/problem+json`. A range whose `q` does not parse is left
/// out.
pub(crate) fn prefers_html(accept: &str) -> bool {
    let html = quality(accept, "text", "html");
    let json =
        quality(accept, "application", "json").max(quality(accept, "application", "problem+json"));
    html > json
}

/// The quality `accept` gives `kind/sub`, in thousandths: that of its
/// most specific range (RFC 9110 §12.5.1), 0 when none names it.
fn quality(accept: &str, kind: &str, sub: &str) -> u16 {
    let mut best: Option<(u8, u16)> = None;
    for item in accept.split(',') {
        let mut parts = item.split(';');
        let range = parts.next().unwrap_or_default().trim();
        let Some((k, s)) = range.split_once('/') else {
            continue;
        };
        let specific = match (k.trim(), s.trim()) {
            (k, s) if k.eq_ignore_ascii_case(kind) && s.eq_ignore_ascii_case(sub) => 2,
            (k, "*") if k.eq_ignore_ascii_case(kind) => 1,
            ("*", "*") => 0,
            _ => continue,
        };
        let mut q = Some(1000);
        for p in parts {
            if let Some((name, value)) = p.split_once('=')
                && name.trim().eq_ignore_ascii_case("q")
            {
                q = thousandths(value.trim());
            }
        }
        let Some(q) = q else { continue };
        if best.is_none_or(|(s, bq)| specific > s || (specific == s && q > bq)) {
            best = Some((specific, q));
        }
    }
    best.map_or(0, |(_, q)| q)
}

/// A `q` value (`0`, `0.8`, `1.000`) in thousandths; `None` when it is
/// not one.
fn thousandths(q: &str) -> Option<u16> {
    let (int, frac) = q.split_once('.').unwrap_or((q, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let whole = match int {
        "0" => 0,
        "1" if frac.bytes().all(|b| b == b'0') => 1000,
        _ => return None,
    };
    let mut milli = 0u16;
    for (i, b) in frac.bytes().enumerate() {
        milli += u16::from(b - b'0') * [100, 10, 1][i];
    }
    Some(whole + milli)
}

/// Where the page links back to: the `Referer` when it is the request's
/// own origin (its scheme, `https` when `secure`, and its `authority`,
/// the `Host`), else `/`: never a page of another site.
pub(crate) fn back_link<'a>(
    referer: Option<&'a str>,
    authority: Option<&str>,
    secure: bool,
) -> &'a str {
    let scheme = if secure { "https://" } else { "http://" };
    let same = referer.zip(authority).is_some_and(|(r, a)| {
        let Some(rest) = r
            .get(..scheme.len())
            .filter(|s| s.eq_ignore_ascii_case(scheme))
            .map(|_| &r[scheme.len()..])
        else {
            return false;
        };
        let theirs = rest.split(['/', '?', '#']).next().unwrap_or_default();
        !a.is_empty() && theirs.eq_ignore_ascii_case(a)
    });
    match referer {
        Some(r) if same => r,
        _ => "/",
    }
}

/// What a page says: the answer's status and its problem's members, and
/// the link back.
pub(crate) struct Refusal<'a> {
    pub(crate) status: u16,
    pub(crate) title: &'a str,
    pub(crate) detail: &'a str,
    pub(crate) code: &'a str,
    pub(crate) back: &'a str,
}

/// `template` (the operator's `error_page`, else the gateway's own) with
/// each placeholder (`{status}`, `{title}`, `{detail}`, `{code}`,
/// `{back}`) replaced by its value, HTML-escaped. One pass: a value that
/// holds a placeholder's name is text, never filled again.
pub(crate) fn render(template: Option<&str>, refusal: &Refusal<'_>) -> String {
    let template = template.unwrap_or(DEFAULT_PAGE);
    let status = refusal.status.to_string();
    let values: [(&str, &str); 5] = [
        ("{status}", &status),
        ("{title}", refusal.title),
        ("{detail}", refusal.detail),
        ("{code}", refusal.code),
        ("{back}", refusal.back),
    ];
    let mut out = String::with_capacity(template.len() + refusal.detail.len());
    let mut rest = template;
    while let Some(at) = rest.find('{') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        match values.iter().find(|(name, _)| rest.starts_with(name)) {
            Some((name, value)) => {
                out.push_str(&escape(value));
                rest = &rest[name.len()..];
            }
            None => {
                out.push('{');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// `s` with `&`, `<`, `>`, `"` and `'` escaped: text and attribute
/// values alike.
fn escape(s: &str) -> Cow<'_, str> {
    if !s.contains(['&', '<', '>', '"', '\'']) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_browser_navigation_prefers_html_and_an_api_client_does_not() {
        for accept in [
            // Chromium's and Firefox's navigations, Safari's.
            "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,image/apng,*/*;q=0.8,application/signed-exchange;v=b3;q=0.7",
            "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
            "text/html",
            "TEXT/HTML;q=1.0, application/json;q=0.5",
            "text/*, */*;q=0.1",
        ] {
            assert!(prefers_html(accept), "{accept}");
        }
        for accept in [
            "*/*",
            "",
            "application/json",
            "application/problem+json, text/html;q=0.9",
            "text/html, application/json",
            "text/html, */*",
            "text/html;q=0, */*;q=0.5",
            "text/html;q=2, application/json;q=0.1",
            "text/html;q=abc",
            "text/plain",
        ] {
            assert!(!prefers_html(accept), "{accept}");
        }
    }

    #[test]
    fn q_values_are_read_to_the_thousandth() {
        assert_eq!(thousandths("0.8"), Some(800));
        assert_eq!(thousandths("1"), Some(1000));
        assert_eq!(thousandths("1.000"), Some(1000));
        assert_eq!(thousandths("0.001"), Some(1));
        assert_eq!(thousandths("0"), Some(0));
        for bad in ["1.5", "0.0001", "-1", "", ".5", "2", "0.x"] {
            assert_eq!(thousandths(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_link_back_is_the_same_origin_referer_or_the_root() {
        let form = "http://shop.example:8080/cart?x=1";
        assert_eq!(
            back_link(Some(form), Some("shop.example:8080"), false),
            form
        );
        assert_eq!(
            back_link(Some(form), Some("Shop.Example:8080"), false),
            form
        );
        assert_eq!(back_link(Some(form), Some("shop.example:8080"), true), "/");
        assert_eq!(back_link(Some(form), Some("shop.example"), false), "/");
        assert_eq!(
            back_link(Some("https://evil.example/"), Some("shop.example"), true),
            "/"
        );
        assert_eq!(
            back_link(Some("javascript:alert(1)"), Some("shop.example"), false),
            "/"
        );
        assert_eq!(back_link(None, Some("shop.example"), false), "/");
        assert_eq!(back_link(Some(form), None, false), "/");
    }

    #[test]
    fn a_page_fills_its_placeholders_escaped_and_once() {
        let refusal = Refusal {
            status: 409,
            title: "Duplicate <submission>",
            detail: "a \"quoted\" & {back} 'detail'",
            code: "duplicate_submission",
            back: "http://shop.example/form?a=1&b=2",
        };
        let page = render(None, &refusal);
        assert!(
            page.contains("<title>409 Duplicate &lt;submission&gt;</title>"),
            "{page}"
        );
        assert!(
            page.contains("<p>a &quot;quoted&quot; &amp; {back} &#39;detail&#39;</p>"),
            "{page}"
        );
        assert!(
            page.contains(r#"<a href="http://shop.example/form?a=1&amp;b=2">"#),
            "{page}"
        );
        let own = render(Some("<b>{status}</b>{title}{nope}{"), &refusal);
        assert_eq!(own, "<b>409</b>Duplicate &lt;submission&gt;{nope}{");
    }
}
