//! Job-spec bodies of `POST /v1/jobs`: a job file as TOML (`Content-Type: application/toml`)
//! or the same shape as JSON. Both deserialize into [`JobFile`] and go through
//! [`JobFile::into_spec`], the checks `tessera submit` applies to a file.
//!
//! Errors say where, from the parsers' own data, never from their messages: the field's path
//! from `serde_path_to_error` (`locality.tolerate`), the line and column from `serde_json`'s
//! position or `toml`'s byte spans; a rule broken after parsing (a [`FieldError`]) is located
//! in a TOML body by the span of its key in the parsed document.

use super::error::{ApiError, Place};
use serde::Serialize;
use std::collections::BTreeMap;
use std::ops::Range;
use tessera_view::{FieldError, JobFile, JobSpec};
use utoipa::ToSchema;

/// The two body formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyFormat {
    /// `application/json` (or no content type).
    Json,
    /// `application/toml`, `text/toml`.
    Toml,
}

/// A job spec from a request body.
pub fn parse_spec(body: &[u8], format: BodyFormat) -> Result<JobSpec, ApiError> {
    let text = std::str::from_utf8(body).map_err(|e| ApiError::BadInput {
        code: "bad_body",
        message: format!("not UTF-8: {e}"),
        at: Place::default(),
    })?;
    match format {
        BodyFormat::Json => from_json(text),
        BodyFormat::Toml => from_toml(text),
    }
}

/// A path as `serde_path_to_error` writes it, or none for the whole document (`.`).
fn field_of(path: &serde_path_to_error::Path) -> Option<String> {
    let p = path.to_string();
    (p != ".").then_some(p)
}

fn from_json(text: &str) -> Result<JobSpec, ApiError> {
    let mut de = serde_json::Deserializer::from_str(text);
    let file: JobFile =
        serde_path_to_error::deserialize(&mut de).map_err(|e| json_error(text, field_of(e.path()), e.into_inner()))?;
    de.end().map_err(|e| json_error(text, None, e))?;
    file.into_spec().map_err(|e| invalid(e, Place::default()))
}

/// A JSON error: in well-formed JSON a wrong value or field (an invalid spec, at its path),
/// otherwise malformed JSON. Well-formedness is asked of the parser, not read from the error:
/// `serde_json` reports some wrong values (a number for an enum) as syntax errors.
fn json_error(text: &str, field: Option<String>, e: serde_json::Error) -> ApiError {
    let at = Place { field: None, line: u32::try_from(e.line()).ok(), column: u32::try_from(e.column()).ok() };
    let well_formed = serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok();
    if well_formed && e.classify() != serde_json::error::Category::Io {
        ApiError::BadInput { code: "invalid_spec", message: e.to_string(), at: Place { field, ..at } }
    } else {
        ApiError::BadInput { code: "malformed_json", message: e.to_string(), at }
    }
}

fn from_toml(text: &str) -> Result<JobSpec, ApiError> {
    let de = toml::de::Deserializer::parse(text).map_err(|e| {
        let at = place_of_span(text, e.span());
        ApiError::BadInput { code: "malformed_toml", message: located(e.message(), &at), at }
    })?;
    let file: JobFile = serde_path_to_error::deserialize(de).map_err(|e| {
        let field = field_of(e.path());
        let e = e.into_inner();
        let at = Place { field, ..place_of_span(text, e.span()) };
        ApiError::BadInput { code: "invalid_spec", message: located(e.message(), &at), at }
    })?;
    file.into_spec().map_err(|e| {
        let at = toml_key_span(text, &e.field).map(|s| place_of_span(text, Some(s))).unwrap_or_default();
        invalid(e, at)
    })
}

/// A broken rule as a 400 naming the field, at `at` when the body shows where.
fn invalid(e: FieldError, at: Place) -> ApiError {
    let at = Place { field: Some(e.field.clone()), ..at };
    ApiError::BadInput { code: "invalid_spec", message: located(&e.to_string(), &at), at }
}

/// `message` led by its line and column when known.
fn located(message: &str, at: &Place) -> String {
    match (at.line, at.column) {
        (Some(l), Some(c)) => format!("line {l} column {c}: {message}"),
        (Some(l), None) => format!("line {l}: {message}"),
        _ => message.to_string(),
    }
}

/// The 1-based line and column (in characters) of a byte span's start.
fn place_of_span(text: &str, span: Option<Range<usize>>) -> Place {
    let Some(span) = span else { return Place::default() };
    let at = span.start.min(text.len());
    let Some(before) = text.get(..at) else { return Place::default() };
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    Place { field: None, line: u32::try_from(line).ok(), column: u32::try_from(column).ok() }
}

/// The byte span of the key that a dotted field path (`locality.tolerate`, `command[0]`)
/// names in a TOML document; for a path that goes deeper than the document, the deepest key
/// written (a missing `locality.prefer` is located at its `[locality]` table).
fn toml_key_span(text: &str, field: &str) -> Option<Range<usize>> {
    use toml::de::{DeTable, DeValue};
    let doc = DeTable::parse(text).ok()?;
    let mut table = doc.get_ref();
    let mut found = None;
    let mut parts = field.split('.').peekable();
    while let Some(part) = parts.next() {
        let (key, index) = match part.split_once('[') {
            Some((k, i)) => (k, i.trim_end_matches(']').parse::<usize>().ok()),
            None => (part, None),
        };
        let Some((k, v)) = table.iter().find(|(k, _)| k.get_ref() == key) else { break };
        found = Some(k.span());
        let mut value = v;
        if let (Some(i), DeValue::Array(items)) = (index, v.get_ref()) {
            let Some(item) = items.get(i) else { break };
            found = Some(item.span());
            value = item;
        }
        match value.get_ref() {
            DeValue::Table(t) if parts.peek().is_some() => table = t,
            _ => break,
        }
    }
    found
}

/// The request body's schema in the OpenAPI document: the fields of a job file, as JSON. Only
/// documents [`JobFile`] (a test deserializes a value of every field of this into one).
#[derive(Debug, Serialize, ToSchema)]
pub struct JobFileBody {
    /// Display name (not blank).
    #[schema(min_length = 1, pattern = "\\S")]
    pub name: String,
    /// Total GPUs of the gang, a multiple of `members`; or give `gpus_per_member`.
    #[schema(minimum = 1)]
    pub gpus: Option<u32>,
    /// Gang members, each on one server (default 1).
    #[schema(minimum = 1, maximum = 4096)]
    pub members: Option<u32>,
    /// GPUs per member.
    #[schema(minimum = 1)]
    pub gpus_per_member: Option<u32>,
    /// Required device type (not blank).
    #[schema(min_length = 1, pattern = "\\S")]
    pub gpu_type: Option<String>,
    /// Tenant, for quotas (default `default`).
    pub tenant: Option<String>,
    /// Higher runs first (default 0).
    pub priority: Option<i32>,
    /// Memory per GPU, MiB (default: the server's share).
    #[schema(minimum = 1)]
    pub memory_mib_per_gpu: Option<u32>,
    /// The deep-learning model it trains (`ResNet-50`, `LM`, or a speed-model class); with no
    /// `locality.slowdown`, the job is admitted with that model's locality losses.
    #[schema(min_length = 1, max_length = 128, pattern = "\\S")]
    pub model: Option<String>,
    /// The command each member runs.
    pub command: Option<Vec<String>>,
    /// The scheduler that places the job (default: the host's).
    pub scheduler: Option<String>,
    /// Locality wishes.
    pub locality: Option<LocalityBody>,
    /// CPU demand (default: the server's share per GPU).
    pub cpu: Option<CpuBody>,
    /// Environment variables added to each task's (at most 128; not `TESSERA_*` nor one the
    /// agent sets, such as `RANK` or `CUDA_VISIBLE_DEVICES`).
    pub env: Option<BTreeMap<String, String>>,
    /// The absolute directory each task starts in.
    #[schema(pattern = "^/")]
    pub workdir: Option<String>,
    /// The longest a placement may be held, seconds; past it the job fails.
    #[schema(minimum = 1, maximum = 31622400)]
    pub time_limit_s: Option<u64>,
    /// After a member fails, restart the gang whole, at most `max` times (default: a failure
    /// ends the job).
    pub restart: Option<RestartBody>,
    /// Seconds a stopped task has between SIGTERM and SIGKILL (default: the agent's).
    #[schema(minimum = 0, maximum = 3600)]
    pub stop_grace_s: Option<u64>,
    /// Jobs that must finish before this one is placed (one that fails fails this one too; an
    /// array's first job stands for the array); at most 64 with `after_any`, none twice.
    #[schema(max_items = 64)]
    pub after: Option<Vec<u64>>,
    /// Jobs that must end, in any state, before this one is placed.
    #[schema(max_items = 64)]
    pub after_any: Option<Vec<u64>>,
    /// Admit this many jobs of this spec at once (consecutive ids; each task sees
    /// `TESSERA_ARRAY_INDEX`); the answer names the first.
    #[schema(minimum = 1, maximum = 1000)]
    pub array: Option<u32>,
}

/// The `restart` table of a job file.
#[derive(Debug, Serialize, ToSchema)]
pub struct RestartBody {
    /// Restarts allowed.
    #[schema(minimum = 1, maximum = 100)]
    pub max: u32,
    /// Seconds before the first restart (default 10), doubling each time up to 3,600.
    #[schema(minimum = 0, maximum = 3600)]
    pub backoff_s: Option<u64>,
}

/// The `[locality]` table of a job file.
#[derive(Debug, Serialize, ToSchema)]
pub struct LocalityBody {
    /// Tightest level wanted: `pcie-switch`, `socket`, `server`, `rack`, `ib-domain`, `any`.
    pub prefer: Option<String>,
    /// Loosest level accepted.
    pub tolerate: Option<String>,
    /// Loosen one level per this many seconds waited.
    pub relax_after_s: Option<u64>,
    /// Throughput lost per level, in `[0, 1)`.
    pub slowdown: Option<BTreeMap<String, f64>>,
}

/// The `[cpu]` table of a job file: a fixed grant, or a predictor.
#[derive(Debug, Serialize, ToSchema)]
pub struct CpuBody {
    /// Cores per GPU.
    pub cores_per_gpu: Option<u32>,
    /// `S(C) = p0 ln C + p1 C` below θ, `p2` from θ.
    pub predictor: Option<PredictorBody>,
    /// The fewest cores per GPU accepted (with `predictor`).
    pub min_cores_per_gpu: Option<u32>,
}

/// The CPU-speed predictor.
#[derive(Debug, Serialize, ToSchema)]
pub struct PredictorBody {
    /// Coefficient of ln C.
    pub p0: f64,
    /// Coefficient of C.
    pub p1: f64,
    /// Speed from θ on.
    pub p2: f64,
    /// The sweet point θ, cores per GPU.
    pub theta: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bad(r: Result<JobSpec, ApiError>) -> (&'static str, Place, String) {
        match r {
            Err(ApiError::BadInput { code, at, message }) => (code, at, message),
            other => panic!("expected a bad input, got {other:?}"),
        }
    }

    #[test]
    fn toml_type_errors_name_field_line_and_column() {
        let text = "name = \"a\"\ngpus = 2\n[locality]\nprefer = \"socket\"\ntolerate = \"nowhere\"\n";
        let (code, at, message) = bad(parse_spec(text.as_bytes(), BodyFormat::Toml));
        assert_eq!(code, "invalid_spec");
        assert_eq!((at.field.as_deref(), at.line, at.column), (Some("locality.tolerate"), Some(5), Some(12)));
        assert!(message.starts_with("line 5 column 12: "), "{message}");
    }

    #[test]
    fn toml_rule_errors_are_located_by_the_key() {
        let text = "name = \"a\"\ngpus = 2\n[locality]\nprefer = \"rack\"\n  tolerate = \"socket\"\n";
        let (code, at, _) = bad(parse_spec(text.as_bytes(), BodyFormat::Toml));
        assert_eq!(code, "invalid_spec");
        assert_eq!((at.field.as_deref(), at.line, at.column), (Some("locality.tolerate"), Some(5), Some(3)));
        // A missing field is named, with no place of its own.
        let (_, at, _) = bad(parse_spec(b"gpus = 2\n", BodyFormat::Toml));
        assert_eq!((at.field.as_deref(), at.line), (Some("name"), None));
        // An unknown key is named and located.
        let (_, at, _) = bad(parse_spec(b"name = \"a\"\ngpus = 1\n[cpu]\ncores = 2\n", BodyFormat::Toml));
        assert_eq!((at.field.as_deref(), at.line, at.column), (Some("cpu.cores"), Some(4), Some(1)));
    }

    #[test]
    fn toml_syntax_errors_are_malformed_with_line_and_column() {
        let (code, at, _) = bad(parse_spec(b"name = \"a\"\ngpus = = 2\n", BodyFormat::Toml));
        assert_eq!(code, "malformed_toml");
        assert_eq!((at.field.as_deref(), at.line), (None, Some(2)));
        assert!(at.column.is_some_and(|c| c > 1), "{at:?}");
    }

    #[test]
    fn json_takes_the_job_file_shape() {
        let spec = parse_spec(
            br#"{"name": "a", "gpus": 4, "members": 2, "locality": {"tolerate": "rack"}, "gpu_type": null}"#,
            BodyFormat::Json,
        )
        .expect("a valid JSON spec");
        assert_eq!((spec.members, spec.gpus_per_member), (2, 2));
        let (code, at, _) = bad(parse_spec(br#"{"name": "a", "gpuz": 4}"#, BodyFormat::Json));
        assert_eq!((code, at.field.as_deref()), ("invalid_spec", Some("gpuz")));
        let (code, at, _) =
            bad(parse_spec(br#"{"name": "a", "gpus": 1, "cpu": {"predictor": {"p0": "x"}}}"#, BodyFormat::Json));
        assert_eq!((code, at.field.as_deref()), ("invalid_spec", Some("cpu.predictor.p0")));
        // serde_json calls a number where an enum belongs a syntax error; the JSON is well formed.
        let (code, at, _) =
            bad(parse_spec(br#"{"name": "a", "gpus": 1, "locality": {"prefer": 3}}"#, BodyFormat::Json));
        assert_eq!((code, at.field.as_deref()), ("invalid_spec", Some("locality.prefer")));
        let (code, at, _) = bad(parse_spec(br#"{"name": "a", "gpus": 3, "members": 2}"#, BodyFormat::Json));
        assert_eq!((code, at.field.as_deref()), ("invalid_spec", Some("gpus")));
    }

    #[test]
    fn malformed_json_names_line_and_column() {
        let (code, at, _) = bad(parse_spec(b"{\n \"name\": ", BodyFormat::Json));
        assert_eq!((code, at.field, at.line), ("malformed_json", None, Some(2)));
        let (code, _, _) = bad(parse_spec(br#"{"name": "a", "gpus": 1} x"#, BodyFormat::Json));
        assert_eq!(code, "malformed_json");
    }

    #[test]
    fn the_documented_body_is_a_job_file() {
        let every_field = JobFileBody {
            name: "doc".into(),
            gpus: Some(4),
            members: Some(2),
            gpus_per_member: Some(2),
            gpu_type: Some("nvidia-v100-16g".into()),
            tenant: Some("t".into()),
            priority: Some(1),
            memory_mib_per_gpu: Some(1024),
            model: Some("ResNet-50".into()),
            command: Some(vec!["true".into()]),
            scheduler: Some("default".into()),
            locality: Some(LocalityBody {
                prefer: Some("socket".into()),
                tolerate: Some("rack".into()),
                relax_after_s: Some(60),
                slowdown: Some([("rack".to_string(), 0.2)].into_iter().collect()),
            }),
            cpu: Some(CpuBody {
                cores_per_gpu: None,
                predictor: Some(PredictorBody { p0: 1.0, p1: 0.02, p2: 2.5, theta: 11.0 }),
                min_cores_per_gpu: Some(2),
            }),
            env: Some([("NCCL_DEBUG".to_string(), "INFO".to_string())].into_iter().collect()),
            workdir: Some("/data/run-1".into()),
            time_limit_s: Some(3600),
            restart: Some(RestartBody { max: 2, backoff_s: Some(5) }),
            stop_grace_s: Some(20),
            after: Some(vec![7]),
            after_any: Some(vec![8, 9]),
            array: Some(3),
        };
        let json = serde_json::to_vec(&every_field).expect("JSON");
        let spec = parse_spec(&json, BodyFormat::Json).expect("every documented field is a job-file field");
        assert_eq!(spec.total_gpus(), 4);
        assert_eq!((spec.run.workdir.as_deref(), spec.run.time_limit_s), (Some("/data/run-1"), Some(3600)));
        assert_eq!(spec.run.env.get("NCCL_DEBUG").map(String::as_str), Some("INFO"));
        assert_eq!(spec.run.restart, Some(tessera_view::RestartPolicy { max: 2, backoff_s: 5 }));
        assert_eq!(spec.run.stop_grace_s, Some(20));
        assert_eq!((spec.after.len(), spec.after_any.len(), spec.array), (1, 2, Some(3)));
        assert_eq!(spec.model.as_deref(), Some("ResNet-50"));
    }
}
