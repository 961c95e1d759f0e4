//! Bounds on open `Watch` streams: at most `max` on a replica, and at most `per_caller` for one
//! caller (one identity; replicas and admins count toward the replica's bound only), so one
//! misbehaving client cannot take every stream. A stream holds a [`WatchSlot`] while it runs;
//! dropping the slot (the stream's task ends) gives it back.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use tessera_proto::tls::{Identity, Role};

/// The streams open on one replica, by caller.
#[derive(Debug)]
pub struct Watchers {
    max: usize,
    per_caller: usize,
    open: Mutex<Open>,
}

#[derive(Debug, Default)]
struct Open {
    all: usize,
    by_caller: HashMap<String, usize>,
}

/// One open stream's place; given back on drop.
#[derive(Debug)]
pub struct WatchSlot {
    watchers: Arc<Watchers>,
    caller: Option<String>,
}

impl Watchers {
    /// Bounds of `max` streams in all and `per_caller` for one caller (each at least 1).
    pub fn new(max: usize, per_caller: usize) -> Arc<Watchers> {
        Arc::new(Watchers { max: max.max(1), per_caller: per_caller.max(1), open: Mutex::default() })
    }

    /// A place for a stream of `who`, or why there is none (the caller retries after a
    /// backoff, or elsewhere).
    pub fn open(self: &Arc<Self>, who: &Identity) -> Result<WatchSlot, String> {
        let mut o = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if o.all >= self.max {
            return Err(format!("{} watch streams open on this replica; at most {}", o.all, self.max));
        }
        let caller = (!matches!(who.role, Role::Replica | Role::Admin)).then(|| format!("{}/{}", who.role, who.name));
        if let Some(c) = &caller {
            let mine = o.by_caller.get(c).copied().unwrap_or(0);
            if mine >= self.per_caller {
                return Err(format!("{who} has {mine} watch streams open; at most {} per caller", self.per_caller));
            }
            *o.by_caller.entry(c.clone()).or_default() += 1;
        }
        o.all += 1;
        Ok(WatchSlot { watchers: Arc::clone(self), caller })
    }

    /// Streams open now: in all, and `who`'s.
    pub fn open_now(&self, who: &Identity) -> (usize, usize) {
        let o = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        (o.all, o.by_caller.get(&format!("{}/{}", who.role, who.name)).copied().unwrap_or(0))
    }
}

impl Drop for WatchSlot {
    fn drop(&mut self) {
        let mut o = self.watchers.open.lock().unwrap_or_else(PoisonError::into_inner);
        o.all = o.all.saturating_sub(1);
        if let Some(c) = &self.caller
            && let Some(n) = o.by_caller.get_mut(c)
        {
            *n -= 1;
            if *n == 0 {
                o.by_caller.remove(c);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(role: Role, name: &str) -> Identity {
        Identity { role, name: name.into(), tenants: Vec::new() }
    }

    #[test]
    fn one_caller_is_bounded_on_its_own_and_every_caller_by_the_replica() {
        let w = Watchers::new(5, 2);
        let host = who(Role::Scheduler, "h1");
        let a = w.open(&host).expect("first");
        let _b = w.open(&host).expect("second");
        let e = w.open(&host).expect_err("a third stream of one caller");
        assert!(e.contains("at most 2 per caller"), "{e}");
        // Another caller of the same name but another role is another caller.
        let _c = w.open(&who(Role::Agent, "h1")).expect("another caller");
        drop(a);
        let _d = w.open(&host).expect("a stream given back makes room");
        assert_eq!(w.open_now(&host), (3, 2));
        // Admins and replicas count toward the replica's bound only.
        let admin = who(Role::Admin, "ops");
        let _e = w.open(&admin).expect("an admin's");
        let _f = w.open(&admin).expect("an admin's second, past the per-caller bound");
        let e = w.open(&admin).expect_err("the replica is full");
        assert!(e.contains("5 watch streams open on this replica; at most 5"), "{e}");
    }

    #[test]
    fn dropping_every_slot_leaves_nothing_counted() {
        let w = Watchers::new(10, 3);
        let users: Vec<Identity> = (0..3).map(|i| who(Role::User, &format!("u{i}"))).collect();
        let slots: Vec<WatchSlot> =
            users.iter().flat_map(|u| [w.open(u), w.open(u)]).map(|s| s.expect("room")).collect();
        assert_eq!(w.open_now(&users[0]), (6, 2));
        drop(slots);
        assert_eq!(w.open_now(&users[0]), (0, 0));
        assert!(w.open.lock().expect("lock").by_caller.is_empty(), "no caller kept at zero");
    }
}
