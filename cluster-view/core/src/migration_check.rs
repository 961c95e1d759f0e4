//! Whether a migration helps the job it is for: the check a leader makes before it lets a
//! scheduler host move running gangs (`Migrate` names the pending job and the placement the
//! moves make room for, [`crate::migration_planner::MigrationPlan::target`]).
//!
//! The approver keeps every move safe on its own (each a whole, valid placement); what it does
//! not know is why a move is made. Without this check a host holding any pending job could move
//! any running gang: no double allocation, but work lost to checkpoint and restart. With it,
//! a migration is let through only when
//! - the target is a placement of the job's shape (members, devices and cores of its servers'
//!   topologies, what one member asks) that does not fit now,
//! - it fits once the moves are applied (each moved job's current members freed, its new ones
//!   taken), and
//! - every move is needed: its job now holds devices, cores or memory that a target member
//!   needs on the same server, or that a needed move's new member needs (a chain: one job
//!   makes room for a job moved off the target).
//!
//! Pure: resource arithmetic over the view, no copy of it. The approver still decides each move
//! and the later proposal for the job; this check only refuses moves made for no reason.

use crate::fit::{check_member_free, check_member_shape, member_request};
use crate::placement::{MemberPlacement, Proposal};
use crate::server::ServerRecord;
use crate::view::ClusterView;
use crate::{JobId, JobState, ServerId};
use std::collections::BTreeMap;

/// Why a migration does not help its job: `Err` of [`moves_help`].
pub type Unhelpful = String;

/// Checks that `moves` make room for pending `job` at `target` (see the module's
/// documentation).
pub fn moves_help(
    view: &ClusterView,
    job: JobId,
    target: &[MemberPlacement],
    moves: &[Proposal],
) -> Result<(), Unhelpful> {
    let j = view.job(job).ok_or_else(|| format!("job {job} does not exist"))?;
    if j.state != JobState::Pending {
        return Err(format!("job {job} is {}, not pending", j.state.as_str()));
    }
    if target.len() != j.spec.members as usize {
        return Err(format!("the target has {} members; job {job} has {}", target.len(), j.spec.members));
    }
    if moves.is_empty() {
        return Err("no moves".into());
    }
    let records = view.servers();
    for (i, m) in target.iter().enumerate() {
        let rec =
            records.get(m.server.0 as usize).ok_or_else(|| format!("target member {i}: no server {}", m.server))?;
        let topo = view.topology_of(rec.config_set);
        let req = member_request(&j.spec, topo);
        check_member_shape(topo, m, &req, i as u32).map_err(|r| format!("target member {i}: {r}"))?;
    }
    if target.iter().all(|m| check_member_free(&records[m.server.0 as usize], m).is_ok()) {
        return Err(format!("job {job}'s target is free already: no move is needed"));
    }
    // Each target server as it would be after the moves.
    let mut after: BTreeMap<ServerId, ServerRecord> =
        target.iter().map(|m| (m.server, records[m.server.0 as usize])).collect();
    let mut held: Vec<Vec<MemberPlacement>> = Vec::with_capacity(moves.len());
    for (i, p) in moves.iter().enumerate() {
        let moved = view.job(p.job).ok_or_else(|| format!("move {i}: job {} does not exist", p.job))?;
        let now = moved.placement.as_ref().ok_or_else(|| format!("move {i}: job {} holds no placement", p.job))?;
        for m in &now.members {
            if let Some(r) = after.get_mut(&m.server) {
                r.free_gpus |= m.gpus;
                r.free_cores = r.free_cores.or(m.cores);
                r.free_memory_mib = r.free_memory_mib.saturating_add(m.memory_mib);
            }
        }
        held.push(now.members.clone());
    }
    for p in moves {
        for m in &p.members {
            if let Some(r) = after.get_mut(&m.server) {
                r.free_gpus &= !m.gpus;
                r.free_cores = r.free_cores.without(m.cores);
                r.free_memory_mib = r.free_memory_mib.saturating_sub(m.memory_mib);
            }
        }
    }
    for (i, m) in target.iter().enumerate() {
        check_member_free(&after[&m.server], m)
            .map_err(|r| format!("target member {i} does not fit after the moves: {r}"))?;
    }
    let mut needed: Vec<bool> = held
        .iter()
        .map(|members| {
            members.iter().any(|h| {
                target.iter().filter(|m| m.server == h.server).any(|m| {
                    let r = &after[&m.server];
                    h.gpus & m.gpus != 0
                        || h.cores.intersects(m.cores)
                        || m.memory_mib > r.free_memory_mib.saturating_sub(h.memory_mib)
                })
            })
        })
        .collect();
    // A move that makes room for a needed move (holds devices or cores its new member takes, or
    // memory the server lacks for it) is needed too: a chain
    // ([`crate::migration_planner::MigrationParams::chained_moves`]). Each pass adds one or ends.
    for _ in 0..moves.len() {
        let before = needed.iter().filter(|n| **n).count();
        for i in 0..moves.len() {
            if needed[i] {
                continue;
            }
            let lands = moves.iter().zip(&needed).filter(|(_, n)| **n).flat_map(|(p, _)| &p.members);
            needed[i] = lands.into_iter().any(|d| {
                held[i].iter().any(|h| {
                    h.server == d.server
                        && (h.gpus & d.gpus != 0
                            || h.cores.intersects(d.cores)
                            || records.get(d.server.0 as usize).is_some_and(|r| d.memory_mib > r.free_memory_mib))
                })
            });
        }
        if needed.iter().filter(|n| **n).count() == before {
            break;
        }
    }
    if let Some(i) = needed.iter().position(|n| !n) {
        return Err(format!("move {i} (job {}) frees nothing the target or another move needs", moves[i].job));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mask::CoreMask;
    use crate::placement::Decision;
    use crate::{ClusterSpec, Command, JobSpec, LocalityLevel, Outcome, ProposalId, Topology, ViewVersion};

    fn member(server: u32, gpus: u64, core0: u32) -> MemberPlacement {
        let n = gpus.count_ones();
        MemberPlacement { server: ServerId(server), gpus, cores: CoreMask::range(core0, 4 * n), memory_mib: 1024 * n }
    }

    fn submit(v: &mut ClusterView, name: &str, gpus: u32) -> JobId {
        let mut s = JobSpec::simple(name, 1, gpus);
        s.tolerate = LocalityLevel::Any;
        s.memory_mib_per_gpu = Some(1024);
        match v.apply(&Command::submit(s)) {
            Outcome::Submitted(Ok(id)) => id,
            o => panic!("{o:?}"),
        }
    }

    fn place(v: &mut ClusterView, job: JobId, members: Vec<MemberPlacement>, id: u64) {
        let p = Proposal { id: ProposalId(id), job, members, based_on: ViewVersion(0) };
        match v.apply(&Command::Propose(vec![p])) {
            Outcome::Decided(d) => assert!(matches!(d[0], Decision::Accepted { .. }), "{d:?}"),
            o => panic!("{o:?}"),
        }
    }

    /// Two 8-GPU servers; a 1-GPU job on GPU 0 of server 0 and one on GPU 0 of server 1, a
    /// third on GPU 1 of server 0; an 8-GPU job waits.
    fn fragmented() -> (ClusterView, [JobId; 3], JobId) {
        let spec = ClusterSpec::uniform(Topology::preset("seed-8gpu").expect("preset"), 2, 2, 1);
        let mut v = ClusterView::from_spec(&spec);
        let a = submit(&mut v, "a", 1);
        let b = submit(&mut v, "b", 1);
        let c = submit(&mut v, "c", 1);
        place(&mut v, a, vec![member(0, 1, 0)], 1);
        place(&mut v, b, vec![member(1, 1, 0)], 2);
        place(&mut v, c, vec![member(0, 2, 4)], 3);
        let big = submit(&mut v, "big", 8);
        (v, [a, b, c], big)
    }

    fn mv(job: JobId, to: MemberPlacement, id: u64) -> Proposal {
        Proposal { id: ProposalId(id), job, members: vec![to], based_on: ViewVersion(0) }
    }

    #[test]
    fn moves_that_empty_the_target_server_help() {
        let (v, [a, _, c], big) = fragmented();
        let target = [member(0, 0xff, 0)];
        // a and c to server 1's free GPUs 1 and 2.
        let moves = [mv(a, member(1, 1 << 1, 4), 10), mv(c, member(1, 1 << 2, 8), 11)];
        assert_eq!(moves_help(&v, big, &target, &moves), Ok(()));
    }

    #[test]
    fn a_move_the_target_does_not_need_is_refused() {
        let (v, [a, b, c], big) = fragmented();
        let target = [member(0, 0xff, 0)];
        // b (on server 1) is moved too: it holds nothing the target needs.
        let moves =
            [mv(a, member(1, 1 << 1, 4), 10), mv(c, member(1, 1 << 2, 8), 11), mv(b, member(1, 1 << 3, 12), 12)];
        let e = moves_help(&v, big, &target, &moves).expect_err("b's move is for nothing");
        assert!(e.contains("move 2"), "{e}");
    }

    #[test]
    fn a_move_that_makes_room_for_a_needed_move_helps_too() {
        let (v, [a, b, c], big) = fragmented();
        let target = [member(0, 0xff, 0)];
        // b makes room on server 1 (GPU 0 to GPU 5) for a, which takes GPU 0 and its cores:
        // a chain, in the order the approver applies it.
        let chain = [mv(b, member(1, 1 << 5, 20), 10), mv(a, member(1, 1, 0), 11), mv(c, member(1, 1 << 2, 8), 12)];
        assert_eq!(moves_help(&v, big, &target, &chain), Ok(()));
        // Moved where nothing needed lands, b's move helps nothing.
        let idle = [mv(b, member(1, 1 << 5, 20), 10), mv(a, member(1, 1 << 1, 4), 11), mv(c, member(1, 1 << 2, 8), 12)];
        let e = moves_help(&v, big, &target, &idle).expect_err("b's move is for nothing");
        assert!(e.contains("move 0"), "{e}");
    }

    #[test]
    fn moves_that_leave_the_target_short_are_refused() {
        let (v, [a, _, _], big) = fragmented();
        let e = moves_help(&v, big, &[member(0, 0xff, 0)], &[mv(a, member(1, 1 << 1, 4), 10)]).expect_err("c stays");
        assert!(e.contains("does not fit after the moves"), "{e}");
        // Moving a onto the target itself frees nothing.
        let e = moves_help(&v, big, &[member(0, 0xff, 0)], &[mv(a, member(0, 1 << 7, 28), 10)]).expect_err("onto it");
        assert!(e.contains("does not fit"), "{e}");
    }

    #[test]
    fn a_target_that_fits_now_or_has_the_wrong_shape_is_refused() {
        let (mut v, [a, _, _], _) = fragmented();
        let small = submit(&mut v, "small", 1);
        let e = moves_help(&v, small, &[member(1, 1 << 5, 20)], &[mv(a, member(1, 1 << 1, 4), 10)]).expect_err("free");
        assert!(e.contains("free already"), "{e}");
        let (v, [a, _, c], big) = fragmented();
        let moves = [mv(a, member(1, 1 << 1, 4), 10), mv(c, member(1, 1 << 2, 8), 11)];
        let e = moves_help(&v, big, &[member(0, 0xff, 0), member(1, 0xff, 0)], &moves).expect_err("two members");
        assert!(e.contains("members"), "{e}");
        let e = moves_help(&v, big, &[member(0, 0x7f, 0)], &moves).expect_err("seven GPUs");
        assert!(e.contains("target member 0"), "{e}");
        assert!(moves_help(&v, big, &[member(0, 0xff, 0)], &[]).is_err());
        assert!(moves_help(&v, a, &[member(0, 1, 0)], &moves).expect_err("placed").contains("not pending"));
        assert!(moves_help(&v, JobId(999), &[member(0, 1, 0)], &moves).is_err());
    }
}
