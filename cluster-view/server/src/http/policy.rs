//! `GET /v1/policy`, `PUT` and `DELETE` of `/v1/policy/quotas/{tenant}`,
//! `/v1/policy/quotas/{tenant}/classes/{class}`, `/v1/policy/classes/{class}` and
//! `/v1/policy/revocations/{fingerprint}`: tenants' GPU quotas (over all their jobs, or at a
//! priority class and above), the priority classes and the revoked credentials of the running
//! cluster, read by any caller and changed by an admin (the `SetPolicy` RPC, audited there), as
//! the [`Policy`] and [`PolicyChanged`] types the CLI prints too. The documented pattern of a
//! tenant or class name is the view's rule (`tessera_view::policy::check_name`): 1 to 64
//! characters, none of them whitespace or a control character. Setting what is in force
//! already, or removing what is absent, changes nothing, so a retried call is safe.

use super::jobs::read_body;
use super::layout::json_body;
use super::{Api, ApiError, query};
use actix_web::{HttpRequest, HttpResponse, web};
use tessera_proto::api::{ClassBody, ErrorBody, Policy, PolicyChanged, QuotaBody, RevocationBody};
use tessera_proto::v1;
use tessera_proto::v1::policy_request::Change;

/// The policy in force: quotas (with what each tenant holds) and priority classes.
#[utoipa::path(
    get,
    path = "/v1/policy",
    tag = "cluster",
    responses(
        (status = 200, description = "the policy in force", body = Policy),
        (status = 400, description = "a query parameter (code `bad_query`: it takes none)", body = ErrorBody),
        (status = 503, description = "no replica answered (code `unavailable`)", body = ErrorBody),
        (status = 504, description = "no answer in time (code `timeout`)", body = ErrorBody),
    )
)]
pub(super) async fn policy(api: web::Data<Api>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    query(&req, &[])?;
    let (snap, _) = api.snapshot().await?;
    Ok(HttpResponse::Ok().json(Policy::of(&snap)))
}

/// Sets a tenant's GPU quota. It binds new placements and submissions; gangs placed already
/// keep their GPUs.
#[utoipa::path(
    put,
    path = "/v1/policy/quotas/{tenant}",
    tag = "cluster",
    params(("tenant" = String, Path, pattern = "^[^\\s\\x00-\\x1f\\x7f-\\x9f]{1,64}$", description = "the tenant (1 to 64 characters, no whitespace or control characters)")),
    request_body(content = QuotaBody, content_type = "application/json"),
    responses(
        (status = 200, description = "set (or in force already)", body = PolicyChanged),
        (status = 400, description = "a malformed body or tenant (codes `malformed_json`, `bad_body`, `invalid_argument`)", body = ErrorBody),
        (status = 403, description = "the caller is not an admin (code `permission_denied`)", body = ErrorBody),
        (status = 409, description = "the view refused it: too many tenants have quotas (code `conflict`)", body = ErrorBody),
        (status = 413, description = "the body is too large (code `too_large`)", body = ErrorBody),
        (status = 503, description = "no leader answered (code `unavailable`)", body = ErrorBody),
        (status = 504, description = "no answer in time (code `timeout`)", body = ErrorBody),
    )
)]
pub(super) async fn set_quota(
    api: web::Data<Api>,
    req: HttpRequest,
    tenant: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    query(&req, &[])?;
    let body: QuotaBody = json_body(&read_body(&api, &req, payload).await?)?;
    let tenant = tenant.into_inner();
    let change = Change::Quota(v1::SetQuota { tenant: tenant.clone(), gpus: Some(body.gpus), class: None });
    changed(&api, change, "set-quota", tenant).await
}

/// Removes a tenant's quota: it has no bound from now on.
#[utoipa::path(
    delete,
    path = "/v1/policy/quotas/{tenant}",
    tag = "cluster",
    params(("tenant" = String, Path, pattern = "^[^\\s\\x00-\\x1f\\x7f-\\x9f]{1,64}$", description = "the tenant")),
    responses(
        (status = 200, description = "removed (or there was none)", body = PolicyChanged),
        (status = 400, description = "a malformed tenant or a query parameter (codes `invalid_argument`, `bad_query`)", body = ErrorBody),
        (status = 403, description = "the caller is not an admin (code `permission_denied`)", body = ErrorBody),
        (status = 503, description = "no leader answered (code `unavailable`)", body = ErrorBody),
        (status = 504, description = "no answer in time (code `timeout`)", body = ErrorBody),
    )
)]
pub(super) async fn remove_quota(
    api: web::Data<Api>,
    req: HttpRequest,
    tenant: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    query(&req, &[])?;
    let tenant = tenant.into_inner();
    let change = Change::Quota(v1::SetQuota { tenant: tenant.clone(), gpus: None, class: None });
    changed(&api, change, "remove-quota", tenant).await
}

/// Sets a tenant's GPU quota at a priority class and above: the most its jobs of that class's
/// priority or higher (by number, whatever class they named) may hold together. It binds new
/// placements and submissions; gangs placed already keep their GPUs.
#[utoipa::path(
    put,
    path = "/v1/policy/quotas/{tenant}/classes/{class}",
    tag = "cluster",
    params(
        ("tenant" = String, Path, pattern = "^[^\\s\\x00-\\x1f\\x7f-\\x9f]{1,64}$", description = "the tenant (1 to 64 characters, no whitespace or control characters)"),
        ("class" = String, Path, pattern = "^[^\\s\\x00-\\x1f\\x7f-\\x9f]{1,64}$", description = "a priority class of the cluster's"),
    ),
    request_body(content = QuotaBody, content_type = "application/json"),
    responses(
        (status = 200, description = "set (or in force already)", body = PolicyChanged),
        (status = 400, description = "a malformed body, tenant or class (codes `malformed_json`, `bad_body`, `invalid_argument`)", body = ErrorBody),
        (status = 403, description = "the caller is not an admin (code `permission_denied`)", body = ErrorBody),
        (status = 409, description = "the view refused it: no such class, or too many class quotas (code `conflict`)", body = ErrorBody),
        (status = 413, description = "the body is too large (code `too_large`)", body = ErrorBody),
        (status = 503, description = "no leader answered (code `unavailable`)", body = ErrorBody),
        (status = 504, description = "no answer in time (code `timeout`)", body = ErrorBody),
    )
)]
pub(super) async fn set_class_quota(
    api: web::Data<Api>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    query(&req, &[])?;
    let body: QuotaBody = json_body(&read_body(&api, &req, payload).await?)?;
    let (tenant, class) = path.into_inner();
    let name = format!("{tenant}/{class}");
    let change = Change::Quota(v1::SetQuota { tenant, gpus: Some(body.gpus), class: Some(class) });
    changed(&api, change, "set-class-quota", name).await
}

/// Removes a tenant's quota at a class: its jobs there are bound by its other quotas only.
#[utoipa::path(
    delete,
    path = "/v1/policy/quotas/{tenant}/classes/{class}",
    tag = "cluster",
    params(
        ("tenant" = String, Path, pattern = "^[^\\s\\x00-\\x1f\\x7f-\\x9f]{1,64}$", description = "the tenant"),
        ("class" = String, Path, pattern = "^[^\\s\\x00-\\x1f\\x7f-\\x9f]{1,64}$", description = "the class"),
    ),
    responses(
        (status = 200, description = "removed (or there was none)", body = PolicyChanged),
        (status = 400, description = "a malformed tenant or class, or a query parameter (codes `invalid_argument`, `bad_query`)", body = ErrorBody),
        (status = 403, description = "the caller is not an admin (code `permission_denied`)", body = ErrorBody),
        (status = 503, description = "no leader answered (code `unavailable`)", body = ErrorBody),
        (status = 504, description = "no answer in time (code `timeout`)", body = ErrorBody),
    )
)]
pub(super) async fn remove_class_quota(
    api: web::Data<Api>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    query(&req, &[])?;
    let (tenant, class) = path.into_inner();
    let name = format!("{tenant}/{class}");
    let change = Change::Quota(v1::SetQuota { tenant, gpus: None, class: Some(class) });
    changed(&api, change, "remove-class-quota", name).await
}

/// Sets a priority class's priority, adding the class if it is new. Jobs submitted afterwards
/// take it; admitted jobs keep theirs.
#[utoipa::path(
    put,
    path = "/v1/policy/classes/{class}",
    tag = "cluster",
    params(("class" = String, Path, pattern = "^[^\\s\\x00-\\x1f\\x7f-\\x9f]{1,64}$", description = "the class (1 to 64 characters, no whitespace or control characters)")),
    request_body(content = ClassBody, content_type = "application/json"),
    responses(
        (status = 200, description = "set (or in force already)", body = PolicyChanged),
        (status = 400, description = "a malformed body or class (codes `malformed_json`, `bad_body`, `invalid_argument`)", body = ErrorBody),
        (status = 403, description = "the caller is not an admin (code `permission_denied`)", body = ErrorBody),
        (status = 409, description = "the view refused it: too many classes (code `conflict`)", body = ErrorBody),
        (status = 413, description = "the body is too large (code `too_large`)", body = ErrorBody),
        (status = 503, description = "no leader answered (code `unavailable`)", body = ErrorBody),
        (status = 504, description = "no answer in time (code `timeout`)", body = ErrorBody),
    )
)]
pub(super) async fn set_class(
    api: web::Data<Api>,
    req: HttpRequest,
    class: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    query(&req, &[])?;
    let body: ClassBody = json_body(&read_body(&api, &req, payload).await?)?;
    let class = class.into_inner();
    let change = Change::PriorityClass(v1::SetPriorityClass { class: class.clone(), priority: Some(body.priority) });
    changed(&api, change, "set-class", class).await
}

/// Removes a priority class (not the last one). Jobs that name it are refused from now on.
#[utoipa::path(
    delete,
    path = "/v1/policy/classes/{class}",
    tag = "cluster",
    params(("class" = String, Path, pattern = "^[^\\s\\x00-\\x1f\\x7f-\\x9f]{1,64}$", description = "the class")),
    responses(
        (status = 200, description = "removed (or there was none)", body = PolicyChanged),
        (status = 400, description = "a malformed class or a query parameter (codes `invalid_argument`, `bad_query`)", body = ErrorBody),
        (status = 403, description = "the caller is not an admin (code `permission_denied`)", body = ErrorBody),
        (status = 409, description = "the view refused it: it is the last class (code `conflict`)", body = ErrorBody),
        (status = 503, description = "no leader answered (code `unavailable`)", body = ErrorBody),
        (status = 504, description = "no answer in time (code `timeout`)", body = ErrorBody),
    )
)]
pub(super) async fn remove_class(
    api: web::Data<Api>,
    req: HttpRequest,
    class: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    query(&req, &[])?;
    let class = class.into_inner();
    let change = Change::PriorityClass(v1::SetPriorityClass { class: class.clone(), priority: None });
    changed(&api, change, "remove-class", class).await
}

/// Revokes a certificate or bearer token by its fingerprint: every replica refuses it
/// (`401`, `… was revoked`) from the moment it applies the change, and every agent's log service
/// once its watch brings the change. Revoking again replaces the entry's subject, note and expiry.
#[utoipa::path(
    put,
    path = "/v1/policy/revocations/{fingerprint}",
    tag = "cluster",
    params(("fingerprint" = String, Path, pattern = "^sha256:[0-9a-f]{64}$", description = "`sha256:` and 64 lowercase hex digits of the certificate's DER or the token's text (`tessera tls revoke` computes it)")),
    request_body(content = RevocationBody, content_type = "application/json"),
    responses(
        (status = 200, description = "revoked (or revoked already with this entry)", body = PolicyChanged),
        (status = 400, description = "a malformed body or fingerprint, or no expiry (codes `malformed_json`, `bad_body`, `invalid_argument`)", body = ErrorBody),
        (status = 403, description = "the caller is not an admin (code `permission_denied`)", body = ErrorBody),
        (status = 409, description = "the view refused it: the credential has expired already, or the list is full (code `conflict`)", body = ErrorBody),
        (status = 413, description = "the body is too large (code `too_large`)", body = ErrorBody),
        (status = 503, description = "no leader answered (code `unavailable`)", body = ErrorBody),
        (status = 504, description = "no answer in time (code `timeout`)", body = ErrorBody),
    )
)]
pub(super) async fn revoke(
    api: web::Data<Api>,
    req: HttpRequest,
    fingerprint: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    query(&req, &[])?;
    let body: RevocationBody = json_body(&read_body(&api, &req, payload).await?)?;
    let fingerprint = fingerprint.into_inner();
    let entry = v1::Revocation {
        fingerprint: fingerprint.clone(),
        subject: body.subject,
        not_after_ms: body.not_after_ms,
        note: body.note,
        at_ms: 0,
    };
    let change = Change::Revocation(v1::SetRevocation { fingerprint: fingerprint.clone(), revocation: Some(entry) });
    changed(&api, change, "revoke", fingerprint).await
}

/// Takes a credential off the revocation list: the CA's signature lets it in again.
#[utoipa::path(
    delete,
    path = "/v1/policy/revocations/{fingerprint}",
    tag = "cluster",
    params(("fingerprint" = String, Path, pattern = "^sha256:[0-9a-f]{64}$", description = "the fingerprint")),
    responses(
        (status = 200, description = "taken off the list (or it was not on it)", body = PolicyChanged),
        (status = 400, description = "a malformed fingerprint or a query parameter (codes `invalid_argument`, `bad_query`)", body = ErrorBody),
        (status = 403, description = "the caller is not an admin (code `permission_denied`)", body = ErrorBody),
        (status = 503, description = "no leader answered (code `unavailable`)", body = ErrorBody),
        (status = 504, description = "no answer in time (code `timeout`)", body = ErrorBody),
    )
)]
pub(super) async fn unrevoke(
    api: web::Data<Api>,
    req: HttpRequest,
    fingerprint: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    query(&req, &[])?;
    let fingerprint = fingerprint.into_inner();
    let change = Change::Revocation(v1::SetRevocation { fingerprint: fingerprint.clone(), revocation: None });
    changed(&api, change, "unrevoke", fingerprint).await
}

/// Sends `change` as the caller and answers what it did.
async fn changed(api: &Api, change: Change, action: &str, name: String) -> Result<HttpResponse, ApiError> {
    let version = api
        .call(|mut c| async move {
            let r = c.set_policy(change).await.map_err(ApiError::from);
            (c, r)
        })
        .await?;
    Ok(HttpResponse::Ok().json(PolicyChanged { action: action.into(), name, version }))
}
