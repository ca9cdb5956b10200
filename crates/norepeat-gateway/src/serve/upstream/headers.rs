//! What the gateway makes of a request's headers on its way upstream:
//! hop-by-hop headers dropped both ways (RFC 9110 §7.6.1), the
//! `X-Forwarded-*` and `Forwarded` headers added, `Host` kept.

use crate::serve::http1::{HOP_BY_HOP, hop_by_hop_index};
use http::{HeaderMap, HeaderName, HeaderValue, header};
use std::net::IpAddr;

/// `X-Forwarded-For`, `X-Forwarded-Host`, `X-Forwarded-Proto`.
pub(crate) const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub(crate) const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
pub(crate) const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// Drops the hop-by-hop headers: the fixed ones, and every header that
/// `Connection` names.
///
/// ```
/// use http::HeaderMap;
/// let mut h = HeaderMap::new();
/// h.insert("connection", "close, x-secret".parse().unwrap());
/// h.insert("x-secret", "1".parse().unwrap());
/// h.insert("keep-alive", "timeout=5".parse().unwrap());
/// h.insert("x-kept", "1".parse().unwrap());
/// norepeat_gateway::serve::strip_hop_by_hop(&mut h);
/// assert_eq!(h.len(), 1);
/// assert!(h.contains_key("x-kept"));
/// ```
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // One pass over the few names a request or an answer has: which of
    // the fixed ones are there (a removal hashes its name even when it
    // finds nothing).
    let mut present = [false; HOP_BY_HOP.len()];
    let mut any = false;
    for name in headers.keys() {
        if let Some(i) = hop_by_hop_index(name.as_str()) {
            present[i] = true;
            any = true;
        }
    }
    // The common request and answer: none.
    if !any {
        return;
    }
    if present[0] {
        // The names `Connection` lists, but for the fixed ones (removed
        // below) and `close`, an option rather than a name unless a
        // header is called so: `Connection: keep-alive` and `close`, the
        // common values, parse nothing.
        let mut named: Vec<HeaderName> = Vec::new();
        for token in headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|s| s.split(','))
            .map(str::trim)
        {
            let fixed = HOP_BY_HOP
                .iter()
                .any(|h| h.as_str().eq_ignore_ascii_case(token));
            if fixed || (token.eq_ignore_ascii_case("close") && !headers.contains_key("close")) {
                continue;
            }
            if let Ok(n) = HeaderName::from_bytes(token.as_bytes()) {
                named.push(n);
            }
        }
        for n in named {
            headers.remove(n);
        }
    }
    for (name, here) in HOP_BY_HOP.iter().zip(present) {
        if here {
            headers.remove(name);
        }
    }
}

/// Adds `X-Forwarded-For` (appended to the client's), `X-Forwarded-Proto`,
/// `X-Forwarded-Host` and `Forwarded` (appended), for a request from `peer`.
pub(super) fn add_forwarded(
    headers: &mut HeaderMap,
    peer: Option<IpAddr>,
    host: Option<HeaderValue>,
    proto: &'static str,
) {
    let Some(peer) = peer else { return };
    // Written into buffers of their own, not through `format!`: this runs
    // on every request, and the formatting machinery was 2 % of the
    // guarded route's CPU (BENCHMARKS.md, issue 39).
    let mut ip = [0u8; 64];
    let ip = ip_text(peer, &mut ip);
    let mut xff = Vec::with_capacity(ip.len());
    for earlier in headers.get_all(&X_FORWARDED_FOR) {
        xff.extend_from_slice(earlier.as_bytes());
        xff.extend_from_slice(b", ");
    }
    xff.extend_from_slice(ip);
    if let Ok(v) = HeaderValue::from_maybe_shared(bytes::Bytes::from(xff)) {
        headers.insert(X_FORWARDED_FOR, v);
    }
    headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static(proto));
    let mut forwarded = Vec::with_capacity(64);
    let named = host
        .as_ref()
        .filter(|h| h.to_str().is_ok())
        .map(HeaderValue::as_bytes);
    forwarded_element(&mut forwarded, peer, ip, proto, named);
    if let Some(host) = host {
        headers.insert(X_FORWARDED_HOST, host);
    }
    if let Ok(v) = HeaderValue::from_maybe_shared(bytes::Bytes::from(forwarded)) {
        headers.append(header::FORWARDED, v);
    }
}

/// What the gateway makes of a request's headers on its way upstream:
/// the hop-by-hop ones dropped, `Host` as the client sent it (else the
/// upstream's authority), and for a request from `peer` the forwarding
/// headers ([`add_forwarded`]). Applied to the `HeaderMap` for hyper's
/// client ([`Forwarding::apply`]), or written with the head by hand
/// ([`Forwarding::write`], `upstream/exchange.rs`): the same lines, without the map's
/// removals and insertions (5 % of a guarded request's instructions).
pub(crate) struct Forwarding {
    pub(super) peer: Option<IpAddr>,
    /// The target's authority, else the client's `Host`.
    pub(super) host: Option<HeaderValue>,
    /// The upstream's, for a request without either.
    pub(super) authority: http::uri::Authority,
    pub(super) proto: &'static str,
}

impl Forwarding {
    /// Edits `headers` to what the upstream gets.
    pub(super) fn apply(&self, headers: &mut HeaderMap) {
        strip_hop_by_hop(headers);
        add_forwarded(headers, self.peer, self.host.clone(), self.proto);
        match &self.host {
            Some(h) => {
                headers.insert(header::HOST, h.clone());
            }
            // An HTTP/1.0 request may come without one; HTTP/1.1 needs it.
            None => {
                if let Ok(h) = HeaderValue::from_str(self.authority.as_str()) {
                    headers.insert(header::HOST, h);
                }
            }
        }
    }

    /// Writes the lines `headers` would have after [`Forwarding::apply`]
    /// into `out`, but `Content-Length` (the body's own is written).
    /// `headers` is edited only when its `Connection` may name others.
    pub(crate) fn write(&self, headers: &mut HeaderMap, out: &mut Vec<u8>) {
        if headers.contains_key(header::CONNECTION) {
            // The names it lists go too: the map's way (not the common
            // request: `Connection` is HTTP/1's, and `keep-alive` its
            // default).
            strip_hop_by_hop(headers);
        }
        let forwarded = self.peer.is_some();
        // Whether the request carries an `X-Forwarded-For` (a trusted
        // proxy's), seen on the way: the common request has none, and a
        // lookup hashes the name even when it finds nothing.
        let mut earlier = false;
        for (name, value) in headers.iter() {
            let forwarded_for = forwarded && name == X_FORWARDED_FOR;
            earlier |= forwarded_for;
            let replaced = forwarded_for
                || name == header::CONTENT_LENGTH
                || name == header::HOST
                || hop_by_hop_index(name.as_str()).is_some()
                || (forwarded
                    && (name == X_FORWARDED_PROTO
                        || (self.host.is_some() && name == X_FORWARDED_HOST)));
            if !replaced {
                crate::serve::http1::header(out, name.as_str().as_bytes(), value.as_bytes());
            }
        }
        let host = self
            .host
            .as_ref()
            .map_or(self.authority.as_str().as_bytes(), HeaderValue::as_bytes);
        crate::serve::http1::header(out, b"host", host);
        let Some(peer) = self.peer else { return };
        let mut ip = [0u8; 64];
        let ip = ip_text(peer, &mut ip);
        out.extend_from_slice(b"x-forwarded-for: ");
        if earlier {
            for earlier in headers.get_all(X_FORWARDED_FOR) {
                out.extend_from_slice(earlier.as_bytes());
                out.extend_from_slice(b", ");
            }
        }
        out.extend_from_slice(ip);
        out.extend_from_slice(b"\r\n");
        crate::serve::http1::header(out, b"x-forwarded-proto", self.proto.as_bytes());
        if let Some(h) = &self.host {
            crate::serve::http1::header(out, b"x-forwarded-host", h.as_bytes());
        }
        out.extend_from_slice(b"forwarded: ");
        let named = self
            .host
            .as_ref()
            .filter(|h| h.to_str().is_ok())
            .map(HeaderValue::as_bytes);
        forwarded_element(out, peer, ip, self.proto, named);
        out.extend_from_slice(b"\r\n");
    }
}

/// The `Forwarded` element (RFC 7239) of a request from `peer` (its
/// address as text in `ip`) over `proto`: `for=...;proto=...`, and
/// `;host="..."` for a `host` without a quote in it.
pub(crate) fn forwarded_element(
    out: &mut Vec<u8>,
    peer: IpAddr,
    ip: &[u8],
    proto: &str,
    host: Option<&[u8]>,
) {
    out.extend_from_slice(b"for=");
    match peer {
        IpAddr::V4(_) => out.extend_from_slice(ip),
        IpAddr::V6(_) => {
            out.extend_from_slice(b"\"[");
            out.extend_from_slice(ip);
            out.extend_from_slice(b"]\"");
        }
    }
    out.extend_from_slice(b";proto=");
    out.extend_from_slice(proto.as_bytes());
    if let Some(host) = host.filter(|h| !h.contains(&b'"')) {
        out.extend_from_slice(b";host=\"");
        out.extend_from_slice(host);
        out.push(b'"');
    }
}

/// `ip` as text in `buf`: an IPv4 address's digits written by hand, an
/// IPv6 one (at most 45 characters) by its `Display`.
pub(crate) fn ip_text(ip: IpAddr, buf: &mut [u8; 64]) -> &[u8] {
    match ip {
        IpAddr::V4(v4) => {
            let mut n = 0;
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    buf[n] = b'.';
                    n += 1;
                }
                let mut digits = itoa::Buffer::new();
                let d = digits.format(octet).as_bytes();
                buf[n..n + d.len()].copy_from_slice(d);
                n += d.len();
            }
            &buf[..n]
        }
        IpAddr::V6(_) => {
            use std::io::Write;
            let mut cursor = std::io::Cursor::new(&mut buf[..]);
            let _ = write!(cursor, "{ip}");
            let n = usize::try_from(cursor.position()).unwrap_or(0);
            &buf[..n]
        }
    }
}
