//! Conversions from the store's rows (feature `store`).

use settle_store::{EntityRow, ErrorRow, HistoryRow, OperationRow, TimerRow};

use super::*;

impl From<&EntityRow> for Entity {
    fn from(e: &EntityRow) -> Self {
        Entity {
            machine: e.machine.to_string(),
            key: e.key.to_string(),
            state: e.state.to_string(),
            version: e.version,
            retry: e.retry,
            properties: e.properties.clone(),
            created_at: e.created_at,
            entered_at: e.entered_at,
            due_at: e.due_at,
            lease_owner: e.lease_owner.clone(),
            run_status: e.run_status.as_str().to_string(),
            machine_version: e.machine_hash.clone(),
            health: None,
            sleep_until: e.sleep_until,
            permitted_events: None,
            lease_until: None,
            recent_errors: None,
            commands: None,
            last_error: None,
            inbox: None,
            next_fires: None,
            limits: None,
        }
    }
}

impl From<&HistoryRow> for HistoryEntry {
    fn from(h: &HistoryRow) -> Self {
        HistoryEntry {
            from: h.from.as_deref().map(str::to_string),
            to: h.to.as_deref().map(str::to_string),
            kind: h.kind.as_str().to_string(),
            action: h.action.as_deref().map(str::to_string),
            event: h.event.as_deref().map(str::to_string),
            retry: h.retry,
            request_id: h.request_id.clone(),
            at: h.at,
            detail: h.detail.clone(),
        }
    }
}

impl From<&TimerRow> for Timer {
    fn from(t: &TimerRow) -> Self {
        Timer { name: t.name.clone(), event: t.event.to_string(), due_at: t.due_at, every_ms: t.every_ms }
    }
}

impl From<&ErrorRow> for ErrorEntry {
    fn from(e: &ErrorRow) -> Self {
        ErrorEntry {
            at: e.at,
            kind: e.kind.clone(),
            details: e.details.clone(),
            request_id: e.request_id.clone(),
            cause: e.cause.iter().map(EntityRef::from).collect(),
        }
    }
}

impl From<&settle_store::CauseRef> for EntityRef {
    fn from(c: &settle_store::CauseRef) -> Self {
        EntityRef { machine: c.machine.clone(), key: c.key.clone(), state: c.state.clone() }
    }
}

impl From<&settle_store::Why> for Why {
    fn from(w: &settle_store::Why) -> Self {
        fn walk(w: &settle_store::Why, depth: u32, out: &mut Vec<WhyStep>) {
            let f = w.failure.as_ref();
            out.push(WhyStep {
                depth,
                machine: w.machine.clone(),
                key: w.key.clone(),
                state: w.state.clone(),
                run_status: w.run_status.map(|r| r.as_str().to_string()),
                failing: w.failing,
                at: f.map(|f| f.at),
                kind: f.map(|f| f.kind.clone()),
                details: f.map(|f| f.details.clone()),
                request_id: f.and_then(|f| f.request_id.clone()),
            });
            for c in &w.causes {
                walk(c, depth + 1, out);
            }
        }
        let mut chain = Vec::new();
        walk(w, 0, &mut chain);
        Why { failing: w.failing, chain, limits: Vec::new() }
    }
}

impl From<&OperationRow> for Operation {
    fn from(o: &OperationRow) -> Self {
        Operation {
            request_id: o.request_id.clone(),
            name: o.name.clone(),
            machine: o.machine.clone(),
            key: o.entity_key.clone(),
            started_at: o.started_at,
            ended_at: o.ended_at,
            first_response_at: o.first_response_at,
            outcome: o.outcome.clone(),
            error: o.error.clone(),
            restart_count: o.restart_count,
            dimensions: o.dimensions.clone(),
        }
    }
}
