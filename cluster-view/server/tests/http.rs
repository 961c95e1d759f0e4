//! The HTTP/JSON API against a real single replica (raft on RocksDB in a temp dir, gRPC and
//! HTTP on free local ports), with a real HTTP client: every endpoint, bad input (with its
//! status, error code and place), metrics (parsed as Prometheus text), and logs from a
//! stand-in node agent. Every answer is checked against the replica's own OpenAPI document.

use reqwest::StatusCode;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tessera_proto::v1;
use tessera_view::fit::{FitMode, member_request, plan_member};
use tessera_view::{ClusterView, JobSpec, LocalityLevel, ServerId, ViewSnapshot};

mod support;
use support::{Api, Replica, assert_error};

/// POSTs headers declaring a `length`-byte body, and a little of it, on a raw connection: the
/// refusal must come before the body does (an HTTP client that sends it all may see the
/// connection closed under its write instead of the answer).
async fn post_declaring_length(r: &Replica, length: usize) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = r.http.trim_start_matches("http://");
    let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect to the HTTP API");
    let head = format!(
        "POST /v1/jobs HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n{{\"name\": \""
    );
    conn.write_all(head.as_bytes()).await.expect("send the head");
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(10);
    // Read until the JSON body's end (or the connection's).
    while !answer.ends_with(b"}") && Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf)).await {
            Ok(Ok(0)) | Err(_) => break,
            Ok(Ok(n)) => answer.extend_from_slice(&buf[..n]),
            Ok(Err(e)) => panic!("reading the answer: {e}"),
        }
    }
    String::from_utf8_lossy(&answer).into_owned()
}

/// Checks Prometheus text format 0.0.4: every line a comment, `# HELP`, `# TYPE` or a sample
/// `name{label="value",...} number`; one TYPE per family, before its samples; histogram
/// buckets cumulative with `+Inf` equal to `_count`. Answers the samples by name and labels.
fn parse_prometheus(text: &str) -> HashMap<String, f64> {
    fn valid_name(n: &str) -> bool {
        let mut cs = n.chars();
        cs.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
            && cs.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    }
    let mut types: HashMap<String, String> = HashMap::new();
    let mut samples = HashMap::new();
    // (family, labels without le) → bucket counts in order, and the +Inf one.
    let mut buckets: HashMap<(String, String), Vec<(f64, f64)>> = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let at = || format!("line {}: `{line}`", i + 1);
        if line.trim().is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, ty) = rest.split_once(' ').unwrap_or_else(|| panic!("{}", at()));
            assert!(valid_name(name), "{}", at());
            assert!(["counter", "gauge", "histogram", "summary", "untyped"].contains(&ty), "{}", at());
            assert!(types.insert(name.to_string(), ty.to_string()).is_none(), "TYPE twice: {}", at());
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            assert!(valid_name(rest.split(' ').next().unwrap_or("")), "{}", at());
            continue;
        }
        assert!(!line.starts_with('#') || line.starts_with("# "), "{}", at());
        if line.starts_with('#') {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("{}", at()));
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("not a number: {}", at())),
        };
        let (name, labels) = match series.split_once('{') {
            Some((n, l)) => (n, l.strip_suffix('}').unwrap_or_else(|| panic!("{}", at()))),
            None => (series, ""),
        };
        assert!(valid_name(name), "{}", at());
        let mut le = None;
        let mut rest_labels = Vec::new();
        // label="value" pairs; values escape \\, \" and \n.
        let mut l = labels;
        while !l.is_empty() {
            let (key, after) = l.split_once("=\"").unwrap_or_else(|| panic!("{}", at()));
            assert!(valid_name(key), "label {key}: {}", at());
            let mut end = None;
            let mut escaped = false;
            for (j, c) in after.char_indices() {
                match (escaped, c) {
                    (true, '\\' | '"' | 'n') => escaped = false,
                    (true, _) => panic!("bad escape: {}", at()),
                    (false, '\\') => escaped = true,
                    (false, '"') => {
                        end = Some(j);
                        break;
                    }
                    _ => {}
                }
            }
            let end = end.unwrap_or_else(|| panic!("unterminated label: {}", at()));
            if key == "le" {
                le = Some(after[..end].to_string());
            } else {
                rest_labels.push(format!("{key}={}", &after[..end]));
            }
            l = after[end + 1..].strip_prefix(',').unwrap_or(&after[end + 1..]);
        }
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| types.get(*f).is_some_and(|t| t == "histogram")))
            .unwrap_or(name);
        assert!(types.contains_key(family), "no TYPE before the sample: {}", at());
        if name.ends_with("_bucket") && family != name {
            let le = le.unwrap_or_else(|| panic!("a bucket without le: {}", at()));
            let bound = if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap_or_else(|_| panic!("{}", at())) };
            buckets.entry((family.to_string(), rest_labels.join(","))).or_default().push((bound, value));
        }
        samples.insert(series.to_string(), value);
    }
    for ((family, labels), b) in &buckets {
        assert!(b.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1), "{family}{{{labels}}}: {b:?}");
        assert_eq!(b.last().map(|x| x.0), Some(f64::INFINITY), "{family}{{{labels}}}: no +Inf bucket");
        let count_key = format!(
            "{family}_count{{{}}}",
            labels
                .split(',')
                .filter(|l| !l.is_empty())
                .map(|kv| kv.replacen('=', "=\"", 1) + "\"")
                .collect::<Vec<_>>()
                .join(",")
        );
        assert_eq!(samples.get(&count_key).copied(), b.last().map(|x| x.1), "{count_key}");
    }
    samples
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spec_naming_its_model_is_admitted_with_the_models_losses_unless_it_declares_its_own() {
    let r = Replica::start().await;
    let api = Api::new(&r).await;
    let named = api.admit(json!({ "name": "named", "gpus": 2, "model": "ResNet-50" })).await;
    let own = json!({ "name": "own", "gpus": 2, "model": "LM", "locality": { "slowdown": { "rack": 0.5 } } });
    let own = api.admit(own).await;
    let plain = api.admit(json!({ "name": "plain", "gpus": 2 })).await;
    let (s, list) = api.get("/v1/jobs", "/v1/jobs").await;
    assert_eq!(s, StatusCode::OK, "{list}");
    let job =
        |id: u64| list["jobs"].as_array().and_then(|v| v.iter().find(|j| j["id"] == id)).cloned().expect("listed");
    let named = job(named);
    assert_eq!(named["model"], "ResNet-50");
    // The shipped speed model's `cnn-imagenet` class.
    assert_eq!(named["slowdown"]["socket"], 0.0, "{named}");
    assert_eq!((named["slowdown"]["server"].as_f64(), named["slowdown"]["rack"].as_f64()), (Some(0.27), Some(0.28)));
    assert_eq!(job(own)["slowdown"], json!({ "rack": 0.5 }), "a declared loss wins");
    assert_eq!((job(plain)["slowdown"].clone(), job(plain)["model"].clone()), (json!({}), Value::Null));
    // A blank, overlong or control-character name is refused and admits nothing.
    for bad in [json!(" "), json!("m".repeat(129)), json!("a\u{7}b")] {
        let got = api.submit_json(json!({ "name": "bad", "gpus": 1, "model": bad })).await;
        assert_error(&got, StatusCode::BAD_REQUEST, "invalid_spec");
        assert_eq!(got.1["field"], "model", "{}", got.1);
    }
    let (_, after) = api.get("/v1/jobs", "/v1/jobs").await;
    assert_eq!(after["jobs"].as_array().map(Vec::len), Some(3), "{after}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_answer_as_documented_and_refuse_bad_input() {
    let r = Replica::start().await;
    let api = Api::new(&r).await;

    let (s, st) = api.get("/v1/status", "/v1/status").await;
    assert_eq!(s, StatusCode::OK, "{st}");
    assert_eq!(st["replica"], 1);
    assert_eq!(st["role"], "leader");
    assert_eq!(st["leader"], 1);
    assert_eq!(st["gpus"], json!({ "total": 16, "used": 0, "free": 16, "unavailable": 0 }));
    assert_eq!(st["jobs"]["pending"], 0);
    assert_eq!(st["servers"]["up"], 2);
    // The probes: alive, and ready (it is its own leader).
    for probe in ["/healthz", "/readyz"] {
        let (s, p) = api.get(probe, probe).await;
        assert_eq!(s, StatusCode::OK, "{probe}: {p}");
        assert_eq!((&p["status"], &p["role"], &p["leader"]), (&json!("ok"), &json!("leader"), &json!(1)), "{probe}");
    }

    // Submit: JSON in the job-file shape, and TOML.
    let a = api.admit(json!({ "name": "json-job", "gpus": 4, "members": 2, "locality": { "tolerate": "rack" } })).await;
    let (s, b) = api
        .submit_toml("name = \"toml-job\"\ngpus = 2\nscheduler = \"default\"\n[locality]\nprefer = \"socket\"\n")
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let b = b["job"].as_u64().expect("a job id");

    let (s, list) = api.get("/v1/jobs", "/v1/jobs").await;
    assert_eq!(s, StatusCode::OK);
    let jobs = list["jobs"].as_array().expect("jobs");
    assert_eq!(jobs.len(), 2, "{list}");
    assert_eq!((jobs[0]["id"].as_u64(), jobs[0]["state"].as_str()), (Some(a), Some("pending")));
    assert_eq!((jobs[0]["gpus"].as_u64(), jobs[0]["members"].as_u64()), (Some(4), Some(2)));
    assert_eq!(jobs[0]["tolerate"], "rack");
    assert_eq!(jobs[1]["scheduler"], "default");
    assert_eq!(jobs[1]["placement"], json!([]));
    assert_eq!(jobs[1]["locality"], Value::Null);

    let (s, one) = api.get("/v1/jobs/{id}", &format!("/v1/jobs/{b}")).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(one["name"], "toml-job");
    assert_eq!(one["spec"]["prefer"], "socket");
    assert_eq!(one["tasks"], json!([]));

    // Unknown and malformed ids.
    assert_error(&api.get("/v1/jobs/{id}", "/v1/jobs/999").await, StatusCode::NOT_FOUND, "unknown_job");
    assert_error(&api.get("/v1/jobs/{id}", "/v1/jobs/abc").await, StatusCode::BAD_REQUEST, "bad_job_id");

    // Malformed JSON: its line and column, no field.
    let bad = api.post("application/json", "{\n \"name\": ").await;
    assert_error(&bad, StatusCode::BAD_REQUEST, "malformed_json");
    assert_eq!((bad.1["line"].as_u64(), bad.1.get("field")), (Some(2), None), "{}", bad.1);
    assert!(bad.1["column"].as_u64().is_some(), "{}", bad.1);
    // A JSON field the spec does not know, and a value of the wrong type, are named by path.
    let bad = api.submit_json(json!({ "name": "x", "gpuz": 2 })).await;
    assert_error(&bad, StatusCode::BAD_REQUEST, "invalid_spec");
    assert_eq!(bad.1["field"], "gpuz");
    let bad = api.submit_json(json!({ "name": "x", "gpus": 1, "locality": { "prefer": 3 } })).await;
    assert_error(&bad, StatusCode::BAD_REQUEST, "invalid_spec");
    assert_eq!(bad.1["field"], "locality.prefer");
    // A rule broken in JSON: the field.
    let bad = api.submit_json(json!({ "name": "x", "gpus": 3, "members": 2 })).await;
    assert_error(&bad, StatusCode::BAD_REQUEST, "invalid_spec");
    assert_eq!(bad.1["field"], "gpus");

    // Malformed TOML: line and column.
    let bad = api.submit_toml("name = \"t\"\ngpus = = 2\n").await;
    assert_error(&bad, StatusCode::BAD_REQUEST, "malformed_toml");
    assert_eq!(bad.1["line"], 2, "{}", bad.1);
    assert!(bad.1["column"].as_u64().is_some_and(|c| c > 1), "{}", bad.1);
    // TOML: a value of the wrong kind, and a rule broken, each with field, line and column.
    let place = |b: &Value| (b["field"].clone(), b["line"].clone(), b["column"].clone());
    let bad = api.submit_toml("name = \"t\"\ngpus = 2\n[locality]\nprefer = \"rack\"\ntolerate = \"nowhere\"\n").await;
    assert_error(&bad, StatusCode::BAD_REQUEST, "invalid_spec");
    assert_eq!(place(&bad.1), (json!("locality.tolerate"), json!(5), json!(12)), "{}", bad.1);
    let bad = api.submit_toml("name = \"t\"\ngpus = 2\n[locality]\nprefer = \"rack\"\ntolerate = \"socket\"\n").await;
    assert_error(&bad, StatusCode::BAD_REQUEST, "invalid_spec");
    assert_eq!(place(&bad.1), (json!("locality.tolerate"), json!(5), json!(1)), "{}", bad.1);
    assert!(bad.1["message"].as_str().is_some_and(|m| m.contains("line 5")), "{}", bad.1);

    // A job that can never fit is refused with the view's reason, by its structured code.
    let never = api.submit_json(json!({ "name": "huge", "gpus": 64, "members": 1 })).await;
    assert_error(&never, StatusCode::UNPROCESSABLE_ENTITY, "never_fits");
    let never = api.submit_toml("name = \"wrong-type\"\ngpus = 1\ngpu_type = \"nvidia-h100-80g\"\n").await;
    assert_error(&never, StatusCode::UNPROCESSABLE_ENTITY, "never_fits");
    assert!(never.1["message"].as_str().is_some_and(|m| m.contains("nvidia-h100-80g")), "{}", never.1);

    // Oversized and unsupported bodies.
    let answer = post_declaring_length(&r, 2 << 20).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    let body: Value = answer
        .split_once("\r\n\r\n")
        .and_then(|(_, b)| serde_json::from_str(b).ok())
        .unwrap_or_else(|| panic!("no JSON body: {answer}"));
    assert_eq!(body["code"], "too_large");
    api.validate(
        &api.doc["paths"]["/v1/jobs"]["post"]["responses"]["413"]["content"]["application/json"]["schema"],
        &body,
        "413",
    );
    assert_error(
        &api.post("text/plain", "name = \"x\"").await,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
    );

    // Logs of a job never placed: nothing to read yet.
    let logs = "/v1/jobs/{id}/logs";
    assert_error(&api.get(logs, &format!("/v1/jobs/{a}/logs")).await, StatusCode::CONFLICT, "wrong_state");
    assert_error(&api.get(logs, &format!("/v1/jobs/{a}/logs?stream=both")).await, StatusCode::BAD_REQUEST, "bad_query");
    assert_error(&api.get(logs, "/v1/jobs/999/logs").await, StatusCode::NOT_FOUND, "unknown_job");

    // Cancel, then cancel again (a state conflict), then an unknown job.
    let (s, del) = api.delete("/v1/jobs/{id}", &format!("/v1/jobs/{a}?reason=not%20needed")).await;
    assert_eq!(s, StatusCode::OK, "{del}");
    assert_eq!((del["job"].as_u64(), del["cancelled"].as_bool()), (Some(a), Some(true)));
    let (_, one) = api.get("/v1/jobs/{id}", &format!("/v1/jobs/{a}")).await;
    assert_eq!(one["state"], "failed");
    assert!(one["error"].as_str().is_some_and(|e| e.contains("not needed")), "{one}");
    assert_error(&api.delete("/v1/jobs/{id}", &format!("/v1/jobs/{a}")).await, StatusCode::CONFLICT, "conflict");
    assert_error(&api.delete("/v1/jobs/{id}", "/v1/jobs/999").await, StatusCode::NOT_FOUND, "not_found");

    // Servers with their GPU bitmaps.
    let (s, servers) = api.get("/v1/servers", "/v1/servers").await;
    assert_eq!(s, StatusCode::OK);
    let list = servers["servers"].as_array().expect("servers");
    assert_eq!(list.len(), 2);
    assert_eq!(list[0]["gpu_bitmap"], "........");
    assert_eq!(list[0]["gpus_free"], 8);
    assert_eq!(list[0]["health"], "up");
    assert_eq!(list[0]["device_type"], "nvidia-v100-16g");
    assert_eq!(list[0]["rack"], "rack-0");
    assert_eq!(list[0]["cores_free"], 32);

    // Unknown routes and methods answer an ErrorBody too.
    let none = json_of(api.http.get(api.url("/v2/nothing")).send().await.expect("GET")).await;
    assert_error(&none, StatusCode::NOT_FOUND, "no_such_route");
    api.validate_as("ErrorBody", &none.1);
    let put = api.http.put(api.url("/v1/jobs")).send().await.expect("PUT");
    // RFC 9110: a 405 lists the methods the resource allows (found by schemathesis).
    assert_eq!(put.headers().get("allow").and_then(|v| v.to_str().ok()), Some("GET, POST"));
    let put = json_of(put).await;
    assert_error(&put, StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed");
    api.validate_as("ErrorBody", &put.1);
    let trace = api.http.request(reqwest::Method::TRACE, api.url("/v1/jobs/1")).send().await.expect("TRACE");
    assert_eq!(trace.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(trace.headers().get("allow").and_then(|v| v.to_str().ok()), Some("GET, DELETE"));

    // Metrics in the Prometheus text format, with the names the dashboards use.
    let resp = api.http.get(api.url("/metrics")).send().await.expect("GET /metrics");
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(
        resp.headers().get("content-type").and_then(|v| v.to_str().ok()).is_some_and(|v| v.starts_with("text/plain")),
        "{resp:?}"
    );
    let text = resp.text().await.expect("text");
    let samples = parse_prometheus(&text);
    for (series, value) in [
        ("tessera_replica_up{replica=\"1\"}", 1.0),
        ("tessera_replica_role{replica=\"1\",role=\"leader\"}", 1.0),
        ("tessera_replica_role{replica=\"1\",role=\"follower\"}", 0.0),
        ("tessera_replica_leader{replica=\"1\"}", 1.0),
        ("tessera_jobs{state=\"pending\"}", 1.0),
        ("tessera_jobs{state=\"failed\"}", 1.0),
        ("tessera_jobs{state=\"running\"}", 0.0),
        ("tessera_gpus{use=\"total\"}", 16.0),
        ("tessera_gpus{use=\"free\"}", 16.0),
        ("tessera_http_requests_total{route=\"/v1/jobs\",method=\"POST\",status=\"201\"}", 2.0),
        ("tessera_http_requests_total{route=\"/v1/jobs/{id}\",method=\"GET\",status=\"404\"}", 1.0),
        ("tessera_http_requests_total{route=\"/v1/jobs\",method=\"POST\",status=\"422\"}", 2.0),
    ] {
        assert_eq!(samples.get(series), Some(&value), "{series} in:\n{text}");
    }
    // Counted from the start, including the harness's wait for the API.
    for series in [
        "tessera_http_request_duration_seconds_count{route=\"/v1/status\"}",
        "tessera_replica_applied_index{replica=\"1\"}",
        "tessera_replica_term{replica=\"1\"}",
        "tessera_view_version{replica=\"1\"}",
    ] {
        assert!(samples.get(series).is_some_and(|v| *v >= 1.0), "{series} in:\n{text}");
    }
    promtool_check(&text);

    // An Idempotency-Key makes a retried POST answer the first job; the key with another body
    // is a conflict, a malformed key a bad request, and neither admits anything.
    let body = json!({ "name": "keyed", "gpus": 1 }).to_string();
    let first = api.post_keyed("application/json", &body, Some("retry-me-1")).await;
    assert_eq!(first.0, StatusCode::CREATED, "{}", first.1);
    let again = api.post_keyed("application/json", &body, Some("retry-me-1")).await;
    assert_eq!((again.0, &again.1["job"]), (StatusCode::CREATED, &first.1["job"]), "{}", again.1);
    let other = json!({ "name": "keyed", "gpus": 2 }).to_string();
    let reused = api.post_keyed("application/json", &other, Some("retry-me-1")).await;
    assert_error(&reused, StatusCode::CONFLICT, "request_reused");
    let bad_key = api.post_keyed("application/json", &body, Some("two words")).await;
    assert_error(&bad_key, StatusCode::BAD_REQUEST, "bad_request_id");
    let (_, list) = api.get("/v1/jobs", "/v1/jobs").await;
    let keyed = list["jobs"].as_array().expect("jobs").iter().filter(|j| j["name"] == "keyed").count();
    assert_eq!(keyed, 1, "one job admitted under the key: {list}");

    // A `traceparent` header puts the job in the caller's trace; a malformed one is ignored and
    // the job gets a trace of its own. The job's page names the trace and its first step.
    let caller = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let traced = |header: &'static str| {
        let req = api.http.post(api.url("/v1/jobs")).header("content-type", "application/json");
        req.header("traceparent", header).body(json!({ "name": "traced", "gpus": 1 }).to_string()).send()
    };
    let mut traces = Vec::new();
    for header in [caller, "00-not-a-trace-01"] {
        let (s, a) = api.checked("post", "/v1/jobs", traced(header).await.expect("POST")).await;
        assert_eq!(s, StatusCode::CREATED, "{a}");
        let id = a["job"].as_u64().expect("a job id");
        let (s, detail) = api.get("/v1/jobs/{id}", &format!("/v1/jobs/{id}")).await;
        assert_eq!(s, StatusCode::OK, "{detail}");
        let trace = detail["trace_id"].as_str().unwrap_or_else(|| panic!("no trace: {detail}")).to_string();
        let parent = detail["traceparent"].as_str().expect("traceparent");
        assert!(parent.starts_with(&format!("00-{trace}-")) && parent.ends_with("-01"), "{parent}");
        assert_eq!(detail["timeline"][0]["step"], "submitted", "{detail}");
        traces.push(trace);
    }
    assert_eq!(traces[0], "0af7651916cd43dd8448eb211c80319c", "the job joined the caller's trace");
    assert!(traces[1].len() == 32 && traces[1] != traces[0], "a malformed header starts a fresh trace: {traces:?}");
}

/// `promtool check metrics` on the text too, where promtool is installed (Debian's
/// `prometheus` package); the Rust-side parse above is the check that always runs.
fn promtool_check(text: &str) {
    use std::io::Write;
    let child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let Ok(mut child) = child else {
        eprintln!("promtool is not installed: skipping `promtool check metrics` (the Rust-side parse ran)");
        return;
    };
    child.stdin.take().expect("stdin").write_all(text.as_bytes()).expect("write to promtool");
    let out = child.wait_with_output().expect("promtool ran");
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Status and JSON body of a response to a route the document does not have.
async fn json_of(resp: reqwest::Response) -> (StatusCode, Value) {
    let status = resp.status();
    let text = resp.text().await.expect("a body");
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (status, v)
}

/// Every path and method of the OpenAPI document is routed and answers as documented.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_route_is_served() {
    let r = Replica::start().await;
    let api = Api::new(&r).await;
    let id = api.admit(json!({ "name": "doc", "gpus": 1 })).await;
    let paths = api.doc["paths"].as_object().expect("paths").clone();
    assert!(paths.len() >= 7);
    let servers: Value =
        api.http.get(api.url("/v1/servers")).send().await.expect("servers").json().await.expect("json");
    let server = servers["servers"][0]["name"].as_str().expect("a server").to_string();
    let plain = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("client");
    let mut checked = 0;
    for (path, ops) in &paths {
        // Configuration set 1 is the one `POST /v1/config-sets` adds (paths sort before their
        // sub-paths); the server removed is the one `POST /v1/servers` adds.
        let id = if path.starts_with("/v1/config-sets") { "1".to_string() } else { id.to_string() };
        // A class quota names a class there is (`doc` is the class `PUT /v1/policy/classes` adds).
        let class = if path.starts_with("/v1/policy/quotas") { "batch" } else { "doc" };
        let fingerprint = format!("sha256:{}", "d0".repeat(32));
        let url = path
            .replace("{id}", &id)
            .replace("{name}", &server)
            .replace("{tenant}", "doc")
            .replace("{class}", class)
            .replace("{fingerprint}", &fingerprint);
        for method in ops.as_object().expect("operations").keys() {
            let req = match method.as_str() {
                // `/` answers a redirect, which this client must not follow.
                "get" if path == "/" => plain.get(api.url(&url)),
                "get" => api.http.get(api.url(&url)),
                "post" if url.ends_with("/drain") => api.http.post(api.url(&format!("{url}?timeout_s=600"))),
                "post" if url == "/v1/config-sets" => api
                    .http
                    .post(api.url(&url))
                    .json(&json!({ "rack": "doc", "ib_domain": "ib-doc", "topology": "pcie-4gpu" })),
                "post" if url == "/v1/servers" => {
                    api.http.post(api.url(&url)).json(&json!({ "config_set": 0, "names": ["doc-server"] }))
                }
                "post" => api.http.post(api.url(&url)).json(&json!({ "name": "doc2", "gpus": 1 })),
                "put" if path.starts_with("/v1/policy/quotas") => {
                    api.http.put(api.url(&url)).json(&json!({ "gpus": 8 }))
                }
                "put" if path.starts_with("/v1/policy/classes") => {
                    api.http.put(api.url(&url)).json(&json!({ "priority": 10 }))
                }
                "put" if path.starts_with("/v1/policy/revocations") => {
                    api.http.put(api.url(&url)).json(&json!({ "not_after_ms": 4_000_000_000_000u64 }))
                }
                "delete" if path == "/v1/servers/{name}" => api.http.delete(api.url("/v1/servers/doc-server")),
                "delete" => api.http.delete(api.url(&url)),
                other => panic!("the document names method {other} on {path}, which this test does not know"),
            };
            let resp = req.send().await.expect("a response");
            let status = resp.status();
            let documented = &api.doc["paths"][path][method]["responses"][status.as_str()];
            assert!(documented.is_object(), "{method} {path}: {status} not documented");
            if documented["content"]["application/json"].is_object() {
                let (status, body) = api.checked(method, path, resp).await;
                if path.ends_with("/logs") {
                    // The job was never placed (and is cancelled by now: `delete` sorts first).
                    assert_error(&(status, body), StatusCode::CONFLICT, "wrong_state");
                } else {
                    assert!(status.is_success(), "{method} {path}: {status} {body}");
                }
            } else if path == "/" {
                // The way to the dashboard.
                assert_eq!(status, StatusCode::FOUND, "{method} {path}");
                assert_eq!(resp.headers().get("location").and_then(|v| v.to_str().ok()), Some("/ui"));
            } else {
                assert!(status.is_success(), "{method} {path}: {status}");
                let ct = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
                let mime = ct.split(';').next().unwrap_or("").trim().to_string();
                assert!(documented["content"][&mime].is_object(), "{method} {path}: {ct} not documented");
                assert!(
                    ["text/plain", "text/html", "text/event-stream"].contains(&mime.as_str()),
                    "{method} {path}: {ct}"
                );
                // The event stream never ends: it is read in its own test, and dropped here.
            }
            checked += 1;
        }
    }
    assert!(checked >= 9, "only {checked} operations documented");
}

/// A stand-in node agent: every task of job `job` has a log; others are not here.
#[derive(Debug)]
struct FakeAgent {
    job: u64,
}

#[tonic::async_trait]
impl v1::agent_server::Agent for FakeAgent {
    async fn logs(
        &self,
        req: tonic::Request<v1::LogsRequest>,
    ) -> Result<tonic::Response<v1::LogsResponse>, tonic::Status> {
        let r = req.into_inner();
        if r.job != self.job {
            return Err(tonic::Status::not_found(format!("no task of job {} ran here", r.job)));
        }
        let stream = if r.stderr { "stderr" } else { "stdout" };
        let data = format!("hello from job {} member {} on {stream}\n", r.job, r.member).into_bytes();
        Ok(tonic::Response::new(v1::LogsResponse {
            size: data.len() as u64,
            data,
            truncated: false,
            path: format!("/tasks/{}/{}/{stream}", r.job, r.member),
        }))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_come_from_the_agent_while_placed_and_after_the_end() {
    let r = Replica::start().await;
    let api = Api::new(&r).await;
    let id = api.admit(json!({ "name": "logged", "gpus": 2 })).await;
    let logs = "/v1/jobs/{id}/logs";

    // The agent of server 0 serves logs; it registers with its address.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the agent's port");
    let agent_addr = listener.local_addr().expect("agent address").to_string();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(v1::agent_server::AgentServer::new(FakeAgent { job: id }))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let mut view = r.view();
    let snap = view.snapshot(true).await.expect("snapshot").snapshot.expect("a view");
    let core = ClusterView::from_snapshot(ViewSnapshot::try_from(snap).expect("a valid snapshot"));
    let rec = core.servers()[0];
    let topo = core.topology_of(rec.config_set).clone();
    view.register_server(core.server_name(ServerId(0)).expect("server 0"), v1::Topology::from(&topo), &agent_addr)
        .await
        .expect("register");

    // Place the job on server 0, as a scheduler would.
    let spec = JobSpec::simple("logged", 1, 2);
    let (member, _) =
        plan_member(&topo, &rec, ServerId(0), &member_request(&spec, &topo), LocalityLevel::Any, FitMode::Pack)
            .expect("a member fits an empty server");
    let proposal =
        v1::Proposal { id: 77, job: id, members: vec![v1::MemberPlacement::from(&member)], based_on: core.version().0 };
    let results = view.propose(vec![proposal]).await.expect("propose");
    assert!(
        matches!(
            results[0].decision.as_ref().and_then(|d| d.outcome.as_ref()),
            Some(v1::decision::Outcome::Accepted(_))
        ),
        "{results:?}"
    );

    let (s, one) = api.get("/v1/jobs/{id}", &format!("/v1/jobs/{id}")).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(one["state"], "placed");
    assert_eq!(one["placement"][0]["gpus"].as_array().map(Vec::len), Some(2));
    assert_eq!(one["tasks"][0]["state"], "starting");
    let (_, servers) = api.get("/v1/servers", "/v1/servers").await;
    assert_eq!(servers["servers"][0]["gpu_bitmap"].as_str().map(|b| b.matches('x').count()), Some(2));

    let (s, log) = api.get(logs, &format!("/v1/jobs/{id}/logs?member=0&stream=stderr&tail_bytes=1024")).await;
    assert_eq!(s, StatusCode::OK, "{log}");
    assert_eq!(log["data"], format!("hello from job {id} member 0 on stderr\n"));
    assert_eq!(log["server"], core.server_name(ServerId(0)).expect("server 0"));
    assert_error(&api.get(logs, &format!("/v1/jobs/{id}/logs?member=3")).await, StatusCode::NOT_FOUND, "no_logs");
    assert_error(
        &api.get(logs, &format!("/v1/jobs/{id}/logs?tail_bytes=-1")).await,
        StatusCode::BAD_REQUEST,
        "bad_query",
    );

    // Ended: the placement is gone; every known agent is asked.
    view.release(id, false).await.expect("release");
    let (_, one) = api.get("/v1/jobs/{id}", &format!("/v1/jobs/{id}")).await;
    assert_eq!(one["state"], "finished");
    let (s, log) = api.get(logs, &format!("/v1/jobs/{id}/logs")).await;
    assert_eq!(s, StatusCode::OK, "{log}");
    assert_eq!(log["data"], format!("hello from job {id} member 0 on stdout\n"));

    // Another job, placed and ended, whose log no agent has.
    let other = api.admit(json!({ "name": "unlogged", "gpus": 1 })).await;
    let spec = JobSpec::simple("unlogged", 1, 1);
    let (member, _) =
        plan_member(&topo, &rec, ServerId(0), &member_request(&spec, &topo), LocalityLevel::Any, FitMode::Pack)
            .expect("a member fits the emptied server");
    let proposal = v1::Proposal { id: 78, job: other, members: vec![v1::MemberPlacement::from(&member)], based_on: 0 };
    view.propose(vec![proposal]).await.expect("propose");
    view.release(other, false).await.expect("release");
    assert_error(&api.get(logs, &format!("/v1/jobs/{other}/logs")).await, StatusCode::NOT_FOUND, "no_logs");
}

/// An operator's cordon, drain and uncordon over HTTP: each answer as documented, the server's
/// detail showing the cordon and its history, and every malformed request refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_are_cordoned_drained_and_uncordoned_over_http() {
    let r = Replica::start().await;
    let api = Api::new(&r).await;
    let servers: Value =
        api.http.get(api.url("/v1/servers")).send().await.expect("servers").json().await.expect("json");
    let name = servers["servers"][0]["name"].as_str().expect("a server").to_string();
    let post = |q: String| {
        let http = api.http.clone();
        let url = api.url(&q);
        async move { http.post(url).send().await.expect("a response") }
    };
    let detail_path = "/v1/servers/{name}";
    let action_path = |a: &str| format!("/v1/servers/{{name}}/{a}");
    let detail = || async {
        let resp = api.http.get(api.url(&format!("/v1/servers/{name}"))).send().await.expect("detail");
        api.checked("get", detail_path, resp).await
    };

    let got = api
        .checked("post", &action_path("cordon"), post(format!("/v1/servers/{name}/cordon?reason=bad%20fan")).await)
        .await;
    assert_eq!(got.0, StatusCode::OK, "{}", got.1);
    assert_eq!((got.1["server"].as_str(), got.1["action"].as_str()), (Some(name.as_str()), Some("cordon")));
    let (s, d) = detail().await;
    assert_eq!(s, StatusCode::OK, "{d}");
    assert_eq!(d["server"]["health"], "draining", "{d}");
    assert_eq!(d["server"]["cordon"]["reason"], "bad fan", "{d}");
    assert_eq!(d["history"][0]["why"], "cordoned: bad fan", "{d}");

    let got =
        api.checked("post", &action_path("drain"), post(format!("/v1/servers/{name}/drain?timeout_s=600")).await).await;
    assert_eq!(got.0, StatusCode::OK, "{}", got.1);
    let (_, d) = detail().await;
    let c = &d["server"]["cordon"];
    assert_eq!(c["drain_by_ms"].as_u64().map(|by| by - c["since_ms"].as_u64().expect("since")), Some(600_000), "{d}");

    let got = api.checked("post", &action_path("uncordon"), post(format!("/v1/servers/{name}/uncordon")).await).await;
    assert_eq!(got.0, StatusCode::OK, "{}", got.1);
    let (_, d) = detail().await;
    assert_eq!(d["server"]["health"], "up", "{d}");
    assert!(d["server"]["cordon"].is_null(), "{d}");
    assert_eq!(d["history"].as_array().map(Vec::len), Some(3), "{d}");

    let long = "x".repeat(257);
    for (action, q, status, code) in [
        ("drain", format!("/v1/servers/{name}/drain"), StatusCode::BAD_REQUEST, "bad_query"),
        ("drain", format!("/v1/servers/{name}/drain?timeout_s=0"), StatusCode::BAD_REQUEST, "bad_query"),
        ("drain", format!("/v1/servers/{name}/drain?timeout_s=9999999999"), StatusCode::BAD_REQUEST, "bad_query"),
        ("cordon", format!("/v1/servers/{name}/cordon?reason={long}"), StatusCode::BAD_REQUEST, "bad_query"),
        ("cordon", format!("/v1/servers/{name}/cordon?timeout_s=5"), StatusCode::BAD_REQUEST, "bad_query"),
        ("uncordon", format!("/v1/servers/{name}/uncordon?reason=x"), StatusCode::BAD_REQUEST, "bad_query"),
        ("cordon", "/v1/servers/no-such/cordon".to_string(), StatusCode::NOT_FOUND, "unknown_server"),
    ] {
        let got = api.checked("post", &action_path(action), post(q.clone()).await).await;
        assert_error(&got, status, code);
    }
    let resp = api.http.post(api.url(&format!("/v1/servers/{name}/reboot"))).send().await.expect("reboot");
    assert_eq!(resp.status(), StatusCode::NOT_FOUND, "no such route");
    let resp = api.http.get(api.url("/v1/servers/no-such")).send().await.expect("detail");
    assert_error(&api.checked("get", detail_path, resp).await, StatusCode::NOT_FOUND, "unknown_server");
    // Nothing above changed the server.
    assert_eq!(detail().await.1["history"].as_array().map(Vec::len), Some(3));
}

/// An operator's layout changes over HTTP: a configuration set and servers added (named and
/// counted), listed, refused when malformed or in conflict, a server removed (hidden from the
/// list but for `health=removed`), and the set removed once empty; every answer as documented.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configuration_sets_and_servers_are_added_and_removed_over_http() {
    let r = Replica::start().await;
    let api = Api::new(&r).await;
    let api = &api;
    let post = |path: &'static str, body: Value| async move {
        let resp = api.http.post(api.url(path)).json(&body).send().await.expect("POST");
        api.checked("post", path, resp).await
    };
    // A type the cluster lacks is refused; a configuration set of it makes room.
    let a100 = json!({ "name": "a100", "gpus": 1, "gpu_type": "nvidia-a100-40g" });
    assert_error(&api.submit_json(a100.clone()).await, StatusCode::UNPROCESSABLE_ENTITY, "never_fits");
    let got = post("/v1/config-sets", json!({ "rack": "r9", "ib_domain": "ib-9", "topology": "pcie-4gpu" })).await;
    assert_eq!(got.0, StatusCode::OK, "{}", got.1);
    assert_eq!((got.1["action"].as_str(), got.1["config_set"].as_u64()), (Some("add-config-set"), Some(1)));
    let got = post("/v1/servers", json!({ "config_set": 1, "count": 2 })).await;
    assert_eq!(got.0, StatusCode::OK, "{}", got.1);
    assert_eq!(got.1["servers"], json!(["r9-s00", "r9-s01"]), "{}", got.1);
    let got = post("/v1/servers", json!({ "config_set": 1, "names": ["gpu-17"] })).await;
    assert_eq!(got.0, StatusCode::OK, "{}", got.1);
    let (s, list) = api.get("/v1/config-sets", "/v1/config-sets").await;
    assert_eq!(s, StatusCode::OK, "{list}");
    assert_eq!(list["config_sets"][1]["name"], "r9/pcie-4gpu", "{list}");
    assert_eq!(list["config_sets"][1]["servers"], 3, "{list}");
    let (_, servers) = api.get("/v1/servers", "/v1/servers").await;
    assert_eq!(servers["total"], 5, "{servers}");
    assert_eq!(servers["servers"][4]["name"], "gpu-17", "{servers}");
    assert_eq!(servers["servers"][4]["health"], "down", "down until its agent registers: {servers}");
    let job = api.admit(a100).await;

    // Refusals: malformed bodies, and what the view refuses (in its words).
    for (path, body, status, code) in [
        ("/v1/config-sets", json!({ "rack": "r9" }), StatusCode::BAD_REQUEST, "malformed_json"),
        (
            "/v1/config-sets",
            json!({ "rack": "r", "ib_domain": "i", "topology": "nope" }),
            StatusCode::BAD_REQUEST,
            "bad_body",
        ),
        (
            "/v1/config-sets",
            json!({ "rack": "r", "ib_domain": "i", "topology": "pcie-4gpu", "topology_toml": "x" }),
            StatusCode::BAD_REQUEST,
            "bad_body",
        ),
        (
            "/v1/config-sets",
            json!({ "rack": "r9", "ib_domain": "ib-0", "topology": "dgx-h100" }),
            StatusCode::CONFLICT,
            "conflict",
        ),
        (
            "/v1/config-sets",
            json!({ "rack": "r9", "ib_domain": "ib-9", "topology": "pcie-4gpu" }),
            StatusCode::CONFLICT,
            "conflict",
        ),
        ("/v1/servers", json!({ "config_set": 1 }), StatusCode::BAD_REQUEST, "bad_body"),
        ("/v1/servers", json!({ "config_set": 1, "count": 5000 }), StatusCode::BAD_REQUEST, "bad_body"),
        ("/v1/servers", json!({ "config_set": 1, "count": 1, "names": ["x"] }), StatusCode::BAD_REQUEST, "bad_body"),
        ("/v1/servers", json!({ "config_set": 1, "names": ["gpu-17"] }), StatusCode::CONFLICT, "conflict"),
        ("/v1/servers", json!({ "config_set": 1, "names": ["bad name"] }), StatusCode::CONFLICT, "conflict"),
        ("/v1/servers", json!({ "config_set": 7, "names": ["x"] }), StatusCode::CONFLICT, "conflict"),
        (
            "/v1/servers",
            json!({ "config_set": 1, "names": ["x"], "extra": 1 }),
            StatusCode::BAD_REQUEST,
            "malformed_json",
        ),
    ] {
        let got = post(path, body.clone()).await;
        assert_error(&got, status, code);
        if code == "conflict" {
            assert!(
                got.1["message"].as_str().is_some_and(|m| m.contains("layout change refused")),
                "{body}: {}",
                got.1
            );
        }
    }
    let del = |path: String, template: &'static str| async move { api.delete(template, &path).await };
    assert_error(
        &del("/v1/servers/no-such".into(), "/v1/servers/{name}").await,
        StatusCode::NOT_FOUND,
        "unknown_server",
    );
    assert_error(&del("/v1/config-sets/x".into(), "/v1/config-sets/{id}").await, StatusCode::BAD_REQUEST, "bad_path");
    let got = del("/v1/config-sets/1".into(), "/v1/config-sets/{id}").await;
    assert_error(&got, StatusCode::CONFLICT, "conflict");
    assert!(got.1["message"].as_str().is_some_and(|m| m.contains("still has 3 server(s)")), "{}", got.1);

    // Removed: gone from the list but for `health=removed`, its name free again.
    for name in ["r9-s00", "r9-s01", "gpu-17"] {
        let got = del(format!("/v1/servers/{name}"), "/v1/servers/{name}").await;
        assert_eq!(got.0, StatusCode::OK, "{}", got.1);
    }
    assert_error(&del("/v1/servers/gpu-17".into(), "/v1/servers/{name}").await, StatusCode::CONFLICT, "conflict");
    let (_, servers) = api.get("/v1/servers", "/v1/servers").await;
    assert_eq!(servers["total"], 2, "{servers}");
    let (_, removed) = api.get("/v1/servers", "/v1/servers?health=removed").await;
    assert_eq!(removed["total"], 3, "{removed}");
    let (_, st) = api.get("/v1/status", "/v1/status").await;
    assert_eq!(st["servers"]["removed"], 3, "{st}");
    assert_eq!(st["gpus"]["total"], 16, "removed servers hold no GPUs: {st}");
    let got = del("/v1/config-sets/1".into(), "/v1/config-sets/{id}").await;
    assert_eq!(got.0, StatusCode::OK, "{}", got.1);
    let (_, list) = api.get("/v1/config-sets", "/v1/config-sets").await;
    assert_eq!(list["config_sets"][1]["removed"], true, "{list}");
    // The job of the removed type still waits: removing servers cancels nothing.
    let (_, j) = api.get("/v1/jobs/{id}", &format!("/v1/jobs/{job}")).await;
    assert_eq!(j["state"], "pending", "{j}");
}

/// Reads the next Server-Sent Event of `resp` (buffered in `buf`): its event name and data.
async fn next_event(resp: &mut reqwest::Response, buf: &mut String) -> (String, String) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            if block.starts_with(':') {
                continue; // a keep-alive comment
            }
            let field = |name: &str| {
                block.lines().find_map(|l| l.strip_prefix(name)).map(|v| v.trim().to_string()).unwrap_or_default()
            };
            return (field("event:"), field("data:"));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, resp.chunk()).await {
            Ok(Ok(Some(bytes))) => buf.push_str(&String::from_utf8_lossy(&bytes)),
            Ok(Ok(None)) => panic!("the event stream ended"),
            Ok(Err(e)) => panic!("reading the event stream: {e}"),
            Err(_) => panic!("no event within 20 s; have: {buf:?}"),
        }
    }
}

/// The dashboard's routes: the page, the queue with why each job waits (in queue order, as
/// documented), one pending job's wait, every replica's status, and view events that follow
/// the view.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_queue_replicas_and_events() {
    let r = Replica::start().await;
    let api = Api::new(&r).await;

    // The page: self-contained HTML with a strict content policy; `/` leads to it.
    let page = api.http.get(api.url("/ui")).send().await.expect("GET /ui");
    assert_eq!(page.status(), StatusCode::OK);
    let csp = page.headers().get("content-security-policy").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    assert!(csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"), "{csp}");
    let html = page.text().await.expect("the page");
    assert!(html.contains("<title>Tessera</title>") && html.contains("/v1/events"), "{html}");
    assert!(!html.contains("http://") && !html.contains("https://"), "the page must fetch nothing from elsewhere");
    let plain = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("client");
    let root = plain.get(api.url("/")).send().await.expect("GET /");
    assert_eq!(root.status(), StatusCode::FOUND);
    assert_eq!(root.headers().get("location").and_then(|v| v.to_str().ok()), Some("/ui"));

    // Events: the version now, then a newer one after a change.
    let mut events = api.http.get(api.url("/v1/events")).send().await.expect("GET /v1/events");
    assert_eq!(events.status(), StatusCode::OK);
    let ct = events.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    assert!(ct.starts_with("text/event-stream"), "{ct}");
    let mut buf = String::new();
    let (name, data) = next_event(&mut events, &mut buf).await;
    assert_eq!(name, "view", "{data}");
    let first: Value = serde_json::from_str(&data).expect("JSON data");
    let v0 = first["version"].as_u64().expect("a version");

    // No scheduler host runs here: submitted jobs stay pending, and fit now.
    let low = api.admit(json!({ "name": "low", "gpus": 2 })).await;
    let high = api.admit(json!({ "name": "high", "gpus": 1, "priority": 10 })).await;
    let big = api.admit(json!({ "name": "big", "gpus": 8 })).await;
    let (name, data) = next_event(&mut events, &mut buf).await;
    let later: Value = serde_json::from_str(&data).expect("JSON data");
    assert_eq!(name, "view");
    assert!(later["version"].as_u64().expect("a version") > v0, "{data} after {v0}");

    let (s, q) = api.get("/v1/queue", "/v1/queue").await;
    assert_eq!(s, StatusCode::OK, "{q}");
    let order: Vec<u64> = q["jobs"].as_array().expect("jobs").iter().map(|j| j["id"].as_u64().expect("id")).collect();
    assert_eq!(order, vec![high, low, big], "priority first, then submission order");
    assert_eq!(q["total"], 3);
    for (i, j) in q["jobs"].as_array().expect("jobs").iter().enumerate() {
        assert_eq!(j["waiting"]["position"], i as u64, "{j}");
        assert_eq!(j["waiting"]["reason"], "ready", "an empty cluster has room: {j}");
    }
    let (s, page) = api.get("/v1/queue", "/v1/queue?offset=1&limit=1").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(page["jobs"][0]["id"], low, "{page}");
    assert_eq!(page["total"], 3);
    for bad in ["/v1/queue?limit=0", "/v1/queue?limit=1001", "/v1/queue?offset=x", "/v1/queue?wat=1"] {
        assert_error(&api.get("/v1/queue", bad).await, StatusCode::BAD_REQUEST, "bad_query");
    }
    let (s, one) = api.get("/v1/jobs/{id}", &format!("/v1/jobs/{big}")).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(one["waiting"]["reason"], "ready", "{one}");
    assert_eq!(one["waiting"]["position"], 2, "{one}");
    assert!(one["waiting"]["message"].as_str().is_some_and(|m| m.contains("fits now")), "{one}");

    // A cancelled job is not waiting.
    let (s, _) = api.delete("/v1/jobs/{id}", &format!("/v1/jobs/{low}")).await;
    assert_eq!(s, StatusCode::OK);
    let (_, gone) = api.get("/v1/jobs/{id}", &format!("/v1/jobs/{low}")).await;
    assert!(gone["waiting"].is_null(), "{gone}");

    // Replicas: this one, the leader, caught up.
    let (s, reps) = api.get("/v1/replicas", "/v1/replicas").await;
    assert_eq!(s, StatusCode::OK, "{reps}");
    let list = reps["replicas"].as_array().expect("replicas");
    assert_eq!(list.len(), 1, "{reps}");
    assert_eq!(list[0]["reachable"], true);
    assert_eq!(list[0]["role"], "leader");
    assert_eq!(list[0]["lag"], 0);
    assert!(list[0]["applied_index"].as_u64().expect("index") > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_are_revoked_and_lifted_over_http() {
    let r = Replica::start().await;
    let api = Api::new(&r).await;
    let api = &api;
    const REVOKED: &str = "/v1/policy/revocations/{fingerprint}";
    let fp = format!("sha256:{}", "ab".repeat(32));
    let path = format!("/v1/policy/revocations/{fp}");
    let put = |path: String, body: String| async move {
        let resp = api.http.put(api.url(&path)).header("content-type", "application/json").body(body);
        api.checked("put", REVOKED, resp.send().await.expect("PUT")).await
    };
    let far = 4_000_000_000_000u64;
    let body = json!({ "subject": "user/alice", "not_after_ms": far, "note": "stolen laptop" }).to_string();
    let set = put(path.clone(), body.clone()).await;
    assert_eq!(set.0, StatusCode::OK, "{}", set.1);
    assert_eq!((set.1["action"].as_str(), set.1["name"].as_str()), (Some("revoke"), Some(fp.as_str())));
    let again = put(path.clone(), body).await;
    assert_eq!(again.1["version"], set.1["version"], "a retry changed the view: {}", again.1);
    let (_, policy) = api.get("/v1/policy", "/v1/policy").await;
    let listed = &policy["revocations"];
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{policy}");
    assert_eq!(
        (&listed[0]["fingerprint"], &listed[0]["subject"], &listed[0]["not_after_ms"], &listed[0]["note"]),
        (&json!(fp), &json!("user/alice"), &json!(far), &json!("stolen laptop")),
        "{policy}"
    );
    // Malformed or expired changes are refused and change nothing.
    let before = api.get("/v1/policy", "/v1/policy").await.1;
    for (path, body, status, code) in [
        (
            "/v1/policy/revocations/sha256:AB".to_string(),
            json!({ "not_after_ms": far }).to_string(),
            StatusCode::BAD_REQUEST,
            "invalid_argument",
        ),
        (path.clone(), json!({ "note": "no expiry" }).to_string(), StatusCode::BAD_REQUEST, "malformed_json"),
        (
            path.clone(),
            json!({ "not_after_ms": far, "extra": 1 }).to_string(),
            StatusCode::BAD_REQUEST,
            "malformed_json",
        ),
        (
            path.clone(),
            json!({ "not_after_ms": far, "note": "x".repeat(300) }).to_string(),
            StatusCode::BAD_REQUEST,
            "invalid_argument",
        ),
        (path.clone(), json!({ "not_after_ms": 1 }).to_string(), StatusCode::CONFLICT, "conflict"),
    ] {
        let got = put(path, body).await;
        assert_error(&got, status, code);
    }
    assert_eq!(api.get("/v1/policy", "/v1/policy").await.1, before, "a refused change changed the policy");
    let got = api.delete(REVOKED, &path).await;
    assert_eq!((got.0, got.1["action"].as_str()), (StatusCode::OK, Some("unrevoke")), "{}", got.1);
    assert_eq!(api.get("/v1/policy", "/v1/policy").await.1["revocations"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quotas_and_classes_are_set_and_removed_over_http() {
    let r = Replica::start().await;
    let api = Api::new(&r).await;
    let api = &api;
    const QUOTA: &str = "/v1/policy/quotas/{tenant}";
    const CLASS: &str = "/v1/policy/classes/{class}";
    let put = |template: &'static str, path: String, body: String| async move {
        let resp = api.http.put(api.url(&path)).header("content-type", "application/json").body(body);
        api.checked("put", template, resp.send().await.expect("PUT")).await
    };
    // A quota binds submissions and placements of its tenant from now on; setting it again
    // changes nothing (the same view version).
    let set = put(QUOTA, "/v1/policy/quotas/vision".into(), json!({ "gpus": 2 }).to_string()).await;
    assert_eq!(set.0, StatusCode::OK, "{}", set.1);
    assert_eq!((set.1["action"].as_str(), set.1["name"].as_str()), (Some("set-quota"), Some("vision")));
    let again = put(QUOTA, "/v1/policy/quotas/vision".into(), json!({ "gpus": 2 }).to_string()).await;
    assert_eq!(again.1["version"], set.1["version"], "a retry changed the view: {}", again.1);
    let big = json!({ "name": "big", "gpus": 4, "tenant": "vision" });
    let refused = api.submit_json(big.clone()).await;
    assert!(refused.0.is_client_error(), "a submission over the quota: {}", refused.1);
    assert!(refused.1["message"].as_str().is_some_and(|m| m.contains("quota")), "{}", refused.1);
    api.admit(json!({ "name": "small", "gpus": 2, "tenant": "vision" })).await;
    // A class: jobs naming it are admitted with its priority.
    let set = put(CLASS, "/v1/policy/classes/urgent".into(), json!({ "priority": 500 }).to_string()).await;
    assert_eq!((set.0, set.1["action"].as_str()), (StatusCode::OK, Some("set-class")), "{}", set.1);
    let urgent = api.admit(json!({ "name": "u", "gpus": 1, "priority": "urgent" })).await;
    let (_, job) = api.get("/v1/jobs/{id}", &format!("/v1/jobs/{urgent}")).await;
    assert_eq!(job["priority"], 500, "{job}");
    let (s, policy) = api.get("/v1/policy", "/v1/policy").await;
    assert_eq!(s, StatusCode::OK, "{policy}");
    assert_eq!(policy["quotas"], json!([{ "tenant": "vision", "gpus": 2, "held": 0 }]), "{policy}");
    assert_eq!(policy["classes"][0], json!({ "class": "urgent", "priority": 500 }), "highest first: {policy}");
    // A quota at a class and above: 1 GPU at `urgent`; a 2-GPU job of that priority never fits
    // it, by number as by name; a class the cluster does not have is refused as a conflict.
    const CLASS_QUOTA: &str = "/v1/policy/quotas/{tenant}/classes/{class}";
    let set =
        put(CLASS_QUOTA, "/v1/policy/quotas/vision/classes/urgent".into(), json!({ "gpus": 1 }).to_string()).await;
    assert_eq!((set.0, set.1["action"].as_str()), (StatusCode::OK, Some("set-class-quota")), "{}", set.1);
    assert_eq!(set.1["name"], "vision/urgent");
    for priority in [json!("urgent"), json!(600)] {
        let refused =
            api.submit_json(json!({ "name": "u2", "gpus": 2, "tenant": "vision", "priority": priority })).await;
        assert!(refused.0.is_client_error(), "over the class quota: {}", refused.1);
        let m = refused.1["message"].as_str().unwrap_or_default();
        assert!(m.contains("quota of 1 at class `urgent`"), "{}", refused.1);
    }
    let unknown = put(CLASS_QUOTA, "/v1/policy/quotas/vision/classes/nightly".into(), json!({ "gpus": 1 }).to_string());
    assert_error(&unknown.await, StatusCode::CONFLICT, "conflict");
    let (_, policy) = api.get("/v1/policy", "/v1/policy").await;
    let shown = json!([{ "tenant": "vision", "class": "urgent", "gpus": 1, "held": 0 }]);
    assert_eq!(policy["class_quotas"], shown, "{policy}");
    // Malformed requests change nothing.
    let before = api.get("/v1/policy", "/v1/policy").await.1;
    for (template, path, body, code) in [
        (QUOTA, "/v1/policy/quotas/vision", r#"{"gpus": -1}"#, "malformed_json"),
        (QUOTA, "/v1/policy/quotas/vision", r#"{"gpus": 1, "extra": true}"#, "malformed_json"),
        (QUOTA, "/v1/policy/quotas/vision", "{}", "malformed_json"),
        (QUOTA, "/v1/policy/quotas/two%20words", r#"{"gpus": 1}"#, "invalid_argument"),
        (QUOTA, "/v1/policy/quotas/vision", r#"{"gpus": 2000000}"#, "invalid_argument"),
        (CLASS, "/v1/policy/classes/urgent", r#"{"priority": "high"}"#, "malformed_json"),
        (CLASS, "/v1/policy/classes/urgent?x=1", r#"{"priority": 1}"#, "bad_query"),
    ] {
        let got = put(template, path.into(), body.into()).await;
        assert_error(&got, StatusCode::BAD_REQUEST, code);
    }
    let after = api.get("/v1/policy", "/v1/policy").await.1;
    assert_eq!(before, after, "a refused change changed the policy");
    // Removed: the class is unknown to new jobs (and its quota gone), the tenant unbounded.
    let got = api.delete(CLASS, "/v1/policy/classes/urgent").await;
    assert_eq!((got.0, got.1["action"].as_str()), (StatusCode::OK, Some("remove-class")), "{}", got.1);
    assert_eq!(api.get("/v1/policy", "/v1/policy").await.1["class_quotas"], json!([]));
    let refused = api.submit_json(json!({ "name": "u2", "gpus": 1, "priority": "urgent" })).await;
    assert!(refused.0.is_client_error(), "a removed class: {}", refused.1);
    let got = api.delete(QUOTA, "/v1/policy/quotas/vision").await;
    assert_eq!((got.0, got.1["action"].as_str()), (StatusCode::OK, Some("remove-quota")), "{}", got.1);
    api.admit(big).await;
    let (_, policy) = api.get("/v1/policy", "/v1/policy").await;
    assert_eq!(policy["quotas"], json!([]), "{policy}");
}
