//! Job dependencies (`after`, `after_any`) and arrays in the world: what a submission names, the
//! oracle of what it must wait for (or why it is refused), and the properties that hold after
//! every command. Written from the documented rules (`tessera_view::dependency`), not from its
//! code.

use super::*;

/// Sometimes names earlier jobs (known, ended, or never submitted) in `after` / `after_any`,
/// and sometimes makes the submission an array of 2 or 3. Draws from its own stream, so the
/// scenario's other draws are as they were.
pub(crate) fn add_dependencies(rng: &mut SmallRng, view: &ClusterView, spec: &mut JobSpec) {
    if rng.random_ratio(1, 8) {
        spec.array = Some(rng.random_range(2..=3));
    }
    if !rng.random_ratio(1, 4) {
        return;
    }
    let known: Vec<JobId> = view.jobs().iter().map(|j| j.id).collect();
    let pick = |rng: &mut SmallRng| match rng.random_range(0..12) {
        // Never submitted: the submission is refused.
        0 => JobId(known.iter().map(|j| j.0).max().unwrap_or(0) + rng.random_range(1..5)),
        _ => known.choose(rng).copied().unwrap_or(JobId(1)),
    };
    let mut named = BTreeSet::new();
    for _ in 0..rng.random_range(1..=2) {
        let j = pick(rng);
        if named.insert(j) {
            spec.after.push(j);
        }
    }
    if rng.random_bool(0.4) {
        let j = pick(rng);
        if named.insert(j) {
            spec.after_any.push(j);
        }
    }
}

/// The jobs a job named `dep` stands for: an array's first job, every member of its array;
/// otherwise itself. When `dep` is forgotten, its members still kept are those whose array
/// starts at `dep`.
fn members_of(view: &ClusterView, dep: JobId) -> Vec<JobId> {
    match view.job(dep) {
        Some(j) if j.array_index == Some(0) => {
            (dep.0..dep.0 + u64::from(j.spec.array.unwrap_or(1))).map(JobId).collect()
        }
        Some(_) => vec![dep],
        None => std::iter::once(dep)
            .chain(view.jobs().iter().filter(|j| j.array_first() == Some(dep) && j.id != dep).map(|j| j.id))
            .collect(),
    }
}

/// What a job admitted now with `spec` must wait for, in id order, each with whether it must
/// finish; or the field of the refusal: a named job never submitted, an `after` job (or member
/// of a named array) that failed, or that was forgotten (only ended jobs are: whether it
/// finished is not known). A forgotten `after_any` job has ended: nothing to wait for.
pub(crate) fn expected_waiting(view: &ClusterView, spec: &JobSpec) -> Result<Vec<(JobId, bool)>, &'static str> {
    let next_job = view.snapshot().next_job;
    let mut waiting: BTreeMap<JobId, bool> = BTreeMap::new();
    for (named, must_finish, field) in
        spec.after.iter().map(|j| (*j, true, "after")).chain(spec.after_any.iter().map(|j| (*j, false, "after_any")))
    {
        if named.0 >= next_job {
            return Err(field);
        }
        for m in members_of(view, named) {
            match view.job(m).map(|j| j.state) {
                None if must_finish => return Err(field),
                None => {}
                Some(JobState::Finished) => {}
                Some(JobState::Failed) if must_finish => return Err(field),
                Some(JobState::Failed) => {}
                Some(_) => *waiting.entry(m).or_default() |= must_finish,
            }
        }
    }
    Ok(waiting.into_iter().collect())
}

/// After every command: a job placed (now or ever) or finished was placed only after every job
/// it named had ended, and had finished where it named them in `after`; a job whose `after` job
/// failed has failed too; a pending job's `waiting_for` lists exactly the named jobs still live.
pub(crate) fn check(view: &ClusterView) -> Result<()> {
    for j in view.jobs() {
        let was_placed = j.times.placed_ms > 0 || j.placement.is_some() || j.state == JobState::Finished;
        let mut live = BTreeSet::new();
        for (named, must_finish) in j.spec.dependencies() {
            for m in members_of(view, named) {
                // Forgotten (ended long ago): nothing left to check.
                let Some(d) = view.job(m) else { continue };
                let ended = matches!(d.state, JobState::Finished | JobState::Failed);
                if was_placed {
                    ensure!(ended, "{} was placed while {m}, which it waits for, is {}", j.id, d.state);
                    ensure!(
                        !must_finish || d.state == JobState::Finished,
                        "{} was placed after {m}, which it needed finished, {}",
                        j.id,
                        d.state
                    );
                }
                if must_finish && d.state == JobState::Failed {
                    ensure!(j.state == JobState::Failed, "{m} failed, yet {}, after it, is {}", j.id, j.state);
                }
                if !ended {
                    live.insert(m);
                }
            }
        }
        if j.state == JobState::Pending {
            let waits: BTreeSet<JobId> = j.waiting_for.iter().map(|(d, _)| *d).collect();
            ensure!(waits == live, "{} waits for {waits:?}, the jobs it named still live are {live:?}", j.id);
        } else {
            ensure!(j.waiting_for.is_empty(), "{} is {} and still waits for {:?}", j.id, j.state, j.waiting_for);
        }
    }
    Ok(())
}
