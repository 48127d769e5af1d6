//! Extractors that fail with a [`Problem`] instead of axum's plain-text rejections: JSON
//! bodies ([`JsonBody`], [`OptionalJsonBody`]), query strings ([`Query`]), path segments
//! ([`Path`]) and the `Idempotency-Key` header ([`IdempotencyKey`]).

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use serde::de::DeserializeOwned;

use crate::problem::{Kind, Problem};

/// The header carrying a client's request id (the operation's idempotency key).
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// Longest accepted `Idempotency-Key`.
pub const MAX_IDEMPOTENCY_KEY: usize = 200;

/// A JSON body of type `T`. The body must be `application/json` (or `application/*+json`);
/// a syntax error is 400 `malformed-json` (with line and column), JSON of the wrong shape
/// 422 `invalid-body` naming the field, a body over the limit 413, another media type 415.
#[derive(Debug)]
pub struct JsonBody<T>(pub T);

/// Like [`JsonBody`], but an empty body is allowed and gives `None`.
#[derive(Debug)]
pub struct OptionalJsonBody<T>(pub Option<T>);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = Problem;
    async fn from_request(req: Request, state: &S) -> Result<Self, Problem> {
        let (headers, bytes) = read_body(req, state).await?;
        if bytes.is_empty() {
            return Err(Problem::new(Kind::MalformedJson, "the request body is empty; a JSON object is expected"));
        }
        Ok(JsonBody(parse(&headers, &bytes)?))
    }
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for OptionalJsonBody<T> {
    type Rejection = Problem;
    async fn from_request(req: Request, state: &S) -> Result<Self, Problem> {
        let (headers, bytes) = read_body(req, state).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalJsonBody(None));
        }
        Ok(OptionalJsonBody(Some(parse(&headers, &bytes)?)))
    }
}

async fn read_body<S: Send + Sync>(req: Request, state: &S) -> Result<(HeaderMap, Bytes), Problem> {
    let headers = req.headers().clone();
    let bytes = Bytes::from_request(req, state).await.map_err(bytes_rejection)?;
    Ok((headers, bytes))
}

fn bytes_rejection(r: BytesRejection) -> Problem {
    if r.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
        Problem::new(Kind::BodyTooLarge, "the request body is larger than the server accepts (see --max-body)")
    } else {
        Problem::new(Kind::BadRequest, format!("cannot read the request body: {}", r.body_text().to_lowercase()))
    }
}

/// Whether `headers` declare a JSON body (`application/json` or `application/*+json`).
pub(crate) fn is_json(headers: &HeaderMap) -> bool {
    let Some(ct) = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json"))
}

fn parse<T: DeserializeOwned>(headers: &HeaderMap, bytes: &[u8]) -> Result<T, Problem> {
    if !is_json(headers) {
        let got = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("none");
        return Err(Problem::new(
            Kind::UnsupportedMediaType,
            format!("the body must be sent as application/json (content type: {got})"),
        )
        .field("Content-Type"));
    }
    let malformed = |e: serde_json::Error| {
        Problem::new(Kind::MalformedJson, format!("malformed JSON: {e}"))
            .with("line", e.line())
            .with("column", e.column())
    };
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        match inner.classify() {
            serde_json::error::Category::Data => {
                let message = inner.to_string();
                // `missing field `x`` is reported at the enclosing object.
                let field = backticked(&message, "missing field `")
                    .map(|f| if path == "." { f.to_string() } else { format!("{path}.{f}") })
                    .unwrap_or(path);
                Problem::new(Kind::InvalidBody, message).field(field)
            }
            _ => malformed(inner),
        }
    })?;
    de.end().map_err(malformed)?;
    Ok(value)
}

/// The text between `prefix` and the next backtick in `message`.
fn backticked<'a>(message: &'a str, prefix: &str) -> Option<&'a str> {
    let start = message.find(prefix)? + prefix.len();
    let len = message[start..].find('`')?;
    Some(&message[start..start + len])
}

/// A query string deserialized into `T`; failures are 400 `bad-request` naming the field.
#[derive(Debug)]
pub struct Query<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Query<T> {
    type Rejection = Problem;
    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Problem> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(v)) => Ok(Query(v)),
            Err(r) => Err(query_rejection(r)),
        }
    }
}

fn query_rejection(r: QueryRejection) -> Problem {
    let text = r.body_text();
    let message = text.strip_prefix("Failed to deserialize query string: ").unwrap_or(&text).to_string();
    let mut p = Problem::new(Kind::BadRequest, format!("bad query string: {message}"));
    if let Some(f) = backticked(&message, "unknown field `").or_else(|| backticked(&message, "duplicate field `")) {
        p = p.field(f);
    }
    p
}

/// Path parameters deserialized into `T`; failures are 400 `bad-request`.
#[derive(Debug)]
pub struct Path<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Path<T> {
    type Rejection = Problem;
    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Problem> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(v)) => Ok(Path(v)),
            Err(PathRejection::FailedToDeserializePathParams(e)) => {
                Err(Problem::new(Kind::BadRequest, format!("bad path: {}", e.body_text().to_lowercase())))
            }
            Err(r) => Err(Problem::new(Kind::Internal, r.body_text())),
        }
    }
}

/// The optional `Idempotency-Key` header: the request id of the operation the request
/// opens ([`crate::contract::IDEMPOTENCY_KEY`]: 1 to 200 characters from
/// `A-Z a-z 0-9 . _ ~ : -`, so it fits a URL path as is).
#[derive(Debug, Clone, Default)]
pub struct IdempotencyKey(pub Option<String>);

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = Problem;
    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Problem> {
        let Some(value) = parts.headers.get(IDEMPOTENCY_KEY) else {
            return Ok(IdempotencyKey(None));
        };
        let bad = || {
            Problem::new(
                Kind::BadRequest,
                format!("Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} characters from A-Z a-z 0-9 . _ ~ : -"),
            )
            .field("Idempotency-Key")
        };
        let key = value.to_str().map_err(|_| bad())?;
        if !crate::contract::IDEMPOTENCY_KEY.matches(key) {
            return Err(bad());
        }
        Ok(IdempotencyKey(Some(key.to_string())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Body {
        key: String,
        n: Option<u32>,
    }

    fn json_headers() -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, "application/json; charset=utf-8".parse().unwrap());
        h
    }

    #[test]
    fn json_errors_name_the_field_or_position() {
        let h = json_headers();
        let e = parse::<Body>(&h, br#"{"key": "a", "n": "x"}"#).unwrap_err();
        assert_eq!(e.kind(), Kind::InvalidBody);
        assert_eq!(e.body().field.as_deref(), Some("n"));
        let e = parse::<Body>(&h, br#"{"n": 1}"#).unwrap_err();
        assert_eq!(e.body().field.as_deref(), Some("key"));
        let e = parse::<Body>(&h, br#"{"key": "a", "x": 1}"#).unwrap_err();
        assert_eq!(e.body().field.as_deref(), Some("x"));
        let e = parse::<Body>(&h, b"{\"key\": \n ").unwrap_err();
        assert_eq!(e.kind(), Kind::MalformedJson);
        assert_eq!(e.body().context["line"], 2);
        let e = parse::<Body>(&h, br#"{"key": "a"} trailing"#).unwrap_err();
        assert_eq!(e.kind(), Kind::MalformedJson);
        let e = parse::<Body>(&HeaderMap::new(), br#"{"key": "a"}"#).unwrap_err();
        assert_eq!(e.kind(), Kind::UnsupportedMediaType);
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, "application/merge-patch+json".parse().unwrap());
        assert!(parse::<Body>(&h, br#"{"key": "a"}"#).is_ok());
    }
}
