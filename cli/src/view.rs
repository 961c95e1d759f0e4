//! `tessera view …`: run a replica of the cluster view, inspect and change the replica set.

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use tessera_view_server::{Listeners, ServeFile, ViewClient};

#[derive(Subcommand)]
pub enum ViewCommand {
    /// Run one replica of the cluster view (raft on RocksDB, gRPC API).
    Serve(ServeArgs),
    /// Show each replica's role, term, applied index and state hash.
    Status(AddrArgs),
    /// Add a replica (start it first with `join = true`).
    AddReplica(MemberArgs),
    /// Remove a replica from the voters.
    RemoveReplica(MemberArgs),
}

#[derive(Args)]
pub struct ServeArgs {
    /// Config file (TOML); flags override its values. Sockets passed by the parent process
    /// (systemd socket activation: LISTEN_FDS, LISTEN_FDNAMES = client:raft:http) are served
    /// instead of binding the file's addresses, which they must match.
    #[arg(long)]
    config: PathBuf,
    /// Replica id.
    #[arg(long)]
    id: Option<u64>,
    /// gRPC listen address.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// RocksDB directory.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Founding voters, `id=host:port,...`.
    #[arg(long, value_delimiter = ',')]
    peers: Option<Vec<String>>,
    /// Milliseconds per raft tick.
    #[arg(long)]
    tick_ms: Option<u64>,
    /// Election timeout in ticks.
    #[arg(long)]
    election_tick: Option<usize>,
    /// Heartbeat interval in ticks.
    #[arg(long)]
    heartbeat_tick: Option<usize>,
    /// TLS directory of this replica's certificate (`tessera tls issue --role replica`);
    /// overrides the file's `tls`.
    #[arg(long, value_name = "DIR", conflicts_with = "insecure")]
    tls: Option<PathBuf>,
    /// Plaintext, nothing authenticated; overrides the file's `tls`.
    #[arg(long)]
    insecure: bool,
}

#[derive(Args)]
pub struct AddrArgs {
    /// Replica addresses, comma-separated (default: $TESSERA_VIEW).
    #[arg(long, env = "TESSERA_VIEW")]
    view: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    security: crate::tls::SecurityArgs,
}

#[derive(Args)]
pub struct MemberArgs {
    /// Replica addresses, comma-separated (default: $TESSERA_VIEW).
    #[arg(long, env = "TESSERA_VIEW")]
    view: String,
    /// The replica's id.
    #[arg(long)]
    id: u64,
    /// The replica's client address (add only).
    #[arg(long, default_value = "")]
    addr: String,
    /// The replica's raft address, when raft has its own port (add only).
    #[arg(long, default_value = "")]
    raft_addr: String,
    #[command(flatten)]
    security: crate::tls::SecurityArgs,
}

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the async runtime")
}

pub fn run(cmd: ViewCommand) -> Result<ExitCode> {
    match cmd {
        ViewCommand::Serve(args) => serve(args),
        ViewCommand::Status(args) => status(args),
        ViewCommand::AddReplica(args) => member(args, true),
        ViewCommand::RemoveReplica(args) => member(args, false),
    }
}

fn serve(args: ServeArgs) -> Result<ExitCode> {
    let mut file = ServeFile::from_file(&args.config)?;
    if let Some(v) = args.id {
        file.id = v;
    }
    if let Some(v) = args.listen {
        file.listen = v;
    }
    if let Some(v) = args.data_dir {
        file.data_dir = v;
    }
    if let Some(v) = args.peers {
        file.peers = v;
    }
    if let Some(v) = args.tick_ms {
        file.tuning.tick_ms = v;
    }
    if let Some(v) = args.election_tick {
        file.tuning.election_tick = v;
    }
    if let Some(v) = args.heartbeat_tick {
        file.tuning.heartbeat_tick = v;
    }
    if let Some(v) = args.tls {
        (file.tls, file.insecure) = (Some(v), false);
    }
    if args.insecure {
        (file.tls, file.insecure) = (None, true);
    }
    let listen = file.listen_addrs();
    let cfg = file.into_config()?;
    // Sockets bound by whoever started this process (systemd, the test kit) come first; they
    // must be where the configuration says, since that is the address peers are given.
    let listeners = match Listeners::inherited()? {
        Some(l) => {
            l.check_bound_at(&listen)?;
            tracing::info!(client = %listen.client, "serving on sockets passed by the parent process");
            l
        }
        None => Listeners::bind(&listen)?,
    };
    let rt = runtime()?;
    rt.block_on(async move { tessera_view_server::serve(listeners, cfg, terminated()).await })?;
    Ok(ExitCode::SUCCESS)
}

/// Serves `metrics` for Prometheus at `addr` (`GET /metrics`, `GET /healthz`) while the
/// process runs, over TLS with the component's own certificate when it has one; answers the
/// bound address (`addr` may ask for port 0).
pub(crate) async fn serve_metrics(
    addr: &str,
    security: &tessera_proto::tls::Security,
    metrics: std::sync::Arc<tessera_proto::prom::Metrics>,
) -> Result<SocketAddr> {
    let bound = tessera_proto::prom::serve(
        addr,
        security,
        std::sync::Arc::new(move || metrics.render()),
        std::future::pending(),
    )
    .await
    .context("cannot serve metrics")?;
    tracing::info!(addr = %bound, "metrics served at /metrics");
    Ok(bound)
}

/// Resolves on SIGINT or SIGTERM.
pub(crate) async fn terminated() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
}

fn status(args: AddrArgs) -> Result<ExitCode> {
    let rt = runtime()?;
    rt.block_on(async move {
        let mut c =
            args.security.apply(ViewClient::from_list(&args.view)?.with_deadline(Duration::from_secs(2)), "the CLI")?;
        let addrs: Vec<String> = args.view.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
        let mut rows = Vec::new();
        let mut any = false;
        for addr in &addrs {
            match c.status_of(addr).await {
                Ok(s) => {
                    any = true;
                    rows.push(serde_json::json!({
                        "addr": addr, "replica": s.replica, "role": s.role, "leader": s.leader,
                        "leader_addr": s.leader_addr, "term": s.term, "applied_index": s.applied_index,
                        "version": s.version, "voters": s.voters, "log_entries": s.log_entries,
                        "state_hash": format!("{:016x}", s.state_hash), "cluster": s.cluster,
                    }));
                }
                Err(e) => rows.push(serde_json::json!({ "addr": addr, "error": e.to_string() })),
            }
        }
        if args.json {
            println!("{}", serde_json::Value::Array(rows));
        } else {
            println!(
                "{:<22} {:>7} {:<10} {:>6} {:>6} {:>10} {:>10} {:<16}",
                "ADDRESS", "REPLICA", "ROLE", "LEADER", "TERM", "APPLIED", "VERSION", "STATE HASH"
            );
            let text = |v: &serde_json::Value| match v {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            for r in &rows {
                if let Some(e) = r.get("error") {
                    println!("{:<22} unreachable: {}", text(&r["addr"]), text(e));
                    continue;
                }
                println!(
                    "{:<22} {:>7} {:<10} {:>6} {:>6} {:>10} {:>10} {:<16}",
                    text(&r["addr"]),
                    text(&r["replica"]),
                    text(&r["role"]),
                    text(&r["leader"]),
                    text(&r["term"]),
                    text(&r["applied_index"]),
                    text(&r["version"]),
                    text(&r["state_hash"])
                );
            }
        }
        if !any {
            bail!("no replica answered (tried {})", addrs.join(", "));
        }
        Ok(ExitCode::SUCCESS)
    })
}

fn member(args: MemberArgs, add: bool) -> Result<ExitCode> {
    if add && args.addr.is_empty() {
        bail!("--addr is required to add a replica");
    }
    let rt = runtime()?;
    rt.block_on(async move {
        let mut c = args.security.apply(ViewClient::from_list(&args.view)?, "the CLI")?;
        let voters = if add {
            c.add_replica(args.id, &args.addr, &args.raft_addr).await?
        } else {
            c.remove_replica(args.id).await?
        };
        println!("voters: {voters:?}");
        Ok(ExitCode::SUCCESS)
    })
}
