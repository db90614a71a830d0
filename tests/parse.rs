//! Property tests of reading Lambda's Kinesis events, from the JSON Lambda sends to the record
//! the handler sees.
//!
//! Three promises are checked on generated input rather than on a few hand-picked events:
//! whatever JSON arrives, nothing panics and the answer is a typed error or a response; every
//! well-formed record (any stream, shard, sequence number, partition key, payload, KPL
//! aggregate or not, arrival time) reaches the handler with its fields intact; and a malformed
//! record ends as a clear error or a reported failure, with the records before it processed,
//! none after it, and nothing skipped silently. Everything runs in process on
//! `MemoryLeaseStore`: the properties are about parsing and reporting, not about `DynamoDB`.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::UNIX_EPOCH;

use aws_lambda_events::event::kinesis::KinesisEvent;
use aws_lambda_events::event::streams::KinesisEventResponse;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use kinesis_checkpoint::event::{InvocationEvent, LambdaKinesisEvent};
use kinesis_checkpoint::kpl::MAGIC;
use kinesis_checkpoint::report::{Disposition, StopReason};
use kinesis_checkpoint::{
    BatchReport, LeaseKey, MemoryLeaseStore, Outcome, Position, ProcessError, Processor, Record,
    SequenceNumber,
};
use lambda_runtime::{Context, LambdaEvent, Service};
use md5::{Digest, Md5};
use proptest::prelude::*;
use proptest::test_runner::Config;
use serde_json::{Value, json};

/// Cases per property: enough to meet every kind of flaw many times over, few enough that the
/// file runs in seconds in the debug build.
const CASES: u32 = 256;

const ARRIVAL: f64 = 1_764_512_345.5;

// --- Running the processor -------------------------------------------------------------------

fn block_on<F: Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime")
        .block_on(future)
}

/// Every record the handler was given, in order.
type Seen = Arc<Mutex<Vec<Record>>>;

/// A processor on a fresh in-memory store whose handler acknowledges every record and keeps it.
fn recording_processor() -> (
    Processor<impl kinesis_checkpoint::Handler>,
    Arc<MemoryLeaseStore>,
    Seen,
) {
    let store = Arc::new(MemoryLeaseStore::new());
    let seen = Seen::default();
    let kept = seen.clone();
    let processor = Processor::new(store.clone(), move |record: Record| {
        kept.lock().unwrap().push(record);
        std::future::ready(Outcome::ack())
    });
    (processor, store, seen)
}

/// Deserializes `body` as Lambda's runtime does (with the path of the offending field): as
/// `LambdaKinesisEvent`, every field kept, unless the caller names another type.
fn deserialize<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, String> {
    serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(body))
        .map_err(|error| error.to_string())
}

/// What `InvocationEvent` must make of `body`: `LambdaKinesisEvent`'s reading, the same error or
/// the same event with the fields no part of the processor reads left out.
fn as_the_service_reads(body: &[u8]) -> Result<KinesisEvent, String> {
    deserialize::<LambdaKinesisEvent>(body).map(|LambdaKinesisEvent(mut event)| {
        for record in &mut event.records {
            record.aws_region = None;
            record.event_name = None;
            record.event_source = None;
            record.event_version = None;
            record.invoke_identity_arn = None;
            record.kinesis.kinesis_schema_version = None;
        }
        event
    })
}

/// Deserializes `body` as Lambda's runtime does, then hands the event to the processor's
/// Lambda service.
fn invoke(
    body: &[u8],
) -> Result<(Result<KinesisEventResponse, ProcessError>, Vec<Record>), String> {
    let event: InvocationEvent = deserialize(body)?;
    let (processor, _store, seen) = recording_processor();
    let mut service = processor.service();
    let answer = block_on(async {
        std::future::poll_fn(|cx| service.poll_ready(cx))
            .await
            .expect("always ready");
        service
            .call(LambdaEvent::new(event, Context::default()))
            .await
    });
    let seen = seen.lock().unwrap().clone();
    Ok((answer, seen))
}

/// The identifiers of a response, checked on the wire: never null, never empty, always a
/// sequence number (anything else makes Lambda fail or lose the batch).
fn identifiers(response: &KinesisEventResponse) -> Result<Vec<String>, TestCaseError> {
    let wire = serde_json::to_value(response).expect("serializable");
    let failures = wire["batchItemFailures"].as_array().cloned();
    let failures = failures.unwrap_or_default();
    let mut ids = Vec::new();
    for failure in failures {
        let id = failure["itemIdentifier"].as_str();
        prop_assert!(id.is_some(), "a null identifier: {wire}");
        let id = id.unwrap_or_default();
        prop_assert!(
            id.parse::<SequenceNumber>().is_ok(),
            "identifier {id:?} is not a sequence number"
        );
        ids.push(id.to_owned());
    }
    Ok(ids)
}

// --- Lambda-shaped JSON ----------------------------------------------------------------------

fn arn(stream: &str) -> String {
    format!("arn:aws:kinesis:us-east-1:123456789012:stream/{stream}")
}

/// One record as Lambda writes it into the event.
fn lambda_record(stream: &str, shard: &str, sequence: &str, key: &str, data: &[u8]) -> Value {
    json!({
        "kinesis": {
            "kinesisSchemaVersion": "1.0",
            "partitionKey": key,
            "sequenceNumber": sequence,
            "data": STANDARD.encode(data),
            "approximateArrivalTimestamp": ARRIVAL,
        },
        "eventSource": "aws:kinesis",
        "eventVersion": "1.0",
        "eventID": format!("{shard}:{sequence}"),
        "eventName": "aws:kinesis:record",
        "invokeIdentityArn": "arn:aws:iam::123456789012:role/test",
        "awsRegion": "us-east-1",
        "eventSourceARN": arn(stream),
    })
}

fn body(records: &[Value]) -> Vec<u8> {
    serde_json::to_vec(&json!({ "Records": records })).expect("serializable")
}

/// Kinesis' sequence number shape: 1 to 80 digits without a leading zero.
fn sequence_number() -> impl Strategy<Value = String> {
    "[1-9][0-9]{0,79}"
}

fn stream_name() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9_.-]{1,128}"
}

fn shard_id() -> impl Strategy<Value = String> {
    "shardId-[0-9]{12}"
}

// --- (a) Arbitrary JSON ----------------------------------------------------------------------

/// Object keys: the event's own field names often, so that arbitrary values land where the
/// deserializer and the parser look, and anything else sometimes.
fn json_key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(vec![
            "Records",
            "kinesis",
            "eventID",
            "eventSourceARN",
            "sequenceNumber",
            "partitionKey",
            "data",
            "approximateArrivalTimestamp",
            "encryptionType",
            "kinesisSchemaVersion",
        ])
        .prop_map(str::to_owned),
        1 => ".{0,12}",
    ]
}

/// Strings of the shapes the parser splits: ARNs, event ids, digits, base64, KPL magic.
fn json_text() -> impl Strategy<Value = String> {
    prop_oneof![
        ".{0,24}",
        "[0-9]{0,140}",
        "arn:aws:kinesis:[a-z0-9-]{0,12}:[0-9]{0,12}:stream/[a-z/:]{0,12}",
        "[a-z:/]{0,6}:[0-9a-z:]{0,12}",
        "[A-Za-z0-9+/=]{0,24}",
        prop::collection::vec(any::<u8>(), 0..24).prop_map(|bytes| {
            STANDARD.encode([&MAGIC[..], &bytes, &Md5::digest(&bytes)].concat())
        }),
    ]
}

fn json_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        // Timestamps as Lambda writes them, and near them.
        (0_u32..=4_000_000_000, 0_u32..1000)
            .prop_map(|(s, ms)| Value::from(f64::from(s) + f64::from(ms) / 1000.0)),
        json_text().prop_map(Value::from),
    ]
}

fn arbitrary_json() -> impl Strategy<Value = Value> {
    json_leaf().prop_recursive(5, 96, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::vec((json_key(), inner), 0..8)
                .prop_map(|fields| Value::Object(fields.into_iter().collect())),
        ]
    })
}

/// A well-formed record with any of its fields replaced by arbitrary JSON or removed.
fn mangled_record() -> impl Strategy<Value = Value> {
    let field = || prop::option::weighted(0.3, prop::option::of(arbitrary_json()));
    (
        stream_name(),
        shard_id(),
        sequence_number(),
        prop::collection::vec(any::<u8>(), 0..32),
        prop::collection::vec(
            (
                prop::sample::select(vec![
                    "/eventID",
                    "/eventSourceARN",
                    "/kinesis",
                    "/kinesis/sequenceNumber",
                    "/kinesis/partitionKey",
                    "/kinesis/data",
                    "/kinesis/approximateArrivalTimestamp",
                    "/kinesis/encryptionType",
                ]),
                field(),
            ),
            0..3,
        ),
    )
        .prop_map(|(stream, shard, sequence, data, changes)| {
            let mut record = lambda_record(&stream, &shard, &sequence, "k", &data);
            for (pointer, change) in changes {
                let (parent, name) = pointer.rsplit_once('/').expect("a pointer");
                let Some(Value::Object(parent)) = record.pointer_mut(parent) else {
                    continue;
                };
                match change {
                    // Unchanged.
                    None => {}
                    // Removed.
                    Some(None) => {
                        parent.remove(name);
                    }
                    Some(Some(value)) => {
                        parent.insert(name.to_owned(), value);
                    }
                }
            }
            record
        })
}

/// Whatever the processor answered, it is a response with valid identifiers or a typed error
/// that says which record and why; and every record the handler did not see is redelivered.
fn check_answer(
    event: &Value,
    answer: &Result<KinesisEventResponse, ProcessError>,
    seen: &[Record],
) -> Result<(), TestCaseError> {
    let records = event["Records"].as_array().cloned().unwrap_or_default();
    let sequence_of = |record: &Value| {
        record["kinesis"]["sequenceNumber"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    match answer {
        Ok(response) => {
            let ids = identifiers(response)?;
            // Lambda redelivers a shard from the reported record on: a record the handler did
            // not see must come at or after a reported one.
            for (index, record) in records.iter().enumerate() {
                let sequence = sequence_of(record);
                let handled = seen.iter().any(|r| r.sequence().as_str() == sequence);
                let redelivered = records[..=index]
                    .iter()
                    .any(|earlier| ids.contains(&sequence_of(earlier)));
                prop_assert!(
                    handled || redelivered,
                    "record {index} ({sequence}) was neither handled nor reported: {ids:?}"
                );
            }
        }
        Err(ProcessError::Unreportable(malformed)) => {
            let message = answer.as_ref().unwrap_err().to_string();
            prop_assert!(
                message.contains(&format!("record {} of the batch", malformed.index)),
                "{message}"
            );
            prop_assert!(malformed.reportable_sequence().is_none(), "{message}");
            let raw = records.get(malformed.index).map(sequence_of);
            prop_assert!(
                raw.is_some_and(|raw| raw.parse::<SequenceNumber>().is_err()),
                "{message}"
            );
        }
        Err(other) => prop_assert!(false, "an unexpected error: {other}"),
    }
    Ok(())
}

proptest! {
    #![proptest_config(Config { cases: CASES, ..Config::default() })]

    #[test]
    fn arbitrary_json_never_panics_and_ends_as_a_typed_error_or_a_response(
        value in prop_oneof![
            arbitrary_json(),
            prop::collection::vec(arbitrary_json(), 0..4).prop_map(|records| json!({ "Records": records })),
        ]
    ) {
        let body = serde_json::to_vec(&value).expect("serializable");
        match invoke(&body) {
            Err(message) => prop_assert!(!message.is_empty()),
            Ok((answer, seen)) => check_answer(&value, &answer, &seen)?,
        }
    }

    #[test]
    fn lambda_events_with_arbitrary_fields_never_panic_and_lose_nothing(
        records in prop::collection::vec(mangled_record(), 0..6)
    ) {
        let value = json!({ "Records": records });
        let body = serde_json::to_vec(&value).expect("serializable");
        match invoke(&body) {
            Err(message) => {
                // The runtime's error points at the record and the field.
                prop_assert!(message.starts_with("Records["), "{message}");
            }
            Ok((answer, seen)) => check_answer(&value, &answer, &seen)?,
        }
    }
}

// --- (b) Well-formed records -----------------------------------------------------------------

/// A KPL aggregate: its partition key and explicit hash key tables and its user records
/// (partition key index, explicit hash key index, data).
#[derive(Debug, Clone)]
struct Aggregate {
    partition_keys: Vec<String>,
    hash_keys: Vec<String>,
    records: Vec<(usize, Option<usize>, Vec<u8>)>,
}

impl Aggregate {
    /// The protobuf `AggregatedRecord`, encoded by hand so that the test does not share the
    /// decoder's schema.
    fn message(&self) -> Vec<u8> {
        fn varint(out: &mut Vec<u8>, mut value: u64) {
            while value >= 0x80 {
                out.push(u8::try_from(value & 0x7f).unwrap() | 0x80);
                value >>= 7;
            }
            out.push(u8::try_from(value).unwrap());
        }
        fn bytes(out: &mut Vec<u8>, field: u64, value: &[u8]) {
            varint(out, (field << 3) | 2);
            varint(out, value.len() as u64);
            out.extend_from_slice(value);
        }
        let mut out = Vec::new();
        for key in &self.partition_keys {
            bytes(&mut out, 1, key.as_bytes());
        }
        for key in &self.hash_keys {
            bytes(&mut out, 2, key.as_bytes());
        }
        for (key, hash_key, data) in &self.records {
            let mut record = Vec::new();
            varint(&mut record, 1 << 3);
            varint(&mut record, *key as u64);
            if let Some(hash_key) = hash_key {
                varint(&mut record, 2 << 3);
                varint(&mut record, *hash_key as u64);
            }
            bytes(&mut record, 3, data);
            bytes(&mut out, 3, &record);
        }
        out
    }

    fn encode(&self) -> Vec<u8> {
        let message = self.message();
        [&MAGIC[..], &message, Md5::digest(&message).as_slice()].concat()
    }
}

fn aggregate() -> impl Strategy<Value = Aggregate> {
    (
        prop::collection::vec("\\PC{1,16}", 1..4),
        prop::collection::vec("[1-9][0-9]{0,38}", 0..3),
    )
        .prop_flat_map(|(partition_keys, hash_keys)| {
            let (keys, hashes) = (partition_keys.len(), hash_keys.len());
            let hash_index = if hashes == 0 {
                Just(None).boxed()
            } else {
                prop::option::of(0..hashes).boxed()
            };
            (
                Just(partition_keys),
                Just(hash_keys),
                prop::collection::vec(
                    (
                        0..keys,
                        hash_index,
                        prop::collection::vec(any::<u8>(), 0..48),
                    ),
                    1..6,
                ),
            )
        })
        .prop_map(|(partition_keys, hash_keys, records)| Aggregate {
            partition_keys,
            hash_keys,
            records,
        })
}

#[derive(Debug, Clone)]
enum Payload {
    Plain(Vec<u8>),
    Aggregate(Aggregate),
    /// An aggregate cut short: its MD5 no longer matches, so it is an ordinary payload that
    /// happens to start with the magic, and must reach the handler byte for byte.
    Cut(Vec<u8>),
}

impl Payload {
    fn data(&self) -> Vec<u8> {
        match self {
            Self::Plain(data) | Self::Cut(data) => data.clone(),
            Self::Aggregate(aggregate) => aggregate.encode(),
        }
    }
}

fn payload() -> impl Strategy<Value = Payload> {
    prop_oneof![
        3 => prop::collection::vec(any::<u8>(), 0..256).prop_map(Payload::Plain),
        1 => "\\PC{0,64}".prop_map(|text| Payload::Plain(text.into_bytes())),
        2 => aggregate().prop_map(Payload::Aggregate),
        1 => (aggregate(), any::<prop::sample::Index>()).prop_map(|(aggregate, cut)| {
            let mut data = aggregate.encode();
            data.truncate(cut.index(data.len()));
            Payload::Cut(data)
        }),
    ]
}

/// `approximateArrivalTimestamp` in the forms Lambda and its emulators write: whole seconds,
/// seconds with milliseconds (Lambda) or microseconds (emulators), and either as a string.
#[derive(Debug, Clone, Copy)]
enum Arrival {
    Whole(u32),
    Millis(u32, u16),
    Micros(u32, u32),
    Text(u32, Option<u16>),
}

impl Arrival {
    fn json(self) -> Value {
        match self {
            Self::Whole(seconds) => json!(seconds),
            Self::Millis(seconds, millis) => json!(f64::from(seconds) + f64::from(millis) / 1e3),
            Self::Micros(seconds, micros) => json!(f64::from(seconds) + f64::from(micros) / 1e6),
            Self::Text(seconds, None) => json!(seconds.to_string()),
            Self::Text(seconds, Some(millis)) => json!(format!("{seconds}.{millis:03}")),
        }
    }

    /// Microseconds since the epoch.
    fn micros(self) -> u128 {
        let (seconds, micros) = match self {
            Self::Whole(seconds) | Self::Text(seconds, None) => (seconds, 0),
            Self::Millis(seconds, millis) | Self::Text(seconds, Some(millis)) => {
                (seconds, u32::from(millis) * 1000)
            }
            Self::Micros(seconds, micros) => (seconds, micros),
        };
        u128::from(seconds) * 1_000_000 + u128::from(micros)
    }
}

fn arrival() -> impl Strategy<Value = Arrival> {
    let seconds = 0_u32..=4_102_444_800;
    prop_oneof![
        seconds.clone().prop_map(Arrival::Whole),
        (seconds.clone(), 0_u16..1000).prop_map(|(s, ms)| Arrival::Millis(s, ms)),
        (seconds.clone(), 0_u32..1_000_000).prop_map(|(s, us)| Arrival::Micros(s, us)),
        (seconds, prop::option::of(0_u16..1000)).prop_map(|(s, ms)| Arrival::Text(s, ms)),
    ]
}

/// Where a batch's records come from: a stream ARN (plain or an enhanced fan-out consumer's,
/// in any partition and region) and a shard.
#[derive(Debug, Clone)]
struct Source {
    stream: String,
    shard: String,
    arn: String,
}

fn source() -> impl Strategy<Value = Source> {
    (
        stream_name(),
        shard_id(),
        prop::sample::select(vec!["aws", "aws-cn", "aws-us-gov"]),
        "[a-z]{2}-[a-z]{4,9}-[1-9]",
        "[0-9]{12}",
        prop::option::of("[a-zA-Z0-9_.-]{1,32}:[0-9]{10}"),
    )
        .prop_map(|(stream, shard, partition, region, account, consumer)| {
            let mut arn = format!("arn:{partition}:kinesis:{region}:{account}:stream/{stream}");
            if let Some(consumer) = consumer {
                arn.push_str("/consumer/");
                arn.push_str(&consumer);
            }
            Source { stream, shard, arn }
        })
}

#[derive(Debug, Clone)]
struct WellFormed {
    source: usize,
    sequence: SequenceNumber,
    partition_key: String,
    payload: Payload,
    arrival: Arrival,
}

/// 1 to 3 sources and 1 to 12 records among them, sequence numbers rising in event order.
fn well_formed_batch() -> impl Strategy<Value = (Vec<Source>, Vec<WellFormed>)> {
    (prop::collection::vec(source(), 1..4), 1_usize..13).prop_flat_map(|(sources, count)| {
        let records = prop::collection::vec(
            (0..sources.len(), "\\PC{1,64}", payload(), arrival()),
            count,
        );
        let sequences = prop::collection::btree_set(sequence_number(), count);
        (Just(sources), records, sequences).prop_map(|(sources, records, sequences)| {
            let sequences: BTreeSet<SequenceNumber> =
                sequences.iter().map(|s| s.parse().unwrap()).collect();
            let records = records
                .into_iter()
                .zip(sequences)
                .map(
                    |((source, partition_key, payload, arrival), sequence)| WellFormed {
                        source,
                        sequence,
                        partition_key,
                        payload,
                        arrival,
                    },
                )
                .collect();
            (sources, records)
        })
    })
}

fn well_formed_json(source: &Source, record: &WellFormed) -> Value {
    let sequence = record.sequence.as_str();
    let mut json = lambda_record(
        &source.stream,
        &source.shard,
        sequence,
        &record.partition_key,
        &record.payload.data(),
    );
    json["eventSourceARN"] = json!(source.arn);
    json["kinesis"]["approximateArrivalTimestamp"] = record.arrival.json();
    json
}

/// What the handler must see for `record`: (stream, shard, sequence, sub-sequence, partition
/// key, explicit hash key, data, arrival in microseconds).
type Fields = (
    String,
    String,
    String,
    Option<u64>,
    String,
    Option<String>,
    Vec<u8>,
    u128,
);

fn expected_fields(source: &Source, record: &WellFormed) -> Vec<Fields> {
    let outer = |sub, key: &str, hash: Option<&String>, data: Vec<u8>| {
        (
            source.stream.clone(),
            source.shard.clone(),
            record.sequence.to_string(),
            sub,
            key.to_owned(),
            hash.cloned(),
            data,
            record.arrival.micros(),
        )
    };
    match &record.payload {
        Payload::Plain(data) | Payload::Cut(data) => {
            vec![outer(None, &record.partition_key, None, data.clone())]
        }
        Payload::Aggregate(aggregate) => (0_u64..)
            .zip(&aggregate.records)
            .map(|(sub, (key, hash, data))| {
                outer(
                    Some(sub),
                    &aggregate.partition_keys[*key],
                    hash.map(|hash| &aggregate.hash_keys[hash]),
                    data.clone(),
                )
            })
            .collect(),
    }
}

fn seen_fields(record: &Record) -> Fields {
    (
        record.stream().to_owned(),
        record.shard().to_owned(),
        record.sequence().to_string(),
        record.sub_sequence(),
        record.partition_key().to_owned(),
        record.explicit_hash_key().map(str::to_owned),
        record.data().to_vec(),
        record
            .arrival()
            .duration_since(UNIX_EPOCH)
            .expect("after the epoch")
            .as_micros(),
    )
}

proptest! {
    #![proptest_config(Config { cases: CASES, ..Config::default() })]

    #[test]
    fn well_formed_records_reach_the_handler_with_every_field_intact(
        (sources, records) in well_formed_batch()
    ) {
        let json: Vec<Value> = records
            .iter()
            .map(|record| well_formed_json(&sources[record.source], record))
            .collect();
        let LambdaKinesisEvent(event) = deserialize(&body(&json)).expect("well formed");
        let (processor, store, seen) = recording_processor();
        let report = block_on(processor.process_batch(event, &Context::default()))
            .expect("no malformed record");

        // The processor runs each shard's records in order, shards in the order the batch
        // first names them.
        let mut keys: Vec<LeaseKey> = Vec::new();
        for record in &records {
            let source = &sources[record.source];
            let key = LeaseKey::new(source.stream.as_str(), source.shard.as_str());
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        let mut expected = Vec::new();
        for key in &keys {
            for record in &records {
                let source = &sources[record.source];
                if source.stream == key.stream() && source.shard == key.shard() {
                    expected.extend(expected_fields(source, record));
                }
            }
        }
        let seen = seen.lock().unwrap().clone();
        let got: Vec<Fields> = seen.iter().map(seen_fields).collect();
        prop_assert_eq!(&got, &expected);

        prop_assert!(report.response().batch_item_failures.is_empty());
        prop_assert_eq!(report.shards.len(), keys.len());
        for (shard, key) in report.shards.iter().zip(&keys) {
            prop_assert_eq!(&shard.key, key);
            prop_assert_eq!(shard.count(Disposition::Processed), shard.records.len());
            // Every record succeeded, so the last one, a KPL aggregate's last sub-record
            // included, is done whole: the checkpoint names its record (DESIGN, "A checkpoint
            // names a record done whole").
            let last = seen
                .iter()
                .rev()
                .find(|r| r.key() == key)
                .map(|r| kinesis_checkpoint::Position::record(r.sequence().clone()));
            prop_assert_eq!(&shard.checkpoint, &last);
            let row = block_on(store.read(key)).expect("a row");
            prop_assert_eq!(row.position().expect("readable"), last);
            prop_assert_eq!(row.lease_owner, None, "released");
        }
    }
}

// --- (c) Malformed records in valid batches --------------------------------------------------

/// One way a record of Lambda's event can be wrong.
#[derive(Debug, Clone)]
enum Flaw {
    // The event deserializes, the record does not parse.
    NoEventId,
    EventId(String),
    NoSourceArn,
    SourceArn(String),
    NoSequence,
    Sequence(String),
    // The event does not deserialize.
    DataNotBase64(String),
    WrongType(&'static str, Value),
    Missing(&'static str),
}

impl Flaw {
    /// Whether the event still deserializes (the record is then the processor's to judge).
    const fn deserializes(&self) -> bool {
        !matches!(
            self,
            Self::DataNotBase64(_) | Self::WrongType(..) | Self::Missing(_)
        )
    }

    fn apply(&self, record: &mut Value) {
        let remove = |record: &mut Value, pointer: &str| {
            let (parent, name) = pointer.rsplit_once('/').expect("a pointer");
            record
                .pointer_mut(parent)
                .and_then(Value::as_object_mut)
                .expect("an object")
                .remove(name);
        };
        match self {
            Self::NoEventId => remove(record, "/eventID"),
            Self::EventId(id) => record["eventID"] = json!(id),
            Self::NoSourceArn => remove(record, "/eventSourceARN"),
            Self::SourceArn(arn) => record["eventSourceARN"] = json!(arn),
            Self::NoSequence => remove(record, "/kinesis/sequenceNumber"),
            Self::Sequence(sequence) => record["kinesis"]["sequenceNumber"] = json!(sequence),
            Self::DataNotBase64(data) => record["kinesis"]["data"] = json!(data),
            Self::WrongType(pointer, value) => {
                *record.pointer_mut(pointer).expect("a field") = value.clone();
            }
            Self::Missing(pointer) => remove(record, pointer),
        }
    }
}

fn flaw() -> impl Strategy<Value = Flaw> {
    prop_oneof![
        Just(Flaw::NoEventId),
        prop_oneof![
            "[a-zA-Z0-9-]{0,24}",
            "shardId-[0-9]{12}:",
            ":[0-9]{1,20}",
            Just(String::new()),
        ]
        .prop_map(Flaw::EventId),
        Just(Flaw::NoSourceArn),
        prop_oneof![
            Just("arn:aws:sqs:us-east-1:123456789012:orders".to_owned()),
            Just("arn:aws:kinesis:us-east-1:123456789012:stream/".to_owned()),
            Just("arn:aws:kinesis:us-east-1:123456789012:table/orders".to_owned()),
            Just("arn:aws:kinesis:us-east-1".to_owned()),
            ".{0,24}".prop_filter("not a stream ARN", |arn| {
                kinesis_checkpoint::event::stream_name(arn).is_none()
            }),
        ]
        .prop_map(Flaw::SourceArn),
        Just(Flaw::NoSequence),
        prop_oneof![
            Just(String::new()),
            "[1-9][0-9]{0,20}[a-z .+-][0-9]{0,20}",
            "0[0-9]{1,30}",
            "[1-9][0-9]{129,140}",
            "-[1-9][0-9]{0,20}",
            " [1-9][0-9]{0,20}",
        ]
        .prop_map(Flaw::Sequence),
        prop_oneof![
            Just("not base64!".to_owned()),
            Just("QUJD=".to_owned()),
            "[A-Za-z0-9+/]{0,12}[!#$%*]{1,3}",
        ]
        .prop_map(Flaw::DataNotBase64),
        prop_oneof![
            Just((
                "/kinesis/sequenceNumber",
                json!(4_959_033_827_149_025_660_u64)
            )),
            Just(("/kinesis/partitionKey", json!(17))),
            Just(("/kinesis/data", json!([1, 2, 3]))),
            Just(("/kinesis/approximateArrivalTimestamp", json!({ "s": 1 }))),
            Just(("/eventID", json!(12))),
            Just(("/eventSourceARN", json!({ "arn": true }))),
            Just(("/kinesis", json!("kinesis"))),
            // Fields no part of the processor reads: `InvocationEvent` refuses them all the same.
            Just(("/awsRegion", json!(17))),
            Just(("/eventName", json!(["aws:kinesis:record"]))),
            Just(("/eventSource", json!(true))),
            Just(("/eventVersion", json!(1.0))),
            Just(("/invokeIdentityArn", json!({ "arn": "x" }))),
            Just(("/kinesis/kinesisSchemaVersion", json!(1))),
        ]
        .prop_map(|(pointer, value)| Flaw::WrongType(pointer, value)),
        prop_oneof![
            Just("/kinesis"),
            Just("/kinesis/data"),
            Just("/kinesis/approximateArrivalTimestamp"),
        ]
        .prop_map(Flaw::Missing),
    ]
}

#[derive(Debug, Clone)]
struct Item {
    source: usize,
    partition_key: String,
    data: Vec<u8>,
    flaw: Option<Flaw>,
}

/// 1 to 3 sources, and 1 to 12 records among them of which at least one is flawed.
fn flawed_batch() -> impl Strategy<Value = (Vec<Source>, Vec<Item>)> {
    (prop::collection::vec(source(), 1..4), 1_usize..13).prop_flat_map(|(sources, count)| {
        let item = (
            0..sources.len(),
            "\\PC{1,16}",
            prop::collection::vec(any::<u8>(), 0..64),
            prop::option::weighted(0.25, flaw()),
        )
            .prop_map(|(source, partition_key, data, flaw)| Item {
                source,
                partition_key,
                data,
                flaw,
            });
        (
            Just(sources),
            prop::collection::vec(item, count),
            any::<prop::sample::Index>(),
            flaw(),
        )
            .prop_map(|(sources, mut items, at, flaw)| {
                let at = at.index(items.len());
                items[at].flaw.get_or_insert(flaw);
                (sources, items)
            })
    })
}

/// Sequence numbers of Kinesis' shape, rising with the record's index in the batch.
fn sequence_at(index: usize) -> String {
    format!("49590338271490256608559692538361571095921575989136{index:06}")
}

struct Built {
    json: Vec<Value>,
    /// The stream and shard each record came from (before any flaw).
    keys: Vec<LeaseKey>,
}

fn build(sources: &[Source], items: &[Item]) -> Built {
    let mut json = Vec::new();
    let mut keys = Vec::new();
    for (index, item) in items.iter().enumerate() {
        let source = &sources[item.source];
        let mut record = lambda_record(
            &source.stream,
            &source.shard,
            &sequence_at(index),
            &item.partition_key,
            &item.data,
        );
        record["eventSourceARN"] = json!(source.arn);
        if let Some(flaw) = &item.flaw {
            flaw.apply(&mut record);
        }
        keys.push(LeaseKey::new(source.stream.as_str(), source.shard.as_str()));
        json.push(record);
    }
    Built { json, keys }
}

/// What is known of a flawed record, as the processor should name it.
struct Known {
    stream: Option<String>,
    shard: Option<String>,
    sequence: Option<String>,
}

fn known(record: &Value) -> Known {
    let text = |pointer: &str| record.pointer(pointer).and_then(Value::as_str);
    Known {
        stream: text("/eventSourceARN")
            .and_then(kinesis_checkpoint::event::stream_name)
            .map(str::to_owned),
        shard: text("/eventID")
            .and_then(kinesis_checkpoint::event::shard_id)
            .map(str::to_owned),
        sequence: text("/kinesis/sequenceNumber")
            .filter(|s| !s.is_empty())
            .map(str::to_owned),
    }
}

/// What the processor must make of each record from the first flawed one on, worked out from
/// the event alone.
struct Model {
    /// The shard each record is grouped with: its own when it names one whole, else (when
    /// flawed) its nearest well-formed neighbour's, before it or else after it.
    groups: Vec<Option<LeaseKey>>,
    /// What each record tells of itself.
    known: Vec<Known>,
    /// Whether each record is flawed with a sequence number that can be reported.
    reportable: Vec<bool>,
}

impl Model {
    fn new(items: &[Item], built: &Built) -> Self {
        let known: Vec<Known> = built.json.iter().map(known).collect();
        let well_formed = |index: usize| items[index].flaw.is_none();
        let groups = (0..items.len())
            .map(|index| {
                if well_formed(index) {
                    return Some(built.keys[index].clone());
                }
                if let (Some(stream), Some(shard)) = (&known[index].stream, &known[index].shard) {
                    return Some(LeaseKey::new(stream.as_str(), shard.as_str()));
                }
                let before = (0..index).rev().find(|&i| well_formed(i));
                let after = || (index + 1..items.len()).find(|&i| well_formed(i));
                before.or_else(after).map(|i| built.keys[i].clone())
            })
            .collect();
        let reportable = known
            .iter()
            .map(|known| {
                known
                    .sequence
                    .as_deref()
                    .is_some_and(|s| s.parse::<SequenceNumber>().is_ok())
            })
            .collect();
        Self {
            groups,
            known,
            reportable,
        }
    }

    /// Whether record `index` (at or after `cut`) stops its group: a well-formed record past
    /// the cut, or a flawed one with a sequence number to report.
    fn stops(&self, items: &[Item], index: usize) -> bool {
        items[index].flaw.is_none() || self.reportable[index]
    }

    /// The first flawed record without a sequence number that no earlier stop of its group
    /// covers: it fails the whole batch.
    fn unreportable(&self, items: &[Item], cut: usize) -> Option<usize> {
        (cut..items.len()).find(|&index| {
            items[index].flaw.is_some()
                && !self.reportable[index]
                && !(cut..index).any(|earlier| {
                    self.groups[index].is_some()
                        && self.groups[earlier] == self.groups[index]
                        && self.stops(items, earlier)
                })
        })
    }
}

/// Checks the batch's outcome against the first flawed record, at `cut`, when the event
/// deserializes.
fn check_cut(
    items: &[Item],
    built: &Built,
    cut: usize,
    outcome: &Result<BatchReport, ProcessError>,
    seen: &[Record],
    store: &MemoryLeaseStore,
) -> Result<(), TestCaseError> {
    let model = Model::new(items, built);
    let key_of = |index: usize| built.keys[index].clone();

    // The records before the flawed one were processed, in each shard's order; none after it.
    let mut expected_keys: Vec<LeaseKey> = Vec::new();
    for index in 0..cut {
        if !expected_keys.contains(&key_of(index)) {
            expected_keys.push(key_of(index));
        }
    }
    let mut expected: Vec<String> = Vec::new();
    for key in &expected_keys {
        expected.extend((0..cut).filter(|&i| key_of(i) == *key).map(sequence_at));
    }
    let got: Vec<String> = seen.iter().map(|r| r.sequence().to_string()).collect();
    prop_assert_eq!(&got, &expected, "handled records (cut at {})", cut);

    // Their checkpoints are in the store; nothing else moved.
    let rows = store.snapshot();
    for (key, row) in &rows {
        let last = (0..cut).rev().find(|&i| key_of(i) == *key).map(sequence_at);
        prop_assert_eq!(row.checkpoint.as_ref(), last.as_ref(), "row of {}", key);
        prop_assert_eq!(row.lease_owner.as_ref(), None, "row of {} released", key);
    }
    for key in &expected_keys {
        prop_assert!(rows.contains_key(key), "no row for {}", key);
    }

    let report = match (outcome, model.unreportable(items, cut)) {
        (Err(error @ ProcessError::Unreportable(malformed)), Some(index)) => {
            let message = error.to_string();
            prop_assert_eq!(malformed.index, index);
            prop_assert!(
                message.contains(&format!("record {index} of the batch")),
                "{}",
                message
            );
            return check_names(&message, &model.known[index]);
        }
        (Err(error), expected) => {
            return Err(TestCaseError::fail(format!(
                "failed the batch ({error}) where the model expects {expected:?}"
            )));
        }
        (Ok(_), Some(index)) => {
            return Err(TestCaseError::fail(format!(
                "record {index} has no sequence number to report, yet the batch did not fail"
            )));
        }
        (Ok(report), None) => report,
    };

    check_report(items, &model, cut, report)
}

/// Checks what a batch that did not fail reported, from the first flawed record, at `cut`, on.
fn check_report(
    items: &[Item],
    model: &Model,
    cut: usize,
    report: &BatchReport,
) -> Result<(), TestCaseError> {
    // Each group with a record from the cut on reports its first such record, and only it; a
    // flawed record of no group is reported on its own.
    let ids = identifiers(&report.response())?;
    let mut expected_stops: Vec<(Option<LeaseKey>, usize)> = Vec::new();
    for index in cut..items.len() {
        if model.stops(items, index)
            && !expected_stops
                .iter()
                .any(|(group, _)| *group == model.groups[index])
        {
            expected_stops.push((model.groups[index].clone(), index));
        }
    }
    prop_assert_eq!(ids.len(), expected_stops.len(), "identifiers {:?}", ids);
    for (group, index) in &expected_stops {
        let sequence = sequence_at(*index);
        prop_assert!(
            ids.contains(&sequence),
            "{} is not reported: {:?}",
            sequence,
            ids
        );
        let (stopped, reason) = if let Some(key) = group {
            let shard = report.shards.iter().find(|shard| shard.key == *key);
            let stopped = shard.and_then(|shard| shard.stopped.as_ref());
            prop_assert!(stopped.is_some(), "{} does not stop", key);
            stopped.cloned().unwrap()
        } else {
            prop_assert_eq!(report.orphans.len(), 1);
            report.orphans[0].clone()
        };
        prop_assert_eq!(stopped.as_str(), sequence.as_str());
        // The reason says which record and what was wrong with it.
        let StopReason::Malformed(message) = reason else {
            return Err(TestCaseError::fail(format!(
                "stopped for another reason: {reason}"
            )));
        };
        if items[*index].flaw.is_some() {
            prop_assert!(
                message.contains(&format!("record {index} of the batch")),
                "{}",
                message
            );
            check_names(&message, &model.known[*index])?;
        }
    }

    // Every record has its fate in the report: processed before the cut, the stop reported,
    // the rest not attempted.
    for shard in &report.shards {
        for record in &shard.records {
            let Position::Record { sequence, .. } = &record.position else {
                return Err(TestCaseError::fail("a shard end in a batch"));
            };
            let expected = if sequence.as_str() < sequence_at(cut).as_str() {
                Disposition::Processed
            } else if shard
                .stopped
                .as_ref()
                .is_some_and(|(stopped, _)| stopped == sequence)
            {
                Disposition::Reported
            } else {
                Disposition::NotAttempted
            };
            prop_assert_eq!(
                record.disposition,
                expected,
                "{} of {}",
                sequence,
                &shard.key
            );
        }
    }
    Ok(())
}

/// The message names the stream, shard and sequence number wherever the record gave them.
fn check_names(message: &str, known: &Known) -> Result<(), TestCaseError> {
    for part in [&known.stream, &known.shard, &known.sequence]
        .into_iter()
        .flatten()
    {
        prop_assert!(
            message.contains(part.as_str()),
            "{part:?} is not named in: {message}"
        );
    }
    for (part, name) in [
        (&known.stream, "stream unknown"),
        (&known.shard, "shard unknown"),
        (&known.sequence, "sequence number unknown"),
    ] {
        if part.is_none() {
            prop_assert!(message.contains(name), "{name:?} missing from: {message}");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(Config { cases: CASES, ..Config::default() })]

    #[test]
    fn a_malformed_record_ends_as_a_clear_error_or_a_reported_failure_and_nothing_is_skipped(
        (sources, items) in flawed_batch()
    ) {
        let built = build(&sources, &items);
        let first_flaw = items.iter().position(|item| item.flaw.is_some()).expect("a flaw");
        let undeserializable = items
            .iter()
            .position(|item| item.flaw.as_ref().is_some_and(|flaw| !flaw.deserializes()));
        let body = body(&built.json);
        let deserialized = deserialize(&body);
        // What the service reads: the same refusal, or the same event less the unread fields.
        prop_assert_eq!(
            deserialize::<InvocationEvent>(&body).map(|InvocationEvent(event)| event),
            as_the_service_reads(&body)
        );
        match (deserialized, undeserializable) {
            (Err(message), Some(index)) => {
                // Lambda's runtime fails the whole batch before the handler runs: nothing was
                // processed, and its message points at the record.
                prop_assert!(message.starts_with(&format!("Records[{index}]")), "{}", message);
            }
            (Err(error), None) => prop_assert!(false, "a parseable event was refused: {error}"),
            (Ok(_), Some(index)) => {
                prop_assert!(false, "record {index} with {:?} deserialized", items[index].flaw);
            }
            (Ok(LambdaKinesisEvent(event)), None) => {
                let (processor, store, seen) = recording_processor();
                let outcome = block_on(processor.process_batch(event, &Context::default()));
                let seen = seen.lock().unwrap().clone();
                check_cut(&items, &built, first_flaw, &outcome, &seen, &store)?;
            }
        }
    }
}

// --- (c) Aggregates that cannot be read --------------------------------------------------------

/// An aggregate whose MD5 matches but whose protobuf ends inside a field: a `records` entry
/// announcing 127 bytes and holding fewer. The producer vouched for these bytes, so it is a
/// poison record.
fn unreadable_aggregate() -> impl Strategy<Value = Vec<u8>> {
    (aggregate(), prop::collection::vec(any::<u8>(), 0..16)).prop_map(|(aggregate, tail)| {
        let message = [aggregate.message(), vec![0x1a, 0x7f], tail].concat();
        [&MAGIC[..], &message, Md5::digest(&message).as_slice()].concat()
    })
}

proptest! {
    #![proptest_config(Config { cases: CASES / 2, ..Config::default() })]

    #[test]
    fn an_unreadable_aggregate_stops_its_shard_alone_and_is_reported_or_dead_lettered_whole(
        (sources, records) in well_formed_batch(),
        at in any::<prop::sample::Index>(),
        unreadable in unreadable_aggregate(),
        sink in any::<bool>(),
    ) {
        let at = at.index(records.len());
        let mut json: Vec<Value> = records
            .iter()
            .map(|record| well_formed_json(&sources[record.source], record))
            .collect();
        json[at]["kinesis"]["data"] = json!(STANDARD.encode(&unreadable));
        let LambdaKinesisEvent(event) = deserialize(&body(&json)).expect("well formed");
        let (processor, _store, seen) = recording_processor();
        let letters = Arc::new(kinesis_checkpoint_testing::MemoryDeadLetters::new());
        let processor = if sink { processor.dead_letters(letters.clone()) } else { processor };
        let report = block_on(processor.process_batch(event, &Context::default()))
            .expect("every record has a sequence number");

        let poison = &records[at];
        let source = &sources[poison.source];
        let poison_key = LeaseKey::new(source.stream.as_str(), source.shard.as_str());
        let same_shard = |record: &WellFormed| {
            let source = &sources[record.source];
            source.stream == poison_key.stream() && source.shard == poison_key.shard()
        };
        // Every other shard ran whole; the poison's shard ran up to it, and past it only once
        // the sink had it.
        let handled = |record: &WellFormed| {
            let sequence = record.sequence.as_str();
            seen.lock().unwrap().iter().any(|r| r.sequence().as_str() == sequence)
        };
        for (index, record) in records.iter().enumerate() {
            let expected = index != at && (!same_shard(record) || index < at || sink);
            prop_assert_eq!(handled(record), expected, "record {}", index);
        }
        let ids = identifiers(&report.response())?;
        let shard = report.shards.iter().find(|shard| shard.key == poison_key);
        prop_assert!(shard.is_some());
        let shard = shard.unwrap();
        if sink {
            prop_assert!(ids.is_empty(), "{:?}", ids);
            prop_assert_eq!(shard.count(Disposition::DeadLettered), 1);
            let letters = letters.letters();
            prop_assert_eq!(letters.len(), 1);
            prop_assert_eq!(letters[0].record.data(), unreadable.as_slice());
            prop_assert_eq!(letters[0].record.sequence(), &poison.sequence);
        } else {
            prop_assert_eq!(&ids, &vec![poison.sequence.to_string()]);
            let (sequence, reason) = shard.stopped.clone().expect("stopped");
            prop_assert_eq!(&sequence, &poison.sequence);
            let message = reason.to_string();
            for part in [source.stream.as_str(), source.shard.as_str(), poison.sequence.as_str()] {
                prop_assert!(message.contains(part), "{:?} missing from: {}", part, message);
            }
            prop_assert!(message.contains("KPL aggregate"), "{}", message);
        }
    }
}

// --- Regressions found by the properties above -----------------------------------------------

/// Found by `a_malformed_record_ends_as_…`: only the first malformed record of a batch was
/// looked at, so a later one of another shard, whose shard had no other record after the first,
/// was dropped while the batch answered success for that shard.
#[test]
fn a_later_malformed_record_of_another_shard_is_not_dropped_silently() {
    let a = ("orders", "shardId-000000000001");
    let b = ("orders", "shardId-000000000002");
    let mut no_event_id = lambda_record(a.0, a.1, &sequence_at(1), "k", b"{}");
    no_event_id
        .as_object_mut()
        .expect("an object")
        .remove("eventID");
    let mut bad_sequence = lambda_record(b.0, b.1, &sequence_at(2), "k", b"{}");
    bad_sequence["kinesis"]["sequenceNumber"] = json!("12x");
    let event: KinesisEvent = serde_json::from_slice(&body(&[
        lambda_record(a.0, a.1, &sequence_at(0), "k", b"{}"),
        no_event_id,
        bad_sequence,
    ]))
    .expect("an event");

    let (processor, store, seen) = recording_processor();
    let outcome = block_on(processor.process_batch(event, &Context::default()));

    let error = outcome.expect_err("shard 2's record cannot be reported: the batch fails");
    let message = error.to_string();
    for part in ["record 2 of the batch", "stream orders", b.1, "12x"] {
        assert!(message.contains(part), "{part:?} missing from: {message}");
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1, "the record before the malformed ones ran");
    let row = &store.snapshot()[&LeaseKey::new(a.0, a.1)];
    assert_eq!(row.checkpoint.as_deref(), Some(sequence_at(0).as_str()));
}

/// Found by `well_formed_records_reach_…` once arrivals in microseconds were among the forms:
/// `aws_lambda_events` reads the fraction's digits as milliseconds, so six decimals failed the
/// whole event ("invalid timestamp"), fourteen overflowed (a panic in the debug build), and
/// `.5` became 5 ms.
#[test]
fn arrival_times_are_read_to_the_microsecond_whatever_their_decimals() {
    for (timestamp, micros) in [
        (json!(1_700_000_000.123_456), 1_700_000_000_123_456_u64),
        (json!(0.123_456_789_012_345_67), 123_457),
        (json!(1_700_000_000.5), 1_700_000_000_500_000),
        (json!("1700000000.250"), 1_700_000_000_250_000),
        (json!(1_700_000_000), 1_700_000_000_000_000),
    ] {
        let mut record = lambda_record("orders", "shardId-000000000000", "1", "k", b"x");
        record["kinesis"]["approximateArrivalTimestamp"] = timestamp.clone();
        let LambdaKinesisEvent(event) =
            deserialize(&body(&[record])).unwrap_or_else(|error| panic!("{timestamp}: {error}"));
        let arrival =
            std::time::SystemTime::from(event.records[0].kinesis.approximate_arrival_timestamp.0);
        assert_eq!(
            arrival,
            UNIX_EPOCH + std::time::Duration::from_micros(micros),
            "{timestamp}"
        );
    }
}

/// Found by `arbitrary_json_never_panics_…`: `aws_lambda_events` reads an array as the
/// struct's fields in order, so `"kinesis": [0.1234…]` reached its timestamp parser unread and
/// overflowed it. Only objects are records.
#[test]
fn a_record_or_kinesis_field_that_is_not_an_object_is_a_clear_error() {
    for (event, path) in [
        (
            json!({ "Records": [{ "kinesis": [0.123_456_789_012_345_67] }] }),
            "Records[0].kinesis",
        ),
        (
            json!({ "Records": [[null, null, null, null, null, null, null, {}]] }),
            "Records[0]",
        ),
        (json!([[]]), "event"),
    ] {
        let body = serde_json::to_vec(&event).unwrap();
        let error = deserialize::<LambdaKinesisEvent>(&body).expect_err("not Lambda's shape");
        assert!(error.contains(path), "{path:?} missing from: {error}");
        let served = deserialize::<InvocationEvent>(&body).expect_err("not Lambda's shape");
        assert_eq!(served, error);
    }
}
