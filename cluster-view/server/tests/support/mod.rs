//! What the HTTP API tests share: one replica with the API, and a client that checks every
//! answer against the replica's own OpenAPI document.

// Each test crate uses some of these.
#![allow(dead_code)]

use reqwest::StatusCode;
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use tessera_testkit::LocalCluster;
use tessera_view::{ClusterSpec, Topology};
use tessera_view_server::{Tuning, ViewClient};

/// One replica with the HTTP API (a [`LocalCluster`] of one).
pub struct Replica {
    pub http: String,
    pub grpc: String,
    _cluster: LocalCluster,
}

impl Replica {
    pub async fn start() -> Replica {
        let spec = ClusterSpec::uniform(Topology::preset("seed-8gpu").expect("preset"), 2, 2, 1);
        let tuning = Tuning { tick_ms: 20, sync: false, request_timeout_ms: 3000, ..Tuning::default() };
        let cluster = LocalCluster::builder(spec)
            .name("http-test")
            .http(true)
            .tls(false)
            .tuning(tuning)
            .start()
            .await
            .expect("replica");
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

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.http)
    }

    pub fn view(&self) -> ViewClient {
        ViewClient::new(vec![self.grpc.clone()]).expect("client").with_deadline(Duration::from_secs(10))
    }
}

/// A client of one replica's API that checks every answer against the replica's own OpenAPI
/// document: the operation (method and path template) must be documented, the status must be
/// one of its documented responses, and the JSON body must validate against that response's
/// schema (JSON Schema 2020-12, which OpenAPI 3.1 schemas are).
pub struct Api {
    pub http: reqwest::Client,
    pub base: String,
    pub doc: Value,
}

impl Api {
    pub async fn new(r: &Replica) -> Api {
        let http = reqwest::Client::new();
        let resp = http.get(r.url("/v1/openapi.json")).send().await.expect("GET /v1/openapi.json");
        assert_eq!(resp.status(), StatusCode::OK);
        let doc: Value = resp.json().await.expect("the document is JSON");
        assert_eq!(doc["openapi"], "3.1.0", "{doc}");
        Api { http, base: r.http.clone(), doc }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Validates `body` against a schema of the document, resolving `#/components/...` refs.
    pub fn validate(&self, schema: &Value, body: &Value, what: &str) {
        let mut root = schema.clone();
        root["components"] = self.doc["components"].clone();
        let v = jsonschema::validator_for(&root).unwrap_or_else(|e| panic!("{what}: bad schema {schema}: {e}"));
        let errors: Vec<String> = v.iter_errors(body).map(|e| format!("{e} (at `{}`)", e.instance_path)).collect();
        assert!(errors.is_empty(), "{what}: the body breaks its schema: {errors:#?}\n{body:#}");
    }

    /// Validates `body` against the named component schema.
    pub fn validate_as(&self, component: &str, body: &Value) {
        self.validate(&json!({ "$ref": format!("#/components/schemas/{component}") }), body, component);
    }

    /// Status and JSON body of a response, checked against the document.
    pub async fn checked(&self, method: &str, template: &str, resp: reqwest::Response) -> (StatusCode, Value) {
        let status = resp.status();
        let text = resp.text().await.expect("a body");
        let body: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
        let what = format!("{} {template} → {status}", method.to_uppercase());
        let op = &self.doc["paths"][template][method];
        assert!(op.is_object(), "{what}: the operation is not documented");
        let answer = &op["responses"][status.as_str()];
        assert!(answer.is_object(), "{what}: status not documented: {body}");
        let schema = &answer["content"]["application/json"]["schema"];
        assert!(schema.is_object(), "{what}: no JSON schema documented: {answer}");
        self.validate(schema, &body, &what);
        (status, body)
    }

    pub async fn get(&self, template: &str, path: &str) -> (StatusCode, Value) {
        self.checked("get", template, self.http.get(self.url(path)).send().await.expect("GET")).await
    }

    pub async fn delete(&self, template: &str, path: &str) -> (StatusCode, Value) {
        self.checked("delete", template, self.http.delete(self.url(path)).send().await.expect("DELETE")).await
    }

    pub async fn post(&self, content_type: &str, body: &str) -> (StatusCode, Value) {
        self.post_keyed(content_type, body, None).await
    }

    /// POST /v1/jobs, with an `Idempotency-Key` header when `key` is given.
    pub async fn post_keyed(&self, content_type: &str, body: &str, key: Option<&str>) -> (StatusCode, Value) {
        let mut req = self.http.post(self.url("/v1/jobs")).header("content-type", content_type);
        if let Some(k) = key {
            req = req.header("idempotency-key", k);
        }
        let resp = req.body(body.to_string()).send().await.expect("POST /v1/jobs");
        self.checked("post", "/v1/jobs", resp).await
    }

    pub async fn submit_json(&self, spec: Value) -> (StatusCode, Value) {
        self.post("application/json", &spec.to_string()).await
    }

    pub async fn submit_toml(&self, text: &str) -> (StatusCode, Value) {
        self.post("application/toml", text).await
    }

    /// An admitted job's id.
    pub async fn admit(&self, spec: Value) -> u64 {
        let (s, a) = self.submit_json(spec).await;
        assert_eq!(s, StatusCode::CREATED, "{a}");
        a["job"].as_u64().expect("a job id")
    }
}

/// Asserts an error answer: status, code, and a non-empty message.
pub fn assert_error(got: &(StatusCode, Value), status: StatusCode, code: &str) {
    assert_eq!(got.0, status, "body: {}", got.1);
    assert_eq!(got.1["code"], code, "body: {}", got.1);
    assert!(got.1["message"].as_str().is_some_and(|m| !m.is_empty()), "body: {}", got.1);
}
