//! The certificate files of `tls` and `upstream_ca`: read and checked at
//! parse time (so `check` names a missing, unreadable or invalid one by
//! its field), and read again by the listener when they change.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

/// `tls:`: the listener's certificate chain and private key, PEM files
/// (a relative path is read from the configuration file's folder).
///
/// ```
/// use norepeat_gateway::config::Config;
///
/// // The files are read at parse time: a missing one is a problem named
/// // by its field.
/// let problems = Config::parse("gateway.yaml", b"
/// upstream: http://127.0.0.1:9000
/// tls: { cert: /nonexistent/cert.pem, key: /nonexistent/key.pem }
/// ").unwrap_err();
/// assert!(problems.to_string().contains("tls.cert: cannot read"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Tls {
    /// `cert`: the certificate chain, the server's own first.
    pub cert: PathBuf,
    /// `key`: its private key (PKCS #8, PKCS #1 or SEC1).
    pub key: PathBuf,
}

/// The server's certificate and key from `tls`'s files, checked to belong
/// together. The error names the field at fault (`tls.cert`, `tls.key`).
pub(crate) fn certified_key(tls: &Tls) -> Result<Arc<CertifiedKey>, (&'static str, String)> {
    let cert_pem = read(&tls.cert).map_err(|e| ("tls.cert", e))?;
    let key_pem = read(&tls.key).map_err(|e| ("tls.key", e))?;
    let chain = certificates(&cert_pem).map_err(|e| ("tls.cert", e))?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
        (
            "tls.key",
            format!("{}: no PEM private key in it ({e})", tls.key.display()),
        )
    })?;
    let provider = rustls::crypto::ring::default_provider();
    CertifiedKey::from_der(chain, key, &provider)
        .map(Arc::new)
        .map_err(|e| {
            (
                "tls.key",
                format!(
                    "{} does not go with the certificate in {} ({e})",
                    tls.key.display(),
                    tls.cert.display()
                ),
            )
        })
}

/// `upstream_ca`: the certificate authorities an `https://` upstream is
/// checked against instead of the system's, read from a PEM file at parse
/// time (a change needs a restart).
///
/// ```
/// use norepeat_gateway::config::Config;
///
/// let problems = Config::parse("gateway.yaml", b"
/// upstream: https://127.0.0.1:9443
/// upstream_ca: /nonexistent/ca.pem
/// ").unwrap_err();
/// assert!(problems.to_string().contains("upstream_ca: cannot read"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct UpstreamCa {
    /// The file, as resolved (a relative path from the configuration
    /// file's folder).
    pub path: PathBuf,
    certs: Vec<CertificateDer<'static>>,
}

impl UpstreamCa {
    /// Reads `path`: at least one certificate, every one usable as a root.
    pub(crate) fn load(path: PathBuf) -> Result<Self, String> {
        let certs = certificates(&read(&path)?)?;
        let mut roots = RootCertStore::empty();
        for cert in &certs {
            roots
                .add(cert.clone())
                .map_err(|e| format!("{}: not a CA certificate ({e})", path.display()))?;
        }
        Ok(Self { path, certs })
    }

    /// The roots an upstream's certificate is checked against: this
    /// file's, or the system's for `None`.
    pub(crate) fn roots(ca: Option<&Self>) -> RootCertStore {
        let mut roots = RootCertStore::empty();
        let certs = match ca {
            Some(ca) => ca.certs.clone(),
            None => rustls_native_certs::load_native_certs().certs,
        };
        roots.add_parsable_certificates(certs);
        roots
    }
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// Every `CERTIFICATE` block of a PEM file; at least one.
fn certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not a PEM certificate file ({e})"))?;
    if certs.is_empty() {
        return Err("no PEM certificate (-----BEGIN CERTIFICATE-----) in the file".into());
    }
    Ok(certs)
}
