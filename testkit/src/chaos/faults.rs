//! One entry of the schedule in force: its fault injected, its partner (if any) injected
//! while it holds, each healed at its own end, then the wait for the cluster to recover.
//!
//! A partner never hits a container the first fault already holds (a paused replica is not
//! also killed; a partitioned one is not also filled up): it picks among the others of its
//! kind, and is skipped, and said so, when none is left (a leader fault whose leader is the
//! one the first fault froze). While a fault holds, and again once the cluster recovered, the
//! suite reads the view's clock against its own (the containers share this host's kernel
//! clock, so the suite's clock is true time unless a fault faked one).

use super::inject::{self, Compose};
use super::schedule::{Fault, FaultKind};
use super::{CLIENT_PORTS, ChaosConfig, call, read_view, recover};
use crate::KitError;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tessera_view_server::ViewClient;

/// One fault as it happened.
#[derive(Clone, Debug, Serialize)]
pub struct FaultRecord {
    /// The schedule's entry.
    #[serde(flatten)]
    pub fault: Fault,
    /// What it hit (a service name).
    pub target: String,
    /// What its partner hit, or why it was skipped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partner_target: Option<String>,
    /// Whether the partner was injected.
    #[serde(skip)]
    pub partner_injected: bool,
    /// Seconds from the start of the load to the injection.
    pub at_s: f64,
    /// Milliseconds from the injection to the first write (a submission or a placement)
    /// acknowledged as committed among those sent after it; none: no write sent after it was
    /// acknowledged.
    pub unavailable_ms: Option<f64>,
    /// Milliseconds from the last heal until the cluster had recovered.
    pub recovered_ms: f64,
    /// The view's clock less true time, milliseconds, read from the leader as the first heal
    /// begins (none: no leader answered within 3 s).
    pub clock_held_ms: Option<i64>,
    /// The same, once the cluster recovered.
    pub clock_recovered_ms: Option<i64>,
}

/// Most the view's clock may read ahead of true time: the leaders' slew (500 ppm) over a
/// soak of an hour is 1.8 s.
pub const CLOCK_AHEAD_MS: i64 = 2_000;

/// Most the view's clock may read behind true time at the end of a clock jump that held
/// alone: the load writes several entries a second, each stamped by the leader, so the last
/// one is well under this old.
pub const CLOCK_BEHIND_MS: i64 = 5_000;

/// A fault in force: what it hit (as the report says it), the container it holds, and what
/// undoes it.
struct Injected {
    target: String,
    service: String,
    heal: Heal,
}

/// What undoes a fault.
enum Heal {
    /// Start the killed container.
    Start(String),
    /// Unpause the frozen container.
    Unpause(String),
    /// Join the raft network again under this alias.
    Reconnect(String, String),
    /// Open the client ports again.
    Ports(String),
    /// Restore the links.
    Network(String),
    /// Stop filling replica N's disk, free it, start the replica if it stopped.
    Disk(u64, String, inject::Filler),
    /// Set replica N's clock right.
    Clock(u64),
}

/// Injects, holds, heals one entry of the schedule (and its partner) and waits for the
/// cluster to recover.
pub(super) async fn one_fault(
    cfg: &ChaosConfig,
    replicas: &[u64],
    f: &Fault,
    c: &mut ViewClient,
    started: Instant,
) -> Result<FaultRecord, KitError> {
    let leader = c.wait_for_leader().await.map_err(call("waiting for a leader"))?.leader;
    let first = inject(cfg, c, replicas, Some(leader), f.kind, f.pick, &[]).await?;
    let first = first.ok_or_else(|| fault_err(f, "no target", "the cluster has none of this kind"))?;
    let at = Instant::now();
    let mut heals = vec![(at + f.hold, first.heal)];
    let (mut partner_target, mut partner_injected) = (None, false);
    if let Some(p) = &f.partner {
        tokio::time::sleep_until((at + p.after).into()).await;
        // The leader may have changed, or be the one the first fault holds: a fault aimed at
        // the leader waits (within the first's hold) for a leader it may hit, so that a kill
        // during a pause hits the new leader rather than nothing.
        let until = if p.kind.needs_leader() { at + f.hold } else { Instant::now() };
        let leader = leader_besides(c, &first.service, until).await;
        match inject(cfg, c, replicas, leader, p.kind, p.pick, std::slice::from_ref(&first.service)).await {
            Ok(Some(second)) => {
                partner_target = Some(second.target);
                partner_injected = true;
                heals.push((Instant::now() + p.hold, second.heal));
            }
            Ok(None) => {
                partner_target = Some(format!("skipped: no {} target besides {}", p.kind.as_str(), first.service))
            }
            Err(e) => {
                // Heal the first before giving up.
                for (_, h) in heals {
                    let _ = heal(&cfg.compose, h).await;
                }
                return Err(e);
            }
        }
    }
    heals.sort_by_key(|(end, _)| *end);
    let mut clock_held = None;
    let mut outcome = Ok(());
    for (i, (end, h)) in heals.into_iter().enumerate() {
        tokio::time::sleep_until(end.into()).await;
        if i == 0 {
            // Read beside the heal, on a client of its own: a read that waits on a frozen
            // leader must not hold the fault past its hold (the first version did, by up to 3 s).
            let mut reader = c.clone();
            clock_held = Some(tokio::spawn(async move { clock_error_ms(&mut reader).await }));
        }
        // Every fault is healed, even after one heal failed.
        if let Err(e) = heal(&cfg.compose, h).await
            && outcome.is_ok()
        {
            outcome = Err(e);
        }
    }
    let healed = Instant::now();
    let clock_held_ms = match clock_held {
        Some(t) => t.await.ok().flatten(),
        None => None,
    };
    outcome?;
    recover(cfg, c, cfg.recover_timeout).await.map_err(|why| {
        let what = format!("{} on {}", f.kind.as_str(), first.target);
        fault_err(f, &what, &format!("the cluster did not recover within {} s: {why}", cfg.recover_timeout.as_secs()))
    })?;
    let recovered_ms = healed.elapsed().as_secs_f64() * 1000.0;
    Ok(FaultRecord {
        fault: f.clone(),
        target: first.target,
        partner_target,
        partner_injected,
        at_s: at.duration_since(started).as_secs_f64(),
        unavailable_ms: None,
        recovered_ms,
        clock_held_ms,
        clock_recovered_ms: clock_error_ms(c).await,
    })
}

/// The leader, asked afresh; until `until`, asked again while it is `busy` (the container
/// another fault holds) or unknown. None when no replica named one.
async fn leader_besides(c: &mut ViewClient, busy: &str, until: Instant) -> Option<u64> {
    let mut last = None;
    loop {
        if let Ok(Ok(s)) = tokio::time::timeout(Duration::from_secs(1), c.wait_for_leader()).await {
            if format!("view-{}", s.leader) != busy {
                return Some(s.leader);
            }
            last = Some(s.leader);
        }
        if Instant::now() + Duration::from_millis(250) >= until {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn fault_err(f: &Fault, what: &str, why: &str) -> KitError {
    KitError::Fault { what: format!("fault {} ({what})", f.index), why: why.to_string() }
}

/// Injects one fault of `kind` on a target that is not `busy` (chosen by `pick` among the
/// candidates); none when no candidate is left, or when it needs the leader and none is known.
async fn inject(
    cfg: &ChaosConfig,
    c: &mut ViewClient,
    replicas: &[u64],
    leader: Option<u64>,
    kind: FaultKind,
    pick: u32,
    busy: &[String],
) -> Result<Option<Injected>, KitError> {
    let k = &cfg.compose;
    let free = |s: &String| !busy.contains(s);
    let choose = |all: Vec<String>| -> Option<String> {
        let all: Vec<String> = all.into_iter().filter(free).collect();
        (!all.is_empty()).then(|| all[pick as usize % all.len()].clone())
    };
    let view = |id: u64| format!("view-{id}");
    let the_leader = leader.map(view).filter(free);
    let followers: Vec<String> = replicas.iter().filter(|r| Some(**r) != leader).map(|r| view(*r)).collect();
    let any_replica: Vec<String> = replicas.iter().map(|r| view(*r)).collect();
    let id_of = |s: &str| s.trim_start_matches("view-").parse::<u64>().unwrap_or(0);
    let done = |target: String, service: String, heal: Heal| Ok(Some(Injected { target, service, heal }));
    match kind {
        FaultKind::KillLeader | FaultKind::KillFollower => {
            let s = if kind == FaultKind::KillLeader { the_leader } else { choose(followers) };
            let Some(s) = s else { return Ok(None) };
            k.kill(&s).await?;
            done(s.clone(), s.clone(), Heal::Start(s))
        }
        FaultKind::PauseLeader => {
            let Some(s) = the_leader else { return Ok(None) };
            k.pause(&s).await?;
            done(s.clone(), s.clone(), Heal::Unpause(s))
        }
        FaultKind::AgentLost => {
            let Some(s) = choose(cfg.agents.clone()) else { return Ok(None) };
            k.pause(&s).await?;
            done(s.clone(), s.clone(), Heal::Unpause(s))
        }
        FaultKind::PartitionReplica => {
            let Some(s) = choose(any_replica) else { return Ok(None) };
            k.disconnect("raft", &s).await?;
            done(format!("{s} from raft"), s.clone(), Heal::Reconnect(s.clone(), format!("{s}-raft")))
        }
        FaultKind::IsolateLeader => {
            // Ports, not the `clients` network: this host reaches the replicas through
            // published ports, which a network disconnect leaves open.
            let Some(s) = the_leader else { return Ok(None) };
            k.isolate_ports(&s, &CLIENT_PORTS).await?;
            done(format!("{s} from its clients"), s.clone(), Heal::Ports(s))
        }
        FaultKind::SlowNetwork => {
            let Some(s) = choose(any_replica) else { return Ok(None) };
            let how = match k.slow_network(&s).await? {
                inject::SlowLink::Netem => "netem",
                inject::SlowLink::TbfAndDrops => "tbf+drops",
            };
            done(format!("{s} ({how})"), s.clone(), Heal::Network(s))
        }
        FaultKind::KillScheduler => {
            // The host holding the most pending jobs (the leader knows), so that the kill
            // orphans jobs; drawn when none holds any.
            let held = match leader {
                Some(l) => held_by_host(cfg, c, l).await,
                None => BTreeMap::new(),
            };
            let most = cfg.schedulers.iter().filter(|s| free(s)).filter_map(|s| held.get(s).map(|n| (*n, s))).max();
            let Some(s) = most.map(|(_, s)| s.clone()).or_else(|| choose(cfg.schedulers.clone())) else {
                return Ok(None);
            };
            let n = held.get(&s).copied().unwrap_or(0);
            k.kill(&s).await?;
            done(format!("{s} (holding {n} jobs)"), s.clone(), Heal::Start(s))
        }
        FaultKind::FullDisk => {
            let Some(s) = choose(any_replica) else { return Ok(None) };
            let id = id_of(&s);
            let filler = k.fill_disk(id).await?;
            // A running replica rarely needs new blocks within the hold (RocksDB preallocates
            // its write-ahead log), so every other time the replica is also restarted onto the
            // full disk: it must open its store there, and fail cleanly until it can.
            let restart = pick.is_multiple_of(2);
            if restart {
                k.kill(&s).await?;
                k.start(&s).await?;
            }
            let what = if restart { format!("{s} (restarted onto it)") } else { s.clone() };
            done(what, s.clone(), Heal::Disk(id, s, filler))
        }
        FaultKind::ClockJump => {
            // The leader's clock, the one written into the log; a follower's when the leader
            // is taken (a partner), which matters once it is elected.
            let Some(s) = the_leader.or_else(|| choose(followers)) else { return Ok(None) };
            let id = id_of(&s);
            let step = super::schedule::clock_step(pick);
            k.set_clock(id, step).await?;
            done(format!("{s} ({step:+} s)"), s, Heal::Clock(id))
        }
    }
}

async fn heal(k: &Compose, h: Heal) -> Result<(), KitError> {
    match h {
        Heal::Start(s) => k.ensure_running(&s).await,
        Heal::Unpause(s) => k.unpause(&s).await,
        Heal::Reconnect(s, alias) => k.connect("raft", &s, &alias).await,
        Heal::Ports(s) => k.heal_ports(&s).await,
        Heal::Network(s) => k.heal_network(&s).await,
        Heal::Disk(id, s, filler) => {
            let bytes = filler.stop().await?;
            tracing::info!(replica = id, mib = bytes >> 20, "chaos: a replica's disk was full");
            k.free_disk(id).await?;
            // A replica that stopped on the full disk is started at once (docker's own restart
            // policy backs off up to a minute).
            k.ensure_running(&s).await
        }
        Heal::Clock(id) => k.set_clock(id, 0).await,
    }
}

/// Pending jobs each scheduler host holds, as the leader (replica `leader`) tells.
async fn held_by_host(cfg: &ChaosConfig, c: &mut ViewClient, leader: u64) -> BTreeMap<String, usize> {
    let Some(addr) = cfg.view.get(leader.saturating_sub(1) as usize) else { return BTreeMap::new() };
    match tokio::time::timeout(Duration::from_secs(2), c.status_of(addr)).await {
        Ok(Ok(s)) => s.scheduler_hosts.into_iter().map(|h| (h.host, h.jobs.len())).collect(),
        _ => BTreeMap::new(),
    }
}

/// The view's clock (the leader's, read linearizably) less this host's clock, milliseconds;
/// none when no leader answers within 3 s.
async fn clock_error_ms(c: &mut ViewClient) -> Option<i64> {
    let v = tokio::time::timeout(Duration::from_secs(3), read_view(c, None)).await.ok()?.ok()?;
    let now = SystemTime::now().duration_since(UNIX_EPOCH).ok()?.as_millis() as i64;
    Some(v.now_ms() as i64 - now)
}

/// The clock checks over the fault log: the view's clock never read more than
/// [`CLOCK_AHEAD_MS`] ahead of true time, and a clock jump that held alone did not hold the
/// view's clock back more than [`CLOCK_BEHIND_MS`]. Answers the violations, and the largest
/// readings ahead and behind.
pub(super) fn clock_checks(log: &[FaultRecord]) -> (Vec<String>, i64, i64) {
    let mut violations = Vec::new();
    let (mut ahead, mut behind) = (0i64, 0i64);
    for r in log {
        for (when, e) in [("while it held", r.clock_held_ms), ("after it", r.clock_recovered_ms)] {
            let Some(e) = e else { continue };
            ahead = ahead.max(e);
            behind = behind.max(-e);
            if e > CLOCK_AHEAD_MS {
                violations
                    .push(format!("fault {}: {when}, the view's clock read {e} ms ahead of true time", r.fault.index));
            }
        }
        let alone = r.fault.kind == FaultKind::ClockJump && !r.partner_injected;
        if alone && let Some(e) = r.clock_held_ms.filter(|e| -*e > CLOCK_BEHIND_MS) {
            violations.push(format!("fault {}: the view's clock read {} ms behind true time", r.fault.index, -e));
        }
    }
    (violations, ahead, behind)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: FaultKind, held: Option<i64>, recovered: Option<i64>) -> FaultRecord {
        FaultRecord {
            fault: Fault { index: 4, kind, pick: 0, hold: Duration::ZERO, gap: Duration::ZERO, partner: None },
            target: "view-1".into(),
            partner_target: None,
            partner_injected: false,
            at_s: 0.0,
            unavailable_ms: None,
            recovered_ms: 0.0,
            clock_held_ms: held,
            clock_recovered_ms: recovered,
        }
    }

    #[test]
    fn a_clock_ahead_or_held_back_is_a_violation() {
        let (v, ahead, behind) = clock_checks(&[record(FaultKind::ClockJump, Some(-300), Some(40))]);
        assert!(v.is_empty(), "{v:?}");
        assert_eq!((ahead, behind), (40, 300));
        let (v, _, _) = clock_checks(&[record(FaultKind::ClockJump, Some(3_600_000), None)]);
        assert_eq!(v.len(), 1, "{v:?}");
        let (v, _, _) = clock_checks(&[record(FaultKind::ClockJump, Some(-3_600_000), Some(0))]);
        assert_eq!(v.len(), 1, "{v:?}");
        // A kill holds writes: the clock falls behind, and that is not the clock's fault.
        let (v, _, _) = clock_checks(&[record(FaultKind::KillLeader, Some(-9_000), None)]);
        assert!(v.is_empty(), "{v:?}");
        let (v, _, _) = clock_checks(&[record(FaultKind::KillLeader, None, Some(2_001))]);
        assert_eq!(v.len(), 1, "{v:?}");
    }
}
