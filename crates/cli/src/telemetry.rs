//! Logs and traces: the `tracing` subscriber of the binary.
//!
//! - Logs go to stderr, filtered by `SETTLE_LOG` (`tracing` syntax, default `warn`).
//! - With the `otlp` feature, the spans (`http.request` from the server, `store.commit`
//!   around each batch's transaction, the engine's `operation` and handler spans) are
//!   exported with OTLP over HTTP (protobuf) when `OTEL_EXPORTER_OTLP_ENDPOINT` (then
//!   `/v1/traces` is appended) or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (used as is) is set.
//!   `OTEL_SERVICE_NAME` names the service (default `settle`); `SETTLE_OTLP_FILTER` selects
//!   the spans exported (`tracing` syntax, default `info`). The exporter reads the other
//!   standard variables itself (`OTEL_EXPORTER_OTLP_HEADERS`, `…_TIMEOUT`,
//!   `OTEL_BSP_SCHEDULE_DELAY`, `OTEL_RESOURCE_ATTRIBUTES`, …); `OTEL_SDK_DISABLED=true`
//!   or `OTEL_TRACES_EXPORTER=none` turns export off.
//! - Without the feature, an OTLP endpoint in the environment gets one warning: this build
//!   does not export.

use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Flushes and shuts the exporter down when dropped (keep it until `main` returns).
pub struct Guard {
    #[cfg(feature = "otlp")]
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

#[cfg(feature = "otlp")]
impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(e) = provider.shutdown()
        {
            eprintln!("warning: OpenTelemetry export: {e}");
        }
    }
}

/// Installs the global subscriber: logs on stderr (as `SETTLE_LOG` says, else at
/// `default`) and, when configured, OTLP export.
pub fn init(default: &str) -> Guard {
    let config = Config::from_env(|name: &str| std::env::var(name).ok());
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(EnvFilter::try_from_env("SETTLE_LOG").unwrap_or_else(|_| EnvFilter::new(default)));
    let registry = tracing_subscriber::registry().with(logs);
    #[cfg(feature = "otlp")]
    {
        let (layer, provider) = match config.export.then(|| otlp::layer(&config)) {
            Some(Ok((layer, provider))) => (Some(layer), Some(provider)),
            Some(Err(e)) => {
                eprintln!("warning: no OpenTelemetry export: {e}");
                (None, None)
            }
            None => (None, None),
        };
        registry.with(layer).init();
        Guard { provider }
    }
    #[cfg(not(feature = "otlp"))]
    {
        registry.init();
        if config.export {
            eprintln!(
                "warning: {} is set, but this build of settle has no OTLP export (build it with `--features otlp`)",
                config.endpoint_var
            );
        }
        Guard {}
    }
}

/// The spans exported unless `SETTLE_OTLP_FILTER` says otherwise.
#[cfg_attr(not(feature = "otlp"), allow(dead_code))]
const DEFAULT_FILTER: &str = "info";

/// The exporter's own crates are never exported (their spans and logs would be exported
/// while exporting). Targets match by prefix: `opentelemetry` covers `opentelemetry_sdk`
/// and `opentelemetry-otlp`, `hyper` covers `hyper_util`.
#[cfg_attr(not(feature = "otlp"), allow(dead_code))]
const QUIET: &str = "opentelemetry=off,reqwest=off,hyper=off,h2=off";

/// What the environment asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(not(feature = "otlp"), allow(dead_code))]
struct Config {
    /// Export spans: an OTLP endpoint is set, and export is not turned off.
    export: bool,
    /// The variable that set the endpoint (for messages).
    endpoint_var: &'static str,
    /// The `service.name` to give, when the environment names none.
    service_name: Option<String>,
    /// The filter of the exported spans (`SETTLE_OTLP_FILTER`; [`QUIET`] is added).
    filter: String,
}

impl Config {
    /// The configuration `var` (an environment lookup) gives.
    fn from_env(var: impl Fn(&str) -> Option<String>) -> Config {
        let set = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        let endpoint_var = ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"]
            .into_iter()
            .find(|name| set(name).is_some())
            .unwrap_or("OTEL_EXPORTER_OTLP_ENDPOINT");
        let disabled = set("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
            || set("OTEL_TRACES_EXPORTER").is_some_and(|v| v.trim().eq_ignore_ascii_case("none"));
        let export = set(endpoint_var).is_some() && !disabled;
        let named = set("OTEL_SERVICE_NAME").is_some()
            || set("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|attrs| {
                attrs.split(',').any(|kv| kv.split('=').next().map(str::trim) == Some("service.name"))
            });
        let service_name = (!named).then(|| "settle".to_string());
        let filter = set("SETTLE_OTLP_FILTER").unwrap_or_else(|| DEFAULT_FILTER.to_string());
        Config { export, endpoint_var, service_name, filter }
    }
}

#[cfg(feature = "otlp")]
mod otlp {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::SpanExporter;
    use opentelemetry_sdk::Resource;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing_subscriber::Layer;
    use tracing_subscriber::filter::EnvFilter;
    use tracing_subscriber::registry::LookupSpan;

    use super::Config;

    /// The export layer (with its filter) and the provider whose shutdown flushes it.
    pub(super) fn layer<S>(config: &Config) -> anyhow::Result<(Box<dyn Layer<S> + Send + Sync>, SdkTracerProvider)>
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
    {
        let filter = EnvFilter::try_new(format!("{},{}", config.filter, super::QUIET))
            .map_err(|e| anyhow::anyhow!("SETTLE_OTLP_FILTER `{}`: {e}", config.filter))?;
        // HTTP with protobuf; the endpoint, headers, timeout and compression come from the
        // standard variables.
        let exporter = SpanExporter::builder().with_http().build()?;
        let mut resource = Resource::builder();
        if let Some(name) = &config.service_name {
            resource = resource.with_service_name(name.clone());
        }
        // Batched on a thread of its own (OTEL_BSP_* variables), so exporting never blocks
        // the runtime.
        let provider =
            SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource.build()).build();
        let tracer = provider.tracer("settle");
        let layer = tracing_opentelemetry::layer().with_tracer(tracer).with_filter(filter).boxed();
        Ok((layer, provider))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(vars: &[(&str, &str)]) -> Config {
        let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Config::from_env(move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
    }

    #[test]
    fn export_needs_an_endpoint() {
        let c = config(&[]);
        assert!(!c.export);
        assert_eq!(c.service_name.as_deref(), Some("settle"));
        assert_eq!(c.filter, "info");
        assert!(!config(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")]).export);
        let c = config(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")]);
        assert!(c.export);
        assert_eq!(c.endpoint_var, "OTEL_EXPORTER_OTLP_ENDPOINT");
        let c = config(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://collector:4318/v1/traces")]);
        assert!(c.export);
        assert_eq!(c.endpoint_var, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    }

    #[test]
    fn export_can_be_turned_off() {
        let on = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318");
        assert!(!config(&[on, ("OTEL_SDK_DISABLED", "TRUE")]).export);
        assert!(!config(&[on, ("OTEL_TRACES_EXPORTER", "none")]).export);
        assert!(config(&[on, ("OTEL_SDK_DISABLED", "false")]).export);
        assert!(config(&[on, ("OTEL_TRACES_EXPORTER", "otlp")]).export);
    }

    #[test]
    fn the_service_is_settle_unless_named() {
        assert_eq!(config(&[("OTEL_SERVICE_NAME", "billing")]).service_name, None);
        assert_eq!(config(&[("OTEL_SERVICE_NAME", "")]).service_name.as_deref(), Some("settle"));
        assert_eq!(
            config(&[("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod, service.name=b")]).service_name,
            None
        );
        assert_eq!(
            config(&[("OTEL_RESOURCE_ATTRIBUTES", "service.namespace=x")]).service_name.as_deref(),
            Some("settle")
        );
    }

    #[test]
    fn the_exported_spans_can_be_chosen() {
        let c = config(&[("SETTLE_OTLP_FILTER", "settle_store=debug")]);
        assert_eq!(c.filter, "settle_store=debug");
        assert!(EnvFilter::try_new(format!("{},{QUIET}", c.filter)).is_ok());
    }
}
