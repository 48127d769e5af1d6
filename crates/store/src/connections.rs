//! How both SQL stores hold their connections: one thread owns the write connection and
//! runs the writes one at a time ([`WriterThread`]); reads run on blocking threads with
//! connections kept in a pool ([`ReaderPool`]).

use std::sync::{Arc, Mutex};

use crate::{Error, Result};

type Job<C> = Box<dyn FnOnce(&mut C) + Send>;

/// A thread that owns a backend's write connection (`C`) and runs jobs on it one at a
/// time: the single writer both SQL stores are built around.
pub(crate) struct WriterThread<C> {
    /// The queue of jobs; `None` once [`close`](Self::close)d.
    jobs: Mutex<Option<std::sync::mpsc::Sender<Job<C>>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl<C: 'static> WriterThread<C> {
    /// Starts the thread `name`, moving `conn` onto it.
    pub(crate) fn spawn(name: &str, mut conn: C) -> std::io::Result<Self>
    where
        C: Send,
    {
        let (tx, rx) = std::sync::mpsc::channel::<Job<C>>();
        let thread = std::thread::Builder::new().name(name.into()).spawn(move || {
            while let Ok(job) = rx.recv() {
                job(&mut conn);
            }
        })?;
        Ok(WriterThread { jobs: Mutex::new(Some(tx)), thread: Some(thread) })
    }

    /// Closes the queue and waits until the thread has run what was queued and dropped the
    /// connection (unless called on that thread, which then ends after its current job):
    /// whatever closing the connection does to its files is done when this returns. Jobs
    /// sent after it fail with [`Error::Closed`].
    pub(crate) fn close(&mut self) {
        drop(self.jobs.get_mut().unwrap_or_else(|p| p.into_inner()).take());
        if let Some(thread) = self.thread.take()
            && thread.thread().id() != std::thread::current().id()
        {
            let _ = thread.join();
        }
    }

    /// Runs `f` on the writer's connection and waits for its result.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut C) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job<C> = Box::new(move |conn| {
            let _ = tx.send(f(conn));
        });
        self.jobs
            .lock()
            .expect("writer sender lock")
            .as_ref()
            .ok_or(Error::Closed)?
            .send(job)
            .map_err(|_| Error::Closed)?;
        rx.await.map_err(|_| Error::Closed)?
    }

    /// Runs `f` on the connection of `writer`, if the handle has one: a handle opened
    /// read-only refuses.
    pub(crate) async fn run_on<T: Send + 'static>(
        writer: Option<&Self>,
        f: impl FnOnce(&mut C) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        match writer {
            Some(writer) => writer.run(f).await,
            None => Err(Error::Db("store opened read-only".into())),
        }
    }
}

/// The read connections (`C`) of a handle, kept for the next reader, and one permit per
/// connection: readers beyond the pool wait for a connection rather than open (and set up)
/// a new one each time.
pub(crate) struct ReaderPool<C> {
    idle: Mutex<Vec<C>>,
    slots: Arc<tokio::sync::Semaphore>,
}

impl<C> ReaderPool<C> {
    /// Connections kept, and readers running at once.
    const SIZE: usize = 8;

    pub(crate) fn new() -> Self {
        ReaderPool { idle: Mutex::new(Vec::new()), slots: Arc::new(tokio::sync::Semaphore::new(Self::SIZE)) }
    }

    /// A kept connection, if there is one.
    pub(crate) fn take(&self) -> Option<C> {
        self.idle.lock().expect("reader pool lock").pop()
    }

    /// Keeps `conn` for the next reader, unless the pool is full.
    pub(crate) fn put(&self, conn: C) {
        let mut idle = self.idle.lock().expect("reader pool lock");
        if idle.len() < Self::SIZE {
            idle.push(conn);
        }
    }

    /// Every kept connection, taken out of the pool (to close them).
    pub(crate) fn drain(&mut self) -> Vec<C> {
        std::mem::take(self.idle.get_mut().unwrap_or_else(|p| p.into_inner()))
    }

    /// Runs `read` on a blocking thread once a reader's permit is free.
    pub(crate) async fn run<T: Send + 'static>(&self, read: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
        let permit = self.slots.clone().acquire_owned().await.map_err(|_| Error::Closed)?;
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            read()
        })
        .await
        .map_err(|e| Error::Db(format!("reader task failed: {e}")))?
    }
}
