//! Who may do what: the rules every request of the `View` and `Raft` services passes before
//! anything is proposed, and the audit log of refusals and admin actions.
//!
//! The rules are one pure function, [`check`], of the caller's [`Identity`] and the request's
//! [`Action`]; the service fills in what an action depends on from the replica's state (a
//! job's tenant, a server's name, the scheduler host holding a job) and answers a refusal with
//! `PERMISSION_DENIED` before the request reaches the driver. So a refused call changes
//! nothing.
//!
//! | caller | may |
//! |---|---|
//! | replica | speak raft; act for the caller of its HTTP API (`tessera-on-behalf-of`) |
//! | admin | everything but raft: membership, cordon and drain, any tenant's jobs, proposals |
//! | scheduler host `H` | read the view; adopt jobs as `H`; propose and preempt for the pending jobs it holds; migrate running jobs to make room for one it holds; release only what it holds |
//! | agent of server `S` | read the view; register, heartbeat and report tasks as `S` |
//! | user of tenants `T` | submit for a tenant of `T`; read and cancel jobs of `T`; the cluster's status |
//!
//! Every refusal and every admin action is written to the audit log: the tracing target
//! [`AUDIT_TARGET`] (one line each: who, what, the verdict), and the replica's `audit.jsonl`
//! in its data directory when configured ([`AuditLog`]).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use tessera_proto::tls::{Identity, Role};

/// The tracing target of audit events.
pub const AUDIT_TARGET: &str = "tessera::audit";
/// The audit file rotates (to `audit.jsonl.1`) past this size.
pub const AUDIT_MAX_BYTES: u64 = 64 << 20;

/// What a request does, with what the rules need to know about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action<'a> {
    /// Raft messages between replicas.
    Raft,
    /// The cluster's status (any authenticated caller).
    Status,
    /// The whole view: snapshots, watches, the agents' addresses.
    ReadView,
    /// One job of `tenant`.
    ReadJob {
        /// The job's tenant.
        tenant: &'a str,
    },
    /// Submit jobs for these tenants.
    Submit {
        /// The specs' tenants.
        tenants: Vec<&'a str>,
    },
    /// Cancel a job of `tenant`.
    Cancel {
        /// The job's tenant.
        tenant: &'a str,
    },
    /// Propose, migrate, preempt or release: the holders of the pending jobs the call is for
    /// (`None`: held by no host). A proposal for a job no longer pending changes nothing (the
    /// approver refuses it, or answers a resend `AlreadyApplied`), so it is not listed; a
    /// migration lists the job it makes room for, a release the job it ends.
    Schedule {
        /// Each job's holder.
        holders: Vec<Option<&'a str>>,
    },
    /// Adopt jobs as scheduler host `host`.
    Adopt {
        /// The host named in the request.
        host: &'a str,
    },
    /// Register, heartbeat or report tasks as server `server`.
    Agent {
        /// The server's name.
        server: &'a str,
    },
    /// Read GPU and core usage, or the history of ended jobs, of these tenants (empty: of
    /// every tenant).
    ReadUsage {
        /// The tenants asked about.
        tenants: Vec<&'a str>,
    },
    /// Cordon, drain, uncordon a server.
    Cordon,
    /// Add or remove servers and configuration sets.
    Layout,
    /// Set quotas or priority classes.
    Policy,
    /// Add or remove a replica.
    Membership,
    /// Issue a bearer token.
    IssueToken,
}

impl Action<'_> {
    /// Whether an admin doing this is audited (changes made by operators).
    pub fn is_admin_change(&self) -> bool {
        matches!(self, Action::Cordon | Action::Layout | Action::Policy | Action::Membership | Action::IssueToken)
    }
}

/// Whether `who` may do `action`; the refusal says why.
pub fn check(who: &Identity, action: &Action<'_>) -> Result<(), String> {
    let deny = |why: String| Err(format!("{who} may not {why}"));
    match (who.role, action) {
        (Role::Replica, Action::Raft) => Ok(()),
        (_, Action::Raft) => deny("send raft messages (replicas only)".into()),
        (Role::Admin | Role::Replica, _) => Ok(()),
        (_, Action::Status) => Ok(()),
        (Role::Scheduler | Role::Agent, Action::ReadView) => Ok(()),
        (Role::User, Action::ReadView) => {
            deny("read the whole view (a user reads its tenants' jobs: GetJob, or the HTTP API's /v1/jobs)".into())
        }
        (Role::Scheduler | Role::Agent, Action::ReadJob { .. }) => Ok(()),
        (Role::Scheduler, Action::ReadUsage { .. }) => Ok(()),
        (Role::User, Action::ReadUsage { tenants }) if tenants.is_empty() => {
            deny("read every tenant's usage (a user reads its own tenants')".into())
        }
        (Role::User, Action::ReadUsage { tenants }) => match tenants.iter().find(|t| !who.acts_for(t)) {
            None => Ok(()),
            Some(t) => deny(format!("read the usage of tenant `{t}`")),
        },
        (Role::Agent, Action::ReadUsage { .. }) => {
            deny("read usage or job history (users, scheduler hosts and admins do)".into())
        }
        (Role::User, Action::ReadJob { tenant } | Action::Cancel { tenant }) => {
            if who.acts_for(tenant) {
                Ok(())
            } else {
                deny(format!("touch a job of tenant `{tenant}`"))
            }
        }
        (Role::User, Action::Submit { tenants }) => match tenants.iter().find(|t| !who.acts_for(t)) {
            None => Ok(()),
            Some(t) => deny(format!("submit for tenant `{t}`")),
        },
        (Role::Scheduler, Action::Schedule { holders }) => {
            if let Some(h) = holders.iter().flatten().find(|h| **h != who.name) {
                deny(format!("schedule a job held by scheduler host `{h}`"))
            } else if holders.iter().any(Option::is_none) {
                deny(
                    "schedule a job it does not hold (a host schedules the pending jobs AdoptJobs gave it, \
                     and names one of them as the job a migration makes room for)"
                        .into(),
                )
            } else {
                Ok(())
            }
        }
        (Role::Scheduler, Action::Adopt { host }) => {
            if *host == who.name {
                Ok(())
            } else {
                deny(format!("adopt jobs as host `{host}`"))
            }
        }
        (Role::Agent, Action::Agent { server }) => {
            if *server == who.name {
                Ok(())
            } else {
                deny(format!("act for server `{server}`"))
            }
        }
        (Role::Scheduler | Role::Agent, Action::Submit { .. } | Action::Cancel { .. }) => {
            deny("submit or cancel jobs (users and admins do)".into())
        }
        (_, Action::Cordon) => deny("cordon, drain or uncordon servers (admins only)".into()),
        (_, Action::Layout) => deny("add or remove servers or configuration sets (admins only)".into()),
        (_, Action::Policy) => deny("set quotas or priority classes (admins only)".into()),
        (_, Action::Membership) => deny("add or remove replicas (admins only)".into()),
        (_, Action::IssueToken) => deny("issue tokens (admins only)".into()),
        (_, Action::Schedule { .. }) => deny("propose placements (scheduler hosts do)".into()),
        (_, Action::Adopt { .. }) => deny("adopt jobs (scheduler hosts do)".into()),
        (_, Action::Agent { .. }) => deny("act as a node agent".into()),
    }
}

/// Most callers the rate limiter tracks at once; past it, the idlest are forgotten (a caller
/// forgotten starts again with a full bucket).
pub const MAX_TRACKED_CALLERS: usize = 16_384;

/// Per-caller token buckets: `rate` requests a second sustained, bursts of `rate`. Replicas
/// and admins are not limited (the HTTP API's callers are limited by their own identity, as
/// the replica acts for them). Pure: time comes in as an argument.
#[derive(Debug)]
pub struct RateLimiter {
    rate: f64,
    buckets: std::collections::HashMap<String, (f64, std::time::Instant)>,
}

impl RateLimiter {
    /// A limiter of `rate` requests per second per caller (0: none).
    pub fn new(rate: u32) -> RateLimiter {
        RateLimiter { rate: f64::from(rate), buckets: std::collections::HashMap::new() }
    }

    /// Takes one request of `who` at `now`; the refusal says how long to wait.
    pub fn take(&mut self, who: &Identity, now: std::time::Instant) -> Result<(), String> {
        if self.rate == 0.0 || matches!(who.role, Role::Replica | Role::Admin) {
            return Ok(());
        }
        if self.buckets.len() >= MAX_TRACKED_CALLERS && !self.buckets.contains_key(&who.uri()) {
            // Forget the callers whose buckets refilled long ago (they lose nothing).
            let full = std::time::Duration::from_secs(1);
            self.buckets.retain(|_, (_, at)| now.saturating_duration_since(*at) < full);
            if self.buckets.len() >= MAX_TRACKED_CALLERS {
                self.buckets.clear();
            }
        }
        let rate = self.rate;
        let (tokens, at) = self.buckets.entry(who.uri()).or_insert((rate, now));
        *tokens = (*tokens + now.saturating_duration_since(*at).as_secs_f64() * rate).min(rate);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Ok(())
        } else {
            let wait_ms = ((1.0 - *tokens) / rate * 1000.0).ceil();
            Err(format!("{who} is over its rate of {rate} requests a second; retry in {wait_ms} ms"))
        }
    }
}

/// An append-only JSON-lines file of audit events, rotated once past [`AUDIT_MAX_BYTES`].
#[derive(Debug)]
pub struct AuditLog {
    path: PathBuf,
    file: Mutex<Option<std::fs::File>>,
}

impl AuditLog {
    /// The log at `path` (opened on first use).
    pub fn new(path: impl Into<PathBuf>) -> AuditLog {
        AuditLog { path: path.into(), file: Mutex::new(None) }
    }

    /// Where it writes.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records one event: `who` asked `method` (`detail`), and the verdict (`Ok` or the
    /// refusal). Also a tracing event of [`AUDIT_TARGET`]. A file that cannot be written is
    /// logged, never fails the request.
    pub fn record(&self, who: Option<&Identity>, method: &str, detail: &str, verdict: &Result<(), String>) {
        let who_text = who.map_or_else(|| "unauthenticated".to_string(), Identity::to_string);
        match verdict {
            Ok(()) => tracing::info!(target: AUDIT_TARGET, who = %who_text, method, detail, "allowed"),
            Err(why) => tracing::warn!(target: AUDIT_TARGET, who = %who_text, method, detail, why = %why, "refused"),
        }
        let line = serde_json::json!({
            "at_ms": crate::node::unix_ms(),
            "who": who,
            "method": method,
            "detail": detail,
            "allowed": verdict.is_ok(),
            "why": verdict.as_ref().err(),
        });
        let mut guard = self.file.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Err(e) = self.append(&mut guard, &line.to_string()) {
            tracing::error!(path = %self.path.display(), error = %e, "audit log not written");
        }
    }

    fn append(&self, file: &mut Option<std::fs::File>, line: &str) -> std::io::Result<()> {
        if file.as_ref().map(|f| f.metadata().map(|m| m.len())).transpose()?.is_some_and(|n| n > AUDIT_MAX_BYTES) {
            *file = None;
            std::fs::rename(&self.path, self.path.with_extension("jsonl.1"))?;
        }
        if file.is_none() {
            *file = Some(std::fs::OpenOptions::new().create(true).append(true).open(&self.path)?);
        }
        let f = file.as_mut().expect("opened above");
        writeln!(f, "{line}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(role: Role, name: &str, tenants: &[&str]) -> Identity {
        let t: Vec<String> = tenants.iter().map(|s| s.to_string()).collect();
        Identity::new(role, name, &t).expect("identity")
    }

    #[test]
    fn each_role_may_do_its_own_work_and_nothing_else() {
        let replica = id(Role::Replica, "view-1", &[]);
        let admin = id(Role::Admin, "ops", &[]);
        let host = id(Role::Scheduler, "host-a", &[]);
        let agent = id(Role::Agent, "gpu-01", &[]);
        let user = id(Role::User, "alice", &["vision"]);
        let ok = |w: &Identity, a: Action<'_>| check(w, &a).is_ok();
        // Raft: replicas only, not even an admin.
        assert!(ok(&replica, Action::Raft));
        for w in [&admin, &host, &agent, &user] {
            assert!(!ok(w, Action::Raft), "{w}");
        }
        // Operators' commands.
        for a in [Action::Cordon, Action::Layout, Action::Policy, Action::Membership, Action::IssueToken] {
            assert!(ok(&admin, a.clone()));
            for w in [&host, &agent, &user] {
                assert!(!ok(w, a.clone()), "{w} {a:?}");
            }
        }
        // Scheduling: the holder alone.
        assert!(ok(&host, Action::Schedule { holders: vec![Some("host-a"), Some("host-a")] }));
        assert!(!ok(&host, Action::Schedule { holders: vec![Some("host-a"), Some("host-b")] }));
        // A job no host holds is no host's to schedule; with nothing pending to change, any
        // host may ask (the approver refuses or answers a resend).
        assert!(!ok(&host, Action::Schedule { holders: vec![None, Some("host-a")] }));
        assert!(ok(&host, Action::Schedule { holders: Vec::new() }));
        assert!(ok(&admin, Action::Schedule { holders: vec![None] }));
        assert!(!ok(&user, Action::Schedule { holders: vec![None] }));
        assert!(ok(&host, Action::Adopt { host: "host-a" }) && !ok(&host, Action::Adopt { host: "host-b" }));
        // Agents: their own server.
        assert!(ok(&agent, Action::Agent { server: "gpu-01" }));
        assert!(!ok(&agent, Action::Agent { server: "gpu-02" }));
        assert!(!ok(&host, Action::Agent { server: "gpu-01" }));
        // Users: their tenants.
        assert!(ok(&user, Action::Submit { tenants: vec!["vision"] }));
        assert!(!ok(&user, Action::Submit { tenants: vec!["vision", "nlp"] }));
        assert!(ok(&user, Action::ReadJob { tenant: "vision" }) && !ok(&user, Action::ReadJob { tenant: "nlp" }));
        assert!(ok(&user, Action::Cancel { tenant: "vision" }) && !ok(&user, Action::Cancel { tenant: "nlp" }));
        assert!(!ok(&user, Action::ReadView) && ok(&user, Action::Status));
        assert!(!ok(&host, Action::Submit { tenants: vec!["vision"] }));
        assert!(ok(&agent, Action::ReadView) && ok(&host, Action::ReadView));
    }

    #[test]
    fn a_caller_over_its_rate_waits_and_others_do_not() {
        let mut l = RateLimiter::new(10);
        let t0 = std::time::Instant::now();
        let alice = id(Role::User, "alice", &["vision"]);
        let bob = id(Role::User, "bob", &["vision"]);
        let admin = id(Role::Admin, "ops", &[]);
        for i in 0..10 {
            assert!(l.take(&alice, t0).is_ok(), "burst request {i}");
        }
        let refused = l.take(&alice, t0).expect_err("the 11th at once");
        assert!(refused.contains("retry in 100 ms"), "{refused}");
        assert!(l.take(&bob, t0).is_ok(), "another caller has its own bucket");
        assert!((0..100).all(|_| l.take(&admin, t0).is_ok()), "admins are not limited");
        // 100 ms later, one more.
        let later = t0 + std::time::Duration::from_millis(100);
        assert!(l.take(&alice, later).is_ok());
        assert!(l.take(&alice, later).is_err());
        assert!(RateLimiter::new(0).take(&alice, t0).is_ok(), "0 is no limit");
    }

    #[test]
    fn the_audit_file_holds_one_json_line_per_event() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = AuditLog::new(dir.path().join("audit.jsonl"));
        let user = id(Role::User, "alice", &["vision"]);
        log.record(Some(&user), "CordonServer", "server 3", &Err("no".into()));
        log.record(None, "Snapshot", "", &Err("anonymous".into()));
        let text = std::fs::read_to_string(log.path()).expect("read");
        let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).expect("json line")).collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["who"]["name"], "alice");
        assert_eq!(lines[0]["allowed"], false);
        assert_eq!(lines[1]["who"], serde_json::Value::Null);
    }
}
