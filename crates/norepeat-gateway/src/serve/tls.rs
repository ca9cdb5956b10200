//! TLS on the listener (`tls: { cert, key }`): rustls with HTTP/2 and
//! HTTP/1.1 offered by ALPN, the certificate and key read again when their
//! files change (a new connection gets the new pair; one already open
//! keeps the pair it was made with), and the client side's roots for an
//! `https://` upstream.

use crate::config::{Tls, UpstreamCa, certified_key};
use arc_swap::ArcSwap;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio_rustls::TlsAcceptor;

/// The certificate every new handshake gets: swapped whole on a change.
pub(crate) struct Certs(ArcSwap<CertifiedKey>);

impl std::fmt::Debug for Certs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Certs")
    }
}

impl ResolvesServerCert for Certs {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.load_full())
    }
}

/// The acceptor for `tls`'s files, and the certificate it serves (for
/// [`watch`] to replace).
///
/// # Errors
/// A file cannot be read, is not PEM, or the key is not the certificate's.
pub(crate) fn acceptor(tls: &Tls) -> Result<(TlsAcceptor, Arc<Certs>), String> {
    let key = certified_key(tls).map_err(|(field, e)| format!("{field}: {e}"))?;
    let certs = Arc::new(Certs(ArcSwap::new(key)));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_cert_resolver(Arc::clone(&certs) as Arc<dyn ResolvesServerCert>);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok((TlsAcceptor::from(Arc::new(config)), certs))
}

/// Reads `tls`'s two files again when either changes (polled every
/// 500 ms, read once both have stopped changing, as the configuration
/// file is): a pair that loads and matches replaces the served one; any
/// other is logged and the old pair stays. Counts
/// `norepeat_gateway_tls_reloads_total{result="applied"|"failed"}`.
///
/// Replace the files by writing each beside the old one and renaming it
/// into place; between the two renames the pair does not match, which is
/// logged and then applied once the second lands.
pub(crate) async fn watch(certs: Arc<Certs>, tls: Tls) {
    let stat = crate::serve::files::stat;
    let both = |_: &Path| (stat(&tls.cert), stat(&tls.key));
    let mut seen = both(&tls.cert);
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = both(&tls.cert);
        if now == seen {
            continue;
        }
        seen = crate::serve::files::settled(&tls.cert, now, both).await;
        match certified_key(&tls) {
            Ok(key) => {
                certs.0.store(key);
                metrics::counter!("norepeat_gateway_tls_reloads_total", "result" => "applied")
                    .increment(1);
                tracing::info!(cert = %tls.cert.display(), "TLS certificate reloaded");
            }
            Err((field, e)) => {
                metrics::counter!("norepeat_gateway_tls_reloads_total", "result" => "failed")
                    .increment(1);
                tracing::error!("TLS certificate not reloaded, the old one stays: {field}: {e}");
            }
        }
    }
}

/// The client side of an `https://` upstream: checked against
/// `upstream_ca`'s roots, or the system's; HTTP/1.1 by ALPN.
/// With `https` (an upstream of the file is `https://`), says so when no
/// root is found (a system without its CA certificates installed).
pub(crate) fn client_config(ca: Option<&UpstreamCa>, https: bool) -> Arc<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let roots = UpstreamCa::roots(ca);
    if https && roots.is_empty() {
        tracing::warn!(
            "no root certificate found: every https:// upstream will be refused (install the system's CA certificates, or give upstream_ca)"
        );
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap_or_else(|_| {
            // ring offers both default versions: this cannot fail.
            rustls::ClientConfig::builder()
        });
    Arc::new(builder.with_root_certificates(roots).with_no_client_auth())
}
