//! The fragmentation metric: how long each pending job waited while enough GPUs were free
//! where its allowed level needs them, yet no placement of its gang existed
//! ([`PolicyReport::frag_blocked_s_by_size`]); and how many free GPUs lack their core share
//! ([`PolicyReport::coreless`]).

use super::*;

impl Sim<'_> {
    /// Brings the count of free GPUs short of their core share and every pending job's
    /// fragmentation-blocked state up to date at `now` (after a pass: only passes change what
    /// is free).
    pub(super) fn track_fragmentation(&mut self, now: f64) {
        if self.pending.is_empty() {
            // Nothing waits: no share of free GPUs is counted until a job arrives (a pass).
            return;
        }
        self.local.catch_up(&self.view);
        let local = &self.local;
        let free = FreeGpus::of(local);
        self.coreless_gpus = free.coreless;
        let mut probed: BTreeMap<(u32, u32, LocalityLevel, Option<u32>), bool> = BTreeMap::new();
        for &i in &self.pending {
            let rt = &self.jobs[i];
            let allowed = rt.allowed(now);
            let blocked = free.enough(&rt.spec, allowed) && {
                let key = (rt.spec.members, rt.spec.gpus_per_member, allowed, rt.ty);
                let fits = *probed.entry(key).or_insert_with(|| {
                    let probe = JobSpec {
                        cpu: CpuDemand::Fixed { cores_per_gpu: 1 },
                        memory_mib_per_gpu: Some(0),
                        ..rt.spec.clone()
                    };
                    find_placement(local, &Overlay::default(), &probe, allowed, FitMode::Pack, 0).is_ok()
                });
                !fits
            };
            let rt = &mut self.jobs[i];
            match (blocked, rt.frag_since) {
                (true, None) => rt.frag_since = Some(now),
                (false, Some(since)) => {
                    rt.frag_blocked_s += now - since;
                    rt.frag_since = None;
                }
                _ => {}
            }
        }
    }
}

/// Free GPUs of each device type: in the whole cluster, and per rack and per IB domain, for the
/// aggregate half of the fragmentation test; and those short of their core share.
struct FreeGpus<'v> {
    cluster: BTreeMap<&'v str, u32>,
    rack: BTreeMap<(&'v str, u32), u32>,
    ib: BTreeMap<(&'v str, u32), u32>,
    /// Free GPUs of up servers beyond what the server's free cores give their proportional share
    /// (`cores / devices` each) to. CPU-aware grants keep the share beside every GPU free when a
    /// job is placed, but a job granted less than its share leaves cores another job may take
    /// as spare, and its GPU comes back short when it ends.
    coreless: u64,
}

impl<'v> FreeGpus<'v> {
    fn of(view: &'v LocalView) -> FreeGpus<'v> {
        let mut f = FreeGpus { cluster: BTreeMap::new(), rack: BTreeMap::new(), ib: BTreeMap::new(), coreless: 0 };
        for rec in view.servers() {
            let n = rec.free_gpus.count_ones();
            if n == 0 || rec.health != tessera_view::Health::Up {
                continue;
            }
            let cs = &view.config_sets()[rec.config_set.index()];
            let topo = view.topology_of(rec.config_set);
            let share = (topo.cores() / topo.devices.max(1)).max(1);
            f.coreless += u64::from(n.saturating_sub(rec.free_cores.count() / share));
            let t = topo.device_type.as_str();
            *f.cluster.entry(t).or_default() += n;
            *f.rack.entry((t, cs.rack)).or_default() += n;
            *f.ib.entry((t, cs.ib_domain)).or_default() += n;
        }
        f
    }

    /// Whether enough GPUs of the job's type are free where its allowed level needs them.
    fn enough(&self, spec: &JobSpec, allowed: LocalityLevel) -> bool {
        let g = spec.total_gpus();
        let typed = |t: &str| spec.gpu_type.as_deref().is_none_or(|w| w == t);
        match allowed {
            LocalityLevel::Rack => self.rack.iter().any(|((t, _), n)| typed(t) && *n >= g),
            LocalityLevel::IbDomain => self.ib.iter().any(|((t, _), n)| typed(t) && *n >= g),
            _ => self.cluster.iter().filter(|(t, _)| typed(t)).map(|(_, n)| *n).sum::<u32>() >= g,
        }
    }
}
