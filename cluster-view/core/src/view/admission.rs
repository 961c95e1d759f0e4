//! Admission: a job spec checked, its class resolved and its dependencies named, then
//! admitted as pending or refused with the reason it can never fit ([`ClusterView::submit`]
//! and its variants, [`ClusterView::never_fits`]). Idempotent on a client's request id.

use super::*;

impl ClusterView {
    /// Admits a job as pending, or refuses it with the reason it can never fit.
    pub fn submit(&mut self, spec: JobSpec) -> Result<JobId, ViewError> {
        self.admit(spec, None, "", None)
    }

    /// Admits a job at most once per request id: a retry under an id the view remembers (its
    /// job is live or among the ended jobs kept) is answered with that job and changes nothing;
    /// the same id with another spec is refused ([`ViewError::RequestReused`]).
    pub fn submit_once(&mut self, spec: &JobSpec, request: Option<&RequestId>) -> Result<JobId, ViewError> {
        self.submit_as(spec, request, None)
    }

    /// [`ClusterView::submit_once`] on behalf of `user` (kept as [`Job::user`]).
    pub fn submit_as(
        &mut self,
        spec: &JobSpec,
        request: Option<&RequestId>,
        user: Option<&str>,
    ) -> Result<JobId, ViewError> {
        self.submit_traced(spec, request, user, None)
    }

    /// [`ClusterView::submit_as`], the job (each member of an array) recorded under `trace`.
    pub fn submit_traced(
        &mut self,
        spec: &JobSpec,
        request: Option<&RequestId>,
        user: Option<&str>,
        trace: Option<crate::JobTrace>,
    ) -> Result<JobId, ViewError> {
        let spec = self.with_class_resolved(spec.clone())?;
        if let Some(r) = request
            && let Some(&job) = self.requests.get(r)
        {
            // An array answers with its first id, whichever member keeps the request.
            return match self.jobs.get(&job) {
                Some(j) if j.spec == spec => Ok(j.array_first().unwrap_or(job)),
                Some(j) => {
                    Err(ViewError::RequestReused { request: r.to_string(), job: j.array_first().unwrap_or(job) })
                }
                None => Err(ViewError::RequestReused { request: r.to_string(), job }),
            };
        }
        self.admit(spec, request.cloned(), user.unwrap_or(""), trace)
    }

    /// The job admitted under `request`, while it is remembered (an array's first id, while
    /// any member is).
    pub fn job_of_request(&self, request: &RequestId) -> Option<JobId> {
        let job = *self.requests.get(request)?;
        Some(self.jobs.get(&job).and_then(Job::array_first).unwrap_or(job))
    }

    /// `spec` with its priority set from its class, if it names one (unknown: refused).
    fn with_class_resolved(&self, mut spec: JobSpec) -> Result<JobSpec, ViewError> {
        if let Some(class) = &spec.class {
            spec.priority = self.priorities.resolve(class).map_err(ViewError::NeverFits)?;
        }
        Ok(spec)
    }

    fn admit(
        &mut self,
        spec: JobSpec,
        request: Option<RequestId>,
        user: &str,
        trace: Option<crate::JobTrace>,
    ) -> Result<JobId, ViewError> {
        let spec = self.with_class_resolved(spec)?;
        spec.validate().map_err(ViewError::InvalidSpec)?;
        let key = ShapeKey::of(&spec);
        let verdict = match self.fit_memo.get(&key) {
            Some(v) => v.clone(),
            None => {
                let v = self.never_fits(&spec);
                if self.fit_memo.len() >= FIT_MEMO_CAP {
                    self.fit_memo.clear();
                }
                self.fit_memo.insert(key, v.clone());
                v
            }
        };
        if let Some(why) = verdict {
            return Err(ViewError::NeverFits(why));
        }
        let waiting_for = self.dependencies_of(&spec)?;
        let count = spec.array.unwrap_or(1);
        let first = JobId(self.next_job);
        self.next_job =
            self.next_job.checked_add(u64::from(count)).ok_or(ViewError::NeverFits("job ids are exhausted".into()))?;
        self.bump();
        for index in 0..count {
            let id = JobId(first.0 + u64::from(index));
            for (dep, _) in &waiting_for {
                self.dependents.entry(*dep).or_default().push(id);
            }
            self.jobs.insert(
                id,
                Job {
                    id,
                    spec: spec.clone(),
                    state: JobState::Pending,
                    placement: None,
                    submitted_at: self.version,
                    proposals: Vec::new(),
                    tasks: Vec::new(),
                    error: None,
                    request: if index == 0 { request.clone() } else { None },
                    preemptions: 0,
                    service_queue: 0,
                    user: user.to_string(),
                    times: JobTimes { submitted_ms: self.now_ms, ..JobTimes::default() },
                    held: Vec::new(),
                    restarts: 0,
                    not_before_ms: 0,
                    waiting_for: waiting_for.clone(),
                    ready_ms: 0,
                    array_index: spec.array.map(|_| index),
                    cancel_grace_s: None,
                    trace,
                },
            );
            self.note(Change::Job(id));
        }
        if let Some(r) = request {
            self.requests.insert(r, first);
        }
        Ok(first)
    }

    /// Why `spec` could never be placed on this cluster even if it were empty, if so.
    pub fn never_fits(&self, spec: &JobSpec) -> Option<String> {
        if let Err(e) = spec.validate() {
            return Some(e.to_string());
        }
        let g = spec.gpus_per_member;
        let total = spec.total_gpus();
        if let Some(q) = self.quotas.get(&spec.tenant)
            && total > *q
        {
            return Some(format!("{total} GPUs exceed tenant `{}`'s quota of {q}", spec.tenant));
        }
        if let Some((class, _, q)) = self.class_limits(&spec.tenant, spec.priority).find(|l| total > l.2) {
            return Some(format!(
                "{total} GPUs exceed tenant `{}`'s quota of {q} at class `{class}` and above",
                spec.tenant
            ));
        }
        let typed = |cs: &ConfigSet| {
            let t = &self.topologies[cs.topology as usize];
            spec.gpu_type.as_ref().is_none_or(|want| *want == t.device_type)
        };
        // Members of this job one server of `cs` can host at once (devices, cores, memory).
        let per_server = |cs: &ConfigSet| -> u64 {
            let t = &self.topologies[cs.topology as usize];
            let req = fit::member_request(spec, t);
            let by_gpus = (t.devices / g) as u64;
            let by_cores = t.cores().checked_div(req.min_cores).map_or(u64::MAX, u64::from);
            let by_mem = t.memory_mib.checked_div(req.memory_mib).map_or(u64::MAX, u64::from);
            by_gpus.min(by_cores).min(by_mem)
        };
        let candidates: Vec<&ConfigSet> = self.config_sets.iter().filter(|cs| !cs.removed && typed(cs)).collect();
        if candidates.is_empty() {
            let ty = spec.gpu_type.as_deref().unwrap_or("any");
            return Some(format!("no server has GPU type `{ty}`"));
        }
        let usable: Vec<&ConfigSet> = candidates.into_iter().filter(|cs| per_server(cs) > 0).collect();
        if usable.is_empty() {
            return Some(format!(
                "no server of the requested type can host one member ({g} GPUs with its cores and memory)"
            ));
        }
        let level = spec.tolerate;
        if level.is_intra_server() {
            // The whole gang in one server, inside one group of some level up to the tolerance
            // (an NVLink group may be larger than a socket).
            let ok = usable.iter().any(|cs| {
                let t = &self.topologies[cs.topology as usize];
                let group =
                    LocalityLevel::ALL.iter().filter(|l| **l <= level).map(|l| t.max_group(*l)).max().unwrap_or(0);
                group >= total && per_server(cs) >= spec.members as u64 && self.servers_in(cs.id) > 0
            });
            return (!ok).then(|| {
                format!("no single {level} holds {total} GPUs with their cores and memory; tolerate a looser level")
            });
        }
        // Member slots per domain at the tolerated level.
        let mut slots: HashMap<u32, u64> = HashMap::new();
        for cs in &usable {
            *slots.entry(cs.domain(level)).or_default() += self.servers_in(cs.id) * per_server(cs);
        }
        let best = slots.values().copied().max().unwrap_or(0);
        (best < spec.members as u64).then(|| {
            format!(
                "{} members of {g} GPUs need {} server slots in one {level}; the largest has {best}",
                spec.members, spec.members
            )
        })
    }

    fn servers_in(&self, cs: ConfigSetId) -> u64 {
        self.cs_servers.get(cs.index()).copied().unwrap_or(0)
    }
}
