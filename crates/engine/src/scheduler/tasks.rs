//! The tasks a scheduler starts outside its loop — an action's handler, a transition's
//! entry and exit actions, an evaluation of subscriptions — and what it does with their
//! answers.

use super::*;

impl<S: Store + Clone> Scheduler<S> {
    /// Starts evaluating the entity's subscriptions for a change notice. The successors
    /// are read outside the scheduler; every notice up to the read is covered by it.
    pub(super) fn evaluate(&mut self, id: i64, notice: InboxItem) {
        let slot = self.held.get_mut(&id).expect("held entity");
        let (machine, e) = (slot.held.machine.clone(), &slot.held.entity);
        let (state, fired, version) = (e.state.clone(), e.fired.clone(), e.version);
        slot.running = Some(Running::Evaluating { notice });
        let (store, registry, tx) = (self.store.clone(), self.registry.clone(), self.tx.clone());
        let task = self.next_task();
        tokio::spawn(async move {
            let result = match store.successor_snapshot(id).await {
                Ok(snap) => Ok((
                    decide::subscription_fires(&machine, &registry, &state, &fired, &snap.successors),
                    snap.newest_notice,
                )),
                Err(e) => Err(e.to_string()),
            };
            let _ = tx.send(Msg::Evaluated { entity_id: id, version, task, result });
        });
    }

    pub(super) fn on_evaluated(
        &mut self,
        id: i64,
        version: i64,
        result: std::result::Result<(Fire, Option<i64>), String>,
    ) {
        let env = decide_env!(self);
        let Some(slot) = self.held.get_mut(&id) else { return };
        if slot.held.entity.version != version {
            return;
        }
        let Some(Running::Evaluating { notice }) = slot.running.take() else { return };
        match result {
            Ok((fire, newest)) => {
                let next = decide::evaluated(&mut slot.held, notice, fire, newest, &env);
                self.carry_out(id, next);
            }
            Err(e) => {
                // The read failed; the notice stays queued and is evaluated again.
                tracing::warn!(entity = id, error = %e, "cannot read successors");
                self.release(id);
            }
        }
    }

    pub(super) fn spawn_action(&mut self, id: i64, action: Arc<Action>, item: Option<InboxItem>) {
        let now = self.clock.now_ms();
        let slot = self.held.get_mut(&id).expect("held entity");
        let machine = slot.held.machine.name().clone();
        let handler = self.registry.handler(&machine, &action.name).expect("run step has a handler").clone();
        let e = &slot.held.entity;
        let locks = Arc::new(Mutex::new(Vec::new()));
        let ctx = ActionContext {
            machine: e.machine.clone(),
            key: e.key.clone(),
            entity_id: e.id,
            state: e.state.clone(),
            action: action.name.clone(),
            properties: e.properties.clone(),
            version: e.version,
            retry: e.retry,
            event: item.as_ref().map(|i| i.event.clone()),
            trigger: slot.held.runs_for(item.as_ref()).0.cloned(),
            params: slot.held.runs_for(item.as_ref()).1.clone(),
            request_id: item.as_ref().and_then(|i| i.request_id.clone()).or_else(|| e.request_id.clone()),
            nested: self.nested.clone(),
            locks: locks.clone(),
        };
        let version = e.version;
        // operation → event → action: the request id ties the spans together.
        let span = tracing::info_span!(
            "action",
            request_id = ctx.request_id.as_deref().unwrap_or(""),
            machine = %ctx.machine,
            key = %ctx.key,
            state = %ctx.state,
            action = %ctx.action,
            event = ctx.event.as_deref().unwrap_or(""),
        );
        slot.running = Some(Running::Action { action, item, locks, started: now });
        // Poll once in place: an action that completes at once (a no-op, a cache hit)
        // commits in this round instead of a task and a message later.
        let mut fut = CatchUnwind(tracing::Instrument::instrument(handler(ctx), span));
        let waker = std::task::Waker::noop();
        if let std::task::Poll::Ready(result) =
            std::pin::Pin::new(&mut fut).poll(&mut std::task::Context::from_waker(waker))
        {
            self.on_action_done(id, version, FaultError::of_handler(result));
            return;
        }
        let tx = self.tx.clone();
        let task = self.next_task();
        tokio::spawn(async move {
            let result = FaultError::of_handler(fut.await);
            let _ = tx.send(Msg::ActionDone { entity_id: id, version, task, result });
        });
    }

    pub(super) fn on_action_done(
        &mut self,
        id: i64,
        version: i64,
        result: std::result::Result<crate::Outcome, FaultError>,
    ) {
        let env = decide_env!(self);
        let Some(slot) = self.held.get_mut(&id) else { return };
        if slot.held.entity.version != version {
            return;
        }
        let Some(Running::Action { action, item, locks, started }) = slot.running.take() else { return };
        let seconds = (env.now - started) as f64 / 1000.0;
        crate::metrics::action_seconds(&slot.held.entity.machine, &action.name, seconds);
        let locks = std::mem::take(&mut *locks.lock().expect("locks"));
        let next = decide::action_done(&mut slot.held, &action, item, result, locks, started, &env);
        self.carry_out(id, next);
    }

    /// Runs a transition's entry and exit actions in order on a task: declarative ones are
    /// applied there, handlers are awaited one after another, each seeing the properties
    /// as the ones before left them. Their effects join the transition's outcome.
    pub(super) fn spawn_hooks(&mut self, id: i64, mut hooks: Hooks) {
        let slot = self.held.get_mut(&id).expect("held entity");
        slot.running = Some(Running::Hooks);
        let entity = slot.held.entity.clone();
        let (trigger, params) = slot.held.runs_for(hooks.item.as_ref());
        let runs_for = (trigger.cloned(), params.clone());
        let (registry, nested, tx) = (self.registry.clone(), self.nested.clone(), self.tx.clone());
        let task = self.next_task();
        tokio::spawn(async move {
            let result = run_hooks(&registry, nested, (&entity, runs_for), &mut hooks).await;
            let _ = tx.send(Msg::HooksDone {
                entity_id: id,
                version: entity.version,
                task,
                hooks: Box::new(hooks),
                result,
            });
        });
    }

    pub(super) fn on_hooks_done(
        &mut self,
        id: i64,
        version: i64,
        hooks: Hooks,
        result: std::result::Result<crate::Outcome, FaultError>,
    ) {
        let env = decide_env!(self);
        let Some(slot) = self.held.get_mut(&id) else { return };
        if slot.held.entity.version != version || !matches!(slot.running, Some(Running::Hooks)) {
            return;
        }
        slot.running = None;
        let d = decide::hooks_done(&mut slot.held, hooks, result, &env);
        self.push(d);
    }
}

/// Runs the hooks of `hooks` (see [`Scheduler::spawn_hooks`]) for `entity`; answers the
/// main outcome with their effects added, or the fault of the first that failed (naming
/// it). What they read with lock joins the transition's preconditions. They run for the
/// event `trigger` with `params` ([`decide::Held::runs_for`]).
async fn run_hooks(
    registry: &Registry,
    nested: Arc<dyn Nested>,
    (entity, (trigger, params)): (&settle_store::EntityRow, (Option<settle_core::EventName>, Value)),
    hooks: &mut Hooks,
) -> std::result::Result<crate::Outcome, FaultError> {
    let mut outcome = std::mem::take(&mut hooks.outcome);
    // Exits' effects, then the action's own, then entries' (SCXML's order): exit actions
    // see the properties before the action's changes, entry actions after them.
    let mut own = outcome.take_effects();
    let item = hooks.item.clone();
    for step in decide::in_order(&hooks.run) {
        let Some(hook) = step else {
            let own = std::mem::take(&mut own);
            decide::own_effects(&mut outcome, own, &hooks.action, hooks.started, entity, &params)
                .map_err(|(field, why)| FaultError::new("refused", format!("{field}: {why}")))?;
            continue;
        };
        let what = if hook.exit { "exit" } else { "entry" };
        let name = format!("{what} action `{}` of state `{}`", hook.action.name, hook.state);
        if hook.action.is_declarative() {
            decide::declare(&hook.action, &mut outcome, entity, &params)
                .map_err(|(field, why)| FaultError::new("refused", format!("{name}: {field}: {why}")))?;
            continue;
        }
        let Some(handler) = registry.handler(&entity.machine, &hook.action.name) else {
            return Err(FaultError::new("refused", format!("{name}: no handler bound")));
        };
        let mut properties = entity.properties.clone();
        settle_core::step::apply_changes(&mut properties, &outcome.decided.changes);
        let locks = Arc::new(Mutex::new(Vec::new()));
        let ctx = ActionContext {
            machine: entity.machine.clone(),
            key: entity.key.clone(),
            entity_id: entity.id,
            state: hook.state.clone(),
            action: hook.action.name.clone(),
            properties,
            version: entity.version,
            retry: entity.retry,
            event: item.as_ref().map(|i| i.event.clone()),
            trigger: trigger.clone(),
            params: params.clone(),
            request_id: item.as_ref().and_then(|i| i.request_id.clone()).or_else(|| entity.request_id.clone()),
            nested: nested.clone(),
            locks: locks.clone(),
        };
        let result = FaultError::of_handler(CatchUnwind(handler(ctx)).await);
        hooks.locks.extend(std::mem::take(&mut *locks.lock().expect("locks")));
        match result {
            Ok(effects) => {
                let beyond = settle_core::step::beyond_declaration(&hook.action, &effects.decided);
                if let Some((field, why)) = beyond.or_else(|| settle_core::step::engine_property(&effects.decided)) {
                    return Err(FaultError::new("refused", format!("{name}: {field}: {why}")));
                }
                outcome.absorb(effects).map_err(|e| FaultError::new("refused", format!("{name} {e}")))?
            }
            Err(mut fault) => {
                fault.details = format!("{name}: {}", fault.details);
                return Err(fault);
            }
        }
    }
    Ok(outcome)
}
