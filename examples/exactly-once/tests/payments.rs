//! Runs the exactly-once example's processor through the local event source on the memory
//! store, whose tables in memory apply each transaction whole, as `DynamoDB` does: every balance
//! moves once per payment, and a payment its producer sent twice is dead-lettered.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use aws_sdk_dynamodb::types::AttributeValue;
use example_exactly_once::{Tables, effect, handler};
use kinesis_checkpoint::effects::ItemId;
use kinesis_checkpoint::processor::Effect;
use kinesis_checkpoint::{LeaseKey, MemoryLeaseStore, Processor, Record};
use kinesis_checkpoint_testing::MemoryDeadLetters;
use kinesis_checkpoint_testing::local::{EventSource, Mapping, MemoryStream};

fn tables() -> Tables {
    Tables {
        payments: "payments".to_owned(),
        balances: "balances".to_owned(),
    }
}

fn payment(n: u32) -> (String, i64, String) {
    let account = format!("account-{}", n % 6);
    let amount = i64::from(100 + n);
    let json = format!(r#"{{"payment_id":"p-{n}","account":"{account}","amount_cents":{amount}}}"#);
    (account, amount, json)
}

#[tokio::test]
async fn each_payment_moves_its_balance_once_and_a_payment_sent_twice_is_dead_lettered() {
    let stream = MemoryStream::new("payments", 2);
    let mut expected: BTreeMap<String, (i64, u64)> = BTreeMap::new();
    for n in 0..150 {
        let (account, amount, json) = payment(n);
        stream.put(&account, json);
        let (balance, writes) = expected.entry(account).or_default();
        *balance += amount;
        *writes += 1;
    }
    // The producer retried payment 40: the same payment, a second record.
    let (account, _, twice) = payment(40);
    stream.put(&account, twice.clone());

    let store = Arc::new(MemoryLeaseStore::new());
    let letters = Arc::new(MemoryDeadLetters::new());
    let processor =
        Processor::transactional(store.clone(), handler(tables())).dead_letters(letters.clone());
    let mapping = Mapping::default()
        .batch_size(20)
        .duplicate_deliveries(0.3)
        .concurrent_deliveries(0.3)
        .seed(21);
    let run = EventSource::new(stream, mapping)
        .run(Arc::new(processor))
        .await
        .unwrap();

    assert!(
        run.redeliveries > 0 && run.strays > 0,
        "the mapping misbehaved"
    );
    assert_eq!(store.items("payments").len(), 150);
    for (account, (balance, writes)) in expected {
        let key = HashMap::from([("account".to_owned(), AttributeValue::S(account.clone()))]);
        let item = store.item("balances", &key).unwrap();
        assert_eq!(
            item["balance_cents"],
            AttributeValue::N(balance.to_string()),
            "{account}"
        );
        assert_eq!(
            store.writes_of(&ItemId::new("balances", &key)),
            writes,
            "{account}: once per payment"
        );
    }
    let letters = letters.letters();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].record.data(), twice.as_bytes());
    assert!(
        letters[0]
            .error
            .contains("attribute_not_exists(payment_id)"),
        "{}",
        letters[0].error
    );
}

#[test]
fn a_record_that_is_not_a_payment_or_has_no_amount_is_rejected_without_writes() {
    let shard = LeaseKey::new("payments", "shardId-000000000000");
    let record = |data: &str| {
        Record::new(
            shard.clone(),
            "1".parse().unwrap(),
            "account-1",
            data.to_owned(),
        )
    };
    let negative = r#"{"payment_id":"p-1","account":"account-1","amount_cents":-3}"#;
    assert!(matches!(
        effect(&tables(), &record("not json")),
        Effect::Reject(_)
    ));
    assert!(matches!(
        effect(&tables(), &record(negative)),
        Effect::Reject(_)
    ));
    let Effect::Commit(writes) = effect(&tables(), &record(&payment(1).2)) else {
        panic!("a payment commits its writes");
    };
    assert_eq!(writes.len(), 2, "the payment's item and its balance");
}
