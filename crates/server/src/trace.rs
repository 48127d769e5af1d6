//! A `tracing` span per request (`http.request`, level `info`): the method, the matched
//! route template, the status, the latency and the request id — the `Idempotency-Key`
//! sent, or else the one the server generated when the response names its operation
//! (`Location: /v1/operations/{id}`). The span is the parent of everything the handler
//! does (the engine's `operation` span among them).
//!
//! This crate only emits spans: whoever installs a subscriber decides what becomes of
//! them (the binary's `telemetry` module logs them, and with its `otlp` feature exports
//! them). With no subscriber listening at `info`, a request pays one disabled-span check.

use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::http::header;
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;
use tracing::field::Empty;

use crate::extract::IDEMPOTENCY_KEY;

/// The middleware (`axum::middleware::from_fn(trace::request)`), added with
/// `Router::layer` so that it runs after routing and sees [`MatchedPath`].
pub async fn request(req: Request, next: Next) -> Response {
    let span = tracing::info_span!(
        "http.request",
        otel.name = Empty,
        otel.kind = "server",
        otel.status_code = Empty,
        http.request.method = %req.method(),
        http.route = Empty,
        url.path = Empty,
        http.response.status_code = Empty,
        request_id = Empty,
        latency_ms = Empty,
    );
    if span.is_disabled() {
        return next.run(req).await;
    }
    let route = req.extensions().get::<MatchedPath>().map(|m| m.as_str().to_string());
    // OpenTelemetry's HTTP server span name: `{method} {route}`, or the method alone
    // when no route matched (the path is unbounded: not for a name).
    match &route {
        Some(route) => {
            span.record("otel.name", format!("{} {route}", req.method()));
            span.record("http.route", route.as_str());
        }
        None => {
            span.record("otel.name", req.method().as_str());
        }
    }
    span.record("url.path", req.uri().path());
    let sent = req.headers().get(IDEMPOTENCY_KEY).and_then(|v| v.to_str().ok()).filter(|k| is_request_id(k));
    if let Some(key) = sent {
        span.record("request_id", key);
    }
    let sent = sent.is_some();
    let start = Instant::now();
    let response = next.run(req).instrument(span.clone()).await;
    let status = response.status();
    span.record("http.response.status_code", status.as_u16());
    span.record("latency_ms", start.elapsed().as_secs_f64() * 1e3);
    if status.is_server_error() {
        span.record("otel.status_code", "error");
    }
    if !sent && let Some(id) = generated_request_id(&response) {
        span.record("request_id", id.as_str());
    }
    response
}

/// Whether `key` is a well-formed request id (the extractor refuses the others with 400;
/// the span does not record what the server refuses).
fn is_request_id(key: &str) -> bool {
    crate::contract::IDEMPOTENCY_KEY.matches(key)
}

/// The request id of the operation a response points to (`Location:
/// /v1/operations/{id}`, percent-decoded): the one the server generated when the request
/// sent none.
fn generated_request_id(response: &Response) -> Option<String> {
    let location = response.headers().get(header::LOCATION)?.to_str().ok()?;
    let encoded = location.strip_prefix("/v1/operations/")?;
    let id = percent_decode(encoded)?;
    is_request_id(&id).then_some(id)
}

/// `%XX` escapes decoded (as `routes::encode_segment` writes them); `None` if malformed.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_come_back_from_operation_locations() {
        assert_eq!(percent_decode("a%3Ab-c").as_deref(), Some("a:b-c"));
        assert_eq!(percent_decode("abc%3"), None);
        assert_eq!(percent_decode("%zz"), None);
        let location = |l: &str| {
            let mut r = Response::new(axum::body::Body::empty());
            r.headers_mut().insert(header::LOCATION, l.parse().unwrap());
            generated_request_id(&r)
        };
        assert_eq!(location("/v1/operations/req%3A1").as_deref(), Some("req:1"));
        assert_eq!(location("/v1/machines/door/entities/d1"), None);
        assert_eq!(location("/v1/operations/a%20b"), None);
    }
}
