//! Validation of machine definitions: every problem at once, each with the machine, the
//! item and (for TOML) the line, as errors (the definition is refused) or warnings.

use std::fmt;

use crate::machine::MachineDef;

/// How serious a diagnostic is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// The definition is refused.
    Error,
    /// The definition is accepted, but probably not what was meant.
    Warning,
}

/// One problem found in a definition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// Error or warning.
    pub severity: Severity,
    /// The file the definition came from, when known.
    pub file: Option<String>,
    /// 1-based line in that file, when known.
    pub line: Option<u32>,
    /// The machine's name.
    pub machine: String,
    /// The item concerned, e.g. "state `creating`", "event `create`", "machine".
    pub item: String,
    /// What is wrong, lowercase, no trailing period.
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sev = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        match (&self.file, self.line) {
            (Some(file), Some(line)) => write!(f, "{file}:{line}: ")?,
            (Some(file), None) => write!(f, "{file}: ")?,
            (None, Some(line)) => write!(f, "line {line}: ")?,
            (None, None) => {}
        }
        write!(f, "{sev}: machine `{}`, {}: {}", self.machine, self.item, self.message)
    }
}

/// All diagnostics for one or more definitions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Diagnostics in the order found.
    pub diagnostics: Vec<Diagnostic>,
}

impl Report {
    /// Whether any diagnostic is an error.
    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(|d| d.severity == Severity::Error)
    }
    /// The errors only.
    pub fn errors(&self) -> impl Iterator<Item = &Diagnostic> {
        self.diagnostics.iter().filter(|d| d.severity == Severity::Error)
    }
    /// The warnings only.
    pub fn warnings(&self) -> impl Iterator<Item = &Diagnostic> {
        self.diagnostics.iter().filter(|d| d.severity == Severity::Warning)
    }
    /// Sets `file` on every diagnostic that has none.
    pub fn with_file(mut self, file: &str) -> Self {
        for d in &mut self.diagnostics {
            d.file.get_or_insert_with(|| file.to_string());
        }
        self
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for d in &self.diagnostics {
            writeln!(f, "{d}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Report {}

/// Checks a definition and returns every error and warning found.
pub fn check(def: &MachineDef) -> Report {
    let mut diagnostics = Vec::new();
    let err = |item: String, line: Option<u32>, message: String| Diagnostic {
        severity: Severity::Error,
        file: None,
        line,
        machine: def.name.clone(),
        item,
        message,
    };
    let has_state = |n: &str| def.states.iter().any(|s| s.name == n);
    let initials: Vec<&str> = def
        .initial
        .iter()
        .map(String::as_str)
        .chain(def.states.iter().filter(|s| s.initial).map(|s| s.name.as_str()))
        .collect();
    if initials.is_empty() {
        diagnostics.push(err("machine".into(), def.origin.line, "no initial state".into()));
    }
    if let Some(i) = &def.initial {
        if !has_state(i) {
            diagnostics.push(err("machine".into(), def.initial_origin.line, format!("initial state `{i}` is not declared")));
        }
    }
    for s in &def.states {
        for a in &s.auto {
            if !def.actions.iter().any(|x| &x.name == a) {
                diagnostics.push(err(format!("state `{}`", s.name), s.origin.line, format!("unknown action `{a}`")));
            }
        }
    }
    for e in &def.events {
        for st in &e.valid_in {
            if !has_state(st) {
                diagnostics.push(err(format!("event `{}`", e.name), e.origin.line, format!("unknown state `{st}`")));
            }
        }
        if !def.actions.iter().any(|x| x.name == e.action) {
            diagnostics.push(err(format!("event `{}`", e.name), e.origin.line, format!("unknown action `{}`", e.action)));
        }
    }
    for a in &def.actions {
        for t in &a.targets {
            if !has_state(t) {
                diagnostics.push(err(format!("action `{}`", a.name), a.origin.line, format!("unknown state `{t}`")));
            }
        }
    }
    Report { diagnostics }
}
