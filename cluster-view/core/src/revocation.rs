//! Revoked credentials as replicated state: the certificates and bearer tokens every replica
//! (and every agent's log service) refuses although the cluster CA signed them, because their
//! key or text leaked.
//!
//! An admin revokes one by its fingerprint ([`Command::SetRevocation`](crate::Command::SetRevocation):
//! `sha256:` and 64 lowercase hex digits of the certificate's DER or the token's text) through
//! the leader, so one command reaches every replica in the order of the log, survives restarts
//! and snapshots, and a replica that joins later has it. Each replica hands the list to its
//! authentication after every round that changed it; agents take it from the snapshots they
//! watch. The same fingerprints can still be listed in a TLS directory's `revoked` file, for a
//! process that reads no view (and for a cluster with no leader).
//!
//! The list is bounded ([`MAX_REVOCATIONS`]) without being a log of everything ever revoked:
//! an entry carries its credential's own expiry, after which the CA signature no longer lets
//! it in, and entries past their expiry by the view's clock are dropped whenever the list
//! changes. An entry whose credential has expired already is refused (nothing to revoke).
//! Revoking again replaces the entry's note and expiry; removing an absent one changes
//! nothing, so a retried call is safe. The list does not travel in deltas: a change resets the
//! change log, as a policy change does, and watchers read a snapshot with the new list.

use crate::error::ViewError;
use crate::view::ClusterView;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Most revoked credentials kept at once (their expiries bound how long each stays).
pub const MAX_REVOCATIONS: usize = 4_096;

/// Longest subject or note, in characters (at most 1 KiB).
pub const MAX_REVOCATION_TEXT: usize = 256;

/// One revoked credential.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revocation {
    /// Who the credential names (`user/alice`), for operators; not checked.
    pub subject: String,
    /// When the credential itself expires, Unix milliseconds: the entry is dropped after it.
    pub not_after_ms: u64,
    /// Why it was revoked.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub note: String,
    /// The view's clock when it was revoked (set at apply).
    #[serde(default)]
    pub at_ms: u64,
}

/// A fingerprint the list may hold: `sha256:` and 64 lowercase hex digits (what
/// `tessera tls revoke` and the `revoked` file use).
pub fn check_fingerprint(fp: &str) -> Result<(), ViewError> {
    let ok = fp
        .strip_prefix("sha256:")
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
    if ok {
        Ok(())
    } else {
        Err(ViewError::Policy(format!("fingerprint `{}`: `sha256:` and 64 lowercase hex digits", clip(fp))))
    }
}

/// A subject or note a revocation may carry: at most [`MAX_REVOCATION_TEXT`] characters, none
/// of them a control character (`what` names it in the refusal).
pub fn check_text(what: &str, s: &str) -> Result<(), ViewError> {
    if s.chars().count() > MAX_REVOCATION_TEXT || s.chars().any(char::is_control) {
        return Err(ViewError::Policy(format!(
            "revocation {what}: at most {MAX_REVOCATION_TEXT} characters, no control characters"
        )));
    }
    Ok(())
}

fn clip(s: &str) -> String {
    s.chars().take(80).collect()
}

impl ClusterView {
    /// Revokes the credential of fingerprint `fingerprint` (`Some`), or takes it off the list
    /// (`None`). The entry's `at_ms` is the view's clock. Entries whose credential has expired
    /// by the view's clock are dropped first.
    pub fn set_revocation(&mut self, fingerprint: &str, revocation: Option<&Revocation>) -> Result<(), ViewError> {
        check_fingerprint(fingerprint)?;
        let now = self.now_ms;
        let expired = self.revocations.values().any(|r| r.not_after_ms <= now);
        match revocation {
            Some(r) => {
                check_text("subject", &r.subject)?;
                check_text("note", &r.note)?;
                if r.not_after_ms <= now {
                    return Err(ViewError::Policy(format!(
                        "the credential {fingerprint} expired at {} ms (the view's clock is {now} ms): it is refused without a revocation",
                        r.not_after_ms
                    )));
                }
                let entry = Revocation { at_ms: now, ..r.clone() };
                let current = self.revocations.get(fingerprint);
                if current.is_some_and(|c| {
                    c.subject == entry.subject && c.note == entry.note && c.not_after_ms == entry.not_after_ms
                }) {
                    return Ok(());
                }
                let kept = self.revocations.values().filter(|c| c.not_after_ms > now).count();
                if current.is_none_or(|c| c.not_after_ms <= now) && kept >= MAX_REVOCATIONS {
                    return Err(ViewError::Policy(format!(
                        "at most {MAX_REVOCATIONS} credentials are revoked at once (entries leave when their credential expires); issue shorter-lived ones"
                    )));
                }
                self.bump();
                self.revocations.retain(|_, c| c.not_after_ms > now);
                self.revocations.insert(fingerprint.to_string(), entry);
            }
            None => {
                if !self.revocations.contains_key(fingerprint) && !expired {
                    return Ok(());
                }
                self.bump();
                self.revocations.retain(|_, c| c.not_after_ms > now);
                self.revocations.remove(fingerprint);
            }
        }
        self.revocations_changed = self.version;
        self.readers_take_snapshots();
        Ok(())
    }

    /// The revoked credentials, by fingerprint.
    pub fn revocations(&self) -> &BTreeMap<String, Revocation> {
        &self.revocations
    }

    /// The version at which the revocation list last changed (a reader republishes it when this
    /// moves).
    pub fn revocations_changed(&self) -> crate::ViewVersion {
        self.revocations_changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ClusterSpec, Command, Outcome};

    const A: &str = "sha256:00000000000000000000000000000000000000000000000000000000000000aa";
    const B: &str = "sha256:00000000000000000000000000000000000000000000000000000000000000bb";

    fn view() -> ClusterView {
        let topo = crate::Topology::preset("seed-8gpu").expect("preset");
        let mut v = ClusterView::from_spec(&ClusterSpec::uniform(topo, 2, 2, 1));
        v.apply(&Command::Clock { at_ms: 1_000_000 });
        v
    }

    fn revoke(v: &mut ClusterView, fp: &str, not_after_ms: u64) -> Result<(), ViewError> {
        let r = Revocation { subject: "user/alice".into(), not_after_ms, note: "stolen laptop".into(), at_ms: 0 };
        match v.apply(&Command::SetRevocation { fingerprint: fp.into(), revocation: Some(r) }) {
            Outcome::Policy(r) => r,
            o => panic!("{o:?}"),
        }
    }

    fn unrevoke(v: &mut ClusterView, fp: &str) -> Result<(), ViewError> {
        match v.apply(&Command::SetRevocation { fingerprint: fp.into(), revocation: None }) {
            Outcome::Policy(r) => r,
            o => panic!("{o:?}"),
        }
    }

    #[test]
    fn a_revocation_is_kept_replicated_and_survives_a_snapshot() {
        let mut v = view();
        let before = (v.version(), v.state_hash());
        revoke(&mut v, A, 2_000_000).expect("revoked");
        assert_eq!(v.version().0, before.0.0 + 1);
        assert_ne!(v.state_hash(), before.1, "the list is replicated state");
        assert_eq!(v.revocations_changed(), v.version());
        let r = &v.revocations()[A];
        assert_eq!((r.subject.as_str(), r.at_ms, r.not_after_ms), ("user/alice", 1_000_000, 2_000_000));
        // Not in deltas: a reader behind the change reads a snapshot.
        assert!(v.delta_since(before.0).is_none());
        let back = ClusterView::from_snapshot(v.snapshot());
        assert_eq!(back.state_hash(), v.state_hash());
        assert_eq!(back.revocations(), v.revocations());
        assert!(crate::invariants::check(&back).is_clean());
        // The same again changes nothing (a retry); another note replaces the entry.
        let at = v.version();
        revoke(&mut v, A, 2_000_000).expect("again");
        assert_eq!(v.version(), at);
        unrevoke(&mut v, A).expect("removed");
        assert!(v.revocations().is_empty());
        let at = v.version();
        unrevoke(&mut v, A).expect("absent: nothing to do");
        assert_eq!(v.version(), at);
    }

    #[test]
    fn malformed_and_expired_revocations_are_refused_and_change_nothing() {
        let mut v = view();
        let (version, hash) = (v.version(), v.state_hash());
        for fp in
            ["", "sha256:", "sha256:AA", &A.to_uppercase(), &format!("{A}0"), "md5:00", &A.replace("sha256", "sha512")]
        {
            let e = revoke(&mut v, fp, 2_000_000).expect_err(fp);
            assert!(e.to_string().contains("64 lowercase hex"), "{e}");
        }
        let e = revoke(&mut v, A, 1_000_000).expect_err("expired");
        assert!(e.to_string().contains("refused without a revocation"), "{e}");
        let long = Revocation {
            subject: "x".repeat(MAX_REVOCATION_TEXT + 1),
            not_after_ms: 2_000_000,
            note: String::new(),
            at_ms: 0,
        };
        let cmd = Command::SetRevocation { fingerprint: A.into(), revocation: Some(long) };
        assert!(matches!(v.apply(&cmd), Outcome::Policy(Err(_))));
        let nl = Revocation { subject: "a".into(), not_after_ms: 2_000_000, note: "two\nlines".into(), at_ms: 0 };
        assert!(matches!(
            v.apply(&Command::SetRevocation { fingerprint: A.into(), revocation: Some(nl) }),
            Outcome::Policy(Err(_))
        ));
        assert_eq!((v.version(), v.state_hash()), (version, hash));
    }

    #[test]
    fn expired_entries_leave_when_the_list_changes_so_the_bound_holds() {
        let mut v = view();
        revoke(&mut v, A, 1_500_000).expect("A");
        revoke(&mut v, B, 3_000_000).expect("B");
        v.apply(&Command::Clock { at_ms: 2_000_000 });
        // A's credential has expired; it stays until the list changes.
        assert_eq!(v.revocations().len(), 2);
        unrevoke(&mut v, "sha256:00000000000000000000000000000000000000000000000000000000000000cc").expect("absent");
        assert_eq!(v.revocations().keys().collect::<Vec<_>>(), [B]);
        // Full: the next one is refused, clearly; once entries expire, there is room again.
        let mut v = view();
        for i in 0..MAX_REVOCATIONS {
            revoke(&mut v, &format!("sha256:{i:064x}"), 1_500_000 + (i as u64 % 2) * 1_000_000).expect("room");
        }
        let next = format!("sha256:{:064x}", MAX_REVOCATIONS);
        let e = revoke(&mut v, &next, 5_000_000).expect_err("full");
        assert!(e.to_string().contains(&format!("at most {MAX_REVOCATIONS}")), "{e}");
        // Replacing an entry in force is not a new one.
        revoke(&mut v, &format!("sha256:{:064x}", 1), 4_000_000).expect("replaced");
        v.apply(&Command::Clock { at_ms: 2_000_000 });
        revoke(&mut v, &next, 5_000_000).expect("half of them expired");
        assert_eq!(v.revocations().len(), MAX_REVOCATIONS / 2 + 1);
        assert!(crate::invariants::check(&v).is_clean());
    }
}
