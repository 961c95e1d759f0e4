//! Whether a migration helps the job it is for: the check a leader makes before it lets a
//! scheduler host move running gangs (`Migrate` names the pending job and the placement the
//! moves make room for, [`crate::migration_planner::MigrationPlan::target`]).
//!
//! The approver keeps every move safe on its own (each a whole, valid placement) and decides
//! the moves of one command one by one, in order; what it does not know is why a move is made.
//! Without this check a host holding any pending job could move any running gang: no double
//! allocation, but work lost to checkpoint and restart. With it, a migration is let through
//! only when
//! - the target is a placement of the job's shape (members, devices and cores of its servers'
//!   topologies, what one member asks, within the job's locality) that does not fit now,
//! - every moved job is one the planner's rules may move, whatever a host's parameters: a
//!   one-member job of fewer GPUs than the job it is moved for
//!   ([`crate::migration_planner::movable_for`]),
//! - every move is one the approver would accept when the moves are applied in the order given:
//!   a placed or running job, named once, each of its members moved, of its shape and locality,
//!   its new members free once the moves before it (and its own old members) are released,
//! - the target fits after the last move, and
//! - every move is needed: the target, or a later move that is needed, takes devices, cores or
//!   memory that the move released (a chain: one job makes room for a job moved off the
//!   target). A move takes memory from its own release first, then from what was free before
//!   the moves, then from the largest releases of other moves, so a move counts as needed for
//!   its memory only when the server lacks that memory without the releases at least as large
//!   as its own.
//!
//! A resend of moves that were all applied is let through: the approver answers each
//! `AlreadyApplied` and changes nothing.
//!
//! Pure: the moves are replayed on copies of the records of the servers they touch, one pass,
//! each released resource remembering which move released it.

use crate::fit::check_member_free;
use crate::mask::CoreMask;
use crate::placement::{Decision, MemberPlacement, Proposal};
use crate::server::ServerRecord;
use crate::view::ClusterView;
use crate::{JobId, JobState, ProposalId, ServerId, ViewVersion};
use std::collections::{BTreeMap, BTreeSet};

/// Why a migration does not help its job: `Err` of [`moves_help`].
pub type Unhelpful = String;

/// What one move released on a server and nobody has taken again yet.
struct Released {
    by: usize,
    gpus: u64,
    cores: CoreMask,
    memory_mib: u32,
}

/// A server's record as the moves so far leave it, with what each move released there.
struct Replayed {
    rec: ServerRecord,
    /// Memory that was free before any move and is still free.
    free_before_mib: u32,
    released: Vec<Released>,
}

/// The servers the moves touch, replayed.
struct Replay<'a> {
    view: &'a ClusterView,
    servers: BTreeMap<ServerId, Replayed>,
}

impl Replay<'_> {
    fn server(&mut self, s: ServerId) -> &mut Replayed {
        let rec = self.view.servers()[s.index()];
        self.servers.entry(s).or_insert_with(|| Replayed {
            rec,
            free_before_mib: rec.free_memory_mib,
            released: Vec::new(),
        })
    }

    /// Move `by` releases `m` (devices that are unhealthy stay taken, as at apply).
    fn release(&mut self, by: usize, m: &MemberPlacement) {
        let unhealthy = self.view.unhealthy_devices(m.server);
        let r = self.server(m.server);
        r.rec.give_back(m, unhealthy);
        r.released.push(Released { by, gpus: m.gpus & !unhealthy, cores: m.cores, memory_mib: m.memory_mib });
    }

    /// `user` (a move's index, or `None` for the target) takes `m` if it is free; the moves
    /// whose released resources it takes are added to `uses`.
    fn take(&mut self, user: Option<usize>, m: &MemberPlacement, uses: &mut Vec<usize>) -> Result<(), String> {
        let r = self.server(m.server);
        check_member_free(&r.rec, m).map_err(|e| e.to_string())?;
        r.rec.free_gpus &= !m.gpus;
        r.rec.free_cores = r.rec.free_cores.without(m.cores);
        r.rec.free_memory_mib -= m.memory_mib;
        // A move's own release first (it frees nothing for itself), then what was free before
        // the moves, then the largest of the others' releases, so that memory is counted
        // against as few other moves as can give it.
        r.released.sort_by_key(|x| (Some(x.by) != user, std::cmp::Reverse(x.memory_mib)));
        let own = r.released.iter().take_while(|x| Some(x.by) == user).count();
        let mut memory = m.memory_mib;
        for x in &mut r.released[..own] {
            let mem = memory.min(x.memory_mib);
            x.memory_mib -= mem;
            memory -= mem;
            x.gpus &= !m.gpus;
            x.cores = x.cores.without(m.cores);
        }
        let from_before = memory.min(r.free_before_mib);
        r.free_before_mib -= from_before;
        memory -= from_before;
        for x in &mut r.released[own..] {
            let mem = memory.min(x.memory_mib);
            let took = x.gpus & m.gpus != 0 || x.cores.intersects(m.cores) || mem > 0;
            x.gpus &= !m.gpus;
            x.cores = x.cores.without(m.cores);
            x.memory_mib -= mem;
            memory -= mem;
            if took {
                uses.push(x.by);
            }
        }
        Ok(())
    }
}

/// Checks that `moves`, applied in order, make room for pending `job` at `target` (see the
/// module's documentation).
pub fn moves_help(
    view: &ClusterView,
    job: JobId,
    target: &[MemberPlacement],
    moves: &[Proposal],
) -> Result<(), Unhelpful> {
    // A resend of moves that were all applied (a client's retry after a lost answer) changes
    // nothing: the approver answers each `AlreadyApplied`, whatever became of the job since.
    if !moves.is_empty() && moves.iter().all(|p| matches!(view.idempotency(p), Some(Decision::AlreadyApplied { .. }))) {
        return Ok(());
    }
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
    let as_proposal = Proposal { id: ProposalId(0), job, members: target.to_vec(), based_on: ViewVersion(0) };
    let (_, target) = view.gang_shape(&as_proposal, &j.spec).map_err(|r| format!("target {r}"))?;
    let records = view.servers();
    if target.iter().all(|m| check_member_free(&records[m.server.index()], m).is_ok()) {
        return Err(format!("job {job}'s target is free already: no move is needed"));
    }
    let mut replay = Replay { view, servers: BTreeMap::new() };
    let mut seen = BTreeSet::new();
    // uses[i]: the moves whose released resources move i takes.
    let mut uses: Vec<Vec<usize>> = Vec::with_capacity(moves.len());
    for (i, p) in moves.iter().enumerate() {
        let bad = |why: String| format!("move {i} (job {}): {why}", p.job);
        let moved = view.job(p.job).ok_or_else(|| bad("no such job".into()))?;
        if !seen.insert(p.job) {
            return Err(bad("the job is moved twice".into()));
        }
        if let Some(d) = view.idempotency(p) {
            return Err(bad(format!("proposal {} was used before: {d:?}", p.id)));
        }
        let now = moved.placement.as_ref().ok_or_else(|| bad("the job holds no placement".into()))?;
        if !matches!(moved.state, JobState::Placed | JobState::Running) {
            return Err(bad(format!("the job is {}; only a placed or running job can be moved", moved.state.as_str())));
        }
        if !crate::migration_planner::movable_for(moved, j.spec.total_gpus()) {
            return Err(bad(format!(
                "a job of {} members and {} GPUs is not moved for job {job} of {} GPUs: only one-member jobs of fewer GPUs are",
                moved.spec.members,
                moved.spec.total_gpus(),
                j.spec.total_gpus()
            )));
        }
        let (_, to) = view.gang_shape(p, &moved.spec).map_err(|r| bad(r.to_string()))?;
        for m in &now.members {
            replay.release(i, m);
        }
        let mut took = Vec::new();
        for m in &to {
            replay
                .take(Some(i), m, &mut took)
                .map_err(|r| bad(format!("does not fit when the moves are applied in order: {r}")))?;
        }
        uses.push(took);
    }
    let mut needed = vec![false; moves.len()];
    let mut by_target = Vec::new();
    for m in &target {
        replay.take(None, m, &mut by_target).map_err(|r| format!("the target does not fit after the moves: {r}"))?;
    }
    for i in by_target {
        needed[i] = true;
    }
    // A move takes only what moves before it released, so one backward pass closes the chains.
    for i in (0..moves.len()).rev() {
        if needed[i] {
            for &k in &uses[i] {
                needed[k] = true;
            }
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
    use crate::{ClusterSpec, Command, JobSpec, LocalityLevel, Outcome, ProposalId, Topology, ViewVersion};

    fn member(server: u32, gpus: u64, core0: u32) -> MemberPlacement {
        let n = gpus.count_ones();
        MemberPlacement { server: ServerId(server), gpus, cores: CoreMask::range(core0, 4 * n), memory_mib: 1024 * n }
    }

    /// Two empty 8-GPU servers.
    fn two_servers() -> ClusterView {
        ClusterView::from_spec(&ClusterSpec::uniform(Topology::preset("seed-8gpu").expect("preset"), 2, 2, 1))
    }

    /// A job of `members` members of `gpus` GPUs, `mib` of memory per GPU, that may spread.
    fn submit_sized(v: &mut ClusterView, name: &str, members: u32, gpus: u32, mib: u32) -> JobId {
        let mut s = JobSpec::simple(name, members, gpus);
        s.tolerate = LocalityLevel::Any;
        s.memory_mib_per_gpu = Some(mib);
        match v.apply(&Command::submit(s)) {
            Outcome::Submitted(Ok(id)) => id,
            o => panic!("{o:?}"),
        }
    }

    fn submit(v: &mut ClusterView, name: &str, gpus: u32) -> JobId {
        submit_sized(v, name, 1, gpus, 1024)
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
        let mut v = two_servers();
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

    #[test]
    fn moves_out_of_the_order_the_approver_applies_them_are_refused() {
        let (v, [a, b, c], big) = fragmented();
        let target = [member(0, 0xff, 0)];
        // The chain of `a_move_that_makes_room_for_a_needed_move_helps_too`, reversed: a would
        // be refused at apply (b still holds GPU 0 of server 1), b and c moved for nothing.
        let reversed = [mv(a, member(1, 1, 0), 10), mv(b, member(1, 1 << 5, 20), 11), mv(c, member(1, 1 << 2, 8), 12)];
        let e = moves_help(&v, big, &target, &reversed).expect_err("a cannot land first");
        assert!(e.contains("move 0") && e.contains("applied in order"), "{e}");
    }

    #[test]
    fn a_swap_is_refused() {
        let (mut v, [a, b, _], _) = fragmented();
        // A 2-GPU job that wants GPUs 0 and 1 of server 0 (a's and c's) while b holds GPU 0 of
        // server 1: swapping a and b frees nothing either can take first.
        let pair = submit(&mut v, "pair", 2);
        let swap = [mv(a, member(1, 1, 0), 10), mv(b, member(0, 1, 0), 11)];
        let e = moves_help(&v, pair, &[member(0, 0b11, 0)], &swap).expect_err("a swap never applies");
        assert!(e.contains("move 0") && e.contains("applied in order"), "{e}");
    }

    #[test]
    fn a_job_moved_twice_or_with_the_wrong_members_is_refused() {
        let (v, [a, _, c], big) = fragmented();
        let target = [member(0, 0xff, 0)];
        let twice =
            [mv(a, member(1, 1 << 1, 4), 10), mv(c, member(1, 1 << 2, 8), 11), mv(a, member(1, 1 << 3, 12), 12)];
        let e = moves_help(&v, big, &target, &twice).expect_err("a twice");
        assert!(e.contains("move 2") && e.contains("twice"), "{e}");
        let none = Proposal { id: ProposalId(10), job: a, members: vec![], based_on: ViewVersion(0) };
        let e = moves_help(&v, big, &target, &[none, mv(c, member(1, 1 << 2, 8), 11)]).expect_err("no members");
        assert!(e.contains("move 0") && e.contains("members"), "{e}");
        // A member of the wrong size (two GPUs for a 1-GPU job).
        let e = moves_help(&v, big, &target, &[mv(a, member(1, 0b110, 4), 10), mv(c, member(1, 1 << 3, 12), 11)])
            .expect_err("two GPUs");
        assert!(e.contains("move 0"), "{e}");
        // A spent proposal id: the approver would refuse that move.
        let e = moves_help(&v, big, &target, &[mv(a, member(1, 1 << 1, 4), 1), mv(c, member(1, 1 << 2, 8), 11)])
            .expect_err("id 1 placed a");
        assert!(e.contains("move 0") && e.contains("used before"), "{e}");
    }

    #[test]
    fn only_one_member_jobs_smaller_than_the_blocked_job_are_moved() {
        let mut v = two_servers();
        // Server 0: a 4-GPU job and one 2-GPU member of a two-member gang, whose other member
        // is on server 1.
        let four = submit(&mut v, "four", 4);
        place(&mut v, four, vec![member(0, 0x0f, 0)], 1);
        let pair = submit_sized(&mut v, "pair", 2, 2, 1024);
        place(&mut v, pair, vec![member(0, 0x30, 16), member(1, 0x03, 0)], 2);
        // A pending 4-GPU job that needs server 0's low half: the 4-GPU job is not smaller.
        let blocked = submit(&mut v, "blocked", 4);
        let e = moves_help(&v, blocked, &[member(0, 0x0f, 0)], &[mv(four, member(1, 0xf0, 16), 10)])
            .expect_err("as large as the blocked job");
        assert!(e.contains("move 0") && e.contains("only one-member jobs of fewer GPUs"), "{e}");
        // A pending 8-GPU job that needs server 0 whole: the 4-GPU job may move, the gang may not.
        let big = submit(&mut v, "big", 8);
        let e = moves_help(
            &v,
            big,
            &[member(0, 0xff, 0)],
            &[
                mv(four, member(1, 0xf0, 16), 10),
                Proposal {
                    id: ProposalId(11),
                    job: pair,
                    members: vec![member(1, 0x0c, 8), member(1, 0x03, 0)],
                    based_on: ViewVersion(0),
                },
            ],
        )
        .expect_err("a gang of two members");
        assert!(e.contains("move 1") && e.contains("2 members"), "{e}");
    }

    #[test]
    fn an_unhealthy_device_a_move_releases_stays_taken() {
        let (mut v, [a, _, c], big) = fragmented();
        // GPU 1 of server 0, c's, is marked unhealthy: moving c does not free it.
        v.apply(&Command::SetUnhealthyDevices { server: ServerId(0), devices: 1 << 1 });
        let moves = [mv(a, member(1, 1 << 1, 4), 10), mv(c, member(1, 1 << 2, 8), 11)];
        let e = moves_help(&v, big, &[member(0, 0xff, 0)], &moves).expect_err("GPU 1 stays taken");
        assert!(e.contains("does not fit after the moves"), "{e}");
    }

    #[test]
    fn a_move_within_a_server_short_of_memory_frees_none_for_the_next() {
        let (mut v, [a, b, c], big) = fragmented();
        // A job holding all but 512 MiB of server 1's memory, on its GPU 7.
        let hold = v.servers()[1].free_memory_mib - 512;
        let hog = submit_sized(&mut v, "hog", 1, 1, hold);
        let m = MemberPlacement { server: ServerId(1), gpus: 1 << 7, cores: CoreMask::range(28, 4), memory_mib: hold };
        place(&mut v, hog, vec![m], 4);
        assert_eq!(v.servers()[1].free_memory_mib, 512);
        let target = [member(0, 0xff, 0)];
        // b moves within server 1 and frees no memory there on balance: a and c, which need
        // 1 GiB each, do not fit in the 512 MiB left, so the chain fails at a.
        let chain = [mv(b, member(1, 1 << 5, 20), 10), mv(a, member(1, 1, 0), 11), mv(c, member(1, 1 << 2, 8), 12)];
        let e = moves_help(&v, big, &target, &chain).expect_err("no memory for a");
        assert!(e.contains("move 1"), "{e}");
    }

    #[test]
    fn target_members_on_one_server_are_taken_together() {
        let mut v = two_servers();
        let a = submit(&mut v, "a", 1);
        place(&mut v, a, vec![member(0, 1, 0)], 1);
        let pair = submit_sized(&mut v, "pair", 2, 4, 1024);
        // Both members on GPUs 0-3 of server 0: they overlap, so the target is no placement.
        let e = moves_help(&v, pair, &[member(0, 0xf, 0), member(0, 0xf, 0)], &[mv(a, member(1, 1, 0), 10)])
            .expect_err("overlapping target");
        assert!(e.contains("overlap"), "{e}");
    }

    #[test]
    fn a_move_is_needed_for_memory_only_where_the_target_lacks_it() {
        let mut v = two_servers();
        let a = submit(&mut v, "a", 1);
        place(&mut v, a, vec![member(0, 1, 0)], 1);
        let hog = submit_sized(&mut v, "hog", 1, 1, 300_000);
        let held = MemberPlacement { memory_mib: 300_000, ..member(0, 1 << 1, 4) };
        place(&mut v, hog, vec![held], 2);
        // Four free GPUs on server 0 but not the memory: 4 x 30,000 MiB.
        let wide = submit_sized(&mut v, "wide", 1, 4, 30_000);
        let target = [MemberPlacement { memory_mib: 120_000, ..member(0, 0xf0, 16) }];
        let hog_off = mv(hog, MemberPlacement { memory_mib: 300_000, ..member(1, 1, 0) }, 10);
        assert_eq!(moves_help(&v, wide, &target, std::slice::from_ref(&hog_off)), Ok(()));
        // a's gigabyte is not needed once the hog's memory is free.
        let e = moves_help(&v, wide, &target, &[mv(a, member(1, 1 << 1, 4), 11), hog_off])
            .expect_err("a frees nothing needed");
        assert!(e.contains("move 0"), "{e}");
    }

    #[test]
    fn a_move_back_onto_its_own_members_is_not_needed_for_memory() {
        let mut v = two_servers();
        // Server 0: 20 GiB free; n (GPU 0) and m (GPU 7) hold 10 GiB each, a filler the rest.
        let total = v.servers()[0].free_memory_mib;
        let at = |gpu: u32, mib: u32| MemberPlacement { memory_mib: mib, ..member(0, 1 << gpu, 4 * gpu) };
        let filler = submit_sized(&mut v, "filler", 1, 1, total - 40_960);
        place(&mut v, filler, vec![at(5, total - 40_960)], 1);
        let n = submit_sized(&mut v, "n", 1, 1, 10_240);
        place(&mut v, n, vec![at(0, 10_240)], 2);
        let m = submit_sized(&mut v, "m", 1, 1, 10_240);
        place(&mut v, m, vec![at(7, 10_240)], 3);
        // Four GPUs 0-3 and 25 GiB: only n is in the way (with it gone, 30 GiB are free).
        let t = submit_sized(&mut v, "t", 1, 4, 6_400);
        let target = [MemberPlacement { memory_mib: 25_600, ..member(0, 0xf, 0) }];
        let n_off = mv(n, MemberPlacement { memory_mib: 10_240, ..member(1, 1, 0) }, 10);
        assert_eq!(moves_help(&v, t, &target, std::slice::from_ref(&n_off)), Ok(()));
        // m moved back onto its own members (a restart for nothing) is refused.
        let e = moves_help(&v, t, &target, &[mv(m, at(7, 10_240), 11), n_off]).expect_err("m is not needed");
        assert!(e.contains("move 0"), "{e}");
    }
}
