//! The engine's metrics, recorded through the `metrics` facade: free when no recorder is
//! installed. The HTTP service (or any embedding program) installs one; with the
//! `prometheus` feature, `install_prometheus` installs a Prometheus recorder and returns
//! the handle that renders the text exposition format.
//!
//! These are live, per-process figures (`settle_engine_*`); the store-wide totals that
//! `settle stats --prometheus` reads from the database are `settle_*`.
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `settle_engine_transitions_total` | counter | machine, from, to |
//! | `settle_engine_events_rejected_total` | counter | machine, event |
//! | `settle_engine_faults_total` | counter | machine, kind |
//! | `settle_engine_parked_total` | counter | machine |
//! | `settle_engine_leases_lost_total` | counter | |
//! | `settle_engine_limit_waits_total` | counter | limit (auto actions that found their limit full) |
//! | `settle_engine_action_seconds` | histogram | machine, action |
//! | `settle_engine_batch_ops` | histogram | |
//! | `settle_engine_inflight_entities` | gauge | |
//! | `settle_engine_pending_entities` | gauge | (entities with work scheduled) |
//! | `settle_engine_schedule_refused_total` | counter | machine, schedule (fires whose request was refused) |

pub(crate) fn transition(machine: &str, from: &str, to: &str) {
    metrics::counter!("settle_engine_transitions_total", "machine" => machine.to_string(), "from" => from.to_string(), "to" => to.to_string())
        .increment(1);
}

pub(crate) fn rejected(machine: &str, event: &str) {
    metrics::counter!("settle_engine_events_rejected_total", "machine" => machine.to_string(), "event" => event.to_string())
        .increment(1);
}

pub(crate) fn fault(machine: &str, kind: &'static str, parked: bool) {
    metrics::counter!("settle_engine_faults_total", "machine" => machine.to_string(), "kind" => kind).increment(1);
    if parked {
        metrics::counter!("settle_engine_parked_total", "machine" => machine.to_string()).increment(1);
    }
}

pub(crate) fn lease_lost() {
    metrics::counter!("settle_engine_leases_lost_total").increment(1);
}

/// An auto action found every slot of its concurrency limit taken: its entity waits in line.
pub(crate) fn limit_waited(limit: &str) {
    metrics::counter!("settle_engine_limit_waits_total", "limit" => limit.to_string()).increment(1);
}

pub(crate) fn action_seconds(machine: &str, action: &str, seconds: f64) {
    metrics::histogram!("settle_engine_action_seconds", "machine" => machine.to_string(), "action" => action.to_string())
        .record(seconds);
}

pub(crate) fn batch(ops: usize, inflight: usize) {
    metrics::histogram!("settle_engine_batch_ops").record(ops as f64);
    metrics::gauge!("settle_engine_inflight_entities").set(inflight as f64);
}

pub(crate) fn due_backlog(n: u64) {
    metrics::gauge!("settle_engine_pending_entities").set(n as f64);
}

pub(crate) fn pages_reclaimed(pages: u64) {
    metrics::counter!("settle_store_pages_reclaimed_total").increment(pages);
}

/// Entities written to the archive before pruning removed them
/// (`settle_archived_entities_total`).
pub(crate) fn archived(n: usize) {
    metrics::counter!("settle_archived_entities_total").increment(n as u64);
}

/// Entities a bulk operation commanded, and those whose command was refused
/// (`settle_bulk_entities_total{result}`).
pub(crate) fn bulk_commanded(done: u64, failed: u64) {
    metrics::counter!("settle_bulk_entities_total", "result" => "done").increment(done);
    metrics::counter!("settle_bulk_entities_total", "result" => "failed").increment(failed);
}

/// Rows a round of pruning removed, per table (`settle_pruned_rows_total{table}`).
pub(crate) fn pruned(rows: &settle_store::PrunedRows) {
    for (table, n) in rows.tables() {
        if n > 0 {
            metrics::counter!("settle_pruned_rows_total", "table" => table).increment(n);
        }
    }
}

/// Installs a Prometheus recorder as the global metrics recorder and returns its handle;
/// `handle.render()` gives the text exposition format.
#[cfg(feature = "prometheus")]
pub fn install_prometheus() -> Result<metrics_exporter_prometheus::PrometheusHandle, String> {
    metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder().map_err(|e| e.to_string())
}
