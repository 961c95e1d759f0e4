//! Transport security and callers' identities (issue 15).
//!
//! Every connection between components is mutual TLS over one cluster CA:
//! [`issue`] makes the CA and the certificates (`tessera tls init|issue`), [`material`] reads a
//! component's TLS directory and reloads it when the files change, [`server`] accepts TLS
//! connections for tonic (and gives actix-web the same configuration), [`identity`] says who a
//! certificate is for, and [`token`] signs and checks the bearer tokens of callers without a
//! certificate. [`authenticate`] turns what a request arrived with into the caller's
//! [`Identity`]; the services decide what that identity may do.
//!
//! Plaintext is [`Security::Insecure`]: chosen explicitly (`--insecure`), logged as a warning,
//! and every caller is then trusted as a replica is (nothing is authenticated).

pub mod credential;
pub mod identity;
pub mod issue;
pub mod material;
pub mod server;
pub mod token;

pub use identity::{Identity, IdentityError, Role};
pub use material::{Material, Tls};

use std::path::PathBuf;
use std::sync::Arc;
use thiserror::Error;
use tokio_rustls::rustls::pki_types::CertificateDer;

/// The metadata (gRPC) and header (HTTP) of a bearer token.
pub const AUTHORIZATION: &str = "authorization";
/// The metadata a replica's HTTP API sets to call the view for its own caller (honoured from a
/// replica alone).
pub const ON_BEHALF_OF: &str = "tessera-on-behalf-of";

/// Why TLS could not be set up.
#[derive(Debug, Error)]
pub enum TlsError {
    /// A file could not be read or written.
    #[error("{}: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file's content is not what it should be.
    #[error("{}: {why}", .path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// A configuration that cannot work.
    #[error("{0}")]
    Config(String),
}

/// How a component talks to the others.
#[derive(Clone, Debug)]
pub enum Security {
    /// Plaintext, nothing authenticated (`--insecure`).
    Insecure,
    /// Mutual TLS with the files of this directory.
    Tls(Arc<Tls>),
}

impl Security {
    /// TLS from `dir`, or plaintext when `insecure`; exactly one must be given. Plaintext logs
    /// a warning.
    pub fn from_flags(dir: Option<PathBuf>, insecure: bool, who: &str) -> Result<Security, TlsError> {
        let s = Security::client_from_flags(dir, insecure, who)?;
        if matches!(s, Security::Insecure) {
            tracing::warn!(
                component = who,
                "--insecure: plaintext connections, no caller authenticated; never on a shared network"
            );
        }
        Ok(s)
    }

    /// [`Security::from_flags`] for a one-shot client (a CLI command): plaintext is logged at
    /// info, not warned about on every call.
    pub fn client_from_flags(dir: Option<PathBuf>, insecure: bool, who: &str) -> Result<Security, TlsError> {
        match (dir, insecure) {
            (Some(d), false) => Ok(Security::Tls(Tls::open(d)?)),
            (None, true) => {
                tracing::info!(component = who, "--insecure: plaintext, nothing authenticated");
                Ok(Security::Insecure)
            }
            (Some(_), true) => Err(TlsError::Config("--tls and --insecure exclude each other".into())),
            (None, false) => Err(TlsError::Config(format!(
                "{who} needs --tls DIR (ca.pem, cert.pem, key.pem from `tessera tls issue`) or an explicit --insecure"
            ))),
        }
    }

    /// The URL scheme of a connection.
    pub fn scheme(&self) -> &'static str {
        match self {
            Security::Insecure => "http",
            Security::Tls(_) => "https",
        }
    }

    /// The TLS directory, when there is one.
    pub fn tls(&self) -> Option<&Arc<Tls>> {
        match self {
            Security::Insecure => None,
            Security::Tls(t) => Some(t),
        }
    }

    /// A tonic client TLS configuration from the current files (`None` in plaintext).
    pub fn client_config(&self) -> Option<tonic::transport::ClientTlsConfig> {
        let m = self.tls()?.current();
        let mut c = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(m.ca_pem.as_bytes()));
        if let (Some(cert), Some(key)) = (&m.cert_pem, &m.key_pem) {
            c = c.identity(tonic::transport::Identity::from_pem(cert.as_bytes(), key.as_bytes()));
        }
        Some(c)
    }

    /// An endpoint at `addr` (`host:port`) with this transport: the URL scheme and, with TLS,
    /// the current files' client configuration.
    pub fn endpoint(&self, addr: &str) -> Result<tonic::transport::Endpoint, tonic::transport::Error> {
        let ep = tonic::transport::Endpoint::from_shared(format!("{}://{addr}", self.scheme()))?;
        match self.client_config() {
            Some(tls) => ep.tls_config(tls),
            None => Ok(ep),
        }
    }

    /// The generation of the current files (0 in plaintext): connections made with an older
    /// generation are made again.
    pub fn generation(&self) -> u64 {
        self.tls().map_or(0, |t| t.current().generation)
    }
}

/// Why a caller is not let in.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum AuthError {
    /// No certificate and no token.
    #[error(
        "no client certificate and no bearer token: every call is authenticated (tessera tls issue, tessera token create)"
    )]
    Anonymous,
    /// A token that does not check.
    #[error("bearer token refused: {0}")]
    BadToken(String),
    /// A certificate without a usable identity.
    #[error("client certificate refused: {0}")]
    BadCertificate(String),
    /// A caller other than a replica naming another identity.
    #[error("{0} may not act on behalf of another caller")]
    NotReplica(String),
    /// A malformed on-behalf identity.
    #[error("bad {ON_BEHALF_OF}: {0}")]
    BadOnBehalf(String),
    /// A certificate or token listed in the TLS directory's `revoked` file or the view's
    /// revocations.
    #[error("{0} was revoked")]
    Revoked(String),
}

/// Who every caller is in plaintext: trusted as a replica (everything allowed).
pub fn insecure_identity() -> Identity {
    Identity { role: Role::Replica, name: "insecure".into(), tenants: Vec::new() }
}

/// The caller of a request: from its client certificate (already verified against the CA at
/// the handshake), else its bearer token; a replica may then name the caller it acts for.
pub fn authenticate(
    security: &Security,
    certs: Option<&[CertificateDer<'_>]>,
    bearer: Option<&str>,
    on_behalf: Option<&str>,
    now_s: u64,
) -> Result<Identity, AuthError> {
    let Security::Tls(tls) = security else { return Ok(insecure_identity()) };
    let m = tls.current();
    let revoked = |what: &str, bytes: &[u8], who: &Identity| {
        let fp = material::fingerprint(bytes);
        if m.revoked.contains(&fp) || tls.view_revoked(&fp) {
            Err(AuthError::Revoked(format!("the {what} {fp} of {who}")))
        } else {
            Ok(())
        }
    };
    let caller = match (certs.and_then(|c| c.first()), bearer) {
        (Some(leaf), _) => {
            let who = Identity::from_cert_der(leaf).map_err(|e| AuthError::BadCertificate(e.to_string()))?;
            revoked("certificate", leaf, &who)?;
            who
        }
        (None, Some(b)) => {
            let t = b.strip_prefix("Bearer ").unwrap_or(b).trim();
            let v = token::verify(&m, t, now_s).map_err(AuthError::BadToken)?;
            revoked("token", t.as_bytes(), &v.identity)?;
            if let Some(signer) = &v.signer {
                // A revoked replica certificate takes the tokens it issued with it.
                revoked("token's signer certificate", signer, &v.identity)?;
            }
            v.identity
        }
        (None, None) => return Err(AuthError::Anonymous),
    };
    match on_behalf {
        None => Ok(caller),
        Some(_) if caller.role != Role::Replica => Err(AuthError::NotReplica(caller.to_string())),
        Some(uris) => Identity::from_uris(uris.split(',')).map_err(|e| AuthError::BadOnBehalf(e.to_string())),
    }
}

/// The Unix time in seconds.
pub fn unix_s() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// What a client sends besides TLS: a bearer token, and (a replica's HTTP API) the caller it
/// acts for. Added to every call's metadata, with the current span's trace context
/// ([`crate::trace::inject`]).
#[derive(Clone, Debug, Default)]
pub struct CallerAuth {
    /// `authorization: Bearer …`.
    pub bearer: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    /// `tessera-on-behalf-of`.
    pub on_behalf: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
}

impl CallerAuth {
    /// A token (without the `Bearer ` prefix) and the identity acted for.
    pub fn new(token: Option<&str>, on_behalf: Option<&Identity>) -> Result<CallerAuth, TlsError> {
        let value = |s: String| s.parse().map_err(|_| TlsError::Config("a token or name with non-ASCII bytes".into()));
        Ok(CallerAuth {
            bearer: token.map(|t| value(format!("Bearer {}", t.trim()))).transpose()?,
            on_behalf: on_behalf.map(|i| value(i.uris().join(","))).transpose()?,
        })
    }
}

impl tonic::service::Interceptor for CallerAuth {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(b) = &self.bearer {
            req.metadata_mut().insert(AUTHORIZATION, b.clone());
        }
        if let Some(o) = &self.on_behalf {
            req.metadata_mut().insert(ON_BEHALF_OF, o.clone());
        }
        // Every call continues the caller's trace, when it is in one.
        crate::trace::inject(req.metadata_mut());
        Ok(req)
    }
}

/// The caller of a tonic request (see [`authenticate`]).
pub fn caller_of<T>(security: &Security, req: &tonic::Request<T>) -> Result<Identity, AuthError> {
    let certs = req.peer_certs();
    let md = req.metadata();
    let text = |k: &str| md.get(k).and_then(|v| v.to_str().ok());
    authenticate(security, certs.as_deref().map(Vec::as_slice), text(AUTHORIZATION), text(ON_BEHALF_OF), unix_s())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca(dir: &std::path::Path) -> (Arc<Tls>, String) {
        issue::init_dir(&dir.join("ca"), 1).expect("CA");
        let id = Identity::new(Role::Replica, "r1", &[]).expect("id");
        let req = issue::Request::for_days(id, vec!["127.0.0.1".into()], 1).expect("request");
        issue::issue_dir(&dir.join("ca"), &req, &dir.join("r1")).expect("issue");
        let key = std::fs::read_to_string(dir.join("ca").join(material::CA_KEY_FILE)).expect("key");
        (Tls::open(dir.join("r1")).expect("open"), key)
    }

    #[test]
    fn tokens_carry_their_identity_until_they_expire_and_only_from_the_ca() {
        let dir = tempfile_dir();
        let (tls, key) = ca(&dir);
        let m = tls.current();
        let verify = |t: &str, now: u64| token::verify(&m, t, now).map(|v| v.identity);
        let alice = Identity::new(Role::User, "alice", &["vision".into()]).expect("id");
        let t = token::create(&key, &alice, 1000, 60).expect("token");
        assert_eq!(verify(&t, 1010), Ok(alice.clone()));
        assert!(verify(&t, 1060).expect_err("expired").contains("expired"));
        // Any change to the claims breaks the signature.
        let (body, sig) = t.rsplit_once('.').expect("token");
        let forged = format!("{}A.{sig}", body);
        assert!(verify(&forged, 1010).is_err());
        assert!(verify("tsr1.e30.AAAA", 1010).is_err());
        assert!(token::create(&key, &alice, 1000, 0).is_err(), "a token lives at least a second");
        let replica = Identity::new(Role::Replica, "r9", &[]).expect("id");
        assert!(token::create(&key, &replica, 1000, 60).is_err(), "replicas use certificates");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_replica_issues_tokens_with_its_own_certificate_and_nobody_else_can() {
        use material::{CERT_FILE, KEY_FILE, fingerprint};
        let dir = tempfile_dir();
        let (tls, _) = ca(&dir);
        let sec = Security::Tls(tls.clone());
        let read = |who: &str, f: &str| std::fs::read_to_string(dir.join(who).join(f)).expect("file");
        let (alice, alice_cert) = alice(&dir);
        let now = unix_s();
        // Replica r1 issues a token for alice: it names her, and its signer.
        let t = token::issue(&read("r1", CERT_FILE), &read("r1", KEY_FILE), &alice, now, 600).expect("issued");
        assert!(t.starts_with("tsr2.") && token::looks_like(&t));
        let v = token::verify(&tls.current(), &t, now + 1).expect("checks");
        assert_eq!(v.identity, alice);
        let signer = v.signer.expect("issued by a replica");
        assert_eq!(authenticate(&sec, None, Some(&format!("Bearer {t}")), None, now + 1), Ok(alice.clone()));
        assert_eq!(token::claims(&t), Ok((alice.clone(), now + 600)));
        assert!(token::verify(&tls.current(), &t, now + 600).expect_err("expired").contains("expired"));
        // Claims changed (alice made admin) break the signature.
        let admin = Identity::new(Role::Admin, "alice", &[]).expect("id");
        let other = token::issue(&read("r1", CERT_FILE), &read("r1", KEY_FILE), &admin, now, 600).expect("issued");
        let (claims, _) = other.strip_prefix("tsr2.").and_then(|r| r.split_once('.')).expect("parts");
        let (_, tail) = t.strip_prefix("tsr2.").and_then(|r| r.split_once('.')).expect("parts");
        let forged = format!("tsr2.{claims}.{tail}");
        assert!(token::verify(&tls.current(), &forged, now + 1).is_err());
        // A user's certificate of the same CA is no issuer.
        let by_user =
            token::issue(&read("alice", CERT_FILE), &read("alice", KEY_FILE), &admin, now, 600).expect("signed");
        let e = token::verify(&tls.current(), &by_user, now + 1).expect_err("a user is no issuer");
        assert!(e.contains("only a replica issues tokens"), "{e}");
        // A replica of another CA is no issuer of this cluster's.
        let foreign = dir.join("foreign");
        let (_, _) = ca(&foreign);
        let by_foreign = token::issue(
            &std::fs::read_to_string(foreign.join("r1").join(CERT_FILE)).expect("cert"),
            &std::fs::read_to_string(foreign.join("r1").join(KEY_FILE)).expect("key"),
            &admin,
            now,
            600,
        )
        .expect("signed");
        assert!(
            token::verify(&tls.current(), &by_foreign, now + 1).expect_err("foreign").contains("this cluster's CA")
        );
        // Revoking the signer's certificate takes its tokens with it; alice's own certificate
        // still works.
        assert!(tls.set_view_revoked(3, [fingerprint(&signer)].into()));
        let e = authenticate(&sec, None, Some(&format!("Bearer {t}")), None, now + 1).expect_err("signer revoked");
        assert!(matches!(&e, AuthError::Revoked(m) if m.contains("signer")), "{e}");
        assert_eq!(authenticate(&sec, Some(&[alice_cert]), None, None, now + 1), Ok(alice));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn only_a_replica_acts_for_another_caller_and_plaintext_trusts_everyone() {
        let dir = tempfile_dir();
        let (tls, key) = ca(&dir);
        let sec = Security::Tls(tls);
        let admin = Identity::new(Role::Admin, "ops", &[]).expect("id");
        let alice = Identity::new(Role::User, "alice", &["vision".into()]).expect("id");
        let t = token::create(&key, &admin, unix_s(), 60).expect("token");
        let bearer = format!("Bearer {t}");
        assert_eq!(authenticate(&sec, None, Some(&bearer), None, unix_s()), Ok(admin.clone()));
        assert_eq!(authenticate(&sec, None, None, None, unix_s()), Err(AuthError::Anonymous));
        let behalf = alice.uris().join(",");
        assert!(matches!(
            authenticate(&sec, None, Some(&bearer), Some(&behalf), unix_s()),
            Err(AuthError::NotReplica(_))
        ));
        // A replica's certificate may name the caller it acts for.
        let cert = tokio_rustls::rustls::pki_types::pem::PemObject::from_pem_file(dir.join("r1").join("cert.pem"))
            .expect("cert");
        let certs: Vec<CertificateDer<'_>> = vec![cert];
        assert_eq!(authenticate(&sec, Some(&certs), None, Some(&behalf), unix_s()), Ok(alice));
        assert_eq!(authenticate(&Security::Insecure, None, None, None, 0), Ok(insecure_identity()));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn revoked_certificates_and_tokens_are_refused_once_listed() {
        use material::{REVOKED_FILE, fingerprint};
        let dir = tempfile_dir();
        let (tls, key) = ca(&dir);
        let sec = Security::Tls(tls);
        let (alice, cert) = alice(&dir);
        let certs = vec![cert.clone()];
        let t = token::create(&key, &alice, unix_s(), 600).expect("token");
        let other = token::create(&key, &alice, unix_s(), 601).expect("another token");
        let (bearer, other) = (format!("Bearer {t}"), format!("Bearer {other}"));
        assert_eq!(authenticate(&sec, Some(&certs), None, None, unix_s()), Ok(alice.clone()));
        assert_eq!(authenticate(&sec, None, Some(&bearer), None, unix_s()), Ok(alice.clone()));
        let list =
            format!("# alice's laptop was stolen\n{} laptop\n{}\n", fingerprint(&cert), fingerprint(t.as_bytes()));
        std::fs::write(dir.join("r1").join(REVOKED_FILE), list).expect("write");
        // Reloaded within RECHECK.
        let t0 = std::time::Instant::now();
        while authenticate(&sec, Some(&certs), None, None, unix_s()).is_ok() {
            assert!(t0.elapsed() < std::time::Duration::from_secs(5), "the revoked list was never loaded");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let e = authenticate(&sec, Some(&certs), None, None, unix_s()).expect_err("revoked");
        assert!(matches!(&e, AuthError::Revoked(m) if m.contains("certificate sha256:") && m.contains("alice")), "{e}");
        let e = authenticate(&sec, None, Some(&bearer), None, unix_s()).expect_err("revoked");
        assert!(matches!(&e, AuthError::Revoked(m) if m.starts_with("the token sha256:")), "{e}");
        assert_eq!(authenticate(&sec, None, Some(&other), None, unix_s()), Ok(alice), "another token still works");
        // A malformed list does not load; the last good one stays in force.
        std::fs::write(dir.join("r1").join(REVOKED_FILE), "sha256:nothex\n").expect("write");
        assert!(material::Material::load(&dir.join("r1"), 9).is_err_and(|e| e.to_string().contains("line 1")));
        std::thread::sleep(material::RECHECK * 2);
        assert!(authenticate(&sec, Some(&certs), None, None, unix_s()).is_err(), "still revoked");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn credentials_the_view_revokes_are_refused_and_an_older_list_never_undoes_it() {
        use material::fingerprint;
        let dir = tempfile_dir();
        let (tls, key) = ca(&dir);
        let sec = Security::Tls(tls.clone());
        let (alice, cert) = alice(&dir);
        let certs = vec![cert.clone()];
        let t = token::create(&key, &alice, unix_s(), 600).expect("token");
        let bearer = format!("Bearer {t}");
        let listed: std::collections::HashSet<String> = [fingerprint(&cert), fingerprint(t.as_bytes())].into();
        assert!(tls.set_view_revoked(7, listed.clone()));
        let e = authenticate(&sec, Some(&certs), None, None, unix_s()).expect_err("revoked by the view");
        assert!(matches!(&e, AuthError::Revoked(m) if m.contains("alice")), "{e}");
        assert!(matches!(authenticate(&sec, None, Some(&bearer), None, unix_s()), Err(AuthError::Revoked(_))));
        // A list from before the change (a lagging replica's snapshot) is not taken.
        assert!(!tls.set_view_revoked(6, Default::default()));
        assert!(!tls.set_view_revoked(7, Default::default()));
        assert!(authenticate(&sec, Some(&certs), None, None, unix_s()).is_err(), "still revoked");
        // A later change that takes the certificate off the list lets it in again.
        assert!(tls.set_view_revoked(9, [fingerprint(t.as_bytes())].into()));
        assert_eq!(authenticate(&sec, Some(&certs), None, None, unix_s()), Ok(alice));
        assert!(authenticate(&sec, None, Some(&bearer), None, unix_s()).is_err());
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A user certificate of the CA in `dir` (as [`ca`] made it) for `alice` of tenant `vision`.
    fn alice(dir: &std::path::Path) -> (Identity, CertificateDer<'static>) {
        let alice = Identity::new(Role::User, "alice", &["vision".into()]).expect("id");
        let req = issue::Request::for_days(alice.clone(), vec![], 1).expect("request");
        issue::issue_dir(&dir.join("ca"), &req, &dir.join("alice")).expect("issue");
        let cert =
            tokio_rustls::rustls::pki_types::pem::PemObject::from_pem_file(dir.join("alice").join(material::CERT_FILE))
                .expect("cert");
        (alice, cert)
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("tessera-tls-{}-{:x}", std::process::id(), rand::random::<u64>()));
        std::fs::create_dir_all(&d).expect("dir");
        d
    }
}
