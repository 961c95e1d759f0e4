//! Gang placement search over a [`LocalView`].
//!
//! [`find_placement`] tries locality levels from the tightest (`pcie-switch`) to the loosest the
//! job allows now, and returns the first placement found, so the result is at the tightest
//! feasible level within tolerance.
//!
//! - Intra-server levels (`pcie-switch`, `socket`, `server`): every member on one server, all
//!   GPUs inside one group of that level. Candidate servers come from the index buckets whose
//!   free figure at that level is large enough; packing visits the fullest buckets first
//!   (best fit), spreading the emptiest. Within a bucket, probing starts at a per-scheduler
//!   offset (`salt`) so that schedulers reading the same snapshot pick different servers.
//! - Inter-server levels (`rack`, `ib-domain`, `any`): one member per slot of `g` free GPUs.
//!   Member slots per domain are counted from the per-configuration-set histograms; the domain
//!   that fits with the fewest spare slots wins (best fit), and servers with the most free GPUs
//!   are filled first so the gang spans as few servers as possible.
//!
//! Every member is built by [`tessera_view::fit`], the approver's own fit code.

use crate::local_view::{LocalView, Overlay, key_at};
use tessera_view::fit::{self, FitMode, MemberRequest};
use tessera_view::{JobSpec, LocalityLevel, MemberPlacement, ServerId, ServerRecord, Topology};
use thiserror::Error;

/// Domains tried for an inter-server gang before giving up at that level.
const DOMAINS_TRIED: usize = 8;

/// Why no placement was found: an outcome of the search (wait for capacity, or give up on a
/// GPU type no server has), not a failure of the crate.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum NoPlacement {
    /// No server has the job's GPU type.
    #[error("no server has GPU type `{0}`")]
    NoSuchType(String),
    /// Nothing fits now at any level up to the one allowed.
    #[error("no placement within {allowed} fits the current view")]
    NoFit {
        /// The loosest level tried.
        allowed: LocalityLevel,
    },
}

/// A placement found by the search.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// Members in rank order.
    pub members: Vec<MemberPlacement>,
    /// Level achieved.
    pub level: LocalityLevel,
}

/// Finds a gang placement for `spec` on `view` (with fresher records from `overlay`), at the
/// tightest level up to `allowed`, packing or spreading per `mode`. `salt` decorrelates
/// schedulers that read the same view.
pub fn find_placement(
    view: &LocalView,
    overlay: &Overlay,
    spec: &JobSpec,
    allowed: LocalityLevel,
    mode: FitMode,
    salt: u64,
) -> Result<Found, NoPlacement> {
    let typed: Vec<bool> = view
        .topologies()
        .iter()
        .map(|t| spec.gpu_type.as_ref().is_none_or(|want| *want == t.device_type) && t.devices >= spec.gpus_per_member)
        .collect();
    if !typed.iter().any(|&b| b) {
        return Err(match &spec.gpu_type {
            Some(t) => NoPlacement::NoSuchType(t.clone()),
            None => NoPlacement::NoFit { allowed },
        });
    }
    let total = spec.total_gpus();
    let ctx = Ctx { view, overlay, spec, typed: &typed, mode, salt };
    for level in LocalityLevel::ALL {
        if level > allowed {
            break;
        }
        let found = if level.is_intra_server() {
            let possible = view.topologies().iter().zip(&typed).any(|(t, &ok)| ok && t.max_group(level) >= total);
            if possible { ctx.single_server(level) } else { None }
        } else if spec.members > 1 {
            ctx.multi_server(level)
        } else {
            None
        };
        if let Some(members) = found {
            let level = achieved_level(view, &members);
            return Ok(Found { members, level });
        }
    }
    Err(NoPlacement::NoFit { allowed })
}

/// The level a set of members achieves on `view`, by the approver's own rule.
fn achieved_level(view: &LocalView, members: &[MemberPlacement]) -> LocalityLevel {
    tessera_view::approver::gang_level(view.topologies(), view.config_sets(), view.servers(), members)
}

struct Ctx<'a> {
    view: &'a LocalView,
    overlay: &'a Overlay,
    spec: &'a JobSpec,
    typed: &'a [bool],
    mode: FitMode,
    salt: u64,
}

impl Ctx<'_> {
    #[inline]
    fn record(&self, s: ServerId) -> &ServerRecord {
        self.overlay.get(s).unwrap_or(&self.view.servers()[s.index()])
    }

    fn single_server(&self, level: LocalityLevel) -> Option<Vec<MemberPlacement>> {
        let total = self.spec.total_gpus();
        // (order key, bucket): pack wants the fullest servers, spread the emptiest.
        let mut candidates: Vec<(u64, u32)> = Vec::with_capacity(32);
        for (t, bucket_ids) in self.view.topology_buckets.iter().enumerate() {
            if !self.typed[t] {
                continue;
            }
            for &b in bucket_ids {
                let bucket = &self.view.buckets[b as usize];
                let at = key_at(bucket.key, level);
                if bucket.servers.is_empty() || at < total {
                    continue;
                }
                let order = ((bucket.key & 0xff) as u64) << 8 | at as u64;
                let order = match self.mode {
                    FitMode::Pack => order,
                    FitMode::Spread => u64::MAX - order,
                };
                candidates.push((order, b));
            }
        }
        candidates.sort_unstable();
        for &(_, b) in &candidates {
            let bucket = &self.view.buckets[b as usize];
            let topo = &self.view.topologies()[bucket.topology as usize];
            let req = fit::member_request(self.spec, topo);
            let n = bucket.servers.len();
            let start = (self.salt % n as u64) as usize;
            // Every server of the bucket has the GPUs; cores or memory may still be short, so
            // probe on (usually the first probe fits) rather than report a false no-fit.
            for i in 0..n {
                let s = bucket.servers[(start + i) % n];
                if let Some(m) = plan_on_server(topo, self.record(s), s, &req, self.spec.members, level, self.mode) {
                    return Some(m);
                }
            }
        }
        None
    }

    fn multi_server(&self, level: LocalityLevel) -> Option<Vec<MemberPlacement>> {
        let g = self.spec.gpus_per_member;
        let m = self.spec.members as u64;
        let v = self.view;
        let rack_slots = |r: u32| -> u64 {
            v.rack_sets[r as usize]
                .iter()
                .filter(|cs| self.typed[v.config_sets()[cs.index()].topology as usize])
                .map(|cs| {
                    let hist = &v.cs_hist[cs.index()];
                    (g as usize..hist.len()).map(|k| hist[k] as u64 * (k as u64 / g as u64)).sum::<u64>()
                })
                .sum()
        };
        // Domains that fit, as (order, domain index); racks for `rack`, IB domains for
        // `ib-domain`, the whole cluster for `any`.
        let mut fits: Vec<(u64, u32)> = Vec::new();
        let mut consider = |slots: u64, d: u32| {
            if slots >= m {
                let order = match self.mode {
                    FitMode::Pack => slots,
                    FitMode::Spread => u64::MAX - slots,
                };
                fits.push((order, d));
            }
        };
        match level {
            LocalityLevel::Rack => (0..v.rack_count() as u32).for_each(|r| consider(rack_slots(r), r)),
            LocalityLevel::IbDomain => {
                for (d, racks) in v.ib_racks.iter().enumerate() {
                    consider(racks.iter().map(|&r| rack_slots(r)).sum(), d as u32);
                }
            }
            _ => consider((0..v.rack_count() as u32).map(rack_slots).sum(), 0),
        }
        fits.sort_unstable();
        let all: Vec<u32> = if fits.is_empty() || level <= LocalityLevel::IbDomain {
            Vec::new()
        } else {
            (0..v.rack_count() as u32).collect()
        };
        for &(_, d) in fits.iter().take(DOMAINS_TRIED) {
            let racks: &[u32] = match level {
                LocalityLevel::Rack => std::slice::from_ref(&d),
                LocalityLevel::IbDomain => &v.ib_racks[d as usize],
                _ => &all,
            };
            if let Some(members) = self.fill_domain(racks) {
                return Some(members);
            }
        }
        None
    }

    /// Fills the gang's members into servers of the given racks, racks with most room first,
    /// servers with most free GPUs first.
    fn fill_domain(&self, racks: &[u32]) -> Option<Vec<MemberPlacement>> {
        let g = self.spec.gpus_per_member;
        let v = self.view;
        // (rack free, server free, server): sort descending on both.
        let mut cands: Vec<(u32, u32, ServerId)> = Vec::new();
        for &r in racks {
            let start = cands.len();
            let mut rack_free = 0;
            for &cs in &v.rack_sets[r as usize] {
                if !self.typed[v.config_sets()[cs.index()].topology as usize] {
                    continue;
                }
                for &s in &v.cs_servers[cs.index()] {
                    let rec = self.record(s);
                    let free = rec.free_gpus.count_ones();
                    if rec.health == tessera_view::Health::Up && free >= g {
                        rack_free += free;
                        cands.push((0, free, s));
                    }
                }
            }
            for c in &mut cands[start..] {
                c.0 = rack_free;
            }
        }
        cands.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
        let mut members = Vec::with_capacity(self.spec.members as usize);
        for &(_, _, s) in &cands {
            let mut rec = *self.record(s);
            let topo = v.topology_of(rec.config_set);
            let req = fit::member_request(self.spec, topo);
            while members.len() < self.spec.members as usize {
                let Some((mp, _)) = fit::plan_member(topo, &rec, s, &req, LocalityLevel::Server, FitMode::Pack) else {
                    break;
                };
                rec.free_gpus &= !mp.gpus;
                rec.free_cores = rec.free_cores.without(mp.cores);
                rec.free_memory_mib -= mp.memory_mib;
                members.push(mp);
            }
            if members.len() == self.spec.members as usize {
                return Some(members);
            }
        }
        None
    }
}

/// Places every member of a gang on one server, all GPUs within one group of `level`.
pub fn plan_on_server(
    topo: &Topology,
    rec: &ServerRecord,
    server: ServerId,
    req: &MemberRequest,
    members: u32,
    level: LocalityLevel,
    mode: FitMode,
) -> Option<Vec<MemberPlacement>> {
    if members == 1 {
        return fit::plan_member(topo, rec, server, req, level, mode).map(|(m, _)| vec![m]);
    }
    if rec.health != tessera_view::Health::Up || (rec.free_memory_mib as u64) < req.memory_mib as u64 * members as u64 {
        return None;
    }
    let (all, _) = fit::pick_gpus(topo, rec.free_gpus, req.gpus * members, level, mode)?;
    let mut cores_free = rec.free_cores;
    let mut rest = all;
    let mut out = Vec::with_capacity(members as usize);
    for _ in 0..members {
        let gpus = tessera_view::mask::lowest_set_bits(rest, req.gpus)?;
        rest &= !gpus;
        let reserve = fit::core_reserve(topo, (rec.free_gpus & !all).count_ones());
        let cores = fit::pick_cores(topo, cores_free, gpus, req, reserve)?;
        cores_free = cores_free.without(cores);
        out.push(MemberPlacement { server, gpus, cores, memory_mib: req.memory_mib });
    }
    Some(out)
}
