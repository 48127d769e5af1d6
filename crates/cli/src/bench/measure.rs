//! Measurements the benchmarks report: the process's memory (and another's) from
//! `/proc`, figures rounded for JSON, medians.

/// Resident set size of this process now, in MiB (Linux; 0 elsewhere).
pub(crate) fn rss_mb() -> f64 {
    proc_status_mb("VmRSS:")
}

/// Peak resident set size of this process in MiB (Linux; 0 elsewhere).
pub(crate) fn peak_rss_mb() -> f64 {
    proc_status_mb("VmHWM:")
}

/// A memory figure of `/proc/self/status` (given in kB there), in MiB; 0 if unavailable.
pub(crate) fn proc_status_mb(field: &str) -> f64 {
    proc_file_mb("/proc/self/status", field)
}

/// `field` of process `pid`'s status, in MiB (Linux; 0 elsewhere).
pub(crate) fn proc_mb(pid: u32, field: &str) -> f64 {
    proc_file_mb(&format!("/proc/{pid}/status"), field)
}

pub(crate) fn proc_file_mb(path: &str, field: &str) -> f64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

pub(crate) fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The median of `v` (the mean of the middle two of an even count); 0 when empty.
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}
