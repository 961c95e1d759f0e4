//! Validators for core values that arrive from outside (over the wire, from disk).
//!
//! The core types have public fields, so a value built from a decoded message has none of the
//! guarantees that `Topology::from_toml` or `JobSpec::from_toml` give. These functions restore
//! them; every `TryFrom` in [`crate::convert`] calls the one that applies. They never panic.
//!
//! The rules of single values are the core's own ([`Topology::validate`], [`JobSpec::validate`],
//! [`CpuDemand::validate`], [`Predictor::validate`]); this module only names the wire field a
//! broken rule is about. What it checks itself is what spans values: a whole snapshot and a job
//! with its placement.

use crate::error::WireError;
use std::collections::{HashMap, HashSet};
use tessera_view::cluster_spec::MAX_SERVERS;
use tessera_view::mask::format_indices;
use tessera_view::{
    CoreMask, CpuDemand, FieldError, Health, Job, JobId, JobSpec, JobState, Predictor, Topology, ViewSnapshot,
};

const SNAPSHOT: &str = "ViewSnapshot";

/// The fields of each message that a core field path can name. A wire field matches a path
/// segment equal to its last dotted part (`fixed.cores_per_gpu` matches `cores_per_gpu`).
const TOPOLOGY_FIELDS: &[&str] =
    &["name", "device_type", "devices", "sockets", "pcie_switches", "nvlink_groups", "cores_per_socket", "memory_mib"];
const JOB_SPEC_FIELDS: &[&str] = &[
    "name",
    "tenant",
    "gpu_type",
    "members",
    "gpus_per_member",
    "prefer",
    "tolerate",
    "relax_after_s",
    "slowdown",
    "cpu",
    "memory_mib_per_gpu",
    "priority",
    "command",
    "env",
    "workdir",
    "time_limit_s",
    "restart.max",
    "restart.backoff_s",
    "stop_grace_s",
    "after",
    "after_any",
    "array",
    "model",
];
const CPU_DEMAND_FIELDS: &[&str] = &["fixed.cores_per_gpu", "predicted.predictor", "predicted.min_cores_per_gpu"];
const PREDICTOR_FIELDS: &[&str] = &["p0", "p1", "p2", "theta"];

/// The wire field of `fields` that a core field path names: the last segment of the path that
/// matches one (`sockets[1].pcie_switches[0]` names `pcie_switches`, `locality.slowdown.rack`
/// names `slowdown`, `predictor.theta` names `predicted.predictor`).
fn wire_field(path: &str, fields: &[&'static str]) -> Option<&'static str> {
    path.split(['.', '[']).rev().find_map(|seg| fields.iter().copied().find(|f| f.rsplit('.').next() == Some(seg)))
}

/// A broken core rule as a [`WireError`] of `message`: [`WireError::OutOfRange`] where `value`
/// gives the offending number for the wire field, [`WireError::Invalid`] otherwise, and
/// [`WireError::Rule`] where the path names none of `fields`. The core's path leads `why` when it
/// says more than the wire field (an index, a level, a nested field).
fn from_core(
    message: &'static str,
    fields: &[&'static str],
    e: FieldError,
    value: impl FnOnce(&'static str, &str) -> Option<u64>,
) -> WireError {
    let Some(field) = wire_field(&e.field, fields) else {
        return WireError::Rule { message, path: e.field, why: e.message };
    };
    let value = value(field, &e.field);
    let why = if field.rsplit('.').next() == Some(e.field.as_str()) {
        e.message
    } else {
        format!("{}: {}", e.field, e.message)
    };
    match value {
        Some(v) => WireError::out_of_range(message, field, v, why),
        None => WireError::invalid(message, field, why),
    }
}

/// Checks a topology with [`Topology::validate`]. Counts out of range, and device groups naming
/// devices the server does not have, are [`WireError::OutOfRange`] (a group's value is its mask).
pub fn check_topology(t: &Topology) -> Result<(), WireError> {
    t.validate().map_err(|e| {
        from_core("Topology", TOPOLOGY_FIELDS, e, |field, path| match field {
            "devices" => Some(t.devices.into()),
            "cores_per_socket" => Some(t.cores_per_socket.into()),
            "memory_mib" => Some(t.memory_mib.into()),
            _ => t.group_at(path).filter(|g| g & !t.all_devices() != 0),
        })
    })
}

/// Checks a job spec with [`JobSpec::validate`]; counts out of range are
/// [`WireError::OutOfRange`].
pub fn check_job_spec(s: &JobSpec) -> Result<(), WireError> {
    s.validate().map_err(|e| {
        from_core("JobSpec", JOB_SPEC_FIELDS, e, |field, _| match field {
            "members" => Some(s.members.into()),
            "gpus_per_member" => Some(s.gpus_per_member.into()),
            "relax_after_s" => s.relax_after_s,
            "memory_mib_per_gpu" => s.memory_mib_per_gpu.map(u64::from),
            "time_limit_s" => s.run.time_limit_s,
            "restart.max" => s.run.restart.map(|r| u64::from(r.max)),
            "restart.backoff_s" => s.run.restart.map(|r| r.backoff_s),
            "stop_grace_s" => s.run.stop_grace_s,
            "array" => s.array.map(u64::from),
            _ => None,
        })
    })
}

/// Checks a CPU demand with [`CpuDemand::validate`]; core counts out of range are
/// [`WireError::OutOfRange`].
pub fn check_cpu_demand(c: &CpuDemand) -> Result<(), WireError> {
    c.validate().map_err(|e| {
        from_core("CpuDemand", CPU_DEMAND_FIELDS, e, |field, _| match (field, *c) {
            ("fixed.cores_per_gpu", CpuDemand::Fixed { cores_per_gpu }) => Some(cores_per_gpu.into()),
            ("predicted.min_cores_per_gpu", CpuDemand::Predicted { min_cores_per_gpu, .. }) => {
                Some(min_cores_per_gpu.into())
            }
            _ => None,
        })
    })
}

/// Checks a predictor with [`Predictor::validate`].
pub fn check_predictor(p: &Predictor) -> Result<(), WireError> {
    p.validate().map_err(|e| from_core("Predictor", PREDICTOR_FIELDS, e, |_, _| None))
}

/// Jobs waiting for others (the invariant checker, which the `wire_snapshot` fuzz target runs on
/// every restored view, holds a view to the same): a waiting job is pending and was never placed, and waits, once each,
/// for earlier jobs of the snapshot that have not ended.
fn check_waiting(s: &ViewSnapshot) -> Result<(), WireError> {
    let states: HashMap<JobId, JobState> = s.jobs.iter().map(|j| (j.id, j.state)).collect();
    for (i, job) in s.jobs.iter().enumerate().filter(|(_, j)| !j.waiting_for.is_empty()) {
        let bad = |why: String| WireError::invalid("Job", "waiting_for", why).at(format!("jobs[{i}]"));
        if job.times.placed_ms != 0 || !job.held.is_empty() {
            return Err(bad(format!("{} was placed, yet waits for other jobs", job.id)));
        }
        let mut seen = HashSet::with_capacity(job.waiting_for.len());
        for (dep, _) in &job.waiting_for {
            if !seen.insert(*dep) {
                return Err(bad(format!("{dep} is listed twice")));
            }
            match states.get(dep) {
                _ if *dep >= job.id => return Err(bad(format!("{dep} is not earlier than {}", job.id))),
                None => return Err(bad(format!("{dep} is not in the snapshot"))),
                Some(JobState::Finished | JobState::Failed) => return Err(bad(format!("{dep} has ended"))),
                Some(_) => {}
            }
        }
    }
    Ok(())
}

/// Checks a whole snapshot, so that `ClusterView::from_snapshot` on it gives a view whose
/// invariants hold (and whose operations cannot trip the view's internal assertions).
///
/// Checks every topology and job spec; that configuration set ids equal their index and every
/// table index is in range; one unique name per server that is not removed, no live server in a
/// removed configuration set, and at most `MAX_SERVERS` servers; job ids
/// unique and below `next_job`; placements present exactly while a job holds resources, whole
/// (one member per gang member, each with `gpus_per_member` GPUs), on existing servers, within
/// their topologies, with unique proposal ids; no device or core held twice; every server's
/// free devices, cores and memory equal to its capacity minus what its jobs hold (nothing, held or
/// free, on a removed server); jobs wait only for earlier jobs that have not ended; and class
/// quotas name well-formed tenants and classes the snapshot has, at most `MAX_CLASS_QUOTAS`.
pub fn check_snapshot(s: &ViewSnapshot) -> Result<(), WireError> {
    let mut class_quotas = 0usize;
    for (tenant, classes) in &s.class_quotas {
        for class in classes.keys() {
            let bad = |why: String| WireError::invalid(SNAPSHOT, "class_quotas", why);
            tessera_view::policy::check_name("tenant", tenant).map_err(|e| bad(e.to_string()))?;
            if !s.priorities.classes.contains_key(class) {
                return Err(bad(format!("tenant `{tenant}` has a quota at class `{class}`, which the snapshot lacks")));
            }
            class_quotas += 1;
        }
    }
    if class_quotas > tessera_view::policy::MAX_CLASS_QUOTAS {
        let most = tessera_view::policy::MAX_CLASS_QUOTAS;
        return Err(WireError::out_of_range(SNAPSHOT, "class_quotas", class_quotas as u64, format!("at most {most}")));
    }
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
    // A name names one server that is not removed; tombstones may share it (a removed server's
    // name may be given to a later one).
    // A live server is the last of its name, as the view maps names.
    let mut last_of: HashMap<&str, usize> = HashMap::with_capacity(s.server_names.len());
    for (i, n) in s.server_names.iter().enumerate() {
        last_of.insert(n.as_str(), i);
    }
    for (i, (n, r)) in s.server_names.iter().zip(&s.servers).enumerate() {
        if r.health != Health::Removed && last_of.get(n.as_str()) != Some(&i) {
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
        if cs.removed && r.health != Health::Removed {
            return Err(at(WireError::invalid(
                "ServerRecord",
                "config_set",
                format!("configuration set `{}` was removed, yet the server is {}", cs.name, r.health),
            )));
        }
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
        // Found by the `wire_snapshot` fuzz target: the invariant checker holds a view to it.
        if job.preemptions > s.priorities.max_preemptions {
            let bound = format!("the cluster preempts a job at most {} times", s.priorities.max_preemptions);
            return Err(at(WireError::out_of_range("Job", "preemptions", u64::from(job.preemptions), bound)));
        }
        if job.id.0 >= s.next_job {
            return Err(at(WireError::out_of_range("Job", "id", job.id.0, format!("next_job is {}", s.next_job))));
        }
        if !job_ids.insert(job.id) {
            return Err(at(WireError::invalid("Job", "id", format!("{} appears twice", job.id))));
        }
        for p in &job.proposals {
            if !proposals.insert(*p) {
                return Err(at(WireError::invalid("Job", "proposals", format!("{p} was applied for two jobs"))));
            }
        }
        let Some(p) = &job.placement else { continue };
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
    check_waiting(s)?;
    if !s.unhealthy.is_empty() && s.unhealthy.len() != n {
        return Err(WireError::invalid(
            SNAPSHOT,
            "unhealthy",
            format!("{} entries for {n} servers", s.unhealthy.len()),
        ));
    }
    for (i, r) in s.servers.iter().enumerate() {
        let t = topo_of[i];
        let unhealthy = s.unhealthy.get(i).copied().unwrap_or(0);
        if unhealthy & !t.all_devices() != 0 {
            return Err(WireError::out_of_range(
                SNAPSHOT,
                "unhealthy",
                unhealthy,
                format!("server {i} has {} devices", t.devices),
            ));
        }
        let removed = r.health == Health::Removed;
        if removed && unhealthy != 0 {
            return Err(WireError::invalid(
                SNAPSHOT,
                "unhealthy",
                format!("server {i} was removed yet has unhealthy devices"),
            ));
        }
        // A removed server is held by no job and offers nothing.
        let (want_gpus, want_cores, want_mem) = if removed {
            let held = held_gpus[i] != 0 || !held_cores[i].is_empty() || held_mem[i] != 0;
            (0, CoreMask::EMPTY, (!held).then_some(0))
        } else {
            (
                t.all_devices() & !held_gpus[i] & !unhealthy,
                t.all_cores().without(held_cores[i]),
                u64::from(t.memory_mib).checked_sub(held_mem[i]),
            )
        };
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
                    want_mem
                        .map_or_else(|| "over-committed or held on a removed server".to_string(), |m| m.to_string()),
                ),
            )
            .at(format!("servers[{i}]")));
        }
    }
    let state_of: std::collections::HashMap<JobId, JobState> = s.jobs.iter().map(|j| (j.id, j.state)).collect();
    let mut ended = HashSet::with_capacity(s.ended.len());
    for (i, id) in s.ended.iter().enumerate() {
        let job = state_of.get(id).map(|&state| (id, state));
        if !ended.insert(*id) || !job.is_some_and(|(_, st)| matches!(st, JobState::Finished | JobState::Failed)) {
            return Err(WireError::invalid(
                SNAPSHOT,
                "ended",
                format!("ended[{i}] = {id} is repeated, unknown or not an ended job"),
            ));
        }
    }
    if let Some(j) =
        s.jobs.iter().find(|j| matches!(j.state, JobState::Finished | JobState::Failed) && !ended.contains(&j.id))
    {
        return Err(WireError::invalid(SNAPSHOT, "ended", format!("{} has ended but is not listed", j.id)));
    }
    // Cordons and histories: of existing servers, in server order, each server once; a
    // cordoned server takes no placements.
    let mut last = None;
    for (i, (id, _)) in s.cordons.iter().enumerate() {
        let at = |why: String| WireError::invalid("Cordon", "server", why).at(format!("cordons[{i}]"));
        match s.servers.get(id.index()) {
            None => return Err(at(format!("{id} does not exist ({n} servers)"))),
            Some(r) if r.health == Health::Up => return Err(at(format!("{id} is cordoned but up"))),
            Some(r) if r.health == Health::Removed => return Err(at(format!("{id} is cordoned but removed"))),
            Some(_) => {}
        }
        if last.is_some_and(|l| l >= *id) {
            return Err(at(format!("{id} is out of order or repeated")));
        }
        last = Some(*id);
    }
    let mut last = None;
    for (i, (id, _)) in s.health_history.iter().enumerate() {
        let at = |why: String| WireError::invalid("ServerHistory", "server", why).at(format!("health_history[{i}]"));
        if id.index() >= n {
            return Err(at(format!("{id} does not exist ({n} servers)")));
        }
        if last.is_some_and(|l| l >= *id) {
            return Err(at(format!("{id} is out of order or repeated")));
        }
        last = Some(*id);
    }
    Ok(())
}

/// Checks a job on its own: its spec (see [`check_job_spec`]), a placement present exactly while
/// its state holds resources, and a whole gang (one member per gang member, each with
/// `gpus_per_member` GPUs, at most `MAX_MEMBERS`).
pub fn check_job(job: &Job) -> Result<(), WireError> {
    check_job_spec(&job.spec).map_err(|e| e.at("spec"))?;
    // A job restarts only as far as its policy allows.
    let allowed = job.spec.run.restart.map_or(0, |r| r.max);
    if job.restarts > allowed {
        let bound = format!("its restart policy allows {allowed}");
        return Err(WireError::out_of_range("Job", "restarts", u64::from(job.restarts), bound));
    }
    // An array member's index lies within its array; a job submitted alone has none.
    match (job.array_index, job.spec.array) {
        (Some(i), Some(n)) if i >= n => {
            return Err(WireError::out_of_range("Job", "array_index", u64::from(i), format!("its array has {n} jobs")));
        }
        (Some(_), None) => return Err(WireError::invalid("Job", "array_index", "set on a job submitted alone")),
        // Ids start at 1: the array's first job is `id - index`.
        (Some(i), Some(_)) if u64::from(i) >= job.id.0 => {
            let bound = format!("its array's first job would be id {} - {i}", job.id.0);
            return Err(WireError::out_of_range("Job", "array_index", u64::from(i), bound));
        }
        _ => {}
    }
    // Only a pending job waits for others (a placed one waited already).
    if !job.waiting_for.is_empty() && job.state != tessera_view::JobState::Pending {
        return Err(WireError::invalid("Job", "waiting_for", format!("not empty while the job is {}", job.state)));
    }
    match (&job.placement, job.state.holds_resources()) {
        (None, true) => Err(WireError::invalid("Job", "placement", format!("missing while the job is {}", job.state))),
        (Some(_), false) => {
            Err(WireError::invalid("Job", "placement", format!("present while the job is {}", job.state)))
        }
        (None, false) => Ok(()),
        (Some(p), true) => {
            if !job.tasks.is_empty() && job.tasks.len() != p.members.len() {
                return Err(WireError::invalid(
                    "Job",
                    "tasks",
                    format!("{} task states for {} members", job.tasks.len(), p.members.len()),
                ));
            }
            if job.proposals.last() != Some(&p.proposal) {
                return Err(WireError::invalid(
                    "Job",
                    "proposals",
                    format!("the placement's {} is not the last applied proposal", p.proposal),
                ));
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_view::LocalityLevel;

    #[test]
    fn core_paths_name_wire_fields() {
        assert_eq!(wire_field("sockets[1].pcie_switches[0]", TOPOLOGY_FIELDS), Some("pcie_switches"));
        assert_eq!(wire_field("sockets[1]", TOPOLOGY_FIELDS), Some("sockets"));
        assert_eq!(wire_field("locality.slowdown.rack", JOB_SPEC_FIELDS), Some("slowdown"));
        assert_eq!(wire_field("cpu.predictor.theta", JOB_SPEC_FIELDS), Some("cpu"));
        assert_eq!(wire_field("predictor.theta", CPU_DEMAND_FIELDS), Some("predicted.predictor"));
        assert_eq!(wire_field("cores_per_gpu", CPU_DEMAND_FIELDS), Some("fixed.cores_per_gpu"));
        assert_eq!(wire_field("bogus.path", TOPOLOGY_FIELDS), None);
        let e = from_core("Topology", TOPOLOGY_FIELDS, FieldError::new("bogus[2]", "broken"), |_, _| Some(1));
        assert_eq!(e, WireError::Rule { message: "Topology", path: "bogus[2]".into(), why: "broken".into() });
        assert_eq!(e.to_string(), "Topology: field `bogus[2]`: broken");
    }

    #[test]
    fn core_rules_become_wire_errors() {
        let mut t = Topology::preset("seed-8gpu").expect("preset");
        t.pcie_switches[3] = 0b1110_0000;
        let e = check_topology(&t).expect_err("overlap");
        assert!(
            matches!(&e, WireError::Invalid { message: "Topology", field: "pcie_switches", why }
            if why.starts_with("sockets[1].pcie_switches[1]: device 5 is in two groups")),
            "{e}"
        );
        t.pcie_switches[3] = 0b1100_0000 | 1 << 9;
        t.sockets[1] |= 1 << 9;
        let e = check_topology(&t).expect_err("out of range");
        assert!(matches!(e, WireError::OutOfRange { field: "pcie_switches", value: 0x2C0, .. }), "{e}");

        let mut s = JobSpec::simple("x", 1, 1);
        s.prefer = LocalityLevel::Socket;
        s.tolerate = LocalityLevel::PcieSwitch;
        let e = check_job_spec(&s).expect_err("tighter");
        assert!(matches!(e, WireError::Invalid { field: "tolerate", .. }) && e.to_string().contains("tighter"), "{e}");
        s.tolerate = LocalityLevel::Any;
        s.relax_after_s = Some(0);
        assert!(matches!(check_job_spec(&s), Err(WireError::OutOfRange { field: "relax_after_s", value: 0, .. })));
        s.relax_after_s = None;
        s.cpu = CpuDemand::Fixed { cores_per_gpu: 0 };
        let e = check_job_spec(&s).expect_err("no cores");
        assert_eq!(e.to_string(), "JobSpec.cpu: cpu.cores_per_gpu: must be 1..=128, got 0");
        let e = check_cpu_demand(&s.cpu).expect_err("no cores");
        assert!(matches!(e, WireError::OutOfRange { field: "fixed.cores_per_gpu", value: 0, .. }), "{e}");
        let p = Predictor { p0: 1.0, p1: 0.0, p2: 1.0, theta: 4.0 };
        let e = check_cpu_demand(&CpuDemand::Predicted { predictor: p, min_cores_per_gpu: 5 }).expect_err("min");
        assert!(matches!(e, WireError::OutOfRange { field: "predicted.min_cores_per_gpu", value: 5, .. }), "{e}");
        let e = check_predictor(&Predictor { p2: f64::NAN, ..p }).expect_err("nan");
        assert_eq!(e.to_string(), "Predictor.p2: must be a finite number, got NaN");
    }
}
