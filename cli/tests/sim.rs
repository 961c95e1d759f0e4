//! `tessera sim`, run as a user would: JSON keys and determinism, the files `--out` writes,
//! and bad traces reported with row and column.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const PHILLY_HEADER: &str = "job_id,vc,submit_time_s,num_gpus,duration_s_v100,job_type,total_steps";
const POLICIES: [&str; 8] = [
    "fifo-firstfit",
    "gandiva",
    "hived",
    "tessera",
    "tessera-no-migration",
    "tessera-reserving",
    "tessera-gpu-proportional-cpu",
    "tessera-las",
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn shared_traces() -> PathBuf {
    repo().join("../shared/traces")
}

/// Whether the shared real traces are beside the checkout. When they are not, the tests that
/// use them say so on stderr and run on synthetic data instead; under CI (`CI` set), where
/// they are always present, their absence fails the test rather than passing on less.
fn real_traces_present(what: &str) -> bool {
    let dir = shared_traces();
    if dir.join("philly-vc-jobs.csv").is_file() {
        return true;
    }
    assert!(std::env::var_os("CI").is_none(), "{what}: the shared traces are missing at {}", dir.display());
    eprintln!("NOTE {what}: no shared traces at {}; this part runs on synthetic data only", dir.display());
    false
}

fn tessera(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .current_dir(repo())
        .env_remove("TESSERA_TRACES")
        .output()
        .expect("run tessera")
}

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// A small Philly slice: the first 240 data rows of the real trace when it is there (most of
/// them from one VC's busiest start), else a synthetic file with the same columns and mix.
fn philly_slice(dir: &Path) -> PathBuf {
    let real = shared_traces().join("philly-vc-jobs.csv");
    let body = match real_traces_present("philly slice").then(|| std::fs::read_to_string(&real)) {
        Some(t) => t.expect("read the shared Philly trace").lines().take(241).collect::<Vec<_>>().join("\n") + "\n",
        None => {
            let sizes = [1, 1, 2, 1, 4, 1, 8, 1, 1, 4];
            let types = ["ResNet-50 (batch size 32)", "LM (batch size 5)", "A3C", "ResNet-18 (batch size 64)"];
            let mut s = format!("{PHILLY_HEADER}\n");
            for i in 0..240usize {
                let d = if i % 11 == 0 { "nan".to_string() } else { (900 + (i * 7919) % 97 * 600).to_string() };
                s += &format!(
                    "{i},vc{},{},{},{d},{},1\n",
                    i % 3,
                    i * 90,
                    sizes[i % sizes.len()],
                    types[i % types.len()]
                );
            }
            s
        }
    };
    let p = dir.join("philly-slice.csv");
    std::fs::write(&p, body).expect("write slice");
    p
}

#[test]
fn json_has_every_key_for_every_policy_and_is_deterministic() {
    let dir = tempfile::tempdir().expect("tmp");
    let slice = philly_slice(dir.path());
    let slice = slice.to_str().expect("utf-8 path");
    let args = ["sim", "--trace", slice, "--max-jobs", "200", "--seed", "7", "--json"];
    let a = tessera(&args);
    let (out_a, err_a) = text(&a);
    assert!(a.status.success(), "{err_a}");
    let b = tessera(&args);
    assert!(b.status.success(), "{:?}", text(&b));
    assert_eq!(out_a, text(&b).0, "same seed, same JSON");

    let v: serde_json::Value = serde_json::from_str(&out_a).expect("stdout is one JSON object");
    let obj = v.as_object().expect("object keyed by policy");
    assert_eq!(obj.len(), POLICIES.len(), "{out_a}");
    for p in POLICIES {
        let r = obj.get(p).unwrap_or_else(|| panic!("policy {p} in {out_a}"));
        for key in ["avg_jct_s", "p50_jct_s", "p99_jct_s", "makespan_s", "gpu_utilization", "migrations"] {
            assert!(r.get(key).is_some_and(serde_json::Value::is_number), "{p}: {key} in {r}");
        }
        for map in ["queue_s_by_size", "frag_blocked_s_by_size"] {
            let q = r.get(map).and_then(serde_json::Value::as_object).unwrap_or_else(|| panic!("{p}: {map}"));
            for bucket in ["1", "2-4", "8", ">8"] {
                assert!(q.get(bucket).is_some_and(serde_json::Value::is_number), "{p}: {map} {bucket} in {r}");
            }
        }
        assert_eq!(r["jobs"], 200, "{p}: --max-jobs");
        assert_eq!(r["finished"], 200, "{p}: every job finishes");
        assert_eq!(r["invariant_violations"], 0, "{p}");
    }
}

#[test]
fn out_writes_csvs_and_svg_plots() {
    let dir = tempfile::tempdir().expect("tmp");
    let slice = philly_slice(dir.path());
    let out = dir.path().join("out");
    let o = tessera(&[
        "sim",
        "--trace",
        slice.to_str().expect("utf-8"),
        "--policies",
        "fifo-firstfit,tessera",
        "--max-jobs",
        "120",
        "--out",
        out.to_str().expect("utf-8"),
    ]);
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stderr}");
    assert!(stdout.contains("fifo-firstfit") && stdout.contains("tessera") && stdout.contains("avg JCT"), "{stdout}");
    for p in ["fifo-firstfit", "tessera"] {
        let jobs = std::fs::read_to_string(out.join(format!("{p}-jobs.csv"))).expect("jobs csv");
        let mut lines = jobs.lines();
        assert_eq!(lines.next(), Some("id,gpus,submit_s,start_s,end_s,jct_s,queue_s,level,moves"));
        assert_eq!(lines.count(), 120, "{p}: one row per job");
        let util = std::fs::read_to_string(out.join(format!("{p}-utilization.csv"))).expect("utilization csv");
        assert!(util.starts_with("time_s,busy_gpu_fraction\n") && util.lines().count() > 10, "{p}");
    }
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).expect("summary")).expect("json");
    assert!(summary.get("tessera").is_some(), "{summary}");
    for svg in ["jct-cdf.svg", "utilization.svg", "queue-by-size.svg"] {
        let s = std::fs::read_to_string(out.join(svg)).expect(svg);
        let s = s.trim();
        assert!(s.starts_with("<svg") || s.starts_with("<?xml"), "{svg}: {}", &s[..s.len().min(80)]);
        assert!(s.ends_with("</svg>"), "{svg}");
        assert!(s.contains("<text") && s.contains("tessera"), "{svg}: labels and legend are SVG text");
        assert_eq!(s.matches("<svg").count(), 1, "{svg}");
    }
}

#[test]
fn malformed_column_fails_with_row_and_column() {
    let dir = tempfile::tempdir().expect("tmp");
    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, format!("{PHILLY_HEADER}\n0,a,10,1,100,LM,1\n1,a,20,1,nan,LM,1\n2,a,ten,1,100,LM,1\n"))
        .expect("write");
    let o = tessera(&["sim", "--trace", bad.to_str().expect("utf-8"), "--json"]);
    let (stdout, stderr) = text(&o);
    assert!(!o.status.success(), "a malformed trace fails: {stdout}");
    assert!(stdout.is_empty(), "no partial JSON: {stdout}");
    let line = stderr.lines().find(|l| l.starts_with("error:")).unwrap_or_else(|| panic!("an error line: {stderr}"));
    assert!(line.contains("row 3") && line.contains("`submit_time_s`") && line.contains("`ten`"), "{line}");

    let missing = dir.path().join("missing.csv");
    std::fs::write(&missing, "job_id,vc,submit_time_s,num_gpus,job_type\n0,a,1,1,LM\n").expect("write");
    let o = tessera(&["sim", "--trace", missing.to_str().expect("utf-8")]);
    assert!(!o.status.success());
    assert!(text(&o).1.contains("missing column `duration_s_v100`"), "{:?}", text(&o));
}

#[test]
fn unusable_rows_are_counted_and_named_traces_resolve() {
    let dir = tempfile::tempdir().expect("tmp");
    let p = dir.path().join("few.csv");
    std::fs::write(
        &p,
        format!("{PHILLY_HEADER}\n0,a,0,1,100,LM,1\n1,a,5,2,nan,LM,1\n2,a,9,4,,A3C,1\n3,a,12,8,300,A3C,1\n"),
    )
    .expect("write");
    let o = tessera(&["sim", "--trace", p.to_str().expect("utf-8"), "--policies", "tessera"]);
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stderr}");
    assert!(stdout.contains("skipped rows: 2"), "{stdout}");
    if real_traces_present("named trace `philly`") {
        // The smallest VC of the real trace, found through the default traces folder.
        let o = tessera(&["sim", "--trace", "philly", "--vc", "795a4c", "--policies", "hived", "--json"]);
        assert!(o.status.success(), "{:?}", text(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
        assert!(v["hived"]["jobs"].as_u64().is_some_and(|n| n > 0), "{v}");
    }
}

#[test]
fn a_synthetic_trace_runs_from_its_seed_and_bad_settings_name_the_flag() {
    let args = ["sim", "--trace", "synthetic", "--synthetic", "seed=4,jobs=300,multi=0.05", "--json"];
    let first = tessera(&args);
    let (out, err) = text(&first);
    assert!(first.status.success(), "{err}");
    assert!(err.contains("synthetic seed=4 jobs=300"), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    for p in POLICIES {
        assert_eq!(v[p]["finished"], 300, "{p}: every job finishes");
    }
    assert_eq!(out, text(&tessera(&args)).0, "one seed, one result");
    let bad = tessera(&["sim", "--trace", "synthetic", "--synthetic", "jobs=0"]);
    assert!(!bad.status.success() && text(&bad).1.contains("--synthetic"), "{:?}", text(&bad));
    let stray = tessera(&["sim", "--synthetic", "seed=2"]);
    assert!(!stray.status.success() && text(&stray).1.contains("--trace synthetic"), "{:?}", text(&stray));
}

#[test]
fn the_quick_matrix_reports_every_cell_against_fifo_firstfit() {
    if !real_traces_present("quick matrix") {
        return;
    }
    let o = tessera(&["sim", "--matrix", "--quick", "--json"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("targets met in"), "{err}");
    let cells: Vec<serde_json::Value> = serde_json::from_str(&out).expect("JSON array");
    assert_eq!(cells.len(), 8);
    for c in &cells {
        let entries = c["entries"].as_object().expect("entries");
        assert_eq!(entries.len(), POLICIES.len(), "{}", c["label"]);
        assert_eq!(c["entries"]["fifo-firstfit"]["jct_ratio"], 1.0, "{}", c["label"]);
        for (name, e) in entries {
            assert_eq!(e["report"]["invariant_violations"], 0, "{} {name}", c["label"]);
            assert_eq!(e["report"]["finished"], e["report"]["jobs"], "{} {name}", c["label"]);
            let u = e["util_waiting"].as_f64().expect("number");
            assert!((0.0..=1.0).contains(&u), "{} {name}: {u}", c["label"]);
        }
        assert!(c["misses"].is_array());
    }
    // --check turns a missed target into a failing exit status.
    let missed = cells.iter().any(|c| !c["misses"].as_array().expect("array").is_empty());
    let checked = tessera(&["sim", "--matrix", "--quick", "--check"]);
    assert_eq!(checked.status.success(), !missed, "{}", text(&checked).1);
    // --cells keeps the cells whose label contains one of its words, and refuses a filter that
    // keeps none.
    let labels: Vec<&str> = cells.iter().map(|c| c["label"].as_str().expect("label")).collect();
    let some =
        tessera(&["sim", "--matrix", "--quick", "--json", "--cells", "load=1.5 8x8 ideal,philly[2000] load=0.9"]);
    let (out, err) = text(&some);
    assert!(some.status.success(), "{err}");
    let kept: Vec<serde_json::Value> = serde_json::from_str(&out).expect("JSON array");
    let want: Vec<&str> = labels
        .iter()
        .copied()
        .filter(|l| l.contains("load=1.5 8x8 ideal") || l.contains("philly[2000] load=0.9"))
        .collect();
    assert_eq!(kept.iter().map(|c| c["label"].as_str().expect("label")).collect::<Vec<_>>(), want);
    assert_eq!(want.len(), 4, "{labels:?}");
    // --seed seeds every cell's searches: recorded per cell, and it reaches the probe order
    // (some contender's figures differ from seed 1's).
    let reseeded = tessera(&[
        "sim",
        "--matrix",
        "--quick",
        "--json",
        "--seed",
        "5",
        "--cells",
        "load=1.5 8x8 ideal,philly[2000] load=0.9",
    ]);
    let (out, err) = text(&reseeded);
    assert!(reseeded.status.success(), "{err}");
    assert!(err.contains("seed 5"), "{err}");
    let other: Vec<serde_json::Value> = serde_json::from_str(&out).expect("JSON array");
    assert_eq!(other.len(), kept.len());
    assert!(kept.iter().all(|c| c["seed"] == 1) && other.iter().all(|c| c["seed"] == 5));
    let reports = |cells: &[serde_json::Value]| -> Vec<serde_json::Value> {
        cells
            .iter()
            .flat_map(|c| c["entries"].as_object().expect("entries").values().map(|e| e["report"].clone()))
            .collect()
    };
    assert_ne!(reports(&kept), reports(&other), "--seed 5 changed no contender's figures in any cell");
    // --trace-seeds replaces the synthetic trace with traces of other seeds (held-out traces),
    // and --synthetic sets the generator's other settings; the Philly cells stay.
    let held_out = tessera(&[
        "sim",
        "--matrix",
        "--quick",
        "--json",
        "--trace-seeds",
        "4,7",
        "--synthetic",
        "jobs=300,multi=0.1",
        "--cells",
        "synthetic,philly[2000] load=1.5 8x8 ideal",
    ]);
    let (out, err) = text(&held_out);
    assert!(held_out.status.success(), "{err}");
    let held: Vec<serde_json::Value> = serde_json::from_str(&out).expect("JSON array");
    let held_labels: Vec<&str> = held.iter().map(|c| c["label"].as_str().expect("label")).collect();
    let synthetic: Vec<&&str> = held_labels.iter().filter(|l| l.starts_with("synthetic")).collect();
    // 2 seeds × 2 loads × 2 models on the 8 servers of the quick matrix.
    assert_eq!(synthetic.len(), 8, "{held_labels:?}");
    assert!(
        synthetic.iter().all(|l| l.starts_with("synthetic-4[multi=0.1] ") || l.starts_with("synthetic-7[multi=0.1] "))
    );
    assert!(held_labels.contains(&"philly[2000] load=1.5 8x8 ideal"), "{held_labels:?}");
    assert!(held.iter().filter(|c| c["cell"]["trace"]["synthetic"].is_object()).all(|c| c["jobs"] == 300));
    let alone = tessera(&["sim", "--trace-seeds", "4"]);
    assert!(!alone.status.success() && text(&alone).1.contains("--matrix"), "{:?}", text(&alone));
    let none = tessera(&["sim", "--matrix", "--quick", "--cells", "no such cell"]);
    assert!(!none.status.success() && text(&none).1.contains("--cells no such cell"), "{:?}", text(&none));
}
