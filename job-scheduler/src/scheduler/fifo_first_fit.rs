//! [`FifoFirstFit`]: the GPU-count baseline, as a plain cluster scheduler (Kubernetes' default
//! scheduler with `nvidia.com/gpu` counts, Slurm's `--gres=gpu:N` without topology) places jobs.

use super::{Attempt, Scheduler, Verdict, no_such_type};
use tessera_view::fit::{self, FitMode};
use tessera_view::{JobSpec, LocalityLevel, MemberPlacement, ServerId};

/// First fit by GPU count: each member goes to the lowest-numbered server that has room for it,
/// in order, ignoring topology and locality. Jobs written as one-GPU members (the simulator's
/// `fifo-firstfit` preset) spread over whatever GPUs are free, as a GPU-count scheduler would.
#[derive(Clone, Debug, Default)]
pub struct FifoFirstFit;

impl Scheduler for FifoFirstFit {
    fn name(&self) -> &str {
        "fifo-firstfit"
    }

    fn decides_by_shape(&self) -> bool {
        true
    }

    fn schedule(&self, a: &Attempt<'_>) -> Verdict {
        let spec = &a.job.spec;
        if let Some(v) = no_such_type(a) {
            return v;
        }
        match first_fit(a, spec) {
            Some(members) => Verdict::Propose(members),
            None => Verdict::Wait(format!(
                "fewer than {} members of {} GPU{} fit the free servers now",
                spec.members,
                spec.gpus_per_member,
                if spec.gpus_per_member == 1 { "" } else { "s" }
            )),
        }
    }
}

/// Members in rank order on the lowest-numbered servers with room, or `None`.
fn first_fit(a: &Attempt<'_>, spec: &JobSpec) -> Option<Vec<MemberPlacement>> {
    let mut members = Vec::with_capacity(spec.members as usize);
    for (i, rec) in a.view.servers().iter().enumerate() {
        let s = ServerId(i as u32);
        let mut rec = *a.overlay.get(s).unwrap_or(rec);
        let topo = a.view.topology_of(rec.config_set);
        if spec.gpu_type.as_ref().is_some_and(|t| *t != topo.device_type) {
            continue;
        }
        let req = fit::member_request(spec, topo);
        while members.len() < spec.members as usize {
            let Some((m, _)) = fit::plan_member(topo, &rec, s, &req, LocalityLevel::Server, FitMode::Pack) else {
                break;
            };
            rec.free_gpus &= !m.gpus;
            rec.free_cores = rec.free_cores.without(m.cores);
            rec.free_memory_mib -= m.memory_mib;
            members.push(m);
        }
        if members.len() == spec.members as usize {
            return Some(members);
        }
    }
    None
}
