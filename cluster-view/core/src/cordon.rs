//! Node operations on the view: an operator's cordon, drain and uncordon of a server, a drain's
//! eviction, and each server's history of health and cordon changes.
//!
//! A [`Cordon`] is a cold table of the view (in snapshots and the state hash); its effect on the
//! hot [`crate::ServerRecord`] is the health: an alive cordoned server is
//! [`Health::Draining`], which the fit function refuses to place on, and
//! [`ClusterView::set_health_at`] keeps it so when the server's agent comes back.

use crate::error::ViewError;
use crate::ids::{JobId, ServerId};
use crate::server::{Cordon, HEALTH_HISTORY, Health, HealthChange, MAX_CORDON_REASON_CHARS};
use crate::view::ClusterView;

impl ClusterView {
    /// Cordons (or, with a deadline, drains) a server; replaces a cordon it has. An alive
    /// server becomes [`Health::Draining`]. Setting the cordon it has changes nothing.
    pub fn cordon(&mut self, server: ServerId, cordon: Cordon) -> Result<Vec<JobId>, ViewError> {
        let rec = self.live_server(server)?;
        if cordon.reason.chars().count() > MAX_CORDON_REASON_CHARS {
            return Err(ViewError::BadServer(
                server,
                format!("a cordon's reason has at most {MAX_CORDON_REASON_CHARS} characters"),
            ));
        }
        if self.cordons.get(&server) == Some(&cordon) {
            return Ok(Vec::new());
        }
        self.bump();
        if rec.health == Health::Up {
            self.servers[server.index()].health = Health::Draining;
            self.touch_server(server);
        }
        let why = match cordon.drain_by_ms {
            Some(by) => format!("draining by {by} (Unix ms): {}", cordon.reason),
            None => format!("cordoned: {}", cordon.reason),
        };
        let at = cordon.since_ms;
        self.cordons.insert(server, cordon);
        self.remember(server, at, why);
        Ok(Vec::new())
    }

    /// Lifts a server's cordon; an alive server takes placements again. A server without a
    /// cordon is left as it is.
    pub fn uncordon(&mut self, server: ServerId, at_ms: u64) -> Result<Vec<JobId>, ViewError> {
        let rec = *self.servers.get(server.index()).ok_or_else(|| ViewError::UnknownServer(server.to_string()))?;
        if self.cordons.remove(&server).is_none() {
            return Ok(Vec::new());
        }
        self.bump();
        if rec.health == Health::Draining {
            self.servers[server.index()].health = Health::Up;
            self.touch_server(server);
        }
        self.remember(server, at_ms, "uncordoned".to_string());
        Ok(Vec::new())
    }

    /// Re-queues every gang with a member on a cordoned server (a drain's deadline passed);
    /// returns those jobs. A server that is not cordoned is refused: an eviction proposed
    /// before an uncordon must not take effect after it.
    pub fn evict(&mut self, server: ServerId, at_ms: u64) -> Result<Vec<JobId>, ViewError> {
        if self.servers.get(server.index()).is_none() {
            return Err(ViewError::UnknownServer(server.to_string()));
        }
        if !self.cordons.contains_key(&server) {
            return Err(ViewError::BadServer(server, "not cordoned: only a drained server's gangs are evicted".into()));
        }
        if !self.hosts_gangs(server) {
            return Ok(Vec::new());
        }
        self.bump();
        let name = self.server_name(server).unwrap_or("?").to_string();
        let requeued = self.requeue_server(server, &format!("re-queued: server {name} was drained"));
        self.remember(server, at_ms, format!("drain deadline passed: {} gang(s) re-queued", requeued.len()));
        Ok(requeued)
    }

    /// Whether any placed gang has a member on `server`.
    pub fn hosts_gangs(&self, server: ServerId) -> bool {
        self.jobs.values().any(|j| j.placed_on(server))
    }

    /// The jobs with a member on `server`, in id order.
    pub fn gangs_on(&self, server: ServerId) -> Vec<JobId> {
        let mut hit: Vec<JobId> = self.jobs.values().filter(|j| j.placed_on(server)).map(|j| j.id).collect();
        hit.sort();
        hit
    }

    /// A server's cordon, if it has one.
    pub fn cordon_of(&self, server: ServerId) -> Option<&Cordon> {
        self.cordons.get(&server)
    }

    /// Every cordoned server.
    pub fn cordons(&self) -> impl Iterator<Item = (ServerId, &Cordon)> {
        self.cordons.iter().map(|(s, c)| (*s, c))
    }

    /// A server's latest health changes, oldest first (at most [`HEALTH_HISTORY`]).
    pub fn health_history(&self, server: ServerId) -> impl Iterator<Item = &HealthChange> {
        self.health_history.get(&server).into_iter().flatten()
    }

    /// Re-queues, in job order, every gang with a member on `server`.
    pub(crate) fn requeue_server(&mut self, server: ServerId, why: &str) -> Vec<JobId> {
        let hit = self.gangs_on(server);
        for &job in &hit {
            self.requeue(job, why.to_string());
        }
        hit
    }

    /// Appends to a server's history (at the current version), forgetting the oldest entry
    /// past [`HEALTH_HISTORY`].
    pub(crate) fn remember(&mut self, server: ServerId, at_ms: u64, why: String) {
        let change = HealthChange {
            version: self.version,
            at_ms,
            health: self.servers[server.index()].health,
            cordoned: self.cordons.contains_key(&server),
            why,
        };
        let h = self.health_history.entry(server).or_default();
        if h.len() >= HEALTH_HISTORY {
            h.pop_front();
        }
        h.push_back(change);
    }
}
