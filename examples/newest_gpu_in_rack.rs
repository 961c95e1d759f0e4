//! A custom scheduler: the whole gang in one rack, on the newest GPU type that has room.
//! Run it as a scheduler host:  cargo run --example newest_gpu_in_rack -- 127.0.0.1:7101
//! and submit jobs with `scheduler = "newest-in-rack"` (docs/SDK.md walks through it).
use tessera_scheduler::{Attempt, Registry, Scheduler, Verdict, find_placement};
use tessera_view::{JobSpec, LocalityLevel, fit::FitMode};

/// GPU generations, newest first; types not listed come last.
const NEWEST_FIRST: [&str; 4] = ["h100", "a100", "v100", "p100"];

#[derive(Debug)]
struct NewestInRack;

impl Scheduler for NewestInRack {
    fn name(&self) -> &str {
        "newest-in-rack"
    }

    fn schedule(&self, a: &Attempt<'_>) -> Verdict {
        let age = |t: &str| NEWEST_FIRST.iter().position(|g| t.contains(g)).unwrap_or(NEWEST_FIRST.len());
        let mut types: Vec<&str> = a.view.topologies().iter().map(|t| t.device_type.as_str()).collect();
        types.sort_by_key(|t| (age(t), *t));
        types.dedup();
        let allowed = a.allowed.min(LocalityLevel::Rack);
        for t in types {
            let spec = JobSpec { gpu_type: Some(t.to_string()), ..a.job.spec.clone() };
            if let Ok(found) = find_placement(a.view, a.overlay, &spec, allowed, FitMode::Pack, a.salt) {
                return Verdict::Propose(found.members);
            }
        }
        Verdict::Wait(format!("no rack has {} free GPUs of one type", a.job.spec.total_gpus()))
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let view = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:7101".into());
    // The TLS directory of a scheduler certificate (`tessera tls issue --role scheduler
    // --name NAME`), or plaintext for a cluster started with --insecure.
    let (security, name) = match std::env::var_os("TESSERA_TLS") {
        Some(dir) => {
            let s = tessera_scheduler::tls::Security::Tls(tessera_scheduler::tls::Tls::open(
                std::path::PathBuf::from(dir),
            )?);
            let name = s.tls().and_then(|t| t.current().identity.clone()).map(|i| i.name);
            (s, name.unwrap_or_else(|| "newest-in-rack".into()))
        }
        None => (tessera_scheduler::tls::Security::Insecure, format!("newest-in-rack-{}", std::process::id())),
    };
    let cfg = tessera_scheduler::HostConfig {
        view: view.split(',').map(str::to_string).collect(),
        security,
        name,
        max_jobs: 64,
        runtime: Default::default(),
        migration: Default::default(),
        metrics: Default::default(),
    };
    let registry = Registry::default().register(NewestInRack);
    tessera_scheduler::run_host(cfg, registry, async { tokio::signal::ctrl_c().await.unwrap_or(()) }).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_scheduler::{Context, LocalView, Overlay};
    use tessera_view::{ClusterSpec, ClusterView, Decision, Proposal, ProposalId};

    #[test]
    fn places_in_one_rack_on_the_newest_type_and_the_approver_agrees() {
        let spec = ClusterSpec::from_file(std::path::Path::new("../deploy/clusters/mixed.toml")).expect("spec");
        let mut view = ClusterView::from_spec(&spec);
        let id = view.submit(JobSpec::simple("j", 2, 8)).expect("admitted");
        let job = view.job(id).expect("job").clone();
        let local = LocalView::of_view(&view);
        let overlay = Overlay::default();
        let a = Attempt {
            job: &job,
            view: &local,
            overlay: &overlay,
            allowed: LocalityLevel::Any,
            waited_s: 0,
            attempt: 0,
            salt: 1,
            ctx: Context::empty(),
        };
        let Verdict::Propose(members) = NewestInRack.schedule(&a) else { panic!("expected a proposal") };
        let racks: Vec<u32> = members
            .iter()
            .map(|m| view.config_sets()[view.server(m.server).expect("server").config_set.index()].rack)
            .collect();
        assert!(racks.iter().all(|r| *r == racks[0]), "one rack: {racks:?}");
        let ty = &view.topology_of(view.server(members[0].server).expect("server").config_set).device_type;
        assert_eq!(ty, "nvidia-h100-80g");
        let p = Proposal { id: ProposalId(7), job: id, members, based_on: view.version() };
        assert!(matches!(view.propose(&p), Decision::Accepted { .. }));
    }
}
