//! `settle serve`: the HTTP/JSON management API (settle-server) over an engine on `--db`.
//! Wiring only: reads the machine files, the token file and `SETTLE_TOKENS`, checks the
//! listen address, starts the engine and the server, and stops both on Ctrl-C/SIGTERM.

use std::io::Write as _;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};

use crate::defs::Machines;
use std::process::ExitCode;
use std::sync::Arc;

use settle_engine::{Config, Engine};
use settle_server::auth::Tokens;
use settle_store::AnyStore;

/// Arguments of `settle serve`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Address to listen on (`127.0.0.1:0` picks a free port). Without tokens only a
    /// loopback address is accepted; with tokens, a non-loopback address needs TLS
    /// (`--tls-cert`/`--tls-key`) or `--insecure-http`.
    #[arg(long, default_value = "127.0.0.1:7400")]
    listen: String,
    /// Bearer tokens (TOML: `[[token]] token = "...", role = "admin|operator|reader|agent",
    /// queues = [...]` for agents). Also read: `SETTLE_TOKENS` (`ROLE=TOKEN;agent:Q1,Q2=TOKEN`).
    #[arg(long, value_name = "FILE")]
    tokens: Option<PathBuf>,
    /// Largest request body in bytes; larger bodies are refused with 413.
    #[arg(long, default_value_t = 1 << 20)]
    max_body: usize,
    /// Longest `wait=stable` a request, or an agent's long poll, may ask for (longer ones
    /// are capped).
    #[arg(long, default_value = "60s")]
    max_wait: String,
    /// Requests per second each token may make, in bursts of as many; more are answered 429
    /// `rate-limited` with `Retry-After`. `/healthz` and `/v1/session` are not limited, nor
    /// is a server without tokens. 0: no limit.
    #[arg(long, default_value_t = 200, value_name = "N")]
    rate_limit: u32,
    /// Unknown bearer tokens one client address may present per minute (in a burst of as
    /// many); beyond, its requests with a token are answered 429 `auth-throttled` until
    /// `Retry-After`. 0: no limit (behind a proxy every client shares its address).
    #[arg(long, default_value_t = settle_server::ratelimit::AUTH_FAILURES_PER_MINUTE, value_name = "N")]
    auth_failures: u32,
    /// Serve HTTPS with this certificate chain (PEM, leaf first); needs `--tls-key`.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of `--tls-cert` (PEM: PKCS#8, RSA or EC).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Also answer requests whose `Host` is this name (beyond `localhost`, loopback
    /// addresses and the address listened on): the name clients and a proxy in front use.
    /// Repeatable. `*` answers any host (with tokens only: without them, a web page could
    /// reach this server by DNS rebinding).
    #[arg(long = "allowed-host", value_name = "HOST")]
    allowed_hosts: Vec<String>,
    /// Also accept requests from web pages of this origin (`https://ops.example.com`),
    /// beside the server's own: the public URL of a TLS-terminating proxy in front, say.
    /// Repeatable. `*` accepts any origin (with tokens only).
    #[arg(long = "allowed-origin", value_name = "ORIGIN")]
    allowed_origins: Vec<String>,
    /// Serve plain HTTP on a non-loopback address although tokens are configured: the
    /// bearer tokens cross the network in clear text (behind a TLS-terminating proxy, say).
    #[arg(long, conflicts_with = "tls_cert")]
    insecure_http: bool,
    /// Longest time a client may take to send a request head (and finish its TLS
    /// handshake); slower or idle connections are closed.
    #[arg(long, default_value = "10s")]
    header_timeout: String,
    /// Longest time a request may take until its response starts; slower ones get 503.
    /// Default: `--max-wait` plus 30 s, so long polls are never cut.
    #[arg(long)]
    request_timeout: Option<String>,
    /// Longest time (real time) evaluating a filter (`where=`, `error=`) over one page of
    /// entities may take; beyond, the request is answered 422 `filter-too-costly`.
    #[arg(long, default_value = "2s", value_name = "D")]
    filter_budget: String,
    /// Most change-feed streams (`GET /v1/feed`) open at once; beyond, 429
    /// `too-many-streams`.
    #[arg(long, default_value_t = settle_server::streams::MAX_STREAMS, value_name = "N")]
    max_streams: usize,
    /// Most change-feed streams one token may hold open.
    #[arg(long, default_value_t = settle_server::streams::PER_TOKEN, value_name = "N")]
    streams_per_token: usize,
    /// How long a change-feed stream stays open before the server ends it (the client
    /// reconnects after the last id it saw, missing nothing).
    #[arg(long, default_value = "10m", value_name = "D")]
    stream_lifetime: String,
    /// Serve the reference scenario (`server` and its resources) with the resources'
    /// provider calls made by external agents on queue `provider` (`settle agent`), as
    /// `settle demo --agents` does. The server's timeout comes from the latest demo run.
    #[arg(long)]
    scenario: bool,
    /// Stop when stdin closes (for a server started by `settle demo --agents`).
    #[arg(long, hide = true)]
    until_stdin_closes: bool,
}

/// Exit status of a configuration the server refuses to start with.
const REFUSED: u8 = 2;

/// Serves `db` with `machines`: those stored in it, a directory's (`--machines`), or the
/// built-in ones (`--builtin`).
pub fn run(db: &str, machines: Machines, args: Args) -> anyhow::Result<ExitCode> {
    if args.scenario && !matches!(machines.source, crate::defs::Source::Stored) {
        eprintln!("error: --scenario serves the built-in reference scenario; it does not take --machines or --builtin");
        return Ok(ExitCode::from(REFUSED));
    }
    let tokens = match load_tokens(args.tokens.as_deref()) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::from(REFUSED));
        }
    };
    let addrs: Vec<SocketAddr> = match args.listen.to_socket_addrs() {
        Ok(a) => a.collect(),
        Err(e) => {
            eprintln!("error: --listen {}: {e}", args.listen);
            return Ok(ExitCode::from(REFUSED));
        }
    };
    if tokens.is_open() && addrs.iter().any(|a| !a.ip().is_loopback()) {
        eprintln!(
            "error: refusing to listen on {} without tokens: anyone could change everything. \
             Configure tokens (--tokens FILE or SETTLE_TOKENS) or listen on a loopback address (127.0.0.1, ::1)",
            args.listen
        );
        return Ok(ExitCode::from(REFUSED));
    }
    let max_wait = match settle_core::duration::parse(&args.max_wait) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: --max-wait: {e}");
            return Ok(ExitCode::from(REFUSED));
        }
    };
    let listen = match listen_config(&args, max_wait) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::from(REFUSED));
        }
    };
    if !tokens.is_open() && listen.tls.is_none() && !args.insecure_http && addrs.iter().any(|a| !a.ip().is_loopback()) {
        eprintln!(
            "error: refusing to listen on {} over plain HTTP: the bearer tokens would cross the network in clear text. \
             Serve TLS (--tls-cert FILE --tls-key FILE), listen on a loopback address (127.0.0.1, ::1), \
             or accept the risk with --insecure-http (behind a TLS-terminating proxy, say)",
            args.listen
        );
        return Ok(ExitCode::from(REFUSED));
    }
    let browser = match browser_policy(&args, &addrs, tokens.is_open(), listen.tls.is_some()) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::from(REFUSED));
        }
    };
    let durations =
        (settle_core::duration::parse(&args.filter_budget), settle_core::duration::parse(&args.stream_lifetime));
    let (filter_budget, stream_lifetime) = match durations {
        (Ok(f), Ok(l)) if !f.is_zero() && !l.is_zero() => (f, l),
        (Err(e), _) => return refuse(&format!("--filter-budget: {e}")),
        (_, Err(e)) => return refuse(&format!("--stream-lifetime: {e}")),
        _ => return refuse("--filter-budget and --stream-lifetime must be longer than 0"),
    };
    if args.max_streams == 0 || args.streams_per_token == 0 {
        return refuse("--max-streams and --streams-per-token must be at least 1");
    }
    let config = settle_server::Config {
        max_body: args.max_body,
        max_wait,
        rate_limit: args.rate_limit,
        auth_failures: args.auth_failures,
        browser,
        max_streams: args.max_streams,
        streams_per_token: args.streams_per_token,
        stream_lifetime,
        ..Default::default()
    };
    let engine_config = Config { narrow_budget: filter_budget, ..Config::default() };
    let source = if args.scenario { Source::Scenario } else { Source::Machines(machines) };
    raise_open_files_limit();
    let run = Serve {
        source,
        tokens,
        config,
        engine: engine_config,
        addrs,
        listen,
        until_stdin_closes: args.until_stdin_closes,
    };
    crate::engines::runtime()?.block_on(serve(db, run))
}

/// Prints a refused configuration and gives the exit status that says so.
fn refuse(message: &str) -> anyhow::Result<ExitCode> {
    eprintln!("error: {message}");
    Ok(ExitCode::from(REFUSED))
}

/// Raises the soft limit of open files to the hard one: each connection (a feed stream, a
/// long poll) holds one, and the common soft limit of 1,024 is easily reached.
fn raise_open_files_limit() {
    #[cfg(unix)]
    #[allow(unsafe_code)]
    {
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit and setrlimit read and write the one struct passed, owned here.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max {
                limit.rlim_cur = limit.rlim_max;
                let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
            }
        }
    }
}

/// What `serve` starts.
struct Serve {
    source: Source,
    tokens: Tokens,
    config: settle_server::Config,
    engine: Config,
    addrs: Vec<SocketAddr>,
    listen: settle_server::Listen,
    until_stdin_closes: bool,
}

/// The listener's TLS and timeouts from the flags; errors name the flag or file.
fn listen_config(args: &Args, max_wait: std::time::Duration) -> anyhow::Result<settle_server::Listen> {
    let header_timeout =
        settle_core::duration::parse(&args.header_timeout).map_err(|e| anyhow::anyhow!("--header-timeout: {e}"))?;
    let request_timeout = match &args.request_timeout {
        Some(t) => settle_core::duration::parse(t).map_err(|e| anyhow::anyhow!("--request-timeout: {e}"))?,
        None => max_wait + std::time::Duration::from_secs(30),
    };
    for (flag, d) in [("--header-timeout", header_timeout), ("--request-timeout", request_timeout)] {
        anyhow::ensure!(!d.is_zero(), "{flag}: must be longer than 0");
    }
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            let read = |flag: &str, path: &Path| {
                std::fs::read(path).map_err(|e| anyhow::anyhow!("{flag} {}: cannot read: {e}", path.display()))
            };
            let (cert_pem, key_pem) = (read("--tls-cert", cert)?, read("--tls-key", key)?);
            let config = settle_server::TlsConfig::from_pem(&cert_pem, &key_pem).map_err(|e| match e {
                settle_server::TlsError::Cert(m) => anyhow::anyhow!("--tls-cert {}: {m}", cert.display()),
                settle_server::TlsError::Key(m) => anyhow::anyhow!("--tls-key {}: {m}", key.display()),
                settle_server::TlsError::Pair(m) => {
                    anyhow::anyhow!("--tls-cert {} with --tls-key {}: {m}", cert.display(), key.display())
                }
            })?;
            Some(config)
        }
        _ => None,
    };
    Ok(settle_server::Listen { tls, header_timeout, request_timeout })
}

/// The `Host` and `Origin` values the server answers: its own (loopback names, the
/// addresses in `addrs`) and those of `--allowed-host`/`--allowed-origin`; `*` only with
/// tokens.
fn browser_policy(
    args: &Args,
    addrs: &[SocketAddr],
    open: bool,
    tls: bool,
) -> anyhow::Result<settle_server::browser::Policy> {
    let mut policy = settle_server::browser::Policy::new().listening_on(addrs).tls(tls);
    for host in &args.allowed_hosts {
        policy = policy.allow_host(host).map_err(|e| anyhow::anyhow!("--allowed-host: {e}"))?;
    }
    for origin in &args.allowed_origins {
        policy = policy.allow_origin(origin).map_err(|e| anyhow::anyhow!("--allowed-origin: {e}"))?;
    }
    if open && policy.any_host() {
        anyhow::bail!(
            "--allowed-host '*' needs tokens: without them every caller is an admin, and any web page \
             could reach this server through a name rebound to its address. Name the hosts, or configure tokens"
        );
    }
    if open && policy.any_origin() {
        anyhow::bail!(
            "--allowed-origin '*' needs tokens: without them every caller is an admin, and any web page \
             could change everything. Name the origins, or configure tokens"
        );
    }
    Ok(policy)
}

/// Tokens from `--tokens FILE` and `SETTLE_TOKENS`, both if both are given.
fn load_tokens(file: Option<&Path>) -> anyhow::Result<Tokens> {
    let mut tokens = Tokens::open();
    if let Some(path) = file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("--tokens {}: cannot read: {e}", path.display()))?;
        tokens = Tokens::from_toml(&text).map_err(|e| anyhow::anyhow!("--tokens {}: {e}", path.display()))?;
    }
    if let Ok(spec) = std::env::var("SETTLE_TOKENS") {
        let from_env = Tokens::from_spec(&spec).map_err(|e| anyhow::anyhow!("{e}"))?;
        tokens.merge(from_env).map_err(|e| anyhow::anyhow!("SETTLE_TOKENS: {e}"))?;
    }
    Ok(tokens)
}

/// What the server runs.
enum Source {
    /// Those stored, a directory's, or the built-in ones.
    Machines(Machines),
    /// The reference scenario with agent-bound provider calls.
    Scenario,
}

async fn serve(db: &str, run: Serve) -> anyhow::Result<ExitCode> {
    let Serve { source, tokens, config, engine: engine_config, addrs, listen, until_stdin_closes } = run;
    let store = AnyStore::open(db)?;
    let started = match &source {
        Source::Machines(machines) => crate::engines::start_engine_with(store, machines, engine_config).await,
        Source::Scenario => {
            crate::defs::refuse_foreign(&store).await?;
            let timeout = crate::demo_run::stored_settings(&store).await?.unwrap_or_default().timeout_ms;
            let b = Engine::builder(store).config(lease_config(engine_config)).origin(crate::defs::ORIGIN);
            let b = settle_builtin::bind_server_via_agents(b, std::time::Duration::from_millis(timeout));
            crate::engines::start_built(b).await
        }
    };
    let engine = match started {
        Ok(engine) => engine,
        Err(e) => {
            eprintln!("error: {e:#}");
            return Ok(ExitCode::FAILURE);
        }
    };
    let names: Vec<String> = engine.machines().iter().map(|m| m.name().to_string()).collect();
    if names.is_empty() {
        eprintln!(
            "settle: no machine definitions are stored in {} yet: deploy some (`settle deploy FILE...`, \
             POST /v1/machines), or start with --machines DIR (or --builtin for the built-in ones)",
            engine.store().location()
        );
    }
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let open = tokens.is_open();
    let mut state = settle_server::AppState::new(engine.clone(), &refs, tokens, config)?;
    match settle_engine::metrics::install_prometheus() {
        Ok(handle) => state = state.with_engine_metrics(Arc::new(move || handle.render())),
        Err(e) => eprintln!("settle: engine metrics not exported: {e}"),
    }
    let listener = tokio::net::TcpListener::bind(&addrs[..]).await?;
    let local = listener.local_addr()?;
    eprintln!("settle: serving {} machine(s) on {}: {}", names.len(), engine.store().location(), names.join(", "));
    if open {
        eprintln!("settle: no tokens configured: every caller is an admin; serving loopback only");
    }
    let scheme = if listen.tls.is_some() { "https" } else { "http" };
    println!("listening on {scheme}://{local}");
    std::io::stdout().flush()?;
    let polls = engine.clone();
    let stop = async move {
        if until_stdin_closes {
            tokio::select! {
                _ = crate::engines::stdin_closed() => {}
                _ = crate::engines::shutdown_signal() => {}
            }
        } else {
            crate::engines::shutdown_signal().await
        }
        // Agents' long polls would hold the graceful shutdown for up to their wait, and
        // the change feed's streams for ever.
        polls.close_long_polls();
    };
    let served = settle_server::serve(listener, settle_server::router(state), stop, &listen).await;
    eprintln!("settle: stopping (finishing running actions)");
    engine.shutdown().await;
    served?;
    Ok(ExitCode::SUCCESS)
}

/// `config`, with `SETTLE_LEASE` honoured.
fn lease_config(mut config: Config) -> Config {
    if let Ok(lease) = std::env::var("SETTLE_LEASE")
        && let Ok(d) = settle_core::duration::parse(&lease)
    {
        config.lease = d;
    }
    config
}
