//! The ledger Lambda function: order events from Kinesis into a `DynamoDB` table, each record
//! applied once. Configuration from the environment: `LEASE_TABLE`, `LEDGER_TABLE`,
//! `DEAD_LETTER_QUEUE_URL` (optional: without it a poison record is retried, never dropped),
//! `MAX_ATTEMPTS` (default 3), `METRICS_NAMESPACE` (default `KinesisCheckpoint`),
//! `STARTING_POSITION` (the mapping's, default `TRIM_HORIZON`: the parent gate's rule for
//! parents it never saw), `CHECKPOINT_MODE` (`shard`, the default, for a mapping with
//! `ParallelizationFactor` 1; `partition-key` for 2 to 10), `EVENT_SOURCE` (`kinesis`, the
//! default; `dynamodb-streams` for an orders table's stream through a mapping with
//! `TumblingWindowInSeconds`: see `ledger::changes`), `LEASE_TTL_SECONDS` (shard mode:
//! how long a crashed invocation holds its shard, default 30, never past its deadline and a
//! second), `MAX_IN_FLIGHT` (records of
//! different partition keys run at once, default 1: in order), and the SDK's own variables
//! (`AWS_ENDPOINT_URL` points it at local servers, `AWS_ENDPOINT_URL_DYNAMODB`,
//! `AWS_ENDPOINT_URL_SQS` and `AWS_ENDPOINT_URL_KINESIS` one service each, as `make local-up`
//! does), and `AWS_LAMBDA_MAX_CONCURRENCY` (set by Lambda Managed Instances: how many
//! invocations run at once in this process; unset or 1, one at a time), and `LEDGER_MODE`
//! (`plain`, the default; `transactional` commits each order's update with the checkpoint in
//! one `TransactWriteItems`, exactly once: see `ledger::transactional`; in the partition-key
//! mode, with the advance of its key's row).
//!
//! Nothing here sends a request or builds an SDK client before the first event: each client is
//! built on its first request, and the HTTPS client trusts the roots AWS endpoints chain to,
//! compiled in, unless `SSL_CERT_FILE`, `SSL_CERT_DIR` or a proxy variable is set (see
//! `ledger::aws`).

use std::sync::Arc;
use std::time::Duration;

use kinesis_checkpoint::dynamodb_streams::DynamoDbStreamsTopology;
use kinesis_checkpoint::gate::Topology;
use kinesis_checkpoint::metrics::DEFAULT_NAMESPACE;
use kinesis_checkpoint::processor::{CheckpointMode, ShardMode};
use kinesis_checkpoint::{
    DynamoLeaseStore, Gate, Handler, KinesisTopology, Metrics, Mode, Processor, SqsDeadLetters,
    StartingPosition,
};
use lambda_runtime::{Diagnostic, LambdaEvent, Service};
use ledger::transactional::LedgerMode;
use ledger::{DynamoBook, required};

fn main() -> Result<(), lambda_runtime::Error> {
    runtime()?.block_on(start())
}

/// The tokio runtime: one thread when Lambda hands this process one invocation at a time (classic
/// Lambda: `AWS_LAMBDA_MAX_CONCURRENCY` unset or 1), as its single invocation is one chain of
/// futures, records of several keys included (`MAX_IN_FLIGHT` runs them as futures of the one
/// invocation, not as threads); a worker per CPU when Lambda Managed Instances send several at
/// once, which then run in parallel. The multi-threaded runtime's workers cost start-up time a
/// lone invocation gains nothing from (BENCHMARKS.md, "Cold start").
fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    let concurrent = std::env::var("AWS_LAMBDA_MAX_CONCURRENCY")
        .ok()
        .and_then(|n| n.parse::<u32>().ok())
        .is_some_and(|n| n > 1);
    let mut builder = if concurrent {
        tokio::runtime::Builder::new_multi_thread()
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    builder.enable_all().build()
}

async fn start() -> Result<(), lambda_runtime::Error> {
    ledger::init_logging();
    let config = ledger::aws::sdk_config(ledger::aws::Roots::from_env()).await;
    let leases = Arc::new(DynamoLeaseStore::new(&config, required("LEASE_TABLE")?));
    let table = required("LEDGER_TABLE")?;
    let book = Arc::new(DynamoBook::new(&config, table.clone()));
    let ledger_mode = LedgerMode::from_env()?;
    let handler = ledger::handler(Arc::clone(&book));
    let mode: Mode =
        std::env::var("CHECKPOINT_MODE").map_or(Ok(Mode::Shard), |mode| mode.parse())?;
    if std::env::var("EVENT_SOURCE").is_ok_and(|source| source == "dynamodb-streams") {
        if mode != Mode::Shard {
            return Err(
                "EVENT_SOURCE=dynamodb-streams runs in the shard mode only: unset CHECKPOINT_MODE"
                    .into(),
            );
        }
        // The orders come from a table's stream, through tumbling-window events.
        let topology = Arc::new(DynamoDbStreamsTopology::new(&config));
        return match ledger_mode {
            LedgerMode::Plain => {
                let processor = Processor::new(leases, ledger::changes::orders(handler));
                let processor = configured(lease_ttl(processor)?, &config, topology)?;
                serve(processor.dynamodb_service()).await
            }
            LedgerMode::Transactional => {
                let effects = ledger::changes::effects(ledger::transactional::handler(book, table));
                let processor = Processor::transactional(leases, effects);
                let processor = configured(lease_ttl(processor)?, &config, topology)?;
                serve(processor.dynamodb_service()).await
            }
        };
    }
    let topology = Arc::new(KinesisTopology::new(&config));
    // The mode is the builder's type: the branch is taken once, here, and the settings both
    // modes share are applied by one function.
    match (mode, ledger_mode) {
        (Mode::Shard, LedgerMode::Plain) => {
            let processor = lease_ttl(Processor::new(leases, handler))?;
            serve(configured(processor, &config, topology)?.service()).await
        }
        (Mode::Shard, LedgerMode::Transactional) => {
            let handler = ledger::transactional::handler(book, table);
            let processor = lease_ttl(Processor::transactional(leases, handler))?;
            serve(configured(processor, &config, topology)?.service()).await
        }
        (Mode::PartitionKey, LedgerMode::Plain) => {
            let processor = Processor::by_partition_key(leases, handler);
            serve(configured(processor, &config, topology)?.service()).await
        }
        (Mode::PartitionKey, LedgerMode::Transactional) => {
            let handler = ledger::transactional::handler(book, table);
            let processor = Processor::transactional_by_partition_key(leases, handler);
            serve(configured(processor, &config, topology)?.service()).await
        }
    }
}

/// Applies `LEASE_TTL_SECONDS`, the shard mode's one setting of its own, if it is set.
fn lease_ttl<H: Handler>(
    processor: Processor<H, ShardMode>,
) -> Result<Processor<H, ShardMode>, String> {
    match std::env::var("LEASE_TTL_SECONDS") {
        Err(_) => Ok(processor),
        Ok(seconds) => seconds
            .parse()
            .map(|seconds| processor.lease_ttl(Duration::from_secs(seconds)))
            .map_err(|_| format!("LEASE_TTL_SECONDS is a number of seconds, not '{seconds}'")),
    }
}

/// Applies the settings both modes and both sources share, from the environment, with the
/// gate asking `topology` for parents.
fn configured<H: Handler, M: CheckpointMode>(
    processor: Processor<H, M>,
    config: &aws_config::SdkConfig,
    topology: Arc<dyn Topology>,
) -> Result<Processor<H, M>, lambda_runtime::Error> {
    let starting_position: StartingPosition = std::env::var("STARTING_POSITION")
        .map_or(Ok(StartingPosition::TrimHorizon), |position| {
            position.parse()
        })?;
    let gate = Gate::new(topology, starting_position);
    let max_in_flight: usize = std::env::var("MAX_IN_FLIGHT").map_or(Ok(1), |n| {
        n.parse()
            .map_err(|_| format!("MAX_IN_FLIGHT is a number of records, not '{n}'"))
    })?;
    // One CloudWatch embedded-metric line per invocation (namespace `METRICS_NAMESPACE`).
    let namespace =
        std::env::var("METRICS_NAMESPACE").unwrap_or_else(|_| DEFAULT_NAMESPACE.to_owned());
    let mut processor = processor
        .gate(gate)
        .concurrency(max_in_flight)
        .metrics(Metrics::new(namespace));
    if let Ok(queue) = std::env::var("DEAD_LETTER_QUEUE_URL") {
        processor = processor.dead_letters(Arc::new(SqsDeadLetters::new(config, queue)));
    }
    if let Ok(attempts) = std::env::var("MAX_ATTEMPTS") {
        processor =
            processor.max_attempts(attempts.parse().map_err(|_| "MAX_ATTEMPTS is a number")?);
    }
    Ok(processor)
}

/// Serves `service`: one invocation at a time, as on classic Lambda, unless
/// `AWS_LAMBDA_MAX_CONCURRENCY` (set by Lambda Managed Instances, or by `cargo lambda watch
/// --concurrency N`) allows more: then that many at once in this process, each with its own
/// lease owner (its request id).
async fn serve<S, E, R>(service: S) -> Result<(), lambda_runtime::Error>
where
    S: Service<LambdaEvent<E>, Response = R> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Diagnostic> + std::fmt::Debug,
    E: serde::de::DeserializeOwned + Send + 'static,
    R: serde::Serialize + Send + 'static,
{
    lambda_runtime::run_concurrent(service).await
}
