//! `GET /ui`: the web dashboard, one page of HTML, CSS and JavaScript compiled into the binary
//! (`dashboard.html`; no build step, nothing fetched from elsewhere). The page holds no data: it
//! reads the JSON routes as its caller (a bearer token from the URL fragment, kept for the tab)
//! and reloads what it shows on each `view` event of `GET /v1/events`. Pages: the cluster (GPU
//! heat map by rack and server, coloured by job, unhealthy and draining marked; jobs and GPUs
//! by state; replicas with role, term, applied index and lag), the queue with why each job
//! waits, jobs, one job (timeline, placement per rank with task states, logs), and usage per
//! tenant and user.

use actix_web::HttpResponse;
use actix_web::http::header;

/// The page.
pub const PAGE: &str = include_str!("dashboard.html");

/// The web dashboard: one self-contained HTML page (it needs no caller; the data it reads does).
#[utoipa::path(
    get,
    path = "/ui",
    tag = "dashboard",
    responses((status = 200, description = "the dashboard page", content_type = "text/html", body = String))
)]
pub(super) async fn page() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        // The page runs its own inline script and talks to this origin alone.
        .insert_header((
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        ))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .insert_header((header::REFERRER_POLICY, "no-referrer"))
        .body(PAGE)
}

/// `/` leads to the dashboard.
#[utoipa::path(
    get,
    path = "/",
    tag = "dashboard",
    responses((status = 302, description = "to the dashboard, `/ui`"))
)]
pub(super) async fn root() -> HttpResponse {
    HttpResponse::Found().insert_header((header::LOCATION, "/ui")).finish()
}
