//! Bearer JWTs for `identity.jwt`: the keys that verify them (an HS256
//! secret, or RS256 and ES256 public keys from a PEM or JWKS file) and the
//! one check of a token (signature, `exp` and `nbf` with a small leeway,
//! `iss` and `aud` when the file names them). A token is read only once
//! its signature verifies: no claim of an unverified token is ever used.
//!
//! The verification is the `jsonwebtoken` crate's (RustCrypto backend):
//! its `Algorithm` has no `none`, so an unsigned token never parses, and a
//! key verifies only its own family (an RSA key is never taken for an HMAC
//! secret).

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation, errors::ErrorKind};
use serde_json::{Map, Value};
use std::path::Path;

/// How far past `exp` (and before `nbf`) a token is still taken, for the
/// clocks of the issuer and the gateway that differ.
pub(crate) const LEEWAY_SECS: u64 = 30;

/// The longest bearer token read (longer is malformed).
const MAX_TOKEN: usize = 8192;

/// One verifying key.
struct Key {
    kid: Option<String>,
    alg: Algorithm,
    key: DecodingKey,
}

/// The keys of one `identity.jwt`.
pub(crate) struct KeySet(Vec<Key>);

impl std::fmt::Debug for KeySet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kids: Vec<_> = self
            .0
            .iter()
            .map(|k| (k.alg, k.kid.as_deref().unwrap_or("-")))
            .collect();
        write!(f, "KeySet({kids:?})")
    }
}

/// Why a token was not taken.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// It names a key (`kid`) the set does not hold: the file may have
    /// changed since it was read.
    UnknownKey,
    /// Malformed, unsigned, badly signed, expired, not yet valid, for
    /// another issuer or audience.
    Invalid,
}

/// What a token must also carry, beyond a good signature and `exp`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Rules {
    pub(crate) issuer: Option<String>,
    pub(crate) audiences: Vec<String>,
}

/// Selects the RustCrypto provider for this process once, so a second
/// backend turned on elsewhere in the build cannot leave `jsonwebtoken`
/// without one.
fn provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = jsonwebtoken::crypto::rust_crypto::DEFAULT_PROVIDER.install_default();
    });
}

impl KeySet {
    /// An HS256 secret.
    pub(crate) fn secret(secret: &[u8]) -> Result<Self, String> {
        let key = DecodingKey::from_secret(secret).map_err(|e| format!("HS256 secret: {e}"))?;
        Ok(Self(vec![Key {
            kid: None,
            alg: Algorithm::HS256,
            key,
        }]))
    }

    /// The public keys of the file at `path`.
    pub(crate) fn read(path: &Path) -> Result<Self, String> {
        let bytes =
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Self::parse(&bytes).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// RS256 and ES256 public keys from PEM blocks (`PUBLIC KEY`, `RSA
    /// PUBLIC KEY`) or a JWKS (`{"keys": [...]}`).
    pub(crate) fn parse(bytes: &[u8]) -> Result<Self, String> {
        let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
        if first == Some(&b'{') {
            return Self::jwks(bytes);
        }
        let text = std::str::from_utf8(bytes).map_err(|_| "neither PEM nor JWKS JSON")?;
        let mut keys = Vec::new();
        let mut rest = text;
        while let Some(start) = rest.find("-----BEGIN ") {
            let block = &rest[start..];
            let label_end = block[11..]
                .find("-----")
                .ok_or("a PEM block without its end")?
                + 11;
            let label = &block[11..label_end];
            let end_marker = format!("-----END {label}-----");
            let end = block
                .find(&end_marker)
                .ok_or_else(|| format!("a {label} block without its END line"))?
                + end_marker.len();
            keys.push(pem_key(label, &block.as_bytes()[..end])?);
            rest = &block[end..];
        }
        if keys.is_empty() {
            return Err(
                "neither PEM (-----BEGIN PUBLIC KEY-----) nor JWKS JSON ({\"keys\": [...]})".into(),
            );
        }
        Ok(Self(keys))
    }

    fn jwks(bytes: &[u8]) -> Result<Self, String> {
        let set: JwkSet = serde_json::from_slice(bytes).map_err(|e| format!("not a JWKS: {e}"))?;
        let mut keys = Vec::new();
        let mut skipped = Vec::new();
        for (i, jwk) in set.keys.iter().enumerate() {
            let name = jwk
                .common
                .key_id
                .clone()
                .unwrap_or_else(|| format!("keys[{i}]"));
            if jwk.common.public_key_use == Some(PublicKeyUse::Encryption) {
                skipped.push(format!("{name}: use enc"));
                continue;
            }
            let given = jwk.common.key_algorithm;
            let alg = match (&jwk.algorithm, given) {
                (AlgorithmParameters::RSA(_), None | Some(KeyAlgorithm::RS256)) => Algorithm::RS256,
                (AlgorithmParameters::EllipticCurve(ec), None | Some(KeyAlgorithm::ES256))
                    if ec.curve == EllipticCurve::P256 =>
                {
                    Algorithm::ES256
                }
                (_, Some(a)) => {
                    skipped.push(format!("{name}: alg {a}"));
                    continue;
                }
                (other, None) => {
                    skipped.push(format!("{name}: {}", kind(other)));
                    continue;
                }
            };
            match DecodingKey::from_jwk(jwk) {
                Ok(key) => keys.push(Key {
                    kid: jwk.common.key_id.clone(),
                    alg,
                    key,
                }),
                Err(e) => skipped.push(format!("{name}: {e}")),
            }
        }
        if keys.is_empty() {
            return Err(format!(
                "no RS256 or ES256 (P-256) key among its {} keys{}",
                set.keys.len(),
                if skipped.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", skipped.join("; "))
                }
            ));
        }
        Ok(Self(keys))
    }

    /// The claims of `token` once it verifies against one of the keys.
    pub(crate) fn verify(&self, token: &str, rules: &Rules) -> Result<Map<String, Value>, Refused> {
        provider();
        if token.len() > MAX_TOKEN {
            return Err(Refused::Invalid);
        }
        let header = jsonwebtoken::decode_header(token).map_err(|_| Refused::Invalid)?;
        let same_alg = || self.0.iter().filter(|k| k.alg == header.alg);
        // A token that names its key is verified by that key alone (or by
        // the keys without a name, a PEM file's).
        let named: Vec<&Key> = match &header.kid {
            Some(kid) if same_alg().any(|k| k.kid.as_ref() == Some(kid)) => {
                same_alg().filter(|k| k.kid.as_ref() == Some(kid)).collect()
            }
            Some(_) => same_alg().filter(|k| k.kid.is_none()).collect(),
            None => same_alg().collect(),
        };
        if named.is_empty() {
            return Err(if header.kid.is_some() {
                Refused::UnknownKey
            } else {
                Refused::Invalid
            });
        }
        let mut validation = Validation::new(header.alg);
        validation.leeway = LEEWAY_SECS;
        validation.validate_nbf = true;
        if rules.audiences.is_empty() {
            validation.validate_aud = false;
        } else {
            validation.set_audience(&rules.audiences);
        }
        if let Some(iss) = &rules.issuer {
            validation.set_issuer(&[iss]);
        }
        for key in named {
            match jsonwebtoken::decode::<Map<String, Value>>(token, &key.key, &validation) {
                Ok(data) => return Ok(data.claims),
                // Another key of the set may have signed it.
                Err(e) if matches!(e.kind(), ErrorKind::InvalidSignature) => {}
                Err(_) => return Err(Refused::Invalid),
            }
        }
        Err(Refused::Invalid)
    }
}

/// One PEM block's key.
fn pem_key(label: &str, block: &[u8]) -> Result<Key, String> {
    match label {
        "PUBLIC KEY" | "RSA PUBLIC KEY" => {}
        l if l.contains("PRIVATE") => {
            return Err(format!(
                "a {l}: give the public key (openssl pkey -in KEY -pubout), never the private one"
            ));
        }
        "CERTIFICATE" => {
            return Err(
                "a CERTIFICATE: give its public key (openssl x509 -in CERT -pubkey -noout)".into(),
            );
        }
        l => return Err(format!("a {l} block; expected PUBLIC KEY")),
    }
    if let Ok(key) = DecodingKey::from_rsa_pem(block) {
        return Ok(Key {
            kid: None,
            alg: Algorithm::RS256,
            key,
        });
    }
    let key = DecodingKey::from_ec_pem(block)
        .map_err(|_| format!("a {label} that is neither RSA nor EC (RS256, ES256)"))?;
    // The key's point (SEC1): a P-256 one is 65 bytes uncompressed, 33
    // compressed; P-384's and P-521's are longer.
    let point = key.try_get_as_bytes().unwrap_or_default();
    let p256 = matches!(
        (point.len(), point.first()),
        (65, Some(4)) | (33, Some(2 | 3))
    );
    if !p256 {
        return Err(
            "an EC key that is not on P-256: ES256 is supported, ES384 and ES512 are not".into(),
        );
    }
    Ok(Key {
        kid: None,
        alg: Algorithm::ES256,
        key,
    })
}

fn kind(p: &AlgorithmParameters) -> &'static str {
    match p {
        AlgorithmParameters::EllipticCurve(_) => "an EC key not on P-256",
        AlgorithmParameters::RSA(_) => "an RSA key",
        AlgorithmParameters::OctetKey(_) => "a secret (oct) key",
        AlgorithmParameters::OctetKeyPair(_) => "an OKP (EdDSA) key",
        _ => "a key of another type",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/files/jwt/");

    fn file(name: &str) -> Vec<u8> {
        std::fs::read(format!("{FILES}{name}")).unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    fn now() -> u64 {
        jsonwebtoken::get_current_timestamp()
    }

    fn sign(alg: Algorithm, kid: Option<&str>, key: &[u8], claims: &Value) -> String {
        let mut header = jsonwebtoken::Header::new(alg);
        header.kid = kid.map(str::to_owned);
        let key = match alg {
            Algorithm::HS256 => jsonwebtoken::EncodingKey::from_secret(key),
            Algorithm::RS256 => jsonwebtoken::EncodingKey::from_rsa_pem(key),
            _ => jsonwebtoken::EncodingKey::from_ec_pem(key),
        }
        .unwrap();
        jsonwebtoken::encode(&header, claims, &key).unwrap()
    }

    #[test]
    fn a_pem_and_a_jwks_file_verify_their_own_keys_only() {
        provider();
        let claims = serde_json::json!({"sub": "u1", "exp": now() + 60});
        let es = sign(Algorithm::ES256, None, &file("ec1.key"), &claims);
        let rs = sign(Algorithm::RS256, Some("rsa-1"), &file("rsa1.key"), &claims);
        let rules = Rules::default();
        let ec_pem = KeySet::parse(&file("ec1.pub.pem")).unwrap();
        assert_eq!(ec_pem.verify(&es, &rules).unwrap()["sub"], "u1");
        assert_eq!(ec_pem.verify(&rs, &rules), Err(Refused::UnknownKey));
        let jwks = KeySet::parse(&file("jwks.json")).unwrap();
        assert_eq!(jwks.0.len(), 2, "the Ed25519 key is left out: {jwks:?}");
        assert!(jwks.verify(&es, &rules).is_ok());
        assert!(jwks.verify(&rs, &rules).is_ok());
        let other = sign(Algorithm::ES256, Some("ec-1"), &file("ec2.key"), &claims);
        assert_eq!(jwks.verify(&other, &rules), Err(Refused::Invalid));
        let both = [file("rsa1.pub.pem"), file("ec2.pub.pem")].concat();
        assert_eq!(KeySet::parse(&both).unwrap().0.len(), 2);
    }

    #[test]
    fn expired_unsigned_and_foreign_tokens_are_refused() {
        provider();
        let keys = KeySet::secret(&[7; 32]).unwrap();
        let rules = Rules {
            issuer: Some("https://id.example".into()),
            audiences: vec!["shop".into()],
        };
        let good = serde_json::json!({"sub": "u1", "exp": now() + 60, "iss": "https://id.example", "aud": "shop"});
        let ok = sign(Algorithm::HS256, None, &[7; 32], &good);
        assert_eq!(keys.verify(&ok, &rules).unwrap()["sub"], "u1");
        let mut expired = good.clone();
        expired["exp"] = (now() - LEEWAY_SECS - 60).into();
        let mut early = good.clone();
        early["nbf"] = (now() + LEEWAY_SECS + 60).into();
        let mut foreign = good.clone();
        foreign["aud"] = "bank".into();
        let mut no_exp = good.clone();
        no_exp.as_object_mut().unwrap().remove("exp");
        for claims in [expired, early, foreign, no_exp] {
            let t = sign(Algorithm::HS256, None, &[7; 32], &claims);
            assert_eq!(keys.verify(&t, &rules), Err(Refused::Invalid), "{claims}");
        }
        let wrong = sign(Algorithm::HS256, None, &[8; 32], &good);
        assert_eq!(keys.verify(&wrong, &rules), Err(Refused::Invalid));
        // alg none: the claims of `ok`, no signature.
        let payload = ok.split('.').nth(1).unwrap();
        let none = format!("eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.{payload}.");
        assert_eq!(keys.verify(&none, &rules), Err(Refused::Invalid));
        assert_eq!(keys.verify("not.a.jwt", &rules), Err(Refused::Invalid));
    }

    #[test]
    fn a_file_without_a_usable_public_key_says_why() {
        let why = |bytes: &[u8]| KeySet::parse(bytes).unwrap_err();
        assert!(why(&file("ec1.key")).contains("give the public key"));
        assert!(why(b"hello").contains("neither PEM"));
        assert!(why(br#"{"keys": []}"#).contains("no RS256 or ES256"));
        let okp = br#"{"keys": [{"kty":"OKP","kid":"e","crv":"Ed25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}]}"#;
        assert!(why(okp).contains("e: an OKP"), "{}", why(okp));
        assert!(why(b"{").contains("not a JWKS"));
    }
}
