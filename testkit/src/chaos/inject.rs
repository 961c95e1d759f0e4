//! Faults made real on a compose cluster: `docker` for processes and networks, `nsenter` with
//! `tc` and `iptables` inside one container's network namespace for slow and lossy links, a
//! file written into a replica's data file system for a full disk, and the offset file that
//! libfaketime reads in a replica's process for a clock step.
//!
//! Every command runs with a deadline, and every fault has its heal; [`Compose::heal_all`]
//! undoes whatever a run that stopped half-way may have left (frozen containers, cut links,
//! queues, filler files), so the cluster is always left whole.

use crate::KitError;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::process::Command;

/// Longest any one command may take.
const COMMAND_DEADLINE: Duration = Duration::from_secs(30);

/// The name of the file that fills a replica's disk.
pub const FILLER: &str = "chaos-fill";

/// The packet loss of a slow link, in percent.
const LOSS_PERCENT: u32 = 10;

/// A compose project (docker-compose v1 names: `<project>_<service>_1`, networks
/// `<project>_<network>`).
#[derive(Clone, Debug)]
pub struct Compose {
    /// The project name (`-p`).
    pub project: String,
    /// Where each replica's data file system is mounted on this host (`<root>/view-N`), for
    /// the full-disk fault; none: that fault cannot be made.
    pub data_root: Option<PathBuf>,
    /// Where each replica's clock offset file is on this host (`<root>/view-N/offset`, the
    /// file libfaketime reads in the replica's container), for the clock-jump fault; none:
    /// that fault cannot be made.
    pub clock_root: Option<PathBuf>,
}

/// How a slow link was made (either is undone by [`Compose::heal_network`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlowLink {
    /// `tc netem` delay and loss on each interface.
    Netem,
    /// A rate-limited `tbf` queue on each interface, plus random drops by `iptables`
    /// (kernels built without netem).
    TbfAndDrops,
}

impl Compose {
    /// The container of `service`.
    pub fn container(&self, service: &str) -> String {
        format!("{}_{service}_1", self.project)
    }

    /// The network `name` of the project.
    pub fn network(&self, name: &str) -> String {
        format!("{}_{name}", self.project)
    }

    /// `docker kill --signal KILL`.
    pub async fn kill(&self, service: &str) -> Result<(), KitError> {
        docker(&["kill", "--signal", "KILL", &self.container(service)]).await.map(drop)
    }

    /// `docker start` (a running container is left as it is).
    pub async fn start(&self, service: &str) -> Result<(), KitError> {
        docker(&["start", &self.container(service)]).await.map(drop)
    }

    /// Starts `service` unless it runs, waiting out docker's own restart in progress (a
    /// container that exited on an error is restarted by its policy, with a back-off).
    pub async fn ensure_running(&self, service: &str) -> Result<(), KitError> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let state = docker(&["inspect", "--format", "{{.State.Status}}", &self.container(service)]).await?;
            match state.trim() {
                "running" => return Ok(()),
                "restarting" => {}
                "paused" => self.unpause(service).await?,
                _ => {
                    // Exited or created; a start racing docker's own restart may be refused.
                    let _ = self.start(service).await;
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(fault(&format!("starting {service}"), &format!("still {} after 60 s", state.trim())));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `docker pause`: every process of the container frozen.
    pub async fn pause(&self, service: &str) -> Result<(), KitError> {
        docker(&["pause", &self.container(service)]).await.map(drop)
    }

    /// `docker unpause`.
    pub async fn unpause(&self, service: &str) -> Result<(), KitError> {
        docker(&["unpause", &self.container(service)]).await.map(drop)
    }

    /// Cuts `service` off `network`.
    pub async fn disconnect(&self, network: &str, service: &str) -> Result<(), KitError> {
        docker(&["network", "disconnect", "--force", &self.network(network), &self.container(service)]).await.map(drop)
    }

    /// Joins `service` to `network` again under its alias.
    pub async fn connect(&self, network: &str, service: &str, alias: &str) -> Result<(), KitError> {
        docker(&["network", "connect", "--alias", alias, &self.network(network), &self.container(service)])
            .await
            .map(drop)
    }

    /// Whether `service` is attached to `network`.
    pub async fn connected(&self, network: &str, service: &str) -> Result<bool, KitError> {
        let out =
            docker(&["inspect", "--format", "{{json .NetworkSettings.Networks}}", &self.container(service)]).await?;
        Ok(out.contains(&format!("\"{}\"", self.network(network))))
    }

    /// The container's main process id on this host (0 when it is not running).
    async fn pid(&self, service: &str) -> Result<u32, KitError> {
        let out = docker(&["inspect", "--format", "{{.State.Pid}}", &self.container(service)]).await?;
        out.trim().parse().map_err(|_| fault(&format!("the process id of {service}"), &out))
    }

    /// The container's network interfaces other than loopback.
    async fn interfaces(&self, pid: u32) -> Result<Vec<String>, KitError> {
        let out = in_netns(pid, &["ip", "-o", "link", "show"]).await?;
        // "2: eth0@if12: <BROADCAST,...>": the name ends at '@' or ':'.
        Ok(out
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|n| n.split('@').next().unwrap_or(n).to_string())
            .filter(|n| n != "lo")
            .collect())
    }

    /// Slows every link of `service` and drops a share of its packets: `netem` delay
    /// (200 ± 100 ms) and loss where the kernel has netem, else a 256 kbit/s queue that holds
    /// packets up to 300 ms, and random drops of incoming and outgoing packets by `iptables`.
    pub async fn slow_network(&self, service: &str) -> Result<SlowLink, KitError> {
        let pid = self.pid(service).await?;
        let ifaces = self.interfaces(pid).await?;
        let loss = format!("{LOSS_PERCENT}%");
        let mut netem = true;
        for i in &ifaces {
            let r = in_netns(
                pid,
                &["tc", "qdisc", "replace", "dev", i, "root", "netem", "delay", "200ms", "100ms", "loss", &loss],
            )
            .await;
            if r.is_err() {
                netem = false;
                break;
            }
        }
        if netem {
            return Ok(SlowLink::Netem);
        }
        for i in &ifaces {
            in_netns(
                pid,
                &[
                    "tc", "qdisc", "replace", "dev", i, "root", "tbf", "rate", "256kbit", "burst", "16kbit", "latency",
                    "300ms",
                ],
            )
            .await?;
        }
        let p = format!("{:.2}", f64::from(LOSS_PERCENT) / 100.0);
        for chain in ["INPUT", "OUTPUT"] {
            in_netns(pid, &tagged(&["-I", chain, "-m", "statistic", "--mode", "random", "--probability", &p])).await?;
        }
        Ok(SlowLink::TbfAndDrops)
    }

    /// Undoes [`Compose::slow_network`]. A container restarted meanwhile has a fresh namespace
    /// and nothing to undo.
    pub async fn heal_network(&self, service: &str) -> Result<(), KitError> {
        let pid = self.pid(service).await?;
        if pid == 0 {
            return Ok(());
        }
        for i in self.interfaces(pid).await? {
            // Deleting the root qdisc restores the default; an interface without one answers an
            // error, which is what "nothing to undo" looks like.
            let _ = in_netns(pid, &["tc", "qdisc", "del", "dev", &i, "root"]).await;
        }
        self.clear_rules(pid).await
    }

    /// Cuts `service` off its clients: every packet to `ports` (its client and HTTP ports)
    /// dropped in its namespace, whoever sends it (agents, scheduler hosts, this host through
    /// the published ports), while it still reaches and is reached by the other replicas.
    pub async fn isolate_ports(&self, service: &str, ports: &[u16]) -> Result<(), KitError> {
        let pid = self.pid(service).await?;
        for p in ports {
            let p = p.to_string();
            in_netns(pid, &tagged(&["-I", "INPUT", "-p", "tcp", "--dport", &p])).await?;
        }
        Ok(())
    }

    /// Undoes [`Compose::isolate_ports`].
    pub async fn heal_ports(&self, service: &str) -> Result<(), KitError> {
        match self.pid(service).await? {
            0 => Ok(()),
            pid => self.clear_rules(pid).await,
        }
    }

    /// Deletes every rule this module added in the namespace of `pid`.
    async fn clear_rules(&self, pid: u32) -> Result<(), KitError> {
        let rules = in_netns(pid, &["iptables", "-S"]).await?;
        for r in rules.lines().filter(|r| r.contains(TAG) && r.starts_with("-A ")) {
            let mut args: Vec<&str> = r.split_whitespace().collect();
            args[0] = "-D";
            let mut cmd = vec!["iptables"];
            cmd.extend(args);
            in_netns(pid, &cmd).await?;
        }
        Ok(())
    }

    /// Fills replica `id`'s data file system and keeps it full until [`Filler::stop`]: a file
    /// written in 1 MiB blocks until the disk refuses more, and again every 50 ms, so that space
    /// the replica frees (RocksDB releases a preallocated log when it rolls it) is taken too.
    /// Answers once the disk is full the first time.
    pub async fn fill_disk(&self, id: u64) -> Result<Filler, KitError> {
        let path = self.filler(id)?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let (full_tx, full) = tokio::sync::oneshot::channel();
        let task = tokio::task::spawn_blocking(move || keep_full(&path, &flag, full_tx));
        let filler = Filler { stop, task };
        if full.await.is_err() {
            // The filler ended before the disk was full: its error says why.
            filler.stop().await?;
            return Err(fault("filling the disk", "the filler stopped before the disk was full"));
        }
        Ok(filler)
    }

    /// Removes the file that filled replica `id`'s disk (none: nothing to do).
    pub async fn free_disk(&self, id: u64) -> Result<(), KitError> {
        let path = self.filler(id)?;
        match tokio::fs::remove_file(&path).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(fault(&format!("removing {}", path.display()), &e.to_string())),
        }
    }

    /// Sets replica `id`'s wall clock `offset_s` seconds from true time (0: right again). The
    /// file is replaced whole (written aside, then renamed), so libfaketime never reads half
    /// of it; it rereads the file within a second.
    /// A step (`offset_s` not 0) is refused unless the replica's process has libfaketime
    /// loaded: a preload the loader ignored would make the fault a no-op that passes.
    pub async fn set_clock(&self, id: u64, offset_s: i64) -> Result<(), KitError> {
        let root = self.clock_root.as_ref().ok_or_else(|| fault("clock jump", "no --clock-root was given"))?;
        let service = format!("view-{id}");
        if offset_s != 0 && !self.has_mapped(&service, "libfaketime").await? {
            return Err(fault(
                &format!("stepping the clock of {service}"),
                "libfaketime is not loaded in its process (is LD_PRELOAD set and the library mounted?)",
            ));
        }
        let dir = root.join(format!("view-{id}"));
        let (tmp, path) = (dir.join(".offset.new"), dir.join("offset"));
        let what = |e: std::io::Error| fault(&format!("setting {}", path.display()), &e.to_string());
        tokio::fs::write(&tmp, format!("{offset_s:+}\n")).await.map_err(what)?;
        tokio::fs::rename(&tmp, &path).await.map_err(what)
    }

    /// Whether a process of `service`'s container (its main process or a descendant: compose
    /// runs the service under an init) has a library whose path holds `lib` mapped.
    pub async fn has_mapped(&self, service: &str, lib: &str) -> Result<bool, KitError> {
        let pid = self.pid(service).await?;
        if pid == 0 {
            return Ok(false);
        }
        let lib = lib.to_string();
        tokio::task::spawn_blocking(move || process_tree(pid).iter().any(|p| maps_hold(*p, &lib)))
            .await
            .map_err(|e| fault("reading /proc", &e.to_string()))
    }

    fn filler(&self, id: u64) -> Result<PathBuf, KitError> {
        let root = self.data_root.as_ref().ok_or_else(|| fault("full disk", "no --data-root was given"))?;
        Ok(root.join(format!("view-{id}")).join(FILLER))
    }

    /// Undoes every fault this module can make, on every service named: unpause, start,
    /// reconnect (`networks`: (network, service, alias) each service must be on), links
    /// restored, filler files removed, clocks set right. Errors are collected, not stopped at.
    pub async fn heal_all(
        &self,
        services: &[String],
        networks: &[(String, String, String)],
        replicas: &[u64],
    ) -> Vec<String> {
        let mut errors = Vec::new();
        for s in services {
            if let Err(e) = self.ensure_running(s).await {
                errors.push(e.to_string());
            }
        }
        for (net, s, alias) in networks {
            match self.connected(net, s).await {
                Ok(true) => {}
                Ok(false) => {
                    if let Err(e) = self.connect(net, s, alias).await {
                        errors.push(e.to_string());
                    }
                }
                Err(e) => errors.push(e.to_string()),
            }
        }
        for s in services {
            if let Err(e) = self.heal_network(s).await {
                errors.push(e.to_string());
            }
        }
        if self.data_root.is_some() {
            for id in replicas {
                if let Err(e) = self.free_disk(*id).await {
                    errors.push(e.to_string());
                }
            }
        }
        if self.clock_root.is_some() {
            for id in replicas {
                if let Err(e) = self.set_clock(*id, 0).await {
                    errors.push(e.to_string());
                }
            }
        }
        errors
    }
}

/// The comment on every rule this module adds, by which it finds them again.
const TAG: &str = "tessera-chaos";

/// An `iptables` command adding (or deleting) `rule`, tagged, dropping what it matches.
fn tagged(rule: &[&str]) -> Vec<String> {
    let mut v = vec!["iptables".to_string()];
    v.extend(rule.iter().map(|s| (*s).to_string()));
    v.extend(["-m", "comment", "--comment", TAG, "-j", "DROP"].iter().map(|s| (*s).to_string()));
    v
}

/// A disk kept full (see [`Compose::fill_disk`]).
#[derive(Debug)]
pub struct Filler {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Result<u64, KitError>>,
}

impl Filler {
    /// Stops filling (the file stays until [`Compose::free_disk`]); answers the bytes written.
    pub async fn stop(self) -> Result<u64, KitError> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.map_err(|e| fault("filling the disk", &e.to_string()))?
    }
}

fn keep_full(path: &Path, stop: &AtomicBool, full: tokio::sync::oneshot::Sender<()>) -> Result<u64, KitError> {
    let mut full = Some(full);
    use std::io::Write;
    let what = |e: std::io::Error| fault(&format!("filling {}", path.display()), &e.to_string());
    let mut f = std::fs::File::create(path).map_err(what)?;
    let block = vec![0u8; 1 << 20];
    let mut written = 0u64;
    while !stop.load(Ordering::Relaxed) {
        loop {
            match f.write(&block) {
                Ok(0) => break,
                Ok(n) => written += n as u64,
                Err(e) if e.raw_os_error() == Some(ENOSPC) => break,
                Err(e) => return Err(what(e)),
            }
        }
        // On the disk, not in this host's page cache, for the replica to find it full.
        match f.sync_all() {
            Err(e) if e.raw_os_error() != Some(ENOSPC) => return Err(what(e)),
            _ => {}
        }
        if let Some(tx) = full.take() {
            let _ = tx.send(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(written)
}

/// `root` and its descendants, from every process's parent in `/proc/*/stat` (bounded: 4 levels).
fn process_tree(root: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // "pid (comm) state ppid ...": the name may hold spaces and parentheses.
            let ppid = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()?;
            Some((pid, ppid))
        })
        .collect();
    let mut tree = vec![root];
    let mut level = vec![root];
    for _ in 0..4 {
        level = parents.iter().filter(|(_, pp)| level.contains(pp)).map(|(p, _)| *p).collect();
        tree.extend(&level);
    }
    tree
}

fn maps_hold(pid: u32, lib: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|m| m.contains(lib))
}

/// "No space left on device".
const ENOSPC: i32 = 28;

fn fault(what: &str, why: &str) -> KitError {
    KitError::Fault { what: what.to_string(), why: why.trim().to_string() }
}

/// Runs `docker ARGS`, answering its standard output.
pub async fn docker(args: &[&str]) -> Result<String, KitError> {
    run("docker", args).await
}

async fn in_netns<S: AsRef<str>>(pid: u32, args: &[S]) -> Result<String, KitError> {
    let t = pid.to_string();
    let mut all: Vec<&str> = vec!["-t", &t, "-n", "--"];
    all.extend(args.iter().map(AsRef::as_ref));
    run("nsenter", &all).await
}

async fn run(program: &str, args: &[&str]) -> Result<String, KitError> {
    let what = format!("{program} {}", args.join(" "));
    let out = tokio::time::timeout(COMMAND_DEADLINE, Command::new(program).args(args).kill_on_drop(true).output())
        .await
        .map_err(|_| fault(&what, &format!("no answer within {} s", COMMAND_DEADLINE.as_secs())))?
        .map_err(|e| fault(&what, &e.to_string()))?;
    if !out.status.success() {
        return Err(fault(&what, &String::from_utf8_lossy(&out.stderr)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
