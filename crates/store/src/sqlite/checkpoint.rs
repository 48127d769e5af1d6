//! Checkpoints of the write-ahead log on a thread of their own.
//!
//! By default SQLite checkpoints in the connection that commits: once the log holds 1,000
//! pages, the commit that passes it also copies them into the database file and syncs it.
//! On the engine's file that connection is the writer, so every few hundred batches one
//! batch also waited for the pages of a large, scattered file to be written (the larger the
//! fleet, the more pages a checkpoint touches). Here the writer only reports the log's
//! size after each commit (a WAL hook in place of SQLite's automatic checkpoint), and a
//! thread with a connection of its own copies the pages beside it (`PASSIVE`: it never
//! blocks the writer). The writer wakes it once the log has grown by [`Limits::start`]
//! pages since it last did, not after every commit: each checkpoint syncs the database file
//! and the log, and a page written again meanwhile is copied once.
//!
//! A checkpoint that runs beside a busy writer rarely catches up with it, and SQLite starts
//! the log again from its beginning only when a write begins with every page copied. So
//! the log has a bound: a commit that leaves it at [`Limits::bound`] pages or more is
//! followed by a checkpoint in the writer itself, which first waits for the thread's to end
//! (SQLite refuses a second checkpoint at once rather than waiting for it) and then copies
//! the few pages written since; the next write starts the log again. The writer also
//! checkpoints itself if the thread has failed. A reader's old snapshot can still keep the
//! log from starting again, and it grows meanwhile; its file is cut back to the bound's
//! size once it does (`journal_size_limit`), instead of keeping its largest size.

use std::cell::Cell;
use std::ffi::c_int;
use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use rusqlite::Connection;

/// When the log is checkpointed, in pages it holds after a commit.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// From this many the thread copies them into the database file (SQLite's own default
    /// for the automatic checkpoint), and again each time the log has grown by as many
    /// (on every commit in the last `start` pages before the bound, so that the writer's
    /// checkpoint at the bound finds few pages left to copy).
    pub(crate) start: i64,
    /// From this many the writer checkpoints after its commit.
    pub(crate) bound: i64,
}

impl Limits {
    /// 1,000 pages (4 MB at 4 KiB a page) to start, 8,000 (32 MB) at most.
    pub(crate) const DEFAULT: Limits = Limits { start: 1_000, bound: 8_000 };
}

thread_local! {
    /// The pages in the log after the last commit of a connection with [`on_commit`] as
    /// its WAL hook, on the thread that committed (the writer's; -1: no commit since the
    /// last look).
    static PAGES: Cell<i64> = const { Cell::new(-1) };
}

fn on_commit(_: &rusqlite::hooks::Wal, pages: c_int) -> rusqlite::Result<()> {
    PAGES.set(i64::from(pages));
    Ok(())
}

/// What the thread has done, for the writer and for tests.
#[derive(Default, Debug)]
struct State {
    /// The writer has committed past [`Limits::start`] since the thread last looked.
    due: bool,
    stop: bool,
    /// Checkpoints the thread has run.
    runs: u64,
    /// Checkpoints the writer has run (the bound, or the thread failed).
    writer_runs: u64,
    /// Times the writer woke the thread.
    wakes: u64,
    /// Why the thread stopped checkpointing, if it did.
    failed: Option<String>,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    /// Told after each of the thread's checkpoints.
    ran: Condvar,
    /// Held while a checkpoint runs, by the thread or the writer.
    running: Mutex<()>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The checkpoint thread of a store's writer; dropping it stops the thread and waits for it
/// (a checkpoint under way ends first).
pub(crate) struct Checkpoints {
    shared: Arc<Shared>,
    limits: Limits,
    /// The log's pages when the writer last woke the thread (only the writer uses it).
    woken_at: AtomicI64,
    thread: Option<JoinHandle<()>>,
}

/// The size of a log file of `pages` pages of `page` bytes (a header, and one per page).
fn log_bytes(page: i64, pages: i64) -> i64 {
    pages.saturating_mul(page + 24).saturating_add(32)
}

/// Runs a `PASSIVE` checkpoint on `conn`.
fn checkpoint(conn: &Connection) -> rusqlite::Result<()> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
}

impl Checkpoints {
    /// Starts the thread on a connection of its own to the file at `path`, then makes
    /// `writer` report the log's size after each commit instead of checkpointing itself.
    pub(crate) fn start(path: &Path, writer: &Connection, limits: Limits) -> Result<Checkpoints, String> {
        let conn = Connection::open(path).map_err(|e| format!("cannot open the checkpoint connection: {e}"))?;
        conn.execute_batch("PRAGMA busy_timeout = 5000; PRAGMA synchronous = FULL;")
            .map_err(|e| format!("cannot set up the checkpoint connection: {e}"))?;
        // Past the bound the log only grows while a reader holds an old snapshot; once it
        // starts again, its file is cut back to the bound's size instead of keeping its
        // largest. (A pragma takes no bound parameter; the size is a number computed here.)
        let page: i64 = writer
            .query_row("PRAGMA page_size", [], |r| r.get(0))
            .map_err(|e| format!("cannot read the page size: {e}"))?;
        writer
            .query_row(&format!("PRAGMA journal_size_limit = {}", log_bytes(page, limits.bound)), [], |_| Ok(()))
            .map_err(|e| format!("cannot limit the log's size: {e}"))?;
        let shared = Arc::new(Shared {
            state: Mutex::default(),
            wake: Condvar::new(),
            ran: Condvar::new(),
            running: Mutex::new(()),
        });
        let theirs = shared.clone();
        let thread = std::thread::Builder::new()
            .name("settle-sqlite-checkpoint".into())
            .spawn(move || run(&theirs, &conn))
            .map_err(|e| format!("cannot start the checkpoint thread: {e}"))?;
        // Replaces SQLite's automatic checkpoint, which is a WAL hook too.
        writer.wal_hook(Some(on_commit));
        Ok(Checkpoints { shared, limits, woken_at: AtomicI64::new(0), thread: Some(thread) })
    }

    /// After a job of the writer on `writer`: wakes the thread if the job's commit left the
    /// log at [`Limits::start`] pages or more and grown by as many since the last wake-up
    /// (or within `start` of the bound), or checkpoints in the writer if it left
    /// [`Limits::bound`] or more or the thread has failed.
    pub(crate) fn after_write(&self, writer: &Connection) {
        let pages = PAGES.replace(-1);
        if pages < 0 {
            return;
        }
        // Fewer pages than at the last wake-up: the log has started again.
        let woken_at = self.woken_at.load(Ordering::Relaxed).min(pages);
        self.woken_at.store(woken_at, Ordering::Relaxed);
        let Limits { start, bound } = self.limits;
        if pages < start {
            return;
        }
        let mut state = self.shared.state();
        if pages < bound && state.failed.is_none() {
            if pages - woken_at >= start || pages >= bound.saturating_sub(start) {
                self.woken_at.store(pages, Ordering::Relaxed);
                state.due = true;
                state.wakes += 1;
                drop(state);
                self.shared.wake.notify_one();
            }
            return;
        }
        drop(state);
        let running = self.shared.running.lock().unwrap_or_else(|p| p.into_inner());
        let done = checkpoint(writer);
        drop(running);
        match done {
            Ok(()) => self.shared.state().writer_runs += 1,
            // The next commit tries again; the log keeps every page meanwhile.
            Err(e) => tracing::warn!(error = %e, pages, "the writer's checkpoint of the SQLite log failed"),
        }
    }

    /// Times the writer woke the thread.
    #[cfg(test)]
    fn wakes(&self) -> u64 {
        self.shared.state().wakes
    }

    /// Checkpoints run so far by the thread and by the writer.
    #[cfg(test)]
    fn runs(&self) -> (u64, u64) {
        let state = self.shared.state();
        (state.runs, state.writer_runs)
    }

    /// Waits (a minute at most) until the thread has run a checkpoint.
    #[cfg(test)]
    fn wait_for_thread(&self) {
        let state = self.shared.state();
        let (state, _) = self
            .shared
            .ran
            .wait_timeout_while(state, std::time::Duration::from_secs(60), |s| s.runs == 0 && s.failed.is_none())
            .unwrap();
        assert!(state.runs > 0, "the thread never checkpointed: {state:?}");
    }
}

/// The thread: a checkpoint each time the writer says the log has grown, until stopped.
fn run(shared: &Shared, conn: &Connection) {
    loop {
        {
            let mut state = shared.state();
            while !state.due && !state.stop {
                state = shared.wake.wait(state).unwrap_or_else(|p| p.into_inner());
            }
            if state.stop {
                return;
            }
            state.due = false;
        }
        let running = shared.running.lock().unwrap_or_else(|p| p.into_inner());
        let done = checkpoint(conn);
        drop(running);
        let mut state = shared.state();
        match done {
            Ok(()) => {
                state.runs += 1;
                shared.ran.notify_all();
            }
            Err(e) => {
                tracing::error!(error = %e, "the SQLite checkpoint thread failed; the writer checkpoints from now on");
                state.failed = Some(e.to_string());
                return;
            }
        }
    }
}

impl Drop for Checkpoints {
    fn drop(&mut self) {
        self.shared.state().stop = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file in WAL mode with a table of blobs; answers its writer connection.
    fn file(dir: &tempfile::TempDir) -> (std::path::PathBuf, Connection) {
        let path = dir.path().join("log.db");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE blobs (b BLOB);").unwrap();
        (path, conn)
    }

    /// Commits `n` rows of 20 kB each (five or six pages a commit), each followed by what
    /// the store's writer does after a job; answers the largest size of the log seen.
    fn write(conn: &Connection, c: &Checkpoints, path: &Path, n: usize) -> u64 {
        let wal = path.with_extension("db-wal");
        let mut largest = 0;
        for _ in 0..n {
            conn.execute("INSERT INTO blobs VALUES (randomblob(20000))", []).unwrap();
            c.after_write(conn);
            largest = largest.max(std::fs::metadata(&wal).unwrap().len());
        }
        largest
    }

    /// The log file's size when it holds `pages` pages of 4 KiB.
    fn log_size(pages: i64) -> u64 {
        super::log_bytes(4096, pages) as u64
    }

    /// The largest log file a bound of 64 pages allows: the write that passes it, and one
    /// more if the write after the writer's checkpoint found a read mark locked for a
    /// moment by the thread's checkpoint (SQLite then appends instead of starting again,
    /// and does at the next write). Below what the writer left with its checkpoint not
    /// waiting for the thread's (80 pages and more).
    const BOUND_64: i64 = 64 + 14;

    #[test]
    fn the_thread_copies_the_log_once_it_passes_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let (path, conn) = file(&dir);
        let c = Checkpoints::start(&path, &conn, Limits { start: 16, bound: i64::MAX }).unwrap();
        write(&conn, &c, &path, 100);
        c.wait_for_thread();
        assert_eq!(c.runs().1, 0, "below the bound the writer leaves the log to the thread");
        drop(c);
        // Stopped and joined: the thread's connection is closed, the file reads whole.
        let n: i64 = conn.query_row("SELECT count(*) FROM blobs", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 100);
    }

    /// The writer wakes the thread each time the log has grown by `start` pages (here 16,
    /// of some 550 written in 100 commits), not after every commit past the start. A
    /// reader's snapshot keeps the log from starting again, so that its file's size counts
    /// every page written.
    #[test]
    fn the_thread_is_woken_once_per_start_pages_of_log() {
        let dir = tempfile::tempdir().unwrap();
        let (path, conn) = file(&dir);
        let c = Checkpoints::start(&path, &conn, Limits { start: 16, bound: i64::MAX }).unwrap();
        let reader = Connection::open(&path).unwrap();
        reader.execute_batch("BEGIN").unwrap();
        let _: i64 = reader.query_row("SELECT count(*) FROM blobs", [], |r| r.get(0)).unwrap();
        let bytes = write(&conn, &c, &path, 100) as i64;
        let pages = (bytes - 32) / (4096 + 24);
        let wakes = c.wakes() as i64;
        assert!(pages > 500, "the log holds {pages} pages");
        // Each wake-up follows 16 pages or more, and fewer than 16 plus a commit's (at most 8).
        assert!((pages / 24 - 1..=pages / 16).contains(&wakes), "{wakes} wake-ups for {pages} pages");
        reader.execute_batch("COMMIT").unwrap();
        c.wait_for_thread();
    }

    #[test]
    fn the_writer_bounds_the_log_without_the_thread() {
        let dir = tempfile::tempdir().unwrap();
        let (path, conn) = file(&dir);
        // The thread never wakes: only the writer's checkpoints keep the log short.
        let c = Checkpoints::start(&path, &conn, Limits { start: 64, bound: 64 }).unwrap();
        let largest = write(&conn, &c, &path, 200);
        assert!(largest <= log_size(BOUND_64), "the log grew to {largest} bytes past its bound");
        assert!(c.runs().1 > 0);
        assert_eq!(c.runs().0, 0);
    }

    #[test]
    fn the_writer_bounds_the_log_while_the_thread_checkpoints() {
        let dir = tempfile::tempdir().unwrap();
        let (path, conn) = file(&dir);
        // The thread is woken every 8 pages and on every commit from 56, so the writer's
        // checkpoints at 64 often find one under way: they wait for it rather than being
        // refused.
        let c = Checkpoints::start(&path, &conn, Limits { start: 8, bound: 64 }).unwrap();
        let largest = write(&conn, &c, &path, 400);
        assert!(largest <= log_size(BOUND_64), "the log grew to {largest} bytes past its bound");
        let n: i64 = conn.query_row("SELECT count(*) FROM blobs", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 400);
    }

    #[test]
    fn a_log_that_a_reader_let_grow_is_cut_back_once_it_starts_again() {
        let dir = tempfile::tempdir().unwrap();
        let (path, conn) = file(&dir);
        let c = Checkpoints::start(&path, &conn, Limits { start: 8, bound: 64 }).unwrap();
        write(&conn, &c, &path, 10);
        // A reader's snapshot keeps the log from starting again: it grows past the bound.
        let reader = Connection::open(&path).unwrap();
        reader.execute_batch("BEGIN").unwrap();
        let _: i64 = reader.query_row("SELECT count(*) FROM blobs", [], |r| r.get(0)).unwrap();
        let wal = path.with_extension("db-wal");
        write(&conn, &c, &path, 60);
        let grown = std::fs::metadata(&wal).unwrap().len();
        assert!(grown > log_size(200), "the log did not grow while pinned: {grown} bytes");
        reader.execute_batch("COMMIT").unwrap();
        // The writer's next checkpoint copies it all; the write after starts it again and
        // cuts the file back.
        write(&conn, &c, &path, 3);
        let now = std::fs::metadata(&wal).unwrap().len();
        assert!(now <= log_size(64), "the log file kept {now} bytes (it grew to {grown})");
    }

    #[test]
    fn without_the_hook_sqlite_would_checkpoint_in_the_writer() {
        // The hook replaces SQLite's automatic checkpoint: with neither, the log only grows.
        let dir = tempfile::tempdir().unwrap();
        let (path, conn) = file(&dir);
        let c = Checkpoints::start(&path, &conn, Limits { start: i64::MAX, bound: i64::MAX }).unwrap();
        let largest = write(&conn, &c, &path, 300);
        assert!(largest > log_size(1_000), "the log was checkpointed by someone: {largest} bytes");
        assert_eq!(c.runs(), (0, 0));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_store_checkpoints_beside_its_writer_and_keeps_its_log_short() {
        use crate::Store;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        let store = super::super::SqliteStore::open_with(&path, Limits { start: 8, bound: 64 }).unwrap();
        store.sql_execute("CREATE TABLE blobs (b BLOB)").await.unwrap();
        // The migrations' pages are still in the log (from before the writer's hook): empty
        // it, so that the log file's size shows how long it grows from here.
        let conn = Connection::open(&path).unwrap();
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())).unwrap();
        drop(conn);
        let wal = path.with_extension("db-wal");
        let mut largest = 0;
        for _ in 0..300 {
            store.sql_execute("INSERT INTO blobs VALUES (randomblob(20000))").await.unwrap();
            largest = largest.max(std::fs::metadata(&wal).unwrap().len());
        }
        let c = store.inner.checkpoints.clone().unwrap();
        c.wait_for_thread();
        assert!(largest <= log_size(BOUND_64), "the log grew to {largest} bytes past its bound");
        drop(c);
        drop(store);
        let conn = Connection::open(&path).unwrap();
        let n: i64 = conn.query_row("SELECT count(*) FROM blobs", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 300);
    }
}
