//! The toolkit's `DynamoLeaseStore` and the seed crate's own (`ruststream-kinesis` 0.7.1,
//! feature `dynamodb-lease`) on one table in moto, through the real AWS SDK: what the README
//! promises a container consumer on the seed crate and a Lambda function on this toolkit when
//! they share a table. Leases are exclusive across the two, expired ones are taken, fenced
//! writes are refused, a shard is handed over both ways through its checkpoint (inside a KPL
//! aggregate too), `SHARD_END` is honoured both ways, bare shard id rows are read alike, and the
//! partition-key mode's rows never meet the seed's.

mod common;

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use common::aggregates::{Ran, STREAM, event_of, noting, process, ten_sub_records};
use common::moto::{Moto, create_lease_table, unique};
use kinesis_checkpoint::gate::{Gate, StartingPosition};
use kinesis_checkpoint::report::Disposition;
use kinesis_checkpoint::sequence::SHARD_END;
use kinesis_checkpoint::store::{CheckpointStore, LeaseStore};
use kinesis_checkpoint::{DynamoLeaseStore, LeaseKey, Position, Processor};
use kinesis_checkpoint_testing::local::MemoryStream;
use ruststream_kinesis::LeaseStore as _;

const SHARD: &str = "shardId-000000000000";
const TTL: Duration = Duration::from_mins(1);

/// Both stores on one fresh table, and a raw client on it.
struct Table {
    toolkit: DynamoLeaseStore,
    seed: ruststream_kinesis::DynamoLeaseStore,
    config: aws_config::SdkConfig,
    client: aws_sdk_dynamodb::Client,
    name: String,
}

async fn table() -> Table {
    let config = Moto::shared().sdk_config(1).await;
    let name = unique("shared");
    create_lease_table(&config, &name).await;
    Table {
        toolkit: DynamoLeaseStore::new(&config, &name),
        seed: ruststream_kinesis::DynamoLeaseStore::new(&config, &name),
        client: aws_sdk_dynamodb::Client::new(&config),
        config,
        name,
    }
}

impl Table {
    async fn raw(&self, key: &str) -> std::collections::HashMap<String, AttributeValue> {
        self.client
            .get_item()
            .table_name(&self.name)
            .key("lease_key", AttributeValue::S(key.to_owned()))
            .consistent_read(true)
            .send()
            .await
            .unwrap()
            .item
            .unwrap_or_default()
    }

    /// The seed's checkpoint of `shard`, as a seed consumer reads it.
    async fn seed_checkpoint(&self, shard: &str) -> Option<String> {
        self.seed.read(&seed_key(shard)).await.unwrap().checkpoint
    }

    /// A seed consumer's turn: take the lease, checkpoint `sequence`, release.
    async fn seed_checkpoints(&self, shard: &str, sequence: &str) {
        let key = seed_key(shard);
        assert!(self.seed.acquire(&key, "container-1", TTL).await.unwrap());
        assert!(
            self.seed
                .checkpoint(&key, "container-1", sequence)
                .await
                .unwrap()
        );
        self.seed.release(&key, "container-1").await.unwrap();
    }
}

fn seed_key(shard: &str) -> ruststream_kinesis::LeaseKey {
    ruststream_kinesis::LeaseKey::new(STREAM, shard)
}

fn key(shard: &str) -> LeaseKey {
    LeaseKey::new(STREAM, shard)
}

#[tokio::test]
async fn a_live_lease_is_exclusive_across_both_stores_an_expired_one_is_taken_and_the_loser_fenced()
{
    let table = table().await;
    let (ours, theirs) = (key(SHARD), seed_key(SHARD));

    assert!(table.toolkit.acquire(&ours, "lambda-1", TTL).await.unwrap());
    assert!(
        !table
            .seed
            .acquire(&theirs, "container-1", TTL)
            .await
            .unwrap(),
        "the toolkit's live lease keeps the seed consumer out"
    );
    assert!(!table.seed.renew(&theirs, "container-1", TTL).await.unwrap());
    assert!(
        !table
            .seed
            .checkpoint(&theirs, "container-1", "49001")
            .await
            .unwrap()
    );
    table.seed.release(&theirs, "container-1").await.unwrap();
    assert_eq!(
        table
            .toolkit
            .read(&ours)
            .await
            .unwrap()
            .lease_owner
            .as_deref(),
        Some("lambda-1"),
        "the seed cannot release the toolkit's lease"
    );

    // The toolkit's lease lapses; the seed takes it; the toolkit is fenced.
    assert!(
        table
            .toolkit
            .renew(&ours, "lambda-1", Duration::from_millis(1))
            .await
            .unwrap()
    );
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert!(
        table
            .seed
            .acquire(&theirs, "container-1", TTL)
            .await
            .unwrap()
    );
    assert!(!table.toolkit.renew(&ours, "lambda-1", TTL).await.unwrap());
    assert!(
        !table
            .toolkit
            .commit(
                &ours,
                "lambda-1",
                &common::checkpoint_at(Some(&Position::record("49002".parse().unwrap())))
            )
            .await
            .unwrap()
    );
    assert!(!table.toolkit.acquire(&ours, "lambda-2", TTL).await.unwrap());

    // And the other way: the seed's lease lapses, the toolkit takes it, the seed is fenced.
    assert!(
        table
            .seed
            .renew(&theirs, "container-1", Duration::from_millis(1))
            .await
            .unwrap()
    );
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert!(table.toolkit.acquire(&ours, "lambda-2", TTL).await.unwrap());
    assert!(!table.seed.renew(&theirs, "container-1", TTL).await.unwrap());
    assert!(
        !table
            .seed
            .checkpoint(&theirs, "container-1", "49003")
            .await
            .unwrap()
    );

    let row = table.raw("orders:shardId-000000000000").await;
    assert_eq!(row["lease_owner"].as_s().unwrap(), "lambda-2");
    assert!(
        !row.contains_key("checkpoint"),
        "no fenced write landed: {row:?}"
    );
}

#[tokio::test]
async fn a_shard_is_handed_over_both_ways_through_its_checkpoint_and_nothing_runs_twice() {
    let table = table().await;
    let stream = MemoryStream::new(STREAM, 1);
    let written: Vec<String> = (0..10).map(|n| stream.put("k", format!("{n}"))).collect();
    let ran = Ran::default();
    let processor = Processor::new(Arc::new(table.toolkit.clone()), noting(&ran, None));

    // The toolkit does the first five (Lambda delivers five), and releases.
    let mut first = event_of(&stream, SHARD, None);
    first["Records"].as_array_mut().unwrap().truncate(5);
    process(&processor, first, "r1").await;
    assert_eq!(
        table.seed_checkpoint(SHARD).await.as_deref(),
        Some(written[4].as_str())
    );

    // A seed consumer resumes after it, does three more.
    table.seed_checkpoints(SHARD, &written[7]).await;

    // The toolkit takes it back with Lambda's position at record 5: 5 to 7 are duplicates.
    let back = process(
        &processor,
        event_of(&stream, SHARD, Some(&written[5])),
        "r2",
    )
    .await;
    assert_eq!(back.count(Disposition::Duplicate), 3);
    assert_eq!(back.count(Disposition::Processed), 2);
    let mut expected: Vec<String> = written[..5].to_vec();
    expected.extend_from_slice(&written[8..]);
    assert_eq!(*ran.lock().unwrap(), expected);
    assert_eq!(
        table.seed_checkpoint(SHARD).await.as_deref(),
        Some(written[9].as_str())
    );
    let row = table.raw("orders:shardId-000000000000").await;
    assert!(!row.contains_key("lease_owner"), "released: {row:?}");
}

/// The toolkit stops inside aggregate S; a seed consumer takes over (it sees the record before
/// S as its checkpoint, so it runs S itself) and checkpoints past S; the toolkit takes it back.
#[tokio::test]
async fn a_kpl_stream_handed_over_inside_an_aggregate_loses_nothing_and_runs_nothing_done_twice() {
    let table = table().await;
    let stream = MemoryStream::new(STREAM, 1);
    let plain = stream.put("plain", "before");
    let (outer, bytes) = ten_sub_records();
    let aggregate = stream.put(&outer, bytes);
    let after = stream.put("plain", "after");
    let last = stream.put("plain", "last");
    let ran = Ran::default();
    let processor = Processor::new(Arc::new(table.toolkit.clone()), noting(&ran, Some(4)));

    let stopped = process(&processor, event_of(&stream, SHARD, None), "r1").await;
    assert_eq!(stopped.stopped.as_ref().unwrap().0.as_str(), aggregate);
    let row = table.raw("orders:shardId-000000000000").await;
    assert_eq!(
        row["checkpoint"].as_s().unwrap(),
        &plain,
        "done whole: the record before S"
    );
    assert_eq!(row["aggregate_sequence"].as_s().unwrap(), &aggregate);
    assert_eq!(row["aggregate_sub"].as_n().unwrap(), "3");
    assert!(!row.contains_key("checkpoint_sub"));

    // The seed consumer resumes after `checkpoint`: at S, which it runs whole, and `after`.
    let resume_after = table.seed_checkpoint(SHARD).await.unwrap();
    assert_eq!(
        resume_after, plain,
        "the seed consumer runs S itself, none of it is skipped"
    );
    table.seed_checkpoints(SHARD, &after).await;
    let row = table.raw("orders:shardId-000000000000").await;
    assert_eq!(
        row["aggregate_sequence"].as_s().unwrap(),
        &aggregate,
        "the seed writes `checkpoint` alone: the aggregate's progress stays, stale"
    );

    // The toolkit takes it back with Lambda's position still at S.
    let back = process(&processor, event_of(&stream, SHARD, Some(&aggregate)), "r2").await;
    assert_eq!(back.stopped, None);
    assert_eq!(
        back.count(Disposition::Duplicate),
        11,
        "S's ten and `after`: the seed did them"
    );
    let mut expected = vec![plain];
    expected.extend((0..4).map(|sub| format!("{aggregate}/{sub}")));
    expected.push(last.clone());
    assert_eq!(*ran.lock().unwrap(), expected);
    let row = table.raw("orders:shardId-000000000000").await;
    assert_eq!(row["checkpoint"].as_s().unwrap(), &last);
    assert!(
        !row.contains_key("aggregate_sequence") && !row.contains_key("aggregate_sub"),
        "the stale progress is gone with the toolkit's next write: {row:?}"
    );
}

#[tokio::test]
async fn shard_end_is_honoured_both_ways() {
    let table = table().await;
    let stream = MemoryStream::new(STREAM, 1);
    let parent_last = stream.put("a", "in the parent");
    let _children = stream.split(SHARD);
    let child = stream.shard_of("a");
    stream.put("a", "in the child");
    let ran = Ran::default();
    let gate = || Gate::new(Arc::new(stream.clone()), StartingPosition::TrimHorizon);
    let processor =
        Processor::new(Arc::new(table.toolkit.clone()), noting(&ran, None)).gate(gate());

    // The seed consumer finished the parent: the toolkit's child runs.
    table.seed_checkpoints(SHARD, &parent_last).await;
    table.seed_checkpoints(SHARD, SHARD_END).await;
    let runs = process(&processor, event_of(&stream, &child, None), "r1").await;
    assert_eq!(
        runs.stopped, None,
        "SHARD_END written by the seed finishes the parent"
    );

    // The toolkit's gate finishes a parent it proved exhausted: the seed reads SHARD_END.
    let _grandchildren = stream.split(&child);
    let grandchild = stream.shard_of("a");
    stream.put("a", "in the grandchild");
    assert_eq!(stream.parents(&grandchild), [child.as_str()]);
    let processor =
        Processor::new(Arc::new(table.toolkit.clone()), noting(&ran, None)).gate(gate());
    let runs = process(&processor, event_of(&stream, &grandchild, None), "r2").await;
    assert_eq!(runs.stopped, None);
    assert_eq!(
        table.seed_checkpoint(&child).await.as_deref(),
        Some(SHARD_END)
    );
    let row = table.raw(&format!("{STREAM}:{child}")).await;
    assert!(row.contains_key("expires_at"), "{row:?}");
    assert_eq!(ran.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn bare_shard_id_rows_are_read_alike_by_both_stores() {
    let table = table().await;
    table
        .client
        .put_item()
        .table_name(&table.name)
        .item("lease_key", AttributeValue::S(SHARD.to_owned()))
        .item("checkpoint", AttributeValue::S("49000041".to_owned()))
        .send()
        .await
        .unwrap();

    // Neither names the stream: both refuse, naming the table, the shard and the stream.
    let ours = table
        .toolkit
        .read(&key(SHARD))
        .await
        .unwrap_err()
        .to_string();
    let theirs = table
        .seed
        .read(&seed_key(SHARD))
        .await
        .unwrap_err()
        .to_string();
    for error in [&ours, &theirs] {
        assert!(
            error.contains(&table.name) && error.contains(SHARD) && error.contains("'orders'"),
            "{error}"
        );
    }
    assert_eq!(ours, theirs, "the same words");

    // The seed adopts it for `orders`; the toolkit reads the copy, even without `legacy_stream`.
    let seed =
        ruststream_kinesis::DynamoLeaseStore::new(&table.config, &table.name).legacy_stream(STREAM);
    assert_eq!(
        seed.read(&seed_key(SHARD))
            .await
            .unwrap()
            .checkpoint
            .as_deref(),
        Some("49000041")
    );
    assert_eq!(
        table
            .toolkit
            .read(&key(SHARD))
            .await
            .unwrap()
            .checkpoint
            .as_deref(),
        Some("49000041")
    );

    // Another shard's bare row, adopted by the toolkit: the seed reads the copy.
    table
        .client
        .put_item()
        .table_name(&table.name)
        .item(
            "lease_key",
            AttributeValue::S("shardId-000000000001".to_owned()),
        )
        .item("checkpoint", AttributeValue::S("49000077".to_owned()))
        .send()
        .await
        .unwrap();
    let toolkit = DynamoLeaseStore::new(&table.config, &table.name).legacy_stream(STREAM);
    assert_eq!(
        toolkit
            .read(&key("shardId-000000000001"))
            .await
            .unwrap()
            .checkpoint
            .as_deref(),
        Some("49000077")
    );
    assert_eq!(
        table
            .seed_checkpoint("shardId-000000000001")
            .await
            .as_deref(),
        Some("49000077")
    );
    // Another stream ignores bare rows in both.
    let refunds = ruststream_kinesis::LeaseKey::new("refunds", SHARD);
    assert_eq!(seed.read(&refunds).await.unwrap().checkpoint, None);
    assert_eq!(
        toolkit
            .read(&LeaseKey::new("refunds", SHARD))
            .await
            .unwrap()
            .checkpoint,
        None
    );
}

/// The partition-key mode keeps a row per key (`stream:shard:key`), which a seed consumer
/// never reads as a shard; the shard's own row stays the seed's, and its `SHARD_END` lets the
/// mode's children run.
#[tokio::test]
async fn the_partition_key_mode_beside_a_seed_consumer_shares_the_table_without_sharing_rows() {
    let table = table().await;
    let stream = MemoryStream::new(STREAM, 1);
    let parent_records: Vec<String> = ["a", "b", "a"]
        .iter()
        .map(|k| stream.put(k, format!("{k} in the parent")))
        .collect();
    let (_left, _right) = stream.split(SHARD);
    let child = stream.shard_of("a");
    stream.put("a", "a in the child");
    let ran = Ran::default();
    let processor =
        Processor::by_partition_key(Arc::new(table.toolkit.clone()), noting(&ran, None)).gate(
            Gate::new(Arc::new(stream.clone()), StartingPosition::TrimHorizon),
        );

    let parent = process(&processor, event_of(&stream, SHARD, None), "r1").await;
    assert_eq!(parent.stopped, None);
    assert_eq!(
        table.seed_checkpoint(SHARD).await,
        None,
        "the mode writes no shard checkpoint: a seed consumer sees none"
    );
    // A seed consumer checkpoints the shard on its own row; the keys' rows stay as they are.
    table.seed_checkpoints(SHARD, &parent_records[2]).await;
    let a = table.raw(&format!("{STREAM}:{SHARD}:a")).await;
    assert_eq!(a["checkpoint"].as_s().unwrap(), &parent_records[2]);
    assert!(
        a.contains_key("expires_at") && !a.contains_key("lease_owner"),
        "{a:?}"
    );
    // A seed consumer never reads a key's row as a shard's (no shard id holds a colon).
    assert_eq!(table.seed_checkpoint("shardId-000000000099").await, None);

    // The seed consumer finishes the parent: the mode's child passes the gate.
    table.seed_checkpoints(SHARD, SHARD_END).await;
    let runs = process(&processor, event_of(&stream, &child, None), "r2").await;
    assert_eq!(runs.stopped, None);
    assert_eq!(ran.lock().unwrap().len(), 4);
}
