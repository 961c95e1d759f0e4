//! The chaos suite's fault schedule, drawn from a seed: which fault, on which target, held for
//! how long, and the quiet time after it heals.
//!
//! Pure: no clock, no I/O. The same seed gives the same schedule on every machine, so a run
//! that found a fault is repeated with `--seed`. Every consecutive block of `kinds.len()`
//! faults holds each kind once (in a shuffled order), so a short round still covers every kind
//! and a soak spreads them evenly.

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
}

impl FaultKind {
    /// Every kind, in the order reports list them.
    pub const ALL: [FaultKind; 9] = [
        FaultKind::KillLeader,
        FaultKind::KillFollower,
        FaultKind::PauseLeader,
        FaultKind::PartitionReplica,
        FaultKind::IsolateLeader,
        FaultKind::SlowNetwork,
        FaultKind::AgentLost,
        FaultKind::KillScheduler,
        FaultKind::FullDisk,
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
        }
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
    /// `seed`. `agent_lease` is the servers' lease, which an `agent-lost` fault outlasts.
    /// Empty `kinds` gives an empty schedule.
    pub fn seeded(seed: u64, n: usize, kinds: &[FaultKind], agent_lease: Duration) -> Schedule {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut kinds: Vec<FaultKind> = kinds.to_vec();
        kinds.sort();
        kinds.dedup();
        let mut faults = Vec::with_capacity(n);
        let mut block: Vec<FaultKind> = Vec::new();
        while faults.len() < n && !kinds.is_empty() {
            if block.is_empty() {
                block = kinds.clone();
                block.shuffle(&mut rng);
            }
            let kind = block.pop().unwrap_or(FaultKind::KillLeader);
            let (lo, hi) = kind.hold_ms(agent_lease);
            faults.push(Fault {
                index: faults.len(),
                kind,
                pick: rng.random_range(0..1024),
                hold: Duration::from_millis(rng.random_range(lo..=hi)),
                gap: Duration::from_millis(rng.random_range(500..=2_000)),
            });
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
        let a = Schedule::seeded(7, 40, &FaultKind::ALL, LEASE);
        assert_eq!(a, Schedule::seeded(7, 40, &FaultKind::ALL, LEASE));
        assert_ne!(a.faults, Schedule::seeded(8, 40, &FaultKind::ALL, LEASE).faults);
    }

    #[test]
    fn every_block_holds_every_kind_once() {
        let s = Schedule::seeded(3, 9 * 12 + 4, &FaultKind::ALL, LEASE);
        assert_eq!(s.faults.len(), 9 * 12 + 4);
        for block in s.faults.chunks(9).filter(|b| b.len() == 9) {
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
        for f in Schedule::seeded(11, 200, &FaultKind::ALL, LEASE).faults {
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
        let s = Schedule::seeded(1, 10, &kinds, LEASE);
        assert!(s.faults.iter().all(|f| matches!(f.kind, FaultKind::FullDisk | FaultKind::KillLeader)));
        assert_eq!(s.faults.iter().filter(|f| f.kind == FaultKind::FullDisk).count(), 5);
        assert!(Schedule::seeded(1, 10, &[], LEASE).faults.is_empty());
    }

    #[test]
    fn names_round_trip() {
        for k in FaultKind::ALL {
            assert_eq!(FaultKind::parse(k.as_str()), Some(k));
        }
        assert_eq!(FaultKind::parse("kill-everything"), None);
    }
}
