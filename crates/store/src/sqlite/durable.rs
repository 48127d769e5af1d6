//! Making the writer's commits durable on a thread of their own.
//!
//! The write connection runs with `synchronous = NORMAL`: a commit appends its pages to the
//! write-ahead log and returns without syncing it. This thread syncs the log after each
//! job of the writer that committed, one sync for every commit made since the last, and
//! the job is answered only then ([`Syncer::until`]): a caller still hears back only once
//! what it asked for is on disk, but the writer goes on to the next batch while the last
//! one syncs. SQLite keeps its own order of syncs around checkpoints in this mode (the log
//! before pages are copied from it, the database file after), so the file stays whole
//! after a power loss; what the log held beyond its last sync is then lost, and nothing of
//! it was answered.
//!
//! A commit is visible to readers once it returns, before its sync. So that nothing is
//! read that a power loss could take back, every read of the store waits, after it ran,
//! until every commit that may be in its snapshot is durable ([`Syncer::begun`] is counted
//! by a commit hook before each commit of the writer becomes visible). The wait is at
//! most the writer's current batch and one sync. (Another process reading the file
//! directly may see a commit up to that long before it is durable.)

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use rusqlite::{Connection, OpenFlags};

use super::db_err;
use crate::connections::WriterThread;
use crate::{Error, Result};

/// What the thread has made durable: every commit counted up to `upto`, unless a sync failed.
#[derive(Clone, Debug, Default)]
struct Durable {
    upto: u64,
    failed: Option<Arc<str>>,
}

struct Shared {
    /// Held by a test to keep the thread from syncing.
    #[cfg(test)]
    gate: Mutex<()>,
    /// Commits of the writer that began (counted before each becomes visible).
    begun: AtomicU64,
    /// Commits the writer finished and asks to sync, and whether to stop.
    asked: Mutex<(u64, bool)>,
    wake: Condvar,
    durable: tokio::sync::watch::Sender<Durable>,
}

/// The sync thread of a SQLite store's write-ahead log. Dropping it syncs what was asked
/// and stops the thread.
pub(crate) struct Syncer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Syncer {
    /// Counts the commits of `writer` (a commit hook) and starts the thread that syncs the
    /// log of the database at `path`.
    pub(crate) fn start(path: &Path, writer: &rusqlite::Connection) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            #[cfg(test)]
            gate: Mutex::new(()),
            begun: AtomicU64::new(0),
            asked: Mutex::new((0, false)),
            wake: Condvar::new(),
            durable: tokio::sync::watch::Sender::new(Durable::default()),
        });
        let counted = shared.clone();
        writer
            .commit_hook(Some(move || {
                counted.begun.fetch_add(1, Ordering::SeqCst);
                false
            }))
            .map_err(std::io::Error::other)?;
        let mut log = Log::open(path)?;
        let on_thread = shared.clone();
        let thread = std::thread::Builder::new().name("settle-sqlite-sync".into()).spawn(move || {
            let shared = on_thread;
            loop {
                let target = {
                    let mut asked = shared.asked.lock().unwrap_or_else(|p| p.into_inner());
                    loop {
                        let done = shared.durable.borrow().upto;
                        if asked.0 > done {
                            break asked.0;
                        }
                        if asked.1 {
                            return;
                        }
                        asked = shared.wake.wait(asked).unwrap_or_else(|p| p.into_inner());
                    }
                };
                #[cfg(test)]
                let _gate = shared.gate.lock().unwrap_or_else(|p| p.into_inner());
                match log.sync() {
                    Ok(()) => shared.durable.send_modify(|d| d.upto = d.upto.max(target)),
                    Err(e) => {
                        // The log's state on disk is unknown: nothing from now on is answered.
                        let message = format!("cannot sync the SQLite log `{}`: {e}", log.path.display());
                        tracing::error!("{message}");
                        shared.durable.send_modify(|d| d.failed = Some(message.into()));
                        return;
                    }
                }
            }
        })?;
        Ok(Syncer { shared, thread: Some(thread) })
    }

    /// The commits of the writer so far (call on the writer's thread after a job: it asks
    /// the thread to sync them).
    pub(crate) fn finished(&self) -> u64 {
        let seq = self.shared.begun.load(Ordering::SeqCst);
        if seq > self.shared.durable.borrow().upto {
            let mut asked = self.shared.asked.lock().unwrap_or_else(|p| p.into_inner());
            if seq > asked.0 {
                asked.0 = seq;
                self.shared.wake.notify_one();
            }
        }
        seq
    }

    /// The commits of the writer that began so far: all that a read finished now can have
    /// seen.
    pub(crate) fn begun(&self) -> u64 {
        self.shared.begun.load(Ordering::SeqCst)
    }

    /// Why a sync failed, if one did.
    pub(crate) fn failed(&self) -> Option<Arc<str>> {
        self.shared.durable.borrow().failed.clone()
    }

    /// What waits until the first `seq` commits are durable; `None` if they are already.
    pub(crate) fn until(&self, seq: u64) -> Option<crate::Durability> {
        if self.shared.durable.borrow().upto >= seq {
            return None;
        }
        let mut rx = self.shared.durable.subscribe();
        Some(Box::pin(async move {
            let d = rx.wait_for(|d| d.upto >= seq || d.failed.is_some()).await.map_err(|_| Error::Closed)?;
            match &d.failed {
                Some(m) if d.upto < seq => Err(Error::Db(m.to_string())),
                _ => Ok(()),
            }
        }))
    }
}

#[cfg(test)]
impl Syncer {
    /// Keeps the thread from syncing while the guard lives.
    fn hold(&self) -> std::sync::MutexGuard<'_, ()> {
        self.shared.gate.lock().unwrap()
    }
}

impl Drop for Syncer {
    fn drop(&mut self) {
        self.shared.asked.lock().unwrap_or_else(|p| p.into_inner()).1 = true;
        self.shared.wake.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The store's connections, answering once what they committed or may have seen is durable.
impl super::SqliteStore {
    /// Runs `f` on the writer's connection; answers once what it committed is durable.
    pub(super) async fn on_writer<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let (out, durable) = self.on_writer_committed(f).await?;
        settled(durable).await?;
        out
    }

    /// Runs `f` on the writer's connection; answers once it returns, with what makes the
    /// commits it made durable.
    pub(super) async fn on_writer_committed<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    ) -> Result<(Result<T>, Option<crate::Durability>)> {
        let checkpoints = self.inner.checkpoints.clone();
        let syncer = self.inner.syncer.clone();
        let (out, seq) = WriterThread::run_on(self.inner.writer.as_ref(), move |conn| {
            let out = f(conn);
            if let Some(c) = &checkpoints {
                c.after_write(conn);
            }
            Ok((out, syncer.as_ref().map_or(0, |s| s.finished())))
        })
        .await?;
        let syncer = self.inner.syncer.as_ref();
        // Once a sync failed nothing is made durable: every write is an error.
        if let Some(m) = syncer.and_then(|s| s.failed()) {
            return Err(Error::Db(m.to_string()));
        }
        Ok((out, syncer.and_then(|s| s.until(seq))))
    }

    /// A pooled read connection, or a new one.
    pub(super) fn reader(&self) -> Result<Connection> {
        if let Some(c) = self.inner.readers.take() {
            return Ok(c);
        }
        let conn = Connection::open_with_flags(
            &self.inner.path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI,
        )
        .map_err(|e| Error::Open { path: self.inner.path.display().to_string(), message: e.to_string() })?;
        conn.execute_batch("PRAGMA busy_timeout = 5000; PRAGMA query_only = 1;").map_err(db_err)?;
        Ok(conn)
    }

    /// Runs `f` on a read connection, on a blocking thread; answers once every commit it
    /// may have seen is durable.
    pub(super) async fn on_reader<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let this = self.clone();
        let (out, seen) = self
            .inner
            .readers
            .run(move || {
                let conn = this.reader()?;
                let out = f(&conn);
                this.inner.readers.put(conn);
                Ok((out, this.inner.syncer.as_ref().map_or(0, |s| s.begun())))
            })
            .await?;
        settled(self.inner.syncer.as_ref().and_then(|s| s.until(seen))).await?;
        out
    }
}

/// Waits until what `durable` waits for is durable, if anything.
pub(super) async fn settled(durable: Option<crate::Durability>) -> Result<()> {
    match durable {
        Some(d) => d.await,
        None => Ok(()),
    }
}

/// The database's write-ahead log file, opened to be synced.
struct Log {
    path: PathBuf,
    file: Option<std::fs::File>,
}

impl Log {
    fn open(db: &Path) -> std::io::Result<Log> {
        let mut name = db.as_os_str().to_owned();
        name.push("-wal");
        let mut log = Log { path: PathBuf::from(name), file: None };
        log.reopen()?;
        Ok(log)
    }

    /// Opens the log file, and syncs the directory holding it: its name is durable too.
    fn reopen(&mut self) -> std::io::Result<()> {
        self.file = Some(std::fs::OpenOptions::new().read(true).write(true).open(&self.path)?);
        #[cfg(unix)]
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    }

    /// Syncs the log, reopening it first if the file at its path is not the one open (the
    /// writer's connection keeps the log, so this is a guard, not a path taken).
    fn sync(&mut self) -> std::io::Result<()> {
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            let on_disk = std::fs::metadata(&self.path)?;
            let open = self.file.as_ref().map(|f| f.metadata()).transpose()?;
            if open.is_none_or(|m| (m.dev(), m.ino()) != (on_disk.dev(), on_disk.ino())) {
                self.reopen()?;
            }
        }
        self.file.as_ref().expect("opened above").sync_all()
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::time::Duration;

    use super::*;
    use crate::{Batch, Op, SqliteStore, Store};

    fn create(key: &str) -> Batch {
        Batch { now: 1, ops: vec![Op::Create(crate::conformance::entity(key, "idle"))], claim: None }
    }

    /// Whether `f` is still waiting after a while (it must not finish: a broken wait would
    /// finish at once, so this cannot pass by luck where the wait is missing).
    async fn still_waiting<F: Future>(f: F) -> bool {
        tokio::time::timeout(Duration::from_millis(100), f).await.is_err()
    }

    /// A committed batch is visible in the file at once, but neither its writer nor a read
    /// of the store answers before the log is synced: what a caller hears of, and what the
    /// store's reads show, survives a power loss.
    #[tokio::test]
    // The guard that holds the sync thread back is meant to live across the awaits.
    #[allow(clippy::await_holding_lock)]
    async fn nothing_is_answered_or_read_before_its_commit_is_synced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let store = SqliteStore::open(&path).unwrap();
        let syncer = store.inner.syncer.clone().unwrap();
        let hold = syncer.hold();
        let (result, durable) = store.write_committed(create("a")).await.unwrap();
        assert!(result.results[0].is_ok());
        let durable = durable.expect("a commit not synced yet");
        // Another connection sees the row: it is committed.
        let raw = rusqlite::Connection::open(&path).unwrap();
        let n: i64 = raw.query_row("SELECT count(*) FROM entities", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 1);
        // The store's own read waits, as does a write (it answers once durable).
        let read = tokio::spawn({
            let store = store.clone();
            async move { store.entity_get("m", "a").await }
        });
        let write = tokio::spawn({
            let store = store.clone();
            async move { store.write(create("b")).await }
        });
        let mut durable = durable;
        assert!(still_waiting(&mut durable).await, "durable before the sync");
        assert!(!read.is_finished() && !write.is_finished());
        drop(hold);
        durable.await.unwrap();
        assert_eq!(read.await.unwrap().unwrap().unwrap().key.as_str(), "a");
        assert!(write.await.unwrap().unwrap().results[0].is_ok());
        // Synced: nothing waits.
        assert!(syncer.until(syncer.begun()).is_none());
    }

    /// A sync that fails fails the write waiting for it, and every write after it (nothing
    /// could be made durable any more), with the reason.
    #[cfg(unix)]
    #[tokio::test]
    async fn a_failed_sync_fails_its_write_and_every_write_after() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let store = SqliteStore::open(&path).unwrap();
        store.write(create("a")).await.unwrap();
        // SQLite keeps writing its open log; the sync thread finds a directory at its path.
        let wal = dir.path().join("s.db-wal");
        std::fs::remove_file(&wal).unwrap();
        std::fs::create_dir(&wal).unwrap();
        let err = store.write(create("b")).await.unwrap_err().to_string();
        assert!(err.contains("cannot sync the SQLite log"), "{err}");
        let err = store.write(create("c")).await.unwrap_err().to_string();
        assert!(err.contains("cannot sync the SQLite log"), "{err}");
        let err = store.meta_put("k", "v").await.unwrap_err().to_string();
        assert!(err.contains("cannot sync the SQLite log"), "{err}");
        // An engine is not handed a commit to act on either.
        let err = store.write_committed(create("d")).await.err().expect("an error").to_string();
        assert!(err.contains("cannot sync the SQLite log"), "{err}");
    }

    /// The log is synced through the file at its path: if another file took its place, it
    /// is opened again before the sync.
    #[cfg(unix)]
    #[test]
    fn the_log_is_reopened_if_its_file_was_replaced() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("s.db");
        let wal = dir.path().join("s.db-wal");
        std::fs::write(&wal, b"old").unwrap();
        let mut log = Log::open(&db).unwrap();
        let other = dir.path().join("other");
        std::fs::write(&other, b"new").unwrap();
        std::fs::rename(&other, &wal).unwrap();
        log.sync().unwrap();
        let open = log.file.as_ref().unwrap().metadata().unwrap();
        assert_eq!(open.ino(), std::fs::metadata(&wal).unwrap().ino());
    }
}
