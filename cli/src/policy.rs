//! `tessera policy` (show), `tessera policy quota TENANT GPUS|none [--class CLASS]`,
//! `tessera policy class CLASS PRIORITY|none` and `tessera policy revoke|unrevoke CREDENTIAL`:
//! tenants' GPU quotas (over all their jobs, or at a priority class and above), the priority
//! classes and the revoked credentials of a running cluster, changed by an admin through the
//! `SetPolicy` RPC (replicated and validated by the view; its refusals come back in its words).
//! A quota binds new placements and submissions, not jobs already holding GPUs; a class applies
//! to jobs submitted afterwards; a revocation applies to every call from the moment a replica
//! applies it.

use crate::jobs::{ViewArg, rt, snapshot};
use anyhow::{Result, bail};
use clap::{Args, Subcommand};
use std::process::ExitCode;
use tessera_proto::api::Policy;
use tessera_proto::tls::credential::Credential;
use tessera_proto::v1;
use tessera_proto::v1::policy_request::Change;

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct PolicyArgs {
    #[command(subcommand)]
    action: Option<PolicyAction>,
    #[command(flatten)]
    view: ViewArg,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
pub enum PolicyAction {
    /// Set a tenant's GPU quota, or remove it with `none` (no bound); with `--class`, its quota
    /// at that priority class and above.
    Quota(QuotaArgs),
    /// Set a priority class's priority (adding the class), or remove the class with `none`.
    Class(ClassArgs),
    /// Revoke a certificate or bearer token cluster-wide (a stolen key, a leaked token): every
    /// replica refuses it from the moment it applies the change, every agent's log service once
    /// its watch brings it; no file to copy, no restart. The entry leaves the list when the
    /// credential expires.
    Revoke(RevokeArgs),
    /// Take a credential off the revocation list.
    Unrevoke(UnrevokeArgs),
}

#[derive(Args)]
pub struct RevokeArgs {
    #[command(flatten)]
    view: ViewArg,
    /// The certificate file (PEM) or the token text (`tsr1.…`) to revoke; or its fingerprint
    /// (`sha256:…`) with --not-after-ms.
    credential: String,
    /// Why (kept with the entry: at most 256 characters, no control characters).
    #[arg(long, default_value = "")]
    note: String,
    /// With a fingerprint: when the credential expires, Unix ms (read from the certificate or
    /// token otherwise).
    #[arg(long)]
    not_after_ms: Option<u64>,
}

#[derive(Args)]
pub struct UnrevokeArgs {
    #[command(flatten)]
    view: ViewArg,
    /// The certificate file, the token text or the fingerprint.
    credential: String,
}

#[derive(Args)]
pub struct QuotaArgs {
    #[command(flatten)]
    view: ViewArg,
    /// The tenant.
    tenant: String,
    /// GPUs, or `none`.
    gpus: String,
    /// Bound only the tenant's jobs at this class's priority and above (by number, whatever
    /// class they named).
    #[arg(long)]
    class: Option<String>,
}

#[derive(Args)]
pub struct ClassArgs {
    #[command(flatten)]
    view: ViewArg,
    /// The class.
    class: String,
    /// Its priority (higher preempts lower), or `none`.
    priority: String,
}

/// `none`, or a number.
fn number_or_none<T: std::str::FromStr>(text: &str, what: &str) -> Result<Option<T>> {
    if text == "none" {
        return Ok(None);
    }
    match text.parse() {
        Ok(n) => Ok(Some(n)),
        Err(_) => bail!("{what} `{text}`: give a number, or `none`"),
    }
}

/// The fingerprint of a credential given as a file, a token or a fingerprint, with what it
/// says of itself (none for a bare fingerprint).
fn credential(given: &str) -> Result<(String, Option<Credential>)> {
    if given.starts_with("sha256:") {
        tessera_view::revocation::check_fingerprint(given)?;
        return Ok((given.to_string(), None));
    }
    let c = Credential::of(given)?;
    Ok((c.fingerprint.clone(), Some(c)))
}

pub fn run(args: PolicyArgs) -> Result<ExitCode> {
    let (view, change, what) = match args.action {
        None => return show(args.view, args.json),
        Some(PolicyAction::Quota(q)) => {
            let gpus = number_or_none::<u32>(&q.gpus, "GPUs")?;
            let at = q.class.as_ref().map(|c| format!(" at class `{c}` and above")).unwrap_or_default();
            let what = match gpus {
                Some(g) => format!("tenant `{}` may hold {g} GPUs{at}", q.tenant),
                None => format!("tenant `{}` has no quota{at}", q.tenant),
            };
            (q.view, Change::Quota(v1::SetQuota { tenant: q.tenant, gpus, class: q.class }), what)
        }
        Some(PolicyAction::Class(c)) => {
            let priority = number_or_none::<i32>(&c.priority, "priority")?;
            let what = match priority {
                Some(p) => format!("class `{}` has priority {p}", c.class),
                None => format!("class `{}` is removed", c.class),
            };
            (c.view, Change::PriorityClass(v1::SetPriorityClass { class: c.class, priority }), what)
        }
        Some(PolicyAction::Revoke(r)) => {
            let (fingerprint, cred) = credential(&r.credential)?;
            let (not_after_ms, subject, what) = match (&cred, r.not_after_ms) {
                (_, Some(ms)) => (ms, cred.as_ref().map(|c| c.subject.clone()).unwrap_or_default(), "credential"),
                (Some(c), None) => (c.not_after_s.saturating_mul(1000), c.subject.clone(), c.kind),
                (None, None) => bail!("a fingerprint alone says nothing of its expiry: give --not-after-ms"),
            };
            let entry = v1::Revocation {
                fingerprint: fingerprint.clone(),
                subject: subject.clone(),
                not_after_ms,
                note: r.note,
                at_ms: 0,
            };
            let what = format!("revoked {what} {fingerprint} of {subject} until it expires at {not_after_ms} ms");
            (r.view, Change::Revocation(v1::SetRevocation { fingerprint, revocation: Some(entry) }), what)
        }
        Some(PolicyAction::Unrevoke(u)) => {
            let (fingerprint, _) = credential(&u.credential)?;
            let what = format!("{fingerprint} is not revoked");
            (u.view, Change::Revocation(v1::SetRevocation { fingerprint, revocation: None }), what)
        }
    };
    rt()?.block_on(async move {
        let mut c = view.client()?;
        let version = c.set_policy(change).await?;
        println!("{what} (view version {version})");
        Ok(ExitCode::SUCCESS)
    })
}

/// The quotas (with what each tenant holds) and classes in force, from the view; `--json`
/// prints what `GET /v1/policy` answers.
fn show(view: ViewArg, json: bool) -> Result<ExitCode> {
    rt()?.block_on(async move {
        let mut c = view.client()?;
        let (s, _) = snapshot(&mut c).await?;
        let p = Policy::of(&s);
        if json {
            println!("{}", serde_json::to_string_pretty(&p)?);
            return Ok(ExitCode::SUCCESS);
        }
        println!("quotas (GPUs per tenant){}", if p.quotas.is_empty() { ": none" } else { "" });
        if !p.quotas.is_empty() {
            println!("  {:<24} {:>6} {:>6}", "TENANT", "QUOTA", "HELD");
        }
        for q in &p.quotas {
            println!("  {:<24} {:>6} {:>6}", q.tenant, q.gpus, q.held);
        }
        if !p.class_quotas.is_empty() {
            println!("quotas at a class and above");
            println!("  {:<24} {:<16} {:>6} {:>6}", "TENANT", "CLASS", "QUOTA", "HELD");
        }
        for q in &p.class_quotas {
            println!("  {:<24} {:<16} {:>6} {:>6}", q.tenant, q.class, q.gpus, q.held);
        }
        println!("priority classes (a job is preempted at most {} times)", p.max_preemptions);
        for c in &p.classes {
            println!("  {:<24} {}", c.class, c.priority);
        }
        println!("revoked credentials{}", if p.revocations.is_empty() { ": none" } else { "" });
        for r in &p.revocations {
            println!("  {} {:<24} until {} ms  {}", r.fingerprint, r.subject, r.not_after_ms, r.note);
        }
        Ok(ExitCode::SUCCESS)
    })
}
