//! Bearer tokens for the CLI, the SDK and the HTTP API (`tessera token create|issue`).
//!
//! A token is `tsr1.<claims>.<signature>`: the claims (an [`Identity`] and an expiry) as JSON,
//! base64url, signed with the cluster CA's key (ECDSA P-256, SHA-256), offline (`tessera token
//! create --ca`). Or it is `tsr2.<claims>.<certificate>.<signature>`, issued online to an
//! admin who asks a replica (`tessera token issue`, the `IssueToken` RPC): signed with that
//! replica's own key and carrying its certificate, so that the CA key never has to be on the
//! cluster. Replicas verify either with the CA certificate they already hold (a `tsr2` token's
//! signer must be a replica certificate of the CA, valid now, not revoked), so a token needs no
//! replicated state; it is valid until it expires (keep them short, reissue them) or is
//! revoked. It travels only over TLS, in the `authorization: Bearer …` header or metadata.

use super::TlsError;
use super::identity::{Identity, Role};
use super::material::Material;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use rcgen::{KeyPair, SigningKey as _};
use serde::{Deserialize, Serialize};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, UnixTime};

const PREFIX: &str = "tsr1.";
const PREFIX_ISSUED: &str = "tsr2.";
/// Longest token accepted, in bytes.
pub const MAX_TOKEN: usize = 8192;
/// Longest validity of a token: 90 days.
pub const MAX_TTL_S: u64 = 90 * 24 * 3600;

#[derive(Serialize, Deserialize)]
struct Claims {
    #[serde(flatten)]
    identity: Identity,
    /// Unix seconds after which the token is refused.
    exp: u64,
}

fn claims_json(identity: &Identity, now_s: u64, ttl_s: u64) -> Result<Vec<u8>, TlsError> {
    if ttl_s == 0 || ttl_s > MAX_TTL_S {
        return Err(TlsError::Config(format!("a token lives 1 s to {MAX_TTL_S} s (90 days); asked {ttl_s} s")));
    }
    if identity.role == Role::Replica {
        return Err(TlsError::Config("replicas authenticate with certificates, not tokens".into()));
    }
    serde_json::to_vec(&Claims { identity: identity.clone(), exp: now_s + ttl_s })
        .map_err(|e| TlsError::Config(e.to_string()))
}

/// A token for `identity`, valid `ttl_s` seconds from `now_s` (Unix), signed by the CA key.
pub fn create(ca_key_pem: &str, identity: &Identity, now_s: u64, ttl_s: u64) -> Result<String, TlsError> {
    let json = claims_json(identity, now_s, ttl_s)?;
    let key = KeyPair::from_pem(ca_key_pem).map_err(|e| TlsError::Config(format!("the CA key: {e}")))?;
    let signed = format!("{PREFIX}{}", B64.encode(json));
    let sig = key.sign(signed.as_bytes()).map_err(|e| TlsError::Config(format!("signing: {e}")))?;
    Ok(format!("{signed}.{}", B64.encode(sig)))
}

/// A token for `identity`, valid `ttl_s` seconds from `now_s`, signed by a replica with its own
/// certificate (`cert_pem`, the first certificate is the signer's) and key: what the
/// `IssueToken` RPC answers an admin.
pub fn issue(cert_pem: &str, key_pem: &str, identity: &Identity, now_s: u64, ttl_s: u64) -> Result<String, TlsError> {
    let json = claims_json(identity, now_s, ttl_s)?;
    let cert = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .next()
        .ok_or_else(|| TlsError::Config("the signer has no certificate".into()))?
        .map_err(|e| TlsError::Config(format!("the signer's certificate: {e}")))?;
    let key = KeyPair::from_pem(key_pem).map_err(|e| TlsError::Config(format!("the signer's key: {e}")))?;
    let signed = format!("{PREFIX_ISSUED}{}.{}", B64.encode(json), B64.encode(cert.as_ref()));
    let sig = key.sign(signed.as_bytes()).map_err(|e| TlsError::Config(format!("signing: {e}")))?;
    let token = format!("{signed}.{}", B64.encode(sig));
    if token.len() > MAX_TOKEN {
        return Err(TlsError::Config(format!("a token of {} bytes; at most {MAX_TOKEN}", token.len())));
    }
    Ok(token)
}

/// Whether `text` has a token's form (as opposed to a file name).
pub fn looks_like(text: &str) -> bool {
    let t = text.trim();
    t.starts_with(PREFIX) || t.starts_with(PREFIX_ISSUED)
}

/// A token's parts: the signed text, the claims (base64url), the signer's certificate (DER,
/// issued tokens only) and the signature (base64url).
struct Parts<'a> {
    signed: &'a str,
    claims: &'a str,
    signer: Option<Vec<u8>>,
    signature: &'a str,
}

fn parts(token: &str) -> Result<Parts<'_>, String> {
    if token.len() > MAX_TOKEN {
        return Err(format!("token of {} bytes; at most {MAX_TOKEN}", token.len()));
    }
    let (signed, signature) = token.rsplit_once('.').ok_or("not a token (no signature)")?;
    if let Some(claims) = signed.strip_prefix(PREFIX) {
        return Ok(Parts { signed, claims, signer: None, signature });
    }
    let rest = signed.strip_prefix(PREFIX_ISSUED).ok_or("not a tessera token (no `tsr1.` or `tsr2.` prefix)")?;
    let (claims, cert) = rest.split_once('.').ok_or("an issued token without its signer's certificate")?;
    let cert = B64.decode(cert).map_err(|_| "the signer's certificate is not base64url")?;
    Ok(Parts { signed, claims, signer: Some(cert), signature })
}

/// The identity and expiry (Unix seconds) a token claims, read without checking its signature:
/// for naming it in a revocation, never for letting anyone in ([`verify`] does that).
pub fn claims(token: &str) -> Result<(Identity, u64), String> {
    let p = parts(token)?;
    let json = B64.decode(p.claims).map_err(|_| "the claims are not base64url")?;
    let claims: Claims = serde_json::from_slice(&json).map_err(|e| format!("the claims: {e}"))?;
    Ok((claims.identity, claims.exp))
}

/// A token that checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified {
    /// Whom it names.
    pub identity: Identity,
    /// The replica certificate (DER) that signed an issued token; `None` for one the CA key
    /// signed. The caller refuses the token if that certificate is revoked.
    pub signer: Option<Vec<u8>>,
}

/// The identity a token names, if it checks against the CA of `m` and has not expired at
/// `now_s`: signed by the CA's key, or issued by a replica whose certificate the CA signed, is
/// valid at `now_s` and says it is a replica's.
pub fn verify(m: &Material, token: &str, now_s: u64) -> Result<Verified, String> {
    let p = parts(token)?;
    let sig = B64.decode(p.signature).map_err(|_| "the signature is not base64url")?;
    let key: Vec<u8> = match &p.signer {
        None => m.ca_public_key.clone(),
        Some(der) => {
            let cert = CertificateDer::from(der.as_slice());
            let at = UnixTime::since_unix_epoch(std::time::Duration::from_secs(now_s));
            m.client_verifier
                .verify_client_cert(&cert, &[], at)
                .map_err(|e| format!("the signer's certificate is not one of this cluster's CA, valid now: {e}"))?;
            let signer = Identity::from_cert_der(der).map_err(|e| format!("the signer's certificate: {e}"))?;
            if signer.role != Role::Replica {
                return Err(format!("issued by {signer}; only a replica issues tokens"));
            }
            let (_, parsed) =
                x509_parser::parse_x509_certificate(der).map_err(|e| format!("the signer's certificate: {e}"))?;
            parsed.public_key().subject_public_key.data.to_vec()
        }
    };
    ring::signature::UnparsedPublicKey::new(&ring::signature::ECDSA_P256_SHA256_ASN1, &key)
        .verify(p.signed.as_bytes(), &sig)
        .map_err(|_| "the token is not signed by this cluster's CA or one of its replicas")?;
    let (identity, exp) = claims(token)?;
    if exp <= now_s {
        return Err(format!("the token expired {} s ago", now_s - exp));
    }
    // Checked like a certificate's identity (a signed token is still only as good as its
    // fields).
    let identity = Identity::new(identity.role, &identity.name, &identity.tenants).map_err(|e| e.to_string())?;
    Ok(Verified { identity, signer: p.signer })
}
