//! `settle validate`: machine files loaded and checked, their diagnostics as text or JSON.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Why a definition file did not load.
pub(crate) enum LoadError {
    /// It could not be read.
    Unreadable(std::io::Error),
    /// It has errors (and perhaps warnings).
    Invalid(settle_core::Report),
}

/// Loads and validates one TOML definition.
pub(crate) fn load_definition(path: &Path) -> Result<(settle_core::Machine, settle_core::Report), LoadError> {
    let text = std::fs::read_to_string(path).map_err(LoadError::Unreadable)?;
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("machine");
    settle_core::toml::load(&path.display().to_string(), stem, &text).map_err(LoadError::Invalid)
}

/// Loads and validates one TOML definition; `Err` holds the printed report.
pub(crate) fn load_machine(path: &Path) -> Result<(settle_core::Machine, settle_core::Report), String> {
    load_definition(path).map_err(|e| match e {
        LoadError::Unreadable(e) => format!("{}: cannot read: {e}", path.display()),
        LoadError::Invalid(report) => report.to_string(),
    })
}

pub(crate) fn validate(files: &[PathBuf], as_json: bool) -> anyhow::Result<ExitCode> {
    let mut ok = true;
    let mut loaded = Vec::new();
    let mut results = Vec::new();
    for path in files {
        match load_definition(path) {
            Ok((m, report)) if as_json => {
                results.push(serde_json::json!({
                    "file": path.display().to_string(),
                    "ok": true,
                    "machine": m.name().as_str(),
                    "states": m.states().len(),
                    "events": m.events().len(),
                    "actions": m.actions().len(),
                    "diagnostics": diagnostics_json(&report),
                }));
                loaded.push(m);
            }
            Ok((m, report)) => {
                print!("{report}");
                println!(
                    "{}: ok: machine `{}` ({} states, {} events, {} actions, {} warnings)",
                    path.display(),
                    m.name(),
                    m.states().len(),
                    m.events().len(),
                    m.actions().len(),
                    report.warnings().count()
                );
                loaded.push(m);
            }
            Err(e) => {
                ok = false;
                let report = match e {
                    LoadError::Invalid(report) => report,
                    LoadError::Unreadable(e) if !as_json => {
                        println!("{}: cannot read: {e}", path.display());
                        continue;
                    }
                    // The file itself as the item of an error diagnostic, as a reader of the
                    // JSON expects every problem to be.
                    LoadError::Unreadable(e) => settle_core::Report {
                        diagnostics: vec![settle_core::Diagnostic {
                            severity: settle_core::Severity::Error,
                            file: Some(path.display().to_string()),
                            line: None,
                            machine: String::new(),
                            item: "file".to_string(),
                            message: format!("cannot read: {e}"),
                        }],
                    },
                };
                if as_json {
                    let machine = report.diagnostics.first().map(|d| d.machine.clone()).filter(|m| !m.is_empty());
                    results.push(serde_json::json!({
                        "file": path.display().to_string(),
                        "ok": false,
                        "machine": machine,
                        "states": null,
                        "events": null,
                        "actions": null,
                        "diagnostics": diagnostics_json(&report),
                    }));
                } else {
                    print!("{report}");
                }
            }
        }
    }
    // Subscriptions name other machines: check them against every machine given.
    let mut across = settle_core::Report::default();
    if loaded.len() > 1 {
        let set: Vec<&settle_core::Machine> = loaded.iter().collect();
        across = settle_core::validate::check_set(&set);
        if !as_json {
            print!("{across}");
        }
        ok &= !across.has_errors();
    }
    if as_json {
        let v = serde_json::json!({"ok": ok, "files": results, "across_machines": diagnostics_json(&across)});
        println!("{v}");
    }
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// `settle validate --json`'s diagnostics: `severity` (`error` or `warning`), `file`,
/// `line` (null when unknown), `machine`, `item`, `message`.
pub(crate) fn diagnostics_json(report: &settle_core::Report) -> serde_json::Value {
    let severity = |s: settle_core::Severity| match s {
        settle_core::Severity::Error => "error",
        settle_core::Severity::Warning => "warning",
    };
    report
        .diagnostics
        .iter()
        .map(|d| {
            serde_json::json!({
                "severity": severity(d.severity),
                "file": d.file,
                "line": d.line,
                "machine": d.machine,
                "item": d.item,
                "message": d.message,
            })
        })
        .collect()
}
