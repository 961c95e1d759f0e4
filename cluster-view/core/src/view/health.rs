//! What node agents report: tasks starting and exiting (a failure restarts the gang whole
//! while its restart policy allows), devices found unhealthy, and servers' health.

use super::*;

impl ClusterView {
    /// Unhealthy devices of a server (bit `i` = device `i`).
    pub fn unhealthy_devices(&self, server: ServerId) -> u64 {
        self.unhealthy.get(server.index()).copied().unwrap_or(0)
    }

    /// Records a node agent's report on one member's task. `Started` moves the member to
    /// running (the job too, once every member runs); `Exited` with code 0 marks it succeeded
    /// (the job finishes and releases once every member has); any other exit fails the job and
    /// releases its resources, or, while its [`crate::job::RestartPolicy`] allows, releases them
    /// and queues the job again (restarted whole). A report for another placement than the job's current one is
    /// [`ViewError::StaleTask`]; repeated reports change nothing.
    pub fn task_event(
        &mut self,
        job: JobId,
        proposal: ProposalId,
        member: u32,
        server: ServerId,
        event: &TaskEvent,
    ) -> Result<JobState, ViewError> {
        let j = self.jobs.get(&job).ok_or(ViewError::UnknownJob(job))?;
        let stale = |why: String| Err(ViewError::StaleTask { job, why });
        let Some(p) = j.placement.as_ref().filter(|_| j.state.holds_resources()) else {
            return stale(format!("the job is {} and holds no placement", j.state));
        };
        if p.proposal != proposal {
            return stale(format!("its placement is proposal {}, not {proposal}", p.proposal));
        }
        let Some(m) = p.members.get(member as usize) else {
            return stale(format!("the placement has {} members, no member {member}", p.members.len()));
        };
        if m.server != server {
            return stale(format!("member {member} is on server {}, not {server}", m.server));
        }
        let members = p.members.len();
        let current = j.tasks.get(member as usize).copied().unwrap_or_default();
        let next = match event {
            TaskEvent::Started if current == TaskState::Starting => TaskState::Running,
            TaskEvent::Exited { code: 0, .. } if current != TaskState::Succeeded => TaskState::Succeeded,
            TaskEvent::Started | TaskEvent::Exited { code: 0, .. } => return Ok(j.state),
            TaskEvent::Exited { code, message } => return Ok(self.task_failed(job, member, server, *code, message)),
        };
        self.bump();
        let j = self.jobs.get_mut(&job).ok_or(ViewError::UnknownJob(job))?;
        j.tasks.resize(members, TaskState::Starting);
        j.tasks[member as usize] = next;
        if j.tasks.iter().all(|t| *t == TaskState::Succeeded) {
            self.free_placement(job);
            self.end_job(job, JobState::Finished);
            return Ok(JobState::Finished);
        }
        // A moved job (migrating) runs again once every member of its new placement started.
        if matches!(j.state, JobState::Placed | JobState::Migrating)
            && j.tasks.iter().all(|t| *t != TaskState::Starting)
        {
            j.state = JobState::Running;
            j.times.started_ms = self.now_ms;
        }
        let state = j.state;
        self.note(Change::Job(job));
        Ok(state)
    }

    fn task_failed(&mut self, job: JobId, member: u32, server: ServerId, code: i32, message: &str) -> JobState {
        let name = self.server_name(server).unwrap_or("?").to_string();
        // Bounded, deterministically: the text is replicated and kept with ended jobs.
        let message: String = message.chars().take(MAX_ERROR_CHARS).collect();
        let why = match (code, message.trim()) {
            (c, "") if c < 0 => format!("killed by signal {}", -c),
            (c, "") => format!("exited with code {c}"),
            (c, m) => format!("exited with code {c}: {m}"),
        };
        let what = format!("member {member} on {name} {why}");
        self.bump();
        // A restart policy with restarts left: the gang goes back to the queue whole (its
        // agents stop the other members, whose placement is gone), to be placed again after
        // the policy's backoff.
        let restart = self.jobs.get(&job).and_then(|j| {
            let policy = j.spec.run.restart.filter(|r| j.restarts < r.max)?;
            Some((policy, j.restarts + 1))
        });
        if let Some((policy, n)) = restart {
            let wait_ms = policy.backoff_ms(n);
            self.requeue(job, format!("restart {n} of {} in {} s after: {what}", policy.max, wait_ms / 1000));
            if let Some(j) = self.jobs.get_mut(&job) {
                j.restarts = n;
                j.not_before_ms = self.now_ms.saturating_add(wait_ms);
            }
            return JobState::Pending;
        }
        self.free_placement(job);
        if let Some(j) = self.jobs.get_mut(&job) {
            j.error = Some(match j.restarts {
                0 => what,
                n => format!("{what} (after {n} restart{})", if n == 1 { "" } else { "s" }),
            });
        }
        self.end_job(job, JobState::Failed);
        JobState::Failed
    }

    /// Replaces a server's set of unhealthy devices. Free devices that turn unhealthy stop
    /// being free; held ones stay with their job and are not freed when it ends; devices that
    /// turn healthy and are not held become free.
    pub fn set_unhealthy_devices(&mut self, server: ServerId, devices: u64) -> Result<(), ViewError> {
        let rec = self.live_server(server)?;
        let all = self.topology_of(rec.config_set).all_devices();
        if devices & !all != 0 {
            return Err(ViewError::BadServer(
                server,
                format!(
                    "unhealthy devices {} do not exist (it has {})",
                    crate::mask::format_indices(devices & !all),
                    crate::mask::format_indices(all)
                ),
            ));
        }
        if self.unhealthy[server.index()] == devices {
            return Ok(());
        }
        let held = self
            .jobs
            .values()
            .filter_map(|j| j.placement.as_ref())
            .flat_map(|p| p.members.iter())
            .filter(|m| m.server == server)
            .fold(0u64, |acc, m| acc | m.gpus);
        self.bump();
        self.unhealthy[server.index()] = devices;
        self.servers[server.index()].free_gpus = all & !held & !devices;
        self.touch_server(server);
        Ok(())
    }

    /// Sets a server's health. Going down fails every gang with a member there and puts the
    /// job back to pending whole; returns those jobs. `Up` on a cordoned server gives
    /// [`Health::Draining`].
    pub fn set_health(&mut self, server: ServerId, health: Health) -> Result<Vec<JobId>, ViewError> {
        self.set_health_at(server, health, 0)
    }

    /// [`ClusterView::set_health`], recorded in the server's history at `at_ms` (Unix ms).
    pub fn set_health_at(&mut self, server: ServerId, health: Health, at_ms: u64) -> Result<Vec<JobId>, ViewError> {
        let rec = self.live_server(server)?;
        if health == Health::Removed {
            return Err(ViewError::BadServer(server, "only a RemoveServer command removes a server".into()));
        }
        let health = match health {
            Health::Up if self.cordons.contains_key(&server) => Health::Draining,
            h => h,
        };
        if rec.health == health {
            return Ok(Vec::new());
        }
        self.bump();
        self.servers[server.index()].health = health;
        self.touch_server(server);
        let requeued = if health == Health::Down {
            let name = self.server_name(server).unwrap_or("?").to_string();
            self.requeue_server(server, &format!("re-queued: server {name} went down"))
        } else {
            Vec::new()
        };
        let why = match (health, requeued.len()) {
            (Health::Down, 0) => "down".to_string(),
            (Health::Down, n) => format!("down: {n} gang(s) re-queued"),
            (Health::Draining, _) => "up, cordoned: no new placements".to_string(),
            (Health::Up, _) => "up".to_string(),
            (Health::Removed, _) => unreachable!("refused above"),
        };
        self.remember(server, at_ms, why);
        Ok(requeued)
    }
}
