//! `tessera policy` (show), `tessera policy quota TENANT GPUS|none [--class CLASS]` and
//! `tessera policy class CLASS PRIORITY|none`: tenants' GPU quotas (over all their jobs, or at
//! a priority class and above) and the priority classes of a running cluster,
//! changed by an admin through the `SetPolicy` RPC (replicated and validated by the view; its
//! refusals come back in its words). A quota binds new placements and submissions, not jobs
//! already holding GPUs; a class applies to jobs submitted afterwards.

use crate::jobs::{ViewArg, rt, snapshot};
use anyhow::{Result, bail};
use clap::{Args, Subcommand};
use std::process::ExitCode;
use tessera_proto::api::Policy;
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
        Ok(ExitCode::SUCCESS)
    })
}
