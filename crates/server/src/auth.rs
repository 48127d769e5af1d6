//! Access control: bearer tokens with roles.
//!
//! | role | may |
//! |---|---|
//! | `admin` | everything |
//! | `operator` | read, create entities, raise events, lifecycle commands |
//! | `reader` | `GET` machines, entities, history, operations, `/metrics`, `/openapi.json` |
//! | `agent` | the agent queue routes of its named queues (and `/healthz`) |
//!
//! Every route belongs to one [`Access`] group; [`guard`] puts a group's routes behind the
//! check, which answers 401 (no token, unknown token) or 403 (role not allowed) before the
//! handler runs, and leaves the [`Caller`] in the request for handlers that refine the
//! check (an agent's queues: [`Caller::authorize_queue`]). With no token configured
//! ([`Tokens::open`]) every caller is an admin: the binary then serves loopback only.
//!
//! Tokens are compared in constant time: the server keeps each token's SHA-256 digest,
//! digests the presented token and compares it with every configured digest (all 32 bytes,
//! without stopping at a difference or at a match), so neither a token's content nor its
//! length shows in the time an answer takes.
//!
//! The guard also enforces the per-token request rate limit ([`RateLimiter`]) on every
//! route but the public ones (`/healthz`, `/v1/session`): a token over it is answered
//! 429 `rate-limited` with `Retry-After`; a request refused 401/403 does not count against
//! it. And it slows token guessing ([`AuthFailures`]): a bearer token that matches none is
//! a failure of the client's address (logged with the address and route, never the
//! token); an address with no failure left is answered 429 `auth-throttled` on every
//! request that presents a token, public routes included, before the token is looked at.
//! An open server limits nothing.
//!
//! A token shorter than [`MIN_TOKEN_LEN`] characters is refused when it is configured.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{ConnectInfo, FromRequestParts, Request, State};
use axum::http::header;
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::{ConditionallySelectable, ConstantTimeEq};
use utoipa::openapi::security::SecurityRequirement;
use utoipa_axum::router::OpenApiRouter;

use crate::metrics::{Refusal, Refusals};
use crate::problem::{Kind, Problem};
use crate::ratelimit::{AuthFailures, RateLimiter};

/// The shortest token accepted, in characters: a token is a secret to be guessed, and
/// 16 random characters are far beyond any guessing the failure limit lets through.
pub const MIN_TOKEN_LEN: usize = 16;

/// A token's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Everything.
    Admin,
    /// Read, create, raise, lifecycle commands.
    Operator,
    /// Agent queue routes of its named queues only.
    Agent,
    /// Read only.
    Reader,
}

impl Role {
    /// The role's name in token files.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Operator => "operator",
            Role::Agent => "agent",
            Role::Reader => "reader",
        }
    }
    /// Parses a role name.
    pub fn parse(s: &str) -> Option<Role> {
        Some(match s {
            "admin" => Role::Admin,
            "operator" => Role::Operator,
            "agent" => Role::Agent,
            "reader" => Role::Reader,
            _ => return None,
        })
    }
    /// Whether the role may use routes of `access`.
    pub fn allows(self, access: Access) -> bool {
        match access {
            Access::Public => true,
            Access::Read => matches!(self, Role::Admin | Role::Operator | Role::Reader),
            Access::Write => matches!(self, Role::Admin | Role::Operator),
            Access::Agent => matches!(self, Role::Admin | Role::Agent),
            Access::Admin => matches!(self, Role::Admin),
        }
    }
}

/// The access group of a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// No token needed (`/healthz`).
    Public,
    /// Reads: admin, operator, reader.
    Read,
    /// Changes (create, raise, lifecycle): admin, operator.
    Write,
    /// Agent queues: admin, and agents (each limited to its queues by
    /// [`Caller::authorize_queue`]).
    Agent,
    /// Deploying definitions: admin only.
    Admin,
}

/// One configured token.
#[derive(Clone)]
pub struct Token {
    /// The SHA-256 digest of the secret: what requests are compared with.
    digest: [u8; 32],
    role: Role,
    queues: Vec<String>,
    name: Option<String>,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token")
            .field("role", &self.role)
            .field("queues", &self.queues)
            .field("name", &self.name)
            .finish()
    }
}

impl Token {
    /// A token with `role`; `queues` are the queues of an agent (required for agents, refused
    /// for other roles).
    pub fn new(secret: impl Into<String>, role: Role, queues: Vec<String>) -> Result<Token, TokenError> {
        let secret = secret.into();
        if secret.is_empty() || secret.chars().any(|c| c.is_whitespace() || c == ';') {
            return Err(TokenError("a token must be non-empty, without whitespace or `;`".into()));
        }
        let len = secret.chars().count();
        if len < MIN_TOKEN_LEN {
            return Err(TokenError(format!(
                "a token must be at least {MIN_TOKEN_LEN} characters, not {len}: use a random one \
                 (`openssl rand -hex 24`, say)"
            )));
        }
        match (role, queues.is_empty()) {
            (Role::Agent, true) => return Err(TokenError("an agent token needs `queues`".into())),
            (Role::Agent, false) => {}
            (_, false) => return Err(TokenError(format!("only agent tokens have queues (role {})", role.as_str()))),
            (_, true) => {}
        }
        if let Some(q) = queues.iter().find(|q| q.is_empty()) {
            return Err(TokenError(format!("empty queue name `{q}`")));
        }
        Ok(Token { digest: digest(&secret), role, queues, name: None })
    }
    /// The role.
    pub fn role(&self) -> Role {
        self.role
    }
}

/// The SHA-256 digest of a token.
fn digest(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// A token configuration that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TokenError(pub String);

/// The configured tokens; none means open access (everyone is an admin).
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    tokens: Vec<Token>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenFile {
    #[serde(default)]
    token: Vec<TokenToml>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenToml {
    token: String,
    role: String,
    #[serde(default)]
    queues: Vec<String>,
    name: Option<String>,
}

impl Tokens {
    /// No tokens: every caller is an admin.
    pub fn open() -> Self {
        Tokens::default()
    }
    /// Whether no token is configured (open access).
    pub fn is_open(&self) -> bool {
        self.tokens.is_empty()
    }
    /// How many tokens are configured.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }
    /// Whether no token is configured (same as [`Tokens::is_open`]).
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
    /// Adds a token; the same secret twice is refused.
    pub fn add(&mut self, token: Token) -> Result<(), TokenError> {
        if self.find(&token.digest).is_some() {
            return Err(TokenError("the same token is configured twice".into()));
        }
        self.tokens.push(token);
        Ok(())
    }

    /// Adds every token of `other` (from another source); a secret configured twice is
    /// refused.
    pub fn merge(&mut self, other: Tokens) -> Result<(), TokenError> {
        for t in other.tokens {
            self.add(t)?;
        }
        Ok(())
    }

    /// Parses a token file:
    ///
    /// ```toml
    /// [[token]]
    /// token = "s3cret-admin-token-7f3a9c"
    /// role = "admin"            # admin | operator | reader | agent
    ///
    /// [[token]]
    /// token = "s3cret-dns-agent-token-41bd"
    /// role = "agent"
    /// queues = ["dns"]          # agents only: the queues it may serve
    /// name = "dns agent"        # optional, for logs
    /// ```
    pub fn from_toml(text: &str) -> Result<Tokens, TokenError> {
        let file: TokenFile = toml::from_str(text).map_err(|e| TokenError(e.to_string().trim_end().to_string()))?;
        let mut tokens = Tokens::default();
        for (i, t) in file.token.into_iter().enumerate() {
            let at = |e: TokenError| TokenError(format!("token #{}: {}", i + 1, e.0));
            let role = Role::parse(&t.role)
                .ok_or_else(|| at(TokenError(format!("unknown role `{}` (admin, operator, reader, agent)", t.role))))?;
            let mut token = Token::new(t.token, role, t.queues).map_err(at)?;
            token.name = t.name;
            tokens.add(token).map_err(at)?;
        }
        Ok(tokens)
    }

    /// Parses the `SETTLE_TOKENS` form: entries separated by `;`, each `ROLE=TOKEN`, where
    /// an agent's ROLE is `agent:QUEUE,QUEUE`. Example:
    /// `admin=s3cret-admin-token-7f3a9c;reader=r3ad-token-0c2e7d51;agent:dns,app=ag3nt-token-9b1e44a0`.
    pub fn from_spec(spec: &str) -> Result<Tokens, TokenError> {
        let mut tokens = Tokens::default();
        for (i, entry) in spec.split(';').map(str::trim).filter(|e| !e.is_empty()).enumerate() {
            let at = |e: TokenError| TokenError(format!("SETTLE_TOKENS entry {}: {}", i + 1, e.0));
            let (role, secret) = entry.split_once('=').ok_or_else(|| at(TokenError("expected ROLE=TOKEN".into())))?;
            let (role, queues) = match role.split_once(':') {
                Some((role, queues)) => (role, queues.split(',').map(|q| q.trim().to_string()).collect()),
                None => (role, Vec::new()),
            };
            let role = Role::parse(role.trim())
                .ok_or_else(|| at(TokenError(format!("unknown role `{role}` (admin, operator, reader, agent)"))))?;
            tokens.add(Token::new(secret.trim(), role, queues).map_err(at)?).map_err(at)?;
        }
        Ok(tokens)
    }

    /// The position of the token whose digest is `presented` (a token's digest): compared
    /// with every token, each in constant time, the match selected without a branch.
    fn find(&self, presented: &[u8; 32]) -> Option<usize> {
        let mut found = u64::MAX;
        for (i, t) in self.tokens.iter().enumerate() {
            found.conditional_assign(&(i as u64), t.digest.ct_eq(presented));
        }
        usize::try_from(found).ok().filter(|i| *i < self.tokens.len())
    }

    /// The token the request's `Authorization` header presents.
    fn presented(&self, headers: &axum::http::HeaderMap) -> Presented {
        let presented =
            headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(bearer).map(str::trim);
        match presented {
            None => Presented::None,
            Some(p) => self.find(&digest(p)).map_or(Presented::Unknown, Presented::Known),
        }
    }

    /// Who is calling, from the request's `Authorization` header, for a route of `access`.
    pub fn authenticate(&self, headers: &axum::http::HeaderMap, access: Access) -> Result<Caller, Problem> {
        if self.is_open() {
            return Ok(Caller::open());
        }
        self.caller(self.presented(headers), access)
    }

    /// The caller of a route of `access` presenting `presented` (tokens configured): an
    /// anonymous reader on a public route without a known token, else 401 or 403.
    fn caller(&self, presented: Presented, access: Access) -> Result<Caller, Problem> {
        let index = match presented {
            Presented::Known(i) => i,
            _ if access == Access::Public => {
                return Ok(Caller { role: Role::Reader, queues: Vec::new(), name: None, token: None });
            }
            Presented::None => {
                return Err(Problem::new(Kind::Unauthorized, "this route needs `Authorization: Bearer <token>`"));
            }
            Presented::Unknown => return Err(Problem::new(Kind::Unauthorized, "unknown bearer token")),
        };
        let token = &self.tokens[index];
        if !token.role.allows(access) {
            return Err(Problem::new(Kind::Forbidden, format!("role {} may not use this route", token.role.as_str()))
                .with("role", token.role.as_str()));
        }
        Ok(Caller { role: token.role, queues: token.queues.clone(), name: token.name.clone(), token: Some(index) })
    }

    /// The positions of the tokens that may serve agent queue `queue`: its agents' and
    /// every admin's.
    pub fn servers_of(&self, queue: &str) -> Vec<usize> {
        let serves =
            |t: &Token| t.role == Role::Admin || (t.role == Role::Agent && t.queues.iter().any(|q| q == queue));
        self.tokens.iter().enumerate().filter(|(_, t)| serves(t)).map(|(i, _)| i).collect()
    }
}

/// What a request's `Authorization` header presents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Presented {
    /// No bearer token.
    None,
    /// A bearer token that matches no configured token.
    Unknown,
    /// The configured token at this position.
    Known(usize),
}

/// The authenticated caller of a request (an extractor on guarded routes).
#[derive(Debug, Clone)]
pub struct Caller {
    role: Role,
    queues: Vec<String>,
    name: Option<String>,
    /// The position of the caller's token; none on an open server or for an anonymous caller.
    token: Option<usize>,
}

impl Caller {
    /// The caller of an open server: an admin without a token.
    fn open() -> Caller {
        Caller { role: Role::Admin, queues: Vec::new(), name: None, token: None }
    }
    /// The position of the caller's token in [`Tokens`]; none on an open server.
    pub fn token(&self) -> Option<usize> {
        self.token
    }
    /// The caller's role.
    pub fn role(&self) -> Role {
        self.role
    }
    /// The agent queues the caller may serve: `None` for any (an admin); none for a role
    /// that serves no queue.
    pub fn queues(&self) -> Option<Vec<String>> {
        match self.role {
            Role::Admin => None,
            Role::Agent => Some(self.queues.clone()),
            _ => Some(Vec::new()),
        }
    }
    /// The token's name, if configured.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }
    /// Allows an admin, or an agent whose token names `queue`; anyone else gets 403.
    pub fn authorize_queue(&self, queue: &str) -> Result<(), Problem> {
        match self.role {
            Role::Admin => Ok(()),
            Role::Agent if self.queues.iter().any(|q| q == queue) => Ok(()),
            Role::Agent => {
                Err(Problem::new(Kind::Forbidden, format!("this agent token may not serve queue `{queue}`"))
                    .with("queue", queue)
                    .with("role", "agent"))
            }
            other => Err(Problem::new(Kind::Forbidden, format!("role {} may not serve agent queues", other.as_str()))
                .with("queue", queue)
                .with("role", other.as_str())),
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = Problem;
    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Problem> {
        parts
            .extensions
            .get::<Caller>()
            .cloned()
            .ok_or_else(|| Problem::new(Kind::Internal, "route is not behind auth::guard"))
    }
}

/// What the guard checks requests with: the tokens, their rate limit, the failed
/// authentications per address, and the counters of what it refused.
#[derive(Debug)]
pub struct Gate {
    tokens: Arc<Tokens>,
    limiter: RateLimiter,
    failures: AuthFailures,
    refusals: Arc<Refusals>,
}

impl Gate {
    /// A gate of `tokens` with their rate limit and the per-address failure limit,
    /// counting its refusals in `refusals`.
    pub fn new(tokens: Arc<Tokens>, limiter: RateLimiter, failures: AuthFailures, refusals: Arc<Refusals>) -> Gate {
        Gate { tokens, limiter, failures, refusals }
    }

    /// Who calls a route of `access` with `headers` from `peer` (its address, if known):
    /// the caller, or the problem that refuses the request.
    pub fn admit(
        &self,
        headers: &axum::http::HeaderMap,
        peer: Option<IpAddr>,
        access: Access,
    ) -> Result<Caller, Problem> {
        let tokens = &self.tokens;
        if tokens.is_open() {
            return Ok(Caller::open());
        }
        let presented = tokens.presented(headers);
        if presented != Presented::None
            && let Err(seconds) = self.failures.check(peer)
        {
            self.refusals.count(Refusal::AuthThrottled);
            return Err(Problem::auth_throttled(self.failures.per_minute(), seconds));
        }
        if presented == Presented::Unknown {
            self.refusals.count(Refusal::UnknownToken);
            let left = self.failures.failed(peer);
            let peer = peer.map_or_else(|| "unknown".to_string(), |p| p.to_string());
            match left {
                Ok(()) => tracing::warn!(%peer, "authentication failed: unknown bearer token"),
                Err(seconds) => tracing::warn!(
                    %peer,
                    refused_for_s = seconds,
                    "authentication failed: unknown bearer token; the address is refused for a while"
                ),
            }
        }
        let caller = tokens.caller(presented, access)?;
        if access != Access::Public
            && let Some(token) = caller.token
            && let Err(seconds) = self.limiter.check(token)
        {
            self.refusals.count(Refusal::RateLimited);
            return Err(Problem::rate_limited(self.limiter.rate(), seconds));
        }
        Ok(caller)
    }
}

impl Gate {
    /// Charges `caller`'s token `extra` requests more than the one its request took: a
    /// request that carries many (a batch of reports) counts as many against the rate
    /// limit ([`RateLimiter::charge`]).
    pub fn charge(&self, caller: &Caller, extra: u64) {
        if let Some(token) = caller.token {
            self.limiter.charge(token, extra);
        }
    }
}

/// Puts every route of `router` behind the check for `access` ([`Gate::admit`]): 401/403
/// before the handler, then (unless the group is public) the token's rate limit, 429; and
/// the [`Caller`] in the request extensions for the handler. The routes' OpenAPI
/// operations say so (unless the group is public): the `bearer` scheme, from which
/// [`crate::contract::document`] adds the 401, 403 and 429 problems the check answers.
pub fn guard<S: Clone + Send + Sync + 'static>(
    router: OpenApiRouter<S>,
    gate: Arc<Gate>,
    access: Access,
) -> OpenApiRouter<S> {
    let mut router = router.route_layer(axum::middleware::from_fn_with_state((gate, access), check));
    if access != Access::Public {
        document(router.get_openapi_mut());
    }
    router
}

/// The credentials of an `Authorization: Bearer …` value, the scheme in any case (RFC
/// 9110: schemes are case-insensitive).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, rest) = value.split_at_checked(7)?;
    scheme.eq_ignore_ascii_case("bearer ").then_some(rest)
}

/// Adds to every operation of `openapi` the bearer requirement.
fn document(openapi: &mut utoipa::openapi::OpenApi) {
    for item in openapi.paths.paths.values_mut() {
        let operations = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.options,
            &mut item.head,
            &mut item.patch,
            &mut item.trace,
        ];
        for op in operations.into_iter().flatten() {
            op.security.get_or_insert_with(Vec::new).push(SecurityRequirement::new("bearer", Vec::<String>::new()));
        }
    }
}

async fn check(State((gate, access)): State<(Arc<Gate>, Access)>, mut req: Request, next: Next) -> Response {
    let peer = req.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip());
    match gate.admit(req.headers(), peer, access) {
        Ok(caller) => {
            req.extensions_mut().insert(caller);
            next.run(req).await
        }
        Err(p) => p.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bearer(t: &str) -> axum::http::HeaderMap {
        let mut h = axum::http::HeaderMap::new();
        h.insert(header::AUTHORIZATION, format!("Bearer {t}").parse().unwrap());
        h
    }

    #[test]
    fn token_file_and_env_spec_parse_alike() {
        let file = Tokens::from_toml(
            "[[token]]\ntoken = \"admin-token-0001\"\nrole = \"admin\"\n[[token]]\ntoken = \"agent-token-0001\"\nrole = \"agent\"\nqueues = [\"dns\", \"app\"]\n",
        )
        .unwrap();
        let env = Tokens::from_spec("admin=admin-token-0001; agent:dns,app=agent-token-0001").unwrap();
        for t in [file, env] {
            assert_eq!(t.len(), 2);
            let agent = t.authenticate(&bearer("agent-token-0001"), Access::Agent).unwrap();
            assert!(agent.authorize_queue("dns").is_ok());
            assert_eq!(agent.authorize_queue("db").unwrap_err().kind(), Kind::Forbidden);
            assert_eq!(t.authenticate(&bearer("agent-token-0001"), Access::Read).unwrap_err().kind(), Kind::Forbidden);
            assert_eq!(t.authenticate(&bearer("admin-token-0001"), Access::Write).unwrap().role(), Role::Admin);
            assert_eq!(
                t.authenticate(&bearer("nope-token-000001"), Access::Read).unwrap_err().kind(),
                Kind::Unauthorized
            );
            assert_eq!(t.authenticate(&Default::default(), Access::Read).unwrap_err().kind(), Kind::Unauthorized);
            assert!(t.authenticate(&Default::default(), Access::Public).is_ok());
        }
    }

    #[test]
    fn the_bearer_scheme_is_read_in_any_case() {
        let t = Tokens::from_spec("admin=admin-token-0001").unwrap();
        for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
            let mut h = axum::http::HeaderMap::new();
            h.insert(header::AUTHORIZATION, format!("{scheme} admin-token-0001").parse().unwrap());
            assert!(t.authenticate(&h, Access::Write).is_ok(), "{scheme}");
        }
        let mut basic = axum::http::HeaderMap::new();
        basic.insert(header::AUTHORIZATION, "Basic admin-token-0001".parse().unwrap());
        assert_eq!(t.authenticate(&basic, Access::Write).unwrap_err().kind(), Kind::Unauthorized);
    }

    #[test]
    fn bad_token_configurations_are_refused() {
        assert!(Tokens::from_spec("agent=xxxxxxxxxxxxxxxx").unwrap_err().0.contains("queues"));
        assert!(Tokens::from_spec("reader:dns=xxxxxxxxxxxxxxxx").unwrap_err().0.contains("only agent"));
        assert!(Tokens::from_spec("boss=xxxxxxxxxxxxxxxx").unwrap_err().0.contains("unknown role"));
        assert!(Tokens::from_spec("admin").unwrap_err().0.contains("ROLE=TOKEN"));
        assert!(Tokens::from_spec("admin=xxxxxxxxxxxxxxxx;reader=xxxxxxxxxxxxxxxx").unwrap_err().0.contains("twice"));
        assert!(Tokens::from_toml("[[token]]\ntoken = \"\"\nrole = \"admin\"\n").is_err());
        assert!(Tokens::from_toml("[[token]]\ntoken = \"xxxxxxxxxxxxxxxx\"\nrole = \"admin\"\nextra = 1\n").is_err());
        assert!(Tokens::from_spec("").unwrap().is_open());
        // Too short to be a secret: 15 characters are refused, 16 accepted.
        let short = Tokens::from_spec("admin=only-15-charact").unwrap_err().0;
        assert!(short.contains("at least 16 characters, not 15"), "{short}");
        assert!(short.starts_with("SETTLE_TOKENS entry 1: "), "{short}");
        assert!(Tokens::from_spec("admin=exactly-16-chars").is_ok());
        let short = Tokens::from_toml("[[token]]\ntoken = \"s3cret\"\nrole = \"admin\"\n").unwrap_err().0;
        assert!(short.contains("token #1: a token must be at least 16 characters, not 6"), "{short}");
    }

    #[test]
    fn the_servers_of_a_queue_are_its_agents_and_the_admins() {
        let t = Tokens::from_spec(
            "agent:dns=dns-agent-token-1;admin=admin-token-0001;agent:dns,app=both-agent-token;reader=reader-token-0001",
        )
        .unwrap();
        assert_eq!(t.servers_of("dns"), [0, 1, 2]);
        assert_eq!(t.servers_of("app"), [1, 2]);
        assert_eq!(t.servers_of("db"), [1]);
    }

    fn gate_of(spec: &str, per_minute: u32) -> (Gate, Arc<Refusals>, settle_store::ManualClock) {
        let clock = settle_store::ManualClock::new(1_000_000);
        let shared: settle_store::SharedClock = Arc::new(clock.clone());
        let tokens = Arc::new(Tokens::from_spec(spec).unwrap());
        let refusals = Arc::new(Refusals::default());
        let limiter = RateLimiter::new(0, tokens.len(), shared.clone());
        let gate = Gate::new(tokens, limiter, AuthFailures::new(per_minute, shared), refusals.clone());
        (gate, refusals, clock)
    }

    #[test]
    fn an_address_guessing_tokens_is_refused_before_its_token_is_looked_at() {
        let (gate, refusals, clock) = gate_of("admin=admin-token-0001", 2);
        let (guesser, other): (IpAddr, IpAddr) = ("10.0.0.9".parse().unwrap(), "10.0.0.10".parse().unwrap());
        let kind =
            |h: &axum::http::HeaderMap, peer: IpAddr, access| gate.admit(h, Some(peer), access).map_err(|p| p.kind());
        let (wrong, right) = (bearer("wrong-token-00001"), bearer("admin-token-0001"));
        assert_eq!(kind(&wrong, guesser, Access::Read).unwrap_err(), Kind::Unauthorized);
        // A public route counts a wrong token too (`/v1/session` answers whether it is valid).
        assert!(kind(&wrong, guesser, Access::Public).is_ok());
        // Out of failures: even the right token is refused, so a right guess tells nothing.
        assert_eq!(kind(&right, guesser, Access::Read).unwrap_err(), Kind::AuthThrottled);
        assert_eq!(kind(&wrong, guesser, Access::Public).unwrap_err(), Kind::AuthThrottled);
        let p = gate.admit(&right, Some(guesser), Access::Read).unwrap_err();
        assert_eq!(p.body().context["retry_after"], 30, "{p}");
        // A request without a token is not a guess; another address is not affected.
        assert!(kind(&Default::default(), guesser, Access::Public).is_ok());
        assert!(kind(&right, other, Access::Read).is_ok());
        assert_eq!(refusals.get(Refusal::UnknownToken), 2);
        assert_eq!(refusals.get(Refusal::AuthThrottled), 3);
        // Half a minute later (2 a minute) one failure is back.
        clock.advance(std::time::Duration::from_secs(30));
        assert!(kind(&right, guesser, Access::Read).is_ok());
        // An open server counts nothing.
        let (open, _, _) = gate_of("", 1);
        assert!((0..5).all(|_| open.admit(&wrong, Some(guesser), Access::Write).is_ok()));
    }

    #[test]
    fn tokens_are_found_by_digest_among_all() {
        let t = Tokens::from_spec(
            "admin=alpha-token-0001;operator=beta-token-00001;reader=gamma-token-0001;agent:q=delta-token-0001",
        )
        .unwrap();
        for (i, secret) in
            ["alpha-token-0001", "beta-token-00001", "gamma-token-0001", "delta-token-0001"].into_iter().enumerate()
        {
            assert_eq!(t.find(&digest(secret)), Some(i), "{secret}");
        }
        for wrong in ["", "alpha-token-000", "alpha-token-00011", "Alpha-token-0001", "delta-token-000\u{0}", "zeta"] {
            assert_eq!(t.find(&digest(wrong)), None, "{wrong:?}");
        }
        assert_eq!(Tokens::open().find(&digest("alpha-token-0001")), None);
        assert_eq!(digest("alpha"), digest("alpha"));
        assert_ne!(digest("alpha"), digest("alphb"));
        // The secret itself is not kept, nor shown.
        let shown = format!("{t:?}");
        assert!(!shown.contains("alpha-token") && !shown.contains("delta-token"), "{shown}");
    }

    #[test]
    fn roles_allow_their_groups_only() {
        use Access::*;
        let table = [
            (Role::Admin, [true, true, true, true]),
            (Role::Operator, [true, true, true, false]),
            (Role::Reader, [true, true, false, false]),
            (Role::Agent, [true, false, false, true]),
        ];
        for (role, expected) in table {
            for (access, ok) in [Public, Read, Write, Agent].into_iter().zip(expected) {
                assert_eq!(role.allows(access), ok, "{role:?} {access:?}");
            }
        }
    }
}
