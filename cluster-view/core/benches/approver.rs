//! Criterion benches of the approver on a 16,000-server view (8 GPUs each):
//! `propose_then_release` (validate + apply of a 1-member and a 2-member gang, then release, so
//! the state stays steady) and `reject_conflict` (validation of a stale proposal).

use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;
use tessera_view::fit::{self, FitMode};
use tessera_view::{ClusterSpec, ClusterView, JobSpec, LocalityLevel, Proposal, ProposalId, ServerId, Topology};

fn view() -> ClusterView {
    let topo = Topology::preset("seed-8gpu").expect("preset");
    ClusterView::from_spec(&ClusterSpec::uniform(topo, 16_000, 16, 16))
}

fn plan(view: &ClusterView, spec: &JobSpec, servers: &[u32]) -> Vec<tessera_view::MemberPlacement> {
    let topo = Topology::preset("seed-8gpu").expect("preset");
    let req = fit::member_request(spec, &topo);
    servers
        .iter()
        .map(|&s| {
            let rec = view.server(ServerId(s)).expect("server");
            fit::plan_member(&topo, rec, ServerId(s), &req, LocalityLevel::Server, FitMode::Pack).expect("fits").0
        })
        .collect()
}

fn approver(c: &mut Criterion) {
    let mut g = c.benchmark_group("approver");
    for (name, members, gpus, servers) in [("1x4", 1u32, 4u32, vec![7u32]), ("2x8", 2, 8, vec![100, 101])] {
        let mut v = view();
        let spec = JobSpec::simple(name, members, gpus);
        let m = plan(&v, &spec, &servers);
        let mut id = 0u64;
        g.bench_function(format!("propose_then_release_{name}"), |b| {
            b.iter(|| {
                let job = v.submit(spec.clone()).expect("fits");
                id += 1;
                let p = Proposal { id: ProposalId(id), job, members: m.clone(), based_on: v.version() };
                assert!(black_box(v.propose(&p)).is_placed());
                v.release(job, false).expect("release");
            })
        });
    }
    let mut v = view();
    let spec = JobSpec::simple("held", 1, 8);
    let m = plan(&v, &spec, &[5]);
    let job = v.submit(spec.clone()).expect("fits");
    assert!(v.propose(&Proposal { id: ProposalId(1), job, members: m.clone(), based_on: v.version() }).is_placed());
    let late = v.submit(spec).expect("fits");
    let stale = Proposal { id: ProposalId(2), job: late, members: m, based_on: v.version() };
    g.bench_function("reject_conflict", |b| b.iter(|| black_box(v.validate(black_box(&stale))).is_err()));
    g.finish();
}

criterion_group!(benches, approver);
criterion_main!(benches);
