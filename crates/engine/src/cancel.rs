//! Canceling an operation (DESIGN §1 "Operations", §9): every entity the operation reached
//! stops its work in it and runs its machine's undo path where there is one.
//!
//! [`Engine::cancel_operation`] starts one bulk operation, `{request id}/cancel`, over the
//! entities the operation reached (its own, those its events reached, those it created;
//! [`Store::operation_reached`]): durable, resumed after a crash, idempotent per entity.
//! On each, as the operation `{request id}/cancel/{entity id}` ([`Op::Cancel`], decided in
//! the store's write plan): its queued events of the operation are dropped; the work it
//! does in it is stopped (its version moves, so a result in flight is refused; its agent
//! task is canceled); where its state is the operation's doing and its machine's `cancel`
//! event is valid there, that event is queued — the entity's part ends when its undo path
//! is at rest — and work stopped with no undo leaves it paused for an operator. The
//! operation itself ends as `canceled` once nothing of it is busy or queued.

use std::time::Duration;

use serde_json::json;
use settle_core::EntityKey;
use settle_store::{
    Applied, BulkRow, Cancel, CancelOutcome, EntityRow, HistoryKind, Op, OpenOperation, OperationRow, Store, Undo,
};
use tokio::sync::oneshot;

use crate::bulk::{BulkAction, BulkRequest, MAX_RATE, Selection, entity_request_id};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::msg::Msg;

/// The request id of the bulk operation canceling operation `request_id`.
pub fn cancel_request_id(request_id: &str) -> String {
    format!("{request_id}/cancel")
}

/// A cancel started (or found started: a replay).
#[derive(Debug, Clone)]
pub struct CancelStarted {
    /// The operation canceled, as it is now.
    pub operation: OperationRow,
    /// The bulk operation going through the entities it reached.
    pub bulk: BulkRow,
    /// The cancel was asked before: nothing was started again.
    pub replayed: bool,
}

/// One entity an operation reached, and its part of the cancel.
#[derive(Debug, Clone)]
pub struct CanceledEntity {
    /// The entity as it is now.
    pub entity: EntityRow,
    /// Its part of the cancel (`{request id}/cancel/{entity id}`): open while its undo
    /// runs; `None` until the cancel reached it.
    pub part: Option<OperationRow>,
    /// What the cancel did there, as recorded in its history (`None`: nothing).
    pub did: Option<String>,
}

impl<S: Store + Clone> Engine<S> {
    /// Cancels the operation `request_id`: starts the bulk operation that stops its work on
    /// every entity it reached and runs their undo (see the [module docs](self)). `reason`
    /// is recorded with it (default: "cancel of operation …"). Asking again is a replay.
    /// [`Error::UnknownOperation`] if there is no such operation, [`Error::OperationEnded`]
    /// if it has ended (and was not canceled by this cancel).
    pub async fn cancel_operation(&self, request_id: &str, reason: Option<&str>) -> Result<CancelStarted> {
        let bulk_id = cancel_request_id(request_id);
        let operation =
            self.operation(request_id).await?.ok_or_else(|| Error::UnknownOperation(request_id.to_string()))?;
        if let Some(bulk) = self.bulk_get(&bulk_id).await? {
            return Ok(CancelStarted { operation, bulk, replayed: true });
        }
        if let (Some(_), Some(outcome)) = (operation.ended_at, &operation.outcome) {
            return Err(Error::OperationEnded { request_id: request_id.to_string(), outcome: outcome.clone() });
        }
        let reason = reason
            .map(str::trim)
            .filter(|r| !r.is_empty())
            .map_or_else(|| format!("cancel of operation {request_id}"), str::to_string);
        let req = BulkRequest {
            request_id: Some(bulk_id),
            action: BulkAction::Cancel,
            selection: Selection { reached_by: Some(request_id.to_string()), ..Selection::default() },
            reason,
            rate: MAX_RATE,
            priority: None,
        };
        let (bulk, new) = self.bulk_start(req).await?;
        Ok(CancelStarted { operation, bulk, replayed: !new })
    }

    /// Waits, at most `timeout`, until the cancel of `request_id` went through every entity
    /// and, with `undone`, until the operation and every entity's part ended (each undo at
    /// rest). The operation then.
    pub async fn cancel_wait(&self, request_id: &str, undone: bool, timeout: Duration) -> Result<OperationRow> {
        let deadline = tokio::time::Instant::now() + timeout;
        let left = || deadline.saturating_duration_since(tokio::time::Instant::now());
        let bulk = self.bulk_wait(&cancel_request_id(request_id), left()).await?;
        if !undone {
            return self.operation(request_id).await?.ok_or_else(|| Error::UnknownOperation(request_id.to_string()));
        }
        let operation = self.wait_operation(request_id, left()).await?;
        for e in self.inner.store.operation_reached(request_id, None, bulk.total.max(1) * 2 + 100).await? {
            let part = entity_request_id(&bulk.request_id, e.id);
            if self.operation(&part).await?.is_some() {
                self.wait_operation(&part, left()).await?;
            }
        }
        Ok(operation)
    }

    /// The entities the operation `request_id` reached (at most `limit`, in id order), each
    /// with its part of the cancel.
    pub async fn cancel_parts(&self, request_id: &str, limit: u64) -> Result<Vec<CanceledEntity>> {
        let bulk_id = cancel_request_id(request_id);
        let mut out = Vec::new();
        for entity in self.inner.store.operation_reached(request_id, None, limit).await? {
            let part_id = entity_request_id(&bulk_id, entity.id);
            let part = self.operation(&part_id).await?;
            let did = match &part {
                Some(_) => self
                    .inner
                    .store
                    .history_list(entity.id)
                    .await?
                    .into_iter()
                    .rev()
                    .find(|h| h.kind == HistoryKind::Command && h.request_id.as_deref() == Some(part_id.as_str()))
                    .and_then(|h| h.detail),
                None => None,
            };
            out.push(CanceledEntity { entity, part, did });
        }
        Ok(out)
    }

    /// Cancels the operation `canceled` on entity `e` as the operation `request_id` (a
    /// page of the cancel's bulk operation): what became of its part.
    pub(crate) async fn cancel_entity(
        &self,
        e: &EntityRow,
        canceled: &str,
        request_id: String,
        reason: &str,
    ) -> Result<Option<CancelOutcome>> {
        let registry = self.inner.registry();
        let (_, machine) = registry.version_of(e)?;
        let undo =
            machine.cancel_event().map(|event| Undo { event: event.clone(), states: machine.states_where(event) });
        let op = Op::Cancel(Box::new(Cancel {
            machine: machine.name().clone(),
            key: EntityKey::new(e.key.as_str()),
            canceled: canceled.to_string(),
            undo,
            operation: Some(OpenOperation {
                request_id,
                name: format!("{}.cancel", machine.name()),
                dimensions: json!({"machine": machine.name().as_str(), "command": "cancel", "canceled": canceled,
                    "reason": reason}),
                priority: 0,
            }),
        }));
        let (reply, rx) = oneshot::channel();
        self.send(Msg::Cancel { op, reply })?;
        match rx.await.map_err(|_| Error::Stopped)?? {
            Applied::Canceled { outcome, .. } => Ok(Some(outcome)),
            Applied::Replayed { .. } => Ok(None),
            other => unreachable!("a cancel answered with {other:?}"),
        }
    }
}
