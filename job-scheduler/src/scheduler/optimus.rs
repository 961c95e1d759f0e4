//! [`Optimus`]: parameter-server/worker jobs on the fewest servers, in equal shares.

use super::{Attempt, LocalityTolerant, Scheduler, Verdict};
use crate::placement_policy::Policy;
use crate::search::{find_placement, plan_on_server};
use std::collections::HashMap;
use tessera_view::fit::{FitMode, member_request};
use tessera_view::{LocalityLevel, MemberPlacement, ServerId};

/// Optimus-style placement of parameter-server/worker jobs (Peng et al., EuroSys 2018): each
/// member runs a worker and a parameter-server shard, and traffic between them is smallest
/// when the job spans the fewest servers with the same number of members on each. The
/// scheduler tries `k = 1, 2, …` servers (only counts that divide the members evenly) and
/// takes the first `k` for which `k` servers in one domain within the tolerance each have room
/// for `members / k` members. Members are numbered server by server, so ranks on one server
/// are consecutive.
#[derive(Clone, Debug, Default)]
pub struct Optimus;

impl Scheduler for Optimus {
    fn name(&self) -> &str {
        "optimus"
    }

    fn decides_by_shape(&self) -> bool {
        true
    }

    fn schedule(&self, a: &Attempt<'_>) -> Verdict {
        let spec = &a.job.spec;
        if spec.members == 1 {
            return LocalityTolerant { policy: Policy::Pack }.schedule(a);
        }
        let view = a.view;
        let typed = |cs: tessera_view::ConfigSetId| {
            spec.gpu_type.as_ref().is_none_or(|w| *w == view.topology_of(cs).device_type)
        };
        if !view.config_sets().iter().any(|cs| typed(cs.id)) {
            return Verdict::GiveUp(format!(
                "no server in the cluster has GPU type `{}`",
                spec.gpu_type.clone().unwrap_or_default()
            ));
        }
        for k in 1..=spec.members {
            if !spec.members.is_multiple_of(k) {
                continue;
            }
            let level = if k == 1 { LocalityLevel::Server } else { LocalityLevel::Rack };
            if k == 1 && a.allowed < LocalityLevel::Server {
                // One server is only acceptable within the tighter group the job wants.
                if let Ok(f) = find_placement(view, a.overlay, spec, a.allowed, FitMode::Pack, a.salt) {
                    return Verdict::Propose(f.members);
                }
                continue;
            }
            if level > a.allowed && k > 1 {
                break;
            }
            if let Some(m) = self.on_k_servers(a, k) {
                return Verdict::Propose(m);
            }
        }
        Verdict::Wait(format!(
            "no set of servers within {} has room for {} members of {} GPUs in equal shares",
            a.allowed, spec.members, spec.gpus_per_member
        ))
    }
}

/// A server that can take its share of a gang: its free GPUs now, and the members planned.
type Candidate = (u32, Vec<MemberPlacement>);

impl Optimus {
    /// `k` servers in one domain of the allowed level, each taking `members / k` members.
    fn on_k_servers(&self, a: &Attempt<'_>, k: u32) -> Option<Vec<MemberPlacement>> {
        let spec = &a.job.spec;
        let view = a.view;
        let per = spec.members / k;
        // Candidate servers (fullest first, to pack), grouped by the domain the level needs.
        let mut by_domain: HashMap<u32, Vec<Candidate>> = HashMap::new();
        for (i, rec) in view.servers().iter().enumerate() {
            let s = ServerId(i as u32);
            let rec = a.overlay.get(s).unwrap_or(rec);
            let cs = &view.config_sets()[rec.config_set.index()];
            let topo = view.topology_of(rec.config_set);
            if spec.gpu_type.as_ref().is_some_and(|w| *w != topo.device_type) {
                continue;
            }
            let req = member_request(spec, topo);
            let Some(m) = plan_on_server(topo, rec, s, &req, per, LocalityLevel::Server, FitMode::Pack) else {
                continue;
            };
            by_domain.entry(cs.domain(a.allowed)).or_default().push((rec.free_gpus.count_ones(), m));
        }
        let mut domains: Vec<(u32, Vec<Candidate>)> =
            by_domain.into_iter().filter(|(_, v)| v.len() >= k as usize).collect();
        // The domain with the fewest spare servers (best fit), ties by id for determinism.
        domains.sort_by_key(|(d, v)| (v.len(), *d));
        let (_, mut servers) = domains.into_iter().next()?;
        servers.sort_by_key(|(free, m)| (*free, m[0].server));
        Some(servers.into_iter().take(k as usize).flat_map(|(_, m)| m).collect())
    }
}
