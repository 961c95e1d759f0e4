//! `tessera sim`: replay a job trace through the simulator (`tessera_scheduler::sim`) under
//! several placement policies and report, table, JSON, CSV files and SVG plots.
//!
//! The simulator computes every metric ([`PolicyReport`]) and the experiment module
//! (`tessera_scheduler::sim::experiment`) loads the inputs and runs the policies side by side;
//! this module turns flags into an [`ExperimentSpec`] and prints or writes what came back.

use anyhow::{Context, Result, bail};
use clap::Args;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use tessera_scheduler::sim::experiment::DEFAULT_OFFERED_LOAD;
use tessera_scheduler::sim::{
    Contender, Experiment, ExperimentSpec, ModelChoice, PolicyReport, SIZE_BUCKETS, SimPolicy, TraceSource, matrix,
    synthetic::SyntheticSpec,
};

#[derive(Args)]
pub struct SimArgs {
    /// Trace: `philly` (the Philly-derived per-VC jobs), `alibaba` (the Alibaba PAI v2023 pods,
    /// on their real node list by default), `synthetic` (generated: see --synthetic) or the path
    /// of a CSV with the columns of either.
    #[arg(long, default_value = "philly")]
    trace: String,
    /// Folder holding the traces (default: `../shared/traces` from the working directory, else
    /// beside the repository this binary was built from).
    #[arg(long, env = "TESSERA_TRACES")]
    traces_dir: Option<PathBuf>,
    /// Philly virtual cluster to replay, or `all` (every VC on one clock).
    #[arg(long, default_value = "all")]
    vc: String,
    /// Policies, comma-separated: the presets (the default: all of them) or any built-in
    /// scheduler by name (locality-tolerant, cpu-aware, optimus, ...).
    #[arg(long, value_delimiter = ',', value_parser = Contender::builtin)]
    policies: Vec<Contender>,
    /// Cluster spec file. Default: Philly on `seed-8gpu` servers sized so that the trace offers
    /// `--offered-load` of their GPUs (queues form); Alibaba on its real node list.
    #[arg(long)]
    cluster: Option<PathBuf>,
    /// Offered load the default Philly cluster is sized for (ignored with --cluster).
    #[arg(long, default_value_t = DEFAULT_OFFERED_LOAD)]
    offered_load: f64,
    /// Arrival-rate multiplier: arrival times are divided by it (default 1 for Philly, 300 for
    /// Alibaba).
    #[arg(long)]
    load_scale: Option<f64>,
    /// Seed of the searches' probe order (the only randomness); with --matrix, of every cell.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Speed-model file, or `ideal` (no locality, interference or CPU effects). Default: the
    /// compiled-in `deploy/sim/speed-model.toml`.
    #[arg(long)]
    model: Option<String>,
    /// Replay only the first N jobs by arrival.
    #[arg(long)]
    max_jobs: Option<usize>,
    /// Policies run at once (default: the machine's cores).
    #[arg(long)]
    threads: Option<usize>,
    /// With `--trace synthetic`: the generator's settings as `key=value` pairs, e.g.
    /// `seed=3,jobs=2000,multi=0.05,burst=4` (defaults: seed 1, 4,000 jobs, 3% of 16–64 GPUs,
    /// bursts at 4× the calm arrival rate; also burst_s, calm_s). With --matrix: the settings of
    /// the synthetic trace that replaces seeds 1–3 (one per --trace-seeds seed when given).
    #[arg(long, value_parser = SyntheticSpec::parse)]
    synthetic: Option<SyntheticSpec>,
    /// With --matrix: these synthetic traces' seeds instead of 1, 2 and 3 (e.g. `4,5,6`: traces
    /// no rule was measured on), with the matrix's 3,000 jobs or --synthetic's settings.
    #[arg(long, requires = "matrix", value_delimiter = ',')]
    trace_seeds: Vec<u64>,
    /// Run the robustness matrix instead of one experiment: every policy on the Philly trace and
    /// synthetic traces × offered loads × cluster sizes × speed models (docs/EVALUATION.md).
    #[arg(long)]
    matrix: bool,
    /// With --matrix: only the 8-server cells, on a Philly slice and one synthetic trace (CI).
    #[arg(long, requires = "matrix")]
    quick: bool,
    /// With --matrix: exit with status 1 when a cell misses a target.
    #[arg(long, requires = "matrix")]
    check: bool,
    /// With --matrix: only the cells whose label contains one of these (comma-separated), e.g.
    /// `--cells '8x8 ideal'` or `--cells 'synthetic-3 load=1.5 8x8 ideal'`; labels as printed.
    #[arg(long, requires = "matrix", value_delimiter = ',')]
    cells: Vec<String>,
    /// Print one JSON object keyed by policy name instead of a table.
    #[arg(long)]
    json: bool,
    /// Write per-policy CSVs (jobs, utilization), summary.json and SVG plots into this folder.
    #[arg(long)]
    out: Option<PathBuf>,
}

pub fn run(args: SimArgs) -> Result<ExitCode> {
    if args.matrix {
        return run_matrix(&args);
    }
    let policies: Vec<Contender> = if args.policies.is_empty() {
        SimPolicy::ALL.into_iter().map(Contender::from).collect()
    } else {
        dedup(&args.policies)
    };
    let inputs = experiment(&args)?.load()?;
    let gpus: u64 = inputs.cluster_gpus();
    let mut summary = vec![
        format!(
            "trace: {} — {} jobs{}",
            inputs.trace.name,
            inputs.trace.jobs.len(),
            args.max_jobs.map(|n| format!(" (--max-jobs {n})")).unwrap_or_default()
        ),
        format!("cluster: {} ({} servers, {gpus} GPUs)", inputs.cluster_note, inputs.cluster.server_count()),
        format!("speed model: {}; load scale {}; seed {}", inputs.model.name, inputs.load_scale, inputs.seed),
    ];
    summary.extend(inputs.notes.iter().cloned());
    for (reason, n) in &inputs.trace.skipped {
        summary.push(format!("skipped rows: {n} — {reason}"));
    }
    for (what, n) in &inputs.trace.approximated {
        summary.push(format!("approximated rows: {n} — {what}"));
    }
    for line in &summary {
        if args.json {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    }

    let reports = run_policies(&args, &inputs, &policies)?;

    if args.json {
        println!("{}", serde_json::to_string_pretty(&json_object(&reports))?);
    } else {
        print_table(&reports);
    }
    if let Some(dir) = &args.out {
        write_outputs(dir, &reports)?;
        let msg = format!("wrote CSVs, summary.json and SVG plots to {}", dir.display());
        if args.json {
            eprintln!("{msg}");
        } else {
            println!("{msg}");
        }
    }
    let bad: Vec<String> = reports
        .iter()
        .filter(|(_, r)| r.invariant_violations > 0 || r.finished < r.jobs)
        .map(|(p, r)| {
            format!("{}: {} invariant violations, {}/{} finished", p, r.invariant_violations, r.finished, r.jobs)
        })
        .collect();
    if !bad.is_empty() {
        bail!("simulation check failed: {}", bad.join("; "));
    }
    Ok(ExitCode::SUCCESS)
}

fn dedup(p: &[Contender]) -> Vec<Contender> {
    let mut out: Vec<Contender> = Vec::new();
    for x in p {
        if !out.iter().any(|o| o.name == x.name) {
            out.push(x.clone());
        }
    }
    out
}

/// The traces folder: the flag or `$TESSERA_TRACES`, else `../shared/traces` from the working
/// directory (the repository root), else beside the repository this binary was built from.
fn traces_dir(args: &SimArgs) -> PathBuf {
    if let Some(d) = &args.traces_dir {
        return d.clone();
    }
    let cwd = PathBuf::from("../shared/traces");
    if cwd.is_dir() {
        return cwd;
    }
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/traces");
    if built.is_dir() { built } else { cwd }
}

/// The experiment the flags describe.
fn experiment(args: &SimArgs) -> Result<ExperimentSpec> {
    if args.synthetic.is_some() && args.trace != "synthetic" {
        bail!("--synthetic applies to --trace synthetic");
    }
    let trace = match args.trace.as_str() {
        "philly" => TraceSource::Philly,
        "alibaba" => TraceSource::Alibaba,
        "synthetic" => TraceSource::Synthetic(args.synthetic.clone().unwrap_or_else(|| SyntheticSpec::new(1))),
        p => TraceSource::File(PathBuf::from(p)),
    };
    let mut e = ExperimentSpec::new(&traces_dir(args), trace);
    e.vc = (args.vc != "all").then(|| args.vc.clone());
    e.cluster = args.cluster.clone();
    e.offered_load = args.offered_load;
    e.load_scale = args.load_scale;
    e.seed = args.seed;
    e.model = match args.model.as_deref() {
        None => ModelChoice::Builtin,
        Some("ideal") => ModelChoice::Ideal,
        Some(f) => ModelChoice::File(PathBuf::from(f)),
    };
    e.max_jobs = args.max_jobs;
    Ok(e)
}

/// Runs every policy, up to `--threads` at once, with one progress bar each (drawn only when
/// stderr is a terminal). Results come back in `policies` order.
fn run_policies(args: &SimArgs, inputs: &Experiment, policies: &[Contender]) -> Result<Vec<(String, PolicyReport)>> {
    let target =
        if std::io::stderr().is_terminal() { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() };
    let multi = MultiProgress::with_draw_target(target);
    let style = ProgressStyle::with_template("{prefix:>30} [{bar:30}] {percent:>3}% {elapsed_precise} {msg}")
        .map_err(|e| anyhow::anyhow!("progress bar template: {e}"))?
        .progress_chars("=> ");
    let bars: Vec<ProgressBar> = policies
        .iter()
        .map(|p| {
            let b = multi.add(ProgressBar::new(1));
            b.set_style(style.clone());
            b.set_prefix(p.name.clone());
            b
        })
        .collect();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let runs = inputs.run(policies, args.threads.unwrap_or(cores), &|k, done, total| {
        bars[k].set_length(total.max(1));
        bars[k].set_position(done);
    })?;
    let mut out = Vec::new();
    for ((p, r), bar) in runs.into_iter().zip(&bars) {
        let (report, wall_s) = r.with_context(|| p.clone())?;
        bar.finish_with_message(format!("{wall_s:.1} s"));
        // Wall time goes to stderr only: stdout stays identical across runs with one seed.
        eprintln!("{p:<30} simulated in {wall_s:.1} s");
        out.push((p, report));
    }
    Ok(out)
}

/// `tessera sim --matrix`: every cell, one line of progress each on stderr, then the table (or
/// the JSON array with `--json`).
fn run_matrix(args: &SimArgs) -> Result<ExitCode> {
    let contenders = if args.policies.is_empty() { matrix::default_contenders() } else { dedup(&args.policies) };
    let mut cells = matrix::cells_with(args.quick, &matrix_synthetic(args));
    if !args.cells.is_empty() {
        cells.retain(|c| {
            let label = c.label();
            args.cells.iter().any(|f| label.contains(f.as_str()))
        });
        if cells.is_empty() {
            bail!(
                "--cells {}: no cell's label contains it (labels look like `philly load=0.9 8x8 default`)",
                args.cells.join(",")
            );
        }
    }
    let dir = traces_dir(args);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = args.threads.unwrap_or(cores);
    let t0 = std::time::Instant::now();
    let mut results = Vec::with_capacity(cells.len());
    for (k, cell) in cells.iter().enumerate() {
        let r = matrix::run_cell(cell, &dir, &contenders, threads, args.seed).with_context(|| cell.label())?;
        eprintln!("[{}/{}] {:<40} {:>6.1} s", k + 1, cells.len(), r.label, r.wall_s);
        results.push(r);
    }
    eprintln!("matrix: {} cells in {:.0} s, seed {}", results.len(), t0.elapsed().as_secs_f64(), args.seed);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    } else {
        print_matrix(&results, &contenders);
    }
    let bad: Vec<String> = results
        .iter()
        .flat_map(|c| c.entries.iter().map(move |(n, e)| (c, n, &e.report)))
        .filter(|(_, _, r)| r.invariant_violations > 0 || r.finished < r.jobs || r.rejected_proposals > 0)
        .map(|(c, n, r)| {
            format!(
                "{} / {n}: {} invariant violations, {}/{} finished, {} refused proposals",
                c.label, r.invariant_violations, r.finished, r.jobs, r.rejected_proposals
            )
        })
        .collect();
    if !bad.is_empty() {
        bail!("simulation check failed: {}", bad.join("; "));
    }
    let missed = results.iter().filter(|r| !r.misses.is_empty()).count();
    let measured: Vec<f64> = results.iter().filter_map(|r| r.migration_ratio).collect();
    let cut = measured.iter().filter(|m| **m <= matrix::MIGRATION_TARGET).count();
    let line = format!(
        "targets met in {} of {} cells; migration cut the >=5-GPU jobs' fragmentation-blocked wait 3x in {cut} of the {} cells where it occurred",
        results.len() - missed,
        results.len(),
        measured.len()
    );
    if args.json {
        eprintln!("{line}");
    } else {
        println!("{line}");
    }
    Ok(if args.check && missed > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

/// The matrix's synthetic traces: seeds 1–3 with the matrix's settings, unless --trace-seeds
/// or --synthetic name others (--synthetic's settings, its seed replaced by each of
/// --trace-seeds when both are given).
fn matrix_synthetic(args: &SimArgs) -> Vec<SyntheticSpec> {
    let mut seeds = args.trace_seeds.clone();
    seeds.sort_unstable();
    seeds.dedup();
    match &args.synthetic {
        None if seeds.is_empty() => matrix::synthetic_traces(args.quick),
        None => seeds.into_iter().map(|seed| matrix::synthetic_spec(seed, args.quick)).collect(),
        Some(spec) if seeds.is_empty() => vec![spec.clone()],
        Some(spec) => seeds.into_iter().map(|seed| SyntheticSpec { seed, ..spec.clone() }).collect(),
    }
}

/// One row per cell: each policy's avg JCT over fifo-firstfit's, the utilization while jobs
/// wait of `tessera` minus fifo's (points), `tessera`'s fragmentation-blocked wait of ≥ 5-GPU
/// jobs over `tessera-no-migration`'s (migr), and the targets missed.
fn print_matrix(results: &[matrix::CellResult], contenders: &[Contender]) {
    let mut header = format!("{:<40} {:>6}", "cell (avg JCT / fifo-firstfit)", "jobs");
    for c in contenders {
        header.push_str(&format!(" {:>10}", short(&c.name)));
    }
    header.push_str(&format!(" {:>8} {:>6}  {}", "Δutil", "migr", "missed"));
    println!("{header}");
    for r in results {
        let mut line = format!("{:<40} {:>6}", r.label, r.jobs);
        for c in contenders {
            let v = r.entries.get(&c.name).and_then(|e| e.jct_ratio).map_or("-".to_string(), |x| format!("{x:.3}"));
            line.push_str(&format!(" {v:>10}"));
        }
        let delta = match (r.entries.get("tessera"), r.entries.get("fifo-firstfit")) {
            (Some(t), Some(f)) => format!("{:+.1}", 100.0 * (t.util_waiting - f.util_waiting)),
            _ => "-".to_string(),
        };
        let migr = r.migration_ratio.map_or("-".to_string(), |m| format!("{m:.2}"));
        line.push_str(&format!(
            " {delta:>8} {migr:>6}  {}",
            if r.misses.is_empty() { "-".to_string() } else { r.misses.join("; ") }
        ));
        println!("{line}");
    }
}

/// A column title of at most 10 characters.
fn short(name: &str) -> String {
    match name {
        "tessera-no-migration" => "t-no-migr".into(),
        "tessera-reserving" => "t-reserve".into(),
        "tessera-gpu-proportional-cpu" => "t-prop-cpu".into(),
        n => n.chars().take(10).collect(),
    }
}

fn json_object(reports: &[(String, PolicyReport)]) -> BTreeMap<&str, &PolicyReport> {
    reports.iter().map(|(p, r)| (p.as_str(), r)).collect()
}

/// `1234567.8` → `1,234,568`.
fn thousands(x: f64) -> String {
    let n = x.round() as i64;
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 { format!("-{out}") } else { out }
}

fn print_table(reports: &[(String, PolicyReport)]) {
    println!();
    println!(
        "{:<30} {:>6} {:>11} {:>11} {:>11} {:>11} {:>11} {:>5} {:>10} {:>10} {:>10} {:>10} {:>5} {:>5} {:>6}",
        "policy (times in s)",
        "jobs",
        "avg JCT",
        "p50 JCT",
        "p95 JCT",
        "p99 JCT",
        "makespan",
        "util",
        "queue 1",
        "queue 2-4",
        "queue 8",
        "queue >8",
        "frag",
        "pref",
        "migr"
    );
    for (p, r) in reports {
        let q = |b: &str| r.queue_s_by_size.get(b).copied().map_or_else(|| "-".into(), thousands);
        println!(
            "{:<30} {:>6} {:>11} {:>11} {:>11} {:>11} {:>11} {:>5.2} {:>10} {:>10} {:>10} {:>10} {:>5.2} {:>5.2} {:>6}",
            p,
            r.finished,
            thousands(r.avg_jct_s),
            thousands(r.p50_jct_s),
            thousands(r.p95_jct_s),
            thousands(r.p99_jct_s),
            thousands(r.makespan_s),
            r.gpu_utilization,
            q(SIZE_BUCKETS[0]),
            q(SIZE_BUCKETS[1]),
            q(SIZE_BUCKETS[2]),
            q(SIZE_BUCKETS[3]),
            r.fragmentation,
            r.preferred_locality_share,
            r.migrations
        );
    }
    println!();
    println!(
        "queue = mean arrival-to-start by job size (`8` = 5-8 GPUs); util = busy GPU-s / (GPUs × makespan); \
         frag = share of GPUs free while jobs waited; pref = share first placed at the tightest level that fits"
    );
}

fn write_outputs(dir: &Path, reports: &[(String, PolicyReport)]) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create", dir.display()))?;
    for (p, r) in reports {
        write_jobs_csv(&dir.join(format!("{}-jobs.csv", p)), r)?;
        write_utilization_csv(&dir.join(format!("{}-utilization.csv", p)), r)?;
    }
    let summary = dir.join("summary.json");
    std::fs::write(&summary, serde_json::to_string_pretty(&json_object(reports))? + "\n")
        .with_context(|| format!("{}: cannot write", summary.display()))?;
    plots::jct_cdf(&dir.join("jct-cdf.svg"), reports)?;
    plots::utilization(&dir.join("utilization.svg"), reports)?;
    plots::queue_by_size(&dir.join("queue-by-size.svg"), reports)?;
    Ok(())
}

fn csv_writer(path: &Path) -> Result<csv::Writer<std::fs::File>> {
    csv::Writer::from_path(path).with_context(|| format!("{}: cannot write", path.display()))
}

fn opt(x: Option<f64>) -> String {
    x.map(|v| format!("{v:.3}")).unwrap_or_default()
}

/// One row per job: id, GPUs, submit/start/end (s), JCT and queueing (s), level, moves. Jobs
/// that never started or finished leave those cells empty.
fn write_jobs_csv(path: &Path, r: &PolicyReport) -> Result<()> {
    let mut w = csv_writer(path)?;
    let ctx = || format!("{}: cannot write", path.display());
    w.write_record(["id", "gpus", "submit_s", "start_s", "end_s", "jct_s", "queue_s", "level", "moves"])
        .with_context(ctx)?;
    for j in &r.job_records {
        w.write_record([
            j.name.clone(),
            j.gpus.to_string(),
            format!("{:.3}", j.arrival_s),
            opt(j.start_s),
            opt(j.end_s),
            opt(j.end_s.map(|e| e - j.arrival_s)),
            opt(j.start_s.map(|s| s - j.arrival_s)),
            j.level.map(|l| l.to_string()).unwrap_or_default(),
            j.moves.to_string(),
        ])
        .with_context(ctx)?;
    }
    w.flush().with_context(ctx)?;
    Ok(())
}

/// The simulator's utilization series: time (s) and busy-GPU fraction, time-averaged per interval.
fn write_utilization_csv(path: &Path, r: &PolicyReport) -> Result<()> {
    let mut w = csv_writer(path)?;
    let ctx = || format!("{}: cannot write", path.display());
    w.write_record(["time_s", "busy_gpu_fraction"]).with_context(ctx)?;
    for (t, u) in &r.utilization {
        w.write_record([format!("{t:.3}"), format!("{u:.6}")]).with_context(ctx)?;
    }
    w.flush().with_context(ctx)?;
    Ok(())
}

/// SVG plots (plotters' SVG backend; text is written as SVG `<text>`, no font files needed).
mod plots {
    use super::{PolicyReport, SIZE_BUCKETS};
    use anyhow::{Result, anyhow};
    use plotters::prelude::*;
    use std::path::Path;

    const SIZE: (u32, u32) = (960, 560);
    /// Points per line at most (keeps the files small).
    const MAX_POINTS: usize = 400;
    const COLORS: [RGBColor; 7] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
    ];

    fn color(i: usize) -> RGBColor {
        COLORS[i % COLORS.len()]
    }

    fn err<E: std::fmt::Display>(path: &Path) -> impl Fn(E) -> anyhow::Error + '_ {
        move |e| anyhow!("{}: cannot draw: {e}", path.display())
    }

    /// Every `step`-th of `n` indices, always the last.
    fn thin(n: usize) -> impl Iterator<Item = usize> {
        let step = n.div_ceil(MAX_POINTS).max(1);
        (0..n).filter(move |k| k % step == 0 || *k + 1 == n)
    }

    /// JCT CDF per policy on one chart, logarithmic time axis.
    pub fn jct_cdf(path: &Path, reports: &[(String, PolicyReport)]) -> Result<()> {
        let e = err(path);
        let all = reports.iter().flat_map(|(_, r)| r.jct_s.iter().copied());
        let lo = all.clone().filter(|x| *x > 0.0).fold(f64::INFINITY, f64::min);
        let hi = all.fold(0.0, f64::max);
        let (lo, hi) = if lo.is_finite() && hi > lo { (lo.max(1.0) * 0.9, hi * 1.1) } else { (1.0, 10.0) };
        let root = SVGBackend::new(path, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(&e)?;
        let mut chart = builder(&root, "Job completion time, CDF", 56)
            .build_cartesian_2d((lo..hi).log_scale(), 0f64..1f64)
            .map_err(&e)?;
        chart
            .configure_mesh()
            .label_style(("sans-serif", 15))
            .axis_desc_style(("sans-serif", 16))
            .x_desc("JCT (s, log scale)")
            .y_desc("fraction of jobs")
            .x_label_formatter(&|x| format!("{x:.0e}"))
            .draw()
            .map_err(&e)?;
        draw_lines(&mut chart, reports, 2, |r| {
            let n = r.jct_s.len();
            thin(n).map(|k| (r.jct_s[k].max(lo), (k + 1) as f64 / n as f64)).collect()
        })
        .map_err(&e)?;
        legend(&mut chart, SeriesLabelPosition::LowerRight).map_err(&e)?;
        root.present().map_err(&e)?;
        Ok(())
    }

    /// Busy-GPU fraction over time per policy.
    pub fn utilization(path: &Path, reports: &[(String, PolicyReport)]) -> Result<()> {
        let e = err(path);
        let end = reports.iter().flat_map(|(_, r)| r.utilization.last().map(|(t, _)| *t)).fold(0.0, f64::max);
        let (unit, div) = if end > 3.0 * 86_400.0 { ("days", 86_400.0) } else { ("hours", 3_600.0) };
        let x_max = (end / div).max(1e-3) * 1.02;
        let root = SVGBackend::new(path, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(&e)?;
        let mut chart = builder(&root, "GPU utilization over time", 56)
            .build_cartesian_2d(0f64..x_max, 0f64..1.05f64)
            .map_err(&e)?;
        chart
            .configure_mesh()
            .label_style(("sans-serif", 15))
            .axis_desc_style(("sans-serif", 16))
            .x_label_formatter(&|x| if x_max >= 10.0 { format!("{x:.0}") } else { format!("{x:.1}") })
            .x_desc(format!("time ({unit})"))
            .y_desc("busy GPUs / all GPUs")
            .draw()
            .map_err(&e)?;
        draw_lines(&mut chart, reports, 1, |r| {
            thin(r.utilization.len()).map(|k| (r.utilization[k].0 / div, r.utilization[k].1)).collect()
        })
        .map_err(&e)?;
        legend(&mut chart, SeriesLabelPosition::UpperRight).map_err(&e)?;
        root.present().map_err(&e)?;
        Ok(())
    }

    /// Mean queueing delay by job-size bucket, one bar per policy in each bucket's group.
    pub fn queue_by_size(path: &Path, reports: &[(String, PolicyReport)]) -> Result<()> {
        let e = err(path);
        let value = |r: &PolicyReport, b: &str| r.queue_s_by_size.get(b).copied().unwrap_or(0.0) / 3_600.0;
        let y_max = reports
            .iter()
            .flat_map(|(_, r)| SIZE_BUCKETS.iter().map(move |b| value(r, b)))
            .fold(0.0, f64::max)
            .max(1e-3)
            * 1.1;
        let root = SVGBackend::new(path, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(&e)?;
        let mut chart = builder(&root, "Mean queueing delay by job size", 64)
            .build_cartesian_2d(-0.5f64..(SIZE_BUCKETS.len() as f64 - 0.5), 0f64..y_max)
            .map_err(&e)?;
        chart
            .configure_mesh()
            .label_style(("sans-serif", 15))
            .axis_desc_style(("sans-serif", 16))
            .disable_x_mesh()
            .x_labels(SIZE_BUCKETS.len())
            .x_label_formatter(&|x| {
                let k = x.round();
                if (x - k).abs() < 1e-6 && k >= 0.0 {
                    SIZE_BUCKETS
                        .get(k as usize)
                        .map(|b| format!("{b} GPU{}", if *b == "1" { "" } else { "s" }))
                        .unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .y_label_formatter(&|y| if y_max >= 10.0 { format!("{y:.0}") } else { format!("{y:.2}") })
            .x_desc("job size (8 = 5-8 GPUs)")
            .y_desc("mean queueing delay (hours)")
            .draw()
            .map_err(&e)?;
        let n = reports.len().max(1) as f64;
        let width = 0.8 / n;
        for (i, (p, r)) in reports.iter().enumerate() {
            let c = color(i);
            let bars = SIZE_BUCKETS.iter().enumerate().map(|(b, name)| {
                let x0 = b as f64 - 0.4 + i as f64 * width;
                Rectangle::new([(x0, 0.0), (x0 + width * 0.92, value(r, name))], c.filled())
            });
            chart
                .draw_series(bars)
                .map_err(&e)?
                .label(p)
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], c.filled()));
        }
        legend(&mut chart, SeriesLabelPosition::UpperLeft).map_err(&e)?;
        root.present().map_err(&e)?;
        Ok(())
    }

    /// A chart builder with the common title, margin and label areas.
    fn builder<'a, 'b>(
        root: &'a DrawingArea<SVGBackend<'b>, plotters::coord::Shift>,
        title: &str,
        y_area: u32,
    ) -> ChartBuilder<'a, 'b, SVGBackend<'b>> {
        let mut b = ChartBuilder::on(root);
        b.caption(title, ("sans-serif", 26)).margin(14).x_label_area_size(44).y_label_area_size(y_area);
        b
    }

    /// One line per policy, `points(report)` giving its `(x, y)` points, with a legend entry.
    fn draw_lines<'a, X: Ranged<ValueType = f64>>(
        chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, plotters::coord::types::RangedCoordf64>>,
        reports: &[(String, PolicyReport)],
        width: u32,
        points: impl Fn(&PolicyReport) -> Vec<(f64, f64)>,
    ) -> Result<(), DrawingAreaErrorKind<std::io::Error>> {
        for (i, (p, r)) in reports.iter().enumerate() {
            let c = color(i);
            chart
                .draw_series(LineSeries::new(points(r), c.stroke_width(width)))?
                .label(p)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        }
        Ok(())
    }

    fn legend<'a, DB: DrawingBackend + 'a, CT: plotters::coord::CoordTranslate>(
        chart: &mut ChartContext<'a, DB, CT>,
        at: SeriesLabelPosition,
    ) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
        chart
            .configure_series_labels()
            .position(at)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 14))
            .draw()
    }
}
