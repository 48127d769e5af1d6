//! settle-server: Settle's HTTP/JSON management API (`settle serve`).
//!
//! - [`router`](mod@router): the axum [`Router`](axum::Router) of every route, built from
//!   `utoipa-axum` routers so `/openapi.json` lists exactly the routes served;
//! - [`routes`]: the handlers — machines, entities, events, lifecycle commands,
//!   operations, `/healthz`, `/metrics`;
//! - [`auth`]: bearer tokens with roles (admin, operator, agent scoped to queues, reader);
//! - [`browser`]: what a web page can make a browser send: `Host` (DNS rebinding),
//!   `Origin` and simple requests (cross-site request forgery);
//! - [`ratelimit`]: per-token request rate limits (429 `rate-limited`) and failed
//!   authentications per client address (429 `auth-throttled`);
//! - [`polls`]: agents' long polls, bounded per queue and per token;
//! - [`problem`]: the one error type, served as `application/problem+json`;
//! - [`extract`]: extractors whose rejections are problems too;
//! - [`model`]: the JSON types of requests and responses;
//! - [`ui`]: the dashboard under `/ui/`, a client of the same API, compiled into the binary;
//! - [`listen`]: the listener — HTTP/1.1 with hyper, TLS with rustls, header and request
//!   timeouts, graceful shutdown.
//!
//! Only this crate knows HTTP. It reads no files and no environment: the binary parses
//! `--tokens` and `SETTLE_TOKENS` with [`auth::Tokens`] and hands everything in.
//!
//! ```no_run
//! # async fn demo(engine: settle_engine::Engine<settle_store::AnyStore>) -> std::io::Result<()> {
//! use settle_server::{AppState, Config, Listen, auth::Tokens};
//!
//! let state = AppState::new(engine, &["door"], Tokens::open(), Config::default()).expect("machine");
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:7400").await?;
//! // Plain HTTP; `tls: Some(TlsConfig::from_pem(cert, key)?)` serves HTTPS.
//! let listen = Listen::default();
//! settle_server::serve(listener, settle_server::router(state), std::future::pending(), &listen).await
//! # }
//! ```

pub mod auth;
pub mod browser;
mod conditional;
pub mod contract;
pub mod extract;
pub mod listen;
pub mod metrics;
pub mod model;
pub mod paths;
pub mod polls;
pub mod problem;
pub mod ratelimit;
pub mod router;
pub mod routes;
pub mod state;
pub mod streams;
pub mod trace;
pub mod ui;

#[cfg(test)]
mod cancel_tests;
#[cfg(test)]
mod deploy_tests;
#[cfg(test)]
mod feed_tests;
#[cfg(test)]
mod limits_tests;
#[cfg(test)]
mod narrow_tests;
#[cfg(test)]
mod schedules_tests;
#[cfg(test)]
mod security_tests;
#[cfg(test)]
mod testkit;
#[cfg(test)]
mod tests;

pub use listen::{Listen, TlsConfig, TlsError, serve};
pub use problem::{Kind, Problem};
pub use router::{OpenApiJson, api, openapi, router};
pub use state::{AppState, Config, MetricsRender};

/// The URL of the operation with `request_id`.
pub fn operation_location(request_id: &str) -> String {
    format!("/v1/operations/{}", routes::encode_segment(request_id))
}
