//! What validation reports: [`Diagnostic`]s with their [`Severity`], gathered in a
//! [`Report`] that says where each problem is (file, line, machine, item).

use std::fmt;

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
