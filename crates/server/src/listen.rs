//! The listener: accepts TCP connections (optionally TLS with rustls), serves HTTP/1.1 on
//! each with hyper, and bounds what a client can hold:
//!
//! - the **header timeout**: a connection that does not send a complete request head within
//!   it (a slow client, an idle keep-alive connection, a stalled TLS handshake) is closed;
//! - the **request timeout**: a handler that has not produced its response within it is
//!   answered with 503 (`request-timeout`). Long polls (`wait=stable`, agents' task polls) are
//!   bounded by the server's `max_wait`, so a request timeout above it leaves them alone.
//!
//! On shutdown the listener stops accepting, idle connections close, and the requests in
//! flight finish.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::response::IntoResponse as _;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::{self, PemObject as _};
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tower::ServiceExt as _;

use crate::{Kind, Problem};

/// How [`serve`] listens: TLS or plain HTTP, and its timeouts.
#[derive(Clone, Debug)]
pub struct Listen {
    /// Serve HTTPS with this certificate and key; `None`: plain HTTP.
    pub tls: Option<TlsConfig>,
    /// Longest time a connection may take to send a request head (and to finish its TLS
    /// handshake); also how long an idle keep-alive connection stays open.
    pub header_timeout: Duration,
    /// Longest time a request may take until its response starts.
    pub request_timeout: Duration,
}

impl Default for Listen {
    /// Plain HTTP, a header timeout of 10 s, a request timeout of 90 s (the default
    /// `max_wait` of 60 s and a margin).
    fn default() -> Self {
        Listen { tls: None, header_timeout: Duration::from_secs(10), request_timeout: Duration::from_secs(90) }
    }
}

/// A TLS server configuration: a certificate chain and its private key (rustls, ring).
#[derive(Clone)]
pub struct TlsConfig(Arc<rustls::ServerConfig>);

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsConfig(..)")
    }
}

/// Why a certificate and key cannot serve TLS.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The certificate file: not PEM, or no `CERTIFICATE` block.
    #[error("{0}")]
    Cert(String),
    /// The key file: not PEM, or no private key block.
    #[error("{0}")]
    Key(String),
    /// Both parse, but rustls refuses them together (a key that does not match the
    /// certificate, an unsupported key type).
    #[error("{0}")]
    Pair(String),
}

impl TlsConfig {
    /// A configuration from PEM text: `cert` holds the certificate chain (leaf first),
    /// `key` a PKCS#8, PKCS#1 (RSA) or SEC1 (EC) private key.
    pub fn from_pem(cert: &[u8], key: &[u8]) -> Result<TlsConfig, TlsError> {
        let certs = CertificateDer::pem_slice_iter(cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TlsError::Cert(format!("not a PEM certificate: {e}")))?;
        if certs.is_empty() {
            return Err(TlsError::Cert("no `BEGIN CERTIFICATE` block: not a PEM certificate".into()));
        }
        let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| match e {
            pem::Error::NoItemsFound => {
                TlsError::Key("no `BEGIN PRIVATE KEY` (PKCS#8, RSA or EC) block: not a PEM private key".into())
            }
            e => TlsError::Key(format!("not a PEM private key: {e}")),
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Pair(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| TlsError::Pair(format!("certificate and key cannot be used together: {e}")))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(TlsConfig(Arc::new(config)))
    }
}

/// Serves `router` on `listener` as `listen` says until `shutdown` resolves, then finishes
/// the requests in flight.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
    listen: &Listen,
) -> std::io::Result<()> {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(listen.header_timeout);
    let acceptor = listen.tls.as_ref().map(|t| tokio_rustls::TlsAcceptor::from(t.0.clone()));
    let (header_timeout, request_timeout) = (listen.header_timeout, listen.request_timeout);
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) if is_connection_error(&e) => continue,
                Err(e) => {
                    // Out of file descriptors, say: wait instead of spinning.
                    tracing::error!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let service = hyper::service::service_fn({
            let router = router.clone();
            move |mut req: hyper::Request<hyper::body::Incoming>| {
                // The client's address, for what is limited per address (failed
                // authentications: `crate::ratelimit::AuthFailures`).
                req.extensions_mut().insert(axum::extract::ConnectInfo(peer));
                let router = router.clone();
                async move {
                    match tokio::time::timeout(request_timeout, router.oneshot(req)).await {
                        Ok(response) => response,
                        Err(_) => Ok::<_, Infallible>(
                            Problem::new(
                                Kind::RequestTimeout,
                                format!(
                                    "the request took longer than the server's request timeout ({request_timeout:?})"
                                ),
                            )
                            .into_response(),
                        ),
                    }
                }
            }
        });
        let (http, watcher, acceptor) = (http.clone(), graceful.watcher(), acceptor.clone());
        tokio::spawn(async move {
            let served = match acceptor {
                None => watcher.watch(http.serve_connection(TokioIo::new(stream), service)).await,
                Some(acceptor) => {
                    // The handshake counts as part of the request head.
                    let tls = match tokio::time::timeout(header_timeout, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => tls,
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!(%peer, "TLS handshake timed out");
                            return;
                        }
                    };
                    watcher.watch(http.serve_connection(TokioIo::new(tls), service)).await
                }
            };
            if let Err(e) = served {
                tracing::debug!(%peer, error = %e, "connection closed with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// Errors of one incoming connection (not of the listener): skip it and accept the next.
fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(e.kind(), ConnectionRefused | ConnectionAborted | ConnectionReset)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::routing::get;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::{Listen, serve};

    /// `GET PATH` on a fresh connection: the raw response.
    async fn get_raw(addr: std::net::SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).await.unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.unwrap();
        String::from_utf8_lossy(&raw).into_owned()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn request_timeout_and_graceful_shutdown() {
        let router = axum::Router::new()
            .route("/fast", get(|| async { "fast" }))
            .route("/slow", get(|| async { tokio::time::sleep(Duration::from_secs(30)).await }))
            .route(
                "/busy",
                get(|| async {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    "finished"
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let listen = Listen { request_timeout: Duration::from_secs(1), ..Listen::default() };
        let server =
            tokio::spawn(
                async move { serve(listener, router, async move { stopped.await.unwrap_or(()) }, &listen).await },
            );

        assert!(get_raw(addr, "/fast").await.starts_with("HTTP/1.1 200"));
        // A handler slower than the request timeout: 503, a problem document.
        let slow = get_raw(addr, "/slow").await;
        assert!(slow.starts_with("HTTP/1.1 503"), "{slow}");
        assert!(slow.contains("request timeout"), "{slow}");

        // Shutdown while a request is in flight: it finishes, then `serve` returns.
        let busy = tokio::spawn(get_raw(addr, "/busy"));
        tokio::time::sleep(Duration::from_millis(100)).await;
        stop.send(()).unwrap();
        let busy = busy.await.unwrap();
        assert!(busy.starts_with("HTTP/1.1 200") && busy.ends_with("finished"), "{busy}");
        tokio::time::timeout(Duration::from_secs(10), server).await.expect("serve returns").unwrap().unwrap();
        // No longer accepting.
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    }
}
