//! Homes for the jobs a plan moves: a free one ([`destination`]), or one made by moving one
//! more job out of the way (a chain, [`chained`]), both ranked alike ([`home_on`]).

use super::{Holder, Holders, Move, home_level, released, take};
use crate::fit::{self, FitMode};
use crate::ids::{JobId, ServerId};
use crate::job::JobSpec;
use crate::locality::LocalityLevel;
use crate::placement::MemberPlacement;
use crate::server::{Health, ServerRecord};
use crate::view::ClusterView;
use std::collections::HashMap;

/// A home for `mover`, which fits nowhere on `dest` as things are, made by first moving one
/// other movable job (not in `skip`, not on the `freed` servers) to a free home of its own:
/// `(that move, the mover's new member)`. Of the ways found, the one that leaves the mover its
/// cores, then moves the fewest GPUs, then lands it on the fullest server (best fit, as
/// [`destination`]), then the lowest server id.
///
/// The ways are tried in that order but for the cores, which only a fit tells: the first found
/// that keeps the mover's cores is the best, so the search stops there. The other job's two
/// best homes on other servers are searched once per shape of job ([`two_homes`]); a way whose
/// job has neither there, nor by the counts room beside the mover ([`room_for_both`]), is not
/// tried: on a busy cluster that is most of them.
pub(super) fn chained<'a>(
    view: &'a ClusterView,
    dest: &[ServerRecord],
    mover: &Holder<'a>,
    holders: &Holders,
    skip: &[JobId],
    freed: &[ServerId],
    memo: &mut ChainMemo<'a>,
) -> Option<(Move, MemberPlacement)> {
    let spec = &mover.of.spec;
    let keep = home_level(mover.of);
    let cores = mover.member.cores.count();
    // The other job's best homes, per shape, searched on `dest` once: `dest` changes only on the
    // server it leaves, so its best home is the best of the two best elsewhere and that server.
    let mut homes: Vec<Option<[Option<Home>; 2]>> = vec![None; holders.shapes.len()];
    // Every way ([`Way`]), listed only if what the mover's fit needs of counts is there once the
    // other job is released (GPUs, memory, the fewest cores), and the other job has a home
    // elsewhere or, by the counts, room beside the mover.
    let mut ways: Vec<Way> = Vec::new();
    let mut reqs = Requests::new(view, spec);
    // Every server with a free GPU, fullest first: each shape's search reads its part of it.
    let mut order: Option<Vec<(u32, usize)>> = None;
    for (y, rec) in dest.iter().enumerate() {
        let server = ServerId(y as u32);
        let topo = view.topology_of(rec.config_set);
        let free = rec.free_gpus.count_ones();
        if rec.health != Health::Up
            || freed.contains(&server)
            || spec.gpu_type.as_ref().is_some_and(|t| *t != topo.device_type)
        {
            continue;
        }
        let req = reqs.of(view, rec);
        for h in holders[y].iter().filter(|h| h.movable && !skip.contains(&h.of.id)) {
            let Some(at) = h.shape else { continue };
            let gpus = h.member.gpus.count_ones();
            let free_cores = rec.free_cores.or(h.member.cores).count();
            if free + gpus < req.gpus
                || rec.free_memory_mib.saturating_add(h.member.memory_mib) < req.memory_mib
                || free_cores < req.min_cores
            {
                continue;
            }
            let shape = holders.shapes[at];
            let two = homes[at].get_or_insert_with(|| {
                let order = order.get_or_insert_with(|| fullest_first(dest, 1));
                two_homes(view, dest, order, &h.of.spec, shape.keep, shape.cores)
            });
            let elsewhere = two.iter().flatten().find(|(r, _)| r.2 != server).copied();
            if elsewhere.is_none() && !room_for_both(rec, &h.member, &req, &fit::member_request(&h.of.spec, topo)) {
                continue;
            }
            // A fit grants at most the cores wanted or free, and at least the fewest.
            let could_keep = req.min_cores.max(req.want_cores.min(free_cores)) >= cores;
            ways.push(Way { gpus, free, server, req, other: h, shape, could_keep, elsewhere });
        }
    }
    ways.sort_by_key(|w| (w.gpus, w.free, w.server)); // stable: a server's jobs stay in id order
    let mut short: Option<(Move, MemberPlacement)> = None;
    let mover_shape = memo.shape(Shape::of(spec, keep, 0));
    for Way { server, req, other: h, shape, could_keep, elsewhere, .. } in ways {
        if !could_keep && short.is_some() {
            continue; // ranks below the short way already found
        }
        let rec = &dest[server.index()];
        let topo = view.topology_of(rec.config_set);
        let left = || released(view, rec, server, &[&h.member]);
        let fit = || fit::plan_member(topo, &left(), server, &req, keep, FitMode::Pack).map(|(m, _)| m);
        // Another candidate's search may have tried this already, on the same record.
        let to = if view.server(server) == Some(rec) {
            *memo.fits.entry((mover_shape, server, h.of.id)).or_insert_with(fit)
        } else {
            fit()
        };
        let Some(to) = to else { continue };
        let keeps_cores = to.cores.count() >= cores;
        if !keeps_cores && short.is_some() {
            continue; // ranks below the short way already found
        }
        let mut there = left();
        take(&mut there, &to);
        let here = home_on(view, &there, server, &h.of.spec, shape.keep, shape.cores);
        let home = match (elsewhere, here) {
            (Some(e), Some(h)) => Some(if h.0 < e.0 { h.1 } else { e.1 }),
            (Some(e), None) => Some(e.1),
            (None, h) => h.map(|h| h.1),
        };
        let Some(home) = home else { continue };
        let way = (Move { job: h.of.id, from: vec![h.member], to: vec![home] }, to);
        if keeps_cores {
            return Some(way);
        }
        short = Some(way);
    }
    short
}

/// One way [`chained`] may make a home for a mover: release `other`, on `server`, and move it.
/// Ways rank by (`gpus`, `free`, `server`): the fewest GPUs moved, then the fullest server.
struct Way<'h, 'a> {
    /// The other job's GPUs.
    gpus: u32,
    /// The server's free GPUs.
    free: u32,
    server: ServerId,
    /// The mover's request on the server.
    req: fit::MemberRequest,
    other: &'h Holder<'a>,
    /// The other job's shape.
    shape: Shape<'a>,
    /// Whether the mover could keep its cores there, by the counts.
    could_keep: bool,
    /// The other job's best home on another server, if any.
    elsewhere: Option<Home>,
}

/// Whether `rec`, with `held` released, has the counts two members of requests `a` and `b`
/// need side by side: GPUs, memory and the fewest cores of each. [`fit::plan_member`] for `a`,
/// then for `b` on what `a` leaves, fails if this is false.
fn room_for_both(rec: &ServerRecord, held: &MemberPlacement, a: &fit::MemberRequest, b: &fit::MemberRequest) -> bool {
    (rec.free_gpus | held.gpus).count_ones() >= a.gpus + b.gpus
        && u64::from(rec.free_memory_mib) + u64::from(held.memory_mib)
            >= u64::from(a.memory_mib) + u64::from(b.memory_mib)
        && rec.free_cores.or(held.cores).count() >= a.min_cores + b.min_cores
}

/// What the chain searches of one plan share ([`chained`]), over the candidates it tries:
/// whether a mover's shape fits on a server once one job there is released, kept for servers
/// whose records are still the view's (the others change from candidate to candidate).
#[derive(Default)]
pub(super) struct ChainMemo<'a> {
    shapes: Vec<Shape<'a>>,
    fits: HashMap<(usize, ServerId, JobId), Option<MemberPlacement>>,
}

impl<'a> ChainMemo<'a> {
    /// The index of `shape`, added if new.
    pub(super) fn shape(&mut self, shape: Shape<'a>) -> usize {
        match self.shapes.iter().position(|s| *s == shape) {
            Some(at) => at,
            None => {
                self.shapes.push(shape);
                self.shapes.len() - 1
            }
        }
    }
}

/// What a moved job's home depends on: its request's fields, the level it keeps, the cores it
/// holds.
#[derive(Clone, Copy, PartialEq)]
pub(super) struct Shape<'a> {
    gpus: u32,
    cpu: crate::job::CpuDemand,
    memory_mib_per_gpu: Option<u32>,
    gpu_type: Option<&'a str>,
    keep: LocalityLevel,
    cores: u32,
}

impl<'a> Shape<'a> {
    pub(super) fn of(spec: &'a JobSpec, keep: LocalityLevel, cores: u32) -> Shape<'a> {
        Shape {
            gpus: spec.gpus_per_member,
            cpu: spec.cpu,
            memory_mib_per_gpu: spec.memory_mib_per_gpu,
            gpu_type: spec.gpu_type.as_deref(),
            keep,
            cores,
        }
    }
}

/// How [`destination`] ranks a home, lowest first: short of the job's cores, the server's free
/// GPUs, the server.
type Home = ((bool, u32, ServerId), MemberPlacement);

/// A job's member request per configuration set, worked out once per search: it depends only
/// on the spec and the set's topology, and a search asks it of every server it tries.
struct Requests<'s> {
    spec: &'s JobSpec,
    by_set: Vec<Option<fit::MemberRequest>>,
}

impl<'s> Requests<'s> {
    fn new(view: &ClusterView, spec: &'s JobSpec) -> Requests<'s> {
        Requests { spec, by_set: vec![None; view.config_sets().len()] }
    }

    fn of(&mut self, view: &ClusterView, rec: &ServerRecord) -> fit::MemberRequest {
        let spec = self.spec;
        *self.by_set[rec.config_set.index()]
            .get_or_insert_with(|| fit::member_request(spec, view.topology_of(rec.config_set)))
    }
}

/// A home for a job of `spec` on server `server` as `rec` has it, ranked as [`destination`] does.
fn home_on(
    view: &ClusterView,
    rec: &ServerRecord,
    server: ServerId,
    spec: &JobSpec,
    keep: LocalityLevel,
    cores: u32,
) -> Option<Home> {
    let req = fit::member_request(spec, view.topology_of(rec.config_set));
    home_with(view, rec, server, spec, &req, keep, cores)
}

/// [`home_on`], with the job's request on `rec` given.
fn home_with(
    view: &ClusterView,
    rec: &ServerRecord,
    server: ServerId,
    spec: &JobSpec,
    req: &fit::MemberRequest,
    keep: LocalityLevel,
    cores: u32,
) -> Option<Home> {
    let topo = view.topology_of(rec.config_set);
    let free = rec.free_gpus.count_ones();
    if free < spec.gpus_per_member || spec.gpu_type.as_ref().is_some_and(|t| *t != topo.device_type) {
        return None;
    }
    let (m, _) = fit::plan_member(topo, rec, server, req, keep, FitMode::Pack)?;
    Some(((m.cores.count() < cores, free, server), m))
}

/// The servers of `dest` with at least `gpus` free, fullest first (fewest free GPUs, then the
/// lowest id): the order of a home's rank but for being short of cores, so in this order the
/// first home found that keeps the job's cores is the best of all, and the first short one the
/// best of those. Each as (free GPUs, server index).
fn fullest_first(dest: &[ServerRecord], gpus: u32) -> Vec<(u32, usize)> {
    let mut order: Vec<(u32, usize)> =
        dest.iter().enumerate().map(|(i, r)| (r.free_gpus.count_ones(), i)).filter(|&(free, _)| free >= gpus).collect();
    order.sort_unstable();
    order
}

/// The two best homes on `dest` for a job of `spec`, on two servers, as [`destination`] ranks
/// them: the best home on every server but one is one of them. Servers are tried in `order`,
/// [`fullest_first`] of `dest` for any number of GPUs up to the job's, so the search ends at the
/// second home that keeps the job's cores.
fn two_homes(
    view: &ClusterView,
    dest: &[ServerRecord],
    order: &[(u32, usize)],
    spec: &JobSpec,
    keep: LocalityLevel,
    cores: u32,
) -> [Option<Home>; 2] {
    let mut reqs = Requests::new(view, spec);
    let (mut keeping, mut short): (Vec<Home>, Vec<Home>) = (Vec::with_capacity(2), Vec::with_capacity(2));
    for &(_, i) in order {
        let (rec, server) = (&dest[i], ServerId(i as u32));
        let Some(h) = home_with(view, rec, server, spec, &reqs.of(view, rec), keep, cores) else { continue };
        if !h.0.0 {
            keeping.push(h);
            if keeping.len() == 2 {
                break;
            }
        } else if short.len() < 2 {
            short.push(h);
        }
    }
    let mut top = keeping.into_iter().chain(short);
    [top.next(), top.next()]
}

/// A new home for a single-member job at `keep` or tighter: where it keeps the `cores` it holds
/// if any server allows (a CPU-aware grant lost in a move would slow the job for the rest of its
/// run), then the fullest server where it fits (best fit, so moves do not fragment other
/// servers). Servers are tried fullest first ([`fullest_first`]), so the search ends at the
/// first home that keeps the job's cores.
pub(super) fn destination(
    view: &ClusterView,
    dest: &[ServerRecord],
    spec: &JobSpec,
    keep: LocalityLevel,
    cores: u32,
) -> Option<MemberPlacement> {
    let mut reqs = Requests::new(view, spec);
    let mut short: Option<MemberPlacement> = None;
    for (_, i) in fullest_first(dest, spec.gpus_per_member) {
        let (rec, server) = (&dest[i], ServerId(i as u32));
        let Some(((is_short, _, _), m)) = home_with(view, rec, server, spec, &reqs.of(view, rec), keep, cores) else {
            continue;
        };
        if !is_short {
            return Some(m);
        }
        short.get_or_insert(m);
    }
    short
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::CpuDemand;
    use crate::mask::CoreMask;
    use crate::{ClusterSpec, Topology};
    use proptest::prelude::*;

    /// Every home on `dest`, best first, as the rank orders them: what the fullest-first
    /// searches must agree with.
    fn ranked(view: &ClusterView, dest: &[ServerRecord], spec: &JobSpec, keep: LocalityLevel, cores: u32) -> Vec<Home> {
        let mut all: Vec<Home> =
            (0..dest.len()).filter_map(|i| home_on(view, &dest[i], ServerId(i as u32), spec, keep, cores)).collect();
        all.sort_by_key(|h| h.0);
        all
    }

    proptest! {
        /// Trying servers fullest first and stopping at the first (second) home that keeps the
        /// job's cores finds the best (two best) homes of all, as ranking every server does.
        #[test]
        fn fullest_first_finds_the_best_ranked_homes(
            free in prop::collection::vec((0u64..256, any::<u32>(), 0u32..=8), 1..40),
            gpus in 1u32..=4,
            cores_per_gpu in 1u32..=8,
            held_cores in 1u32..=16,
            keep in prop::sample::select(vec![LocalityLevel::PcieSwitch, LocalityLevel::Socket, LocalityLevel::Server]),
        ) {
            let topo = Topology::preset("seed-8gpu").expect("preset");
            let view = ClusterView::from_spec(&ClusterSpec::uniform(topo, free.len() as u32, free.len() as u32, 1));
            let dest: Vec<ServerRecord> = view
                .servers()
                .iter()
                .zip(&free)
                .map(|(rec, &(gpus, cores, mem_gib))| {
                    let mut r = *rec;
                    r.free_gpus = gpus;
                    r.free_cores = (0..32).filter(|c| cores >> c & 1 == 1).fold(CoreMask::EMPTY, |m, c| m.or(CoreMask::range(c, 1)));
                    r.free_memory_mib = mem_gib * 1024;
                    r
                })
                .collect();
            let mut spec = JobSpec::simple("j", 1, gpus);
            spec.cpu = CpuDemand::Fixed { cores_per_gpu };
            spec.memory_mib_per_gpu = Some(1024);
            let all = ranked(&view, &dest, &spec, keep, held_cores);
            prop_assert_eq!(destination(&view, &dest, &spec, keep, held_cores), all.first().map(|h| h.1));
            let two = two_homes(&view, &dest, &fullest_first(&dest, 1), &spec, keep, held_cores);
            prop_assert_eq!(two, [all.first().copied(), all.get(1).copied()]);
        }
    }
}
