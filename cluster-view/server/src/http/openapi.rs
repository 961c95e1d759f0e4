//! `GET /v1/openapi.json`: the OpenAPI 3.1 document of the API, derived (`utoipa`) from the
//! handlers' `#[utoipa::path]` attributes and the answer types of [`tessera_proto::api`], so
//! the document says what the code does. The HTTP tests check every answer against it.

use actix_web::HttpResponse;
use tessera_proto::api;
use utoipa::OpenApi;

/// The document's root: every path and the schemas they name.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Tessera view API",
        version = "1",
        description = "The cluster view of a Tessera GPU cluster over HTTP/JSON, served by every view replica; \
            writes reach the raft leader wherever they land. Errors are JSON objects (`ErrorBody`) with a \
            stable `code` and a `message`, and the `field`, `line` and `column` of the input at fault when known.",
    ),
    paths(
        super::probes::healthz,
        super::probes::readyz,
        super::servers::status,
        super::servers::servers,
        super::servers::server,
        super::servers::cordon,
        super::servers::drain,
        super::servers::uncordon,
        super::layout::config_sets,
        super::layout::add_config_set,
        super::layout::remove_config_set,
        super::layout::add_servers,
        super::layout::remove_server,
        super::policy::policy,
        super::policy::set_quota,
        super::policy::remove_quota,
        super::policy::set_class_quota,
        super::policy::remove_class_quota,
        super::policy::set_class,
        super::policy::remove_class,
        super::policy::revoke,
        super::policy::unrevoke,
        super::jobs::list_jobs,
        super::jobs::submit,
        super::jobs::get_job,
        super::jobs::cancel,
        super::logs::logs,
        super::metrics::metrics,
        super::usage::usage,
        super::history::history,
        super::queue::queue,
        super::servers::replicas,
        super::events::events,
        super::dashboard::page,
        super::dashboard::root,
        openapi,
    ),
    components(schemas(
        api::ErrorBody,
        api::Probe,
        api::Status,
        api::GpuCounts,
        api::SchedulerHost,
        api::Job,
        api::JobDetail,
        api::JobList,
        api::JobHistory,
        api::Member,
        api::Task,
        api::Server,
        api::ServerList,
        api::ServerCordon,
        api::ServerHealthChange,
        api::ServerDetail,
        api::CordonChanged,
        api::ConfigSetInfo,
        api::ConfigSetList,
        api::AddConfigSetBody,
        api::AddServersBody,
        api::LayoutChanged,
        api::Policy,
        api::Quota,
        api::ClassQuota,
        api::PriorityClass,
        api::QuotaBody,
        api::RevocationBody,
        api::Revoked,
        api::ClassBody,
        api::PolicyChanged,
        api::Submitted,
        api::Cancelled,
        api::Logs,
        api::UsageFigures,
        api::UsageLine,
        api::UsageReport,
        api::WaitInfo,
        api::TimelineStep,
        api::QueuedJob,
        api::Queue,
        api::ReplicaState,
        api::Replicas,
        super::spec::JobFileBody,
        super::logs::LogStream,
        super::probes::NotReady,
    ))
)]
struct ApiDoc;

/// The OpenAPI document of the API, served at `/v1/openapi.json`. Every operation but the
/// open ones (probes, metrics, this document) also answers 401 (no client certificate or bearer
/// token, with TLS) and 403 (the caller may not), added here once rather than on each handler.
pub fn openapi_document() -> utoipa::openapi::OpenApi {
    use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
    let mut doc = ApiDoc::openapi();
    let error = |what: &str| {
        ResponseBuilder::new()
            .description(what)
            .content("application/json", ContentBuilder::new().schema(Some(Ref::from_schema_name("ErrorBody"))).build())
            .build()
    };
    for (path, item) in doc.paths.paths.iter_mut() {
        if super::open_route(path) {
            continue;
        }
        for op in
            [&mut item.get, &mut item.post, &mut item.delete, &mut item.put, &mut item.patch].into_iter().flatten()
        {
            op.responses.responses.entry("401".into()).or_insert_with(|| {
                error("no client certificate and no valid bearer token (code `unauthenticated`)").into()
            });
            op.responses
                .responses
                .entry("403".into())
                .or_insert_with(|| error("the caller may not do this (code `forbidden`; docs/SECURITY.md)").into());
        }
    }
    doc
}

/// This document.
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    tag = "operations",
    responses((status = 200, description = "the OpenAPI 3.1 document", body = serde_json::Value))
)]
pub(super) async fn openapi() -> HttpResponse {
    HttpResponse::Ok().json(openapi_document())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_and_schema_is_documented() {
        let doc = serde_json::to_value(openapi_document()).expect("JSON");
        let paths = doc["paths"].as_object().expect("paths");
        for path in [
            "/healthz",
            "/readyz",
            "/v1/status",
            "/v1/servers",
            "/v1/jobs",
            "/v1/jobs/{id}",
            "/v1/jobs/{id}/logs",
            "/metrics",
            "/v1/openapi.json",
            "/v1/queue",
            "/v1/replicas",
            "/v1/events",
            "/ui",
            "/",
        ] {
            assert!(paths.contains_key(path), "{path} missing");
        }
        assert_eq!(
            doc["paths"]["/v1/jobs"]["post"]["responses"]["422"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/ErrorBody"
        );
        // With TLS every route but the open ones may answer 401 and 403.
        assert!(doc["paths"]["/v1/jobs/{id}"]["delete"]["responses"]["403"].is_object());
        assert!(doc["paths"]["/v1/servers/{name}/drain"]["post"]["responses"]["401"].is_object());
        assert!(doc["paths"]["/healthz"]["get"]["responses"]["401"].is_null());
        let job = &doc["components"]["schemas"]["Job"];
        assert_eq!(job["properties"]["state"]["enum"][0], "pending", "{job}");
        assert!(job["required"].as_array().is_some_and(|r| r.contains(&"id".into())), "{job}");
    }
}
