//! The job-speed model: how fast a job runs where it was placed.
//!
//! Parameters are data (`deploy/sim/speed-model.toml`, compiled in as [`SpeedModel::builtin`]);
//! their sources are listed in `docs/EVALUATION.md`. A job's speed (1 = the duration the trace
//! gives) is the product of a locality factor, an interference factor and a CPU factor. The
//! [`SpeedModel::ideal`] model has none of them, so queueing alone can be compared with other
//! simulators.
//!
//! The simulator runs jobs at these speeds; a live cluster reads only the locality losses: a
//! job spec that names its `model` and declares no `slowdown` is given its class's losses when
//! the leader admits it ([`SpeedModel::default_slowdown`]), so its host weighs locality by cost
//! as it would with a declared one. The figures are written into the admitted spec (the log
//! entry), so replicas never read this table when they apply.

use crate::error::SpecError;
use crate::job::JobSpec;
use crate::locality::LocalityLevel;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::LazyLock;

/// The shipped model file.
pub const BUILTIN_MODEL: &str = include_str!("../../../deploy/sim/speed-model.toml");

/// One model class: CPU sweet point and curve, locality and interference losses.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpeedClass {
    /// Cores per GPU for best speed (θ).
    pub theta: f64,
    /// Coefficient of `ln C` in `S(C)`.
    pub p0: f64,
    /// Coefficient of `C` in `S(C)`.
    pub p1: f64,
    /// Loss with GPUs in one socket but under several PCIe switches.
    pub socket: f64,
    /// Loss with GPUs under both sockets of one server.
    pub server: f64,
    /// Loss with GPUs on two servers.
    pub two_servers: f64,
    /// Loss with GPUs on four or more servers (three: halfway between two and four).
    pub four_servers: f64,
    /// Loss while another job holds a GPU under one of this job's PCIe switches.
    pub interference: f64,
}

impl SpeedClass {
    /// The CPU factor with `cores` cores per GPU and sweet point `theta`: `S(C)/S(θ)`, 1 at or
    /// beyond θ (and for θ ≤ 1, where one core is all the job uses).
    pub fn cpu_factor(&self, theta: f64, cores: f64) -> f64 {
        if theta <= 1.0 || cores >= theta {
            return 1.0;
        }
        let s = |c: f64| self.p0 * c.ln() + self.p1 * c;
        let best = s(theta);
        if best <= 0.0 { 1.0 } else { (s(cores.max(1.0)) / best).clamp(0.01, 1.0) }
    }

    /// The locality factor for a gang on `servers` servers at `level`.
    pub fn locality_factor(&self, level: LocalityLevel, servers: usize) -> f64 {
        let loss = match servers {
            0 | 1 => match level {
                LocalityLevel::PcieSwitch => 0.0,
                LocalityLevel::Socket => self.socket,
                _ => self.server,
            },
            2 => self.two_servers,
            3 => (self.two_servers + self.four_servers) / 2.0,
            _ => self.four_servers,
        };
        1.0 - loss
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    name: String,
    default_class: String,
    #[serde(default)]
    job_types: BTreeMap<String, String>,
    classes: BTreeMap<String, SpeedClass>,
}

/// A speed model: classes and the mapping of trace job types to them.
#[derive(Clone, Debug, PartialEq)]
pub struct SpeedModel {
    /// Its name (reported with results).
    pub name: String,
    /// Classes by name.
    pub classes: Vec<(String, SpeedClass)>,
    /// `(job-type prefix, class index)`, longest prefix first.
    job_types: Vec<(String, usize)>,
    /// Class of unmatched types.
    default_class: usize,
    /// No effects at all.
    pub ideal: bool,
}

impl SpeedModel {
    /// Parses a model file; `file` names it in errors.
    pub fn from_toml(file: &str, text: &str) -> Result<SpeedModel, SpecError> {
        let raw: RawModel = toml::from_str(text)
            .map_err(|e| SpecError::Syntax { file: file.to_string(), message: e.to_string().trim_end().to_string() })?;
        let classes: Vec<(String, SpeedClass)> = raw.classes.into_iter().collect();
        for (name, c) in &classes {
            let field = format!("classes.{name}");
            let losses = [c.socket, c.server, c.two_servers, c.four_servers, c.interference];
            if losses.iter().any(|l| !(0.0..1.0).contains(l)) {
                return Err(SpecError::invalid(file, field, "every loss must be in [0, 1)"));
            }
            if !(c.theta.is_finite() && c.theta > 0.0 && c.p0.is_finite() && c.p1.is_finite()) {
                return Err(SpecError::invalid(file, field, "theta must be positive, p0 and p1 finite"));
            }
        }
        let index = |class: &str, field: &str| {
            classes
                .iter()
                .position(|(n, _)| n == class)
                .ok_or_else(|| SpecError::invalid(file, field, format!("names unknown class `{class}`")))
        };
        let default_class = index(&raw.default_class, "default_class")?;
        let mut job_types = Vec::new();
        for (prefix, class) in &raw.job_types {
            job_types.push((prefix.clone(), index(class, &format!("job_types.{prefix}"))?));
        }
        job_types.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
        Ok(SpeedModel { name: raw.name, classes, job_types, default_class, ideal: false })
    }

    /// The shipped model.
    pub fn builtin() -> SpeedModel {
        // Checked by a unit test; a broken shipped file is a build defect.
        SpeedModel::from_toml("<builtin speed-model.toml>", BUILTIN_MODEL)
            .unwrap_or_else(|e| panic!("the compiled-in speed model is invalid: {e}"))
    }

    /// The model with no locality, interference or CPU effects (classes still map job types,
    /// so CPU-aware policies ask the same cores).
    pub fn ideal() -> SpeedModel {
        SpeedModel { name: "ideal".into(), ideal: true, ..SpeedModel::builtin() }
    }

    /// The class index of a trace job type.
    pub fn class_of(&self, job_type: &str) -> usize {
        self.job_types.iter().find(|(p, _)| job_type.starts_with(p.as_str())).map_or(self.default_class, |(_, c)| *c)
    }

    /// The class of a job spec's `model`: a class named so, else the class of the job types it
    /// starts with (`ResNet-50` → `cnn-imagenet`), else the default class, as for a trace job
    /// of an unknown type.
    pub fn class_of_model(&self, model: &str) -> usize {
        self.classes.iter().position(|(n, _)| n == model).unwrap_or_else(|| self.class_of(model))
    }

    /// The model shipped with this build, parsed once.
    pub fn shipped() -> &'static SpeedModel {
        static SHIPPED: LazyLock<SpeedModel> = LazyLock::new(SpeedModel::builtin);
        &SHIPPED
    }

    /// The losses `spec` is admitted with: what it declares, or, when it declares none and
    /// names its `model`, that model's class's ([`SpeedModel::slowdown_of`]); `None` when
    /// nothing is to be filled in.
    pub fn default_slowdown(&self, spec: &JobSpec) -> Option<BTreeMap<LocalityLevel, f64>> {
        let model = spec.model.as_deref().filter(|_| spec.slowdown.is_empty())?;
        Some(self.slowdown_of(self.class_of_model(model)))
    }

    /// A class by index.
    pub fn class(&self, i: usize) -> &SpeedClass {
        &self.classes[i].1
    }

    /// The CPU sweet point a job whose real one is `theta` declares in its spec's predictor:
    /// `theta` itself, but 1 under the `ideal` model, where a job runs at full speed on any
    /// number of cores and so gains nothing from more than one (as its declared `slowdown` is 0
    /// at every level there, [`SpeedModel::slowdown_of`]).
    pub fn declared_theta(&self, theta: f64) -> f64 {
        if self.ideal { 1.0 } else { theta }
    }

    /// The throughput a job of class `class` loses at each locality level, as a job spec's
    /// `slowdown` declares it: none at one PCIe switch, the class's socket and server losses,
    /// and its two-server loss for rack and wider levels (the least a gang beyond one server
    /// can lose). All 0 under the `ideal` model.
    pub fn slowdown_of(&self, class: usize) -> BTreeMap<LocalityLevel, f64> {
        let c = self.class(class);
        let loss = |x: f64| if self.ideal { 0.0 } else { x };
        [
            (LocalityLevel::PcieSwitch, 0.0),
            (LocalityLevel::Socket, loss(c.socket)),
            (LocalityLevel::Server, loss(c.server)),
            (LocalityLevel::Rack, loss(c.two_servers)),
            (LocalityLevel::IbDomain, loss(c.two_servers)),
            (LocalityLevel::Any, loss(c.two_servers)),
        ]
        .into_iter()
        .collect()
    }

    /// The speed of a job of class `class` (sweet point `theta`) placed at `level` over
    /// `servers` servers with `cores_per_gpu` cores per GPU, `interfered` when it shares a
    /// PCIe switch with another job.
    pub fn speed(
        &self,
        class: usize,
        theta: f64,
        level: LocalityLevel,
        servers: usize,
        cores_per_gpu: f64,
        interfered: bool,
    ) -> f64 {
        if self.ideal {
            return 1.0;
        }
        let c = self.class(class);
        let interference = if interfered { 1.0 - c.interference } else { 1.0 };
        c.locality_factor(level, servers) * interference * c.cpu_factor(theta, cores_per_gpu)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_model_maps_types_and_computes_speeds() {
        let m = SpeedModel::builtin();
        let cnn = m.class_of("ResNet-50 (batch size 32)");
        assert_eq!(m.classes[cnn].0, "cnn-imagenet");
        assert_eq!(m.classes[m.class_of("LM (batch size 5)")].0, "language");
        assert_eq!(m.classes[m.class_of("A3C")].0, "default");
        // 4-GPU ResNet-50: 2 servers -28%, 4 servers -59%.
        let s = |lvl, n| m.speed(cnn, 11.0, lvl, n, 11.0, false);
        assert!((s(LocalityLevel::Rack, 2) - 0.72).abs() < 1e-9);
        assert!((s(LocalityLevel::Rack, 4) - 0.41).abs() < 1e-9);
        assert_eq!(s(LocalityLevel::PcieSwitch, 1), 1.0);
        // CPU: at θ full speed, starved slower, LM (θ = 1) never CPU-bound.
        let c = m.class(cnn);
        assert_eq!(c.cpu_factor(11.0, 16.0), 1.0);
        assert!(c.cpu_factor(11.0, 4.0) < 0.5);
        assert_eq!(m.class(m.class_of("LM")).cpu_factor(1.0, 1.0), 1.0);
        // Interference: Gandiva's LM pair loses 19%.
        let lm = m.class_of("LM");
        assert!((m.speed(lm, 1.0, LocalityLevel::PcieSwitch, 1, 1.0, true) - 0.81).abs() < 1e-9);
        assert_eq!(SpeedModel::ideal().speed(cnn, 11.0, LocalityLevel::Any, 8, 1.0, true), 1.0);
    }

    #[test]
    fn a_job_declares_what_it_loses_and_under_ideal_it_loses_nothing() {
        let (m, ideal) = (SpeedModel::builtin(), SpeedModel::ideal());
        let cnn = m.class_of("ResNet-50");
        assert_eq!(m.declared_theta(11.0), 11.0);
        assert_eq!(ideal.declared_theta(11.0), 1.0, "one core per GPU runs at full speed under ideal");
        assert!(ideal.speed(cnn, 11.0, LocalityLevel::PcieSwitch, 1, 1.0, false) == 1.0);
        assert_eq!(m.slowdown_of(cnn)[&LocalityLevel::Rack], 0.28);
        assert!(ideal.slowdown_of(cnn).values().all(|s| *s == 0.0));
    }

    #[test]
    fn a_spec_naming_its_model_and_declaring_no_loss_takes_its_class_figures() {
        let m = SpeedModel::builtin();
        assert_eq!(m.classes[m.class_of_model("ResNet-50")].0, "cnn-imagenet", "a job type's prefix");
        assert_eq!(m.classes[m.class_of_model("inception-like")].0, "inception-like", "a class by name");
        assert_eq!(m.classes[m.class_of_model("my-own-net")].0, "default", "unknown: the default class");
        let mut spec = JobSpec::simple("j", 2, 4);
        assert_eq!(m.default_slowdown(&spec), None, "no model named");
        spec.model = Some("LM-big".into());
        let lm = m.default_slowdown(&spec).expect("filled in");
        assert_eq!((lm[&LocalityLevel::Server], lm[&LocalityLevel::Rack]), (0.11, 0.28));
        spec.slowdown = BTreeMap::from([(LocalityLevel::Rack, 0.5)]);
        assert_eq!(m.default_slowdown(&spec), None, "a declared loss wins");
        assert_eq!(SpeedModel::shipped(), &m);
    }

    #[test]
    fn bad_model_files_are_refused() {
        let e = SpeedModel::from_toml("m.toml", "name='x'\ndefault_class='nope'\n[classes]\n").expect_err("bad");
        assert!(e.to_string().contains("unknown class `nope`"), "{e}");
        let text = BUILTIN_MODEL.replace("interference = 0.19", "interference = 1.5");
        let e = SpeedModel::from_toml("m.toml", &text).expect_err("bad");
        assert!(e.to_string().contains("classes.language"), "{e}");
    }
}
