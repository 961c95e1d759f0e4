//! The cluster CA and the certificates it issues (`tessera tls init`, `tessera tls issue`).
//!
//! Keys are ECDSA P-256. A component's certificate carries its identity as URIs (see
//! [`super::identity`]), the host names and addresses it serves on (for the peers' server-name
//! check), and both TLS uses (server and client): a replica is a server to clients and a client
//! of its peers. Private keys are written readable by their owner alone.

use super::TlsError;
use super::identity::Identity;
use super::material::{CA_FILE, CA_KEY_FILE, CERT_FILE, KEY_FILE};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    SanType,
};
use std::net::IpAddr;
use std::path::Path;
use time::{Duration, OffsetDateTime};

/// Longest validity of a certificate, in days (ten years, the CA's).
pub const MAX_DAYS: u32 = 3650;

/// A certificate to issue.
#[derive(Clone, Debug)]
pub struct Request {
    /// Who it is for.
    pub identity: Identity,
    /// Host names and IP addresses it serves on (a client-only identity needs none).
    pub hosts: Vec<String>,
    /// Valid from this instant (normally now, less a minute of clock skew) ...
    pub not_before: OffsetDateTime,
    /// ... to this one.
    pub not_after: OffsetDateTime,
}

impl Request {
    /// Valid from a minute ago for `days` days.
    pub fn for_days(identity: Identity, hosts: Vec<String>, days: u32) -> Result<Request, TlsError> {
        if days == 0 || days > MAX_DAYS {
            return Err(TlsError::Config(format!("{days} days of validity; 1 to {MAX_DAYS}")));
        }
        let now = OffsetDateTime::now_utc();
        Ok(Request {
            identity,
            hosts,
            not_before: now - Duration::minutes(1),
            not_after: now + Duration::days(i64::from(days)),
        })
    }
}

fn rc(e: rcgen::Error) -> TlsError {
    TlsError::Config(e.to_string())
}

/// A new CA: (certificate PEM, private key PEM), valid `days` days.
pub fn new_ca(days: u32) -> Result<(String, String), TlsError> {
    if days == 0 || days > MAX_DAYS {
        return Err(TlsError::Config(format!("{days} days of validity; 1 to {MAX_DAYS}")));
    }
    let key = KeyPair::generate().map_err(rc)?;
    let mut p = CertificateParams::default();
    p.distinguished_name = rcgen::DistinguishedName::new();
    p.distinguished_name.push(DnType::CommonName, "tessera cluster CA");
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let now = OffsetDateTime::now_utc();
    p.not_before = now - Duration::minutes(1);
    p.not_after = now + Duration::days(i64::from(days));
    let cert = p.self_signed(&key).map_err(rc)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Issues a certificate: (certificate PEM, private key PEM).
pub fn issue_pem(ca_pem: &str, ca_key_pem: &str, req: &Request) -> Result<(String, String), TlsError> {
    let ca_key = KeyPair::from_pem(ca_key_pem).map_err(rc)?;
    let issuer = Issuer::from_ca_cert_pem(ca_pem, ca_key).map_err(rc)?;
    let key = KeyPair::generate().map_err(rc)?;
    let mut p = CertificateParams::default();
    p.distinguished_name = rcgen::DistinguishedName::new();
    p.distinguished_name.push(DnType::CommonName, req.identity.uri());
    let ia5 = |s: String| s.try_into().map_err(|e: rcgen::Error| TlsError::Config(e.to_string()));
    for u in req.identity.uris() {
        p.subject_alt_names.push(SanType::URI(ia5(u)?));
    }
    for h in &req.hosts {
        let h = h.trim();
        if h.is_empty() {
            continue;
        }
        p.subject_alt_names.push(match h.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(ia5(h.to_string())?),
        });
    }
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    p.use_authority_key_identifier_extension = true;
    p.not_before = req.not_before;
    p.not_after = req.not_after;
    let cert = p.signed_by(&key, &issuer).map_err(rc)?;
    Ok((cert.pem(), key.serialize_pem()))
}

fn write(path: &Path, text: &str, private: bool) -> Result<(), TlsError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let io = |source| TlsError::Io { path: path.to_path_buf(), source };
    // Written under a temporary name and renamed, so a reloading reader never sees half a file.
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(if private { 0o600 } else { 0o644 })
        .open(&tmp)
        .map_err(io)?;
    f.write_all(text.as_bytes()).map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// `tessera tls init`: a new CA in `dir` (`ca.pem`, `ca.key`); refuses to overwrite one.
pub fn init_dir(dir: &Path, days: u32) -> Result<(), TlsError> {
    let io = |source| TlsError::Io { path: dir.to_path_buf(), source };
    std::fs::create_dir_all(dir).map_err(io)?;
    for f in [CA_FILE, CA_KEY_FILE] {
        if dir.join(f).exists() {
            return Err(TlsError::Config(format!(
                "{} exists: a cluster has one CA (remove it first to start over)",
                dir.join(f).display()
            )));
        }
    }
    let (cert, key) = new_ca(days)?;
    write(&dir.join(CA_KEY_FILE), &key, true)?;
    write(&dir.join(CA_FILE), &cert, false)
}

/// `tessera tls issue`: a certificate of the CA in `ca_dir`, written to `out` as `ca.pem`,
/// `cert.pem`, `key.pem` (a directory a component's `--tls` names). Overwrites a previous
/// certificate there (renewal: the component loads the new one without a restart).
pub fn issue_dir(ca_dir: &Path, req: &Request, out: &Path) -> Result<(), TlsError> {
    let read = |f: &str| {
        let p = ca_dir.join(f);
        std::fs::read_to_string(&p).map_err(|source| TlsError::Io { path: p, source })
    };
    let (ca, ca_key) = (read(CA_FILE)?, read(CA_KEY_FILE)?);
    let (cert, key) = issue_pem(&ca, &ca_key, req)?;
    std::fs::create_dir_all(out).map_err(|source| TlsError::Io { path: out.to_path_buf(), source })?;
    write(&out.join(CA_FILE), &ca, false)?;
    write(&out.join(KEY_FILE), &key, true)?;
    write(&out.join(CERT_FILE), &cert, false)
}
