//! Who a caller is: a [`Role`] and a name, and for a user the tenants it acts for.
//!
//! In a certificate the identity is a URI subject alternative name
//! `spiffe://tessera/<role>/<name>` (the SPIFFE ID form), and a user's tenants are further URIs
//! `urn:tessera:tenant:<tenant>`. A bearer token carries the same fields, signed by the
//! cluster CA ([`super::token`]). The cluster's CA is the trust domain: certificates of another
//! CA are refused at the handshake, whatever names they carry.

use serde::{Deserialize, Serialize};
use std::fmt;
use thiserror::Error;

/// The URI prefix of an identity.
pub const ID_PREFIX: &str = "spiffe://tessera/";
/// The URI prefix of a tenant a user acts for.
pub const TENANT_PREFIX: &str = "urn:tessera:tenant:";
/// Longest name or tenant, in bytes.
pub const MAX_NAME: usize = 128;
/// Most tenants of one user.
pub const MAX_TENANTS: usize = 64;

/// What a caller is allowed to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A view replica: speaks raft, and acts for the callers of its HTTP API.
    Replica,
    /// The node agent of the server its name names.
    Agent,
    /// A scheduler host (`tessera scheduler run`) named as in `AdoptJobs`.
    Scheduler,
    /// A user, of the tenants its identity lists.
    User,
    /// An operator: membership, drains, tokens, every tenant.
    Admin,
}

impl Role {
    /// Every role.
    pub const ALL: [Role; 5] = [Role::Replica, Role::Agent, Role::Scheduler, Role::User, Role::Admin];

    /// The role's name in URIs, tokens and flags.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Replica => "replica",
            Role::Agent => "agent",
            Role::Scheduler => "scheduler",
            Role::User => "user",
            Role::Admin => "admin",
        }
    }

    /// The role named `s`.
    pub fn parse(s: &str) -> Result<Role, IdentityError> {
        Role::ALL.into_iter().find(|r| r.as_str() == s).ok_or_else(|| IdentityError::UnknownRole(s.to_string()))
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why an identity is not one.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum IdentityError {
    /// Not a role.
    #[error("unknown role `{0}` (replica, agent, scheduler, user or admin)")]
    UnknownRole(String),
    /// A name or tenant that is empty, too long or has other characters.
    #[error("bad {what} `{value}`: 1 to {MAX_NAME} bytes of letters, digits and . _ - @")]
    BadName {
        /// Name or tenant.
        what: &'static str,
        /// The value.
        value: String,
    },
    /// Tenants on an identity that is not a user's.
    #[error("only a user has tenants; a {0} acts for none")]
    TenantsNotUser(Role),
    /// A user without a tenant.
    #[error("a user acts for at least one tenant")]
    NoTenant,
    /// Too many tenants.
    #[error("{0} tenants; at most {MAX_TENANTS}")]
    TooManyTenants(usize),
    /// No identity URI, or several.
    #[error("the certificate carries {0} identity URIs (`{ID_PREFIX}<role>/<name>`); exactly one is needed")]
    IdentityCount(usize),
    /// A malformed identity URI.
    #[error("`{0}` is not `{ID_PREFIX}<role>/<name>`")]
    BadUri(String),
    /// The certificate itself does not parse.
    #[error("the certificate does not parse: {0}")]
    BadCertificate(String),
}

/// A caller: role, name and (a user's) tenants.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Identity {
    /// The role.
    pub role: Role,
    /// The name: an agent's server, a scheduler host's name, a user's or a replica's name.
    pub name: String,
    /// The tenants a user acts for, sorted; empty for every other role.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tenants: Vec<String>,
}

fn check_name(what: &'static str, value: &str) -> Result<(), IdentityError> {
    let ok = !value.is_empty()
        && value.len() <= MAX_NAME
        && value.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'@'));
    if ok { Ok(()) } else { Err(IdentityError::BadName { what, value: value.to_string() }) }
}

impl Identity {
    /// A checked identity: names of letters, digits and `. _ - @`; tenants for a user alone
    /// (at least one).
    pub fn new(role: Role, name: &str, tenants: &[String]) -> Result<Identity, IdentityError> {
        check_name("name", name)?;
        if role != Role::User && !tenants.is_empty() {
            return Err(IdentityError::TenantsNotUser(role));
        }
        if role == Role::User && tenants.is_empty() {
            return Err(IdentityError::NoTenant);
        }
        if tenants.len() > MAX_TENANTS {
            return Err(IdentityError::TooManyTenants(tenants.len()));
        }
        for t in tenants {
            check_name("tenant", t)?;
        }
        let mut tenants = tenants.to_vec();
        tenants.sort();
        tenants.dedup();
        Ok(Identity { role, name: name.to_string(), tenants })
    }

    /// The identity URI.
    pub fn uri(&self) -> String {
        format!("{ID_PREFIX}{}/{}", self.role, self.name)
    }

    /// Every URI the certificate carries: the identity's, then one per tenant.
    pub fn uris(&self) -> Vec<String> {
        let mut v = vec![self.uri()];
        v.extend(self.tenants.iter().map(|t| format!("{TENANT_PREFIX}{t}")));
        v
    }

    /// The identity in a certificate's URIs (other URIs are ignored).
    pub fn from_uris<'a>(uris: impl IntoIterator<Item = &'a str>) -> Result<Identity, IdentityError> {
        let mut ids = Vec::new();
        let mut tenants = Vec::new();
        for u in uris {
            if let Some(rest) = u.strip_prefix(ID_PREFIX) {
                ids.push((u, rest));
            } else if let Some(t) = u.strip_prefix(TENANT_PREFIX) {
                tenants.push(t.to_string());
            }
        }
        let [(uri, rest)] = ids.as_slice() else { return Err(IdentityError::IdentityCount(ids.len())) };
        let (role, name) = rest.split_once('/').ok_or_else(|| IdentityError::BadUri(uri.to_string()))?;
        Identity::new(Role::parse(role)?, name, &tenants)
    }

    /// The identity of a DER certificate (its URI subject alternative names).
    pub fn from_cert_der(der: &[u8]) -> Result<Identity, IdentityError> {
        let (_, cert) =
            x509_parser::parse_x509_certificate(der).map_err(|e| IdentityError::BadCertificate(e.to_string()))?;
        let san = cert.subject_alternative_name().map_err(|e| IdentityError::BadCertificate(e.to_string()))?;
        let uris = san.into_iter().flat_map(|s| s.value.general_names.iter()).filter_map(|g| match g {
            x509_parser::extensions::GeneralName::URI(u) => Some(*u),
            _ => None,
        });
        Identity::from_uris(uris)
    }

    /// Whether this caller may act for `tenant`: an admin or replica for any, a user for its
    /// own.
    pub fn acts_for(&self, tenant: &str) -> bool {
        match self.role {
            Role::Admin | Role::Replica => true,
            Role::User => self.tenants.iter().any(|t| t == tenant),
            Role::Agent | Role::Scheduler => false,
        }
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} `{}`", self.role, self.name)?;
        if !self.tenants.is_empty() {
            write!(f, " (tenants {})", self.tenants.join(", "))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identity_reads_back_from_its_uris() {
        let u = Identity::new(Role::User, "alice@lab", &["vision".into(), "nlp".into(), "nlp".into()]).expect("ok");
        assert_eq!(u.tenants, vec!["nlp".to_string(), "vision".to_string()]);
        let uris = u.uris();
        assert_eq!(Identity::from_uris(uris.iter().map(String::as_str)), Ok(u.clone()));
        assert!(u.acts_for("nlp") && !u.acts_for("speech"));
        let a = Identity::new(Role::Agent, "gpu-07", &[]).expect("ok");
        assert_eq!(a.uri(), "spiffe://tessera/agent/gpu-07");
        assert!(!a.acts_for("nlp"));
    }

    #[test]
    fn malformed_identities_are_refused_with_the_reason() {
        assert_eq!(Identity::new(Role::User, "bob", &[]), Err(IdentityError::NoTenant));
        assert_eq!(Identity::new(Role::Agent, "s1", &["t".into()]), Err(IdentityError::TenantsNotUser(Role::Agent)));
        assert!(matches!(Identity::new(Role::Admin, "a/b", &[]), Err(IdentityError::BadName { .. })));
        assert!(matches!(Identity::new(Role::Admin, "", &[]), Err(IdentityError::BadName { .. })));
        assert_eq!(Identity::from_uris(["urn:tessera:tenant:x"]), Err(IdentityError::IdentityCount(0)));
        assert_eq!(
            Identity::from_uris(["spiffe://tessera/admin/a", "spiffe://tessera/admin/b"]),
            Err(IdentityError::IdentityCount(2))
        );
        assert_eq!(Identity::from_uris(["spiffe://tessera/root/a"]), Err(IdentityError::UnknownRole("root".into())));
        assert_eq!(
            Identity::from_uris(["spiffe://tessera/admin"]),
            Err(IdentityError::BadUri("spiffe://tessera/admin".into()))
        );
    }
}
