//! `tessera servers`: the servers, filtered and paged (the default), one in detail with its health history, an
//! operator's cordon, drain or uncordon of one, and servers added or removed (`layout`).

use crate::jobs::{self, ListArgs, ViewArg, rt, snapshot};
use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use std::process::ExitCode;
use tessera_proto::api::{CordonChanged, MAX_SERVER_PAGE, ServerDetail, ServerFilter};
use tessera_proto::v1;
use tessera_view::ViewSnapshot;

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ServersArgs {
    #[command(subcommand)]
    action: Option<ServersAction>,
    #[command(flatten)]
    list: ListArgs,
    #[command(flatten)]
    filter: FilterArgs,
}

/// Which servers the list shows (the filter of `GET /v1/servers`).
#[derive(Args)]
pub struct FilterArgs {
    /// Only these healths, comma-separated (up, draining, down, removed); without it, every
    /// server but the removed ones.
    #[arg(long)]
    health: Option<String>,
    /// Only this rack's servers.
    #[arg(long)]
    rack: Option<String>,
    /// Only servers of this GPU type (e.g. nvidia-h100-80g).
    #[arg(long = "type")]
    device_type: Option<String>,
    /// Only servers with at least this many GPUs free to place on.
    #[arg(long, default_value_t = 0)]
    min_free_gpus: u32,
    /// Only cordoned servers (draining ones included).
    #[arg(long, conflicts_with = "uncordoned")]
    cordoned: bool,
    /// Only servers without a cordon.
    #[arg(long)]
    uncordoned: bool,
    /// Only ids above this (the previous page's last id).
    #[arg(long)]
    after: Option<u32>,
    /// Servers per page, at most 100,000.
    #[arg(long, default_value_t = 10_000)]
    limit: usize,
}

impl FilterArgs {
    fn filter(&self) -> Result<ServerFilter> {
        if self.limit == 0 || self.limit > MAX_SERVER_PAGE {
            anyhow::bail!("--limit must be 1 to {MAX_SERVER_PAGE}");
        }
        Ok(ServerFilter {
            health: match &self.health {
                Some(h) => ServerFilter::parse_health(h).map_err(anyhow::Error::msg)?,
                None => Vec::new(),
            },
            rack: self.rack.clone(),
            device_type: self.device_type.clone(),
            min_free_gpus: self.min_free_gpus,
            cordoned: match (self.cordoned, self.uncordoned) {
                (true, _) => Some(true),
                (_, true) => Some(false),
                _ => None,
            },
            after: self.after,
            limit: self.limit,
        })
    }
}

#[derive(Subcommand)]
pub enum ServersAction {
    /// One server in detail: health, GPUs, cordon, and its latest health changes.
    Show(ShowArgs),
    /// No new placements on SERVER; its running gangs go on. Lasts until `uncordon`, across
    /// agent restarts and lost leases.
    Cordon(CordonArgs),
    /// Cordon SERVER; move its gangs now where they fit no looser (checkpointed and
    /// restarted there), and re-queue those still on it after --timeout-s (whole, to restart
    /// elsewhere from their checkpoints).
    Drain(DrainArgs),
    /// Lift SERVER's cordon: it takes placements again.
    Uncordon(UncordonArgs),
    /// Add servers to a configuration set of the running cluster (admins); each is down until
    /// its agent registers with the set's topology.
    Add(crate::layout::AddServersArgs),
    /// Remove SERVER from the running cluster (admins): no gang may be on it (drain it first).
    /// Its id is never reused; its name may be given to a new server.
    Remove(crate::layout::RemoveServerArgs),
}

#[derive(Args)]
pub struct ShowArgs {
    #[command(flatten)]
    view: ViewArg,
    /// The server's name.
    server: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct CordonArgs {
    #[command(flatten)]
    view: ViewArg,
    /// The server's name.
    server: String,
    /// Why (kept with the cordon and in the server's history; at most 256 characters).
    #[arg(long, default_value = "")]
    reason: String,
}

#[derive(Args)]
pub struct DrainArgs {
    #[command(flatten)]
    view: ViewArg,
    /// The server's name.
    server: String,
    /// Why (kept with the cordon and in the server's history; at most 256 characters).
    #[arg(long, default_value = "")]
    reason: String,
    /// Seconds the running gangs have to finish before they are re-queued (at most 30 days).
    #[arg(long, default_value_t = 3600)]
    timeout_s: u64,
}

#[derive(Args)]
pub struct UncordonArgs {
    #[command(flatten)]
    view: ViewArg,
    /// The server's name.
    server: String,
}

pub fn run(args: ServersArgs) -> Result<ExitCode> {
    match args.action {
        None => jobs::servers(args.list, args.filter.filter()?),
        Some(ServersAction::Show(a)) => show(a),
        Some(ServersAction::Cordon(a)) => change(&a.view, &a.server, v1::CordonAction::Cordon, &a.reason, 0),
        Some(ServersAction::Drain(a)) => change(&a.view, &a.server, v1::CordonAction::Drain, &a.reason, a.timeout_s),
        Some(ServersAction::Uncordon(a)) => change(&a.view, &a.server, v1::CordonAction::Uncordon, "", 0),
        Some(ServersAction::Add(a)) => crate::layout::add_servers(a),
        Some(ServersAction::Remove(a)) => crate::layout::remove_server(a),
    }
}

/// A server's id by name: the last server of that name (a removed server's name may have
/// been given to a later one, which it then means).
pub(crate) fn server_index(snap: &ViewSnapshot, name: &str) -> Result<usize> {
    snap.server_names.iter().rposition(|n| n == name).with_context(|| {
        let known = snap.server_names.iter().take(8).cloned().collect::<Vec<_>>().join(", ");
        format!(
            "no server `{name}` in the view (servers: {known}{})",
            if snap.server_names.len() > 8 { ", …" } else { "" }
        )
    })
}

fn change(view: &ViewArg, name: &str, action: v1::CordonAction, reason: &str, timeout_s: u64) -> Result<ExitCode> {
    rt()?.block_on(async move {
        let mut c = view.client()?;
        let (snap, _) = snapshot(&mut c).await?;
        let id = server_index(&snap, name)? as u32;
        let version = c.cordon_server(id, action, reason, timeout_s).await?;
        let done = CordonChanged { server: name.to_string(), action: action_word(action).into(), version };
        match action {
            v1::CordonAction::Drain => println!(
                "draining {}: no new placements; gangs move where they fit, those still there in {timeout_s} s are re-queued (view version {})",
                done.server, done.version
            ),
            v1::CordonAction::Cordon => {
                println!("cordoned {}: no new placements (view version {})", done.server, done.version)
            }
            _ => println!("uncordoned {}: takes placements again (view version {})", done.server, done.version),
        }
        Ok(ExitCode::SUCCESS)
    })
}

fn action_word(a: v1::CordonAction) -> &'static str {
    match a {
        v1::CordonAction::Cordon => "cordon",
        v1::CordonAction::Drain => "drain",
        v1::CordonAction::Uncordon => "uncordon",
        v1::CordonAction::Unspecified => "unspecified",
    }
}

/// `at_ms` as seconds before `now_ms`, or `-` when it was not recorded.
fn ago(at_ms: u64, now_ms: u64) -> String {
    if at_ms == 0 {
        return "-".into();
    }
    let s = now_ms.saturating_sub(at_ms) / 1000;
    match s {
        0..=119 => format!("{s} s ago"),
        120..=7199 => format!("{} min ago", s / 60),
        _ => format!("{} h ago", s / 3600),
    }
}

fn show(args: ShowArgs) -> Result<ExitCode> {
    rt()?.block_on(async move {
        let mut c = args.view.client()?;
        let (snap, _) = snapshot(&mut c).await?;
        let i = server_index(&snap, &args.server)?;
        let d = ServerDetail::of(&snap, i).context("the server has no record")?;
        if args.json {
            println!("{}", serde_json::to_string(&d)?);
            return Ok(ExitCode::SUCCESS);
        }
        let now = tessera_view_server::node::unix_ms();
        let s = &d.server;
        println!("{} (id {}), {} in rack {} / {}", s.name, s.id, s.topology, s.rack, s.ib_domain);
        println!("  health   {}", s.health.as_str());
        println!("  GPUs     {} ({} of {} free, x used . free ! unhealthy)", s.gpu_bitmap, s.gpus_free, s.gpus);
        println!(
            "  cores    {}/{} free, memory {}/{} MiB free",
            s.cores_free, s.cores, s.memory_free_mib, s.memory_mib
        );
        match &s.cordon {
            Some(c) => {
                let drain = match c.drain_by_ms {
                    Some(by) if by > now => format!(", draining: gangs re-queued in {} s", (by - now) / 1000),
                    Some(_) => ", draining: deadline passed".into(),
                    None => String::new(),
                };
                println!("  cordon   since {}{drain}: {}", ago(c.since_ms, now), c.reason);
            }
            None => println!("  cordon   none"),
        }
        println!("  history  (oldest first)");
        println!("    {:>8} {:>12} {:<9} {:<8} WHAT", "VERSION", "WHEN", "HEALTH", "CORDONED");
        for h in &d.history {
            println!(
                "    {:>8} {:>12} {:<9} {:<8} {}",
                h.version,
                ago(h.at_ms, now),
                h.health.as_str(),
                if h.cordoned { "yes" } else { "no" },
                h.why
            );
        }
        if d.history.is_empty() {
            println!("    (no changes since the cluster started)");
        }
        Ok(ExitCode::SUCCESS)
    })
}
