//! `GET /v1/events`: Server-Sent Events that tell a page the view changed, so the dashboard
//! reloads what it shows when (and only when) there is something new.
//!
//! The stream carries the applied view version alone (`event: view`, `data: {"version": N}`),
//! never view data: a caller reads what its rules let it read through the other routes. It
//! follows this replica's applied version (the driver's watch channel, in process), sends the
//! version at once, then at most one event per [`COALESCE`] however fast the view moves, and a
//! comment line every [`KEEPALIVE`] so a dead connection is noticed. A replica serves at most
//! [`MAX_EVENT_STREAMS`] streams; one more is refused with 429 `busy`.

use super::{Api, ApiError};
use crate::error::ViewServerError;
use actix_web::{HttpResponse, web};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tessera_proto::api::ErrorBody;

/// Open event streams one replica serves.
pub const MAX_EVENT_STREAMS: usize = 64;
/// Shortest time between two events of one stream: a burst of commits is one reload.
pub const COALESCE: Duration = Duration::from_millis(250);
/// A comment line this often keeps idle connections alive and finds dead ones.
pub const KEEPALIVE: Duration = Duration::from_secs(15);

/// One open stream's slot; given back when the stream ends.
struct Slot(Arc<AtomicUsize>);

impl Slot {
    fn take(open: &Arc<AtomicUsize>) -> Result<Slot, ApiError> {
        let n = open.fetch_add(1, Ordering::SeqCst);
        if n >= MAX_EVENT_STREAMS {
            open.fetch_sub(1, Ordering::SeqCst);
            let why = format!("{n} event streams open on this replica; at most {MAX_EVENT_STREAMS}");
            return Err(ViewServerError::Busy(why).into());
        }
        Ok(Slot(open.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn view_event(version: u64) -> web::Bytes {
    web::Bytes::from(format!("event: view\ndata: {{\"version\":{version}}}\n\n"))
}

/// A stream of `view` events (Server-Sent Events): the applied view version now, then each
/// time it changes (at most one event per 250 ms), with a keep-alive comment every 15 s.
#[utoipa::path(
    get,
    path = "/v1/events",
    tag = "cluster",
    responses(
        (status = 200, description = "an endless `text/event-stream` of `view` events, data `{\"version\": N}`", content_type = "text/event-stream", body = String),
        (status = 429, description = "too many event streams open on this replica (code `busy`)", body = ErrorBody),
        (status = 503, description = "this replica serves no events (code `unavailable`)", body = ErrorBody),
    )
)]
pub(super) async fn events(api: web::Data<Api>) -> Result<HttpResponse, ApiError> {
    let Some(mut version) = api.version.clone() else {
        return Err(ViewServerError::Stopped("this HTTP API follows no replica's view".into()).into());
    };
    let slot = Slot::take(&api.event_streams)?;
    let (tx, rx) = tokio::sync::mpsc::channel::<web::Bytes>(4);
    api.rt.spawn(async move {
        let _slot = slot;
        let now = *version.borrow_and_update();
        if tx.send(view_event(now)).await.is_err() {
            return;
        }
        let mut keepalive = tokio::time::interval(KEEPALIVE);
        keepalive.reset();
        loop {
            tokio::select! {
                changed = version.changed() => {
                    if changed.is_err() {
                        break; // the replica stopped
                    }
                    // A rate bound, not a synchronisation: later changes within it join this event.
                    tokio::time::sleep(COALESCE).await;
                    let v = *version.borrow_and_update();
                    if tx.send(view_event(v)).await.is_err() {
                        break;
                    }
                }
                _ = keepalive.tick() => {
                    if tx.send(web::Bytes::from_static(b": keep-alive\n\n")).await.is_err() {
                        break;
                    }
                }
                () = tx.closed() => break,
            }
        }
    });
    let body = tokio_stream::wrappers::ReceiverStream::new(rx);
    let body = tokio_stream::StreamExt::map(body, Ok::<_, actix_web::Error>);
    Ok(HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(("Cache-Control", "no-cache"))
        .insert_header(("X-Accel-Buffering", "no"))
        .streaming(body))
}
