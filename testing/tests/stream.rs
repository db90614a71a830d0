//! The memory stream's own tests: keys stay in their shard, splits and merges keep order.

use kinesis_checkpoint_testing::local::*;

#[tokio::test]
async fn records_of_one_key_stay_in_one_shard_until_it_splits() {
    let stream = MemoryStream::new("orders", 4);
    let shard = stream.shard_of("customer-9");
    for n in 0..5 {
        stream.put("customer-9", format!("{n}"));
    }
    assert_eq!(stream.records(&shard).len(), 5);
    let (left, right) = stream.split(&shard);
    let child = stream.shard_of("customer-9");
    assert!(child == left || child == right);
    stream.put("customer-9", "after the split");
    assert_eq!(stream.records(&child).len(), 1);
    assert_eq!(
        stream.records(&shard).len(),
        5,
        "the closed parent keeps its records"
    );
}

#[tokio::test]
async fn a_closed_shard_ends_once_its_last_record_is_read() {
    let stream = MemoryStream::new("orders", 1);
    let first = stream.put("k", "a");
    stream.put("k", "b");
    stream.split("shardId-000000000000");
    let read = stream
        .read("shardId-000000000000", Some(&first), 10)
        .await
        .unwrap();
    assert_eq!(read.records.len(), 1);
    assert!(read.ended);
    let partial = stream.read("shardId-000000000000", None, 1).await.unwrap();
    assert!(!partial.ended, "one record is still unread");
}
