//! The executor's durable memory of execution tokens (§11.3 rules 5 and 8).
//!
//! A token is recorded as accepted before its tool runs, its result is
//! recorded before its finish is sent, and it is marked final once the
//! server gave a definite answer. What the store holds decides what a
//! delivery may do: a token it already holds never runs again.
//!
//! [`FileTokenStore`] keeps that memory in an append-only file of JSON
//! lines, each write followed by an fsync; [`MemoryTokenStore`] keeps it
//! in memory, for tests.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use chrono::{DateTime, Utc};
use narad_protocol::control::ClientToolExecute;
use narad_protocol::primitives::{
    ClientExecutorId, ExecutionToken, LeaseId, Timestamp, ToolCallId,
};
use serde::{Deserialize, Serialize};

use super::ToolResult;

/// What a `client.tool.execute` said about its token, as recorded when the
/// executor accepts it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AcceptedToken {
    /// The token.
    pub execution_token: ExecutionToken,
    /// The endpoint it was delivered to.
    pub client_executor_id: ClientExecutorId,
    /// The lease it was delivered under; its finish names this lease even
    /// after a reconnect (§11.3 rule 8).
    pub lease_id: LeaseId,
    /// The tool call.
    pub tool_call_id: ToolCallId,
    /// The tool named.
    pub tool_name: String,
    /// When the token lapses.
    pub execution_token_expires_at: Timestamp,
}

impl From<&ClientToolExecute> for AcceptedToken {
    fn from(m: &ClientToolExecute) -> AcceptedToken {
        AcceptedToken {
            execution_token: m.execution_token.clone(),
            client_executor_id: m.client_executor_id.clone(),
            lease_id: m.lease_id.clone(),
            tool_call_id: m.tool_call_id.clone(),
            tool_name: m.tool_name.as_str().to_owned(),
            execution_token_expires_at: m.execution_token_expires_at.clone(),
        }
    }
}

/// A token the store holds, and how far it got.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenEntry {
    /// The delivery that was accepted.
    pub accepted: AcceptedToken,
    /// The tool's result, once recorded.
    pub result: Option<ToolResult>,
    /// Whether the server gave a definite answer to its finish.
    pub is_final: bool,
}

/// Why the store could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Reading, writing or syncing failed.
    #[error("token store I/O: {0}")]
    Io(#[from] io::Error),
    /// A line before the last is not a record: the file is damaged, and
    /// guessing past it could run a tool twice.
    #[error("{path}: line {line} is not a token record: {message}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The 1-based line number.
        line: usize,
        /// What is wrong with it.
        message: String,
    },
    /// The token was never accepted.
    #[error("the token store holds no token {0}")]
    UnknownToken(String),
}

/// Durable memory of execution tokens. Each call returns once what it
/// recorded survives a crash of the process (and, for a file store, of the
/// machine).
pub trait TokenStore: Send + Sync {
    /// Records a delivered token as accepted; `false` when the store
    /// already holds it (nothing is written then).
    fn accept(&self, token: &AcceptedToken) -> Result<bool, StoreError>;
    /// Records the result of an accepted token. A token has one result:
    /// once one is recorded, later ones are ignored.
    fn record_result(&self, token: &ExecutionToken, result: &ToolResult) -> Result<(), StoreError>;
    /// Records that the server gave a definite answer to the token's
    /// finish, so it is never sent again.
    fn mark_final(&self, token: &ExecutionToken) -> Result<(), StoreError>;
    /// What the store holds about a token.
    fn get(&self, token: &ExecutionToken) -> Result<Option<TokenEntry>, StoreError>;
    /// Every token not yet final, in the order accepted.
    fn pending(&self) -> Result<Vec<TokenEntry>, StoreError>;
}

impl<S: TokenStore + ?Sized> TokenStore for Arc<S> {
    fn accept(&self, token: &AcceptedToken) -> Result<bool, StoreError> {
        (**self).accept(token)
    }
    fn record_result(&self, token: &ExecutionToken, result: &ToolResult) -> Result<(), StoreError> {
        (**self).record_result(token, result)
    }
    fn mark_final(&self, token: &ExecutionToken) -> Result<(), StoreError> {
        (**self).mark_final(token)
    }
    fn get(&self, token: &ExecutionToken) -> Result<Option<TokenEntry>, StoreError> {
        (**self).get(token)
    }
    fn pending(&self) -> Result<Vec<TokenEntry>, StoreError> {
        (**self).pending()
    }
}

/// One line of the store file: one change to one token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase", rename_all_fields = "camelCase")]
enum Line {
    Accepted(AcceptedToken),
    Result {
        execution_token: ExecutionToken,
        result: ToolResult,
    },
    Final {
        execution_token: ExecutionToken,
    },
}

/// The tokens as the lines written so far leave them.
#[derive(Debug, Default)]
struct Ledger {
    entries: HashMap<ExecutionToken, (u64, TokenEntry)>,
    next_order: u64,
}

impl Ledger {
    /// The line that `accept` writes, or `None` when the token is known.
    fn accept_line(&self, token: &AcceptedToken) -> Option<Line> {
        (!self.entries.contains_key(&token.execution_token)).then(|| Line::Accepted(token.clone()))
    }

    /// The line that `record_result` writes, or `None` when a result is
    /// already recorded.
    fn result_line(
        &self,
        token: &ExecutionToken,
        result: &ToolResult,
    ) -> Result<Option<Line>, StoreError> {
        let (_, entry) = self.known(token)?;
        Ok(entry.result.is_none().then(|| Line::Result {
            execution_token: token.clone(),
            result: result.clone(),
        }))
    }

    /// The line that `mark_final` writes, or `None` when already final.
    fn final_line(&self, token: &ExecutionToken) -> Result<Option<Line>, StoreError> {
        let (_, entry) = self.known(token)?;
        Ok((!entry.is_final).then(|| Line::Final {
            execution_token: token.clone(),
        }))
    }

    fn known(&self, token: &ExecutionToken) -> Result<&(u64, TokenEntry), StoreError> {
        self.entries
            .get(token)
            .ok_or_else(|| StoreError::UnknownToken(token.to_string()))
    }

    /// Applies a line; lines about tokens never accepted change nothing.
    fn apply(&mut self, line: Line) {
        match line {
            Line::Accepted(accepted) => {
                let order = self.next_order;
                self.next_order += 1;
                self.entries
                    .entry(accepted.execution_token.clone())
                    .or_insert_with(|| {
                        (
                            order,
                            TokenEntry {
                                accepted,
                                result: None,
                                is_final: false,
                            },
                        )
                    });
            }
            Line::Result {
                execution_token,
                result,
            } => {
                if let Some((_, e)) = self.entries.get_mut(&execution_token) {
                    e.result.get_or_insert(result);
                }
            }
            Line::Final { execution_token } => {
                if let Some((_, e)) = self.entries.get_mut(&execution_token) {
                    e.is_final = true;
                }
            }
        }
    }

    fn get(&self, token: &ExecutionToken) -> Option<TokenEntry> {
        self.entries.get(token).map(|(_, e)| e.clone())
    }

    fn pending(&self) -> Vec<TokenEntry> {
        let mut pending: Vec<_> = self.entries.values().filter(|(_, e)| !e.is_final).collect();
        pending.sort_by_key(|(order, _)| *order);
        pending.into_iter().map(|(_, e)| e.clone()).collect()
    }

    /// Whether compaction may forget an entry: its finish has a definite
    /// answer and its token has expired, so no delivery of it can be
    /// accepted any more (an expired delivery is refused before the store
    /// is asked), and forgetting it cannot let the tool run twice.
    fn forgettable(entry: &TokenEntry, now: DateTime<Utc>) -> bool {
        entry.is_final && entry.accepted.execution_token_expires_at.to_utc() <= now
    }

    /// The lines that rebuild the entries kept, in acceptance order.
    fn lines_kept(&self, now: DateTime<Utc>) -> (Vec<Line>, Vec<ExecutionToken>) {
        let mut kept: Vec<_> = self.entries.values().collect();
        kept.sort_by_key(|(order, _)| *order);
        let mut lines = Vec::new();
        let mut dropped = Vec::new();
        for (_, e) in kept {
            let token = &e.accepted.execution_token;
            if Ledger::forgettable(e, now) {
                dropped.push(token.clone());
                continue;
            }
            lines.push(Line::Accepted(e.accepted.clone()));
            if let Some(result) = &e.result {
                lines.push(Line::Result {
                    execution_token: token.clone(),
                    result: result.clone(),
                });
            }
            if e.is_final {
                lines.push(Line::Final {
                    execution_token: token.clone(),
                });
            }
        }
        (lines, dropped)
    }
}

/// A store that lives in memory: it survives an executor restart within
/// one process (share it through an `Arc`), not a process restart. For
/// tests.
#[derive(Debug, Default)]
pub struct MemoryTokenStore {
    ledger: Mutex<Ledger>,
}

impl MemoryTokenStore {
    /// An empty store.
    pub fn new() -> MemoryTokenStore {
        MemoryTokenStore::default()
    }

    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl TokenStore for MemoryTokenStore {
    fn accept(&self, token: &AcceptedToken) -> Result<bool, StoreError> {
        let mut ledger = self.ledger();
        let line = ledger.accept_line(token);
        let new = line.is_some();
        line.into_iter().for_each(|l| ledger.apply(l));
        Ok(new)
    }

    fn record_result(&self, token: &ExecutionToken, result: &ToolResult) -> Result<(), StoreError> {
        let mut ledger = self.ledger();
        if let Some(line) = ledger.result_line(token, result)? {
            ledger.apply(line);
        }
        Ok(())
    }

    fn mark_final(&self, token: &ExecutionToken) -> Result<(), StoreError> {
        let mut ledger = self.ledger();
        if let Some(line) = ledger.final_line(token)? {
            ledger.apply(line);
        }
        Ok(())
    }

    fn get(&self, token: &ExecutionToken) -> Result<Option<TokenEntry>, StoreError> {
        Ok(self.ledger().get(token))
    }

    fn pending(&self) -> Result<Vec<TokenEntry>, StoreError> {
        Ok(self.ledger().pending())
    }
}

/// Lines appended between two compactions, by default.
const DEFAULT_COMPACTION_THRESHOLD: usize = 1024;

/// A store in one file of JSON lines, one change per line, appended and
/// fsynced before each call returns.
///
/// Opening replays the file; a torn last line (a crash mid-write) is
/// dropped and cut off, since the call that wrote it never returned. Once
/// enough lines were appended, the file is rewritten without the tokens
/// that are final and expired (to a temporary file, fsynced, renamed over
/// the old one, and the directory fsynced).
#[derive(Debug)]
pub struct FileTokenStore {
    path: PathBuf,
    compact_after: usize,
    inner: Mutex<FileInner>,
}

#[derive(Debug)]
struct FileInner {
    file: File,
    /// The file's length: where the next line starts.
    len: u64,
    ledger: Ledger,
    lines_since_compaction: usize,
}

impl FileTokenStore {
    /// Opens (or creates) the store at `path` and replays it.
    pub fn open(path: impl AsRef<Path>) -> Result<FileTokenStore, StoreError> {
        let path = path.as_ref().to_owned();
        let existed = path.exists();
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&path)?;
        if !existed {
            sync_dir(&path)?;
        }
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let (lines, good_len) = replay(&path, &bytes)?;
        if good_len < bytes.len() as u64 {
            tracing::warn!(
                path = %path.display(),
                dropped_bytes = bytes.len() as u64 - good_len,
                "the token store ends in a torn line; dropping it"
            );
            file.set_len(good_len)?;
            file.sync_data()?;
        }
        let mut ledger = Ledger::default();
        let count = lines.len();
        lines.into_iter().for_each(|l| ledger.apply(l));
        Ok(FileTokenStore {
            path,
            compact_after: DEFAULT_COMPACTION_THRESHOLD,
            inner: Mutex::new(FileInner {
                file,
                len: good_len,
                ledger,
                lines_since_compaction: count,
            }),
        })
    }

    /// Compacts once this many lines were appended since the last
    /// compaction (default 1024).
    pub fn with_compaction_threshold(mut self, lines: usize) -> FileTokenStore {
        self.compact_after = lines.max(1);
        self
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Rewrites the file without the tokens that are final and expired;
    /// returns how many were dropped.
    pub fn compact(&self) -> Result<usize, StoreError> {
        let mut inner = self.inner();
        self.compact_locked(&mut inner, Utc::now())
    }

    fn inner(&self) -> MutexGuard<'_, FileInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn compact_locked(
        &self,
        inner: &mut FileInner,
        now: DateTime<Utc>,
    ) -> Result<usize, StoreError> {
        let (lines, dropped) = inner.ledger.lines_kept(now);
        let mut bytes = Vec::new();
        for line in &lines {
            bytes.extend(encode(line));
        }
        let mut tmp_name = self.path.clone().into_os_string();
        tmp_name.push(".compact");
        let tmp = PathBuf::from(tmp_name);
        {
            let mut f = File::create(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, &self.path)?;
        sync_dir(&self.path)?;
        inner.file = OpenOptions::new()
            .read(true)
            .append(true)
            .open(&self.path)?;
        inner.len = bytes.len() as u64;
        inner.lines_since_compaction = 0;
        for token in &dropped {
            inner.ledger.entries.remove(token);
        }
        tracing::debug!(
            path = %self.path.display(),
            kept = lines.len(),
            dropped = dropped.len(),
            "token store compacted"
        );
        Ok(dropped.len())
    }

    /// Appends one line and syncs it, then applies it.
    fn append(&self, inner: &mut FileInner, line: Line) -> Result<(), StoreError> {
        let bytes = encode(&line);
        let written = inner
            .file
            .write_all(&bytes)
            .and_then(|()| inner.file.sync_data());
        if let Err(e) = written {
            // Cut off what part of the line made it, so the next line does
            // not start in the middle of this one.
            let _ = inner.file.set_len(inner.len);
            return Err(e.into());
        }
        inner.len += bytes.len() as u64;
        inner.lines_since_compaction += 1;
        inner.ledger.apply(line);
        Ok(())
    }
}

impl TokenStore for FileTokenStore {
    fn accept(&self, token: &AcceptedToken) -> Result<bool, StoreError> {
        let mut inner = self.inner();
        match inner.ledger.accept_line(token) {
            Some(line) => self.append(&mut inner, line).map(|()| true),
            None => Ok(false),
        }
    }

    fn record_result(&self, token: &ExecutionToken, result: &ToolResult) -> Result<(), StoreError> {
        let mut inner = self.inner();
        match inner.ledger.result_line(token, result)? {
            Some(line) => self.append(&mut inner, line),
            None => Ok(()),
        }
    }

    fn mark_final(&self, token: &ExecutionToken) -> Result<(), StoreError> {
        let mut inner = self.inner();
        let Some(line) = inner.ledger.final_line(token)? else {
            return Ok(());
        };
        self.append(&mut inner, line)?;
        if inner.lines_since_compaction >= self.compact_after
            && let Err(e) = self.compact_locked(&mut inner, Utc::now())
        {
            // The mark is durable; the old file stays as it was.
            tracing::warn!(path = %self.path.display(), error = %e, "token store compaction failed");
        }
        Ok(())
    }

    fn get(&self, token: &ExecutionToken) -> Result<Option<TokenEntry>, StoreError> {
        Ok(self.inner().ledger.get(token))
    }

    fn pending(&self) -> Result<Vec<TokenEntry>, StoreError> {
        Ok(self.inner().ledger.pending())
    }
}

fn encode(line: &Line) -> Vec<u8> {
    let mut bytes = serde_json::to_vec(line).expect("token records always serialise");
    bytes.push(b'\n');
    bytes
}

/// The records of a store file, and the length of its good part: the
/// file up to its last line that reads as a record. Lines that do not read
/// are tolerated only at the end (a torn write); before a good line they
/// mean the file is damaged.
fn replay(path: &Path, bytes: &[u8]) -> Result<(Vec<Line>, u64), StoreError> {
    let mut lines = Vec::new();
    let mut good_len = 0u64;
    let mut bad: Option<(usize, String)> = None;
    let mut start = 0usize;
    let mut number = 0usize;
    while start < bytes.len() {
        number += 1;
        let (end, next) = match bytes[start..].iter().position(|b| *b == b'\n') {
            Some(n) => (start + n, start + n + 1),
            // No newline: the write that made this line never finished.
            None => (bytes.len(), usize::MAX),
        };
        let text = &bytes[start..end];
        if next == usize::MAX {
            bad.get_or_insert((number, "no end of line".to_owned()));
            break;
        }
        if text.iter().all(u8::is_ascii_whitespace) {
            if bad.is_none() {
                good_len = next as u64;
            }
        } else {
            match serde_json::from_slice::<Line>(text) {
                Ok(line) => {
                    if let Some((line_number, message)) = bad.take() {
                        return Err(StoreError::Corrupt {
                            path: path.to_owned(),
                            line: line_number,
                            message,
                        });
                    }
                    lines.push(line);
                    good_len = next as u64;
                }
                Err(e) => {
                    bad.get_or_insert((number, e.to_string()));
                }
            }
        }
        start = next;
    }
    Ok((lines, good_len))
}

/// Syncs the directory holding `path`, so that a file created or renamed
/// there survives a crash.
fn sync_dir(path: &Path) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use narad_protocol::authority::Outcome;
    use serde_json::json;

    /// A fresh directory under the system's temporary one.
    fn temp_dir(name: &str) -> PathBuf {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_nanos();
        let dir = std::env::temp_dir().join(format!(
            "narad-token-store-{name}-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        dir
    }

    fn token(n: u32, expires_at: &str) -> AcceptedToken {
        AcceptedToken {
            execution_token: ExecutionToken::new(format!("tok-{n}")).unwrap(),
            client_executor_id: ClientExecutorId::new("exec-1").unwrap(),
            lease_id: LeaseId::new("lease-1").unwrap(),
            tool_call_id: ToolCallId::new(format!("tc-{n}")).unwrap(),
            tool_name: "echo".to_owned(),
            execution_token_expires_at: Timestamp::parse(expires_at).unwrap(),
        }
    }

    const FUTURE: &str = "2999-01-01T00:00:00Z";
    const PAST: &str = "2000-01-01T00:00:00Z";

    #[test]
    fn accepted_results_and_finals_survive_reopening() {
        let path = temp_dir("reopen").join("x.tokens");
        let (a, b, c) = (token(1, FUTURE), token(2, FUTURE), token(3, FUTURE));
        {
            let store = FileTokenStore::open(&path).unwrap();
            assert!(store.accept(&a).unwrap());
            assert!(store.accept(&b).unwrap());
            assert!(store.accept(&c).unwrap());
            assert!(!store.accept(&a).unwrap(), "a token is accepted once");
            store
                .record_result(&a.execution_token, &ToolResult::ok(json!({"x": 1})))
                .unwrap();
            store
                .record_result(&b.execution_token, &ToolResult::ok(json!(2)))
                .unwrap();
            store.mark_final(&b.execution_token).unwrap();
        }
        let store = FileTokenStore::open(&path).unwrap();
        assert!(!store.accept(&a).unwrap(), "still known after reopening");
        let a_entry = store.get(&a.execution_token).unwrap().unwrap();
        assert_eq!(a_entry.result, Some(ToolResult::ok(json!({"x": 1}))));
        assert!(!a_entry.is_final);
        assert!(store.get(&b.execution_token).unwrap().unwrap().is_final);
        let pending: Vec<_> = store
            .pending()
            .unwrap()
            .into_iter()
            .map(|e| e.accepted.execution_token)
            .collect();
        assert_eq!(pending, vec![a.execution_token, c.execution_token]);
    }

    #[test]
    fn the_first_result_stays() {
        let store = MemoryTokenStore::new();
        let a = token(1, FUTURE);
        store.accept(&a).unwrap();
        store
            .record_result(&a.execution_token, &ToolResult::ok(json!(1)))
            .unwrap();
        store
            .record_result(&a.execution_token, &ToolResult::error("x", "y"))
            .unwrap();
        let entry = store.get(&a.execution_token).unwrap().unwrap();
        assert_eq!(entry.result.unwrap().outcome, Outcome::Success);
    }

    #[test]
    fn results_for_tokens_never_accepted_are_refused() {
        let store = MemoryTokenStore::new();
        let a = token(1, FUTURE);
        let err = store
            .record_result(&a.execution_token, &ToolResult::ok(json!(1)))
            .unwrap_err();
        assert!(matches!(err, StoreError::UnknownToken(_)));
    }

    #[test]
    fn a_torn_last_line_is_dropped_and_cut_off() {
        let path = temp_dir("torn").join("x.tokens");
        let (a, b) = (token(1, FUTURE), token(2, FUTURE));
        {
            let store = FileTokenStore::open(&path).unwrap();
            store.accept(&a).unwrap();
        }
        let good_len = std::fs::metadata(&path).unwrap().len();
        // A crash in the middle of writing the next line.
        let torn = &encode(&Line::Accepted(b.clone()))[..20];
        OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(torn)
            .unwrap();
        {
            let store = FileTokenStore::open(&path).unwrap();
            assert_eq!(std::fs::metadata(&path).unwrap().len(), good_len);
            assert!(store.get(&a.execution_token).unwrap().is_some());
            assert!(store.get(&b.execution_token).unwrap().is_none());
            // The next line starts on a line of its own.
            assert!(store.accept(&b).unwrap());
        }
        let store = FileTokenStore::open(&path).unwrap();
        assert_eq!(store.pending().unwrap().len(), 2);
    }

    #[test]
    fn a_garbled_last_line_with_its_newline_is_dropped_too() {
        let path = temp_dir("garbled").join("x.tokens");
        let a = token(1, FUTURE);
        FileTokenStore::open(&path).unwrap().accept(&a).unwrap();
        OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"\0\0\0\0\n")
            .unwrap();
        let store = FileTokenStore::open(&path).unwrap();
        assert_eq!(store.pending().unwrap().len(), 1);
    }

    #[test]
    fn damage_before_the_last_line_is_an_error() {
        let path = temp_dir("corrupt").join("x.tokens");
        let (a, b) = (token(1, FUTURE), token(2, FUTURE));
        let mut bytes = encode(&Line::Accepted(a));
        bytes.extend(b"{not json\n");
        bytes.extend(encode(&Line::Accepted(b)));
        std::fs::write(&path, bytes).unwrap();
        let err = FileTokenStore::open(&path).unwrap_err();
        assert!(matches!(err, StoreError::Corrupt { line: 2, .. }), "{err}");
    }

    #[test]
    fn compaction_drops_final_expired_tokens_and_keeps_the_rest() {
        let path = temp_dir("compact").join("x.tokens");
        let final_expired = token(1, PAST);
        let final_live = token(2, FUTURE);
        let resulted = token(3, PAST);
        let accepted = token(4, FUTURE);
        {
            let store = FileTokenStore::open(&path).unwrap();
            for t in [&final_expired, &final_live, &resulted, &accepted] {
                store.accept(t).unwrap();
            }
            for t in [&final_expired, &final_live, &resulted] {
                store
                    .record_result(&t.execution_token, &ToolResult::ok(json!(null)))
                    .unwrap();
            }
            store.mark_final(&final_expired.execution_token).unwrap();
            store.mark_final(&final_live.execution_token).unwrap();
            let before = std::fs::metadata(&path).unwrap().len();
            assert_eq!(store.compact().unwrap(), 1);
            assert!(std::fs::metadata(&path).unwrap().len() < before);
            assert!(store.get(&final_expired.execution_token).unwrap().is_none());
            // Appends go on into the compacted file.
            store.mark_final(&resulted.execution_token).unwrap();
        }
        let store = FileTokenStore::open(&path).unwrap();
        assert!(store.get(&final_expired.execution_token).unwrap().is_none());
        let live = store.get(&final_live.execution_token).unwrap().unwrap();
        assert!(live.is_final, "a final token that has not expired is kept");
        assert!(
            store
                .get(&resulted.execution_token)
                .unwrap()
                .unwrap()
                .is_final
        );
        let accepted_entry = store.get(&accepted.execution_token).unwrap().unwrap();
        assert_eq!(accepted_entry.result, None);
        assert!(!accepted_entry.is_final);
        let mut tmp = path.clone().into_os_string();
        tmp.push(".compact");
        assert!(!PathBuf::from(tmp).exists());
    }

    #[test]
    fn compaction_runs_by_itself_past_the_threshold() {
        let path = temp_dir("auto-compact").join("x.tokens");
        let store = FileTokenStore::open(&path)
            .unwrap()
            .with_compaction_threshold(8);
        for n in 0..20 {
            let t = token(n, PAST);
            store.accept(&t).unwrap();
            store
                .record_result(&t.execution_token, &ToolResult::ok(json!(n)))
                .unwrap();
            store.mark_final(&t.execution_token).unwrap();
        }
        let lines = std::fs::read_to_string(&path).unwrap().lines().count();
        assert!(lines < 8, "the file was compacted ({lines} lines)");
        drop(store);
        let store = FileTokenStore::open(&path).unwrap();
        assert!(store.pending().unwrap().is_empty());
    }
}
