//! The HTTP/JSON API against a real single replica (raft on RocksDB in a temp dir, gRPC and
//! HTTP on free local ports), with a real HTTP client: every endpoint, bad input, and logs from
//! a stand-in node agent.

use reqwest::StatusCode;
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use tessera_proto::v1;
use tessera_testkit::LocalCluster;
use tessera_view::fit::{FitMode, member_request, plan_member};
use tessera_view::{ClusterSpec, ClusterView, JobSpec, LocalityLevel, ServerId, Topology, ViewSnapshot};
use tessera_view_server::{Tuning, ViewClient};

/// One replica with the HTTP API (a [`LocalCluster`] of one).
struct Replica {
    http: String,
    grpc: String,
    _cluster: LocalCluster,
}

impl Replica {
    async fn start() -> Replica {
        let spec = ClusterSpec::uniform(Topology::preset("seed-8gpu").expect("preset"), 2, 2, 1);
        let tuning = Tuning { tick_ms: 20, sync: false, request_timeout_ms: 3000, ..Tuning::default() };
        let cluster =
            LocalCluster::builder(spec).name("http-test").http(true).tuning(tuning).start().await.expect("replica");
        let http = cluster.http_addr().expect("an HTTP address");
        let r = Replica { http: format!("http://{http}"), grpc: cluster.addrs()[0].clone(), _cluster: cluster };
        let mut c = r.view();
        c.wait_for_leader().await.expect("the replica elected itself");
        // The HTTP API answers once the replica does.
        let start = Instant::now();
        loop {
            if let Ok(resp) = reqwest::get(r.url("/v1/status")).await
                && resp.status() == StatusCode::OK
            {
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(20), "the HTTP API never answered");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        r
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.http)
    }

    fn view(&self) -> ViewClient {
        ViewClient::new(vec![self.grpc.clone()]).expect("client").with_deadline(Duration::from_secs(10))
    }
}

/// Status and JSON body of a response.
async fn json_of(resp: reqwest::Response) -> (StatusCode, Value) {
    let status = resp.status();
    let text = resp.text().await.expect("a body");
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (status, v)
}

/// Asserts an error answer: status, code, and a non-empty message.
fn assert_error(got: &(StatusCode, Value), status: StatusCode, code: &str) {
    assert_eq!(got.0, status, "body: {}", got.1);
    assert_eq!(got.1["code"], code, "body: {}", got.1);
    assert!(got.1["message"].as_str().is_some_and(|m| !m.is_empty()), "body: {}", got.1);
}

async fn submit_json(http: &reqwest::Client, r: &Replica, spec: Value) -> (StatusCode, Value) {
    json_of(http.post(r.url("/v1/jobs")).json(&spec).send().await.expect("POST /v1/jobs")).await
}

async fn submit_toml(http: &reqwest::Client, r: &Replica, text: &str) -> (StatusCode, Value) {
    let resp = http
        .post(r.url("/v1/jobs"))
        .header("content-type", "application/toml")
        .body(text.to_string())
        .send()
        .await
        .expect("POST /v1/jobs");
    json_of(resp).await
}

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

async fn get(http: &reqwest::Client, r: &Replica, path: &str) -> (StatusCode, Value) {
    json_of(http.get(r.url(path)).send().await.expect("GET")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_answer_and_refuse_bad_input() {
    let r = Replica::start().await;
    let http = reqwest::Client::new();

    let (s, st) = get(&http, &r, "/v1/status").await;
    assert_eq!(s, StatusCode::OK, "{st}");
    assert_eq!(st["replica"], 1);
    assert_eq!(st["role"], "leader");
    assert_eq!(st["leader"], 1);
    assert_eq!(st["gpus"]["total"], 16);
    assert_eq!(st["gpus"]["free"], 16);
    assert_eq!(st["jobs"]["pending"], 0);
    assert_eq!(st["state_hash"].as_str().map(str::len), Some(16));

    // Submit: JSON in the job-file shape, and TOML.
    let (s, a) = submit_json(
        &http,
        &r,
        json!({ "name": "json-job", "gpus": 4, "members": 2, "locality": { "tolerate": "rack" } }),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{a}");
    let a = a["job"].as_u64().expect("a job id");
    let (s, b) = submit_toml(
        &http,
        &r,
        "name = \"toml-job\"\ngpus = 2\nscheduler = \"default\"\n[locality]\nprefer = \"socket\"\n",
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let b = b["job"].as_u64().expect("a job id");

    let (s, list) = get(&http, &r, "/v1/jobs").await;
    assert_eq!(s, StatusCode::OK);
    let jobs = list["jobs"].as_array().expect("jobs");
    assert_eq!(jobs.len(), 2, "{list}");
    assert_eq!(jobs[0]["id"], a);
    assert_eq!(jobs[0]["state"], "pending");
    assert_eq!(jobs[0]["gpus"], 4);
    assert_eq!(jobs[0]["members"], 2);
    assert_eq!(jobs[1]["scheduler"], "default");
    assert_eq!(jobs[1]["placement"], json!([]));

    let (s, one) = get(&http, &r, &format!("/v1/jobs/{b}")).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(one["name"], "toml-job");
    assert_eq!(one["spec"]["prefer"], "socket");
    assert_eq!(one["tasks"], json!([]));

    // Unknown and malformed ids.
    assert_error(&get(&http, &r, "/v1/jobs/999").await, StatusCode::NOT_FOUND, "unknown_job");
    assert_error(&get(&http, &r, "/v1/jobs/abc").await, StatusCode::BAD_REQUEST, "bad_job_id");

    // Malformed JSON names the line.
    let resp =
        http.post(r.url("/v1/jobs")).header("content-type", "application/json").body("{\n \"name\": ").send().await;
    let bad = json_of(resp.expect("POST")).await;
    assert_error(&bad, StatusCode::BAD_REQUEST, "malformed_json");
    assert_eq!(bad.1["line"], 2);
    // A JSON field the spec does not know is named.
    let bad = submit_json(&http, &r, json!({ "name": "x", "gpuz": 2 })).await;
    assert_error(&bad, StatusCode::BAD_REQUEST, "invalid_spec");
    assert_eq!(bad.1["field"], "gpuz");
    // TOML: a value of the wrong kind, and a rule broken, each with line and field.
    let bad =
        submit_toml(&http, &r, "name = \"t\"\ngpus = 2\n[locality]\nprefer = \"rack\"\ntolerate = \"nowhere\"\n").await;
    assert_error(&bad, StatusCode::BAD_REQUEST, "invalid_spec");
    assert_eq!((bad.1["line"].clone(), bad.1["field"].clone()), (json!(5), json!("locality.tolerate")), "{}", bad.1);
    let bad =
        submit_toml(&http, &r, "name = \"t\"\ngpus = 2\n[locality]\nprefer = \"rack\"\ntolerate = \"socket\"\n").await;
    assert_error(&bad, StatusCode::BAD_REQUEST, "invalid_spec");
    assert_eq!((bad.1["line"].clone(), bad.1["field"].clone()), (json!(5), json!("locality.tolerate")), "{}", bad.1);
    assert!(bad.1["message"].as_str().is_some_and(|m| m.contains("line 5")), "{}", bad.1);

    // A job that can never fit is refused with the view's reason.
    let never = submit_json(&http, &r, json!({ "name": "huge", "gpus": 64, "members": 1 })).await;
    assert_error(&never, StatusCode::UNPROCESSABLE_ENTITY, "never_fits");
    let never = submit_toml(&http, &r, "name = \"wrong-type\"\ngpus = 1\ngpu_type = \"nvidia-h100-80g\"\n").await;
    assert_error(&never, StatusCode::UNPROCESSABLE_ENTITY, "never_fits");

    // Oversized and unsupported bodies.
    let answer = post_declaring_length(&r, 2 << 20).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("\"code\":\"too_large\""), "{answer}");
    let resp = http.post(r.url("/v1/jobs")).header("content-type", "text/plain").body("name = \"x\"").send().await;
    assert_error(&json_of(resp.expect("POST")).await, StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type");

    // Logs of a job never placed: nothing to read yet.
    assert_error(&get(&http, &r, &format!("/v1/jobs/{a}/logs")).await, StatusCode::CONFLICT, "wrong_state");
    assert_error(
        &get(&http, &r, &format!("/v1/jobs/{a}/logs?stream=both")).await,
        StatusCode::BAD_REQUEST,
        "bad_query",
    );

    // Cancel, then cancel again (a state conflict), then an unknown job.
    let del =
        json_of(http.delete(r.url(&format!("/v1/jobs/{a}?reason=not%20needed"))).send().await.expect("DELETE")).await;
    assert_eq!(del.0, StatusCode::OK, "{}", del.1);
    let (_, one) = get(&http, &r, &format!("/v1/jobs/{a}")).await;
    assert_eq!(one["state"], "failed");
    assert!(one["error"].as_str().is_some_and(|e| e.contains("not needed")), "{one}");
    let again = json_of(http.delete(r.url(&format!("/v1/jobs/{a}"))).send().await.expect("DELETE")).await;
    assert_error(&again, StatusCode::CONFLICT, "conflict");
    let unknown = json_of(http.delete(r.url("/v1/jobs/999")).send().await.expect("DELETE")).await;
    assert_error(&unknown, StatusCode::NOT_FOUND, "not_found");

    // Servers with their GPU bitmaps.
    let (s, servers) = get(&http, &r, "/v1/servers").await;
    assert_eq!(s, StatusCode::OK);
    let list = servers["servers"].as_array().expect("servers");
    assert_eq!(list.len(), 2);
    assert_eq!(list[0]["gpu_bitmap"], "........");
    assert_eq!(list[0]["health"], "up");
    assert_eq!(list[0]["device_type"], "nvidia-v100-16g");
    assert_eq!(list[0]["rack"], "rack-0");
    assert_eq!(list[0]["cores_free"], 32);

    // Unknown routes and methods answer JSON too.
    assert_error(&get(&http, &r, "/v2/nothing").await, StatusCode::NOT_FOUND, "no_such_route");
    let put = json_of(http.put(r.url("/v1/jobs")).send().await.expect("PUT")).await;
    assert_error(&put, StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed");

    // Metrics in the Prometheus text format.
    let text = http.get(r.url("/metrics")).send().await.expect("GET /metrics").text().await.expect("text");
    for line in [
        "tessera_replica_role{replica=\"1\",role=\"leader\"} 1",
        "tessera_jobs{state=\"pending\"} 1",
        "tessera_jobs{state=\"failed\"} 1",
        "tessera_gpus{use=\"total\"} 16",
        "tessera_http_requests_total{route=\"/v1/jobs\",method=\"POST\",status=\"201\"} 2",
        "tessera_http_requests_total{route=\"/v1/jobs/{id}\",method=\"GET\",status=\"404\"} 1",
        "tessera_http_request_duration_seconds_bucket{route=\"/v1/status\",le=\"+Inf\"}",
    ] {
        assert!(text.contains(line), "no `{line}` in:\n{text}");
    }
    assert!(text.contains("tessera_replica_applied_index{replica=\"1\"}"), "{text}");
}

/// Every path and method of the OpenAPI document is routed (no 404 from the router, no 405).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_route_is_served() {
    let r = Replica::start().await;
    let http = reqwest::Client::new();
    let (s, doc) = get(&http, &r, "/v1/openapi.json").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(doc["openapi"], "3.0.3");
    let (_, job) = submit_json(&http, &r, json!({ "name": "doc", "gpus": 1 })).await;
    let id = job["job"].as_u64().expect("a job id");
    let paths = doc["paths"].as_object().expect("paths");
    assert!(paths.len() >= 7);
    let mut checked = 0;
    for (path, ops) in paths {
        let url = r.url(&path.replace("{id}", &id.to_string()));
        for method in ops.as_object().expect("operations").keys() {
            let resp = match method.as_str() {
                "get" => http.get(&url).send().await,
                "post" => http.post(&url).json(&json!({ "name": "doc2", "gpus": 1 })).send().await,
                "delete" => http.delete(&url).send().await,
                other => panic!("the document names method {other} on {path}, which this test does not know"),
            }
            .expect("a response");
            let status = resp.status();
            let body = resp.text().await.expect("a body");
            assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}: {body}");
            assert!(!body.contains("no_such_route"), "{method} {path}: {status} {body}");
            assert!(status.is_success() || body.contains("\"code\""), "{method} {path}: {status} {body}");
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
    let http = reqwest::Client::new();
    let (_, job) = submit_json(&http, &r, json!({ "name": "logged", "gpus": 2 })).await;
    let id = job["job"].as_u64().expect("a job id");

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

    let (s, one) = get(&http, &r, &format!("/v1/jobs/{id}")).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(one["state"], "placed");
    assert_eq!(one["placement"][0]["gpus"].as_array().map(Vec::len), Some(2));
    assert_eq!(one["tasks"][0]["state"], "starting");
    let (_, servers) = get(&http, &r, "/v1/servers").await;
    assert_eq!(servers["servers"][0]["gpu_bitmap"].as_str().map(|b| b.matches('x').count()), Some(2));

    let (s, log) = get(&http, &r, &format!("/v1/jobs/{id}/logs?member=0&stream=stderr&tail_bytes=1024")).await;
    assert_eq!(s, StatusCode::OK, "{log}");
    assert_eq!(log["data"], format!("hello from job {id} member 0 on stderr\n"));
    assert_eq!(log["server"], core.server_name(ServerId(0)).expect("server 0"));
    assert_error(&get(&http, &r, &format!("/v1/jobs/{id}/logs?member=3")).await, StatusCode::BAD_REQUEST, "bad_query");
    assert_error(
        &get(&http, &r, &format!("/v1/jobs/{id}/logs?tail_bytes=-1")).await,
        StatusCode::BAD_REQUEST,
        "bad_query",
    );

    // Ended: the placement is gone; every known agent is asked.
    view.release(id, false).await.expect("release");
    let (_, one) = get(&http, &r, &format!("/v1/jobs/{id}")).await;
    assert_eq!(one["state"], "finished");
    let (s, log) = get(&http, &r, &format!("/v1/jobs/{id}/logs")).await;
    assert_eq!(s, StatusCode::OK, "{log}");
    assert_eq!(log["data"], format!("hello from job {id} member 0 on stdout\n"));

    // Another job, placed and ended, whose log no agent has.
    let (_, other) = submit_json(&http, &r, json!({ "name": "unlogged", "gpus": 1 })).await;
    let other = other["job"].as_u64().expect("a job id");
    let spec = JobSpec::simple("unlogged", 1, 1);
    let (member, _) =
        plan_member(&topo, &rec, ServerId(0), &member_request(&spec, &topo), LocalityLevel::Any, FitMode::Pack)
            .expect("a member fits the emptied server");
    let proposal = v1::Proposal { id: 78, job: other, members: vec![v1::MemberPlacement::from(&member)], based_on: 0 };
    view.propose(vec![proposal]).await.expect("propose");
    view.release(other, false).await.expect("release");
    assert_error(&get(&http, &r, &format!("/v1/jobs/{other}/logs")).await, StatusCode::NOT_FOUND, "no_logs");
}
