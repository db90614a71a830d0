//! One invocation, from the parsed event to the report: claim, gate, dedupe, dispatch, dead
//! letters, checkpoint, answer.
//!
//! Lambda's event source mapping delivers a shard's records at least once, retries from the
//! lowest sequence number a function reports, and reads nothing but that report. The engine
//! turns those rules into effectively-once processing. Data flows one way through its files,
//! each importing only those before it:
//!
//! | file | what it does |
//! |---|---|
//! | `settings` | what a processor runs with, and the defaults |
//! | `batch` | the event's records grouped by shard, KPL aggregates unpacked |
//! | `invocation` | the invocation's owner and deadline, the lease as dispatch sees it |
//! | `attempt` | the shared attempt runner: one record, guarded, failures and dead letters |
//! | `ordered` | sequential dispatch, a large event's records read a chunk at a time |
//! | `keyed` | per-key dispatch |
//! | `recovery` | records a mapping outside the contract skipped, read and put before the batch |
//! | `transactional` | a transactional handler's writes committed with the checkpoint, in chunks |
//! | `shard_lease` | the shard mode's lease: the claim that reads the row, keep-alive, release |
//! | `shard` | the shard mode: gate, dedupe, dispatch, one checkpoint write |
//! | `careful` | the shard mode after a death: one record at a time, each pinned before it runs |
//! | `partition_key` | the partition-key mode: a row per key |
//!
//! Every dispatcher runs a record through the one attempt runner, so a record is treated alike
//! whichever mode and dispatcher run it; none of them sees the builder
//! ([`Processor`](crate::Processor)), which only fills in the settings.

mod attempt;
mod batch;
mod careful;
mod invocation;
mod keyed;
mod ordered;
mod partition_key;
mod ready;
mod recovery;
mod refused;
mod settings;
mod shard;
mod shard_lease;
#[cfg(feature = "dynamodb")]
mod transactional;

use aws_lambda_events::event::kinesis::KinesisEvent;
use lambda_runtime::Context;
use tracing::Instrument;

pub(crate) use settings::Settings;
pub use settings::{
    DEFAULT_CLOCK_SKEW, DEFAULT_DEADLINE_MARGIN, DEFAULT_KEY_TTL, DEFAULT_LEASE_TTL,
    DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_DONE_ABOVE, Mode, UnknownMode,
};

use self::batch::{ShardBatch, deaggregate, group_event};
use self::invocation::Invocation;
use crate::event::{MalformedRecord, parse_event};
use crate::handler::Handler;
use crate::record::EventHold;
use crate::report::{BatchReport, ShardReport, StopReason};

/// Runs one batch: parses and groups it, runs each shard's records in the processor's mode, and
/// reports every record. Also returns the first malformed record without a usable sequence
/// number that no report covers: the whole batch must fail from it; and a hold on the event,
/// for the caller to drop after the report.
pub(crate) async fn run<H: Handler>(
    settings: &Settings<H>,
    event: &mut KinesisEvent,
    context: &Context,
) -> (BatchReport, Option<MalformedRecord>, EventHold) {
    let started = settings.meter.as_ref().map(|meter| meter.begin());
    let invocation = Invocation::new(
        context,
        std::sync::Arc::clone(&settings.clock),
        settings.deadline_margin,
    );
    tracing::debug!(
        owner = invocation.owner,
        deadline = context.deadline,
        time_left_ms = invocation.time_left().map(|left| left.as_millis()),
        "batch received"
    );
    let (read, aggregates) = parse_event(event, settings.read_in_chunks_above);
    let hold = read.event_hold();
    let (mut groups, orphans, unreportable) = group_event(read);
    if settings.deaggregate && aggregates {
        // Unpacking reads the payloads: every record is read first.
        groups = groups
            .into_iter()
            .map(|group| {
                let mut group = group.read_whole();
                group.entries = deaggregate(std::mem::take(&mut group.entries));
                group
            })
            .collect();
    }
    let mut report = BatchReport::default();
    let shards = async {
        let mut shards = Vec::with_capacity(groups.len());
        for group in groups {
            let span = tracing::info_span!(
                "shard",
                stream = group.key.stream(),
                shard = group.key.shard(),
                records = group.entries.len(),
            );
            shards.push(
                run_shard(settings, group, &invocation)
                    .instrument(span)
                    .await,
            );
        }
        shards
    };
    // Metered, the invocation counts its own requests and checkpoint latencies, apart from
    // others this process runs at the same time (Lambda Managed Instances).
    report.shards = match (&settings.meter, &started) {
        (Some(meter), Some(started)) => Box::pin(meter.scope(started, shards)).await,
        _ => shards.await,
    };
    for malformed in orphans {
        tracing::error!(%malformed, "reporting a record of unknown stream and shard");
        let sequence = malformed
            .reportable_sequence()
            .expect("orphans are reportable");
        report
            .orphans
            .push((sequence, StopReason::Malformed(malformed.to_string())));
    }
    if let (Some(meter), Some(started)) = (&settings.meter, &started) {
        meter.end(started, &report);
    }
    (report, unreportable, hold)
}

/// One shard's records, in the processor's mode.
async fn run_shard<H: Handler>(
    settings: &Settings<H>,
    group: ShardBatch,
    invocation: &Invocation,
) -> ShardReport {
    // Boxed, one block per shard: the handler's future lives in the dispatch's own state, so
    // a shard's run is as large as the handler's future makes it, and the caller's need not be.
    match settings.mode {
        Mode::Shard => Box::pin(shard::run_shard(settings, group, invocation)).await,
        Mode::PartitionKey => Box::pin(partition_key::run_shard(settings, group, invocation)).await,
    }
}
