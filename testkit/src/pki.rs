//! A throw-away cluster CA and certificates for tests, `tessera dev` and the local clusters:
//! [`Pki::create`] makes the CA in a directory, [`Pki::issue`] a component's TLS directory
//! (the same files `tessera tls issue` writes), [`Pki::security`] a client's [`Security`].
//! Loopback names (`127.0.0.1`, `localhost`) are in every certificate, so any component can
//! serve on this machine.

use crate::KitError;
use std::path::{Path, PathBuf};
use tessera_proto::tls::issue::{Request, init_dir, issue_dir};
use tessera_proto::tls::{Identity, Role, Security, Tls};

/// A CA under `<dir>/ca` and the TLS directories issued from it under `<dir>/<role>-<name>`.
#[derive(Clone, Debug)]
pub struct Pki {
    dir: PathBuf,
}

fn tls_error(what: &str) -> impl Fn(tessera_proto::tls::TlsError) -> KitError + '_ {
    move |e| KitError::Fault { what: what.to_string(), why: e.to_string() }
}

impl Pki {
    /// A new CA in `<dir>/ca`, or the one already there (a restarted `tessera dev --data-dir`).
    pub fn create(dir: &Path) -> Result<Pki, KitError> {
        let ca = dir.join("ca");
        if !ca.join(tessera_proto::tls::material::CA_KEY_FILE).exists() {
            init_dir(&ca, 30).map_err(tls_error("cluster CA"))?;
        }
        Ok(Pki { dir: dir.to_path_buf() })
    }

    /// The CA's directory (`ca.pem`, `ca.key`).
    pub fn ca_dir(&self) -> PathBuf {
        self.dir.join("ca")
    }

    /// Where [`Pki::issue`] puts `role` `name`'s TLS directory (a replica `replica-<id>`'s is
    /// the one it serves with).
    pub fn dir_of(&self, role: Role, name: &str) -> PathBuf {
        self.dir.join(format!("{role}-{name}"))
    }

    /// A TLS directory for `role` `name` (a user's `tenants`), valid 30 days, for loopback
    /// and `hosts`.
    pub fn issue(&self, role: Role, name: &str, tenants: &[&str], hosts: &[&str]) -> Result<PathBuf, KitError> {
        let tenants: Vec<String> = tenants.iter().map(|t| t.to_string()).collect();
        let id = Identity::new(role, name, &tenants)
            .map_err(|e| KitError::Fault { what: "identity".into(), why: e.to_string() })?;
        let mut all = vec!["127.0.0.1".to_string(), "localhost".to_string()];
        all.extend(hosts.iter().map(|h| h.to_string()));
        let out = self.dir_of(role, name);
        let req = Request::for_days(id, all, 30).map_err(tls_error("certificate"))?;
        issue_dir(&self.ca_dir(), &req, &out).map_err(tls_error("certificate"))?;
        Ok(out)
    }

    /// A client's security as `role` `name`.
    pub fn security(&self, role: Role, name: &str, tenants: &[&str]) -> Result<Security, KitError> {
        let dir = self.issue(role, name, tenants, &[])?;
        Ok(Security::Tls(Tls::open(dir).map_err(tls_error("TLS directory"))?))
    }

    /// The operator's security (role admin, name `admin`).
    pub fn admin(&self) -> Result<Security, KitError> {
        self.security(Role::Admin, "admin", &[])
    }
}
