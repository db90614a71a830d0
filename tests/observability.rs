//! What an operator sees of an invocation: tracing spans naming stream, shard and sequence
//! number, one `CloudWatch` embedded-metric line with the invocation's counts, the `DynamoDB`
//! requests counted as moto recorded them, and never a record's payload in either.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex, PoisonError};

use base64::Engine;
use common::moto::{Moto, create_lease_table, unique};
use common::{context, event, lambda_record, reported};
use kinesis_checkpoint::dead_letter::{DeadLetter, DeadLetterError};
use kinesis_checkpoint::metrics::Metrics;
use kinesis_checkpoint::{
    BoxFuture, DeadLetterSink, DynamoLeaseStore, MemoryLeaseStore, Outcome, Processor, Record,
};
use kinesis_checkpoint_testing::MemoryDeadLetters;
use serde_json::{Value, json};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::fmt::format::FmtSpan;

/// A payload no log may contain: marker text an operator would recognise at once.
const SECRET: &str = "card-4111-1111-1111-1111-cvv-737";

/// Everything a subscriber writes, kept for the assertions.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(PoisonError::into_inner)).into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Captured {
    type Writer = Self;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// Metrics written to a list instead of standard output.
fn metrics_into(lines: &Arc<Mutex<Vec<String>>>) -> Metrics {
    let lines = Arc::clone(lines);
    Metrics::new("KinesisCheckpointTest")
        .function("observability")
        .sink(Arc::new(move |line: &str| {
            lines
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(line.to_owned());
        }))
}

/// Records 0..5 of `orders`/`shardId-000000000000`, each payload carrying [`SECRET`].
fn secret_batch() -> aws_lambda_events::event::kinesis::KinesisEvent {
    let records: Vec<Value> = (0..5)
        .map(|n| {
            lambda_record(
                "orders",
                "shardId-000000000000",
                n,
                "customer-1",
                &json!({ "n": n, "card": SECRET }),
            )
        })
        .collect();
    event(&records)
}

fn n_of(record: &Record) -> u64 {
    record.json::<Value>().expect("json")["n"]
        .as_u64()
        .expect("n")
}

#[tokio::test]
async fn a_record_payload_never_reaches_the_logs_or_the_metrics_while_spans_name_every_record() {
    let logs = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_span_events(FmtSpan::NEW | FmtSpan::CLOSE)
        .with_writer(logs.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let lines = Arc::new(Mutex::new(Vec::new()));
    let attempts = Arc::new(Mutex::new(0_u32));
    let seen = Arc::clone(&attempts);
    // Record 1 is rejected (dead-lettered with its payload), record 3 fails once: every path
    // that logs a record runs. The handler logs the record the way a user would, by Debug.
    let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), move |record: Record| {
        let seen = Arc::clone(&seen);
        async move {
            tracing::info!(?record, "handler got a record");
            match n_of(&record) {
                1 => Outcome::reject(format!("rejected {record}")),
                3 => {
                    let mut attempts = seen.lock().unwrap_or_else(PoisonError::into_inner);
                    *attempts += 1;
                    if *attempts == 1 {
                        Outcome::retry("downstream unavailable")
                    } else {
                        Outcome::ack()
                    }
                }
                _ => Outcome::ack(),
            }
        }
    })
    .dead_letters(Arc::new(MemoryDeadLetters::new()))
    .metrics(metrics_into(&lines));

    let first = processor
        .process(secret_batch(), &context("first", 60_000))
        .await
        .unwrap();
    assert_eq!(reported(&first), vec![common::sequence(3)]);
    let again = processor
        .process(secret_batch(), &context("again", 60_000))
        .await
        .unwrap();
    assert!(reported(&again).is_empty());

    let text = logs.text();
    let encoded = base64::engine::general_purpose::STANDARD
        .encode(json!({ "n": 0, "card": SECRET }).to_string());
    assert!(
        text.contains(&format!("sequence={}", common::sequence(3))),
        "at TRACE a span per record names its sequence number:\n{text}"
    );
    assert!(
        text.contains("record{"),
        "below INFO each record runs in a `record` span:\n{text}"
    );
    assert!(text.contains("stream=\"orders\"") || text.contains("stream=orders"));
    assert!(
        text.contains("shard=\"shardId-000000000000\"")
            || text.contains("shard=shardId-000000000000")
    );
    assert!(
        text.contains("handler got a record"),
        "the handler's log is captured"
    );
    assert!(
        !text.contains(SECRET),
        "a payload reached the logs:\n{text}"
    );
    assert!(
        !text.contains(&encoded),
        "a base64 payload reached the logs"
    );
    // A piece of the card number, not the bare digits: "4111" alone also turns up in epoch
    // milliseconds (lease expiries, failure stamps) often enough to fail by the clock.
    assert!(
        !text.contains("4111-1111"),
        "part of a payload reached the logs"
    );

    let lines = lines.lock().unwrap_or_else(PoisonError::into_inner).clone();
    assert_eq!(lines.len(), 2, "one metric line per invocation: {lines:?}");
    assert!(lines.iter().all(|line| !line.contains(SECRET)));
    let first: Value = serde_json::from_str(&lines[0]).unwrap();
    let again: Value = serde_json::from_str(&lines[1]).unwrap();
    assert_eq!(
        (
            &first["RecordsIn"],
            &first["Processed"],
            &first["DeadLettered"],
            &first["Failed"],
            &first["Reported"]
        ),
        (&json!(5), &json!(2), &json!(1), &json!(1), &json!(1)),
        "{first}"
    );
    assert_eq!(
        (&again["Duplicates"], &again["Processed"], &again["Failed"]),
        (&json!(3), &json!(2), &json!(0)),
        "{again}"
    );
    assert_eq!(first["Stream"], "orders");
    assert_eq!(first["Function"], "observability");
    assert!(
        first.get("DynamoDBRequests").is_none(),
        "the memory store sends no requests and says so"
    );
}

/// A dead-letter sink that is always down.
struct Unavailable;

impl DeadLetterSink for Unavailable {
    fn send<'a>(&'a self, _: &'a DeadLetter) -> BoxFuture<'a, Result<(), DeadLetterError>> {
        Box::pin(async { Err("the queue is unavailable".into()) })
    }
}

/// At `INFO` no span is opened per record (the `record` span is `DEBUG`'s), yet every warning
/// or error about a record still says, in its one line, which stream, shard and record: the
/// `shard` span names the first two and the line itself the sequence number. Each path that
/// writes one runs: a retry, a rejection without a sink, a sink that fails, and the per-key
/// dispatcher's stop.
#[tokio::test]
async fn at_info_every_warning_about_a_record_names_its_stream_shard_and_sequence_in_its_line() {
    let logs = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_span_events(FmtSpan::NEW)
        .with_writer(logs.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let failing = |record: Record| async move {
        match n_of(&record) {
            1 => Outcome::retry("downstream unavailable"),
            2 => Outcome::reject("not an order"),
            _ => Outcome::ack(),
        }
    };
    let batch = |from: u64| {
        let records: Vec<Value> = (from..3)
            .map(|n| {
                lambda_record(
                    "orders",
                    "shardId-000000000007",
                    n,
                    "customer-1",
                    &json!({ "n": n }),
                )
            })
            .collect();
        event(&records)
    };

    let ordered = Processor::new(Arc::new(MemoryLeaseStore::new()), failing);
    let retried = ordered
        .process(batch(0), &context("retry", 60_000))
        .await
        .unwrap();
    assert_eq!(reported(&retried), vec![common::sequence(1)]);
    // Record 2 is rejected with no sink to take it.
    let rejecting = Processor::new(
        Arc::new(MemoryLeaseStore::new()),
        |record: Record| async move {
            if n_of(&record) == 2 {
                Outcome::reject("not an order")
            } else {
                Outcome::ack()
            }
        },
    );
    let rejected = rejecting
        .process(batch(0), &context("reject", 60_000))
        .await
        .unwrap();
    assert_eq!(reported(&rejected), vec![common::sequence(2)]);
    let sink_down = Processor::new(Arc::new(MemoryLeaseStore::new()), failing)
        .dead_letters(Arc::new(Unavailable));
    let down = sink_down
        .process(batch(2), &context("sink-down", 60_000))
        .await
        .unwrap();
    assert_eq!(reported(&down), vec![common::sequence(2)]);
    let keyed = Processor::new(Arc::new(MemoryLeaseStore::new()), failing).concurrency(4);
    let stopped = keyed
        .process(batch(0), &context("keyed", 60_000))
        .await
        .unwrap();
    assert_eq!(reported(&stopped), vec![common::sequence(1)]);

    let text = logs.text();
    assert!(
        !text.contains("record{"),
        "no span per record at INFO:\n{text}"
    );
    let lines: Vec<&str> = text
        .lines()
        .filter(|line| line.contains(" WARN ") || line.contains("ERROR"))
        .collect();
    for message in [
        "the record is not done; stopping",
        "no dead-letter sink is configured",
        "could not dead-letter the record",
        "the record is not done; its partition key stops",
    ] {
        assert!(
            lines.iter().any(|line| line.contains(message)),
            "{message:?} is logged:\n{text}"
        );
    }
    for line in lines {
        assert!(
            line.contains("stream=orders") || line.contains("stream=\"orders\""),
            "names the stream: {line}"
        );
        assert!(
            line.contains("shard=shardId-000000000007")
                || line.contains("shard=\"shardId-000000000007\""),
            "names the shard: {line}"
        );
        assert!(
            line.contains(&format!("sequence={}", common::sequence(1)))
                || line.contains(&format!("sequence={}", common::sequence(2))),
            "names the record: {line}"
        );
    }
}

#[tokio::test]
async fn the_dynamodb_requests_in_the_metrics_are_those_the_server_received() {
    let moto = Moto::start(true);
    let config = moto.sdk_config(1).await;
    let table = unique("metrics");
    create_lease_table(&config, &table).await;
    let lines = Arc::new(Mutex::new(Vec::new()));
    let processor = Processor::new(
        Arc::new(DynamoLeaseStore::new(&config, &table)),
        |record: Record| async move {
            if n_of(&record) == 7 {
                Outcome::retry("not yet")
            } else {
                Outcome::ack()
            }
        },
    )
    .metrics(metrics_into(&lines));

    let mut recorded = Vec::new();
    for (request, range) in [("one", 0..5), ("two", 5..10)] {
        moto.start_recording();
        let response = processor
            .process(
                common::batch("orders", "shardId-000000000000", range),
                &context(request, 60_000),
            )
            .await
            .unwrap();
        recorded.push(
            moto.stop_recording()
                .iter()
                .filter(|target| target.starts_with("DynamoDB_"))
                .count(),
        );
        let _ = reported(&response);
    }

    let lines = lines.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let metrics: Vec<Value> = lines
        .iter()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let counted: Vec<usize> = metrics
        .iter()
        .map(|m| usize::try_from(m["DynamoDBRequests"].as_u64().expect("counted")).unwrap())
        .collect();
    println!("DynamoDB requests per invocation: metrics {counted:?}, moto recorded {recorded:?}");
    assert_eq!(counted, recorded);
    assert_eq!(metrics[1]["Failed"], 1);
    assert_eq!(metrics[1]["Processed"], 2);
    let latencies = metrics[1]["CheckpointLatency"]
        .as_array()
        .expect("measured");
    assert_eq!(latencies.len(), 1, "one final write per shard");
    assert!(latencies[0].as_f64().unwrap() > 0.0);
    let declared = metrics[1]["_aws"]["CloudWatchMetrics"][0]["Metrics"]
        .as_array()
        .unwrap();
    assert!(
        declared
            .iter()
            .any(|m| m["Name"] == "CheckpointLatency" && m["Unit"] == "Milliseconds")
    );
}

/// Two invocations at once on one processor, as on Lambda Managed Instances: the one of shard
/// 1 waits, inside its handler, until the one of shard 2 has answered, so shard 2's whole
/// invocation runs inside shard 1's. Each metric line must still count only its own requests
/// (the same as a lone invocation of a fresh shard costs, recorded by moto) and its own
/// checkpoint write.
#[tokio::test]
async fn two_invocations_at_once_each_count_only_their_own_requests_and_checkpoint() {
    let moto = Moto::start(true);
    let config = moto.sdk_config(1).await;
    let table = unique("metrics");
    create_lease_table(&config, &table).await;
    let lines = Arc::new(Mutex::new(Vec::new()));
    let (done, answered) = tokio::sync::watch::channel(false);
    let processor = Processor::new(
        Arc::new(DynamoLeaseStore::new(&config, &table)),
        move |record: Record| {
            let mut answered = answered.clone();
            async move {
                if record.shard() == "shardId-000000000001" {
                    answered.wait_for(|done| *done).await.unwrap();
                }
                Outcome::ack()
            }
        },
    )
    .metrics(metrics_into(&lines));

    // What one invocation of a fresh shard costs when it runs alone.
    moto.start_recording();
    processor
        .process(
            common::batch("orders", "shardId-000000000000", 0..3),
            &context("alone", 60_000),
        )
        .await
        .unwrap();
    let alone = moto
        .stop_recording()
        .iter()
        .filter(|target| target.starts_with("DynamoDB_"))
        .count();

    let first_context = context("first", 60_000);
    let first = processor.process(
        common::batch("orders", "shardId-000000000001", 0..3),
        &first_context,
    );
    let second = async {
        let response = processor
            .process(
                common::batch("orders", "shardId-000000000002", 0..3),
                &context("second", 60_000),
            )
            .await;
        done.send(true).unwrap();
        response
    };
    let (first, second) = tokio::join!(first, second);
    assert!(reported(&first.unwrap()).is_empty() && reported(&second.unwrap()).is_empty());

    let lines = lines.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let metrics: Vec<Value> = lines
        .iter()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(metrics.len(), 3);
    for (metric, invocation) in metrics.iter().zip(["alone", "second", "first"]) {
        assert_eq!(
            metric["DynamoDBRequests"].as_u64(),
            Some(u64::try_from(alone).unwrap()),
            "{invocation}: {metric}"
        );
        assert_eq!(metric["Processed"], 3, "{invocation}");
        let latencies = metric["CheckpointLatency"].as_array().unwrap();
        assert_eq!(latencies.len(), 1, "{invocation}: its own final write only");
    }
}
