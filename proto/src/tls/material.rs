//! A component's TLS files, read and checked, and read again when they change on disk.
//!
//! A TLS directory holds `ca.pem` (the cluster CA), and for a component with a certificate
//! `cert.pem` and `key.pem` (what `tessera tls issue --out DIR` writes). A client with a bearer
//! token needs `ca.pem` alone. [`Tls::current`] looks at the files' sizes and modification
//! times at most every [`RECHECK`] and loads them again when they changed, so a renewed
//! certificate is used by the next handshake without a restart. Files that do not load (a
//! half-written copy) leave the last good material in use, and the error is logged once.
//! Replace the files by renaming new ones over them.
//!
//! An optional `revoked` file lists the certificates and tokens refused although the CA signed
//! them and they have not expired (a stolen key, a leaked token), one SHA-256 fingerprint per
//! line (`sha256:<64 hex digits>`, then anything: a comment), `#` lines ignored; see
//! [`fingerprint`] and `tessera tls revoke`. It is reloaded like the others.

use super::TlsError;
use super::identity::Identity;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use tokio_rustls::rustls;
use tokio_rustls::rustls::RootCertStore;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::server::danger::ClientCertVerifier;
use tokio_rustls::rustls::sign::CertifiedKey;

/// The cluster CA's certificate in a TLS directory.
pub const CA_FILE: &str = "ca.pem";
/// The CA's private key, in the CA's directory only (`tessera tls init`).
pub const CA_KEY_FILE: &str = "ca.key";
/// A component's certificate.
pub const CERT_FILE: &str = "cert.pem";
/// A component's private key.
pub const KEY_FILE: &str = "key.pem";
/// The fingerprints of revoked certificates and tokens, optional.
pub const REVOKED_FILE: &str = "revoked";
/// How often [`Tls::current`] looks at the files.
pub const RECHECK: Duration = Duration::from_millis(500);

/// The crypto provider of every TLS endpoint (ring).
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// One loaded, checked set of files.
pub struct Material {
    /// The CA certificate, PEM.
    pub ca_pem: String,
    /// The CA's public key (the subject public key bits), which signs tokens.
    pub ca_public_key: Vec<u8>,
    /// The roots: the CA.
    pub roots: Arc<RootCertStore>,
    /// The certificate chain, PEM, when the directory has one.
    pub cert_pem: Option<String>,
    /// The private key, PEM, with `cert_pem`.
    pub key_pem: Option<String>,
    /// The certificate and key for rustls.
    pub certified: Option<Arc<CertifiedKey>>,
    /// Who the certificate says this component is.
    pub identity: Option<Identity>,
    /// Verifies clients' certificates against the CA (a client without one passes the
    /// handshake; the services then ask for a token).
    pub client_verifier: Arc<dyn ClientCertVerifier>,
    /// Fingerprints ([`fingerprint`]) of the certificates and tokens refused (`revoked`).
    pub revoked: std::collections::HashSet<String>,
    /// Counts loads: a client rebuilds its connections when it changes.
    pub generation: u64,
}

impl std::fmt::Debug for Material {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Material").field("identity", &self.identity).field("generation", &self.generation).finish()
    }
}

fn read(path: &Path) -> Result<String, TlsError> {
    std::fs::read_to_string(path).map_err(|source| TlsError::Io { path: path.to_path_buf(), source })
}

impl Material {
    /// Loads the directory's files.
    pub fn load(dir: &Path, generation: u64) -> Result<Material, TlsError> {
        let ca_path = dir.join(CA_FILE);
        let ca_pem = read(&ca_path)?;
        let bad = |path: &Path, why: String| TlsError::Pem { path: path.to_path_buf(), why };
        let cas: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(ca_pem.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| bad(&ca_path, e.to_string()))?;
        let [ca] = cas.as_slice() else {
            return Err(bad(&ca_path, format!("{} certificates; exactly one CA certificate expected", cas.len())));
        };
        let (_, parsed) = x509_parser::parse_x509_certificate(ca).map_err(|e| bad(&ca_path, e.to_string()))?;
        let ca_public_key = parsed.public_key().subject_public_key.data.to_vec();
        let mut roots = RootCertStore::empty();
        roots.add(ca.clone()).map_err(|e| bad(&ca_path, e.to_string()))?;
        let roots = Arc::new(roots);
        let client_verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider())
            .allow_unauthenticated()
            .build()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let (cert_path, key_path) = (dir.join(CERT_FILE), dir.join(KEY_FILE));
        let (mut cert_pem, mut key_pem, mut certified, mut identity) = (None, None, None, None);
        if cert_path.exists() || key_path.exists() {
            let c = read(&cert_path)?;
            let k = read(&key_path)?;
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(c.as_bytes())
                .collect::<Result<_, _>>()
                .map_err(|e| bad(&cert_path, e.to_string()))?;
            let leaf = chain.first().ok_or_else(|| bad(&cert_path, "no certificate".into()))?;
            identity = Some(Identity::from_cert_der(leaf).map_err(|e| bad(&cert_path, e.to_string()))?);
            let key = PrivateKeyDer::from_pem_slice(k.as_bytes()).map_err(|e| bad(&key_path, e.to_string()))?;
            let ck = CertifiedKey::from_der(chain, key, &provider())
                .map_err(|e| bad(&key_path, format!("the key does not fit the certificate: {e}")))?;
            certified = Some(Arc::new(ck));
            cert_pem = Some(c);
            key_pem = Some(k);
        }
        let revoked = read_revoked(&dir.join(REVOKED_FILE))?;
        Ok(Material {
            revoked,
            ca_pem,
            ca_public_key,
            roots,
            cert_pem,
            key_pem,
            certified,
            identity,
            client_verifier,
            generation,
        })
    }
}

/// The SHA-256 fingerprint of a certificate (its DER bytes) or a token (its text), as the
/// `revoked` file lists it: `sha256:` and 64 lowercase hex digits.
pub fn fingerprint(bytes: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, bytes);
    let hex: String = d.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// The first certificate of a PEM file, DER (what [`fingerprint`] takes for a certificate).
pub fn certificate_der(path: &Path) -> Result<Vec<u8>, TlsError> {
    let text = read(path)?;
    let first = CertificateDer::pem_slice_iter(text.as_bytes()).next();
    match first {
        Some(Ok(c)) => Ok(c.to_vec()),
        Some(Err(e)) => Err(TlsError::Pem { path: path.to_path_buf(), why: e.to_string() }),
        None => Err(TlsError::Pem { path: path.to_path_buf(), why: "no certificate".into() }),
    }
}

/// The fingerprints of a `revoked` file (none when there is no file); a malformed line is an
/// error naming it.
fn read_revoked(path: &Path) -> Result<std::collections::HashSet<String>, TlsError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Default::default()),
        Err(source) => return Err(TlsError::Io { path: path.to_path_buf(), source }),
    };
    let mut out = std::collections::HashSet::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fp = line.split_whitespace().next().unwrap_or("").to_ascii_lowercase();
        let hex = fp.strip_prefix("sha256:").unwrap_or("");
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            let why = format!("line {}: `{line}` is not `sha256:` and 64 hex digits", i + 1);
            return Err(TlsError::Pem { path: path.to_path_buf(), why });
        }
        out.insert(fp);
    }
    Ok(out)
}

/// What the files looked like when last loaded: (size, modification time) of each.
type Stamp = Vec<Option<(u64, SystemTime)>>;

fn stamp(dir: &Path) -> Stamp {
    [CA_FILE, CERT_FILE, KEY_FILE, REVOKED_FILE]
        .iter()
        .map(|f| std::fs::metadata(dir.join(f)).ok().and_then(|m| Some((m.len(), m.modified().ok()?))))
        .collect()
}

struct State {
    stamp: Stamp,
    checked: Instant,
    material: Arc<Material>,
    /// The stamp of files that failed to load (logged once).
    failed: Option<Stamp>,
}

/// A TLS directory, reloaded when its files change, and the cluster's replicated list of
/// revoked credentials as the process last read it from the view.
pub struct Tls {
    dir: PathBuf,
    state: Mutex<State>,
    /// Fingerprints the view lists as revoked (`tessera_view::revocation`), with the view
    /// version they were read at; set by whoever follows the view (a replica after each round
    /// that changed it, an agent from the snapshots it watches).
    view_revoked: std::sync::RwLock<(u64, Arc<std::collections::HashSet<String>>)>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("dir", &self.dir).finish()
    }
}

impl Tls {
    /// Loads the directory now: a missing or malformed file is an error here, at start.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Arc<Tls>, TlsError> {
        let dir = dir.into();
        let s = stamp(&dir);
        let material = Arc::new(Material::load(&dir, 1)?);
        Ok(Arc::new(Tls {
            dir,
            state: Mutex::new(State { stamp: s, checked: Instant::now(), material, failed: None }),
            view_revoked: std::sync::RwLock::new((0, Arc::default())),
        }))
    }

    /// Takes the view's revoked fingerprints as of view version `changed_at` (when its list
    /// last changed); a list older than the one held is ignored, so a reader that falls back
    /// to a stale replica never un-revokes anything. Returns whether it replaced the list.
    pub fn set_view_revoked(&self, changed_at: u64, fingerprints: std::collections::HashSet<String>) -> bool {
        let mut held = self.view_revoked.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if changed_at < held.0 || (changed_at == held.0 && changed_at != 0) {
            return false;
        }
        tracing::info!(dir = %self.dir.display(), version = changed_at, revoked = fingerprints.len(), "revoked credentials from the view");
        *held = (changed_at, Arc::new(fingerprints));
        true
    }

    /// Whether the view lists `fingerprint` as revoked (as last set).
    pub fn view_revoked(&self, fingerprint: &str) -> bool {
        self.view_revoked.read().unwrap_or_else(std::sync::PoisonError::into_inner).1.contains(fingerprint)
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The current material, loaded again first if the files changed.
    pub fn current(&self) -> Arc<Material> {
        // A panic while loading cannot leave the state half-changed: take it as it is.
        let mut st = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if st.checked.elapsed() < RECHECK {
            return st.material.clone();
        }
        st.checked = Instant::now();
        let now = stamp(&self.dir);
        if now == st.stamp || st.failed.as_ref() == Some(&now) {
            return st.material.clone();
        }
        match Material::load(&self.dir, st.material.generation + 1) {
            Ok(m) => {
                tracing::info!(dir = %self.dir.display(), identity = ?m.identity, "TLS files changed: loaded again");
                st.material = Arc::new(m);
                st.stamp = now;
                st.failed = None;
            }
            Err(e) => {
                tracing::error!(dir = %self.dir.display(), error = %e, "TLS files changed but do not load; the previous ones stay in use");
                st.failed = Some(now);
            }
        }
        st.material.clone()
    }
}
