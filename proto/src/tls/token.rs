//! Bearer tokens for the CLI, the SDK and the HTTP API (`tessera token create`).
//!
//! A token is `tsr1.<claims>.<signature>`: the claims (an [`Identity`] and an expiry) as JSON,
//! base64url, signed with the cluster CA's key (ECDSA P-256, SHA-256). Replicas verify it with
//! the CA certificate they already hold, so a token needs no replicated state; it is valid
//! until it expires (keep them short, reissue them). It travels only over TLS, in the
//! `authorization: Bearer …` header or metadata.

use super::TlsError;
use super::identity::Identity;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use rcgen::{KeyPair, SigningKey as _};
use serde::{Deserialize, Serialize};

const PREFIX: &str = "tsr1.";
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

/// A token for `identity`, valid `ttl_s` seconds from `now_s` (Unix), signed by the CA key.
pub fn create(ca_key_pem: &str, identity: &Identity, now_s: u64, ttl_s: u64) -> Result<String, TlsError> {
    if ttl_s == 0 || ttl_s > MAX_TTL_S {
        return Err(TlsError::Config(format!("a token lives 1 s to {MAX_TTL_S} s (90 days); asked {ttl_s} s")));
    }
    let key = KeyPair::from_pem(ca_key_pem).map_err(|e| TlsError::Config(format!("the CA key: {e}")))?;
    let claims = Claims { identity: identity.clone(), exp: now_s + ttl_s };
    let json = serde_json::to_vec(&claims).map_err(|e| TlsError::Config(e.to_string()))?;
    let signed = format!("{PREFIX}{}", B64.encode(json));
    let sig = key.sign(signed.as_bytes()).map_err(|e| TlsError::Config(format!("signing: {e}")))?;
    Ok(format!("{signed}.{}", B64.encode(sig)))
}

/// Whether `text` has a token's form (as opposed to a file name).
pub fn looks_like(text: &str) -> bool {
    text.trim().starts_with(PREFIX)
}

/// The identity and expiry (Unix seconds) a token claims, read without checking its signature:
/// for naming it in a revocation, never for letting anyone in ([`verify`] does that).
pub fn claims(token: &str) -> Result<(Identity, u64), String> {
    if token.len() > MAX_TOKEN {
        return Err(format!("token of {} bytes; at most {MAX_TOKEN}", token.len()));
    }
    let (signed, _) = token.rsplit_once('.').ok_or("not a token (no signature)")?;
    let body = signed.strip_prefix(PREFIX).ok_or("not a tessera token (no `tsr1.` prefix)")?;
    let json = B64.decode(body).map_err(|_| "the claims are not base64url")?;
    let claims: Claims = serde_json::from_slice(&json).map_err(|e| format!("the claims: {e}"))?;
    Ok((claims.identity, claims.exp))
}

/// The identity a token names, if the CA whose public key is `ca_public_key` signed it and it
/// has not expired at `now_s`.
pub fn verify(ca_public_key: &[u8], token: &str, now_s: u64) -> Result<Identity, String> {
    if token.len() > MAX_TOKEN {
        return Err(format!("token of {} bytes; at most {MAX_TOKEN}", token.len()));
    }
    let (signed, sig) = token.rsplit_once('.').ok_or("not a token (no signature)")?;
    if !signed.starts_with(PREFIX) {
        return Err("not a tessera token (no `tsr1.` prefix)".into());
    }
    let sig = B64.decode(sig).map_err(|_| "the signature is not base64url")?;
    ring::signature::UnparsedPublicKey::new(&ring::signature::ECDSA_P256_SHA256_ASN1, ca_public_key)
        .verify(signed.as_bytes(), &sig)
        .map_err(|_| "the token is not signed by this cluster's CA")?;
    let (identity, exp) = claims(token)?;
    if exp <= now_s {
        return Err(format!("the token expired {} s ago", now_s - exp));
    }
    // Checked like a certificate's identity (a signed token is still only as good as its
    // fields).
    Identity::new(identity.role, &identity.name, &identity.tenants).map_err(|e| e.to_string())
}
