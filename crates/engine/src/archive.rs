//! The archive of what retention removes, when asked for ([`ArchiveConfig`], a machine's
//! `[retention] archive`): before a round removes entities of a machine that archives, each
//! is written as one JSON object on one line — the entity with its history, processed
//! events and errors — to a file of the archive directory, and the file is synced to disk;
//! only then is the round that deletes them written. A crash between the two leaves them in
//! the store, so a later round writes them again: the archive may hold an entity twice,
//! never lose one. Files are rotated by size and never appended to by another process: a
//! process starts a new file on its first write (and after a failed write), so a line cut
//! short by a crash is the last of its file and the entity it began follows whole, later.
//!
//! A line: `{"machine", "key", "id", "state", "ended_at", "archived_at", "run_status",
//! "version", "created_at", "entered_at", "machine_hash", "properties", "history": [...],
//! "events": [...], "errors": [...]}` (times in milliseconds since the epoch).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use settle_store::{EntityRow, ErrorRow, EventRow, HistoryRow, Millis, PrunedEntity, Store};

use crate::error::{Error, Result};

/// Where and how the deployment archives what retention removes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveConfig {
    /// The directory of the archive files (created when missing).
    pub dir: PathBuf,
    /// A file reaching this size is closed and the next write starts a new one.
    pub rotate_bytes: u64,
}

impl ArchiveConfig {
    /// Files rotated at 64 MiB unless told otherwise.
    pub const ROTATE_BYTES: u64 = 64 << 20;

    /// An archive in `dir`, rotated at [`ArchiveConfig::ROTATE_BYTES`].
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        ArchiveConfig { dir: dir.into(), rotate_bytes: Self::ROTATE_BYTES }
    }
}

/// The file being written.
struct Open {
    file: File,
    bytes: u64,
}

/// The archive's writer: one per engine, shared by the periodic job and on-demand rounds.
pub(crate) struct Archive {
    config: ArchiveConfig,
    open: Mutex<Option<Open>>,
}

/// An engine's archive, if it has one.
pub(crate) type Shared = Option<Arc<Archive>>;

impl Archive {
    pub(crate) fn new(config: ArchiveConfig) -> Arc<Self> {
        Arc::new(Archive { config, open: Mutex::new(None) })
    }

    /// The directory written to.
    pub(crate) fn dir(&self) -> &Path {
        &self.config.dir
    }

    /// Appends `lines` to the current file (a new one when there is none or it is full)
    /// and syncs them to disk. After a failure the next write starts a new file.
    pub(crate) fn append(&self, lines: &[String]) -> std::io::Result<()> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let result = self.append_to(&mut open, lines);
        if result.is_err() {
            *open = None;
        }
        result
    }

    fn append_to(&self, open: &mut Option<Open>, lines: &[String]) -> std::io::Result<()> {
        if open.as_ref().is_none_or(|o| o.bytes >= self.config.rotate_bytes) {
            *open = Some(self.create()?);
        }
        let o = open.as_mut().expect("a file was just opened");
        let mut buf = String::with_capacity(lines.iter().map(|l| l.len() + 1).sum());
        for line in lines {
            buf.push_str(line);
            buf.push('\n');
        }
        o.file.write_all(buf.as_bytes())?;
        o.file.sync_data()?;
        o.bytes += buf.len() as u64;
        Ok(())
    }

    /// A new file, named so that names sort in the order they were created, with its
    /// directory entry synced.
    fn create(&self) -> std::io::Result<Open> {
        std::fs::create_dir_all(&self.config.dir)?;
        let path = self.config.dir.join(format!("settle-archive-{}.jsonl", uuid::Uuid::now_v7().simple()));
        let file = OpenOptions::new().create_new(true).append(true).open(&path)?;
        #[cfg(unix)]
        File::open(&self.config.dir)?.sync_all()?;
        Ok(Open { file, bytes: 0 })
    }
}

/// Writes `entities` (those of a round about to remove them) to `archive`, each with its
/// history, events and errors read from `store`, and syncs the file. An entity already gone
/// (another instance removed it) is left out.
pub(crate) async fn write<S: Store>(
    store: &S,
    archive: &Arc<Archive>,
    entities: &[PrunedEntity],
    now: Millis,
) -> Result<usize> {
    if entities.is_empty() {
        return Ok(0);
    }
    let ended: std::collections::HashMap<i64, Millis> = entities.iter().map(|e| (e.id, e.ended_at)).collect();
    let rows = store.entities_by_id(entities.iter().map(|e| e.id).collect()).await?;
    let mut lines = Vec::with_capacity(rows.len());
    for e in &rows {
        let history = store.history_list(e.id).await?;
        let events = store.events_list(e.id).await?;
        let mut errors = store.error_list(e.id, i64::MAX as u64).await?;
        errors.reverse();
        lines.push(record(e, ended.get(&e.id).copied(), &history, &events, &errors, now).to_string());
    }
    let n = lines.len();
    let writer = archive.clone();
    let written = tokio::task::spawn_blocking(move || writer.append(&lines)).await;
    let failed = |message: String| Error::Archive { dir: archive.dir().to_path_buf(), message };
    match written {
        Ok(Ok(())) => {
            crate::metrics::archived(n);
            Ok(n)
        }
        Ok(Err(e)) => Err(failed(e.to_string())),
        Err(e) => Err(failed(e.to_string())),
    }
}

/// One entity's line of the archive.
pub(crate) fn record(
    e: &EntityRow,
    ended_at: Option<Millis>,
    history: &[HistoryRow],
    events: &[EventRow],
    errors: &[ErrorRow],
    archived_at: Millis,
) -> Value {
    json!({
        "machine": e.machine.as_str(),
        "key": e.key.as_str(),
        "id": e.id,
        "state": e.state.as_str(),
        "ended_at": ended_at,
        "archived_at": archived_at,
        "run_status": e.run_status.as_str(),
        "version": e.version,
        "created_at": e.created_at,
        "entered_at": e.entered_at,
        "machine_hash": e.machine_hash,
        "properties": e.properties,
        "history": history.iter().map(|h| json!({
            "id": h.id,
            "from": h.from.as_deref(),
            "to": h.to.as_deref(),
            "kind": h.kind.as_str(),
            "action": h.action.as_deref(),
            "event": h.event.as_deref(),
            "retry": h.retry,
            "request_id": h.request_id,
            "at": h.at,
            "detail": h.detail,
        })).collect::<Vec<_>>(),
        "events": events.iter().map(|v| json!({
            "id": v.id,
            "event": v.event.as_str(),
            "kind": v.kind,
            "request_id": v.request_id,
            "start_state": v.start_state.as_str(),
            "end_state": v.end_state.as_deref(),
            "entered": v.entered.as_deref(),
            "start_time": v.start_time,
            "end_time": v.end_time,
            "rejected": v.rejected,
            "failed": v.failed,
            "error": v.error,
            "exception": v.exception,
            "reason": v.reason,
        })).collect::<Vec<_>>(),
        "errors": errors.iter().map(|r| json!({
            "id": r.id,
            "at": r.at,
            "kind": r.kind,
            "details": r.details,
            "request_id": r.request_id,
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines_in(dir: &Path) -> Vec<(String, String)> {
        let mut files: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
        files.sort();
        files
            .iter()
            .flat_map(|f| {
                let name = f.file_name().unwrap().to_string_lossy().to_string();
                std::fs::read_to_string(f)
                    .unwrap()
                    .lines()
                    .map(move |l| (name.clone(), l.to_string()))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    #[test]
    fn lines_go_to_one_file_until_it_is_full_then_to_a_new_one() {
        let dir = tempfile::tempdir().unwrap();
        let a = Archive::new(ArchiveConfig { dir: dir.path().join("archive"), rotate_bytes: 10 });
        a.append(&["one".into(), "two".into()]).unwrap();
        a.append(&["three".into()]).unwrap();
        a.append(&["four".into()]).unwrap();
        let got = lines_in(&dir.path().join("archive"));
        let texts: Vec<&str> = got.iter().map(|(_, l)| l.as_str()).collect();
        assert_eq!(texts, ["one", "two", "three", "four"]);
        // "one\ntwo\n" is 8 bytes: "three" still fits that file; then it is full.
        assert_eq!(got[0].0, got[2].0);
        assert_ne!(got[2].0, got[3].0);
        assert!(got.iter().all(|(f, _)| f.starts_with("settle-archive-") && f.ends_with(".jsonl")));
    }

    #[test]
    fn a_failed_write_is_an_error_and_the_next_starts_a_new_file() {
        let dir = tempfile::tempdir().unwrap();
        let blocked = dir.path().join("blocked");
        std::fs::write(&blocked, "a file where the directory should be").unwrap();
        let a = Archive::new(ArchiveConfig::new(&blocked));
        assert!(a.append(&["x".into()]).is_err());
        std::fs::remove_file(&blocked).unwrap();
        a.append(&["y".into()]).unwrap();
        assert_eq!(lines_in(&blocked).len(), 1);
    }
}
