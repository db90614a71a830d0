//! The partition-key mode's last write with a transactional handler: each record's writes
//! committed in one `TransactWriteItems` with the advance of its key's row.
//!
//! Dispatch ran the handler per key and kept each done record's writes; nothing of them is
//! written yet. Here the records with writes are cut into chunks, in the batch's order, under
//! the service's limits (100 actions, 4 MB, no two actions on one item: a record whose writes
//! touch an item already in the chunk ends it). Each key with a record in a chunk has its row
//! in that transaction, conditioned on its `lease_counter` as
//! [`commit_rows`](crate::store::CheckpointStore::commit_rows) conditions it, so the row's
//! update is the transaction's checkpoint action and a concurrent delivery of the key stays
//! fenced. The row moves to the key's last record done before its next record with writes in
//! a later chunk (every field it carries as the plain write computes it), or, in the chunk
//! holding the key's last record with writes, to everything the plain write would give it
//! (failing record, TTL). Several keys share one transaction; the rows take one action
//! each and their bytes. Keys without writes ride in the last chunk while it has room; the rest
//! go out as the plain mode's [`write`](super::commits::write).
//!
//! Each transaction carries a `ClientRequestToken` made from the invocation, the shard, every
//! row with the counter it expects, and the range of records, so a retry after a lost answer
//! (the SDK's, or the one retry here) applies once; another delivery's transaction is fenced by
//! the rows' counters instead, which the one that landed moved.
//!
//! A write refused by its own condition cancels its transaction (nothing of it lands). Its
//! record is that failure, for its key only: counted and, as its
//! [`OnConditionFailed`](crate::effects::OnConditionFailed) says, retried (the key stops
//! there: its later records are not committed and run again) or rejected (dead-lettered, and
//! the key goes on), with a message naming the table, the key and the condition; the chunk is
//! planned again without it, the other keys go on. A row fenced by another delivery drops its
//! key: its records are reported, as when `commit_rows` is refused. A record whose writes and
//! row break a limit on their own can never commit and is rejected the same way.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::commits::{Batch, key_commits_of, write};
use crate::effects::{MAX_ACTIONS, MAX_BYTES, Room, TooLarge, Write, Writes, next_chunk, token};
use crate::engine::attempt::{Failing, Runner};
use crate::engine::batch::Entry;
use crate::engine::keyed::{self, State};
use crate::engine::refused::refusal;
use crate::handler::Handler;
use crate::report::{Disposition, StopReason};
use crate::sequence::Position;
use crate::store::{FailingChange, KeyCommit, RowsTransacted, RowsTransaction};

/// The room a key row's update takes in a transaction: its expressions and values (a failing
/// record's error, up to its cap; a position or two) are bounded well below this.
const ROW_ACTION_BYTES: usize = 16 * 1024;

/// Commits the staged writes with the keys' rows; returns the keys whose rows were not written
/// (fenced, or the store failing), as [`write`] does. `run` learns the records that failed at
/// the commit.
pub(super) async fn commit<H: Handler>(
    runner: &Runner<'_, H>,
    batch: &Batch<'_>,
    run: &mut keyed::Run,
) -> Vec<(String, StopReason)> {
    let mut staged: BTreeMap<Position, Writes> = runner
        .staged
        .map(|staged| {
            std::mem::take(
                &mut *staged
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            )
        })
        .unwrap_or_default();
    let store = runner.settings.store.as_ref();
    let mut progress = Progress::default();
    loop {
        let finals = progress.finals(batch, &run.states);
        let written = written(
            batch,
            &run.states,
            &staged,
            progress.from,
            &progress.settled,
        );
        if written.is_empty() {
            let mut rest: Vec<(String, KeyCommit)> = finals.into_iter().collect();
            rest.sort_by(|a, b| a.0.cmp(&b.0));
            progress.refused.extend(write(store, &rest).await);
            return progress.end(batch, run);
        }
        let plan = plan(
            batch,
            &run.states,
            &staged,
            &written,
            &finals,
            &progress.bumps,
        );
        let chunk = match plan {
            Ok(chunk) => chunk,
            Err(too_large) => {
                // Alone it breaks a limit: it can never commit.
                let index = written[0];
                staged.remove(&batch.entries[index].position());
                let reason = StopReason::Rejected(too_large.to_string());
                fail(runner, batch, run, index, reason, true).await;
                progress.revision += 1;
                continue;
            }
        };
        let transaction = chunk.transaction(batch, &runner.invocation.owner, progress.revision);
        match send(store, &transaction).await {
            Ok(RowsTransacted::Committed) => progress.landed(chunk),
            Ok(RowsTransacted::Fenced(rows)) => progress.fenced(&chunk, &rows),
            Ok(RowsTransacted::Refused { action, reason }) => {
                let entries = (batch.entries, batch.key);
                let (index, reason, rejected) =
                    refusal(entries, &mut staged, &chunk.owners, action, &reason);
                fail(runner, batch, run, index, reason, rejected).await;
                progress.revision += 1;
            }
            Err(error) => {
                tracing::error!(%error, "could not commit the records' writes with the keys' rows; reporting their records");
                let reason = StopReason::CheckpointFailed(error.to_string());
                let mut left: Vec<String> = finals
                    .into_keys()
                    .filter(|partition_key| !progress.settled.contains(partition_key))
                    .collect();
                left.sort();
                progress
                    .refused
                    .extend(left.into_iter().map(|k| (k, reason.clone())));
                return progress.end(batch, run);
            }
        }
    }
}

/// Sends `transaction`, and once more with the same token when the store failed: should the
/// first have landed with its answer lost, the second applies nothing again.
async fn send(
    store: &dyn crate::store::CheckpointStore,
    transaction: &RowsTransaction,
) -> Result<RowsTransacted, crate::store::LeaseError> {
    match store.transact_rows(transaction).await {
        Err(error) => {
            tracing::warn!(%error, "could not commit the records' writes with the keys' rows; sending them again");
            store.transact_rows(transaction).await
        }
        answer => answer,
    }
}

/// What the commit has done so far.
#[derive(Default)]
struct Progress {
    /// Each key's transactions so far: each bumped its row's counter once.
    bumps: HashMap<String, u64>,
    /// Keys whose last row landed, or that were given up on (fenced, the store failing).
    settled: HashSet<String>,
    /// Per key, the entry before which its records are committed (its row landed there).
    landed: HashMap<String, usize>,
    /// The keys whose rows were not written, and why.
    refused: Vec<(String, StopReason)>,
    /// The records before `from` have their writes committed.
    from: usize,
    /// Tells apart the transactions of one range planned again, which must not share a token.
    revision: u32,
}

impl Progress {
    /// Each unsettled key's last row, expecting the counter its transactions so far left.
    fn finals(&self, batch: &Batch<'_>, states: &[State]) -> HashMap<String, KeyCommit> {
        key_commits_of(batch, states)
            .into_iter()
            .filter(|(partition_key, _)| !self.settled.contains(partition_key))
            .map(|(partition_key, commit)| {
                let commit = bumped(commit, &self.bumps, &partition_key);
                (partition_key, commit)
            })
            .collect()
    }

    /// `chunk` committed: its rows' counters moved, its keys' records before its cuts landed.
    fn landed(&mut self, chunk: Chunk) {
        for ((partition_key, _), cut) in chunk.rows.iter().zip(&chunk.cuts) {
            *self.bumps.entry(partition_key.clone()).or_default() += 1;
            self.landed.insert(partition_key.clone(), *cut);
        }
        self.settled.extend(chunk.finals);
        self.from = chunk.end;
    }

    /// Another invocation wrote the `rows` of `chunk` meanwhile: nothing more of those keys
    /// lands, and their records past what did run again.
    fn fenced(&mut self, chunk: &Chunk, rows: &[usize]) {
        for &row in rows {
            let Some((partition_key, commit)) = chunk.rows.get(row) else {
                continue;
            };
            tracing::error!(
                row = %commit.row,
                "another invocation wrote the partition key's row meanwhile; its records are reported"
            );
            self.settled.insert(partition_key.clone());
            self.refused
                .push((partition_key.clone(), StopReason::CheckpointFenced));
        }
        self.revision += 1;
    }

    /// The keys not written, once their records that did not land are marked to run again.
    fn end(self, batch: &Batch<'_>, run: &mut keyed::Run) -> Vec<(String, StopReason)> {
        uncheckpointed(batch, run, &self.refused, &self.landed);
        self.refused
    }
}

/// The records of the `refused` keys whose effect happened here but whose row did not land
/// past them (before `landed`'s entry for their key, it did): not checkpointed, they run again.
fn uncheckpointed(
    batch: &Batch<'_>,
    run: &mut keyed::Run,
    refused: &[(String, StopReason)],
    landed: &HashMap<String, usize>,
) {
    for (index, state) in run.states.iter_mut().enumerate() {
        let Some(partition_key) = batch.entries[index].routing_key() else {
            continue;
        };
        let from = landed.get(partition_key).copied().unwrap_or(0);
        let refused_key = refused.iter().any(|(k, _)| k == partition_key);
        // A dead letter whose row was not written is sent again on redelivery: it is not
        // checkpointed either.
        if refused_key
            && index >= from
            && matches!(state, State::Done(d, _) if d.runs_again_unrecorded())
        {
            *state = State::Done(Disposition::Uncheckpointed, false);
        }
    }
}

/// `commit`, expecting the counter its row has after this invocation's transactions of it.
fn bumped(mut commit: KeyCommit, bumps: &HashMap<String, u64>, partition_key: &str) -> KeyCommit {
    commit.expected_counter += bumps.get(partition_key).copied().unwrap_or(0);
    commit
}

/// The records from `from` on whose writes are to commit: done, in their key's run of records
/// done in order, above the key's checkpoint, of a key not settled, with writes.
fn written(
    batch: &Batch<'_>,
    states: &[State],
    staged: &BTreeMap<Position, Writes>,
    from: usize,
    settled: &HashSet<String>,
) -> Vec<usize> {
    let mut stopped: HashSet<&str> = HashSet::new();
    let mut written = Vec::new();
    for (index, (entry, state)) in batch.entries.iter().zip(states).enumerate() {
        let Some(partition_key) = entry.routing_key() else {
            continue;
        };
        if stopped.contains(partition_key) {
            continue;
        }
        if !matches!(state, State::Done(Disposition::Processed, _)) {
            if !state.is_done() {
                stopped.insert(partition_key);
            }
            continue;
        }
        if index >= from
            && !settled.contains(partition_key)
            && staged
                .get(&entry.position())
                .is_some_and(|writes| !writes.is_empty())
        {
            written.push(index);
        }
    }
    written
}

/// One transaction: records' writes and the rows of their keys.
struct Chunk {
    /// The entry after its last record.
    end: usize,
    /// Each key's row, in the order sent.
    rows: Vec<(String, KeyCommit)>,
    /// For each row, the entry before which its key's records are committed once it lands.
    cuts: Vec<usize>,
    /// The keys whose row here is their last.
    finals: Vec<String>,
    writes: Vec<Write>,
    /// The entry each write belongs to.
    owners: Vec<usize>,
    /// The first and last records of the chunk, for the token.
    range: (usize, usize),
}

impl Chunk {
    /// The transaction, with a token of the invocation (`owner`), the shard, the rows and
    /// their counters, the range and `revision` (a range planned again after a refusal must
    /// not share a token). Another delivery never shares it: a transaction that landed moved
    /// its rows' counters, which fence any other, and one that did not must not be answered
    /// for by its token.
    fn transaction(&self, batch: &Batch<'_>, owner: &str, revision: u32) -> RowsTransaction {
        let rows: Vec<KeyCommit> = self.rows.iter().map(|(_, commit)| commit.clone()).collect();
        let mut named = format!("{owner}\u{0}{}", batch.key);
        for commit in &rows {
            named.push('\u{0}');
            named.push_str(&commit.row.to_string());
            named.push('=');
            named.push_str(&commit.expected_counter.to_string());
        }
        let first = batch.entries[self.range.0].position().to_string();
        let last = batch.entries[self.range.1].position().to_string();
        let token = token(&named, u64::from(revision), &first, &last);
        RowsTransaction::new(rows, self.writes.clone(), token)
    }
}

/// The next chunk of the `written` records (at least one): `Err` when the first alone, with its
/// key's row, breaks a limit.
fn plan(
    batch: &Batch<'_>,
    states: &[State],
    staged: &BTreeMap<Position, Writes>,
    written: &[usize],
    finals: &HashMap<String, KeyCommit>,
    bumps: &HashMap<String, u64>,
) -> Result<Chunk, TooLarge> {
    let (taken, keys) = taken(batch, staged, written)?;
    let (inside, after) = written.split_at(taken);
    let mut rows = Rows::default();
    for partition_key in &keys {
        // The key's next record with writes in a later chunk: its row stops before it.
        let next = after
            .iter()
            .copied()
            .find(|&index| batch.entries[index].routing_key() == Some(partition_key));
        let commit = match next {
            None => finals.get(*partition_key).cloned(),
            Some(next) => key_commits_of(batch, &states[..next])
                .into_iter()
                .find(|(k, _)| k == partition_key)
                .map(|(_, commit)| bumped(commit, bumps, partition_key)),
        };
        // A key with a record done above its checkpoint moves it: its row is always there.
        let Some(commit) = commit else {
            unreachable!("a key with a record to commit has a row to move");
        };
        let cut = next.unwrap_or(batch.entries.len());
        rows.push(partition_key, commit, cut, next.is_none());
    }
    let mut writes = Vec::new();
    let mut owners = Vec::new();
    for &index in inside {
        let record_writes = &staged[&batch.entries[index].position()];
        writes.extend(record_writes.iter().cloned());
        owners.extend(std::iter::repeat_n(index, record_writes.len()));
    }
    if after.is_empty() {
        // The last chunk with writes: the keys without any ride along while there is room.
        let bytes = writes.iter().map(Write::bytes).sum::<usize>();
        let room = Room {
            actions: MAX_ACTIONS.saturating_sub(writes.len() + rows.commits.len()),
            bytes: MAX_BYTES.saturating_sub(bytes + rows.commits.len() * ROW_ACTION_BYTES),
        };
        let mut others: Vec<(&String, &KeyCommit)> = finals
            .iter()
            .filter(|(partition_key, _)| !keys.contains(&partition_key.as_str()))
            .collect();
        others.sort_by(|a, b| a.0.cmp(b.0));
        let fit = others
            .len()
            .min(room.actions)
            .min(room.bytes / ROW_ACTION_BYTES);
        for (partition_key, commit) in &others[..fit] {
            rows.push(partition_key, (*commit).clone(), batch.entries.len(), true);
        }
    }
    Ok(Chunk {
        end: inside[taken - 1] + 1,
        rows: rows.commits,
        cuts: rows.cuts,
        finals: rows.finals,
        writes,
        owners,
        range: (inside[0], inside[taken - 1]),
    })
}

/// How many of the `written` records the next chunk takes, and the keys whose rows it holds,
/// in order of their first record.
fn taken<'b>(
    batch: &'b Batch<'_>,
    staged: &BTreeMap<Position, Writes>,
    written: &[usize],
) -> Result<(usize, Vec<&'b str>), TooLarge> {
    let key_of = |index: usize| batch.entries[index].routing_key().unwrap_or_default();
    let writes_of: Vec<Option<&Writes>> = written
        .iter()
        .map(|&index| Some(&staged[&batch.entries[index].position()]))
        .collect();
    // A record brings its key's row into the chunk, unless the chunk has it already.
    let mut rows: HashSet<&str> = HashSet::new();
    let taken = next_chunk(&writes_of, Room::WHOLE, |at| {
        if rows.insert(key_of(written[at])) {
            Room {
                actions: 1,
                bytes: ROW_ACTION_BYTES,
            }
        } else {
            Room::NONE
        }
    })?;
    let mut keys: Vec<&str> = Vec::new();
    for &index in &written[..taken] {
        if !keys.contains(&key_of(index)) {
            keys.push(key_of(index));
        }
    }
    Ok((taken, keys))
}

/// A chunk's rows, each with the entry before which its key's records are committed, and the
/// keys whose row there is their last.
#[derive(Default)]
struct Rows {
    commits: Vec<(String, KeyCommit)>,
    cuts: Vec<usize>,
    finals: Vec<String>,
}

impl Rows {
    fn push(&mut self, partition_key: &str, commit: KeyCommit, cut: usize, last: bool) {
        if last {
            self.finals.push(partition_key.to_owned());
        }
        self.cuts.push(cut);
        self.commits.push((partition_key.to_owned(), commit));
    }
}

/// The record at `index` failed at the commit (`reason`): counted and, when `rejected` or out
/// of attempts, dead-lettered, through the attempt runner. Dead-lettered, it is done and its
/// key goes on; otherwise its key stops there, and its later records done are not committed
/// (they run again).
async fn fail<H: Handler>(
    runner: &Runner<'_, H>,
    batch: &Batch<'_>,
    run: &mut keyed::Run,
    index: usize,
    reason: StopReason,
    rejected: bool,
) {
    let entry = &batch.entries[index];
    let Entry::Record(record) = entry else {
        unreachable!("only a record runs, and only a record has writes");
    };
    let partition_key = entry.routing_key().unwrap_or_default();
    let mut failing = Failing {
        known: batch
            .keys
            .get(partition_key)
            .and_then(|row| row.state.failing.clone()),
        change: FailingChange::Keep,
    };
    match runner.failed(record, reason, rejected, &mut failing).await {
        Ok(disposition) => {
            run.states[index] = State::Done(disposition, failing.change == FailingChange::Clear);
        }
        Err(reason) => {
            run.states[index] = State::Failed {
                reason,
                ran: true,
                counted: match failing.change {
                    FailingChange::Set(failing) => Some(failing),
                    _ => None,
                },
            };
            for (later, state) in run.states.iter_mut().enumerate().skip(index + 1) {
                let same_key = batch.entries[later].routing_key() == Some(partition_key);
                if same_key && matches!(state, State::Done(d, _) if d.runs_again_unrecorded()) {
                    *state = State::Done(Disposition::Uncheckpointed, false);
                }
            }
        }
    }
}
