//! Trace loaders for the simulator: the Philly-derived per-VC jobs, the Alibaba PAI v2023 pods
//! and the Alibaba node list (a real cluster to replay the pods on).
//!
//! A malformed value is an error naming the data row (1-based; the header is row 0) and the
//! column. Rows that are well-formed but cannot be simulated (no duration, no GPU) are counted
//! per reason in [`Trace::skipped`], never dropped silently.

use crate::error::SchedulerError;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use tessera_view::cluster_spec::RackGroup;
use tessera_view::{ClusterSpec, Topology};

/// Servers per rack for clusters built from a node list (the trace gives no racks).
pub const NODE_LIST_RACK_SIZE: u32 = 32;

/// One job to simulate.
#[derive(Clone, Debug, PartialEq)]
pub struct SimJob {
    /// The trace's job id.
    pub name: String,
    /// Arrival, seconds from the trace's start (before load scaling).
    pub arrival_s: f64,
    /// GPUs.
    pub gpus: u32,
    /// Duration at full speed, seconds.
    pub duration_s: f64,
    /// The trace's job type (empty when it has none).
    pub job_type: String,
    /// CPU cores per GPU the job asked for, when the trace says.
    pub cores_per_gpu: Option<f64>,
    /// Memory per GPU the job asked for, when the trace says.
    pub memory_mib_per_gpu: Option<u32>,
    /// Required device type, when the trace says.
    pub gpu_type: Option<String>,
}

/// A loaded trace.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Trace {
    /// Where it came from.
    pub name: String,
    /// Usable jobs, by arrival (stable: ties keep file order).
    pub jobs: Vec<SimJob>,
    /// Rows not simulated, counted by reason.
    pub skipped: BTreeMap<String, u64>,
    /// Rows simulated with an approximation, counted by what was approximated.
    pub approximated: BTreeMap<String, u64>,
}

/// A CSV file with named columns; values parsed with row and column in errors.
struct Table {
    file: String,
    header: Vec<String>,
    rows: csv::StringRecordsIntoIter<Box<dyn Read>>,
}

impl Table {
    fn open(path: &Path) -> Result<Table, SchedulerError> {
        let file = path.display().to_string();
        match std::fs::File::open(path) {
            Ok(f) => Table::read(file, Box::new(f)),
            Err(e) => Err(SchedulerError::Csv { file, source: e.into() }),
        }
    }

    /// A table read from `input`; `file` names it in errors.
    fn read(file: String, input: Box<dyn Read>) -> Result<Table, SchedulerError> {
        let io = |e: csv::Error| SchedulerError::Csv { file: file.clone(), source: e };
        let mut rdr = csv::ReaderBuilder::new().flexible(true).from_reader(input);
        let header = rdr.headers().map_err(io)?.iter().map(|h| h.trim().to_string()).collect();
        Ok(Table { file, header, rows: rdr.into_records() })
    }

    fn column(&self, name: &'static str) -> Result<usize, SchedulerError> {
        self.header
            .iter()
            .position(|h| h == name)
            .ok_or(SchedulerError::MissingColumn { file: self.file.clone(), column: name })
    }

    fn bad(&self, row: u64, column: &'static str, message: String) -> SchedulerError {
        SchedulerError::BadValue { file: self.file.clone(), row, column, message }
    }

    /// The rows, numbered from 1.
    fn next_row(&mut self, row: u64) -> Option<Result<csv::StringRecord, SchedulerError>> {
        let r = self.rows.next()?;
        Some(r.map_err(|e| self.bad(row, "-", format!("unreadable row: {e}"))))
    }

    fn text<'r>(
        &self,
        rec: &'r csv::StringRecord,
        row: u64,
        col: (usize, &'static str),
    ) -> Result<&'r str, SchedulerError> {
        rec.get(col.0).map(str::trim).ok_or_else(|| self.bad(row, col.1, "missing (the row is too short)".into()))
    }

    /// A non-negative number; `None` for an empty cell or `nan` (an unusable, not a malformed,
    /// value: the traces write missing durations so).
    fn number(
        &self,
        rec: &csv::StringRecord,
        row: u64,
        col: (usize, &'static str),
    ) -> Result<Option<f64>, SchedulerError> {
        let raw = self.text(rec, row, col)?;
        if raw.is_empty() || raw.eq_ignore_ascii_case("nan") {
            return Ok(None);
        }
        match raw.parse::<f64>() {
            Ok(v) if v.is_finite() && v >= 0.0 => Ok(Some(v)),
            _ => Err(self.bad(row, col.1, format!("`{raw}` is not a non-negative number"))),
        }
    }

    fn required(&self, rec: &csv::StringRecord, row: u64, col: (usize, &'static str)) -> Result<f64, SchedulerError> {
        self.number(rec, row, col)?.ok_or_else(|| self.bad(row, col.1, "missing value".into()))
    }

    fn whole(
        &self,
        rec: &csv::StringRecord,
        row: u64,
        col: (usize, &'static str),
        max: u32,
    ) -> Result<u32, SchedulerError> {
        let v = self.required(rec, row, col)?;
        if v.fract() != 0.0 || v > f64::from(max) {
            return Err(self.bad(row, col.1, format!("{v} is not a whole number in 0..={max}")));
        }
        Ok(v as u32)
    }
}

fn count(map: &mut BTreeMap<String, u64>, reason: &str) {
    *map.entry(reason.to_string()).or_default() += 1;
}

fn finish(mut t: Trace, file: &str) -> Result<Trace, SchedulerError> {
    if t.jobs.is_empty() {
        return Err(SchedulerError::BadFile {
            file: file.to_string(),
            message: format!("no usable rows ({:?})", t.skipped),
        });
    }
    t.jobs.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
    Ok(t)
}

/// Reads `philly-vc-jobs.csv`. `vc` keeps one virtual cluster; otherwise every VC is replayed
/// on one clock (each VC's clock starts at 0 in the file, so this superposes them).
pub fn load_philly(path: &Path, vc: Option<&str>) -> Result<Trace, SchedulerError> {
    philly(Table::open(path)?, vc)
}

/// [`load_philly`] from any reader; `name` names the input in errors and in [`Trace::name`].
pub fn read_philly(name: &str, input: impl Read + 'static, vc: Option<&str>) -> Result<Trace, SchedulerError> {
    philly(Table::read(name.to_string(), Box::new(input))?, vc)
}

fn philly(mut tab: Table, vc: Option<&str>) -> Result<Trace, SchedulerError> {
    let c = |n: &'static str| tab.column(n).map(|i| (i, n));
    let (id, vcc, submit, gpus, dur, ty) =
        (c("job_id")?, c("vc")?, c("submit_time_s")?, c("num_gpus")?, c("duration_s_v100")?, c("job_type")?);
    let mut t = Trace {
        name: format!("{}{}", tab.file, vc.map(|v| format!(" (vc {v})")).unwrap_or_default()),
        ..Trace::default()
    };
    let mut row = 0u64;
    while let Some(rec) = tab.next_row(row + 1) {
        row += 1;
        let rec = rec?;
        if vc.is_some_and(|v| tab.text(&rec, row, vcc).is_ok_and(|x| x != v)) {
            continue;
        }
        let arrival_s = tab.required(&rec, row, submit)?;
        let g = tab.whole(&rec, row, gpus, 4096)?;
        if g == 0 {
            return Err(tab.bad(row, gpus.1, "a job needs at least one GPU".into()));
        }
        let Some(duration_s) = tab.number(&rec, row, dur)? else {
            count(&mut t.skipped, "no duration (duration_s_v100 empty or nan)");
            continue;
        };
        t.jobs.push(SimJob {
            name: tab.text(&rec, row, id)?.to_string(),
            arrival_s,
            gpus: g,
            duration_s: duration_s.max(1.0),
            job_type: tab.text(&rec, row, ty)?.to_string(),
            cores_per_gpu: None,
            memory_mib_per_gpu: None,
            gpu_type: None,
        });
    }
    finish(t, &tab.file)
}

/// Reads the Alibaba v2023 pod list. Pods without a duration (never ran) and pods with no GPU
/// are counted, not simulated; a fractional GPU (`gpu_milli` < 1000) is simulated as a whole
/// one and counted under `approximated`. `gpu_spec` (a model name of the node list) becomes a
/// device-type constraint.
pub fn load_alibaba_pods(path: &Path) -> Result<Trace, SchedulerError> {
    alibaba_pods(Table::open(path)?)
}

/// [`load_alibaba_pods`] from any reader; `name` names the input in errors and in [`Trace::name`].
pub fn read_alibaba_pods(name: &str, input: impl Read + 'static) -> Result<Trace, SchedulerError> {
    alibaba_pods(Table::read(name.to_string(), Box::new(input))?)
}

fn alibaba_pods(mut tab: Table) -> Result<Trace, SchedulerError> {
    let c = |n: &'static str| tab.column(n).map(|i| (i, n));
    let (id, submit, gpus, milli, dur, cpu, mem, spec) = (
        c("job_id")?,
        c("submit_time_s")?,
        c("num_gpus")?,
        c("gpu_milli")?,
        c("duration_s")?,
        c("cpu_milli")?,
        c("memory_mib")?,
        c("gpu_spec")?,
    );
    let mut t = Trace { name: tab.file.clone(), ..Trace::default() };
    let mut row = 0u64;
    while let Some(rec) = tab.next_row(row + 1) {
        row += 1;
        let rec = rec?;
        let arrival_s = tab.required(&rec, row, submit)?;
        let g = tab.whole(&rec, row, gpus, 4096)?;
        let gpu_milli = tab.required(&rec, row, milli)?;
        let cpu_milli = tab.required(&rec, row, cpu)?;
        let memory = tab.required(&rec, row, mem)?;
        let Some(duration_s) = tab.number(&rec, row, dur)? else {
            count(&mut t.skipped, "no duration (pod never ran)");
            continue;
        };
        if g == 0 {
            count(&mut t.skipped, "no GPU (CPU-only pod)");
            continue;
        }
        if gpu_milli < 1000.0 {
            count(&mut t.approximated, "fractional GPU simulated as a whole GPU");
        }
        let constraint = tab.text(&rec, row, spec)?;
        t.jobs.push(SimJob {
            name: tab.text(&rec, row, id)?.to_string(),
            arrival_s,
            gpus: g,
            duration_s: duration_s.max(1.0),
            job_type: String::new(),
            cores_per_gpu: Some((cpu_milli / 1000.0 / f64::from(g)).max(0.1)),
            memory_mib_per_gpu: Some(((memory / f64::from(g)) as u32).max(1)),
            gpu_type: (!constraint.is_empty()).then(|| device_type(constraint)),
        });
    }
    finish(t, &tab.file)
}

/// The device type of an Alibaba GPU model name.
pub fn device_type(model: &str) -> String {
    match model {
        "V100M16" => "nvidia-v100-16g".into(),
        "V100M32" => "nvidia-v100-32g".into(),
        "P100" => "nvidia-p100-16g".into(),
        "T4" => "nvidia-t4-16g".into(),
        "A10" => "nvidia-a10-24g".into(),
        // G2, G3 and others are anonymized in the trace.
        other => format!("alibaba-{}", other.to_ascii_lowercase()),
    }
}

/// A cluster built from a node list, with what was left out.
#[derive(Clone, Debug)]
pub struct NodeCluster {
    /// The cluster.
    pub spec: ClusterSpec,
    /// Nodes not in it, by reason.
    pub skipped: BTreeMap<String, u64>,
}

/// Builds a cluster from the Alibaba node list (`sn, cpu_milli, memory_mib, gpu, model`).
///
/// Each distinct (model, GPUs, cores, memory) becomes a topology: two sockets when the GPU count
/// is even (half the GPUs and cores each), else one; GPUs paired under PCIe switches within a
/// socket. The list gives no racks: nodes of one topology fill racks of
/// [`NODE_LIST_RACK_SIZE`], one InfiniBand domain per topology. Nodes without GPUs are counted
/// and left out (the view places GPU gangs only).
pub fn load_alibaba_nodes(path: &Path) -> Result<NodeCluster, SchedulerError> {
    alibaba_nodes(Table::open(path)?)
}

/// [`load_alibaba_nodes`] from any reader; `name` names the input in errors.
pub fn read_alibaba_nodes(name: &str, input: impl Read + 'static) -> Result<NodeCluster, SchedulerError> {
    alibaba_nodes(Table::read(name.to_string(), Box::new(input))?)
}

fn alibaba_nodes(mut tab: Table) -> Result<NodeCluster, SchedulerError> {
    let c = |n: &'static str| tab.column(n).map(|i| (i, n));
    let (sn, cpu, mem, gpu, model) = (c("sn")?, c("cpu_milli")?, c("memory_mib")?, c("gpu")?, c("model")?);
    let mut kinds: BTreeMap<(String, u32, u32, u32), u32> = BTreeMap::new();
    let mut skipped = BTreeMap::new();
    let mut row = 0u64;
    while let Some(rec) = tab.next_row(row + 1) {
        row += 1;
        let rec = rec?;
        tab.text(&rec, row, sn)?;
        let g = tab.whole(&rec, row, gpu, 64)?;
        let cores = (tab.required(&rec, row, cpu)? / 1000.0).floor() as u32;
        let memory = tab.whole(&rec, row, mem, u32::MAX)?;
        let name = tab.text(&rec, row, model)?.to_string();
        if g == 0 {
            count(&mut skipped, "no GPU");
            continue;
        }
        if cores == 0 || cores > 128 || memory == 0 {
            return Err(tab.bad(
                row,
                cpu.1,
                format!("{cores} cores / {memory} MiB: a server needs 1..=128 cores and memory"),
            ));
        }
        *kinds.entry((name, g, cores, memory)).or_default() += 1;
    }
    let mut spec = ClusterSpec {
        name: "alibaba-v2023".into(),
        topologies: Vec::new(),
        groups: Vec::new(),
        quotas: BTreeMap::new(),
        class_quotas: BTreeMap::new(),
        priorities: Default::default(),
        accounting: Default::default(),
    };
    for ((model, g, cores, memory), n) in kinds {
        let topo = node_topology(&model, g, cores, memory)
            .map_err(|e| SchedulerError::BadFile { file: tab.file.clone(), message: format!("model {model}: {e}") })?;
        let t = spec.topologies.len();
        let name = topo.name.clone();
        spec.topologies.push(topo);
        let mut left = n;
        let mut rack = 0;
        while left > 0 {
            let k = left.min(NODE_LIST_RACK_SIZE);
            spec.groups.push(RackGroup {
                rack: format!("{name}-r{rack}"),
                ib_domain: format!("{name}-ib"),
                topology: t,
                servers: k,
            });
            left -= k;
            rack += 1;
        }
    }
    if spec.groups.is_empty() {
        return Err(SchedulerError::BadFile { file: tab.file, message: "no node with GPUs".into() });
    }
    Ok(NodeCluster { spec, skipped })
}

fn node_topology(model: &str, gpus: u32, cores: u32, memory_mib: u32) -> Result<Topology, tessera_view::FieldError> {
    let sockets_n = if gpus >= 2 && gpus.is_multiple_of(2) && cores >= 2 { 2 } else { 1 };
    let per_socket = gpus / sockets_n;
    let mut sockets = Vec::new();
    let mut switches = Vec::new();
    for s in 0..sockets_n {
        let base = s * per_socket;
        let mut mask = 0u64;
        let mut d = 0;
        while d < per_socket {
            let width = (per_socket - d).min(2);
            let sw = ((1u64 << width) - 1) << (base + d);
            switches.push(sw);
            mask |= sw;
            d += width;
        }
        sockets.push(mask);
    }
    let t = Topology {
        name: format!("{}-{gpus}gpu-{cores}c-{}g", model.to_ascii_lowercase(), memory_mib / 1024),
        device_type: device_type(model),
        devices: gpus,
        sockets,
        pcie_switches: switches,
        nvlink_groups: Vec::new(),
        cores_per_socket: cores / sockets_n,
        memory_mib,
    };
    t.validate()?;
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(name: &str, text: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("tessera-sim-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp dir");
        let p = dir.join(name);
        std::fs::write(&p, text).expect("write");
        p
    }

    const PHILLY_HEADER: &str = "job_id,vc,submit_time_s,num_gpus,duration_s_v100,job_type,total_steps\n";

    #[test]
    fn philly_rows_are_loaded_counted_or_refused_with_row_and_column() {
        let p = write(
            "philly.csv",
            &format!(
                "{PHILLY_HEADER}0,a,10,1,100,LM (batch size 5),1\n1,b,0,8,nan,A3C,1\n2,a,5,4,,A3C,1\n3,b,3,2,50,A3C,1\n"
            ),
        );
        let t = load_philly(&p, None).expect("loads");
        assert_eq!(t.jobs.len(), 2);
        assert_eq!(t.jobs[0].name, "3", "sorted by arrival");
        assert_eq!(t.skipped.values().sum::<u64>(), 2, "rows without duration are counted");
        let t = load_philly(&p, Some("a")).expect("loads");
        assert_eq!((t.jobs.len(), t.skipped.values().sum::<u64>()), (1, 1));
        let p = write("bad.csv", &format!("{PHILLY_HEADER}0,a,10,1,100,x,1\n1,a,ten,1,100,x,1\n"));
        let e = load_philly(&p, None).expect_err("malformed").to_string();
        assert!(e.contains("row 2") && e.contains("`submit_time_s`") && e.contains("`ten`"), "{e}");
        let p = write("bad2.csv", &format!("{PHILLY_HEADER}0,a,10,1.5,100,x,1\n"));
        let e = load_philly(&p, None).expect_err("malformed").to_string();
        assert!(e.contains("row 1") && e.contains("`num_gpus`"), "{e}");
        let p = write("short.csv", &format!("{PHILLY_HEADER}0,a,10\n"));
        let e = load_philly(&p, None).expect_err("malformed").to_string();
        assert!(e.contains("row 1") && e.contains("`num_gpus`") && e.contains("too short"), "{e}");
        let p = write("nocol.csv", "job_id,vc,submit_time_s,num_gpus,job_type\n0,a,1,1,x\n");
        let e = load_philly(&p, None).expect_err("missing column").to_string();
        assert!(e.contains("duration_s_v100"), "{e}");
    }

    #[test]
    fn alibaba_pods_and_nodes() {
        let p = write(
            "pods.csv",
            "job_id,submit_time_s,num_gpus,gpu_milli,duration_s,queue_s,cpu_milli,memory_mib,gpu_spec,gpu_spec_aug33,qos,pod_phase,censored\n\
             a,0,1,1000,100,0,12000,16384,,,LS,Running,0\n\
             b,5,1,460,50,0,6000,12288,T4,,LS,Running,0\n\
             c,6,0,0,50,0,6000,12288,,,LS,Running,0\n\
             d,7,1,1000,,,6000,12288,,,BE,Pending,0\n",
        );
        let t = load_alibaba_pods(&p).expect("loads");
        assert_eq!(t.jobs.len(), 2);
        assert_eq!(t.jobs[0].cores_per_gpu, Some(12.0));
        assert_eq!(t.jobs[1].gpu_type.as_deref(), Some("nvidia-t4-16g"));
        assert_eq!(t.skipped.values().sum::<u64>(), 2);
        assert_eq!(t.approximated.values().sum::<u64>(), 1);
        let n = write(
            "nodes.csv",
            "sn,cpu_milli,memory_mib,gpu,model\nn0,96000,393216,8,G2\nn1,96000,393216,8,G2\nn2,8000,32768,1,V100M16\nn3,8000,32768,0,CPU\n",
        );
        let c = load_alibaba_nodes(&n).expect("loads");
        assert_eq!(c.spec.server_count(), 3);
        assert_eq!(c.skipped.get("no GPU"), Some(&1));
        let g2 = c.spec.topologies.iter().find(|t| t.devices == 8).expect("G2");
        assert_eq!((g2.sockets.len(), g2.pcie_switches.len(), g2.cores()), (2, 4, 96));
        let n = write("nodes-bad.csv", "sn,cpu_milli,memory_mib,gpu,model\nn0,96000,lots,8,G2\n");
        let e = load_alibaba_nodes(&n).expect_err("bad").to_string();
        assert!(e.contains("row 1") && e.contains("`memory_mib`"), "{e}");
    }
}
