//! The chaos suite's fault schedule, drawn from a seed: which fault, on which target, held for
//! how long, and the quiet time after it heals.
//!
//! Pure: no clock, no I/O. The same seed gives the same schedule on every machine, so a run
//! that found a fault is repeated with `--seed`. Every consecutive block of `kinds.len()`
//! faults holds each kind once (in a shuffled order), so a short round still covers every kind
//! and a soak spreads them evenly.
//!
//! Every `overlap_every`-th fault has a partner: a second fault injected while the first still
//! holds (a kill during a partition, a leader killed while another replica's disk is full), on
//! another target. Partners' kinds come from blocks of their own, so they too cover every kind.

use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::time::Duration;

/// What a fault does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// `kill -9` of the leader's container, restarted after the hold.
    KillLeader,
    /// `kill -9` of a follower's container, restarted after the hold.
    KillFollower,
    /// The leader's container frozen (`docker pause`): a stale leader that wakes up.
    PauseLeader,
    /// One replica cut off the raft network (from the other replicas), then reconnected.
    PartitionReplica,
    /// The leader cut off from its clients (schedulers, agents, the CLI: its client and HTTP
    /// ports closed), while it still reaches the other replicas and keeps its quorum.
    IsolateLeader,
    /// One replica's links slowed and lossy: a rate-limited queue (or `netem` delay where the
    /// kernel has it) and random packet loss, in its network namespace.
    SlowNetwork,
    /// A node agent's container frozen for longer than its server lease: the server is marked
    /// down and its gangs re-queued; the agent wakes up to a view that moved on.
    AgentLost,
    /// `kill -9` of a scheduler host while it holds pending jobs, restarted after the hold.
    KillScheduler,
    /// One replica's data file system filled up, then freed.
    FullDisk,
    /// The leader's wall clock stepped hours forward or back (libfaketime in its process; its
    /// monotonic clock runs on), then set right: an NTP step, an operator's `date`, a VM
    /// resumed.
    ClockJump,
}

impl FaultKind {
    /// Every kind, in the order reports list them.
    pub const ALL: [FaultKind; 10] = [
        FaultKind::KillLeader,
        FaultKind::KillFollower,
        FaultKind::PauseLeader,
        FaultKind::PartitionReplica,
        FaultKind::IsolateLeader,
        FaultKind::SlowNetwork,
        FaultKind::AgentLost,
        FaultKind::KillScheduler,
        FaultKind::FullDisk,
        FaultKind::ClockJump,
    ];

    /// The kind's name in reports and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::KillLeader => "kill-leader",
            FaultKind::KillFollower => "kill-follower",
            FaultKind::PauseLeader => "pause-leader",
            FaultKind::PartitionReplica => "partition-replica",
            FaultKind::IsolateLeader => "isolate-leader",
            FaultKind::SlowNetwork => "slow-network",
            FaultKind::AgentLost => "agent-lost",
            FaultKind::KillScheduler => "kill-scheduler",
            FaultKind::FullDisk => "full-disk",
            FaultKind::ClockJump => "clock-jump",
        }
    }

    /// Whether the fault is aimed at the leader (a clock jump prefers it).
    pub fn needs_leader(self) -> bool {
        matches!(self, FaultKind::KillLeader | FaultKind::PauseLeader | FaultKind::IsolateLeader | FaultKind::ClockJump)
    }

    /// The kind named `s`.
    pub fn parse(s: &str) -> Option<FaultKind> {
        FaultKind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// How long the fault lasts, in milliseconds: (least, most). Every window reaches past an
    /// election timeout where the fault can cost the leader its office; an agent is lost for
    /// longer than its lease plus one heartbeat, so its server is surely marked down.
    fn hold_ms(self, agent_lease: Duration) -> (u64, u64) {
        match self {
            FaultKind::KillLeader | FaultKind::KillFollower => (500, 3_000),
            FaultKind::PauseLeader | FaultKind::PartitionReplica => (2_000, 6_000),
            FaultKind::IsolateLeader => (2_000, 5_000),
            FaultKind::SlowNetwork => (3_000, 8_000),
            FaultKind::AgentLost => {
                let lease = agent_lease.as_millis() as u64;
                (lease + 2_000, lease + 5_000)
            }
            FaultKind::KillScheduler => (1_000, 4_000),
            FaultKind::FullDisk => (2_000, 5_000),
            // Long enough for libfaketime to read the step (it rereads its file every second)
            // and the leader to write entries under it.
            FaultKind::ClockJump => (3_000, 6_000),
        }
    }
}

/// One fault of the schedule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Fault {
    /// Its place in the schedule (0-based).
    pub index: usize,
    /// What it does.
    pub kind: FaultKind,
    /// Which target among the candidates of its kind (followers, replicas, agents, scheduler
    /// hosts), taken modulo their number when the fault is injected; unused for the leader.
    pub pick: u32,
    /// How long the fault lasts before it is healed.
    #[serde(serialize_with = "millis")]
    pub hold: Duration,
    /// Quiet time after the cluster recovered, before the next fault.
    #[serde(serialize_with = "millis")]
    pub gap: Duration,
    /// A second fault injected while this one holds; none for most.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partner: Option<Partner>,
}

impl Fault {
    /// A clock-jump's step, in seconds: 1 to 24 hours, forward or back (by `pick`).
    pub fn clock_step_s(&self) -> i64 {
        clock_step(self.pick)
    }
}

/// The clock step of a clock-jump fault drawn with `pick`, in seconds: 1 to 24 hours, forward
/// for an even pick, back for an odd one.
pub fn clock_step(pick: u32) -> i64 {
    let hours = 1 + i64::from(pick / 2 % 24);
    if pick.is_multiple_of(2) { hours * 3_600 } else { -hours * 3_600 }
}

/// A fault injected during another (see [`Fault::partner`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Partner {
    /// What it does.
    pub kind: FaultKind,
    /// Which target among its kind's candidates, the first fault's target excluded.
    pub pick: u32,
    /// How long after the first fault's injection it is injected (within the first's hold).
    #[serde(serialize_with = "millis")]
    pub after: Duration,
    /// How long it lasts; it is healed at its own end, which may come after the first's.
    #[serde(serialize_with = "millis")]
    pub hold: Duration,
}

impl Partner {
    /// A clock-jump's step, in seconds (as [`Fault::clock_step_s`]).
    pub fn clock_step_s(&self) -> i64 {
        clock_step(self.pick)
    }
}

fn millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_millis() as u64)
}

/// A seeded list of faults.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Schedule {
    /// The seed it was drawn from.
    pub seed: u64,
    /// The faults, in order.
    pub faults: Vec<Fault>,
}

impl Schedule {
    /// `n` faults of `kinds` (each kind once per block of `kinds.len()`, shuffled), drawn from
    /// `seed`; every `overlap_every`-th has a partner (0: none has). `agent_lease` is the
    /// servers' lease, which an `agent-lost` fault outlasts. Empty `kinds` gives an empty
    /// schedule.
    pub fn seeded(seed: u64, n: usize, kinds: &[FaultKind], agent_lease: Duration, overlap_every: usize) -> Schedule {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut kinds: Vec<FaultKind> = kinds.to_vec();
        kinds.sort();
        kinds.dedup();
        let mut faults: Vec<Fault> = Vec::with_capacity(n);
        let mut block: Vec<FaultKind> = Vec::new();
        let mut partners: Vec<FaultKind> = Vec::new();
        let next = |block: &mut Vec<FaultKind>, rng: &mut SmallRng| {
            if block.is_empty() {
                *block = kinds.clone();
                block.shuffle(rng);
            }
            block.pop()
        };
        while faults.len() < n {
            let Some(kind) = next(&mut block, &mut rng) else { break };
            let (lo, hi) = kind.hold_ms(agent_lease);
            let hold = Duration::from_millis(rng.random_range(lo..=hi));
            let index = faults.len();
            let mut f = Fault {
                index,
                kind,
                pick: rng.random_range(0..1024),
                hold,
                gap: Duration::from_millis(rng.random_range(500..=2_000)),
                partner: None,
            };
            if overlap_every > 0 && index % overlap_every == overlap_every - 1 {
                let kind = next(&mut partners, &mut rng).unwrap_or(FaultKind::KillLeader);
                let (lo, hi) = kind.hold_ms(agent_lease);
                let half = (hold.as_millis() as u64 / 2).max(1);
                f.partner = Some(Partner {
                    kind,
                    pick: rng.random_range(0..1024),
                    after: Duration::from_millis(rng.random_range(0..half)),
                    hold: Duration::from_millis(rng.random_range(lo..=hi)),
                });
            }
            faults.push(f);
        }
        Schedule { seed, faults }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(6);

    #[test]
    fn a_seed_gives_one_schedule() {
        let a = Schedule::seeded(7, 40, &FaultKind::ALL, LEASE, 3);
        assert_eq!(a, Schedule::seeded(7, 40, &FaultKind::ALL, LEASE, 3));
        assert_ne!(a.faults, Schedule::seeded(8, 40, &FaultKind::ALL, LEASE, 3).faults);
    }

    #[test]
    fn every_block_holds_every_kind_once() {
        let n = FaultKind::ALL.len();
        let s = Schedule::seeded(3, n * 12 + 4, &FaultKind::ALL, LEASE, 0);
        assert_eq!(s.faults.len(), n * 12 + 4);
        for block in s.faults.chunks(n).filter(|b| b.len() == n) {
            let mut kinds: Vec<FaultKind> = block.iter().map(|f| f.kind).collect();
            kinds.sort();
            assert_eq!(kinds, FaultKind::ALL.to_vec());
        }
        for (i, f) in s.faults.iter().enumerate() {
            assert_eq!(f.index, i);
        }
    }

    #[test]
    fn holds_stay_in_their_windows_and_agents_outlast_the_lease() {
        for f in Schedule::seeded(11, 200, &FaultKind::ALL, LEASE, 3).faults {
            let (lo, hi) = f.kind.hold_ms(LEASE);
            let ms = f.hold.as_millis() as u64;
            assert!((lo..=hi).contains(&ms), "{f:?}");
            if f.kind == FaultKind::AgentLost {
                assert!(f.hold > LEASE + Duration::from_secs(1), "{f:?}");
            }
            assert!((500..=2_000).contains(&(f.gap.as_millis() as u64)), "{f:?}");
        }
    }

    #[test]
    fn a_subset_of_kinds_draws_only_those() {
        let kinds = [FaultKind::FullDisk, FaultKind::KillLeader, FaultKind::KillLeader];
        let s = Schedule::seeded(1, 10, &kinds, LEASE, 2);
        let ours = |k: FaultKind| matches!(k, FaultKind::FullDisk | FaultKind::KillLeader);
        assert!(s.faults.iter().all(|f| ours(f.kind) && f.partner.as_ref().is_none_or(|p| ours(p.kind))));
        assert_eq!(s.faults.iter().filter(|f| f.kind == FaultKind::FullDisk).count(), 5);
        assert!(Schedule::seeded(1, 10, &[], LEASE, 2).faults.is_empty());
    }

    #[test]
    fn every_nth_fault_has_a_partner_within_its_hold_and_partners_cover_every_kind() {
        let n = FaultKind::ALL.len();
        let s = Schedule::seeded(5, 3 * n, &FaultKind::ALL, LEASE, 3);
        let mut kinds = Vec::new();
        for f in &s.faults {
            match &f.partner {
                Some(p) => {
                    assert_eq!(f.index % 3, 2, "{f:?}");
                    assert!(p.after < f.hold, "{f:?}");
                    let (lo, hi) = p.kind.hold_ms(LEASE);
                    assert!((lo..=hi).contains(&(p.hold.as_millis() as u64)), "{f:?}");
                    kinds.push(p.kind);
                }
                None => assert_ne!(f.index % 3, 2, "{f:?}"),
            }
        }
        kinds.sort();
        assert_eq!(kinds, FaultKind::ALL.to_vec());
        assert!(Schedule::seeded(5, 3 * n, &FaultKind::ALL, LEASE, 0).faults.iter().all(|f| f.partner.is_none()));
    }

    #[test]
    fn clock_steps_are_hours_either_way() {
        let s = Schedule::seeded(9, 200, &[FaultKind::ClockJump], LEASE, 0);
        let steps: Vec<i64> = s.faults.iter().map(Fault::clock_step_s).collect();
        assert!(steps.iter().all(|s| s.abs() >= 3_600 && s.abs() <= 24 * 3_600 && s % 3_600 == 0));
        assert!(steps.iter().any(|s| *s > 0) && steps.iter().any(|s| *s < 0));
    }

    #[test]
    fn names_round_trip() {
        for k in FaultKind::ALL {
            assert_eq!(FaultKind::parse(k.as_str()), Some(k));
        }
        assert_eq!(FaultKind::parse("kill-everything"), None);
    }
}
