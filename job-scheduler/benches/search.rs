//! Criterion benches of the placement search on a 16,000-server view (8 GPUs each) at about
//! 50% random load: jobs of 1, 4 and 8 GPUs and a 2x8 gang, packing and spreading.

use criterion::{Criterion, criterion_group, criterion_main};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::hint::black_box;
use tessera_scheduler::{LocalView, Overlay, find_placement};
use tessera_view::fit::FitMode;
use tessera_view::{ClusterSpec, ClusterView, JobSpec, LocalityLevel, ServerId, Topology};

fn loaded() -> LocalView {
    let topo = Topology::preset("seed-8gpu").expect("preset");
    let view = ClusterView::from_spec(&ClusterSpec::uniform(topo.clone(), 16_000, 16, 16));
    let mut local = LocalView::of_view(&view);
    let mut rng = SmallRng::seed_from_u64(7);
    for s in 0..16_000u32 {
        let mut rec = *view.server(ServerId(s)).expect("server");
        // About half the devices taken, at random, with cores and memory to match.
        let taken: u64 = rng.random::<u64>() & topo.all_devices();
        rec.free_gpus &= !taken;
        let used = taken.count_ones();
        rec.free_cores = topo.all_cores().without(tessera_view::CoreMask::range(0, used * 4));
        rec.free_memory_mib -= used * (topo.memory_mib / 8);
        local.apply_server(ServerId(s), rec);
    }
    local
}

fn search(c: &mut Criterion) {
    let local = loaded();
    let overlay = Overlay::default();
    let mut g = c.benchmark_group("search");
    for (name, members, gpus) in [("1gpu", 1u32, 1u32), ("4gpu", 1, 4), ("8gpu", 1, 8), ("2x8", 2, 8)] {
        let spec = JobSpec::simple(name, members, gpus);
        for mode in [FitMode::Pack, FitMode::Spread] {
            let mut salt = 0u64;
            g.bench_function(format!("{name}_{mode:?}").to_lowercase(), |b| {
                b.iter(|| {
                    salt += 1;
                    black_box(find_placement(&local, &overlay, &spec, LocalityLevel::Any, mode, salt)).is_ok()
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, search);
criterion_main!(benches);
