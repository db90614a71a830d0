//! The demo: the sample events of `events/` through the ledger's handler and the processor, on
//! the embedded `MemoryLeaseStore` (and in-memory dead letters), delivered as Lambda's event
//! source mapping would: again from each reported record. Prints what became of every record,
//! then the dead letters and the ledger.
//!
//! `make demo`, or `cargo run -p ledger --example demo [EVENTS_DIR]`. No server needed.

use std::path::PathBuf;
use std::sync::Arc;

use aws_lambda_events::event::kinesis::KinesisEvent;
use kinesis_checkpoint::{
    BatchReport, Disposition, MemoryDeadLetters, MemoryLeaseStore, Processor,
};
use ledger::{MemoryBook, Order};

/// The sample events, in the order a mapping would deliver them.
const EVENTS: [&str; 5] = [
    "batch.json",
    "redelivered.json",
    "transient.json",
    "poison.json",
    "child-shard.json",
];

/// How often a batch is delivered again from its reported record before the demo moves on
/// (Lambda itself would go on until the record expires).
const DELIVERIES: usize = 3;

/// The dispositions the summary counts, in its order.
const COUNTED: [Disposition; 5] = [
    Disposition::Processed,
    Disposition::Duplicate,
    Disposition::Reported,
    Disposition::NotAttempted,
    Disposition::DeadLettered,
];

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args().nth(1).map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../events"),
        PathBuf::from,
    );
    let book = Arc::new(MemoryBook::default());
    let dead_letters = Arc::new(MemoryDeadLetters::new());
    let processor = Processor::new(
        Arc::new(MemoryLeaseStore::new()),
        ledger::handler(book.clone()),
    )
    .dead_letters(dead_letters.clone());
    let mut request = 0;
    let mut totals = [0usize; COUNTED.len()];

    for name in EVENTS {
        let mut event: KinesisEvent =
            serde_json::from_str(&std::fs::read_to_string(dir.join(name))?)?;
        for delivery in 1..=DELIVERIES {
            request += 1;
            let mut context = lambda_runtime::Context::default();
            context.request_id = format!("demo-{request}");
            println!(
                "\n{name}, delivery {delivery}: {} records",
                event.records.len()
            );
            let orders: Vec<String> = event
                .records
                .iter()
                .map(|r| {
                    serde_json::from_slice::<Order>(&r.kinesis.data.0)
                        .map_or_else(|_| "(unreadable)".to_owned(), |o| o.order_id)
                })
                .collect();
            let report = processor.process_batch(event.clone(), &context).await?;
            print_report(&report, &orders, &mut totals);
            let Some(failed) = report.response().batch_item_failures.first().cloned() else {
                break;
            };
            let failed = failed.item_identifier.unwrap_or_default();
            if delivery == DELIVERIES {
                println!(
                    "  … Lambda keeps delivering from {} until it succeeds or expires",
                    short(&failed)
                );
                break;
            }
            let from = event
                .records
                .iter()
                .position(|r| r.kinesis.sequence_number == failed)
                .unwrap_or(0);
            event.records.drain(..from);
        }
    }

    let summary: Vec<String> = COUNTED
        .iter()
        .zip(totals)
        .map(|(disposition, count)| format!("{count} {disposition}"))
        .collect();
    println!("\nrecords: {}", summary.join(", "));
    for letter in dead_letters.letters() {
        println!(
            "  dead letter {} ({}, {} attempt(s)): {}",
            short(letter.record.sequence().as_str()),
            letter.reason.as_str(),
            letter.attempts,
            String::from_utf8_lossy(letter.record.data())
        );
    }
    println!("\nledger (each order's records applied once):");
    let mut entries: Vec<_> = book.entries().into_iter().collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    for (order, entry) in entries {
        println!(
            "  {order:<8} total {:>8} {}  records applied {}  last {}",
            money(entry.total_cents),
            entry.currency,
            entry.applied,
            short(&entry.last_sequence)
        );
    }
    Ok(())
}

fn print_report(report: &BatchReport, orders: &[String], totals: &mut [usize; COUNTED.len()]) {
    let mut order = orders.iter();
    for shard in &report.shards {
        for record in &shard.records {
            if let Some(slot) = COUNTED.iter().position(|d| *d == record.disposition) {
                totals[slot] += 1;
            }
            let why = match (&record.disposition, &shard.stopped) {
                (Disposition::Reported, Some((_, reason))) => format!(": {reason}"),
                _ => String::new(),
            };
            println!(
                "  {} {:<12} {:<8} {}{why}",
                shard.key.shard(),
                short(record.position.checkpoint()),
                order.next().map_or("", String::as_str),
                record.disposition,
            );
        }
    }
}

/// The last digits of a sequence number, enough to tell the records of a demo apart.
fn short(sequence: &str) -> String {
    format!("…{}", &sequence[sequence.len().saturating_sub(6)..])
}

/// Cents as a decimal amount.
fn money(cents: i64) -> String {
    let sign = if cents < 0 { "-" } else { "" };
    format!(
        "{sign}{}.{:02}",
        cents.unsigned_abs() / 100,
        cents.unsigned_abs() % 100
    )
}
