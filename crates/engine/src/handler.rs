//! Action handlers: what a bound action receives ([`ActionContext`]) and returns
//! ([`Outcome`]: a target plus buffered effects, committed atomically by the runtime).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use serde_json::Value;
use settle_core::step::{ActionOutcome, PropChange};
use settle_core::{ActionName, Broadcast, EntityKey, EventName, MachineName, Properties, Related, StateName};
use settle_store::{EntityRow, SqlStatement};

use crate::api::EventOutcome;

/// The error type handlers return; any error counts as a fault of the action.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync>;

/// A boxed handler future.
pub type HandlerFuture = Pin<Box<dyn Future<Output = Result<Outcome, HandlerError>> + Send>>;

/// A bound action implementation.
pub type Handler = Arc<dyn Fn(ActionContext) -> HandlerFuture + Send + Sync>;

/// A boxed future of the engine's API.
pub(crate) type EngineFuture<T> = Pin<Box<dyn Future<Output = Result<T, crate::Error>> + Send>>;

/// A sync nested event: raised by the entity `from` on another, which joins `from`'s
/// workflow.
pub(crate) struct NestedEvent {
    pub(crate) from: i64,
    pub(crate) machine: MachineName,
    pub(crate) key: EntityKey,
    pub(crate) event: EventName,
    pub(crate) params: Value,
    pub(crate) request_id: Option<String>,
}

/// What an action may do with other entities while it runs (implemented by the engine).
pub(crate) trait Nested: Send + Sync {
    /// Raises an event on another entity through its inbox, joining it into the raising
    /// entity's workflow, and waits for its outcome and next stable state.
    fn raise_and_wait(&self, nested: NestedEvent) -> EngineFuture<(EventOutcome, EntityRow)>;
    /// Reads an entity.
    fn read(&self, machine: MachineName, key: EntityKey) -> EngineFuture<Option<EntityRow>>;
}

/// Everything an action may read. Actions run outside any transaction; what they want to
/// change goes into the [`Outcome`].
#[derive(Clone)]
pub struct ActionContext {
    /// The entity's machine.
    pub machine: MachineName,
    /// The entity's key.
    pub key: EntityKey,
    /// The entity's store id.
    pub entity_id: i64,
    /// The state the action runs in.
    pub state: StateName,
    /// The action running.
    pub action: ActionName,
    /// The entity's properties.
    pub properties: Properties,
    /// The entity's version (identifies the state entry and attempt).
    pub version: i64,
    /// How many times the current state has been re-entered for a retry.
    pub retry: u32,
    /// The event that triggered the action (`None` for an auto action).
    pub event: Option<EventName>,
    /// The event whose workflow the action runs in: `event` for an event's action; for an
    /// auto action (or an entry or exit action of its transition), the event whose action
    /// entered the state or began the chain of auto actions that did (`None` when no event
    /// did: an entity created with no first event). An agent's task names the same event.
    pub trigger: Option<EventName>,
    /// The parameters of `trigger` (`Null` when none), as stored with the event.
    pub params: Value,
    /// The request the work belongs to.
    pub request_id: Option<String>,
    pub(crate) nested: Arc<dyn Nested>,
    /// Entities read "with lock": (id, version) preconditions of this action's commit.
    pub(crate) locks: Arc<Mutex<Vec<(i64, i64)>>>,
}

impl std::fmt::Debug for ActionContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActionContext")
            .field("machine", &self.machine)
            .field("key", &self.key)
            .field("state", &self.state)
            .field("action", &self.action)
            .field("version", &self.version)
            .field("retry", &self.retry)
            .field("event", &self.event)
            .finish_non_exhaustive()
    }
}

impl ActionContext {
    /// Raises `event` on another entity and waits for its outcome and next stable state (a
    /// sync nested event). The event goes through the target's durable inbox, the target
    /// joins this entity's workflow (it becomes a successor), and the wait is bounded by
    /// this action's lease. A rejection comes back as [`EventOutcome::Rejected`].
    pub async fn raise_and_wait(
        &self,
        machine: impl AsRef<str>,
        key: impl AsRef<str>,
        event: impl AsRef<str>,
        params: Value,
    ) -> Result<(EventOutcome, EntityRow), crate::Error> {
        self.nested
            .raise_and_wait(NestedEvent {
                from: self.entity_id,
                machine: MachineName::new(machine),
                key: EntityKey::new(key),
                event: EventName::new(event),
                params,
                request_id: self.request_id.clone(),
            })
            .await
    }

    /// Reads another entity as it is now.
    pub async fn read(
        &self,
        machine: impl AsRef<str>,
        key: impl AsRef<str>,
    ) -> Result<Option<EntityRow>, crate::Error> {
        self.nested.read(MachineName::new(machine), EntityKey::new(key)).await
    }

    /// Reads another entity "with lock": this action's commit fails (and the action runs
    /// again) if that entity has changed by then.
    pub async fn read_locked(
        &self,
        machine: impl AsRef<str>,
        key: impl AsRef<str>,
    ) -> Result<Option<EntityRow>, crate::Error> {
        let row = self.read(machine, key).await?;
        if let Some(e) = &row {
            self.locks.lock().expect("locks").push((e.id, e.version));
        }
        Ok(row)
    }

    /// A key that is the same every time this very attempt runs (after a crash, say) and
    /// different for every other attempt: pass it to providers to make calls idempotent.
    pub fn idempotency_key(&self) -> String {
        format!("{}/{}/{}", self.machine, self.key, self.version)
    }
}

/// An entity an action creates (committed with the action).
pub type CreateEffect = settle_core::step::Create;

/// An event an action raises on another entity (through its durable inbox).
pub type RaiseEffect = settle_core::step::Raise;

/// What an action decided: the state to enter and the effects to commit with it.
///
/// ```
/// use serde_json::json;
/// use settle_engine::Outcome;
/// let done = Outcome::to("ready").set("endpoint", json!("10.0.0.7"));
/// let again = Outcome::retry_after(std::time::Duration::from_secs(2));
/// assert_eq!(done.target(), Some("ready"));
/// assert_eq!(again.target(), None);
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    /// What the action decided, as every author decides it (a declarative action and an
    /// agent's report give the same value).
    pub(crate) decided: ActionOutcome,
    /// Raw SQL run in the commit (Rust handlers only).
    pub(crate) sql: Vec<SqlStatement>,
}

impl Outcome {
    /// Move to `state` (one of the action's declared targets).
    pub fn to(state: impl AsRef<str>) -> Self {
        Outcome::from(ActionOutcome { target: Some(StateName::new(state)), ..ActionOutcome::default() })
    }
    /// Re-enter the current state; its auto action runs again after `delay`.
    pub fn retry_after(delay: Duration) -> Self {
        Outcome::from(ActionOutcome { delay: Some(delay), ..ActionOutcome::default() })
    }
    /// Re-enter the current state with its declared wait.
    pub fn stay() -> Self {
        Outcome::default()
    }
    /// The state asked for (`None`: re-enter the current state).
    pub fn target(&self) -> Option<&str> {
        self.decided.target.as_deref()
    }
    /// Says why the action failed: with a target of `health = "error"`, the message is
    /// recorded in the entity's errors (kind `failure`) with the entry, and `settle why`
    /// and the dashboard show it as the failure's cause.
    pub fn error(mut self, message: impl Into<String>) -> Self {
        self.decided.error = Some(message.into());
        self
    }
    /// The failure message given with [`Outcome::error`], if any.
    pub fn error_message(&self) -> Option<&str> {
        self.decided.error.as_deref()
    }
    /// Sets the delay before the entered state's auto action (overrides declared waits).
    pub fn delay(mut self, delay: Duration) -> Self {
        self.decided.delay = Some(delay);
        self
    }
    /// Sets a property.
    pub fn set(mut self, key: impl Into<String>, value: Value) -> Self {
        self.decided.changes.push(PropChange::Set(key.into(), value));
        self
    }
    /// Removes a property.
    pub fn remove(mut self, key: impl Into<String>) -> Self {
        self.decided.changes.push(PropChange::Remove(key.into()));
        self
    }
    /// Runs a parameterised SQL statement in the commit (placeholders in the store's
    /// dialect, e.g. `?1` on SQLite). A failing statement fails the whole commit.
    pub fn sql(mut self, sql: impl Into<String>, params: impl IntoIterator<Item = Value>) -> Self {
        self.sql.push(SqlStatement { sql: sql.into(), params: params.into_iter().collect() });
        self
    }
    /// Creates an entity in the commit.
    pub fn create(mut self, machine: impl AsRef<str>, key: impl AsRef<str>, properties: Properties) -> Self {
        self.decided.creates.push(CreateEffect {
            machine: MachineName::new(machine),
            key: EntityKey::new(key),
            properties,
        });
        self
    }
    /// Raises an event on another entity, written to its inbox in the commit.
    pub fn raise(self, machine: impl AsRef<str>, key: impl AsRef<str>, event: impl AsRef<str>, params: Value) -> Self {
        self.nested(machine, key, event, params, false)
    }
    /// Raises an event on another entity, written to its inbox in the commit, and joins
    /// that entity into this one's workflow: it becomes a successor, whose state changes
    /// this entity's subscriptions see.
    pub fn join(self, machine: impl AsRef<str>, key: impl AsRef<str>, event: impl AsRef<str>, params: Value) -> Self {
        self.nested(machine, key, event, params, true)
    }
    /// Raises an event on another entity, written to its inbox in the commit, as a sync
    /// nested event that does not hold the action open: when the event's workflow ends
    /// there (rejected, ignored or failed, or that entity at rest again), the engine raises
    /// `reply`, an event of this entity's machine, on this entity, with what came of it
    /// (`machine`, `key`, `event`, `outcome` — `accepted`, `rejected`, `ignored`, `failed`
    /// or `interrupted` — `state` and `reason`, those the reply event declares). Meanwhile
    /// this entity waits in the state the outcome enters, which takes `reply` (a stable
    /// state, with a timeout of its own if the wait must be bounded: a killed entity never
    /// replies).
    ///
    /// ```
    /// use serde_json::json;
    /// use settle_engine::Outcome;
    /// let ask = Outcome::to("awaiting_db").raise_with_reply("db", "web-1-db", "provision", json!(null), "db_done");
    /// assert_eq!(ask.target(), Some("awaiting_db"));
    /// ```
    pub fn raise_with_reply(
        mut self,
        machine: impl AsRef<str>,
        key: impl AsRef<str>,
        event: impl AsRef<str>,
        params: Value,
        reply: impl AsRef<str>,
    ) -> Self {
        self = self.nested(machine, key, event, params, false);
        if let Some(r) = self.decided.raises.last_mut() {
            r.reply = Some(EventName::new(reply));
        }
        self
    }
    /// Raises an event on every entity related to this one `on` that way (its
    /// predecessors, or its successors, including those this commit creates), written to
    /// their inboxes in the commit: on those of the machines that declare the event.
    ///
    /// ```
    /// use serde_json::json;
    /// use settle_core::Related;
    /// use settle_engine::Outcome;
    /// let done = Outcome::to("ready").raise_on(Related::Predecessors, "child_ready", json!(null));
    /// assert_eq!(done.target(), Some("ready"));
    /// ```
    pub fn raise_on(mut self, on: Related, event: impl AsRef<str>, params: Value) -> Self {
        self.decided.related.push(Broadcast { event: EventName::new(event), on, params });
        self
    }
    /// Raises `event` on the entity itself, an internal event (SCXML's `<raise>`): queued in
    /// this commit and processed right after it, before any event queued from outside (a
    /// retry or an auto action of the state entered waits for it).
    ///
    /// ```
    /// use serde_json::json;
    /// use settle_engine::Outcome;
    /// let done = Outcome::to("checked").raise_self("verify", json!({"depth": 2}));
    /// assert_eq!(done.target(), Some("checked"));
    /// ```
    pub fn raise_self(mut self, event: impl AsRef<str>, params: Value) -> Self {
        self.decided.internal.push(settle_core::step::InternalEvent { event: EventName::new(event), params });
        self
    }
    /// Takes out its effects (property changes, SQL, entities created, events raised),
    /// leaving what it decided about the state (target, delay): a transition applies its
    /// exit actions' effects, then these, then its entry actions' (SCXML's order), so
    /// they are put back with [`Outcome::add_effects`] once the exit actions' are in.
    pub(crate) fn take_effects(&mut self) -> Outcome {
        let d = &mut self.decided;
        Outcome {
            decided: ActionOutcome {
                target: None,
                delay: None,
                changes: std::mem::take(&mut d.changes),
                creates: std::mem::take(&mut d.creates),
                raises: std::mem::take(&mut d.raises),
                related: std::mem::take(&mut d.related),
                internal: std::mem::take(&mut d.internal),
                error: None,
            },
            sql: std::mem::take(&mut self.sql),
        }
    }
    /// Adds the effects of an entry or exit action's outcome to this one (after its own):
    /// property changes, SQL, created entities, raised events. Such an action never
    /// chooses a state or fails one: an outcome with a target, a delay or a failure message
    /// is refused (the error says so).
    pub(crate) fn absorb(&mut self, hook: Outcome) -> Result<(), String> {
        let (hook, sql) = (hook.decided, hook.sql);
        if let Some(target) = &hook.target {
            return Err(format!("asked to move to `{target}`, but entry and exit actions never choose a state"));
        }
        if hook.delay.is_some() {
            return Err("asked for a delay, but entry and exit actions never choose one".into());
        }
        if hook.error.is_some() {
            return Err("gave a failure message, but only the transition's own action says why it failed".into());
        }
        self.add_effects(Outcome { decided: hook, sql });
        Ok(())
    }
    /// Adds `other`'s effects after its own (its target and delay are not looked at).
    pub(crate) fn add_effects(&mut self, other: Outcome) {
        self.decided.changes.extend(other.decided.changes);
        self.sql.extend(other.sql);
        self.decided.creates.extend(other.decided.creates);
        self.decided.raises.extend(other.decided.raises);
        self.decided.related.extend(other.decided.related);
        self.decided.internal.extend(other.decided.internal);
    }
    fn nested(
        mut self,
        machine: impl AsRef<str>,
        key: impl AsRef<str>,
        event: impl AsRef<str>,
        params: Value,
        join: bool,
    ) -> Self {
        self.decided.raises.push(RaiseEffect {
            machine: MachineName::new(machine),
            key: EntityKey::new(key),
            event: EventName::new(event),
            params,
            join,
            reply: None,
        });
        self
    }
}

impl From<ActionOutcome> for Outcome {
    /// The outcome a declarative action or an agent's report decided, as a handler's.
    fn from(decided: ActionOutcome) -> Self {
        Outcome { decided, sql: Vec::new() }
    }
}

/// Wraps an async function as a [`Handler`].
pub fn handler<F, Fut>(f: F) -> Handler
where
    F: Fn(ActionContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Outcome, HandlerError>> + Send + 'static,
{
    Arc::new(move |ctx| Box::pin(f(ctx)))
}

/// Polls a future, turning a panic into an `Err` with the panic message.
pub(crate) struct CatchUnwind<F>(pub(crate) F);

impl<F: Future + Unpin> Future for CatchUnwind<F> {
    type Output = Result<F::Output, String>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = &mut self.0;
        match std::panic::catch_unwind(AssertUnwindSafe(|| Pin::new(inner).poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Err(payload) => {
                let msg = payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".to_string());
                Poll::Ready(Err(msg))
            }
        }
    }
}
