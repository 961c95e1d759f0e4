//! The clock a leader writes at the head of every log entry ([`tessera_view::Command::Clock`]).
//!
//! The view's times follow it on every replica: time limits, attained-service queues, the
//! usage ledger, drain deadlines, history retention. A machine's wall clock can step (an NTP
//! step, an operator's `date`, a VM resumed after a pause) and machines' clocks disagree; if
//! the leader wrote its wall clock as it reads, a step of an hour on one machine would fail
//! every job with a time limit under an hour, charge an hour of GPUs to every tenant, or,
//! backwards, hold every timer for an hour. So the leader measures *elapsed* time on its
//! monotonic clock, which never steps, and reads its wall clock only to correct slowly:
//!
//! - **Within a term**, the stamp is the term's anchor plus the monotonic time since it was
//!   set, moved toward the wall clock by at most [`SLEW`] of that time (500 ppm: the most
//!   NTP ever slews a clock). Nothing the leader wrote feeds back into its own stamps, so the
//!   correction cannot compound.
//! - **A term's anchor** is this replica's estimate of the view's clock: the latest clock it
//!   saw applied while a leader was known, plus the monotonic time since it saw it (the best
//!   such estimate, if it saw several), again moved toward the wall clock by at most [`SLEW`]
//!   of that time. A new leader whose wall clock is skewed, or stepped while it followed,
//!   therefore continues the old leader's time instead of its own.
//! - **With no estimate** (the process has seen no entry applied under a leader: a whole
//!   cluster restarted, its log replayed before any leader was known), the anchor is the wall
//!   clock: nothing else measured the time the cluster was down.
//!
//! The view never moves its clock backwards ([`tessera_view::ClusterView::advance_clock`]), so
//! a stamp below the view's clock holds the clock, and never turns it back.
//!
//! What this costs: the view's clock and true time part only by the wall clock's error at the
//! last whole-cluster start, plus the apply latency lost at each leader change (an estimate
//! made from an entry seen `d` after it was written is `d` late), both taken back at 500 ppm
//! while the leaders' wall clocks are right. A replica that was away, caught up on an idle
//! cluster and is then elected starts from the last entry it saw, which may be older than the
//! time since: the view's clock then lags by that idle time and catches up at the same rate.
//!
//! Pure: the owner passes both clocks' readings in, so the rule is tested without a machine
//! whose clock steps.

use std::time::{Duration, Instant};
use tessera_view::Command;

/// How much of the elapsed time the stamps may be moved toward the wall clock: 500 parts per
/// million, the largest rate at which ntpd slews a clock (0.5 ms a second, as ntpd documents
/// it; the Linux kernel's `MAX_TICKADJ` is the same 500 µs a second).
pub const SLEW: f64 = 500e-6;

/// The leader's clock rule (see the module's documentation).
#[derive(Clone, Debug, Default)]
pub struct LeaderClock {
    /// The best estimate seen: the view's clock (ms) after an entry applied under a known
    /// leader, and when (monotonic) it was applied.
    seen: Option<(u64, Instant)>,
    /// This replica's term as leader: its anchor (ms) and when it was set; none while it
    /// follows.
    term: Option<(u64, Instant)>,
}

impl LeaderClock {
    /// Records that the view's clock read `view_ms` at `at`, after an entry applied while a
    /// leader was known. Kept only when it improves the estimate (a replica catching up applies
    /// old entries late; those are not better than what it saw while it followed).
    pub fn observe(&mut self, view_ms: u64, at: Instant) {
        if self.estimate(at).is_none_or(|e| view_ms > e) {
            self.seen = Some((view_ms, at));
        }
    }

    /// The view's clock as this replica estimates it at `now` (none: it saw no clock under a
    /// leader).
    pub fn estimate(&self, now: Instant) -> Option<u64> {
        self.seen.map(|(ms, at)| ms.saturating_add(millis(now.saturating_duration_since(at))))
    }

    /// This replica no longer leads: its next term takes a new anchor.
    pub fn step_down(&mut self) {
        self.term = None;
    }

    /// The clock to write at `now`, as leader, given the wall clock `wall_ms`. The first
    /// call of a term sets its anchor.
    pub fn stamp(&mut self, wall_ms: u64, now: Instant) -> u64 {
        let (anchor, since) = match self.term {
            Some(term) => term,
            None => {
                let anchor = match (self.seen, self.estimate(now)) {
                    (Some((_, at)), Some(estimate)) => toward(estimate, wall_ms, now.saturating_duration_since(at)),
                    _ => wall_ms,
                };
                *self.term.insert((anchor, now))
            }
        };
        let elapsed = now.saturating_duration_since(since);
        toward(anchor.saturating_add(millis(elapsed)), wall_ms, elapsed)
    }
}

/// `cmd` with the times it carries read from the view's clock `now_ms` (the leader's
/// [`LeaderClock::stamp`], never before the view's clock) instead of from the wall clock of
/// whoever built it: a cordon's start and a drain's deadline (the drain keeps its length), an
/// uncordon's, an eviction's, a health change's and a layout change's time, a clock entry.
/// So a step of the leader's wall clock moves no deadline the view enforces. Other commands
/// are returned as they are, without reading the clock (`now_ms` is called only for a command
/// that carries a time); a health change that gave no time (0) keeps none.
pub fn restamp(cmd: Command, now_ms: impl FnOnce() -> u64) -> Command {
    match cmd {
        Command::Clock { .. } => Command::Clock { at_ms: now_ms() },
        Command::SetHealth { server, health, at_ms } if at_ms != 0 => {
            Command::SetHealth { server, health, at_ms: now_ms() }
        }
        Command::Cordon { server, mut cordon } => {
            let (now_ms, length) = (now_ms(), cordon.drain_by_ms.map(|by| by.saturating_sub(cordon.since_ms)));
            cordon.since_ms = now_ms;
            cordon.drain_by_ms = length.map(|l| now_ms.saturating_add(l));
            Command::Cordon { server, cordon }
        }
        Command::Uncordon { server, .. } => Command::Uncordon { server, at_ms: now_ms() },
        Command::Evict { server, .. } => Command::Evict { server, at_ms: now_ms() },
        Command::AddServers { config_set, names, .. } => Command::AddServers { config_set, names, at_ms: now_ms() },
        Command::RemoveServer { server, .. } => Command::RemoveServer { server, at_ms: now_ms() },
        other => other,
    }
}

/// `base`, moved toward `wall` by at most [`SLEW`] of `elapsed`.
/// This machine's wall clock, Unix milliseconds (0 if it is before 1970): what a leader's
/// stamps are corrected toward, and the time the view-server writes into the commands it
/// proposes (a server's history, cordons, layout changes, usage queries).
pub fn wall_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn toward(base: u64, wall: u64, elapsed: Duration) -> u64 {
    let most = (millis(elapsed) as f64 * SLEW) as u64;
    wall.clamp(base.saturating_sub(most), base.saturating_add(most))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const T0: u64 = 1_800_000_000_000;
    const HOUR: u64 = 3_600_000;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn a_fresh_cluster_takes_the_wall_clock() {
        let mut c = LeaderClock::default();
        let t = Instant::now();
        assert_eq!(c.stamp(T0, t), T0);
        assert_eq!(c.stamp(T0 + 1_000, t + secs(1)), T0 + 1_000);
    }

    #[test]
    fn a_step_of_the_wall_clock_within_a_term_moves_the_stamp_only_by_the_slew() {
        let mut c = LeaderClock::default();
        let t = Instant::now();
        c.stamp(T0, t);
        // An hour forward after ten seconds: the stamp keeps elapsed time, 5 ms of slew.
        assert_eq!(c.stamp(T0 + 10_000 + HOUR, t + secs(10)), T0 + 10_000 + 5);
        // An hour back: the same, the other way.
        assert_eq!(c.stamp(T0 + 20_000 - HOUR, t + secs(20)), T0 + 20_000 - 10);
        // A day later, the wall clock still an hour ahead: 43.2 s of it taken.
        let day = 86_400;
        assert_eq!(c.stamp(T0 + day * 1_000 + HOUR, t + secs(day)), T0 + day * 1_000 + 43_200);
    }

    #[test]
    fn a_wall_clock_within_the_slew_is_followed() {
        let mut c = LeaderClock::default();
        let t = Instant::now();
        c.stamp(T0, t);
        // 100 s elapsed allow 50 ms either way.
        assert_eq!(c.stamp(T0 + 100_030, t + secs(100)), T0 + 100_030);
        assert_eq!(c.stamp(T0 + 99_960, t + secs(100)), T0 + 99_960);
    }

    #[test]
    fn a_new_leader_continues_the_old_leaders_time_whatever_its_own_clock_says() {
        // A follower saw the old leader's entries; then it is elected, its wall clock an hour
        // ahead (or behind).
        for wall_error in [HOUR as i64, -(HOUR as i64), 0] {
            let mut c = LeaderClock::default();
            let t = Instant::now();
            c.observe(T0, t);
            c.observe(T0 + 2_000, t + secs(2));
            // Elected 3 s after the last entry it saw.
            let now = t + secs(5);
            let wall = (T0 as i64 + 5_000 + wall_error) as u64;
            let s = c.stamp(wall, now);
            assert!((T0 + 5_000 - 2..=T0 + 5_000 + 2).contains(&s), "{wall_error}: {s}");
        }
    }

    #[test]
    fn entries_applied_late_do_not_spoil_a_better_estimate() {
        let mut c = LeaderClock::default();
        let t = Instant::now();
        c.observe(T0, t);
        // A minute later it applies an entry written 50 s ago (it was catching up).
        c.observe(T0 + 10_000, t + secs(60));
        assert_eq!(c.estimate(t + secs(60)), Some(T0 + 60_000));
        // A later, fresher entry replaces it.
        c.observe(T0 + 61_000, t + secs(61));
        assert_eq!(c.estimate(t + secs(62)), Some(T0 + 62_000));
    }

    #[test]
    fn stepping_down_takes_a_new_anchor_next_term() {
        let mut c = LeaderClock::default();
        let t = Instant::now();
        c.stamp(T0, t);
        c.observe(T0, t);
        c.step_down();
        // Elected again 100 s later, the wall clock right: the estimate and the wall agree.
        assert_eq!(c.stamp(T0 + 100_000, t + secs(100)), T0 + 100_000);
    }

    #[test]
    fn commands_take_the_views_time_and_a_drain_keeps_its_length() {
        use tessera_view::{Cordon, Health, ServerId};
        let wall = T0 + HOUR;
        let drain = Command::Cordon {
            server: ServerId(3),
            cordon: Cordon { reason: "r".into(), since_ms: wall, drain_by_ms: Some(wall + 600_000) },
        };
        match restamp(drain, || T0) {
            Command::Cordon { server, cordon } => {
                assert_eq!(server, ServerId(3));
                assert_eq!((cordon.since_ms, cordon.drain_by_ms), (T0, Some(T0 + 600_000)));
            }
            c => panic!("{c:?}"),
        }
        let plain = Command::Cordon {
            server: ServerId(1),
            cordon: Cordon { reason: String::new(), since_ms: wall, drain_by_ms: None },
        };
        assert!(matches!(
            restamp(plain, || T0),
            Command::Cordon { cordon: Cordon { since_ms: T0, drain_by_ms: None, .. }, .. }
        ));
        assert!(matches!(restamp(Command::Clock { at_ms: wall }, || T0), Command::Clock { at_ms: T0 }));
        assert!(matches!(
            restamp(Command::Uncordon { server: ServerId(1), at_ms: wall }, || T0),
            Command::Uncordon { at_ms: T0, .. }
        ));
        let up = Command::SetHealth { server: ServerId(1), health: Health::Up, at_ms: wall };
        assert!(matches!(restamp(up, || T0), Command::SetHealth { at_ms: T0, .. }));
        let untimed = Command::SetHealth { server: ServerId(1), health: Health::Up, at_ms: 0 };
        assert!(matches!(restamp(untimed, || T0), Command::SetHealth { at_ms: 0, .. }));
        let release = Command::Release { job: tessera_view::JobId(4), failed: false };
        let unread = || -> u64 { panic!("a command without a time read the clock") };
        assert!(matches!(restamp(release, unread), Command::Release { .. }));
    }

    proptest! {
        /// Whatever the wall clocks of the leaders do (steps of up to a day either way), over
        /// a run of terms the stamps stay within the slew of true elapsed time from the
        /// first anchor, less what each election loses to late observation (none here: every
        /// entry is seen as it is written).
        #[test]
        fn stamps_follow_elapsed_time_whatever_the_wall_clock_does(
            steps in prop::collection::vec((1u64..600_000, -86_400_000i64..86_400_000, any::<bool>()), 1..60),
        ) {
            let t = Instant::now();
            // Three replicas' clock rules; replica 0 leads first.
            let mut reps = vec![LeaderClock::default(), LeaderClock::default(), LeaderClock::default()];
            let mut leader = 0usize;
            let first = reps[leader].stamp(T0, t);
            prop_assert_eq!(first, T0);
            for r in &mut reps {
                r.observe(first, t);
            }
            let mut elapsed = 0u64;
            for (i, (dt, wall_error, elect)) in steps.into_iter().enumerate() {
                elapsed += dt;
                let now = t + Duration::from_millis(elapsed);
                if elect {
                    reps[leader].step_down();
                    leader = (leader + 1 + i % 2) % 3;
                }
                let wall = (T0 as i64 + elapsed as i64 + wall_error).max(0) as u64;
                let s = reps[leader].stamp(wall, now);
                let truth = T0 + elapsed;
                let most = (elapsed as f64 * SLEW) as u64 + 1;
                prop_assert!(s + most >= truth && s <= truth + most, "stamp {} truth {} most {}", s, truth, most);
                for r in &mut reps {
                    r.observe(s, now);
                }
            }
        }
    }
}
