//! `tessera tls init | issue | revoke` and `tessera token create`: the cluster CA, its
//! certificates and bearer tokens, and their revocation; and [`SecurityArgs`], the flags every client command takes (`--tls`,
//! `--token`, `--insecure`).

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use tessera_proto::tls::issue::{Request, init_dir, issue_dir};
use tessera_proto::tls::material::{CA_FILE, CA_KEY_FILE};
use tessera_proto::tls::{CallerAuth, Identity, Role, Security};
use tessera_view_server::ViewClient;

/// How a client connects: its TLS directory (and token), or plaintext.
#[derive(Args, Clone, Debug, Default)]
pub struct SecurityArgs {
    /// TLS directory: `ca.pem`, and `cert.pem` + `key.pem` of your identity (`tessera tls
    /// issue`); with `--token`, `ca.pem` alone is enough.
    #[arg(long, env = "TESSERA_TLS", value_name = "DIR")]
    pub tls: Option<PathBuf>,
    /// A bearer token (`tessera token create`) instead of a client certificate.
    #[arg(long, env = "TESSERA_TOKEN", hide_env_values = true, requires = "tls")]
    pub token: Option<String>,
    /// Plaintext, nothing authenticated: only for a cluster started with --insecure.
    #[arg(long, env = "TESSERA_INSECURE", conflicts_with_all = ["tls", "token"])]
    pub insecure: bool,
}

impl SecurityArgs {
    /// The transport security these flags choose.
    pub fn security(&self, who: &str) -> Result<Security> {
        Ok(Security::client_from_flags(self.tls.clone(), self.insecure, who)?)
    }

    /// `client` with this security and token.
    pub fn apply(&self, client: ViewClient, who: &str) -> Result<ViewClient> {
        let auth = CallerAuth::new(self.token.as_deref(), None)?;
        Ok(client.with_security(self.security(who)?).with_auth(auth))
    }
}

/// How a component (agent, scheduler host) connects: its certificate, or plaintext.
#[derive(Args, Clone, Debug, Default)]
pub struct ComponentTlsArgs {
    /// TLS directory with this component's certificate (`tessera tls issue`): `ca.pem`,
    /// `cert.pem`, `key.pem`.
    #[arg(long, env = "TESSERA_TLS", value_name = "DIR")]
    pub tls: Option<PathBuf>,
    /// Plaintext, nothing authenticated: only with a cluster started --insecure.
    #[arg(long, env = "TESSERA_INSECURE", conflicts_with = "tls")]
    pub insecure: bool,
}

impl ComponentTlsArgs {
    /// The transport security, and the name the certificate gives (a default for `--name`).
    pub fn security(&self, who: &str) -> Result<(Security, Option<String>)> {
        let s = Security::from_flags(self.tls.clone(), self.insecure, who)?;
        let name = s.tls().and_then(|t| t.current().identity.clone()).map(|i| i.name);
        Ok((s, name))
    }
}

/// `tessera tls`.
#[derive(Subcommand)]
pub enum TlsCommand {
    /// Create the cluster CA (`ca.pem`, `ca.key`) in a directory. Keep `ca.key` off the
    /// cluster's machines: it issues every identity.
    Init(InitArgs),
    /// Issue a certificate of the CA: writes `ca.pem`, `cert.pem`, `key.pem` to `--out` (the
    /// directory a component's `--tls` names). Renewing over an existing one is picked up
    /// without a restart.
    Issue(IssueArgs),
    /// Revoke a certificate or a token in TLS directories: adds its fingerprint to the `revoked`
    /// file of each directory given, reloaded within a second. For a running cluster `tessera
    /// policy revoke` is the one step (replicated to every replica and agent); the file serves
    /// a process that reads no view, or a cluster without a leader.
    Revoke(RevokeArgs),
}

#[derive(Args)]
pub struct RevokeArgs {
    /// The TLS directories whose `revoked` file gets the line (every replica's).
    #[arg(long = "tls-dir", value_name = "DIR", required = true)]
    dirs: Vec<PathBuf>,
    /// The certificate to revoke (PEM, as `tessera tls issue` wrote it).
    #[arg(long, value_name = "FILE", required_unless_present = "token", conflicts_with = "token")]
    cert: Option<PathBuf>,
    /// The token to revoke (as `tessera token create` printed it).
    #[arg(long)]
    token: Option<String>,
    /// Why, kept after the fingerprint as a comment (one line).
    #[arg(long, default_value = "")]
    note: String,
}

#[derive(Args)]
pub struct InitArgs {
    /// Where the CA goes.
    #[arg(long, value_name = "DIR")]
    ca: PathBuf,
    /// Validity in days.
    #[arg(long, default_value_t = 3650)]
    days: u32,
}

/// Who a certificate or token is for, and the CA that signs it.
#[derive(Args)]
pub struct IdentityArgs {
    /// The CA's directory (`tessera tls init --ca`).
    #[arg(long, value_name = "DIR")]
    ca: PathBuf,
    #[command(flatten)]
    who: WhoArgs,
}

/// Who a certificate or token is for.
#[derive(Args)]
pub struct WhoArgs {
    /// replica, agent, scheduler, user or admin.
    #[arg(long)]
    role: String,
    /// The identity's name: an agent's server name, a scheduler host's name (as it adopts
    /// jobs), a user's or replica's name.
    #[arg(long)]
    name: String,
    /// A tenant the user acts for (repeat for several; users only).
    #[arg(long = "tenant")]
    tenants: Vec<String>,
}

impl IdentityArgs {
    fn identity(&self) -> Result<Identity> {
        self.who.identity()
    }
}

impl WhoArgs {
    fn identity(&self) -> Result<Identity> {
        Ok(Identity::new(Role::parse(&self.role)?, &self.name, &self.tenants)?)
    }
}

#[derive(Args)]
pub struct IssueArgs {
    #[command(flatten)]
    who: IdentityArgs,
    /// A host name or IP address the component serves on (repeat; replicas and agents).
    #[arg(long = "host")]
    hosts: Vec<String>,
    /// Validity in days.
    #[arg(long, default_value_t = 365)]
    days: u32,
    /// Output directory.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
}

/// `tessera token`.
#[derive(Subcommand)]
pub enum TokenCommand {
    /// Create a bearer token signed by the CA's key (offline, where the key is): printed on
    /// stdout.
    Create(TokenArgs),
    /// Ask the cluster for a bearer token (admins): the replica that answers signs it with its
    /// own certificate, so the CA key stays off the cluster; printed on stdout.
    Issue(IssueTokenArgs),
}

#[derive(Args)]
pub struct IssueTokenArgs {
    #[command(flatten)]
    view: crate::jobs::ViewArg,
    /// Whom for (agent, scheduler, user or admin: replicas use certificates).
    #[command(flatten)]
    who: WhoArgs,
    /// Lifetime in seconds (at most 90 days).
    #[arg(long, default_value_t = 12 * 3600)]
    ttl_s: u64,
}

#[derive(Args)]
pub struct TokenArgs {
    #[command(flatten)]
    who: IdentityArgs,
    /// Lifetime in seconds (at most 90 days).
    #[arg(long, default_value_t = 12 * 3600)]
    ttl_s: u64,
}

pub fn run(cmd: TlsCommand) -> Result<ExitCode> {
    match cmd {
        TlsCommand::Init(a) => {
            init_dir(&a.ca, a.days)?;
            println!("cluster CA in {} ({CA_FILE}, {CA_KEY_FILE}; keep {CA_KEY_FILE} private)", a.ca.display());
        }
        TlsCommand::Issue(a) => {
            let id = a.who.identity()?;
            if matches!(id.role, Role::Replica) && a.hosts.is_empty() {
                bail!("a replica serves: give the names or addresses its peers and clients dial (--host)");
            }
            let req = Request::for_days(id.clone(), a.hosts, a.days)?;
            issue_dir(&a.who.ca, &req, &a.out)?;
            println!("certificate for {id}, valid {} days: {}", a.days, a.out.display());
        }
        TlsCommand::Revoke(a) => revoke(&a)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// Appends the certificate's or token's fingerprint to each directory's `revoked` file, by a
/// rename over it (a replica reading it meanwhile sees the old list or the new, never half).
fn revoke(a: &RevokeArgs) -> Result<()> {
    use tessera_proto::tls::material::{REVOKED_FILE, certificate_der, fingerprint};
    let (fp, what) = match (&a.cert, &a.token) {
        (Some(path), _) => {
            let der = certificate_der(path)?;
            let who = Identity::from_cert_der(&der).map_or_else(|e| format!("? ({e})"), |i| i.to_string());
            (fingerprint(&der), format!("certificate of {who}"))
        }
        (None, Some(t)) => (fingerprint(t.trim().as_bytes()), "token".to_string()),
        (None, None) => bail!("give --cert FILE or --token TOKEN"),
    };
    let note = a.note.replace(['\n', '\r'], " ");
    for dir in &a.dirs {
        let path = dir.join(REVOKED_FILE);
        let mut text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        if text.lines().any(|l| l.split_whitespace().next() == Some(fp.as_str())) {
            println!("{}: {fp} is already revoked", path.display());
            continue;
        }
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&format!("{fp} {what} {note}\n"));
        let tmp = dir.join(format!(".{REVOKED_FILE}.tmp"));
        std::fs::write(&tmp, &text).with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("cannot replace {}", path.display()))?;
        println!("{}: revoked {what} ({fp})", path.display());
    }
    Ok(())
}

pub fn token(cmd: TokenCommand) -> Result<ExitCode> {
    match cmd {
        TokenCommand::Create(a) => {
            let id = a.who.identity()?;
            let key = read(&a.who.ca.join(CA_KEY_FILE))?;
            println!("{}", tessera_proto::tls::token::create(&key, &id, tessera_proto::tls::unix_s(), a.ttl_s)?);
        }
        TokenCommand::Issue(a) => {
            let r = crate::jobs::rt()?.block_on(async move {
                let mut c = a.view.client()?;
                anyhow::Ok(c.issue_token(&a.who.role, &a.who.name, &a.who.tenants, a.ttl_s).await?)
            })?;
            eprintln!("token signed by replica `{}`, expires at {} (Unix s)", r.signer, r.expires_s);
            println!("{}", r.token);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn read(p: &Path) -> Result<String> {
    std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))
}
