//! The built-in schedulers on real views, each proposal checked by the real approver.

use tessera_scheduler::{
    Attempt, Context, CpuAware, FifoFirstFit, Gandiva, Hived, LocalView, LocalityTolerant, Optimus, Overlay, Policy,
    RunningIndex, Scheduler, Verdict,
};
use tessera_view::{
    ClusterSpec, ClusterView, CpuDemand, Decision, JobId, JobSpec, LocalityLevel, MemberPlacement, Predictor, Proposal,
    ProposalId,
};

fn view(servers: u32) -> ClusterView {
    let spec = ClusterSpec::from_toml(
        "c.toml",
        &format!(
            "name='t'\n[[racks]]\nname='ra'\nib_domain='ib'\ntopology='seed-8gpu'\nservers={servers}\n\
             [[racks]]\nname='rb'\nib_domain='ib'\ntopology='seed-8gpu'\nservers={servers}\n"
        ),
        None,
    )
    .expect("spec");
    ClusterView::from_spec(&spec)
}

/// Runs `s` for `spec` on `v`; a proposal is committed through the approver, which must accept.
fn schedule(v: &mut ClusterView, s: &dyn Scheduler, spec: JobSpec, n: u64) -> Result<Vec<MemberPlacement>, String> {
    let id: JobId = v.submit(spec).map_err(|e| e.to_string())?;
    let job = v.job(id).expect("job").clone();
    let local = LocalView::of_view(v);
    let overlay = Overlay::default();
    let running = RunningIndex::from_jobs(v.jobs());
    let a = Attempt {
        job: &job,
        view: &local,
        overlay: &overlay,
        allowed: job.spec.allowed_level(0),
        waited_s: 0,
        attempt: 0,
        salt: n,
        ctx: Context::of_running(&running),
    };
    match s.schedule(&a) {
        Verdict::Propose(members) => {
            let p = Proposal { id: ProposalId(1000 + n), job: id, members: members.clone(), based_on: v.version() };
            match v.propose(&p) {
                Decision::Accepted { .. } => Ok(members),
                other => panic!("the approver refused {}'s proposal: {other:?}", s.name()),
            }
        }
        Verdict::Wait(why) | Verdict::GiveUp(why) => Err(why),
        Verdict::Preempt { victims, .. } => panic!("{} preempted {victims:?} without being asked to", s.name()),
    }
}

fn predicted(name: &str, theta: f64, min: u32) -> JobSpec {
    let mut s = JobSpec::simple(name, 1, 1);
    s.cpu = CpuDemand::Predicted { predictor: Predictor { p0: 0.3, p1: 0.02, p2: 1.0, theta }, min_cores_per_gpu: min };
    s
}

#[test]
fn default_places_within_tolerance_and_waits_when_full() {
    let mut v = view(1);
    let mut spec = JobSpec::simple("a", 1, 4);
    spec.prefer = LocalityLevel::Socket;
    spec.tolerate = LocalityLevel::Socket;
    let m = schedule(&mut v, &LocalityTolerant::default(), spec.clone(), 1).expect("placed");
    let t = v.topology_of(v.server(m[0].server).expect("server").config_set).clone();
    assert_eq!(t.level_of(m[0].gpus), LocalityLevel::Socket);
    // 2 servers of 2 sockets: three more socket-local 4-GPU jobs fit, a fifth waits.
    for n in 2..5 {
        schedule(&mut v, &LocalityTolerant::default(), spec.clone(), n).expect("placed");
    }
    let why = schedule(&mut v, &LocalityTolerant::default(), spec, 5).expect_err("full");
    assert!(why.contains("no free 4 GPUs"), "{why}");
}

#[test]
fn default_grants_a_fixed_share_and_cpu_aware_the_predictors_sweet_point() {
    // seed-8gpu: 32 cores for 8 GPUs, a share of 4 per GPU. The job's θ is 6.
    let mut v = view(1);
    let m = schedule(&mut v, &LocalityTolerant::default(), predicted("d", 6.0, 2), 1).expect("placed");
    assert_eq!(m[0].cores.count(), 4, "default: the proportional share");
    let mut v = view(1);
    // Fill 7 GPUs of one server so the reserve for free GPUs leaves cores to spare there.
    let mut big = JobSpec::simple("big", 1, 7);
    big.cpu = CpuDemand::Fixed { cores_per_gpu: 2 };
    let held = schedule(&mut v, &LocalityTolerant::default(), big, 2).expect("placed");
    let busy = held[0].server;
    let mut spec = predicted("c", 6.0, 2);
    spec.gpu_type = None;
    let m = schedule(&mut v, &CpuAware::default(), spec, 3).expect("placed");
    assert_eq!(m[0].cores.count(), 6, "cpu-aware: θ cores where a server can spare them");
    assert_eq!(m[0].server, busy, "only the nearly full server can spare 6 cores next to a GPU");
}

#[test]
fn cpu_aware_takes_fewer_cores_rather_than_wait() {
    // θ = 19 is more than any empty seed-8gpu server spares next to one GPU (the reserve for
    // its 7 other GPUs leaves 4): the job still runs, with what it can get.
    let mut v = view(1);
    let m = schedule(&mut v, &CpuAware::default(), predicted("alexnet", 19.0, 2), 1).expect("placed");
    let c = m[0].cores.count();
    assert!((2..19).contains(&c), "between the minimum and θ: {c}");
}

#[test]
fn optimus_uses_the_fewest_servers_with_equal_members_each() {
    let mut v = view(2);
    let mut spec = JobSpec::simple("ps", 4, 2);
    spec.prefer = LocalityLevel::Server;
    spec.tolerate = LocalityLevel::Rack;
    spec.cpu = CpuDemand::Fixed { cores_per_gpu: 2 };
    let m = schedule(&mut v, &Optimus, spec.clone(), 1).expect("placed");
    assert!(m.iter().all(|x| x.server == m[0].server), "8 GPUs fit one server: {m:?}");
    // Leave 4 free GPUs on every server: the next 4 x 2 job needs 2 servers, 2 members each.
    for n in 0..3 {
        let mut half = JobSpec::simple("half", 1, 4);
        half.cpu = CpuDemand::Fixed { cores_per_gpu: 2 };
        schedule(&mut v, &LocalityTolerant { policy: Policy::Spread }, half, 10 + n).expect("placed");
    }
    let m = schedule(&mut v, &Optimus, spec, 2).expect("placed");
    let mut per: std::collections::BTreeMap<u32, usize> = Default::default();
    for x in &m {
        *per.entry(x.server.0).or_default() += 1;
    }
    assert_eq!(per.values().copied().collect::<Vec<_>>(), vec![2, 2], "two servers, two members each: {m:?}");
    assert!(m[0].server == m[1].server && m[2].server == m[3].server, "ranks consecutive per server");
}

#[test]
fn an_absent_gpu_type_gives_up_with_the_reason() {
    let v = view(1);
    let mut spec = JobSpec::simple("h", 1, 1);
    spec.gpu_type = Some("nvidia-b200".into());
    // The view refuses it at submission already; a scheduler shown such a job gives up too.
    let mut v2 = v.clone();
    assert!(v2.submit(spec.clone()).is_err());
    let job = tessera_view::Job {
        id: JobId(1),
        spec,
        state: tessera_view::JobState::Pending,
        placement: None,
        submitted_at: v.version(),
        proposals: Vec::new(),
        tasks: Vec::new(),
        error: None,
        request: None,
        preemptions: 0,
        service_queue: 0,
        user: String::new(),
        times: Default::default(),
        held: Vec::new(),
        restarts: 0,
        not_before_ms: 0,
        waiting_for: Vec::new(),
        ready_ms: 0,
        array_index: None,
        cancel_grace_s: None,
        trace: None,
    };
    let local = LocalView::of_view(&v);
    let overlay = Overlay::default();
    let a = Attempt {
        job: &job,
        view: &local,
        overlay: &overlay,
        allowed: LocalityLevel::Any,
        waited_s: 0,
        attempt: 0,
        salt: 0,
        ctx: Context::empty(),
    };
    for s in [&LocalityTolerant::default() as &dyn Scheduler, &CpuAware::default(), &Optimus] {
        match s.schedule(&a) {
            Verdict::GiveUp(why) => assert!(why.contains("nvidia-b200"), "{}: {why}", s.name()),
            other => panic!("{}: {other:?}", s.name()),
        }
    }
}

fn servers_of(members: &[MemberPlacement]) -> Vec<u32> {
    members.iter().map(|m| m.server.0).collect()
}

fn shaped(name: &str, members: u32, per: u32, prefer: LocalityLevel, tolerate: LocalityLevel) -> JobSpec {
    let mut s = JobSpec::simple(name, members, per);
    (s.prefer, s.tolerate) = (prefer, tolerate);
    s
}

#[test]
fn fifo_firstfit_fills_the_lowest_numbered_servers_first() {
    let mut v = view(1);
    let any = LocalityLevel::Any;
    let a = schedule(&mut v, &FifoFirstFit, shaped("a", 3, 1, any, any), 1).expect("placed");
    assert_eq!(servers_of(&a), [0, 0, 0]);
    // Six one-GPU members: the five left on server 0, then server 1, whatever the topology.
    let b = schedule(&mut v, &FifoFirstFit, shaped("b", 6, 1, any, any), 2).expect("placed");
    assert_eq!(servers_of(&b), [0, 0, 0, 0, 0, 1]);
    let full = schedule(&mut v, &FifoFirstFit, shaped("c", 8, 1, any, any), 3);
    assert!(full.is_err(), "7 GPUs free, 8 asked: {full:?}");
}

#[test]
fn gandiva_puts_a_job_beside_jobs_of_its_own_size_then_on_an_empty_server() {
    let mut v = view(1);
    let (srv, any) = (LocalityLevel::Server, LocalityLevel::Any);
    let two = schedule(&mut v, &Gandiva, shaped("two", 1, 2, srv, any), 1).expect("placed");
    assert_eq!(servers_of(&two), [0], "every server empty: the first");
    // A 4-GPU job avoids the server running a job of another size while an empty one is left.
    let four = schedule(&mut v, &Gandiva, shaped("four", 1, 4, srv, any), 2).expect("placed");
    assert_eq!(servers_of(&four), [1]);
    // Shown no running jobs (an empty context), every server looks empty: best fit would pick
    // the fuller server 1 for the next 2-GPU job ...
    let id = v.submit(shaped("two-b", 1, 2, srv, any)).expect("admitted");
    let job = v.job(id).expect("job").clone();
    let local = LocalView::of_view(&v);
    let overlay = Overlay::default();
    let blind = Attempt {
        job: &job,
        view: &local,
        overlay: &overlay,
        allowed: any,
        waited_s: 0,
        attempt: 0,
        salt: 4,
        ctx: Context::empty(),
    };
    let Verdict::Propose(m) = Gandiva.schedule(&blind) else { panic!("room left") };
    assert_eq!(servers_of(&m), [1]);
    // ... but knowing them, Gandiva puts it beside the 2-GPU job on server 0.
    let again = schedule(&mut v, &Gandiva, shaped("two-c", 1, 2, srv, any), 3).expect("placed");
    assert_eq!(servers_of(&again), [0]);
}

#[test]
fn hived_waits_for_a_group_of_its_level_rather_than_take_a_looser_one() {
    let mut v = view(1);
    let srv = LocalityLevel::Server;
    for (i, name) in ["a", "b"].into_iter().enumerate() {
        schedule(&mut v, &Hived, shaped(name, 1, 6, srv, srv), i as u64).expect("one per server");
    }
    // 2 GPUs free on each server: a 4-GPU gang that must stay on one server waits ...
    let wait = schedule(&mut v, &Hived, shaped("cell", 2, 2, srv, srv), 3);
    assert!(wait.is_err(), "{wait:?}");
    // ... and one whose cell is the InfiniBand domain takes the two servers.
    let ib = schedule(&mut v, &Hived, shaped("ib", 2, 2, srv, LocalityLevel::IbDomain), 4).expect("placed");
    let mut s = servers_of(&ib);
    s.sort_unstable();
    assert_eq!(s, [0, 1]);
}
