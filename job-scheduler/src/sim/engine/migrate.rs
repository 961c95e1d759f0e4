//! The simulator's migration: a plan from [`migration_planner::plan_remembering`] for a blocked
//! job, checked as the leader checks a live host's
//! ([`tessera_view::migration_check::moves_help`]), its moves applied through the approver and
//! the moved jobs paused for the move's cost.

use super::*;

impl Sim<'_> {
    /// Plans and applies moves that free a group for job `i` at `level`; true if they were all
    /// accepted (the job's own machine then places it, as a live host's scheduler task does
    /// on the view change). `cooldown`: [`MigrationConfig::cooldown`], seconds.
    pub(super) fn try_migrate(&mut self, i: usize, level: LocalityLevel, cooldown: f64, now: f64) -> bool {
        // What a live host tells the planner: no remaining times (it has none), only the jobs
        // moved within the cooldown, which it never moves again.
        while self.recent_moves.front().is_some_and(|&(at, _)| at + cooldown <= now) {
            self.recent_moves.pop_front();
        }
        let remaining = migration_task::planner_estimates(self.recent_moves.iter().map(|&(_, job)| job));
        let job = self.jobs[i].view_id;
        let params = MigrationParams {
            chained_moves: self.cfg.migration.chained_moves && self.cfg.contender.chained_moves,
            ..self.cfg.migration
        };
        let Some(plan) =
            migration_planner::plan_remembering(&self.view, job, level, &remaining, &params, &mut self.failed_plans)
        else {
            self.rep.migration_no_plan += 1;
            return false;
        };
        // Neither the job nor the jobs moved for it may land on servers withheld from it.
        let lands = plan.target.iter().chain(plan.moves.iter().flat_map(|m| m.to.iter())).map(|m| m.server);
        if self.view.job(job).is_some_and(|j| self.reservations.withholds_any(j, now, lands)) {
            return false;
        }
        let moves: Vec<Proposal> = plan
            .moves
            .iter()
            .map(|m| Proposal {
                id: self.next_proposal(),
                job: m.job,
                members: m.to.clone(),
                based_on: self.view.version(),
            })
            .collect();
        // The leader's check of a live host's moves: each frees what the target, or another
        // needed move, takes.
        if !moves.is_empty()
            && tessera_view::migration_check::moves_help(&self.view, job, &plan.target, &moves).is_err()
        {
            self.rep.rejected_proposals += moves.len() as u64;
            return false;
        }
        if !moves.is_empty() {
            let Outcome::Decided(ds) = self.view.apply(&Command::Migrate(moves.clone())) else { return false };
            for (p, d) in moves.iter().zip(&ds) {
                if !d.is_placed() {
                    self.rep.rejected_proposals += 1;
                    continue;
                }
                let Some(&j) = self.by_view.get(&p.job) else { continue };
                self.pause_for_move(j, p, now);
            }
            self.local.catch_up(&self.view);
            if ds.iter().any(Decision::is_placed) {
                // The live task plans every interval, so it sees the moved jobs movable again
                // when their cooldown ends: a pass then, even if nothing else happens.
                self.push(now + cooldown, Event::Wake);
            }
            return ds.iter().all(Decision::is_placed);
        }
        // No moves: the group is free already (the job's scheduler passed it over).
        false
    }

    /// A moved job: new members, no progress until its checkpoint-restart pause ends.
    pub(super) fn pause_for_move(&mut self, j: usize, p: &Proposal, now: f64) {
        let mut servers = self.vacate(j);
        let cost = self.cfg.migration.checkpoint_restart_s;
        self.rep.migrations += 1;
        self.rep.migration_cost_gpu_s += f64::from(self.jobs[j].gpus) * cost;
        let level = self.view.gang_level(&p.members);
        {
            let rt = &mut self.jobs[j];
            rt.paused = true;
            rt.members = p.members.clone();
            rt.level = level;
        }
        self.set_speed(j, now);
        servers.extend(p.members.iter().map(|m| m.server));
        let to: BTreeSet<ServerId> = p.members.iter().map(|m| m.server).collect();
        for s in &to {
            self.server_jobs[s.index()].push(j);
        }
        if let Some(v) = self.view.job(self.jobs[j].view_id) {
            self.running.update(v);
        }
        self.observe(j, now);
        self.respeed(&servers);
        self.jobs[j].moves += 1;
        self.recent_moves.push_back((now, self.jobs[j].view_id));
        let moves = self.jobs[j].moves;
        self.push(now + cost, Event::Resume(j, moves));
    }
}
