//! `GET /v1/config-sets`, `POST /v1/config-sets`, `DELETE /v1/config-sets/{id}`,
//! `POST /v1/servers` and `DELETE /v1/servers/{name}`: the cluster's configuration sets, and an
//! operator's layout changes on the running cluster (the `ChangeLayout` RPC; admins only), as
//! the [`ConfigSetList`] and [`LayoutChanged`] types the CLI prints too.

use super::jobs::read_body;
use super::servers::server_index;
use super::{Api, ApiError, Place, query};
use actix_web::{HttpRequest, HttpResponse, web};
use serde::de::DeserializeOwned;
use tessera_proto::api::{
    AddConfigSetBody, AddServersBody, ConfigSetList, ErrorBody, LayoutChanged, free_server_names,
};
use tessera_proto::v1;
use tessera_proto::v1::layout_request::Change;
use tessera_view::Topology;
use tessera_view::layout::MAX_SERVERS_PER_ADD;

/// Every configuration set, by id, removed ones included, with how many servers each has.
#[utoipa::path(
    get,
    path = "/v1/config-sets",
    tag = "cluster",
    responses(
        (status = 200, description = "every configuration set", body = ConfigSetList),
        (status = 400, description = "a query parameter (code `bad_query`: it takes none)", body = ErrorBody),
        (status = 503, description = "no replica answered (code `unavailable`)", body = ErrorBody),
        (status = 504, description = "no answer in time (code `timeout`)", body = ErrorBody),
    )
)]
pub(super) async fn config_sets(api: web::Data<Api>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    query(&req, &[])?;
    let (snap, _) = api.snapshot().await?;
    Ok(HttpResponse::Ok().json(ConfigSetList::of(&snap)))
}

/// Adds a configuration set, with no servers yet: a topology (a preset by name, or a topology
/// file's TOML) in a rack and InfiniBand domain. Add servers to it with `POST /v1/servers`.
#[utoipa::path(
    post,
    path = "/v1/config-sets",
    tag = "cluster",
    request_body(content = AddConfigSetBody, content_type = "application/json"),
    responses(
        (status = 200, description = "added", body = LayoutChanged),
        (status = 400, description = "a malformed body or topology (codes `malformed_json`, `bad_body`)", body = ErrorBody),
        (status = 403, description = "the caller is not an admin (code `permission_denied`)", body = ErrorBody),
        (status = 409, description = "the view refused it: a rack in another domain, a name taken, a topology name clash (code `conflict`)", body = ErrorBody),
        (status = 413, description = "the body is too large (code `too_large`)", body = ErrorBody),
        (status = 503, description = "no leader answered (code `unavailable`)", body = ErrorBody),
        (status = 504, description = "no answer in time (code `timeout`)", body = ErrorBody),
    )
)]
pub(super) async fn add_config_set(
    api: web::Data<Api>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    query(&req, &[])?;
    let body: AddConfigSetBody = json_body(&read_body(&api, &req, payload).await?)?;
    let topology = match (&body.topology, &body.topology_toml) {
        (Some(name), None) => Topology::preset(name).ok_or_else(|| {
            let known: Vec<&str> = tessera_view::topology::PRESETS.iter().map(|(n, _)| *n).collect();
            bad("topology", format!("unknown preset `{name}` (known: {})", known.join(", ")))
        })?,
        (None, Some(text)) => {
            Topology::from_toml("topology_toml", text).map_err(|e| bad("topology_toml", e.to_string()))?
        }
        _ => return Err(bad("topology", "give `topology` (a preset name) or `topology_toml`, one of them".into())),
    };
    let change = Change::AddConfigSet(v1::AddConfigSet {
        rack: body.rack,
        ib_domain: body.ib_domain,
        topology: Some(v1::Topology::from(&topology)),
    });
    let r = send(&api, change).await?;
    Ok(HttpResponse::Ok().json(LayoutChanged {
        action: "add-config-set".into(),
        version: r.version,
        config_set: r.config_set,
        servers: Vec::new(),
    }))
}

/// Removes a configuration set none of whose servers is left (remove them first); its id is
/// never reused and its name is free again.
#[utoipa::path(
    delete,
    path = "/v1/config-sets/{id}",
    tag = "cluster",
    params(("id" = u32, Path, maximum = 65535, description = "the configuration set's id")),
    responses(
        (status = 200, description = "removed", body = LayoutChanged),
        (status = 400, description = "a malformed id or a query parameter (codes `bad_path`, `bad_query`)", body = ErrorBody),
        (status = 403, description = "the caller is not an admin (code `permission_denied`)", body = ErrorBody),
        (status = 409, description = "the view refused it: servers are left, or it was removed already (code `conflict`)", body = ErrorBody),
        (status = 503, description = "no leader answered (code `unavailable`)", body = ErrorBody),
        (status = 504, description = "no answer in time (code `timeout`)", body = ErrorBody),
    )
)]
pub(super) async fn remove_config_set(
    api: web::Data<Api>,
    req: HttpRequest,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    query(&req, &[])?;
    let id = id.parse::<u16>().map_err(|_| ApiError::BadInput {
        code: "bad_path",
        message: format!("`{id}` is not a configuration set id (0 to 65535)"),
        at: Place { field: Some("id".into()), ..Place::default() },
    })?;
    let r = send(&api, Change::RemoveConfigSet(v1::RemoveConfigSet { config_set: id.into() })).await?;
    Ok(HttpResponse::Ok().json(LayoutChanged {
        action: "remove-config-set".into(),
        version: r.version,
        config_set: Some(id.into()),
        servers: Vec::new(),
    }))
}

/// Adds servers to a configuration set, named, or `count` of them named `<rack>-sNN`. They are
/// down until their agents register (with the set's topology); a retry of an add that was
/// applied is refused (the names exist).
#[utoipa::path(
    post,
    path = "/v1/servers",
    tag = "cluster",
    request_body(content = AddServersBody, content_type = "application/json"),
    responses(
        (status = 200, description = "added", body = LayoutChanged),
        (status = 400, description = "a malformed body (codes `malformed_json`, `bad_body`)", body = ErrorBody),
        (status = 403, description = "the caller is not an admin (code `permission_denied`)", body = ErrorBody),
        (status = 409, description = "the view refused it: a name taken or malformed, an unknown or removed configuration set (code `conflict`)", body = ErrorBody),
        (status = 413, description = "the body is too large (code `too_large`)", body = ErrorBody),
        (status = 503, description = "no leader answered (code `unavailable`)", body = ErrorBody),
        (status = 504, description = "no answer in time (code `timeout`)", body = ErrorBody),
    )
)]
pub(super) async fn add_servers(
    api: web::Data<Api>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    query(&req, &[])?;
    let body: AddServersBody = json_body(&read_body(&api, &req, payload).await?)?;
    let names = match (body.names.is_empty(), body.count) {
        (false, 0) => body.names,
        (true, n @ 1..) if n as usize <= MAX_SERVERS_PER_ADD => {
            let (snap, _) = api.snapshot().await?;
            names_for(&snap, body.config_set, n as usize)?
        }
        (true, 0) => return Err(bad("names", "give `names` or a `count`".into())),
        (true, n) => return Err(bad("count", format!("{n}: 1 to {MAX_SERVERS_PER_ADD}"))),
        (false, _) => return Err(bad("count", "give `names` or a `count`, not both".into())),
    };
    let r = send(&api, Change::AddServers(v1::AddServers { config_set: body.config_set, names })).await?;
    Ok(HttpResponse::Ok().json(LayoutChanged {
        action: "add-servers".into(),
        version: r.version,
        config_set: Some(body.config_set),
        servers: r.names,
    }))
}

/// Removes a server no gang is on (drain it first): its record stays as a tombstone (listed
/// with `health=removed`), its id is never reused, and its name may be given to a new server.
#[utoipa::path(
    delete,
    path = "/v1/servers/{name}",
    tag = "cluster",
    params(("name" = String, Path, description = "the server's name")),
    responses(
        (status = 200, description = "removed", body = LayoutChanged),
        (status = 400, description = "a query parameter (code `bad_query`: it takes none)", body = ErrorBody),
        (status = 403, description = "the caller is not an admin (code `permission_denied`)", body = ErrorBody),
        (status = 404, description = "no such server (code `unknown_server`)", body = ErrorBody),
        (status = 409, description = "the view refused it: gangs still run there, or it was removed already (code `conflict`)", body = ErrorBody),
        (status = 503, description = "no leader answered (code `unavailable`)", body = ErrorBody),
        (status = 504, description = "no answer in time (code `timeout`)", body = ErrorBody),
    )
)]
pub(super) async fn remove_server(
    api: web::Data<Api>,
    req: HttpRequest,
    name: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    query(&req, &[])?;
    let (snap, _) = api.snapshot().await?;
    let id = server_index(&snap, &name)? as u32;
    let r = send(&api, Change::RemoveServer(v1::RemoveServer { server: id })).await?;
    Ok(HttpResponse::Ok().json(LayoutChanged {
        action: "remove-server".into(),
        version: r.version,
        config_set: None,
        servers: vec![name.into_inner()],
    }))
}

/// `count` free names for configuration set `cs` of a view.
fn names_for(snap: &tessera_view::ViewSnapshot, cs: u32, count: usize) -> Result<Vec<String>, ApiError> {
    free_server_names(snap, cs, count).ok_or_else(|| bad("config_set", format!("no configuration set with id {cs}")))
}

async fn send(api: &Api, change: Change) -> Result<v1::LayoutResponse, ApiError> {
    api.call(|mut c| async move {
        let r = c.change_layout(change).await.map_err(ApiError::from);
        (c, r)
    })
    .await
}

fn bad(field: &str, message: String) -> ApiError {
    ApiError::BadInput { code: "bad_body", message, at: Place { field: Some(field.into()), ..Place::default() } }
}

/// A JSON body as `T`, or `malformed_json` with the line and column at fault.
pub(super) fn json_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::BadInput {
        code: "malformed_json",
        message: e.to_string(),
        at: Place { field: None, line: u32::try_from(e.line()).ok(), column: u32::try_from(e.column()).ok() },
    })
}
