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
//! 429 `rate-limited` with `Retry-After`. A request refused 401/403 is not counted, and an
//! open server is not limited.

use std::sync::Arc;

use axum::extract::{FromRequestParts, Request, State};
use axum::http::header;
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::{ConditionallySelectable, ConstantTimeEq};
use utoipa::openapi::security::SecurityRequirement;
use utoipa_axum::router::OpenApiRouter;

use crate::problem::{Kind, Problem};
use crate::ratelimit::RateLimiter;

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
    /// token = "s3cret-admin"
    /// role = "admin"            # admin | operator | reader | agent
    ///
    /// [[token]]
    /// token = "s3cret-dns-agent"
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
    /// `admin=s3cret;reader=r3ad;agent:dns,app=ag3nt`.
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

    /// Who is calling, from the request's `Authorization` header, for a route of `access`.
    pub fn authenticate(&self, headers: &axum::http::HeaderMap, access: Access) -> Result<Caller, Problem> {
        self.identify(headers, access).map(|(caller, _)| caller)
    }

    /// [`Tokens::authenticate`], with the position of the caller's token (none for an
    /// anonymous caller).
    fn identify(&self, headers: &axum::http::HeaderMap, access: Access) -> Result<(Caller, Option<usize>), Problem> {
        if self.is_open() {
            return Ok((Caller { role: Role::Admin, queues: Vec::new(), name: None }, None));
        }
        let presented = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
            .map(str::trim);
        let index = match presented {
            Some(p) => self.find(&digest(p)),
            None if access == Access::Public => {
                return Ok((Caller { role: Role::Reader, queues: Vec::new(), name: None }, None));
            }
            None => {
                return Err(Problem::new(Kind::Unauthorized, "this route needs `Authorization: Bearer <token>`"));
            }
        };
        let Some((index, token)) = index.map(|i| (i, &self.tokens[i])) else {
            if access == Access::Public {
                return Ok((Caller { role: Role::Reader, queues: Vec::new(), name: None }, None));
            }
            return Err(Problem::new(Kind::Unauthorized, "unknown bearer token"));
        };
        let caller = Caller { role: token.role, queues: token.queues.clone(), name: token.name.clone() };
        if !token.role.allows(access) {
            return Err(Problem::new(Kind::Forbidden, format!("role {} may not use this route", token.role.as_str()))
                .with("role", token.role.as_str()));
        }
        Ok((caller, Some(index)))
    }
}

/// The authenticated caller of a request (an extractor on guarded routes).
#[derive(Debug, Clone)]
pub struct Caller {
    role: Role,
    queues: Vec<String>,
    name: Option<String>,
}

impl Caller {
    /// The caller's role.
    pub fn role(&self) -> Role {
        self.role
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

/// Puts every route of `router` behind the check for `access`: 401/403 before the handler,
/// then (unless the group is public) the token's rate limit, 429; and the [`Caller`] in
/// the request extensions for the handler. The routes' OpenAPI operations say so (unless
/// the group is public): the `bearer` scheme, from which [`crate::contract::document`]
/// adds the 401, 403 and 429 problems the check answers.
pub fn guard<S: Clone + Send + Sync + 'static>(
    router: OpenApiRouter<S>,
    tokens: Arc<Tokens>,
    limiter: Arc<RateLimiter>,
    access: Access,
) -> OpenApiRouter<S> {
    let mut router = router.route_layer(axum::middleware::from_fn_with_state((tokens, limiter, access), check));
    if access != Access::Public {
        document(router.get_openapi_mut());
    }
    router
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

type Check = (Arc<Tokens>, Arc<RateLimiter>, Access);

async fn check(State((tokens, limiter, access)): State<Check>, mut req: Request, next: Next) -> Response {
    let (caller, index) = match tokens.identify(req.headers(), access) {
        Ok(found) => found,
        Err(p) => return p.into_response(),
    };
    if access != Access::Public
        && let Some(token) = index
        && let Err(seconds) = limiter.check(token)
    {
        return Problem::rate_limited(limiter.rate(), seconds).into_response();
    }
    req.extensions_mut().insert(caller);
    next.run(req).await
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
            "[[token]]\ntoken = \"a1\"\nrole = \"admin\"\n[[token]]\ntoken = \"g1\"\nrole = \"agent\"\nqueues = [\"dns\", \"app\"]\n",
        )
        .unwrap();
        let env = Tokens::from_spec("admin=a1; agent:dns,app=g1").unwrap();
        for t in [file, env] {
            assert_eq!(t.len(), 2);
            let agent = t.authenticate(&bearer("g1"), Access::Agent).unwrap();
            assert!(agent.authorize_queue("dns").is_ok());
            assert_eq!(agent.authorize_queue("db").unwrap_err().kind(), Kind::Forbidden);
            assert_eq!(t.authenticate(&bearer("g1"), Access::Read).unwrap_err().kind(), Kind::Forbidden);
            assert_eq!(t.authenticate(&bearer("a1"), Access::Write).unwrap().role(), Role::Admin);
            assert_eq!(t.authenticate(&bearer("nope"), Access::Read).unwrap_err().kind(), Kind::Unauthorized);
            assert_eq!(t.authenticate(&Default::default(), Access::Read).unwrap_err().kind(), Kind::Unauthorized);
            assert!(t.authenticate(&Default::default(), Access::Public).is_ok());
        }
    }

    #[test]
    fn bad_token_configurations_are_refused() {
        assert!(Tokens::from_spec("agent=x").unwrap_err().0.contains("queues"));
        assert!(Tokens::from_spec("reader:dns=x").unwrap_err().0.contains("only agent"));
        assert!(Tokens::from_spec("boss=x").unwrap_err().0.contains("unknown role"));
        assert!(Tokens::from_spec("admin").unwrap_err().0.contains("ROLE=TOKEN"));
        assert!(Tokens::from_spec("admin=x;reader=x").unwrap_err().0.contains("twice"));
        assert!(Tokens::from_toml("[[token]]\ntoken = \"\"\nrole = \"admin\"\n").is_err());
        assert!(Tokens::from_toml("[[token]]\ntoken = \"x\"\nrole = \"admin\"\nextra = 1\n").is_err());
        assert!(Tokens::from_spec("").unwrap().is_open());
    }

    #[test]
    fn tokens_are_found_by_digest_among_all() {
        let t = Tokens::from_spec("admin=alpha;operator=beta;reader=gamma;agent:q=delta").unwrap();
        for (i, secret) in ["alpha", "beta", "gamma", "delta"].into_iter().enumerate() {
            assert_eq!(t.find(&digest(secret)), Some(i), "{secret}");
        }
        for wrong in ["", "alph", "alphaa", "Alpha", "delt\u{0}", "zeta"] {
            assert_eq!(t.find(&digest(wrong)), None, "{wrong:?}");
        }
        assert_eq!(Tokens::open().find(&digest("alpha")), None);
        assert_eq!(digest("alpha"), digest("alpha"));
        assert_ne!(digest("alpha"), digest("alphb"));
        // The secret itself is not kept, nor shown.
        let shown = format!("{t:?}");
        assert!(!shown.contains("alpha") && !shown.contains("delta"), "{shown}");
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
