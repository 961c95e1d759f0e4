//! Servers' leases, kept by the leader in memory: a server that registers or heartbeats holds
//! its lease for [`DriverConfig::lease`](super::DriverConfig::lease); one that stops is marked
//! down when its lease runs out, and its gangs go back to pending.
//!
//! The table is pure: time comes in as an argument (`now`), read once per event by the driver
//! ([`super::Driver`]), so the unit tests below drive it with explicit instants, lease
//! boundaries included, and never wait. What it does not decide stays in the driver: whether
//! this replica leads (only a leader keeps leases) and proposing `SetHealth` for the servers
//! [`ServerLeases::expired`] names.
//!
//! Nothing here is replicated. A new leader knows no deadlines, so it grants every server that
//! is not down a full lease from the moment it takes office ([`ServerLeases::took_office`]):
//! a server is never marked down for a silence that began under the old leader and that the new
//! one could not have heard end.

use crate::error::ViewServerError;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tessera_view::{Health, ServerId};

/// The leader's lease deadlines, one per server it holds a lease for.
#[derive(Debug)]
pub struct ServerLeases {
    /// How long a registration or heartbeat holds; zero disables leases.
    lease: Duration,
    /// Deadline per server: at or after it, the lease has run out.
    deadlines: BTreeMap<ServerId, Instant>,
}

impl ServerLeases {
    /// An empty table granting leases of `lease`; zero disables leases (no server is ever
    /// marked down for silence).
    pub fn new(lease: Duration) -> ServerLeases {
        ServerLeases { lease, deadlines: BTreeMap::new() }
    }

    /// Whether leases are kept at all.
    pub fn enabled(&self) -> bool {
        !self.lease.is_zero()
    }

    /// The lease in milliseconds, as told to servers (0: disabled).
    pub fn lease_ms(&self) -> u64 {
        self.lease.as_millis() as u64
    }

    /// A server registered (its record is, or is about to be, up): a full lease from `now`.
    pub fn register(&mut self, server: ServerId, now: Instant) {
        if self.enabled() {
            self.deadlines.insert(server, now + self.lease);
        }
    }

    /// A server's heartbeat, with its record's `health` in the view: a full lease from `now`.
    /// A server already marked down (or removed) renews nothing; it must register again (its agent does so
    /// on this error). A lease that ran out but whose server is not marked down yet is renewed:
    /// the server is alive, and if the `SetHealth` already queued takes it down, its next
    /// heartbeat is refused and it registers again.
    pub fn renew(&mut self, server: ServerId, health: Health, now: Instant) -> Result<(), ViewServerError> {
        match health {
            Health::Down => return Err(ViewServerError::ServerDown { server }),
            Health::Removed => {
                // Its agent registers again on this error (FAILED_PRECONDITION) and is refused
                // for good; nothing is left to expire.
                self.deadlines.remove(&server);
                return Err(ViewServerError::Precondition(format!("{server} was removed from the cluster")));
            }
            Health::Up | Health::Draining => {}
        }
        self.register(server, now);
        Ok(())
    }

    /// The servers whose lease has run out at `now` (deadline at or before it), in id order.
    /// They stay listed until [`ServerLeases::marked_down`] or a renewal, so a `SetHealth` that
    /// could not be queued is tried again at the next tick.
    pub fn expired(&self, now: Instant) -> Vec<ServerId> {
        self.deadlines.iter().filter(|(_, d)| **d <= now).map(|(s, _)| *s).collect()
    }

    /// The server's `SetHealth { Down }` is queued: forget its lease.
    pub fn marked_down(&mut self, server: ServerId) {
        self.deadlines.remove(&server);
    }

    /// This replica became leader at `now`: forget any old deadlines and grant each server in
    /// `not_down` (every server whose record is not down) a full lease from `now`.
    pub fn took_office(&mut self, now: Instant, not_down: impl IntoIterator<Item = ServerId>) {
        self.deadlines.clear();
        if self.enabled() {
            let deadline = now + self.lease;
            self.deadlines.extend(not_down.into_iter().map(|s| (s, deadline)));
        }
    }

    /// This replica lost leadership: it keeps no leases (the next leader grants fresh ones).
    pub fn left_office(&mut self) {
        self.deadlines.clear();
    }

    /// The deadline of `server`'s lease, if one is held.
    pub fn deadline(&self, server: ServerId) -> Option<Instant> {
        self.deadlines.get(&server).copied()
    }

    /// How many leases are held.
    pub fn len(&self) -> usize {
        self.deadlines.len()
    }

    /// Whether no lease is held.
    pub fn is_empty(&self) -> bool {
        self.deadlines.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(3);

    fn s(i: u32) -> ServerId {
        ServerId(i)
    }

    #[test]
    fn register_grants_a_full_lease_that_runs_out_at_its_deadline() {
        let t0 = Instant::now();
        let mut l = ServerLeases::new(LEASE);
        assert!(l.enabled());
        assert_eq!(l.lease_ms(), 3000);
        l.register(s(1), t0);
        assert_eq!(l.deadline(s(1)), Some(t0 + LEASE));
        assert!(l.expired(t0).is_empty());
        assert!(l.expired(t0 + LEASE - Duration::from_nanos(1)).is_empty(), "held until the deadline");
        assert_eq!(l.expired(t0 + LEASE), vec![s(1)], "run out at the deadline itself");
        assert_eq!(l.expired(t0 + LEASE * 10), vec![s(1)]);
    }

    #[test]
    fn registering_again_restarts_the_lease() {
        let t0 = Instant::now();
        let mut l = ServerLeases::new(LEASE);
        l.register(s(1), t0);
        l.register(s(1), t0 + Duration::from_secs(2));
        assert_eq!(l.len(), 1);
        assert!(l.expired(t0 + LEASE).is_empty());
        assert_eq!(l.expired(t0 + Duration::from_secs(2) + LEASE), vec![s(1)]);
    }

    #[test]
    fn renew_before_expiry_extends_the_deadline() {
        let t0 = Instant::now();
        let mut l = ServerLeases::new(LEASE);
        l.register(s(1), t0);
        let t1 = t0 + Duration::from_secs(1);
        l.renew(s(1), Health::Up, t1).expect("renewed");
        assert_eq!(l.deadline(s(1)), Some(t1 + LEASE));
        assert!(l.expired(t0 + LEASE).is_empty(), "the old deadline no longer counts");
        assert_eq!(l.expired(t1 + LEASE), vec![s(1)]);
    }

    #[test]
    fn renew_after_expiry_of_a_server_not_yet_down_renews() {
        let t0 = Instant::now();
        let mut l = ServerLeases::new(LEASE);
        l.register(s(1), t0);
        let late = t0 + LEASE + Duration::from_secs(1);
        assert_eq!(l.expired(late), vec![s(1)]);
        l.renew(s(1), Health::Up, late).expect("alive and not marked down: renewed");
        assert!(l.expired(late).is_empty());
        assert_eq!(l.deadline(s(1)), Some(late + LEASE));
    }

    #[test]
    fn renew_after_marked_down_is_refused_until_registered_again() {
        let t0 = Instant::now();
        let mut l = ServerLeases::new(LEASE);
        l.register(s(1), t0);
        let late = t0 + LEASE;
        assert_eq!(l.expired(late), vec![s(1)]);
        l.marked_down(s(1));
        assert!(l.expired(late).is_empty(), "marked down: no longer listed");
        assert_eq!(l.deadline(s(1)), None);
        // Once the view has it down, heartbeats are refused and renew nothing.
        let err = l.renew(s(1), Health::Down, late).expect_err("down");
        assert!(matches!(err, ViewServerError::ServerDown { server } if server == s(1)), "{err:?}");
        assert_eq!(err.to_string(), "server server#1 is down (its lease expired); register again");
        assert_eq!(l.deadline(s(1)), None, "a refused renewal grants nothing");
        // Registering brings the lease back.
        l.register(s(1), late);
        assert_eq!(l.deadline(s(1)), Some(late + LEASE));
    }

    #[test]
    fn a_removed_server_renews_nothing_and_its_lease_is_forgotten() {
        let t0 = Instant::now();
        let mut l = ServerLeases::new(LEASE);
        l.register(s(1), t0);
        let err = l.renew(s(1), Health::Removed, t0 + Duration::from_secs(1)).expect_err("removed");
        assert!(matches!(&err, ViewServerError::Precondition(m) if m.contains("was removed")), "{err:?}");
        assert_eq!(l.deadline(s(1)), None, "nothing left to expire");
        assert!(l.expired(t0 + LEASE * 2).is_empty());
    }

    #[test]
    fn renew_of_a_down_server_keeps_its_old_deadline() {
        let t0 = Instant::now();
        let mut l = ServerLeases::new(LEASE);
        l.register(s(1), t0);
        assert!(l.renew(s(1), Health::Down, t0 + Duration::from_secs(1)).is_err());
        assert_eq!(l.deadline(s(1)), Some(t0 + LEASE));
    }

    #[test]
    fn renew_of_a_server_with_no_lease_grants_one() {
        // A server registered under an earlier leader and not down: its heartbeat to this one
        // holds a lease from now.
        let t0 = Instant::now();
        let mut l = ServerLeases::new(LEASE);
        l.renew(s(7), Health::Up, t0).expect("renewed");
        assert_eq!(l.deadline(s(7)), Some(t0 + LEASE));
    }

    #[test]
    fn expired_lists_exactly_the_run_out_leases_in_id_order() {
        let t0 = Instant::now();
        let mut l = ServerLeases::new(LEASE);
        for (i, at) in [(5, 0), (2, 1), (9, 2), (0, 3)] {
            l.register(s(i), t0 + Duration::from_secs(at));
        }
        assert!(l.expired(t0 + Duration::from_secs(2)).is_empty());
        assert_eq!(l.expired(t0 + Duration::from_secs(3)), vec![s(5)]);
        assert_eq!(l.expired(t0 + Duration::from_secs(4)), vec![s(2), s(5)]);
        assert_eq!(l.expired(t0 + Duration::from_secs(5)), vec![s(2), s(5), s(9)]);
        assert_eq!(l.expired(t0 + Duration::from_secs(6)), vec![s(0), s(2), s(5), s(9)]);
        // Listing is pure: nothing is forgotten until marked down.
        assert_eq!(l.len(), 4);
        l.marked_down(s(2));
        l.marked_down(s(9));
        assert_eq!(l.expired(t0 + Duration::from_secs(6)), vec![s(0), s(5)]);
        // Marking a server with no lease down is harmless.
        l.marked_down(s(42));
        assert_eq!(l.len(), 2);
    }

    #[test]
    fn a_new_leader_grants_every_server_not_down_a_full_lease() {
        let t0 = Instant::now();
        let mut l = ServerLeases::new(LEASE);
        // Deadlines from an earlier term, some long run out, one for a server now down.
        l.register(s(1), t0);
        l.register(s(2), t0);
        l.register(s(3), t0);
        let t1 = t0 + LEASE * 5;
        assert_eq!(l.expired(t1), vec![s(1), s(2), s(3)]);
        l.took_office(t1, [s(1), s(2), s(4)]);
        assert!(l.expired(t1).is_empty(), "no server is down for a silence the new leader did not see");
        assert!(l.expired(t1 + LEASE - Duration::from_nanos(1)).is_empty());
        for i in [1, 2, 4] {
            assert_eq!(l.deadline(s(i)), Some(t1 + LEASE), "s{i}");
        }
        assert_eq!(l.deadline(s(3)), None, "old deadlines are forgotten");
        assert_eq!(l.expired(t1 + LEASE), vec![s(1), s(2), s(4)]);
    }

    #[test]
    fn a_leader_that_steps_down_keeps_no_leases() {
        let t0 = Instant::now();
        let mut l = ServerLeases::new(LEASE);
        l.took_office(t0, [s(0), s(1)]);
        l.register(s(2), t0);
        assert_eq!(l.len(), 3);
        l.left_office();
        assert!(l.is_empty());
        assert!(l.expired(t0 + LEASE * 10).is_empty());
        // Leading again starts from scratch.
        let t1 = t0 + LEASE * 10;
        l.took_office(t1, [s(1)]);
        assert_eq!(l.len(), 1);
        assert_eq!(l.deadline(s(1)), Some(t1 + LEASE));
    }

    #[test]
    fn lease_zero_disables_leases() {
        let t0 = Instant::now();
        let mut l = ServerLeases::new(Duration::ZERO);
        assert!(!l.enabled());
        assert_eq!(l.lease_ms(), 0);
        l.register(s(1), t0);
        l.renew(s(2), Health::Up, t0).expect("renewed (nothing to hold)");
        l.took_office(t0, [s(3), s(4)]);
        assert!(l.is_empty());
        assert!(l.expired(t0 + Duration::from_secs(3600)).is_empty(), "nobody ever runs out");
        // A down server still must register again, leases or not.
        assert!(matches!(l.renew(s(1), Health::Down, t0), Err(ViewServerError::ServerDown { .. })));
    }
}
