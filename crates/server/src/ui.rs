//! The dashboard (DESIGN §7): a single page under `/ui/`, its three files compiled into
//! the binary. It is a client of the public API like any other (it reads `/v1/…` with the
//! token it was given), so these routes serve no data and need no token; they are not API
//! routes and stay out of the OpenAPI document.
//!
//! `/`, `/ui` and `/dashboard` redirect to `/ui/`. Every answer carries a strict
//! Content-Security-Policy: scripts and styles from this origin only (the state diagrams'
//! inline SVG `<style>` aside), no frames, no form posts elsewhere.

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

const INDEX: &str = include_str!("../ui/index.html");
const APP_JS: &str = include_str!("../ui/app.js");
const APP_CSS: &str = include_str!("../ui/app.css");

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The dashboard's routes, to merge into the service's router.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(|| async { Redirect::permanent("/ui/") }))
        .route("/ui", get(|| async { Redirect::permanent("/ui/") }))
        .route("/dashboard", get(|| async { Redirect::permanent("/ui/") }))
        .route("/ui/", get(|| async { asset("text/html; charset=utf-8", INDEX) }))
        .route("/ui/app.js", get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }))
        .route("/ui/app.css", get(|| async { asset("text/css; charset=utf-8", APP_CSS) }))
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut r = body.into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    // The files change with the binary: revalidate rather than cache stale code.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}
