//! Callers waiting for operations to end (`Wait::Operation`). An operation ends when
//! nothing it reached is busy or queued any more; the store ends it in the commit that
//! brings that about, which may be any entity's, of this engine or — on PostgreSQL — of
//! another instance.
//!
//! One task keeps the waiting callers by request id. The scheduler tells it the request ids
//! whose operations its commits may have ended (only while anyone waits); the store's
//! change notifications tell it that another instance committed something. It then reads
//! the operations that may have ended, all of them in one read per round, and answers
//! those that did. A caller's registration is followed by such a read, so an operation
//! that ended before it is answered at once. Nobody polls.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use settle_store::{Changes, OperationRow, Store};
use tokio::sync::{broadcast, mpsc, oneshot};

enum Msg {
    /// A caller waits for the operation `request_id` to end.
    Wait { request_id: String, reply: oneshot::Sender<OperationRow> },
    /// A commit of this engine may have ended the operation.
    Maybe(String),
    /// Something may have ended any operation (an operator command, an agent's report).
    Any,
    /// The engine shuts down: the task lets go of the store, then answers.
    Stop(oneshot::Sender<()>),
}

/// The operation waiters of this engine. Cheap to clone.
#[derive(Clone)]
pub(crate) struct OpWatch {
    tx: mpsc::UnboundedSender<Msg>,
    /// Callers registered and not yet answered (or gone): while 0, nobody is told anything.
    waiting: Arc<AtomicUsize>,
}

impl OpWatch {
    /// Starts the task on `store`. It listens to the store's change notifications only
    /// while someone waits.
    pub(crate) fn start<S: Store>(store: S) -> OpWatch {
        let (tx, rx) = mpsc::unbounded_channel();
        let waiting = Arc::new(AtomicUsize::new(0));
        tokio::spawn(run(store, rx, waiting.clone()));
        OpWatch { tx, waiting }
    }

    /// Whether anyone waits for an operation (the scheduler tells nothing otherwise).
    pub(crate) fn anyone(&self) -> bool {
        self.waiting.load(Ordering::SeqCst) > 0
    }

    /// Waits for the operation `request_id` to end; the receiver errs if the engine stops.
    pub(crate) fn wait(&self, request_id: String) -> oneshot::Receiver<OperationRow> {
        let (reply, rx) = oneshot::channel();
        // Counted before the registration is sent: a commit that lands from now on tells.
        self.waiting.fetch_add(1, Ordering::SeqCst);
        if self.tx.send(Msg::Wait { request_id, reply }).is_err() {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
        }
        rx
    }

    /// A commit that landed may have ended the operation `request_id`.
    pub(crate) fn maybe_ended(&self, request_id: &str) {
        if self.anyone() {
            let _ = self.tx.send(Msg::Maybe(request_id.to_string()));
        }
    }

    /// Something that landed may have ended any operation.
    pub(crate) fn anything(&self) {
        if self.anyone() {
            let _ = self.tx.send(Msg::Any);
        }
    }

    /// Stops the task (its waiting callers get [`Error::Stopped`](crate::Error::Stopped))
    /// and returns once it let go of the store: a SQLite file can be opened again.
    pub(crate) async fn stop(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Msg::Stop(tx)).is_ok() {
            let _ = rx.await;
        }
    }
}

/// The task's state.
#[derive(Default)]
struct State {
    waits: HashMap<String, Vec<oneshot::Sender<OperationRow>>>,
    /// Request ids to read in the next round.
    due: HashSet<String>,
    /// Read every waited operation in the next round.
    all_due: bool,
}

impl State {
    fn on_msg(&mut self, m: Msg) {
        match m {
            Msg::Wait { request_id, reply } => {
                self.due.insert(request_id.clone());
                self.waits.entry(request_id).or_default().push(reply);
            }
            Msg::Maybe(request_id) => {
                if self.waits.contains_key(&request_id) {
                    self.due.insert(request_id);
                }
            }
            Msg::Any => self.all_due = true,
            Msg::Stop(_) => unreachable!("the task stops on it"),
        }
    }

    /// The request ids to read now (forgetting callers that stopped waiting); how many
    /// callers were forgotten.
    fn take_due(&mut self) -> (Vec<String>, usize) {
        let mut gone = 0;
        self.waits.retain(|_, w| {
            let before = w.len();
            w.retain(|tx| !tx.is_closed());
            gone += before - w.len();
            !w.is_empty()
        });
        let ids: Vec<String> = if std::mem::take(&mut self.all_due) {
            self.due.clear();
            self.waits.keys().cloned().collect()
        } else {
            self.due.drain().filter(|r| self.waits.contains_key(r)).collect()
        };
        (ids, gone)
    }

    /// Answers the callers of the operations that ended; how many were answered.
    fn answer(&mut self, ended: Vec<OperationRow>) -> usize {
        let mut answered = 0;
        for op in ended {
            if let Some(callers) = self.waits.remove(&op.request_id) {
                answered += callers.len();
                for tx in callers {
                    let _ = tx.send(op.clone());
                }
            }
        }
        answered
    }
}

async fn run<S: Store>(store: S, rx: mpsc::UnboundedReceiver<Msg>, waiting: Arc<AtomicUsize>) {
    let stopped = watch(&store, rx, &waiting).await;
    drop(store);
    if let Some(tx) = stopped {
        let _ = tx.send(());
    }
}

/// The task's loop, until the engine stops it (the answer to send once the store is let
/// go of) or every handle is gone.
async fn watch<S: Store>(
    store: &S,
    mut rx: mpsc::UnboundedReceiver<Msg>,
    waiting: &AtomicUsize,
) -> Option<oneshot::Sender<()>> {
    let mut st = State::default();
    // Other instances' commits, heard only while someone waits (`None` on a store that
    // nobody else writes to).
    let mut changes: Option<broadcast::Receiver<Changes>> = None;
    let mut retry = false;
    loop {
        tokio::select! {
            c = async { changes.as_mut().expect("guarded").recv().await }, if changes.is_some() => match c {
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => st.all_due = true,
                Err(broadcast::error::RecvError::Closed) => changes = None,
            },
            m = rx.recv() => match m {
                Some(Msg::Stop(tx)) => return Some(tx),
                Some(m) => st.on_msg(m),
                None => return None,
            },
            _ = tokio::time::sleep(Duration::from_millis(200)), if retry => {}
        }
        while let Ok(m) = rx.try_recv() {
            match m {
                Msg::Stop(tx) => return Some(tx),
                m => st.on_msg(m),
            }
        }
        if let Some(c) = changes.as_mut() {
            while let Ok(_) | Err(broadcast::error::TryRecvError::Lagged(_)) = c.try_recv() {
                st.all_due = true;
            }
        }
        if st.waits.is_empty() {
            changes = None;
        } else if changes.is_none() && !store.exclusive() {
            // Listening from now on: what landed before is seen by the read below.
            changes = store.changes();
            st.all_due = true;
        }
        retry = false;
        let (ids, gone) = st.take_due();
        waiting.fetch_sub(gone, Ordering::SeqCst);
        if ids.is_empty() {
            continue;
        }
        match store.operations_ended(ids.clone()).await {
            Ok(ended) => {
                let answered = st.answer(ended);
                waiting.fetch_sub(answered, Ordering::SeqCst);
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the operations callers wait on; trying again");
                st.due.extend(ids);
                retry = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(request_id: &str) -> OperationRow {
        OperationRow { request_id: request_id.into(), outcome: Some("success".into()), ..OperationRow::default() }
    }

    #[test]
    fn a_registration_is_read_at_once_and_only_waited_ids_are_read() {
        let mut st = State::default();
        let (reply, mut rx) = oneshot::channel();
        st.on_msg(Msg::Wait { request_id: "r1".into(), reply });
        st.on_msg(Msg::Maybe("nobody-waits".into()));
        assert_eq!(st.take_due(), (vec!["r1".to_string()], 0));
        assert_eq!(st.take_due(), (vec![], 0), "nothing more to read until told");
        st.on_msg(Msg::Maybe("r1".into()));
        assert_eq!(st.take_due().0, ["r1"]);
        assert_eq!(st.answer(vec![op("other")]), 0, "an operation nobody waits on answers nobody");
        assert!(rx.try_recv().is_err());
        assert_eq!(st.answer(vec![op("r1")]), 1);
        assert_eq!(rx.try_recv().unwrap().request_id, "r1");
        assert!(st.waits.is_empty());
    }

    #[test]
    fn any_change_reads_every_waited_operation_and_gone_callers_are_forgotten() {
        let mut st = State::default();
        let (a, _keep_a) = oneshot::channel();
        let (b, rx_b) = oneshot::channel();
        let (c, _keep_c) = oneshot::channel();
        st.on_msg(Msg::Wait { request_id: "a".into(), reply: a });
        st.on_msg(Msg::Wait { request_id: "b".into(), reply: b });
        st.on_msg(Msg::Wait { request_id: "a".into(), reply: c });
        st.take_due();
        drop(rx_b);
        st.on_msg(Msg::Any);
        let (mut ids, gone) = st.take_due();
        ids.sort();
        assert_eq!((ids, gone), (vec!["a".to_string()], 1), "b's caller left");
        assert_eq!(st.answer(vec![op("a")]), 2, "both callers of a are answered");
    }
}
