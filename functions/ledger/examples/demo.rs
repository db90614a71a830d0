//! The demo: a synthetic stream of orders through the ledger's handler and the processor, on the
//! embedded `MemoryLeaseStore`, delivered by the local event source the way Lambda's event
//! source mapping would: batches of 100, duplicate and concurrent deliveries, a split and a
//! merge with children delivered before their parents are finished, a poison record, an
//! unreadable one and transient failures. Ends with a summary, checked: nothing lost, nothing
//! applied twice, the ledger's totals as expected.
//!
//! `make demo`, or `cargo run -p ledger --example demo [ORDERS] [SEED]`. No server needed.

use std::collections::{BTreeMap, HashSet};
use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex, PoisonError};

use aws_lambda_events::event::kinesis::KinesisEvent;
use aws_lambda_events::event::streams::KinesisEventResponse;
use kinesis_checkpoint::gate::{Gate, StartingPosition};
use kinesis_checkpoint::report::{Disposition, ShardReport, StopReason};
use kinesis_checkpoint::{BoxFuture, Handler, MemoryLeaseStore, Processor};
use kinesis_checkpoint_testing::MemoryDeadLetters;
use kinesis_checkpoint_testing::local::{
    Delivery, EventSource, Function, InvocationError, Mapping, MemoryStream, Rng,
};
use ledger::{MemoryBook, Order};

/// What the processor did, summed over every invocation.
#[derive(Debug, Default)]
struct Tally {
    processed: usize,
    duplicates: usize,
    held: usize,
    dead_lettered: usize,
    /// Records done (processed or dead-lettered), each once.
    done: HashSet<String>,
}

impl Tally {
    /// Adds one shard's report, and those of the closed parents whose tails its invocation ran
    /// first (parent tail recovery): their records are the parents', done in the child's
    /// invocation.
    fn add(&mut self, shard: &ShardReport) {
        self.processed += shard.count(Disposition::Processed);
        self.duplicates += shard.count(Disposition::Duplicate);
        self.dead_lettered += shard.count(Disposition::DeadLettered);
        if matches!(shard.stopped, Some((_, StopReason::Held(_)))) {
            self.held += shard.records.len();
        }
        for record in &shard.records {
            if matches!(
                record.disposition,
                Disposition::Processed | Disposition::DeadLettered
            ) {
                self.done.insert(record.position.to_string());
            }
        }
    }
}

/// The processor as the local source's function, tallying every batch report.
struct Counted<H> {
    processor: Processor<H>,
    tally: Arc<Mutex<Tally>>,
}

impl<H: Handler> Function for Counted<H> {
    fn invoke(
        &self,
        event: KinesisEvent,
        context: lambda_runtime::Context,
    ) -> BoxFuture<'_, Result<KinesisEventResponse, InvocationError>> {
        Box::pin(async move {
            let report = self
                .processor
                .process_batch(event, &context)
                .await
                .map_err(|error| InvocationError::Function(error.to_string()))?;
            let mut tally = self.tally.lock().unwrap_or_else(PoisonError::into_inner);
            for shard in &report.shards {
                tally.add(shard);
            }
            Ok(report.response())
        })
    }
}

/// The orders written, and what the ledger must hold afterwards.
struct Workload {
    written: usize,
    expected_cents: BTreeMap<String, i64>,
    expected_orders: usize,
    poison: usize,
}

/// Writes `orders` orders of 300 customers, splitting a shard a third of the way and merging
/// its children two thirds of the way.
fn write_orders(stream: &MemoryStream, orders: usize, rng: &mut Rng) -> Workload {
    let mut workload = Workload {
        written: 0,
        expected_cents: BTreeMap::new(),
        expected_orders: 0,
        poison: 0,
    };
    let mut children = None;
    for n in 0..orders {
        if n == orders / 3 {
            children = Some(stream.split("shardId-000000000000"));
        }
        if n == 2 * orders / 3
            && let Some((left, right)) = children.take()
        {
            stream.merge(&left, &right);
        }
        let customer = format!("customer-{:03}", rng.below(300));
        let currency = if rng.chance(0.3) { "USD" } else { "EUR" };
        #[allow(clippy::cast_possible_wrap)]
        let amount_cents = rng.within(100..50_000) as i64;
        let mut order = Order {
            order_id: format!("order-{n:06}"),
            amount_cents,
            currency: currency.to_owned(),
            fail: None,
            fail_times: None,
            pause_ms: None,
        };
        workload.written += 1;
        if n == orders / 2 {
            // A poison order and an unreadable payload: both go to the dead letters.
            order.fail = Some(ledger::Fail::Poison);
            stream.put(&customer, serde_json::to_vec(&order).unwrap_or_default());
            stream.put(&customer, "{not json");
            workload.written += 1;
            workload.poison += 2;
            continue;
        }
        if n % 97 == 13 {
            order.fail = Some(ledger::Fail::Transient);
            order.fail_times = Some(2);
        }
        *workload
            .expected_cents
            .entry(order.currency.clone())
            .or_default() += amount_cents;
        workload.expected_orders += 1;
        stream.put(&customer, serde_json::to_vec(&order).unwrap_or_default());
    }
    workload
}

/// A progress bar on a terminal; a line per fifth otherwise (CI logs).
fn progress(done: usize, total: usize, deliveries: u64, last_step: &mut usize) {
    let width = 40;
    let filled = done * width / total.max(1);
    let bar = format!(
        "[{}{}] {done}/{total} records done, {deliveries} deliveries",
        "#".repeat(filled),
        "-".repeat(width - filled)
    );
    let mut err = std::io::stderr();
    if err.is_terminal() {
        let _ = write!(err, "\r{bar}");
    } else if done * 5 / total.max(1) > *last_step {
        *last_step = done * 5 / total.max(1);
        let _ = writeln!(err, "{bar}");
    }
}

#[allow(clippy::too_many_lines, reason = "the demo reads top to bottom")]
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let orders: usize = args.next().map_or(Ok(5_000), |n| n.parse())?;
    let seed: u64 = args.next().map_or(Ok(2026), |n| n.parse())?;

    let stream = MemoryStream::new("orders", 2);
    let workload = write_orders(&stream, orders, &mut Rng::new(seed));
    println!(
        "{} records written to stream 'orders' (2 shards, a split and a merge: {} shards); seed {seed}",
        workload.written,
        stream.shard_ids().len()
    );

    let book = Arc::new(MemoryBook::default());
    let dead_letters = Arc::new(MemoryDeadLetters::new());
    let tally = Arc::new(Mutex::new(Tally::default()));
    let processor = Processor::new(
        Arc::new(MemoryLeaseStore::new()),
        ledger::handler(book.clone()),
    )
    .dead_letters(dead_letters.clone())
    .gate(Gate::new(
        Arc::new(stream.clone()),
        StartingPosition::TrimHorizon,
    ));
    let function = Arc::new(Counted {
        processor,
        tally: tally.clone(),
    });
    let mapping = Mapping::default()
        .batch_size(100)
        .duplicate_deliveries(0.3)
        .concurrent_deliveries(0.1)
        .children_before_parents(0.5)
        .seed(seed);

    let mut deliveries = 0;
    let mut last_step = 0;
    let run = EventSource::new(stream.clone(), mapping)
        .run_observed(function, |_: &Delivery| {
            deliveries += 1;
            let done = tally
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .done
                .len();
            progress(done, workload.written, deliveries, &mut last_step);
        })
        .await?;
    eprintln!();

    let tally = tally.lock().unwrap_or_else(PoisonError::into_inner);
    let entries = book.entries();
    let mut ledger_cents: BTreeMap<String, i64> = BTreeMap::new();
    for entry in entries.values() {
        *ledger_cents.entry(entry.currency.clone()).or_default() += entry.total_cents;
    }
    let applied_twice = entries.values().filter(|e| e.applied > 1).count();
    let lost = workload.written - tally.done.len();
    let rows: [(&str, String); 11] = [
        ("records written", workload.written.to_string()),
        ("deliveries (strays included)", run.deliveries.to_string()),
        ("records delivered", run.records_delivered.to_string()),
        ("processed", tally.processed.to_string()),
        ("skipped as duplicates", tally.duplicates.to_string()),
        ("held by the gate", tally.held.to_string()),
        ("dead-lettered", tally.dead_lettered.to_string()),
        ("discarded by the mapping", run.discarded.len().to_string()),
        ("lost", lost.to_string()),
        ("orders applied twice", applied_twice.to_string()),
        (
            "early children / strays / redeliveries",
            format!(
                "{} / {} / {}",
                run.early_children, run.strays, run.redeliveries
            ),
        ),
    ];
    println!("\n{:<40} {:>12}", "", "count");
    for (name, value) in rows {
        println!("{name:<40} {value:>12}");
    }
    println!("\n{:<10} {:>16} {:>16}", "currency", "ledger", "expected");
    for (currency, expected) in &workload.expected_cents {
        let got = ledger_cents.get(currency).copied().unwrap_or_default();
        println!("{currency:<10} {:>16} {:>16}", cents(got), cents(*expected));
    }

    let checks = [
        (lost == 0, "every record processed or dead-lettered"),
        (applied_twice == 0, "no order applied twice"),
        (
            entries.len() == workload.expected_orders,
            "every good order in the ledger",
        ),
        (
            ledger_cents == workload.expected_cents,
            "ledger totals as expected",
        ),
        (
            tally.dead_lettered == workload.poison
                && dead_letters.letters().len() == workload.poison,
            "the poison and the unreadable records dead-lettered",
        ),
    ];
    println!();
    let mut failed = false;
    for (ok, check) in checks {
        println!("{} {check}", if ok { "ok  " } else { "FAIL" });
        failed |= !ok;
    }
    if failed {
        return Err("the demo's checks failed".into());
    }
    Ok(())
}

/// Cents as `1234.56`.
fn cents(amount: i64) -> String {
    format!("{}.{:02}", amount / 100, (amount % 100).abs())
}
