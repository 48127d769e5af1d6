//! Conditional GETs: every successful `GET` answer of the API and the dashboard carries a
//! weak `ETag` (a digest of its body, or the one its route set), and a request whose
//! `If-None-Match` names it gets `304 Not Modified` without the body. A page that polls
//! what did not change then costs a few headers. Compression (gzip, for clients that ask)
//! sits outside it (`crate::router`), so the tag is that of the uncompressed body, and
//! weak, as the encodings differ. A body larger than [`MAX_TAGGED`] goes out untagged, as
//! it comes. [`protect`] sets the headers every answer carries (sniffing, framing, caching).

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use http_body_util::BodyExt;
use sha2::{Digest, Sha256};

/// Bodies larger than this are passed through untagged (never buffered whole).
const MAX_TAGGED: usize = 8 << 20;

/// The middleware.
pub(crate) async fn etag(req: Request, next: Next) -> Response {
    let conditional = req.method() == Method::GET || req.method() == Method::HEAD;
    let wanted = req.headers().get(header::IF_NONE_MATCH).cloned();
    let response = next.run(req).await;
    if !conditional || response.status() != StatusCode::OK || is_stream(response.headers()) {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let tag = match parts.headers.get(header::ETAG) {
        Some(t) => t.clone(),
        None => {
            let bytes = match buffered(body).await {
                Ok(Buffered::Whole(bytes)) => bytes,
                // Too large to tag: the part read goes first, then the rest, untagged.
                Ok(Buffered::Large(read, rest)) => {
                    let first = futures_util::stream::once(std::future::ready(Ok::<_, axum::Error>(read)));
                    return Response::from_parts(parts, Body::from_stream(first.chain(rest.into_data_stream())));
                }
                Err(_) => return StatusCode::INTERNAL_SERVER_ERROR.into_response(),
            };
            let tag = tag_of(&bytes);
            parts.headers.insert(header::ETAG, tag.clone());
            if matches(wanted.as_ref(), &tag) {
                return not_modified(parts.headers);
            }
            return Response::from_parts(parts, Body::from(bytes));
        }
    };
    if matches(wanted.as_ref(), &tag) {
        return not_modified(parts.headers);
    }
    Response::from_parts(parts, body)
}

/// The middleware around every answer: `X-Content-Type-Options: nosniff` and
/// `X-Frame-Options: DENY`, and, where the route set no `Cache-Control`, one that keeps
/// answers out of shared caches: `private, no-cache` for an answer with an `ETag` (a
/// browser may keep it, and asks again with `If-None-Match`), `no-store` otherwise.
pub(crate) async fn protect(req: Request, next: Next) -> Response {
    let mut response = next.run(req).await;
    let h = response.headers_mut();
    h.entry(header::X_CONTENT_TYPE_OPTIONS).or_insert(HeaderValue::from_static("nosniff"));
    h.entry(header::X_FRAME_OPTIONS).or_insert(HeaderValue::from_static("DENY"));
    if !h.contains_key(header::CACHE_CONTROL) {
        let cache = if h.contains_key(header::ETAG) { "private, no-cache" } else { "no-store" };
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    }
    response
}

/// A body read up to [`MAX_TAGGED`] bytes.
enum Buffered {
    /// All of it.
    Whole(Bytes),
    /// More: what was read, and the rest still to read.
    Large(Bytes, Body),
}

/// Reads `body` whole, unless it is larger than [`MAX_TAGGED`].
async fn buffered(mut body: Body) -> Result<Buffered, axum::Error> {
    let mut read = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            read.extend_from_slice(&data);
            if read.len() > MAX_TAGGED {
                return Ok(Buffered::Large(Bytes::from(read), body));
            }
        }
    }
    Ok(Buffered::Whole(Bytes::from(read)))
}

/// A server-sent event stream is never buffered.
fn is_stream(h: &HeaderMap) -> bool {
    h.get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"))
}

/// `W/"…"`: the first 16 bytes of the body's SHA-256, hex.
fn tag_of(body: &[u8]) -> HeaderValue {
    let digest = Sha256::digest(body);
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    HeaderValue::from_str(&format!("W/\"{hex}\"")).expect("hex is a valid header value")
}

/// Whether `If-None-Match` names `tag` (weakly: `W/` aside), or is `*`.
fn matches(wanted: Option<&HeaderValue>, tag: &HeaderValue) -> bool {
    let Some(wanted) = wanted.and_then(|w| w.to_str().ok()) else { return false };
    let bare = |t: &str| t.trim().trim_start_matches("W/").to_string();
    let tag = tag.to_str().map(bare).unwrap_or_default();
    wanted.split(',').any(|w| w.trim() == "*" || bare(w) == tag)
}

fn not_modified(headers: HeaderMap) -> Response {
    let mut r = StatusCode::NOT_MODIFIED.into_response();
    for name in [header::ETAG, header::CACHE_CONTROL, header::CONTENT_LOCATION, header::VARY] {
        if let Some(v) = headers.get(&name) {
            r.headers_mut().insert(name, v.clone());
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::{matches, tag_of};

    #[test]
    fn a_tag_matches_itself_weakly_in_a_list_or_as_a_star() {
        let tag = tag_of(b"{\"a\":1}");
        assert!(tag.to_str().unwrap().starts_with("W/\""));
        assert_eq!(tag, tag_of(b"{\"a\":1}"));
        assert_ne!(tag, tag_of(b"{\"a\":2}"));
        let strong = HeaderValue::from_str(tag.to_str().unwrap().trim_start_matches("W/")).unwrap();
        assert!(matches(Some(&strong), &tag));
        let list = HeaderValue::from_str(&format!("\"x\", {}", tag.to_str().unwrap())).unwrap();
        assert!(matches(Some(&list), &tag));
        assert!(matches(Some(&HeaderValue::from_static("*")), &tag));
        assert!(!matches(Some(&HeaderValue::from_static("\"other\"")), &tag));
        assert!(!matches(None, &tag));
    }
}
