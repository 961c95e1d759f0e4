//! `tessera config-sets` (list, add, remove) and `tessera servers add|remove`: the cluster's
//! configuration sets, and an operator's layout changes on the running cluster (the
//! `ChangeLayout` RPC; admins only). The view validates each change; its refusals come back in
//! its words.

use crate::jobs::{ViewArg, rt, snapshot};
use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use tessera_proto::api::{ConfigSetList, LayoutChanged, free_server_names};
use tessera_proto::v1;
use tessera_proto::v1::layout_request::Change;
use tessera_view::Topology;
use tessera_view::layout::MAX_SERVERS_PER_ADD;

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ConfigSetsArgs {
    #[command(subcommand)]
    action: Option<ConfigSetsAction>,
    #[command(flatten)]
    view: ViewArg,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
pub enum ConfigSetsAction {
    /// Add a configuration set (a topology in a rack and InfiniBand domain), with no servers
    /// yet; then `tessera servers add --config-set ID`.
    Add(AddConfigSetArgs),
    /// Remove a configuration set none of whose servers is left.
    Remove(RemoveConfigSetArgs),
}

#[derive(Args)]
pub struct AddConfigSetArgs {
    #[command(flatten)]
    view: ViewArg,
    /// Its rack (a known rack keeps its InfiniBand domain).
    #[arg(long)]
    rack: String,
    /// Its InfiniBand domain.
    #[arg(long)]
    ib_domain: String,
    /// A compiled-in topology preset (seed-8gpu, dgx1-v100, dgx-h100, pcie-4gpu).
    #[arg(long, required_unless_present = "topology_file", conflicts_with = "topology_file")]
    topology: Option<String>,
    /// A topology file (TOML), as `tessera check` reads it.
    #[arg(long)]
    topology_file: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct RemoveConfigSetArgs {
    #[command(flatten)]
    view: ViewArg,
    /// The configuration set: its id, or its name `<rack>/<topology>`.
    config_set: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct AddServersArgs {
    #[command(flatten)]
    view: ViewArg,
    /// The configuration set: its id, or its name `<rack>/<topology>`.
    #[arg(long)]
    config_set: String,
    /// Add this many, named `<rack>-sNN` with the smallest numbers free (instead of names).
    #[arg(long, conflicts_with = "names", required_unless_present = "names")]
    count: Option<u32>,
    /// The new servers' names (each agent registers under its name).
    names: Vec<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct RemoveServerArgs {
    #[command(flatten)]
    view: ViewArg,
    /// The server's name; no gang may be on it (drain it first).
    server: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub fn config_sets(args: ConfigSetsArgs) -> Result<ExitCode> {
    match args.action {
        None => list(&args.view, args.json),
        Some(ConfigSetsAction::Add(a)) => add_config_set(a),
        Some(ConfigSetsAction::Remove(a)) => remove_config_set(a),
    }
}

fn list(view: &ViewArg, json: bool) -> Result<ExitCode> {
    rt()?.block_on(async move {
        let mut c = view.client()?;
        let (snap, _) = snapshot(&mut c).await?;
        let list = ConfigSetList::of(&snap);
        if json {
            println!("{}", serde_json::to_string_pretty(&list)?);
            return Ok(ExitCode::SUCCESS);
        }
        println!(
            "{:>4}  {:<28} {:<12} {:<12} {:<18} {:>5} {:>7}  STATE",
            "ID", "NAME", "RACK", "IB", "TYPE", "GPUS", "SERVERS"
        );
        for cs in &list.config_sets {
            println!(
                "{:>4}  {:<28} {:<12} {:<12} {:<18} {:>5} {:>7}  {}",
                cs.id,
                cs.name,
                cs.rack,
                cs.ib_domain,
                cs.device_type,
                cs.gpus_per_server,
                cs.servers,
                if cs.removed { "removed" } else { "live" }
            );
        }
        Ok(ExitCode::SUCCESS)
    })
}

fn add_config_set(a: AddConfigSetArgs) -> Result<ExitCode> {
    let topology = match (&a.topology, &a.topology_file) {
        (Some(name), _) => Topology::preset(name).with_context(|| {
            let known: Vec<&str> = tessera_view::topology::PRESETS.iter().map(|(n, _)| *n).collect();
            format!("unknown topology preset `{name}` (known: {})", known.join(", "))
        })?,
        (None, Some(path)) => Topology::from_file(path)?,
        (None, None) => anyhow::bail!("give --topology PRESET or --topology-file FILE"),
    };
    let change = Change::AddConfigSet(v1::AddConfigSet {
        rack: a.rack.clone(),
        ib_domain: a.ib_domain.clone(),
        topology: Some(v1::Topology::from(&topology)),
    });
    rt()?.block_on(async move {
        let r = a.view.client()?.change_layout(change).await?;
        let done = LayoutChanged {
            action: "add-config-set".into(),
            version: r.version,
            config_set: r.config_set,
            servers: Vec::new(),
        };
        print(&done, a.json, || {
            format!(
                "added configuration set {} ({}/{}, domain {}): add servers with `tessera servers add --config-set {}`",
                r.config_set.unwrap_or_default(),
                a.rack,
                topology.name,
                a.ib_domain,
                r.config_set.unwrap_or_default()
            )
        })
    })
}

fn remove_config_set(a: RemoveConfigSetArgs) -> Result<ExitCode> {
    rt()?.block_on(async move {
        let mut c = a.view.client()?;
        let (snap, _) = snapshot(&mut c).await?;
        let list = ConfigSetList::of(&snap);
        let cs = list.find(&a.config_set).map_err(anyhow::Error::msg)?;
        let (id, name) = (cs.id, cs.name.clone());
        let r = c.change_layout(Change::RemoveConfigSet(v1::RemoveConfigSet { config_set: id })).await?;
        let done = LayoutChanged {
            action: "remove-config-set".into(),
            version: r.version,
            config_set: Some(id),
            servers: Vec::new(),
        };
        print(&done, a.json, || format!("removed configuration set {id} ({name})"))
    })
}

pub fn add_servers(a: AddServersArgs) -> Result<ExitCode> {
    if let Some(n) = a.count
        && !(1..=MAX_SERVERS_PER_ADD as u32).contains(&n)
    {
        anyhow::bail!("--count must be 1 to {MAX_SERVERS_PER_ADD}");
    }
    rt()?.block_on(async move {
        let mut c = a.view.client()?;
        let (snap, _) = snapshot(&mut c).await?;
        let cs = ConfigSetList::of(&snap).find(&a.config_set).map_err(anyhow::Error::msg)?.clone();
        let names = match a.count {
            Some(n) => free_server_names(&snap, cs.id, n as usize).context("the configuration set vanished")?,
            None => a.names.clone(),
        };
        let r = c.change_layout(Change::AddServers(v1::AddServers { config_set: cs.id, names })).await?;
        let done = LayoutChanged { action: "add-servers".into(), version: r.version, config_set: Some(cs.id), servers: r.names };
        print(&done, a.json, || {
            format!(
                "added {} server(s) to {} ({}): {}; each is down until its agent registers (tessera agent run --name NAME)",
                done.servers.len(),
                cs.id,
                cs.name,
                done.servers.join(", ")
            )
        })
    })
}

pub fn remove_server(a: RemoveServerArgs) -> Result<ExitCode> {
    rt()?.block_on(async move {
        let mut c = a.view.client()?;
        let (snap, _) = snapshot(&mut c).await?;
        let id = crate::servers::server_index(&snap, &a.server)? as u32;
        let r = c.change_layout(Change::RemoveServer(v1::RemoveServer { server: id })).await?;
        let done = LayoutChanged {
            action: "remove-server".into(),
            version: r.version,
            config_set: None,
            servers: vec![a.server.clone()],
        };
        print(&done, a.json, || format!("removed {} from the cluster (view version {})", a.server, r.version))
    })
}

fn print(done: &LayoutChanged, json: bool, words: impl FnOnce() -> String) -> Result<ExitCode> {
    if json {
        println!("{}", serde_json::to_string_pretty(done)?);
    } else {
        println!("{}", words());
    }
    Ok(ExitCode::SUCCESS)
}
