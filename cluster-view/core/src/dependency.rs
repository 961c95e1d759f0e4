//! Job dependencies (`after`, `after_any`) and arrays, as the view keeps them.
//!
//! A job admitted with dependencies keeps the jobs it still waits for in
//! [`Job::waiting_for`], resolved once at admission: an array's first job stands for every
//! member, a job that already finished (or, for `after_any`, ended at all, forgotten ones
//! included) is not waited for, and a job never submitted, or a failed or forgotten `after`
//! job, refuses the submission (it could never start, or might not).
//! The approver refuses to place a job that still waits ([`crate::Rejection::DependencyPending`]).
//! When a job ends, each job waiting for it crosses it off; the last one crossed off stamps
//! [`Job::ready_ms`] (its wait for a placement counts from there). A failed or cancelled `after`
//! job fails the jobs waiting for it, in the same command, down the whole chain. Everything is
//! decided on the replicated state alone, so every replica crosses off and fails the same jobs
//! in the same order (the reverse index is rebuilt in job-id order from a snapshot, the order
//! it is built in as jobs are admitted).
//!
//! No cycle can form: a job may only wait for jobs admitted before it.

use crate::error::{FieldError, ViewError};
use crate::ids::JobId;
use crate::job::{Job, JobSpec, JobState, MAX_ARRAY};
use crate::view::{Change, ClusterView, MAX_ERROR_CHARS};
use std::collections::{BTreeMap, HashMap};

/// The live jobs waiting for each job, in id order: the reverse of [`Job::waiting_for`].
pub(crate) fn dependents_of(jobs: &HashMap<JobId, Job>) -> HashMap<JobId, Vec<JobId>> {
    let mut waiting: Vec<&Job> = jobs.values().filter(|j| !j.waiting_for.is_empty()).collect();
    waiting.sort_by_key(|j| j.id);
    let mut dependents: HashMap<JobId, Vec<JobId>> = HashMap::new();
    for j in waiting {
        for (dep, _) in &j.waiting_for {
            dependents.entry(*dep).or_default().push(j.id);
        }
    }
    dependents
}

impl ClusterView {
    /// The jobs `spec` still has to wait for, in id order, each with whether it must finish
    /// (`after`) rather than merely end (`after_any`); an array's first job stands for the
    /// whole array. A job the view has forgotten has ended (only ended jobs are forgotten): for
    /// `after_any` there is nothing to wait for, for `after` whether it finished is not known.
    /// Refused: a job never submitted, an `after` job that failed (this one could never start)
    /// or was forgotten.
    pub(crate) fn dependencies_of(&self, spec: &JobSpec) -> Result<Vec<(JobId, bool)>, ViewError> {
        let mut waiting: BTreeMap<JobId, bool> = BTreeMap::new();
        for (dep, must_finish) in spec.dependencies() {
            let field = if must_finish { "after" } else { "after_any" };
            let refuse = |why: String| ViewError::InvalidSpec(FieldError::new(field, why));
            if dep.0 >= self.next_job {
                return Err(refuse(format!("{dep} was never submitted")));
            }
            for m in self.named_members(dep) {
                let Some(j) = self.jobs.get(&m) else {
                    if must_finish {
                        return Err(refuse(format!(
                            "{m} ended long enough ago to be forgotten, so whether it finished is not known; name it in `after_any` to start after any end"
                        )));
                    }
                    continue;
                };
                match j.state {
                    JobState::Finished => {}
                    JobState::Failed if !must_finish => {}
                    JobState::Failed => {
                        return Err(refuse(format!(
                            "{m} failed ({}), so a job after it could never start; name it in `after_any` to start after any end",
                            j.error.as_deref().unwrap_or("no reason kept")
                        )));
                    }
                    _ => *waiting.entry(m).or_default() |= must_finish,
                }
            }
        }
        Ok(waiting.into_iter().collect())
    }

    /// The jobs `dep` names (submitted before): itself, and when it is an array's first job,
    /// every member. If it was forgotten, the members still kept are found by their first id
    /// (members have consecutive ids, at most [`MAX_ARRAY`] of them).
    fn named_members(&self, dep: JobId) -> Vec<JobId> {
        let size = match self.jobs.get(&dep) {
            Some(j) if j.array_index == Some(0) => j.spec.array.unwrap_or(1),
            Some(_) => 1,
            None => {
                let end = dep.0.saturating_add(u64::from(MAX_ARRAY)).min(self.next_job);
                let kept = (dep.0 + 1..end)
                    .map(JobId)
                    .filter(|m| self.jobs.get(m).is_some_and(|j| j.array_first() == Some(dep)));
                return std::iter::once(dep).chain(kept).collect();
            }
        };
        (dep.0..dep.0.saturating_add(u64::from(size))).map(JobId).collect()
    }

    /// Settles the jobs waiting for `job`, which just ended in `state`: each crosses it off (the
    /// last one crossed off makes it ready, stamping [`Job::ready_ms`]); one that needed it to
    /// finish fails, and is pushed on `ending` for its own waiters. `waited` is what `job`
    /// itself still waited for (a job cancelled while waiting): it leaves those lists.
    pub(crate) fn settle_dependents(
        &mut self,
        job: JobId,
        state: JobState,
        waited: Vec<(JobId, bool)>,
        ending: &mut Vec<(JobId, JobState)>,
    ) {
        for (dep, _) in waited {
            if let Some(v) = self.dependents.get_mut(&dep) {
                v.retain(|d| *d != job);
                if v.is_empty() {
                    self.dependents.remove(&dep);
                }
            }
        }
        let failed_with = self.jobs.get(&job).and_then(|j| j.error.clone()).unwrap_or_default();
        for d in self.dependents.remove(&job).unwrap_or_default() {
            let now_ms = self.now_ms;
            let Some(dj) = self.jobs.get_mut(&d) else { continue };
            let Some(at) = dj.waiting_for.iter().position(|(x, _)| *x == job) else { continue };
            let (_, must_finish) = dj.waiting_for.remove(at);
            if must_finish && state == JobState::Failed {
                let why = format!("{job}, which it waited for, failed: {failed_with}");
                dj.error = Some(why.chars().take(MAX_ERROR_CHARS).collect());
                ending.push((d, JobState::Failed));
            } else {
                if dj.waiting_for.is_empty() {
                    dj.ready_ms = now_ms;
                }
                self.note(Change::Job(d));
            }
        }
    }
}

#[cfg(test)]
mod tests;
