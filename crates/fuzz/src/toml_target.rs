//! The `machine_toml` target.

use std::sync::OnceLock;

use settle_core::graph::{self, Format};
use settle_core::{Machine, validate};

/// The example machines (`examples/machines/`), loaded once: a fuzzed machine is also
/// checked in a set with them, as `settle validate a.toml b.toml` and the server check the
/// machines they load together (subscriptions name other machines).
fn examples() -> &'static [Machine] {
    static EXAMPLES: OnceLock<Vec<Machine>> = OnceLock::new();
    EXAMPLES.get_or_init(|| {
        [
            ("cluster", include_str!("../../../examples/machines/cluster.toml")),
            ("logical_server", include_str!("../../../examples/machines/logical_server.toml")),
            ("replica", include_str!("../../../examples/machines/replica.toml")),
            ("server", include_str!("../../../examples/machines/server.toml")),
        ]
        .iter()
        .map(|(name, text)| {
            let (machine, _) = settle_core::toml::load(&format!("{name}.toml"), name, text)
                .unwrap_or_else(|r| panic!("example {name} does not load:\n{r}"));
            machine
        })
        .collect()
    })
}

/// Parses `data` (as UTF-8) as a machine definition and validates it as `settle validate`
/// does ([`settle_core::toml::load`], then [`validate::check_set`] across machines),
/// rendering every report as the CLI prints it. A machine that loads must also survive
/// what the server and CLI do with it: its canonical JSON and its TOML read back to the
/// same content hash, and its diagrams render.
pub fn machine_toml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // The parser alone (the definition as written, without validation).
    match settle_core::toml::parse("fuzz", text) {
        Ok(def) => drop(format!("{def:?}")),
        Err(report) => {
            assert!(report.has_errors(), "parse failed without an error: {report:?}");
            drop(report.to_string());
        }
    }
    let (machine, warnings) = match settle_core::toml::load("fuzz.toml", "fuzz", text) {
        Ok(loaded) => loaded,
        Err(report) => {
            assert!(report.has_errors(), "load failed without an error: {report:?}");
            drop(report.to_string());
            return;
        }
    };
    assert!(!warnings.has_errors(), "a machine loaded with errors: {warnings}");
    drop(warnings.to_string());
    drop(validate::check_set(&[&machine]).to_string());
    let mut set: Vec<&Machine> = examples().iter().filter(|m| m.name() != machine.name()).collect();
    set.push(&machine);
    drop(validate::check_set(&set).to_string());

    // What the store keeps, read back as `settle inspect` reads it.
    let hash = machine.content_hash();
    let json = machine.canonical_json();
    match Machine::from_canonical_json(&json) {
        Ok(back) => assert_eq!(back.content_hash(), hash, "canonical JSON read back differs:\n{json}"),
        Err(e) => panic!("canonical JSON does not read back: {e}\n{json}"),
    }
    // What `GET /v1/machines/{machine}/toml` serves: it loads back to the same definition.
    let toml = machine.to_toml();
    match settle_core::toml::load("rendered.toml", "rendered", &toml) {
        Ok((back, _)) => assert_eq!(back.content_hash(), hash, "TOML read back differs:\n{toml}"),
        Err(report) => panic!("rendered TOML does not load back:\n{report}\n{toml}"),
    }
    for format in [Format::Mermaid, Format::Dot, Format::Svg] {
        drop(graph::render(&machine, format));
    }
}
