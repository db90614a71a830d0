//! A container consumer on the same table, as the seed crate's runs: between the mapping's
//! invocations it takes a shard's lease with the seed's five methods, handles the records after
//! `checkpoint` itself (whole records, an aggregate's every sub-record), checkpoints each one
//! whole, writes `SHARD_END` at a closed shard's end, and lets go. It knows nothing of the
//! toolkit's attributes (`aggregate_*`, `failing`, `reported`), as the seed crate does not.
//!
//! Hand-offs inside a KPL aggregate, both ways: it takes over a shard the toolkit stopped inside
//! an aggregate (it runs the aggregate whole again, from `checkpoint`), and, when told to, it
//! stops inside one itself (a crash after some sub-records, before its whole-record checkpoint),
//! leaving the aggregate to the toolkit. A record that fails a few times runs once its failures
//! are spent, as the toolkit's handler would run it; one that always fails stops it.
//!
//! In the partition-key mode too: there it reads none of the keys' rows (no shard id holds a
//! colon), so it runs again every record after the shard's `checkpoint` that the mode did (the
//! scenarios count those as its reruns, as the README says), and the mode must take the
//! shard's `checkpoint` as every record up to it done, and turn its batches away while the
//! consumer holds the lease.

use std::collections::HashMap;
use std::time::Duration;

use kinesis_checkpoint::sequence::SHARD_END;
use kinesis_checkpoint::store::LeaseStore;
use kinesis_checkpoint::{LeaseKey, SequenceNumber};
use kinesis_checkpoint_testing::local::MemoryStream;

use super::{Fault, Shared};

/// What the consumer needs to know of the stream the scenario wrote.
pub struct Knowledge {
    /// Each aggregate's sequence number and its user records' count.
    pub aggregates: HashMap<String, usize>,
    /// The fault of every user record, by position: the consumer only handles healthy ones.
    pub faults: HashMap<String, Fault>,
}

/// Takes `shard` over for up to `records` records, if its lease is free and its parents are
/// finished. Every handling is journaled under `owner`; those whose checkpoint did not land are
/// marked so, as for an invocation of the toolkit.
///
/// `busy`, in the partition-key mode, says whether an invocation of the shard is running: the
/// mode reads the shard's lease when a batch starts, and holds no lease on the shard while it
/// runs, so a consumer of the whole shard that took the lease meanwhile would run the same
/// records beside it (two consumers of one shard at once: the README's hand-over stops one
/// first). Asked once the lease is taken: every batch that starts after that is turned away.
pub async fn take_over(
    store: &dyn LeaseStore,
    stream: &MemoryStream,
    knowledge: &Knowledge,
    shared: &Shared,
    (shard, owner): (&str, &str),
    (records, stop_inside): (usize, bool),
    busy: Option<&(dyn Fn() -> bool + Sync)>,
) {
    let key = LeaseKey::new("orders", shard);
    if !matches!(
        store.acquire(&key, owner, Duration::from_millis(150)).await,
        Ok(true)
    ) {
        return;
    }
    if busy.is_some_and(|busy| busy()) {
        let _ = store.release(&key, owner).await;
        return;
    }
    shared.note(format!("{owner} takes {shard} over"));
    shared.journal.lock().unwrap().takeovers += 1;
    let mut finished = true;
    for parent in stream.parents(shard) {
        let row = store.read(&LeaseKey::new("orders", parent.as_str())).await;
        finished &= row.is_ok_and(|row| row.checkpoint.as_deref() == Some(SHARD_END));
    }
    let state = store.read(&key).await;
    let (true, Ok(state)) = (finished, state) else {
        let _ = store.release(&key, owner).await;
        return;
    };
    if state.checkpoint.as_deref() == Some(SHARD_END) {
        let _ = store.release(&key, owner).await;
        return;
    }
    let after: Option<SequenceNumber> = state.checkpoint.as_deref().and_then(|c| c.parse().ok());
    // The toolkit stopped inside an aggregate after `checkpoint`: this consumer knows nothing of
    // it and runs the aggregate whole.
    let inside = state.aggregate_sequence.as_ref().filter(|aggregate| {
        after.as_ref().is_none_or(|after| {
            aggregate
                .parse::<SequenceNumber>()
                .is_ok_and(|aggregate| aggregate > *after)
        })
    });
    if let Some(aggregate) = inside {
        shared.note(format!(
            "{owner} takes {shard} over inside aggregate {aggregate} (sub-records to {:?} done)",
            state.aggregate_sub
        ));
        shared.journal.lock().unwrap().handoffs_into_aggregate += 1;
    }
    let pending: Vec<_> = stream
        .records(shard)
        .into_iter()
        .filter(|record| {
            after
                .as_ref()
                .is_none_or(|after| record.sequence.parse::<SequenceNumber>().unwrap() > *after)
        })
        .collect();
    let mut done = 0;
    for record in pending.iter().take(records) {
        let positions: Vec<String> = match knowledge.aggregates.get(&record.sequence) {
            Some(&count) => (0..count)
                .map(|index| super::sub_position(&record.sequence, index))
                .collect(),
            None => vec![record.sequence.clone()],
        };
        if !positions
            .iter()
            .all(|position| runs_now(knowledge, shared, position))
        {
            break;
        }
        if stop_inside && positions.len() > 1 {
            // A crash after some of the aggregate's sub-records, before its checkpoint.
            let (done, _) = positions.split_at(positions.len() / 2);
            shared.journal.lock().unwrap().handoffs_out_of_aggregate += 1;
            shared.note(format!(
                "{owner} stops inside aggregate {} after {} sub-records",
                record.sequence,
                done.len()
            ));
            for position in done {
                shared.handled(position, owner, false);
                spend_attempt(shared, position);
                shared
                    .journal
                    .lock()
                    .unwrap()
                    .uncheckpointed
                    .insert((owner.to_owned(), position.clone()));
            }
            let _ = store.release(&key, owner).await;
            return;
        }
        for position in &positions {
            shared.handled(position, owner, false);
            spend_attempt(shared, position);
        }
        let written = store.checkpoint(&key, owner, &record.sequence).await;
        if !matches!(written, Ok(true)) {
            shared.note(format!(
                "{owner} could not checkpoint {}: {written:?}",
                record.sequence
            ));
            {
                let mut journal = shared.journal.lock().unwrap();
                for position in positions {
                    journal.uncheckpointed.insert((owner.to_owned(), position));
                }
            }
            let _ = store.release(&key, owner).await;
            return;
        }
        done += 1;
    }
    let closed = stream
        .shard_ids()
        .iter()
        .any(|other| stream.parents(other).iter().any(|p| p == shard));
    if closed && done == pending.len() {
        let _ = store.checkpoint(&key, owner, SHARD_END).await;
    }
    let _ = store.release(&key, owner).await;
}

/// Whether the record at `position` succeeds on its next attempt: a healthy one (records
/// written after the run are all healthy), or one whose failures are spent.
fn runs_now(knowledge: &Knowledge, shared: &Shared, position: &str) -> bool {
    let attempts = shared
        .journal
        .lock()
        .unwrap()
        .attempts
        .get(position)
        .copied()
        .unwrap_or(0);
    match knowledge
        .faults
        .get(position)
        .copied()
        .unwrap_or(Fault::None)
    {
        Fault::None | Fault::Sluggish => true,
        Fault::Retry(n) | Fault::Panic(n) | Fault::Kills(n) => attempts >= n,
        Fault::Slow => attempts >= 1,
        Fault::Stubborn | Fault::Poison => false,
    }
}

/// Counts this consumer's handling as an attempt, as the toolkit's handler does.
fn spend_attempt(shared: &Shared, position: &str) {
    *shared
        .journal
        .lock()
        .unwrap()
        .attempts
        .entry(position.to_owned())
        .or_default() += 1;
}
