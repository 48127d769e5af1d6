//! [`AppState`]: what every handler shares — the engine, the machines it serves, the tokens
//! and the limits ([`Config`]).

use std::sync::Arc;
use std::time::Duration;

use settle_core::Machine;
use settle_engine::Engine;
use settle_store::AnyStore;

use crate::auth::{Gate, Tokens};
use crate::browser::Policy;
use crate::metrics::Refusals;
use crate::polls::Polls;
use crate::problem::Problem;
use crate::ratelimit::{AUTH_FAILURES_PER_MINUTE, AuthFailures, RateLimiter};

/// Limits of the HTTP API.
#[derive(Debug, Clone)]
pub struct Config {
    /// Largest accepted request body, in bytes (default 1 MiB); larger is 413.
    pub max_body: usize,
    /// Longest `wait=stable` a request may ask for (longer timeouts are capped).
    pub max_wait: Duration,
    /// The wait when `wait=stable` comes without `timeout`.
    pub default_wait: Duration,
    /// Requests per second each token may make, with bursts of as many; more are answered
    /// 429 `rate-limited`. 0 is no limit; an open server (no tokens) is not limited.
    /// Default 200.
    pub rate_limit: u32,
    /// Unknown bearer tokens a client address may present per minute (in a burst, then as
    /// many a minute); beyond, its requests with a token are answered 429 `auth-throttled`.
    /// 0 is no limit. Default [`AUTH_FAILURES_PER_MINUTE`].
    pub auth_failures: u32,
    /// Most agents' long polls waiting at once, split among the queues and their tokens
    /// ([`crate::polls`]). Default [`crate::polls::MAX_POLLS`].
    pub max_polls: usize,
    /// The `Host` and `Origin` values answered ([`crate::browser`]). Default: loopback only.
    pub browser: Policy,
    /// Most change-feed streams open at once ([`crate::streams`]). Default
    /// [`crate::streams::MAX_STREAMS`].
    pub max_streams: usize,
    /// Most change-feed streams one token may hold open. Default
    /// [`crate::streams::PER_TOKEN`].
    pub streams_per_token: usize,
    /// How long a change-feed stream stays open before the server ends it (the client
    /// reconnects from its last id). Default [`crate::streams::LIFETIME`].
    pub stream_lifetime: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_body: 1 << 20,
            max_wait: Duration::from_secs(60),
            default_wait: Duration::from_secs(30),
            rate_limit: 200,
            auth_failures: AUTH_FAILURES_PER_MINUTE,
            max_polls: crate::polls::MAX_POLLS,
            browser: Policy::new(),
            max_streams: crate::streams::MAX_STREAMS,
            streams_per_token: crate::streams::PER_TOKEN,
            stream_lifetime: crate::streams::LIFETIME,
        }
    }
}

/// Renders the engine's live metrics in the Prometheus text format (see
/// `settle_engine::metrics::install_prometheus`).
pub type MetricsRender = Arc<dyn Fn() -> String + Send + Sync>;

/// Shared by all handlers; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

#[derive(Clone)]
struct Inner {
    engine: Engine<AnyStore>,
    /// The machines served: those named at the start, and those a deploy adds later.
    served: Vec<String>,
    /// The machines the engine knew at the start (the others came by deploy).
    known: Vec<String>,
    tokens: Arc<Tokens>,
    gate: Arc<Gate>,
    polls: Arc<Polls>,
    streams: Arc<crate::streams::Streams>,
    refusals: Arc<Refusals>,
    config: Config,
    engine_metrics: Option<MetricsRender>,
}

impl AppState {
    /// Serves the machines named in `machines` (each registered with `engine`; unknown names
    /// are an error) with `tokens` and `config`.
    pub fn new(
        engine: Engine<AnyStore>,
        machines: &[&str],
        tokens: Tokens,
        config: Config,
    ) -> Result<AppState, settle_engine::Error> {
        let mut served = Vec::new();
        for name in machines {
            served.push(engine.machine(name)?.name().to_string());
        }
        served.sort();
        served.dedup();
        let known = engine.machines().iter().map(|m| m.name().to_string()).collect();
        let clock = engine.clock().clone();
        let tokens = Arc::new(tokens);
        let refusals = Arc::new(Refusals::default());
        let gate = Gate::new(
            tokens.clone(),
            RateLimiter::new(config.rate_limit, tokens.len(), clock.clone()),
            AuthFailures::new(config.auth_failures, clock),
            refusals.clone(),
        );
        let polls = Polls::new(config.max_polls, &engine.agent_queues(), &tokens);
        Ok(AppState {
            inner: Arc::new(Inner {
                engine,
                served,
                known,
                tokens,
                gate: Arc::new(gate),
                polls: Arc::new(polls),
                streams: Arc::new(crate::streams::Streams::new(config.max_streams, config.streams_per_token)),
                refusals,
                config,
                engine_metrics: None,
            }),
        })
    }

    /// Adds the engine's live metrics to `/metrics`.
    pub fn with_engine_metrics(mut self, render: MetricsRender) -> AppState {
        Arc::make_mut(&mut self.inner).engine_metrics = Some(render);
        self
    }

    /// The engine.
    pub fn engine(&self) -> &Engine<AnyStore> {
        &self.inner.engine
    }
    /// The served machines' current versions, by name: those named at the start and those
    /// deployed since that the engine did not know then.
    pub fn machines(&self) -> Vec<Arc<Machine>> {
        self.inner.engine.machines().into_iter().filter(|m| self.serves(m.name())).collect()
    }
    /// Whether `machine` is served, if the engine knows it.
    fn serves(&self, machine: &str) -> bool {
        let i = &self.inner;
        i.served.iter().any(|s| s == machine) || !i.known.iter().any(|s| s == machine)
    }
    /// The entity as the API shows it, with its state's health when its machine is served.
    pub fn entity(&self, row: &settle_store::EntityRow) -> settle_api::Entity {
        let mut e = settle_api::Entity::from(row);
        e.health = self
            .serves(&row.machine)
            .then(|| self.inner.engine.version_of(row).ok())
            .flatten()
            .map(|(_, m)| m)
            .filter(|m| m.state(&row.state).is_some())
            .map(|m| m.health_of(&row.state).as_str().to_string());
        e
    }
    /// The served machine `name`, or 404 `unknown-machine`.
    pub fn machine(&self, name: &str) -> Result<Arc<Machine>, Problem> {
        let found = self.serves(name).then(|| self.inner.engine.machine(name).ok()).flatten();
        found.ok_or_else(|| Problem::unknown_machine(name))
    }
    /// The version `row` runs under (see [`Engine::version_of`]), when its machine is served.
    pub fn version_of(&self, row: &settle_store::EntityRow) -> Result<Arc<Machine>, Problem> {
        self.machine(&row.machine)?;
        Ok(self.inner.engine.version_of(row)?.1)
    }
    /// The tokens.
    pub fn tokens(&self) -> Arc<Tokens> {
        self.inner.tokens.clone()
    }
    /// The guard of every route: tokens, their rate limit (`Config::rate_limit`) and the
    /// failed authentications per address (`Config::auth_failures`), on the engine's clock.
    pub fn gate(&self) -> Arc<Gate> {
        self.inner.gate.clone()
    }
    /// The change feed's stream permits (`Config::max_streams`, `streams_per_token`).
    pub fn streams(&self) -> &crate::streams::Streams {
        &self.inner.streams
    }

    /// The agents' long-poll permits (`Config::max_polls`).
    pub fn polls(&self) -> &Polls {
        &self.inner.polls
    }
    /// The counters of requests refused before their handler.
    pub fn refusals(&self) -> Arc<Refusals> {
        self.inner.refusals.clone()
    }
    /// The limits.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }
    /// The engine's live metrics, if a renderer was given.
    pub fn engine_metrics(&self) -> Option<String> {
        self.inner.engine_metrics.as_ref().map(|f| f())
    }
}
