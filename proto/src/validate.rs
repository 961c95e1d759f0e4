//! Validators for core values that arrive from outside (over the wire, from disk).
//!
//! The core types have public fields, so a value built from a decoded message has none of the
//! guarantees that `Topology::from_toml` or `JobSpec::from_toml` give. These functions restore
//! them; every `TryFrom` in [`crate::convert`] calls the one that applies. They never panic.

use crate::error::WireError;
use std::collections::HashSet;
use tessera_view::cluster_spec::MAX_SERVERS;
use tessera_view::job::MAX_MEMBERS;
use tessera_view::mask::{MAX_CORES, MAX_DEVICES, format_indices, low_bits};
use tessera_view::{CoreMask, CpuDemand, Job, JobSpec, Predictor, Topology, ViewSnapshot};

const TOPOLOGY: &str = "Topology";
const JOB_SPEC: &str = "JobSpec";
const CPU_DEMAND: &str = "CpuDemand";
const PREDICTOR: &str = "Predictor";
const SNAPSHOT: &str = "ViewSnapshot";

/// Checks what `Topology::from_toml` guarantees: a non-empty name and device type, 1..=64
/// devices, at least one socket, 1..=128 cores in all, non-zero memory; sockets and PCIe switches
/// each partition the devices with no empty group, every switch lies within one socket; NVLink
/// groups are disjoint, within range and have at least two devices each.
pub fn check_topology(t: &Topology) -> Result<(), WireError> {
    let bad = |field, why: String| Err(WireError::invalid(TOPOLOGY, field, why));
    if t.name.trim().is_empty() {
        return bad("name", "must not be empty".into());
    }
    if t.device_type.trim().is_empty() {
        return bad("device_type", "must not be empty".into());
    }
    if t.devices == 0 || t.devices > MAX_DEVICES {
        return Err(WireError::out_of_range(
            TOPOLOGY,
            "devices",
            t.devices.into(),
            format!("must be 1..={MAX_DEVICES}"),
        ));
    }
    if t.sockets.is_empty() {
        return bad("sockets", "at least one socket is required".into());
    }
    if t.cores_per_socket == 0 {
        return Err(WireError::out_of_range(TOPOLOGY, "cores_per_socket", 0, "must be at least 1"));
    }
    let cores = u64::from(t.cores_per_socket) * t.sockets.len() as u64;
    if cores > u64::from(MAX_CORES) {
        return Err(WireError::out_of_range(
            TOPOLOGY,
            "cores_per_socket",
            t.cores_per_socket.into(),
            format!("{} sockets x {} cores = {cores} cores; at most {MAX_CORES}", t.sockets.len(), t.cores_per_socket),
        ));
    }
    if t.memory_mib == 0 {
        return Err(WireError::out_of_range(TOPOLOGY, "memory_mib", 0, "must be at least 1"));
    }
    let all = low_bits(t.devices);
    check_partition("sockets", &t.sockets, t.devices, all)?;
    check_partition("pcie_switches", &t.pcie_switches, t.devices, all)?;
    for (i, &sw) in t.pcie_switches.iter().enumerate() {
        if !t.sockets.iter().any(|&s| sw & !s == 0) {
            return bad("pcie_switches", format!("switch {i} (devices {}) spans sockets", format_indices(sw)));
        }
    }
    let mut seen = 0u64;
    for (i, &g) in t.nvlink_groups.iter().enumerate() {
        check_group("nvlink_groups", i, g, t.devices, all)?;
        if g.count_ones() < 2 {
            return bad("nvlink_groups", format!("group {i} has fewer than two devices"));
        }
        if g & seen != 0 {
            return bad("nvlink_groups", format!("device {} is in two NVLink groups", (g & seen).trailing_zeros()));
        }
        seen |= g;
    }
    Ok(())
}

/// A non-empty device group within the device range.
fn check_group(field: &'static str, i: usize, g: u64, devices: u32, all: u64) -> Result<(), WireError> {
    if g == 0 {
        return Err(WireError::invalid(TOPOLOGY, field, format!("group {i} is empty")));
    }
    if g & !all != 0 {
        return Err(WireError::out_of_range(
            TOPOLOGY,
            field,
            g,
            format!("group {i} names devices {} but devices = {devices}", format_indices(g & !all)),
        ));
    }
    Ok(())
}

/// Groups that are non-empty, within range, disjoint and together cover every device.
fn check_partition(field: &'static str, groups: &[u64], devices: u32, all: u64) -> Result<(), WireError> {
    let mut seen = 0u64;
    for (i, &g) in groups.iter().enumerate() {
        check_group(field, i, g, devices, all)?;
        if g & seen != 0 {
            return Err(WireError::invalid(
                TOPOLOGY,
                field,
                format!("device {} is in two groups", (g & seen).trailing_zeros()),
            ));
        }
        seen |= g;
    }
    if seen != all {
        return Err(WireError::invalid(
            TOPOLOGY,
            field,
            format!("device {} is in no group", (all & !seen).trailing_zeros()),
        ));
    }
    Ok(())
}

/// Checks what `JobSpec::from_toml` guarantees: a non-empty name, 1..=4096 members of
/// 1..=64 GPUs, `tolerate` no tighter than `prefer`, a relaxation step of at least one second,
/// slowdowns in `[0, 1)`, a valid CPU demand, non-zero memory when given, a non-empty GPU type
/// when given and a non-empty program name when a command is given.
pub fn check_job_spec(s: &JobSpec) -> Result<(), WireError> {
    if s.name.trim().is_empty() {
        return Err(WireError::invalid(JOB_SPEC, "name", "must not be empty"));
    }
    if s.members == 0 || s.members > MAX_MEMBERS {
        return Err(WireError::out_of_range(
            JOB_SPEC,
            "members",
            s.members.into(),
            format!("must be 1..={MAX_MEMBERS}"),
        ));
    }
    if s.gpus_per_member == 0 || s.gpus_per_member > MAX_DEVICES {
        return Err(WireError::out_of_range(
            JOB_SPEC,
            "gpus_per_member",
            s.gpus_per_member.into(),
            format!("must be 1..={MAX_DEVICES}"),
        ));
    }
    if s.tolerate < s.prefer {
        return Err(WireError::invalid(
            JOB_SPEC,
            "tolerate",
            format!("`{}` is tighter than prefer = `{}`", s.tolerate, s.prefer),
        ));
    }
    if s.relax_after_s == Some(0) {
        return Err(WireError::out_of_range(JOB_SPEC, "relax_after_s", 0, "must be at least 1 second"));
    }
    for (level, v) in &s.slowdown {
        if !(0.0..1.0).contains(v) {
            return Err(WireError::invalid(JOB_SPEC, "slowdown", format!("{level}: must be in [0, 1), got {v}")));
        }
    }
    check_cpu_demand(&s.cpu)?;
    if s.memory_mib_per_gpu == Some(0) {
        return Err(WireError::out_of_range(JOB_SPEC, "memory_mib_per_gpu", 0, "must be at least 1 when given"));
    }
    if s.gpu_type.as_ref().is_some_and(|t| t.trim().is_empty()) {
        return Err(WireError::invalid(JOB_SPEC, "gpu_type", "must not be empty when given"));
    }
    if s.command.first().is_some_and(|c| c.trim().is_empty()) {
        return Err(WireError::invalid(JOB_SPEC, "command", "the program name must not be empty"));
    }
    Ok(())
}

/// Checks a CPU demand: a fixed grant of 1..=128 cores per GPU, or a valid predictor with a
/// minimum of 1..=⌈θ⌉ cores per GPU.
pub fn check_cpu_demand(c: &CpuDemand) -> Result<(), WireError> {
    match *c {
        CpuDemand::Proportional => Ok(()),
        CpuDemand::Fixed { cores_per_gpu } => {
            if cores_per_gpu == 0 || cores_per_gpu > MAX_CORES {
                return Err(WireError::out_of_range(
                    CPU_DEMAND,
                    "fixed.cores_per_gpu",
                    cores_per_gpu.into(),
                    format!("must be 1..={MAX_CORES}"),
                ));
            }
            Ok(())
        }
        CpuDemand::Predicted { predictor, min_cores_per_gpu } => {
            check_predictor(&predictor)?;
            let max = predictor.theta.ceil();
            if min_cores_per_gpu == 0 || f64::from(min_cores_per_gpu) > max {
                return Err(WireError::out_of_range(
                    CPU_DEMAND,
                    "predicted.min_cores_per_gpu",
                    min_cores_per_gpu.into(),
                    format!("must be 1..={max} (theta rounded up)"),
                ));
            }
            Ok(())
        }
    }
}

/// Checks a predictor: finite coefficients and θ in `1..=128`.
pub fn check_predictor(p: &Predictor) -> Result<(), WireError> {
    if !(p.theta.is_finite() && p.theta >= 1.0 && p.theta <= f64::from(MAX_CORES)) {
        return Err(WireError::invalid(
            PREDICTOR,
            "theta",
            format!("must be a number in 1..={MAX_CORES}, got {}", p.theta),
        ));
    }
    for (field, v) in [("p0", p.p0), ("p1", p.p1), ("p2", p.p2)] {
        if !v.is_finite() {
            return Err(WireError::invalid(PREDICTOR, field, format!("must be a finite number, got {v}")));
        }
    }
    Ok(())
}

/// Checks a whole snapshot, so that `ClusterView::from_snapshot` on it gives a view whose
/// invariants hold (and whose operations cannot trip the view's internal assertions).
///
/// Checks every topology and job spec; that configuration set ids equal their index and every
/// table index is in range; one unique name per server and at most `MAX_SERVERS` servers; job ids
/// unique and below `next_job`; placements present exactly while a job holds resources, whole
/// (one member per gang member, each with `gpus_per_member` GPUs), on existing servers, within
/// their topologies, with unique proposal ids; no device or core held twice; and every server's
/// free devices, cores and memory equal to its capacity minus what its jobs hold.
pub fn check_snapshot(s: &ViewSnapshot) -> Result<(), WireError> {
    for (i, t) in s.topologies.iter().enumerate() {
        check_topology(t).map_err(|e| e.at(format!("topologies[{i}]")))?;
    }
    for (i, cs) in s.config_sets.iter().enumerate() {
        let at = |e: WireError| e.at(format!("config_sets[{i}]"));
        if cs.id.index() != i {
            return Err(at(WireError::invalid("ConfigSet", "id", format!("{} is not its index {i}", cs.id.0))));
        }
        let range = |field, v: u64, len: usize, table: &str| {
            if v >= len as u64 {
                Err(at(WireError::out_of_range("ConfigSet", field, v, format!("the view has {len} {table}"))))
            } else {
                Ok(())
            }
        };
        range("topology", cs.topology.into(), s.topologies.len(), "topologies")?;
        range("rack", cs.rack.into(), s.racks.len(), "racks")?;
        range("ib_domain", cs.ib_domain.into(), s.ib_domains.len(), "InfiniBand domains")?;
    }
    if s.servers.len() as u64 > MAX_SERVERS {
        return Err(WireError::out_of_range(
            SNAPSHOT,
            "servers",
            s.servers.len() as u64,
            format!("at most {MAX_SERVERS} servers"),
        ));
    }
    if s.server_names.len() != s.servers.len() {
        return Err(WireError::invalid(
            SNAPSHOT,
            "server_names",
            format!("{} names for {} servers", s.server_names.len(), s.servers.len()),
        ));
    }
    let mut names = HashSet::with_capacity(s.server_names.len());
    for n in &s.server_names {
        if !names.insert(n.as_str()) {
            return Err(WireError::invalid(SNAPSHOT, "server_names", format!("`{n}` names two servers")));
        }
    }
    // Topology of every server, checked once.
    let mut topo_of: Vec<&Topology> = Vec::with_capacity(s.servers.len());
    for (i, r) in s.servers.iter().enumerate() {
        let at = |e: WireError| e.at(format!("servers[{i}]"));
        let cs = s.config_sets.get(r.config_set.index()).ok_or_else(|| {
            at(WireError::out_of_range(
                "ServerRecord",
                "config_set",
                r.config_set.0.into(),
                format!("the view has {} configuration sets", s.config_sets.len()),
            ))
        })?;
        // Index checked above.
        let t = &s.topologies[cs.topology as usize];
        if r.free_memory_mib > t.memory_mib {
            return Err(at(WireError::out_of_range(
                "ServerRecord",
                "free_memory_mib",
                r.free_memory_mib.into(),
                format!("the server has {} MiB", t.memory_mib),
            )));
        }
        topo_of.push(t);
    }
    let n = s.servers.len();
    let mut held_gpus = vec![0u64; n];
    let mut held_cores = vec![CoreMask::EMPTY; n];
    let mut held_mem = vec![0u64; n];
    let mut job_ids = HashSet::with_capacity(s.jobs.len());
    let mut proposals = HashSet::new();
    for (j, job) in s.jobs.iter().enumerate() {
        let at = |e: WireError| e.at(format!("jobs[{j}]"));
        check_job(job).map_err(at)?;
        if job.id.0 >= s.next_job {
            return Err(at(WireError::out_of_range("Job", "id", job.id.0, format!("next_job is {}", s.next_job))));
        }
        if !job_ids.insert(job.id) {
            return Err(at(WireError::invalid("Job", "id", format!("{} appears twice", job.id))));
        }
        let Some(p) = &job.placement else { continue };
        if !proposals.insert(p.proposal) {
            return Err(at(WireError::invalid("GangPlacement", "proposal", format!("{} placed two jobs", p.proposal))));
        }
        for (k, m) in p.members.iter().enumerate() {
            let at = |e: WireError| at(e.at(format!("placement.members[{k}]")));
            let i = m.server.index();
            let Some(t) = topo_of.get(i) else {
                return Err(at(WireError::out_of_range(
                    "MemberPlacement",
                    "server",
                    m.server.0.into(),
                    format!("the view has {n} servers"),
                )));
            };
            if m.gpus & !t.all_devices() != 0 {
                return Err(at(WireError::out_of_range(
                    "MemberPlacement",
                    "gpus",
                    m.gpus,
                    format!("the server has {} devices", t.devices),
                )));
            }
            if !m.cores.is_subset_of(t.all_cores()) {
                return Err(at(WireError::invalid(
                    "MemberPlacement",
                    "cores",
                    format!("cores {} do not exist (the server has {})", m.cores.format(), t.cores()),
                )));
            }
            if held_gpus[i] & m.gpus != 0 {
                return Err(at(WireError::invalid(
                    "MemberPlacement",
                    "gpus",
                    format!("devices {} of {} are held twice", format_indices(held_gpus[i] & m.gpus), m.server),
                )));
            }
            if held_cores[i].intersects(m.cores) {
                return Err(at(WireError::invalid(
                    "MemberPlacement",
                    "cores",
                    format!("cores {} of {} are held twice", held_cores[i].and(m.cores).format(), m.server),
                )));
            }
            held_gpus[i] |= m.gpus;
            held_cores[i] = held_cores[i].or(m.cores);
            held_mem[i] += u64::from(m.memory_mib);
        }
    }
    for (i, r) in s.servers.iter().enumerate() {
        let t = topo_of[i];
        let want_gpus = t.all_devices() & !held_gpus[i];
        let want_cores = t.all_cores().without(held_cores[i]);
        let want_mem = u64::from(t.memory_mib).checked_sub(held_mem[i]);
        if r.free_gpus != want_gpus || r.free_cores != want_cores || want_mem != Some(u64::from(r.free_memory_mib)) {
            return Err(WireError::invalid(
                "ServerRecord",
                "free_gpus",
                format!(
                    "free state (devices {}, cores {}, {} MiB) differs from capacity minus holdings \
                     (devices {}, cores {}, {} MiB)",
                    format_indices(r.free_gpus),
                    r.free_cores.format(),
                    r.free_memory_mib,
                    format_indices(want_gpus),
                    want_cores.format(),
                    want_mem.map_or_else(|| "over-committed".to_string(), |m| m.to_string()),
                ),
            )
            .at(format!("servers[{i}]")));
        }
    }
    Ok(())
}

/// Checks a job on its own: its spec (see [`check_job_spec`]), a placement present exactly while
/// its state holds resources, and a whole gang (one member per gang member, each with
/// `gpus_per_member` GPUs, at most `MAX_MEMBERS`).
pub fn check_job(job: &Job) -> Result<(), WireError> {
    check_job_spec(&job.spec).map_err(|e| e.at("spec"))?;
    match (&job.placement, job.state.holds_resources()) {
        (None, true) => Err(WireError::invalid("Job", "placement", format!("missing while the job is {}", job.state))),
        (Some(_), false) => {
            Err(WireError::invalid("Job", "placement", format!("present while the job is {}", job.state)))
        }
        (None, false) => Ok(()),
        (Some(p), true) => {
            if p.members.len() != job.spec.members as usize {
                return Err(WireError::invalid(
                    "GangPlacement",
                    "members",
                    format!("{} members, the job has {}", p.members.len(), job.spec.members),
                ));
            }
            if let Some((k, m)) =
                p.members.iter().enumerate().find(|(_, m)| m.gpus.count_ones() != job.spec.gpus_per_member)
            {
                return Err(WireError::invalid(
                    "GangPlacement",
                    "members",
                    format!(
                        "member {k} holds {} GPUs, the job needs {}",
                        m.gpus.count_ones(),
                        job.spec.gpus_per_member
                    ),
                ));
            }
            Ok(())
        }
    }
}
