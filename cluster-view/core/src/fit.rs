//! The fit function, shared by the approver and every scheduler's search.
//!
//! Nomad learned that a proposer and an approver that disagree on what "fits" loop forever on
//! rejections. Here both sides call the same code: [`member_request`] says what a member needs
//! on a given topology, [`check_member`] says whether a proposed member placement is valid on a
//! server record, and the `pick_*` helpers build placements that `check_member` accepts.

use crate::job::{CpuDemand, JobSpec};
use crate::locality::LocalityLevel;
use crate::mask::{CoreMask, lowest_set_bits};
use crate::placement::{MemberPlacement, Rejection};
use crate::server::{Health, ServerRecord};
use crate::topology::Topology;

/// What one member of a job needs on a server of a given topology.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberRequest {
    /// GPUs.
    pub gpus: u32,
    /// Fewest cores accepted.
    pub min_cores: u32,
    /// Cores wanted (most granted).
    pub want_cores: u32,
    /// Memory in MiB.
    pub memory_mib: u32,
}

/// Whether placement picks the tightest fitting group (pack) or the emptiest (spread).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FitMode {
    /// Best fit: fill partly used groups, keep whole groups free.
    Pack,
    /// Least loaded: avoid co-locating with other jobs.
    Spread,
}

/// A member's demand on `topo`.
pub fn member_request(spec: &JobSpec, topo: &Topology) -> MemberRequest {
    let g = spec.gpus_per_member;
    let share = |total: u64| -> u64 { (total * g as u64 / topo.devices as u64).max(1) };
    let (min_cores, want_cores) = match spec.cpu {
        CpuDemand::Proportional => {
            let c = share(topo.cores() as u64) as u32;
            (c, c)
        }
        CpuDemand::Fixed { cores_per_gpu } => (cores_per_gpu * g, cores_per_gpu * g),
        CpuDemand::Predicted { predictor, min_cores_per_gpu } => {
            (min_cores_per_gpu * g, (predictor.theta.ceil() as u32).max(min_cores_per_gpu) * g)
        }
    };
    let memory_mib = match spec.memory_mib_per_gpu {
        Some(m) => (m as u64 * g as u64).min(u32::MAX as u64) as u32,
        None => share(topo.memory_mib as u64) as u32,
    };
    MemberRequest { gpus: g, min_cores, want_cores, memory_mib }
}

/// Checks that `m` is well-formed for `req` on `topo` (ranges and counts), ignoring what is
/// free. `member` is the member's index, for the reason.
pub fn check_member_shape(
    topo: &Topology,
    m: &MemberPlacement,
    req: &MemberRequest,
    member: u32,
) -> Result<(), Rejection> {
    let outside = m.gpus & !topo.all_devices();
    if outside != 0 {
        return Err(Rejection::DevicesOutOfRange { member, server: m.server, mask: outside });
    }
    let outside = m.cores.without(topo.all_cores());
    if !outside.is_empty() {
        return Err(Rejection::CoresOutOfRange { member, server: m.server, mask: outside });
    }
    let got = m.gpus.count_ones();
    if got != req.gpus {
        return Err(Rejection::WrongGpuCount { member, expected: req.gpus, got });
    }
    let cores = m.cores.count();
    if cores < req.min_cores || cores > req.want_cores {
        return Err(Rejection::WrongCoreCount { member, min: req.min_cores, max: req.want_cores, got: cores });
    }
    if m.memory_mib != req.memory_mib {
        return Err(Rejection::WrongMemory { member, expected: req.memory_mib, got: m.memory_mib });
    }
    Ok(())
}

/// Checks that `m`'s resources are free on `rec` (a conflict otherwise).
pub fn check_member_free(rec: &ServerRecord, m: &MemberPlacement) -> Result<(), Rejection> {
    if rec.health != Health::Up {
        return Err(Rejection::ServerNotUp { server: m.server, health: rec.health });
    }
    let busy = m.gpus & !rec.free_gpus;
    if busy != 0 {
        return Err(Rejection::DevicesBusy { server: m.server, mask: busy });
    }
    let busy = m.cores.without(rec.free_cores);
    if !busy.is_empty() {
        return Err(Rejection::CoresBusy { server: m.server, mask: busy });
    }
    if m.memory_mib > rec.free_memory_mib {
        return Err(Rejection::MemoryShort { server: m.server, free: rec.free_memory_mib, asked: m.memory_mib });
    }
    Ok(())
}

/// The whole per-member check: shape, then free resources.
pub fn check_member(
    topo: &Topology,
    rec: &ServerRecord,
    m: &MemberPlacement,
    req: &MemberRequest,
    member: u32,
) -> Result<(), Rejection> {
    check_member_shape(topo, m, req, member)?;
    check_member_free(rec, m)
}

/// Picks `count` free devices from `free` in one group at the tightest intra-server level up to
/// `max_level`. Within the level, `Pack` takes the fullest group that fits and `Spread` the
/// emptiest. Returns the devices and the level achieved.
pub fn pick_gpus(
    topo: &Topology,
    free: u64,
    count: u32,
    max_level: LocalityLevel,
    mode: FitMode,
) -> Option<(u64, LocalityLevel)> {
    if count == 0 || free.count_ones() < count {
        return None;
    }
    for level in [LocalityLevel::PcieSwitch, LocalityLevel::Socket, LocalityLevel::Server] {
        if level > max_level {
            break;
        }
        let mut best: Option<(u32, u64)> = None;
        let consider = |g: u64, best: &mut Option<(u32, u64)>| {
            let n = (free & g).count_ones();
            if n < count {
                return;
            }
            let better = match (*best, mode) {
                (None, _) => true,
                (Some((b, _)), FitMode::Pack) => n < b,
                (Some((b, _)), FitMode::Spread) => n > b,
            };
            if better {
                *best = Some((n, g));
            }
        };
        match level {
            LocalityLevel::PcieSwitch => {
                for &g in topo.pcie_switches.iter().chain(topo.nvlink_groups.iter()) {
                    consider(g, &mut best);
                }
            }
            LocalityLevel::Socket => {
                for &g in &topo.sockets {
                    consider(g, &mut best);
                }
            }
            _ => consider(topo.all_devices(), &mut best),
        }
        if let Some((_, group)) = best {
            return Some((take_compact(topo, free & group, count), level));
        }
    }
    None
}

/// Takes `count` devices from `avail`, filling the PCIe switches with the most free devices
/// first so that the devices span as few switches as possible.
fn take_compact(topo: &Topology, avail: u64, count: u32) -> u64 {
    let mut switches: [(u32, u64); 64] = [(0, 0); 64];
    let mut n = 0;
    for &sw in &topo.pcie_switches {
        let f = avail & sw;
        if f != 0 {
            switches[n] = (f.count_ones(), f);
            n += 1;
        }
    }
    // Most free first; ties keep topology order (stable sort) for determinism.
    switches[..n].sort_by_key(|s| std::cmp::Reverse(s.0));
    let mut out = 0u64;
    let mut left = count;
    for &(c, f) in &switches[..n] {
        if left == 0 {
            break;
        }
        let take = c.min(left);
        out |= lowest_set_bits(f, take).unwrap_or(0);
        left -= take;
    }
    out
}

/// Picks cores for a member holding `gpus`: as many as wanted (at least the minimum) from the
/// free cores, preferring the sockets the GPUs hang off.
///
/// `reserve` cores are left free if that still grants the minimum: callers reserve the
/// proportional core share of every GPU that stays free on the server (see
/// [`core_reserve`]), so a job that could use more cores than its share (a predicted CPU
/// demand) takes spare cores, never the share of a GPU that another job may still get; without
/// the reserve one input-bound job could strand a server's other GPUs with no cores at all.
pub fn pick_cores(topo: &Topology, free: CoreMask, gpus: u64, req: &MemberRequest, reserve: u32) -> Option<CoreMask> {
    let avail = free.count();
    if avail < req.min_cores {
        return None;
    }
    let n = req.want_cores.min(avail.saturating_sub(reserve)).max(req.min_cores);
    let near_sockets = topo.sockets_of(gpus);
    let mut near = CoreMask::EMPTY;
    for s in 0..topo.sockets.len() {
        if near_sockets >> s & 1 == 1 {
            near = near.or(topo.socket_cores(s));
        }
    }
    let near_free = free.and(near);
    let from_near = near_free.count().min(n);
    let mut out = near_free.lowest(from_near)?;
    if from_near < n {
        out = out.or(free.without(near).lowest(n - from_near)?);
    }
    Some(out)
}

/// Cores to keep free for `free_gpus_after` GPUs that stay free: their proportional share.
#[inline]
pub fn core_reserve(topo: &Topology, free_gpus_after: u32) -> u32 {
    topo.cores() / topo.devices * free_gpus_after
}

/// Plans one member on one server record: devices at the tightest level up to `max_level`,
/// cores and memory. The result passes [`check_member`] on the same record.
pub fn plan_member(
    topo: &Topology,
    rec: &ServerRecord,
    server: crate::ServerId,
    req: &MemberRequest,
    max_level: LocalityLevel,
    mode: FitMode,
) -> Option<(MemberPlacement, LocalityLevel)> {
    if rec.health != Health::Up || rec.free_memory_mib < req.memory_mib {
        return None;
    }
    let (gpus, level) = pick_gpus(topo, rec.free_gpus, req.gpus, max_level, mode)?;
    let reserve = core_reserve(topo, (rec.free_gpus & !gpus).count_ones());
    let cores = pick_cores(topo, rec.free_cores, gpus, req, reserve)?;
    Some((MemberPlacement { server, gpus, cores, memory_mib: req.memory_mib }, level))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ServerId;
    use crate::ids::ConfigSetId;

    fn seed() -> Topology {
        Topology::preset("seed-8gpu").expect("preset")
    }

    fn rec(topo: &Topology) -> ServerRecord {
        ServerRecord {
            free_gpus: topo.all_devices(),
            free_cores: topo.all_cores(),
            free_memory_mib: topo.memory_mib,
            config_set: ConfigSetId(0),
            health: Health::Up,
        }
    }

    #[test]
    fn pick_prefers_tight_and_best_fit() {
        let t = seed();
        // Switch {0,1} has one free device, switch {2,3} two: pack takes device 1 for a 1-GPU job.
        let free = 0b1111_1110;
        assert_eq!(
            pick_gpus(&t, free, 1, LocalityLevel::Server, FitMode::Pack),
            Some((0b10, LocalityLevel::PcieSwitch))
        );
        // Spread takes the emptiest switch.
        assert_eq!(pick_gpus(&t, free, 1, LocalityLevel::Server, FitMode::Spread).map(|x| x.0.count_ones()), Some(1));
        // 4 GPUs: socket 1 is whole, socket 0 has 3: socket level, socket 1.
        assert_eq!(pick_gpus(&t, free, 4, LocalityLevel::Server, FitMode::Pack), Some((0xF0, LocalityLevel::Socket)));
        // Tolerance bounds the level.
        assert_eq!(
            pick_gpus(&t, 0b0101_0101, 2, LocalityLevel::Socket, FitMode::Pack).map(|x| x.1),
            Some(LocalityLevel::Socket)
        );
        assert_eq!(pick_gpus(&t, 0b0001_0001, 2, LocalityLevel::Socket, FitMode::Pack), None);
        assert_eq!(
            pick_gpus(&t, 0b0001_0001, 2, LocalityLevel::Server, FitMode::Pack),
            Some((0b0001_0001, LocalityLevel::Server))
        );
    }

    #[test]
    fn planned_member_passes_the_check() {
        let t = seed();
        let mut spec = JobSpec::simple("j", 1, 2);
        spec.cpu = CpuDemand::Fixed { cores_per_gpu: 3 };
        let req = member_request(&spec, &t);
        let mut r = rec(&t);
        r.free_gpus = 0b1111_0000;
        let (m, level) = plan_member(&t, &r, ServerId(0), &req, LocalityLevel::Server, FitMode::Pack).expect("fits");
        assert_eq!(level, LocalityLevel::PcieSwitch);
        assert_eq!(m.cores.count(), 6);
        // Cores come from socket 1 (cores 16..32), near the GPUs.
        assert!(m.cores.is_subset_of(t.socket_cores(1)));
        assert_eq!(check_member(&t, &r, &m, &req, 0), Ok(()));
        // Any change the approver must catch is caught.
        let mut bad = m;
        bad.gpus = 0b1_0000_0000;
        assert!(matches!(check_member(&t, &r, &bad, &req, 0), Err(Rejection::DevicesOutOfRange { .. })));
        let mut bad = m;
        bad.gpus = 0b11;
        assert!(matches!(check_member(&t, &r, &bad, &req, 0), Err(Rejection::DevicesBusy { .. })));
        let mut bad = m;
        bad.memory_mib += 1;
        assert!(matches!(check_member(&t, &r, &bad, &req, 0), Err(Rejection::WrongMemory { .. })));
    }

    #[test]
    fn predicted_cpu_grants_what_is_free_down_to_the_minimum() {
        let t = seed();
        let mut spec = JobSpec::simple("j", 1, 1);
        spec.cpu = CpuDemand::Predicted {
            predictor: crate::Predictor { p0: 1.0, p1: 0.0, p2: 2.0, theta: 11.0 },
            min_cores_per_gpu: 2,
        };
        let req = member_request(&spec, &t);
        assert_eq!((req.min_cores, req.want_cores), (2, 11));
        let few = CoreMask::range(0, 5);
        assert_eq!(pick_cores(&t, few, 1, &req, 0).map(|c| c.count()), Some(5));
        assert_eq!(pick_cores(&t, CoreMask::range(0, 1), 1, &req, 0), None);
        // On an empty seed server (32 cores, 4 per GPU) the 7 GPUs left free keep 28 cores:
        // the job gets its share of 4, not the 11 it could use...
        assert_eq!(core_reserve(&t, 7), 28);
        assert_eq!(pick_cores(&t, t.all_cores(), 1, &req, 28).map(|c| c.count()), Some(4));
        // ...and with only 8 cores free the reserve gives way to the job's minimum of 2.
        assert_eq!(pick_cores(&t, CoreMask::range(0, 8), 1, &req, 28).map(|c| c.count()), Some(2));
    }
}
