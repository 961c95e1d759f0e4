//! View replicas as `tessera view serve` processes: [`ProcessCluster`].
//!
//! The kit binds every replica's sockets itself, in this process, and hands them to the
//! replica at start by systemd's socket-activation protocol (`LISTEN_FDS`, `LISTEN_FDNAMES`;
//! see [`tessera_view_server::Listeners::inherited`]). No port is bound only to be freed for a
//! child to bind again, so parallel tests never race for one. A replica restarted after
//! [`ProcessCluster::kill`] gets its own addresses bound again (peers know it by them).
//!
//! Each replica's configuration is a [`ServeFile`] written with `toml`, the cluster spec
//! files with [`ClusterSpec::write_files`]: the same files an operator writes.

use crate::{KitError, LocalClusterBuilder};
use command_fds::{CommandFdExt, FdMapping};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tessera_view_server::{ListenAddrs, Listeners, ServeConfig, ServeFile, ViewClient};

/// One replica process and what it was started with.
#[derive(Debug)]
struct Replica {
    id: u64,
    addrs: ListenAddrs,
    config: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

/// View replicas running as `tessera view serve` processes on loopback. Dropping it kills them
/// (`SIGKILL`); [`ProcessCluster::stop`] asks them to stop (`SIGTERM`) and waits.
#[derive(Debug)]
pub struct ProcessCluster {
    bin: PathBuf,
    dir: PathBuf,
    name: String,
    spec: tessera_view::ClusterSpec,
    spec_file: PathBuf,
    raft_ports: bool,
    tuning: tessera_view_server::Tuning,
    log_filter: String,
    env: Vec<(String, String)>,
    replicas: Vec<Replica>,
    pki: Option<crate::Pki>,
    client_security: tessera_proto::tls::Security,
    _tmp: Option<tempfile::TempDir>,
}

impl LocalClusterBuilder {
    /// Starts every replica as a process of `bin` (the `tessera` binary) with its sockets bound
    /// here and passed to it, its configuration and logs in the cluster's directory
    /// (`replica-N.toml`, `replica-N.log`, data in `replica-N/`). Returns once the processes
    /// are started (see [`ViewClient::wait_for_leader`] for a leader).
    pub fn start_processes(self, bin: &Path) -> Result<ProcessCluster, KitError> {
        let (tmp, dir) = self.directory()?;
        let spec_file = self
            .spec
            .write_files(&dir)
            .map_err(|source| KitError::WriteSpec { dir: dir.display().to_string(), source })?;
        let (bound, addrs) = self.bind_all()?;
        let pki = if self.tls { Some(crate::Pki::create(&dir.join("tls"))?) } else { None };
        let client_security = match &pki {
            Some(p) => p.admin()?,
            None => tessera_proto::tls::Security::Insecure,
        };
        let mut cluster = ProcessCluster {
            bin: bin.to_path_buf(),
            dir,
            name: self.name.clone(),
            spec: self.spec.clone(),
            spec_file,
            raft_ports: self.raft_ports,
            tuning: self.tuning.clone(),
            log_filter: self.log_filter.clone(),
            env: self.env.clone(),
            replicas: Vec::with_capacity(bound.len()),
            pki,
            client_security,
            _tmp: tmp,
        };
        for (i, l) in bound.into_iter().enumerate() {
            let id = i as u64 + 1;
            let cfg = cluster.config(id)?.with_peers(&addrs);
            let config = cluster.write_config(&cfg, &addrs[i])?;
            let log = cluster.dir.join(format!("replica-{id}.log"));
            cluster.replicas.push(Replica { id, addrs: addrs[i], config, log, child: None });
            cluster.spawn(id, l)?;
        }
        tracing::info!(replicas = addrs.len(), dir = %cluster.dir.display(), "process cluster started");
        Ok(cluster)
    }
}

impl ProcessCluster {
    /// The replicas' client addresses (`host:port`), replica 1 first.
    pub fn addrs(&self) -> Vec<String> {
        self.replicas.iter().map(|r| r.addrs.client.to_string()).collect()
    }

    /// Replica `id`'s sockets.
    pub fn listen_addrs(&self, id: u64) -> Option<ListenAddrs> {
        self.replica(id).ok().map(|r| r.addrs)
    }

    /// The replica whose client address is `addr`.
    pub fn id_of(&self, addr: &str) -> Option<u64> {
        self.replicas.iter().find(|r| r.addrs.client.to_string() == addr).map(|r| r.id)
    }

    /// The cluster's directory: spec, configurations, data and logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Replica `id`'s configuration file.
    pub fn config_path(&self, id: u64) -> Option<&Path> {
        self.replica(id).ok().map(|r| r.config.as_path())
    }

    /// Replica `id`'s log file (its stdout and stderr).
    pub fn log_path(&self, id: u64) -> Option<&Path> {
        self.replica(id).ok().map(|r| r.log.as_path())
    }

    /// A leader-following client of every replica, with a 20 s deadline per call.
    pub fn client(&self) -> Result<ViewClient, KitError> {
        Ok(ViewClient::new(self.addrs())?.with_deadline(Duration::from_secs(20)).with_security(self.security()))
    }

    /// The CA and certificates of the cluster (`None` in plaintext).
    pub fn pki(&self) -> Option<&crate::Pki> {
        self.pki.as_ref()
    }

    /// An admin's security on this cluster (plaintext when the cluster is).
    pub fn security(&self) -> tessera_proto::tls::Security {
        self.client_security.clone()
    }

    /// Whether replica `id`'s process is running (started and not killed or exited).
    pub fn is_running(&mut self, id: u64) -> bool {
        self.replicas
            .iter_mut()
            .find(|r| r.id == id)
            .and_then(|r| r.child.as_mut())
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// `kill -9` of replica `id`, and waits for the process to be gone.
    pub fn kill(&mut self, id: u64) -> Result<(), KitError> {
        let r = self.replica_mut(id)?;
        if let Some(mut c) = r.child.take() {
            let io = |e: std::io::Error| KitError::Process { replica: id, why: e.to_string() };
            c.kill().map_err(io)?;
            c.wait().map_err(io)?;
        }
        Ok(())
    }

    /// Starts replica `id` again (after [`ProcessCluster::kill`]) on its own addresses, from its
    /// data directory.
    pub fn restart(&mut self, id: u64) -> Result<(), KitError> {
        let r = self.replica(id)?;
        if r.child.is_some() {
            return Err(KitError::Process { replica: id, why: "it is still running".into() });
        }
        let l = Listeners::bind(&r.addrs).map_err(|source| KitError::Replica { replica: id, source })?;
        self.spawn(id, l)
    }

    /// Starts a new replica that joins the running cluster (its id is the next free one) on
    /// fresh loopback sockets, and returns its id and addresses; add it to the voters with
    /// [`ViewClient::add_replica`].
    pub fn start_joining(&mut self) -> Result<(u64, ListenAddrs), KitError> {
        let id = self.replicas.iter().map(|r| r.id).max().unwrap_or(0) + 1;
        let l =
            Listeners::loopback(self.raft_ports, false).map_err(|source| KitError::Replica { replica: id, source })?;
        let addrs = l.addrs().map_err(|source| KitError::Replica { replica: id, source })?;
        let existing: Vec<ListenAddrs> = self.replicas.iter().map(|r| r.addrs).collect();
        let mut cfg = self.config(id)?.with_peers(&existing);
        cfg.join = true;
        let config = self.write_config(&cfg, &addrs)?;
        let log = self.dir.join(format!("replica-{id}.log"));
        self.replicas.push(Replica { id, addrs, config, log, child: None });
        self.spawn(id, l)?;
        Ok((id, addrs))
    }

    /// The last `lines` lines of every replica's log, for a failure message.
    pub fn logs(&self, lines: usize) -> String {
        let mut out = String::new();
        for r in &self.replicas {
            let text = std::fs::read_to_string(&r.log).unwrap_or_else(|e| format!("(cannot read: {e})"));
            let tail: Vec<&str> = text.lines().rev().take(lines).collect();
            out.push_str(&format!("--- replica {} ({}) ---\n", r.id, r.log.display()));
            for l in tail.into_iter().rev() {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }

    /// Asks every running replica to stop (`SIGTERM`) and waits up to `grace` for each, then
    /// kills what is left. An error names a replica that had to be killed or exited badly.
    pub fn stop(mut self, grace: Duration) -> Result<(), KitError> {
        let mut first = Ok(());
        for r in &mut self.replicas {
            let Some(c) = r.child.take() else { continue };
            let res = terminate(c, grace, r.id);
            if first.is_ok() {
                first = res;
            }
        }
        first
    }

    fn replica(&self, id: u64) -> Result<&Replica, KitError> {
        self.replicas.iter().find(|r| r.id == id).ok_or(KitError::NoReplica(id))
    }

    fn replica_mut(&mut self, id: u64) -> Result<&mut Replica, KitError> {
        self.replicas.iter_mut().find(|r| r.id == id).ok_or(KitError::NoReplica(id))
    }

    fn config(&self, id: u64) -> Result<ServeConfig, KitError> {
        let cfg = ServeConfig::new(id, &self.name, self.spec.clone(), self.dir.join(format!("replica-{id}")))
            .with_tuning(self.tuning.clone());
        Ok(match &self.pki {
            Some(p) => cfg.with_tls(p.issue(tessera_proto::tls::Role::Replica, &format!("replica-{id}"), &[], &[])?),
            None => cfg.with_insecure(),
        })
    }

    fn write_config(&self, cfg: &ServeConfig, addrs: &ListenAddrs) -> Result<PathBuf, KitError> {
        let path = self.dir.join(format!("replica-{}.toml", cfg.id));
        ServeFile::new(cfg, addrs, self.spec_file.clone())
            .write(&path)
            .map_err(|source| KitError::Replica { replica: cfg.id, source })?;
        Ok(path)
    }

    /// Starts replica `id`'s process on `listeners` (descriptors 3.. in the child).
    fn spawn(&mut self, id: u64, listeners: Listeners) -> Result<(), KitError> {
        let mut names = vec!["client"];
        let mut fds: Vec<OwnedFd> = vec![listeners.client.into()];
        if let Some(r) = listeners.raft {
            names.push("raft");
            fds.push(r.into());
        }
        if let Some(h) = listeners.http {
            names.push("http");
            fds.push(h.into());
        }
        let (bin, filter, env) = (self.bin.clone(), self.log_filter.clone(), self.env.clone());
        let r = self.replica_mut(id)?;
        let err = |why: String| KitError::Process { replica: id, why };
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&r.log)
            .map_err(|e| err(format!("log {}: {e}", r.log.display())))?;
        let out = log.try_clone().map_err(|e| err(e.to_string()))?;
        let n = fds.len();
        let mappings: Vec<FdMapping> =
            fds.into_iter().enumerate().map(|(i, parent_fd)| FdMapping { parent_fd, child_fd: 3 + i as i32 }).collect();
        let mut cmd = Command::new(&bin);
        cmd.args(["view", "serve", "--config"])
            .arg(&r.config)
            .env("RUST_LOG", filter)
            .env("LISTEN_FDS", n.to_string())
            .env("LISTEN_FDNAMES", names.join(":"))
            .env_remove("LISTEN_PID")
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.replace("{replica}", &id.to_string()))))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(log);
        cmd.fd_mappings(mappings).map_err(|e| err(format!("passing sockets: {e}")))?;
        let child = cmd.spawn().map_err(|e| err(format!("starting {}: {e}", bin.display())))?;
        // The child holds the sockets now; this process's copies closed with `cmd`.
        drop(cmd);
        r.child = Some(child);
        Ok(())
    }
}

impl Drop for ProcessCluster {
    fn drop(&mut self) {
        for r in &mut self.replicas {
            if let Some(mut c) = r.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// `SIGTERM`, then waits up to `grace` for the exit (a thread blocks in `wait` and reports
/// it), then `SIGKILL`.
fn terminate(mut c: Child, grace: Duration, replica: u64) -> Result<(), KitError> {
    let fail = |why: String| KitError::Process { replica, why };
    let pid = nix::unistd::Pid::from_raw(i32::try_from(c.id()).map_err(|e| fail(e.to_string()))?);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).map_err(|e| fail(format!("SIGTERM: {e}")))?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(c.wait());
    });
    match rx.recv_timeout(grace) {
        Ok(Ok(status)) if status.success() => Ok(()),
        Ok(Ok(status)) => Err(fail(format!("exited with {status} after SIGTERM"))),
        Ok(Err(e)) => Err(fail(e.to_string())),
        Err(_) => {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            let _ = rx.recv();
            Err(fail(format!("still running {grace:?} after SIGTERM; killed")))
        }
    }
}
