//! A drain that moves gangs away before its deadline: the pure plan the leader proposes as
//! `Migrate` commands while a server is drained ([`crate::Cordon::drain_by_ms`]).
//!
//! A gang with a member on the drained server is moved now, whole and atomically (the approver
//! releases its old placement and takes the new one in one step), when a placement exists
//! that is no looser than the one it has: its members elsewhere stay exactly where they are,
//! those on the drained server go to the fullest up server that takes them (best fit), in the
//! others' rack or domain when the gang spans servers. Its tasks are checkpointed and restarted
//! there by the node agents, as for any migration. A gang whose time limit ends it by the drain
//! deadline is left to end; one with no such placement now stays until the deadline, when the
//! leader re-queues it ([`crate::Command::Evict`]). Moving early costs the gang what an
//! eviction would (the work since its last checkpoint) and gains a place held for it at once,
//! where an eviction puts it back in the queue.

use crate::fit::{self, FitMode};
use crate::ids::ServerId;
use crate::job::JobState;
use crate::locality::LocalityLevel;
use crate::migration_planner::Move;
use crate::placement::MemberPlacement;
use crate::server::{Health, ServerRecord};
use crate::view::ClusterView;

/// Most gangs one plan moves (each costs a pass over the servers).
pub const MAX_DRAIN_MOVES: usize = 8;

/// The moves that take gangs off drained `server` now, at most `max`, in job order; empty when
/// the server is not being drained, its deadline passed (eviction's turn), or nothing can move
/// without a looser placement.
pub fn drain_moves(view: &ClusterView, server: ServerId, max: usize) -> Vec<Move> {
    let Some(by) = view.cordon_of(server).and_then(|c| c.drain_by_ms) else { return Vec::new() };
    if by <= view.now_ms() {
        return Vec::new();
    }
    let mut jobs: Vec<_> = view
        .jobs()
        .into_iter()
        .filter(|j| matches!(j.state, JobState::Placed | JobState::Running))
        .filter(|j| j.placed_on(server))
        // Ends by its time limit before the deadline: left to end.
        .filter(|j| j.deadline_ms().is_none_or(|d| d > by))
        .collect();
    jobs.sort_by_key(|j| j.id);
    // Records as the moves planned so far leave them.
    let mut recs: Vec<ServerRecord> = view.servers().to_vec();
    let mut moves = Vec::new();
    for j in jobs {
        if moves.len() >= max {
            break;
        }
        let Some(p) = &j.placement else { continue };
        let mut mine = recs.clone();
        for m in &p.members {
            mine[m.server.index()].give_back(m, view.unhealthy_devices(m.server));
        }
        let Some(to) = new_members(view, &mut mine, server, &p.members, p.level, &j.spec) else { continue };
        let level = view.gang_level(&to);
        if level > p.level || level > j.spec.tolerate {
            continue;
        }
        recs = mine;
        moves.push(Move { job: j.id, from: p.members.clone(), to });
    }
    moves
}

/// The gang's members with those on `server` given new homes in `recs` (taken there), or
/// `None` when one finds none.
fn new_members(
    view: &ClusterView,
    recs: &mut [ServerRecord],
    server: ServerId,
    members: &[MemberPlacement],
    level: LocalityLevel,
    spec: &crate::job::JobSpec,
) -> Option<Vec<MemberPlacement>> {
    let mut out = Vec::with_capacity(members.len());
    // The members that stay keep their resources exactly.
    for m in members.iter().filter(|m| m.server != server) {
        take(&mut recs[m.server.index()], m);
    }
    let anchor = members.iter().find(|m| m.server != server).map(|m| m.server);
    let mut anchor = anchor;
    for m in members {
        if m.server != server {
            out.push(*m);
            continue;
        }
        let to = home(view, recs, server, anchor, level, spec)?;
        take(&mut recs[to.server.index()], &to);
        anchor = anchor.or(Some(to.server));
        out.push(to);
    }
    Some(out)
}

/// The fullest up server other than `server` where one member fits: within `anchor`'s server
/// (a gang inside one server), rack or domain (one across servers) as `level` asks.
fn home(
    view: &ClusterView,
    recs: &[ServerRecord],
    server: ServerId,
    anchor: Option<ServerId>,
    level: LocalityLevel,
    spec: &crate::job::JobSpec,
) -> Option<MemberPlacement> {
    let same_place = |i: usize| -> bool {
        let Some(a) = anchor else { return true };
        let cs = |s: usize| &view.config_sets()[recs[s].config_set.index()];
        match level {
            l if l <= LocalityLevel::Server => i == a.index(),
            l => cs(i).domain(l) == cs(a.index()).domain(l),
        }
    };
    let keep = level.min(LocalityLevel::Server);
    let mut best: Option<(u32, MemberPlacement)> = None;
    for (i, rec) in recs.iter().enumerate() {
        let free = rec.free_gpus.count_ones();
        if i == server.index()
            || rec.health != Health::Up
            || free < spec.gpus_per_member
            || best.as_ref().is_some_and(|(f, _)| free >= *f)
            || !same_place(i)
        {
            continue;
        }
        let topo = view.topology_of(rec.config_set);
        if spec.gpu_type.as_ref().is_some_and(|t| *t != topo.device_type) {
            continue;
        }
        let req = fit::member_request(spec, topo);
        if let Some((m, _)) = fit::plan_member(topo, rec, ServerId(i as u32), &req, keep, FitMode::Pack) {
            best = Some((free, m));
        }
    }
    best.map(|(_, m)| m)
}

fn take(r: &mut ServerRecord, m: &MemberPlacement) {
    r.free_gpus &= !m.gpus;
    r.free_cores = r.free_cores.without(m.cores);
    r.free_memory_mib = r.free_memory_mib.saturating_sub(m.memory_mib);
}

#[cfg(test)]
mod tests;
