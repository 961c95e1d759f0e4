//! What a revocation records of a credential (`tessera policy revoke`, `tessera tls revoke`):
//! its fingerprint, whom it names and when it expires, read from the certificate file or the
//! token itself. Nothing here checks a signature: the entry only names what to refuse, and the
//! expiry says how long the entry must be kept (an earlier one would let the credential in
//! again before it expires).

use super::TlsError;
use super::identity::Identity;
use super::material::{certificate_der, fingerprint};
use super::token;
use std::path::Path;

/// A credential to revoke.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credential {
    /// `sha256:` and 64 lowercase hex digits of the certificate's DER or the token's text.
    pub fingerprint: String,
    /// `certificate` or `token`.
    pub kind: &'static str,
    /// Whom it names (`user/alice`); `?` when it names nobody this cluster knows.
    pub subject: String,
    /// When it expires, Unix seconds.
    pub not_after_s: u64,
}

fn subject(id: &Identity) -> String {
    format!("{}/{}", id.role, id.name)
}

impl Credential {
    /// The first certificate of a PEM file.
    pub fn of_certificate(path: &Path) -> Result<Credential, TlsError> {
        let der = certificate_der(path)?;
        let bad = |why: String| TlsError::Pem { path: path.to_path_buf(), why };
        let (_, cert) = x509_parser::parse_x509_certificate(&der).map_err(|e| bad(e.to_string()))?;
        let not_after = cert.validity().not_after.timestamp();
        let not_after_s = u64::try_from(not_after).map_err(|_| bad(format!("expires before 1970 ({not_after})")))?;
        let subject = Identity::from_cert_der(&der).map_or_else(|_| "?".to_string(), |i| subject(&i));
        Ok(Credential { fingerprint: fingerprint(&der), kind: "certificate", subject, not_after_s })
    }

    /// A bearer token as `tessera token create` printed it (its claims are read, not checked).
    pub fn of_token(text: &str) -> Result<Credential, TlsError> {
        let text = text.trim();
        let (identity, exp) = token::claims(text).map_err(|e| TlsError::Config(format!("not a token: {e}")))?;
        Ok(Credential {
            fingerprint: fingerprint(text.as_bytes()),
            kind: "token",
            subject: subject(&identity),
            not_after_s: exp,
        })
    }

    /// A token (it starts `tsr1.`), else the path of a certificate file.
    pub fn of(text_or_path: &str) -> Result<Credential, TlsError> {
        if token::looks_like(text_or_path) {
            Credential::of_token(text_or_path)
        } else {
            Credential::of_certificate(Path::new(text_or_path))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::Role;
    use crate::tls::issue;

    #[test]
    fn a_certificate_and_a_token_say_whom_they_name_and_when_they_expire() {
        let dir = std::env::temp_dir().join(format!("tessera-cred-{}-{:x}", std::process::id(), rand::random::<u64>()));
        issue::init_dir(&dir.join("ca"), 30).expect("CA");
        let alice = Identity::new(Role::User, "alice", &["vision".into()]).expect("id");
        let req = issue::Request::for_days(alice.clone(), vec![], 2).expect("request");
        issue::issue_dir(&dir.join("ca"), &req, &dir.join("alice")).expect("issue");
        let now = crate::tls::unix_s();
        let c = Credential::of(dir.join("alice").join("cert.pem").to_str().expect("utf-8")).expect("certificate");
        assert_eq!((c.kind, c.subject.as_str()), ("certificate", "user/alice"));
        assert!(c.not_after_s.abs_diff(now + 2 * 86_400) < 3_600, "{} vs {now}", c.not_after_s);
        assert_eq!(c.fingerprint, fingerprint(&certificate_der(&dir.join("alice").join("cert.pem")).expect("der")));
        let key = std::fs::read_to_string(dir.join("ca").join("ca.key")).expect("key");
        let t = token::create(&key, &alice, now, 600).expect("token");
        let c = Credential::of(&format!(" {t}\n")).expect("token");
        assert_eq!((c.kind, c.subject.as_str(), c.not_after_s), ("token", "user/alice", now + 600));
        assert_eq!(c.fingerprint, fingerprint(t.as_bytes()));
        assert!(Credential::of("tsr1.garbage").is_err());
        assert!(Credential::of(dir.join("missing.pem").to_str().expect("utf-8")).is_err());
        let _ = std::fs::remove_dir_all(dir);
    }
}
