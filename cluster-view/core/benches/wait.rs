//! Criterion benches of `wait::Explainer` on a 16,000-server view (8 GPUs each, 16 racks):
//! `explain_one_shape` (a fresh explainer, one pending job: one pass over the servers) and
//! `explain_page_1000` (a fresh explainer, the first 1,000 of 10,000 pending jobs of 5 shapes:
//! what `GET /v1/queue?limit=1000` computes per request, the snapshot aside).

use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;
use tessera_view::{ClusterSpec, ClusterView, Explainer, JobSpec, LocalityLevel, Topology};

fn wait(c: &mut Criterion) {
    let topo = Topology::preset("seed-8gpu").expect("preset");
    let mut v = ClusterView::from_spec(&ClusterSpec::uniform(topo, 16_000, 16, 16));
    let shapes = [(1u32, 1u32), (1, 4), (1, 8), (2, 8), (4, 8)];
    let mut first = None;
    for i in 0..10_000usize {
        let (members, gpus) = shapes[i % shapes.len()];
        let mut s = JobSpec::simple("q", members, gpus);
        s.tolerate = LocalityLevel::Any;
        s.priority = (i % 3) as i32;
        let id = v.submit(s).expect("fits");
        first.get_or_insert(id);
    }
    let first = first.expect("a job");
    let mut g = c.benchmark_group("wait");
    g.sample_size(20);
    g.bench_function("explain_one_shape", |b| {
        b.iter(|| black_box(Explainer::new(&v).explain(first)).expect("pending"))
    });
    g.bench_function("explain_page_1000", |b| {
        b.iter(|| {
            let mut e = Explainer::new(&v);
            let queue = e.queue();
            let n = queue.iter().take(1000).zip(0u32..).map(|(j, pos)| e.explain_at(j, pos)).count();
            black_box(n)
        })
    });
    g.finish();
}

criterion_group!(benches, wait);
criterion_main!(benches);
