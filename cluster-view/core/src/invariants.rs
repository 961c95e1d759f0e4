//! An independent checker of the view's invariants.
//!
//! It recomputes what every server should have free from the jobs' placements alone and
//! compares, so it does not trust the bookkeeping it checks. Tests and benchmarks call it;
//! [`check`] returns every violation found, each described in words.

use crate::job::JobState;
use crate::mask::CoreMask;
use crate::view::ClusterView;

/// Counts of what the checker found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Devices held by two or more jobs at once (each extra holder counts once).
    pub double_allocated_devices: u64,
    /// Cores held by two or more jobs at once.
    pub double_allocated_cores: u64,
    /// Jobs whose placement is not whole (wrong member count or GPU count).
    pub partial_gangs: u64,
    /// Descriptions of every violation, including free-mask mismatches.
    pub violations: Vec<String>,
}

impl Report {
    /// True when no invariant is broken.
    pub fn is_clean(&self) -> bool {
        self.violations.is_empty()
    }

    /// Double allocations of devices and cores together.
    pub fn double_allocations(&self) -> u64 {
        self.double_allocated_devices + self.double_allocated_cores
    }
}

/// Checks: no device or core held by two jobs; no two jobs admitted under one request id;
/// gangs whole or absent (a pending job, preempted or re-queued, holds nothing); no job
/// preempted beyond the cluster's bound; jobs hold resources
/// exactly in the states that should; every server's free masks and memory equal its capacity
/// minus what its jobs hold; a cordoned server takes no placements (it is draining or down); a
/// job waiting for others is pending, never placed, and waits only for earlier jobs that have
/// not ended, as the index of waiting jobs says; the index of placed jobs names exactly the jobs
/// that hold a placement; a removed server is held by no job and offers
/// nothing, and no live server belongs to a removed configuration set.
pub fn check(view: &ClusterView) -> Report {
    let mut rep = Report::default();
    let n = view.servers.len();
    let mut held_gpus = vec![0u64; n];
    let mut held_cores = vec![CoreMask::EMPTY; n];
    let mut held_mem = vec![0u64; n];
    let mut requests = std::collections::HashMap::new();
    let mut placed = std::collections::BTreeSet::new();
    for job in view.jobs() {
        if let Some(r) = &job.request
            && let Some(other) = requests.insert(r, job.id)
        {
            rep.violations.push(format!("{} and {other} were admitted under one request id `{r}`", job.id));
        }
        // The view moves jobs down its attained-service queues as its clock passes their marks.
        let attained = view.priorities.service_queue(job.attained_gpu_ms(view.now_ms));
        if attained > job.service_queue {
            rep.violations
                .push(format!("{} attained service queue {attained} but is in queue {}", job.id, job.service_queue));
        }
        let holds = job.state.holds_resources();
        match (&job.placement, holds) {
            (None, true) => rep.violations.push(format!("{} is {} but has no placement", job.id, job.state)),
            (Some(_), false) => rep.violations.push(format!("{} is {} but holds a placement", job.id, job.state)),
            _ => {}
        }
        let Some(p) = &job.placement else { continue };
        placed.insert(job.id);
        if p.members.len() != job.spec.members as usize
            || p.members.iter().any(|m| m.gpus.count_ones() != job.spec.gpus_per_member)
        {
            rep.partial_gangs += 1;
            rep.violations.push(format!("{} holds a partial gang ({} members)", job.id, p.members.len()));
        }
        for m in &p.members {
            let Some(i) = (m.server.index() < n).then_some(m.server.index()) else {
                rep.violations.push(format!("{} holds unknown server {}", job.id, m.server));
                continue;
            };
            let dg = held_gpus[i] & m.gpus;
            if dg != 0 {
                rep.double_allocated_devices += dg.count_ones() as u64;
                rep.violations.push(format!(
                    "{}: devices {} on {} held twice",
                    job.id,
                    crate::mask::format_indices(dg),
                    m.server
                ));
            }
            let dc = held_cores[i].and(m.cores);
            if !dc.is_empty() {
                rep.double_allocated_cores += dc.count() as u64;
                rep.violations.push(format!("{}: cores {} on {} held twice", job.id, dc.format(), m.server));
            }
            held_gpus[i] |= m.gpus;
            held_cores[i] = held_cores[i].or(m.cores);
            held_mem[i] += m.memory_mib as u64;
        }
        if job.state == JobState::Pending && (job.placement.is_some() || !job.tasks.is_empty()) {
            rep.violations.push(format!("{} is pending with a placement or tasks", job.id));
        }
        dependency_violations(view, job, &mut rep);
        if job.preemptions > view.priorities.max_preemptions {
            rep.violations.push(format!(
                "{} was preempted {} times, beyond the bound of {}",
                job.id, job.preemptions, view.priorities.max_preemptions
            ));
        }
    }
    if placed != view.placed {
        rep.violations.push(format!(
            "the index of placed jobs ({} jobs) differs from the jobs holding a placement ({})",
            view.placed.len(),
            placed.len()
        ));
    }
    for (i, r) in view.servers.iter().enumerate() {
        if r.health == crate::Health::Removed {
            // A tombstone: nothing held, nothing offered.
            if held_gpus[i] != 0 || !held_cores[i].is_empty() || held_mem[i] != 0 {
                rep.violations.push(format!("server#{i} was removed but jobs still hold resources on it"));
            }
            if r.free_gpus != 0 || !r.free_cores.is_empty() || r.free_memory_mib != 0 || view.unhealthy[i] != 0 {
                rep.violations.push(format!("server#{i} was removed but its record still offers resources"));
            }
            continue;
        }
        if view.config_sets.get(r.config_set.index()).is_none_or(|cs| cs.removed) {
            rep.violations.push(format!(
                "server#{i} belongs to configuration set {} that does not exist or was removed",
                r.config_set.0
            ));
            continue;
        }
        let t = view.topology_of(r.config_set);
        let want_gpus = t.all_devices() & !held_gpus[i] & !view.unhealthy[i];
        let want_cores = t.all_cores().without(held_cores[i]);
        if held_mem[i] > t.memory_mib as u64 {
            rep.violations.push(format!("server#{i}: jobs hold {} MiB of {} MiB", held_mem[i], t.memory_mib));
        }
        let want_mem = (t.memory_mib as u64).saturating_sub(held_mem[i]);
        if r.free_gpus != want_gpus || r.free_cores != want_cores || r.free_memory_mib as u64 != want_mem {
            rep.violations.push(format!(
                "server#{i}: free state (gpus {}, cores {}, {} MiB) differs from capacity minus holdings (gpus {}, cores {}, {} MiB)",
                crate::mask::format_indices(r.free_gpus),
                r.free_cores.format(),
                r.free_memory_mib,
                crate::mask::format_indices(want_gpus),
                want_cores.format(),
                want_mem
            ));
        }
    }
    quota_counters(view, &mut rep);
    let dependents = crate::dependency::dependents_of(&view.jobs);
    if dependents != view.dependents {
        rep.violations.push(format!(
            "the index of waiting jobs {:?} differs from the jobs' own lists {dependents:?}",
            view.dependents
        ));
    }
    for (s, _) in view.cordons() {
        match view.servers.get(s.index()).map(|r| r.health) {
            None => rep.violations.push(format!("{s} is cordoned but does not exist")),
            Some(crate::Health::Up) => rep.violations.push(format!("{s} is cordoned but takes placements (up)")),
            Some(crate::Health::Removed) => rep.violations.push(format!("{s} is cordoned but was removed")),
            Some(_) => {}
        }
    }
    let most = crate::revocation::MAX_REVOCATIONS;
    if view.revocations.len() > most {
        rep.violations.push(format!("{} revoked credentials kept; at most {most}", view.revocations.len()));
    }
    for (fp, r) in &view.revocations {
        let checked = crate::revocation::check_fingerprint(fp)
            .and_then(|()| crate::revocation::check_text("subject", &r.subject))
            .and_then(|()| crate::revocation::check_text("note", &r.note));
        if let Err(e) = checked {
            rep.violations.push(format!("a revocation the view should have refused is kept: {e}"));
        }
    }
    rep
}

/// What quotas read (GPUs held per tenant, and per tenant and priority) is what the placed
/// jobs hold.
fn quota_counters(view: &ClusterView, rep: &mut Report) {
    use std::collections::{BTreeMap, HashMap};
    let mut tenants: BTreeMap<&str, u32> = BTreeMap::new();
    let mut ranks: BTreeMap<(&str, i32), u32> = BTreeMap::new();
    for j in view.jobs.values().filter(|j| j.placement.is_some()) {
        *tenants.entry(&j.spec.tenant).or_default() += j.spec.total_gpus();
        *ranks.entry((&j.spec.tenant, j.spec.priority)).or_default() += j.spec.total_gpus();
    }
    let counted: BTreeMap<&str, u32> =
        view.tenant_used.iter().filter(|(_, g)| **g > 0).map(|(t, g)| (t.as_str(), *g)).collect();
    if counted != tenants {
        rep.violations.push(format!("GPUs counted per tenant {counted:?} differ from the placed jobs' {tenants:?}"));
    }
    let by_rank: &HashMap<String, BTreeMap<i32, u32>> = &view.rank_used;
    let counted: BTreeMap<(&str, i32), u32> =
        by_rank.iter().flat_map(|(t, by)| by.iter().map(move |(p, g)| ((t.as_str(), *p), *g))).collect();
    if counted != ranks {
        rep.violations
            .push(format!("GPUs counted per tenant and priority {counted:?} differ from the jobs' {ranks:?}"));
    }
}

/// A job that still waits for others is pending and was never placed, and each job it waits
/// for is known and has not ended (an end crosses it off at once).
fn dependency_violations(view: &ClusterView, job: &crate::job::Job, rep: &mut Report) {
    if job.waiting_for.is_empty() {
        return;
    }
    if job.state != JobState::Pending || job.times.placed_ms != 0 || !job.held.is_empty() {
        rep.violations.push(format!("{} is {} and was placed, yet waits for other jobs", job.id, job.state));
    }
    for (dep, _) in &job.waiting_for {
        match view.jobs.get(dep).map(|d| d.state) {
            None => rep.violations.push(format!("{} waits for {dep}, which the view does not know", job.id)),
            Some(s @ (JobState::Finished | JobState::Failed)) => {
                rep.violations.push(format!("{} still waits for {dep}, which ended ({s})", job.id))
            }
            Some(_) if *dep >= job.id => rep.violations.push(format!("{} waits for a later job {dep}", job.id)),
            Some(_) => {}
        }
    }
}
