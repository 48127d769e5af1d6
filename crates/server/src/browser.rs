//! What a web page can make a browser send to this server, and what the server refuses of
//! it ([`Policy`], checked on every request by [`check`] before routing and
//! authentication):
//!
//! - **DNS rebinding.** A page on `evil.example` whose name the attacker re-points at
//!   127.0.0.1 talks to a loopback server as its own origin; the browser still sends
//!   `Host: evil.example`. The server answers only a `Host` that names it: `localhost`, a
//!   loopback address, an address it listens on (any IP address when it listens on all of
//!   them: an IP address in the URL is never looked up, so it cannot be rebound), or a name
//!   the operator allows (`--allowed-host`). Otherwise 403 `host-not-allowed`.
//! - **Cross-site requests.** A page of another origin can send a "simple" request
//!   without asking first (no CORS preflight): `GET`, or a `POST` whose body is form data
//!   or text. The server refuses any request whose `Origin` is present and is neither its
//!   own (the `Host` it was asked for) nor allowed (`--allowed-origin`): 403
//!   `origin-not-allowed`. And, in case a browser sends no `Origin`, a request that can
//!   change something (any method but `GET`/`HEAD`) must carry `Content-Type:
//!   application/json` (even without a body) or a bearer token: a page cannot send either to
//!   another site without a preflight, which this server never grants. Otherwise 415
//!   `unsupported-media-type`.
//!
//! - **Cross-site reads.** A page can make a browser send a `GET` of another site unasked
//!   (an `<img>`, a link): no `Origin`, but browsers say where it comes from in
//!   `Sec-Fetch-Site`. A server without tokens refuses every request whose
//!   `Sec-Fetch-Site` is `cross-site` or `same-site` (403 `origin-not-allowed`), reads
//!   included, unless its `Origin` is one allowed; only a top-level navigation to the
//!   dashboard's pages (`/`, `/ui/…`: a link to it) passes, and those serve static files.
//! - **Ambiguous hosts.** Two `Host` headers, or a request target in absolute form
//!   (`GET http://other/…`) whose authority differs from `Host`: 400 `bad-request`.
//!
//! The first two checks hold with and without tokens, and can be relaxed explicitly (`*`
//! allows any host or origin; the binary takes `*` only with tokens). With tokens, the
//! third and fourth are the guard's: every route needs a bearer token (401 without one),
//! which a page cannot send to another site unasked. A request without `Host` or `Origin`
//! (not from a browser) passes those checks.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::extract::is_json;
use crate::metrics::{Refusal, Refusals};
use crate::problem::{Kind, Problem};

/// Which `Host` and `Origin` values the server answers; see the [module](self).
#[derive(Debug, Clone, Default)]
pub struct Policy {
    /// Names allowed beyond the loopback ones, lowercase.
    hosts: Vec<String>,
    any_host: bool,
    /// Addresses the server listens on (beyond loopback, always allowed).
    listen: Vec<IpAddr>,
    /// Whether it listens on every address (`0.0.0.0`, `::`): any IP address names it.
    any_address: bool,
    /// Origins allowed beyond the server's own, as `scheme://host:port`.
    origins: Vec<String>,
    any_origin: bool,
    /// Whether the server speaks TLS: the default port of a `Host` without one.
    tls: bool,
    /// Whether tokens are configured: the guard then refuses a request without a bearer
    /// token (401), and the simple-request check is its.
    tokens: bool,
}

/// The Fetch Metadata header that says which site a browser's request comes from.
const SEC_FETCH_SITE: &str = "sec-fetch-site";

/// An `--allowed-host` or `--allowed-origin` that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PolicyError(pub String);

impl Policy {
    /// Loopback only: `localhost` and loopback addresses, plain HTTP, no other origin.
    pub fn new() -> Policy {
        Policy::default()
    }

    /// The server listens on `addrs`: a `Host` naming one of them by address is its own.
    pub fn listening_on(mut self, addrs: &[SocketAddr]) -> Policy {
        for a in addrs {
            if a.ip().is_unspecified() {
                self.any_address = true;
            } else if !self.listen.contains(&a.ip()) {
                self.listen.push(a.ip());
            }
        }
        self
    }

    /// The server speaks TLS (a `Host` without a port then means 443).
    pub fn tls(mut self, tls: bool) -> Policy {
        self.tls = tls;
        self
    }

    /// Tokens are configured (`true`): a request without a bearer token is the guard's
    /// to refuse (401), so requests are not checked for JSON here.
    pub fn with_tokens(mut self, tokens: bool) -> Policy {
        self.tokens = tokens;
        self
    }

    /// Also answers `Host: host` (a DNS name or address, without a port); `*` answers any.
    pub fn allow_host(mut self, host: &str) -> Result<Policy, PolicyError> {
        let host = host.trim();
        if host == "*" {
            self.any_host = true;
            return Ok(self);
        }
        let name = host.to_ascii_lowercase();
        let valid = !name.is_empty()
            && name.len() <= 253
            && name.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            });
        if !valid && name.parse::<IpAddr>().is_err() {
            return Err(PolicyError(format!(
                "`{host}` is not a host name (letters, digits, `-` and dots, without a port or scheme) or an IP address"
            )));
        }
        if !self.hosts.contains(&name) {
            self.hosts.push(name);
        }
        Ok(self)
    }

    /// Also accepts requests from pages of `origin` (`https://ops.example.com`, a port
    /// when it is not the scheme's default); `*` accepts any origin.
    pub fn allow_origin(mut self, origin: &str) -> Result<Policy, PolicyError> {
        let origin = origin.trim();
        if origin == "*" {
            self.any_origin = true;
            return Ok(self);
        }
        let normal = parse_origin(origin).ok_or_else(|| {
            PolicyError(format!("`{origin}` is not an origin: expected `http://HOST[:PORT]` or `https://HOST[:PORT]`"))
        })?;
        if !self.origins.contains(&normal) {
            self.origins.push(normal);
        }
        Ok(self)
    }

    /// Whether any host is answered (`*`).
    pub fn any_host(&self) -> bool {
        self.any_host
    }

    /// Whether any origin is accepted (`*`).
    pub fn any_origin(&self) -> bool {
        self.any_origin
    }

    /// Checks a request's method, target and headers: `Ok`, or the refusal and its problem.
    pub fn check(&self, method: &Method, uri: &Uri, headers: &HeaderMap) -> Result<(), (Refusal, Problem)> {
        let host = headers.get(header::HOST).map(|v| v.to_str().unwrap_or("\u{fffd}"));
        if headers.get_all(header::HOST).iter().count() > 1 {
            let problem = Problem::new(Kind::BadRequest, "the request has more than one `Host` header").field("Host");
            return Err((Refusal::BadHost, problem));
        }
        if let Some(authority) = uri.authority()
            && host.is_some_and(|h| !h.eq_ignore_ascii_case(authority.as_str()))
        {
            let problem = Problem::new(
                Kind::BadRequest,
                format!("the request's target names host `{authority}`, its `Host` header another"),
            )
            .field("Host");
            return Err((Refusal::BadHost, problem));
        }
        if let Some(host) = host
            && !self.host_allowed(host)
        {
            let problem = Problem::new(
                Kind::HostNotAllowed,
                format!(
                    "this server does not answer to host `{host}`: it answers loopback names and addresses, \
                     the addresses it listens on, and the hosts it was started with (--allowed-host)"
                ),
            )
            .field("Host")
            .with("host", host);
            return Err((Refusal::Host, problem));
        }
        if let Some(origin) = headers.get(header::ORIGIN) {
            let origin = origin.to_str().unwrap_or("\u{fffd}");
            if !self.origin_allowed(origin, host) {
                let problem = Problem::new(
                    Kind::OriginNotAllowed,
                    format!(
                        "requests from pages of origin `{origin}` are refused: only this server's own pages \
                         and the origins it was started with (--allowed-origin) may call it"
                    ),
                )
                .field("Origin")
                .with("origin", origin);
                return Err((Refusal::Origin, problem));
            }
        }
        if !self.tokens && self.cross_site(uri, headers) {
            let site = headers.get(SEC_FETCH_SITE).and_then(|v| v.to_str().ok()).unwrap_or_default();
            let problem = Problem::new(
                Kind::OriginNotAllowed,
                format!(
                    "a request a page of another site made the browser send (Sec-Fetch-Site: {site}) is refused: \
                     this server has no tokens, so only its own pages may call it"
                ),
            )
            .field("Sec-Fetch-Site");
            return Err((Refusal::CrossSite, problem));
        }
        if !self.tokens && !matches!(*method, Method::GET | Method::HEAD) && !is_json(headers) && !has_bearer(headers) {
            let got = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("none");
            let problem = Problem::new(
                Kind::UnsupportedMediaType,
                format!(
                    "a {method} request must be sent with `Content-Type: application/json`, even without a body \
                     (content type: {got}): a web page cannot send that to another site without the browser asking first"
                ),
            )
            .field("Content-Type");
            return Err((Refusal::SimpleRequest, problem));
        }
        Ok(())
    }

    /// Whether a browser says the request comes from another site (`Sec-Fetch-Site`:
    /// `cross-site` or `same-site`), and it is neither from an allowed origin nor a
    /// top-level navigation to the dashboard's pages.
    fn cross_site(&self, uri: &Uri, headers: &HeaderMap) -> bool {
        let value = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_ascii_lowercase);
        if !matches!(value(SEC_FETCH_SITE).as_deref(), Some("cross-site" | "same-site")) {
            return false;
        }
        if headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()).is_some_and(|o| self.explicitly_allowed(o)) {
            return false;
        }
        let page = uri.path() == "/" || uri.path() == "/ui" || uri.path().starts_with("/ui/");
        let navigation = value("sec-fetch-mode").as_deref() == Some("navigate");
        !(page && navigation)
    }

    /// Whether `origin` is one the server was started with (or any, `*`).
    fn explicitly_allowed(&self, origin: &str) -> bool {
        self.any_origin || parse_origin(origin).is_some_and(|o| self.origins.contains(&o))
    }

    /// Whether `host` (a `Host` header: name or address, optional port) names this server.
    fn host_allowed(&self, host: &str) -> bool {
        if self.any_host {
            return true;
        }
        let Some(name) = host_name(host) else { return false };
        if name == "localhost" || self.hosts.contains(&name) {
            return true;
        }
        let ip = name.strip_prefix('[').and_then(|n| n.strip_suffix(']')).unwrap_or(&name);
        match ip.parse::<IpAddr>() {
            Ok(ip) => ip.is_loopback() || self.any_address || self.listen.contains(&ip),
            Err(_) => false,
        }
    }

    /// Whether a page of `origin` may call: it is the origin of `host` (the request's
    /// `Host`), or allowed.
    fn origin_allowed(&self, origin: &str, host: Option<&str>) -> bool {
        if self.any_origin {
            return true;
        }
        let Some(origin) = parse_origin(origin) else { return false };
        if self.origins.contains(&origin) {
            return true;
        }
        let Some(host) = host else { return false };
        let (scheme, default) = if self.tls { ("https", "443") } else { ("http", "80") };
        with_port(host, default).is_some_and(|own| format!("{scheme}://{own}") == origin)
    }
}

/// A `Host` value (or an origin's authority) as its host, lowercase, without a trailing
/// dot (an IPv6 address keeps its brackets), and its port if it has one; `None` if it is
/// malformed.
fn split_host(host: &str) -> Option<(String, Option<String>)> {
    let host = host.trim().to_ascii_lowercase();
    let (name, port) = if host.starts_with('[') {
        let end = host.find(']')?;
        let port = match &host[end + 1..] {
            "" => None,
            rest => Some(rest.strip_prefix(':')?),
        };
        (&host[..=end], port)
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (host.as_str(), None),
        }
    };
    if port.is_some_and(|p| p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit())) {
        return None;
    }
    let name = name.strip_suffix('.').unwrap_or(name);
    (!name.is_empty()).then(|| (name.to_string(), port.map(str::to_string)))
}

/// The host of a `Host` value, lowercase, without its port; `None` if it is malformed.
fn host_name(host: &str) -> Option<String> {
    split_host(host).map(|(name, _)| name)
}

/// `host` as `name:port`, with `default` if it names no port.
fn with_port(host: &str, default: &str) -> Option<String> {
    let (name, port) = split_host(host)?;
    Some(format!("{name}:{}", port.as_deref().unwrap_or(default)))
}

/// An origin as `scheme://host:port`, lowercase, the port explicit; `None` if it is not
/// an http(s) origin (`null`, another scheme, a path).
fn parse_origin(origin: &str) -> Option<String> {
    let origin = origin.trim().to_ascii_lowercase();
    let (scheme, rest) = origin.split_once("://")?;
    let default = match scheme {
        "http" => "80",
        "https" => "443",
        _ => return None,
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() || rest.contains(['/', '?', '#', '@']) {
        return None;
    }
    Some(format!("{scheme}://{}", with_port(rest, default)?))
}

/// Whether the request carries `Authorization: Bearer …` (which a browser never sends
/// cross-site without a preflight, unlike the Basic credentials it may remember).
fn has_bearer(headers: &HeaderMap) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.len() > 7 && v[..7].eq_ignore_ascii_case("bearer "))
}

/// The middleware: [`Policy::check`] on every request, refusals counted.
pub async fn check(
    State((policy, refusals)): State<(Arc<Policy>, Arc<Refusals>)>,
    req: Request,
    next: Next,
) -> Response {
    match policy.check(req.method(), req.uri(), req.headers()) {
        Ok(()) => next.run(req).await,
        Err((refusal, problem)) => {
            refusals.count(refusal);
            problem.into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        h
    }

    fn refusal(p: &Policy, method: Method, pairs: &[(&str, &str)]) -> Option<Refusal> {
        p.check(&method, &Uri::from_static("/v1/entities"), &headers(pairs)).err().map(|(r, _)| r)
    }

    #[test]
    fn a_browsers_request_from_another_site_is_refused_without_tokens_but_a_link_to_the_dashboard() {
        let p = Policy::new();
        let check = |p: &Policy, path: &'static str, pairs: &[(&str, &str)]| {
            p.check(&Method::GET, &Uri::from_static(path), &headers(pairs)).err().map(|(r, _)| r)
        };
        let host = ("host", "127.0.0.1:7400");
        for site in ["cross-site", "same-site", "Cross-Site"] {
            let h = [host, ("sec-fetch-site", site), ("sec-fetch-mode", "no-cors")];
            assert_eq!(check(&p, "/v1/entities?where=x", &h), Some(Refusal::CrossSite), "{site}");
            assert_eq!(check(&p, "/metrics", &h), Some(Refusal::CrossSite), "{site}");
            let nav = [host, ("sec-fetch-site", site), ("sec-fetch-mode", "navigate")];
            assert_eq!(check(&p, "/ui/", &nav), None, "a link to the dashboard");
            assert_eq!(check(&p, "/v1/entities", &nav), Some(Refusal::CrossSite), "a link to the API");
        }
        for site in ["same-origin", "none"] {
            assert_eq!(check(&p, "/v1/entities", &[host, ("sec-fetch-site", site)]), None, "{site}");
        }
        // Allowed origins may call from their site; with tokens the guard answers (401).
        let proxy = Policy::new().allow_origin("https://ops.example.com").unwrap();
        let h = [host, ("sec-fetch-site", "cross-site"), ("origin", "https://ops.example.com")];
        assert_eq!(check(&proxy, "/v1/entities", &h), None);
        let guarded = Policy::new().with_tokens(true);
        assert_eq!(check(&guarded, "/v1/entities", &[host, ("sec-fetch-site", "cross-site")]), None);
    }

    #[test]
    fn two_hosts_or_a_target_naming_another_host_are_refused() {
        let p = Policy::new();
        let mut two = headers(&[("host", "127.0.0.1:7400")]);
        two.append(header::HOST, "evil.example".parse().unwrap());
        let r = p.check(&Method::GET, &Uri::from_static("/v1/machines"), &two).err().map(|(r, _)| r);
        assert_eq!(r, Some(Refusal::BadHost));
        let absolute = Uri::from_static("http://evil.example/v1/machines");
        let h = headers(&[("host", "127.0.0.1:7400")]);
        assert_eq!(p.check(&Method::GET, &absolute, &h).err().map(|(r, _)| r), Some(Refusal::BadHost));
        let same = Uri::from_static("http://127.0.0.1:7400/v1/machines");
        assert_eq!(p.check(&Method::GET, &same, &h).err().map(|(r, _)| r), None);
    }

    #[test]
    fn hosts_answered_by_default_are_loopback_and_the_listen_address() {
        let p = Policy::new().listening_on(&["10.1.2.3:7400".parse().unwrap()]);
        for host in [
            "127.0.0.1:7400",
            "127.9.9.9",
            "localhost",
            "LOCALHOST:80",
            "localhost.",
            "[::1]:7400",
            "[::1]",
            "10.1.2.3:7400",
        ] {
            assert_eq!(refusal(&p, Method::GET, &[("host", host)]), None, "{host}");
        }
        for host in [
            "rebind.evil.example",
            "rebind.evil.example:7400",
            "evil.localhost.example",
            "10.1.2.4:7400",
            "[::2]:7400",
            "127.0.0.1:x",
            "",
            "[::1",
        ] {
            assert_eq!(refusal(&p, Method::GET, &[("host", host)]), Some(Refusal::Host), "{host}");
        }
        // No Host at all: not a browser.
        assert_eq!(refusal(&p, Method::GET, &[]), None);
    }

    #[test]
    fn allowed_hosts_and_every_address() {
        let p = Policy::new().allow_host("Settle.Example.com").unwrap();
        assert_eq!(refusal(&p, Method::GET, &[("host", "settle.example.com:443")]), None);
        assert_eq!(refusal(&p, Method::GET, &[("host", "other.example.com")]), Some(Refusal::Host));
        let all = Policy::new().listening_on(&["0.0.0.0:7400".parse().unwrap()]);
        assert_eq!(refusal(&all, Method::GET, &[("host", "192.168.7.7:7400")]), None);
        assert_eq!(refusal(&all, Method::GET, &[("host", "[fe80::1]:7400")]), None);
        assert_eq!(refusal(&all, Method::GET, &[("host", "rebind.evil.example:7400")]), Some(Refusal::Host));
        let any = Policy::new().allow_host("*").unwrap();
        assert!(any.any_host());
        assert_eq!(refusal(&any, Method::GET, &[("host", "rebind.evil.example")]), None);
        for bad in ["http://x.example", "x.example:80", "a b", "x..example", ""] {
            assert!(Policy::new().allow_host(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn origins_other_than_the_servers_own_are_refused() {
        let p = Policy::new();
        let own = [("host", "127.0.0.1:7400"), ("origin", "http://127.0.0.1:7400")];
        assert_eq!(refusal(&p, Method::POST, &[own[0], own[1], ("content-type", "application/json")]), None);
        for origin in [
            "http://127.0.0.1:7401",
            "http://localhost:7400",
            "https://127.0.0.1:7400",
            "null",
            "http://evil.example",
            "file://",
            "http://127.0.0.1:7400/path",
        ] {
            let h = [("host", "127.0.0.1:7400"), ("origin", origin), ("content-type", "application/json")];
            assert_eq!(refusal(&p, Method::POST, &h), Some(Refusal::Origin), "{origin}");
            assert_eq!(refusal(&p, Method::GET, &h[..2]), Some(Refusal::Origin), "{origin}");
        }
        // Default ports: `Host: localhost` is port 80 over HTTP, 443 over TLS.
        assert_eq!(refusal(&p, Method::GET, &[("host", "localhost"), ("origin", "http://localhost")]), None);
        assert_eq!(refusal(&p, Method::GET, &[("host", "localhost"), ("origin", "http://localhost:80")]), None);
        let tls = Policy::new().tls(true);
        assert_eq!(refusal(&tls, Method::GET, &[("host", "localhost"), ("origin", "https://localhost")]), None);
        // An origin without a Host to compare with: refused unless allowed.
        assert_eq!(refusal(&p, Method::GET, &[("origin", "http://localhost")]), Some(Refusal::Origin));
        // Allowed origins (a TLS proxy in front), and any.
        let proxy = Policy::new().allow_origin("https://Settle.Example.com").unwrap();
        let h = [("host", "127.0.0.1:7400"), ("origin", "https://settle.example.com:443")];
        assert_eq!(refusal(&proxy, Method::GET, &h), None);
        let any = Policy::new().allow_origin("*").unwrap();
        assert_eq!(refusal(&any, Method::GET, &[("host", "localhost"), ("origin", "null")]), None);
        for bad in ["settle.example.com", "ftp://x", "https://x/path", "null", "https://"] {
            assert!(Policy::new().allow_origin(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn requests_that_can_change_something_need_json_or_a_bearer_token() {
        let p = Policy::new();
        for method in [Method::POST, Method::PUT, Method::PATCH, Method::DELETE] {
            assert_eq!(refusal(&p, method.clone(), &[]), Some(Refusal::SimpleRequest), "{method}");
            for simple in ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"] {
                let h = [("content-type", simple)];
                assert_eq!(refusal(&p, method.clone(), &h), Some(Refusal::SimpleRequest), "{method} {simple}");
            }
            // Basic credentials a browser may remember do not count.
            assert_eq!(refusal(&p, method.clone(), &[("authorization", "Basic eDp5")]), Some(Refusal::SimpleRequest));
            for ok in [("content-type", "application/json"), ("content-type", "Application/JSON; charset=utf-8")] {
                assert_eq!(refusal(&p, method.clone(), &[ok]), None, "{method} {ok:?}");
            }
            assert_eq!(refusal(&p, method.clone(), &[("authorization", "Bearer abc")]), None);
        }
        assert_eq!(refusal(&p, Method::GET, &[]), None);
        assert_eq!(refusal(&p, Method::HEAD, &[]), None);
        // With tokens the guard answers a request without one (401, not 415).
        let guarded = Policy::new().with_tokens(true);
        assert_eq!(refusal(&guarded, Method::POST, &[("content-type", "text/plain")]), None);
        assert_eq!(
            refusal(&guarded, Method::POST, &[("host", "localhost"), ("origin", "http://evil.example")]),
            Some(Refusal::Origin)
        );
    }
}
