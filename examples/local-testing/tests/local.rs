//! Tests of the local-testing example's handler, from the handler alone to a whole stream under
//! a misbehaving mapping: what a user of the toolkit writes before deploying.

use std::sync::Arc;

use example_local_testing::{Balances, Movement, handler};
use kinesis_checkpoint::{
    Gate, Handler, LeaseKey, MemoryLeaseStore, Outcome, Processor, Record, StartingPosition,
};
use kinesis_checkpoint_testing::MemoryDeadLetters;
use kinesis_checkpoint_testing::local::{EventSource, Mapping, MemoryStream};

const CUSTOMERS: usize = 10;

fn movement(customer: usize, cents: i64) -> String {
    format!(r#"{{"customer":"customer-{customer}","cents":{cents}}}"#)
}

#[test]
fn the_handler_alone_applies_a_deposit_and_rejects_an_overdraft() {
    let balances = Balances::default();
    let deposit = Movement {
        customer: "c".into(),
        cents: 100,
    };
    let overdraft = Movement {
        customer: "c".into(),
        cents: -300,
    };
    assert!(balances.apply(&deposit).is_ack());
    assert!(matches!(balances.apply(&overdraft), Outcome::Reject(_)));
    assert_eq!(balances.of("c"), 100);
}

#[tokio::test]
async fn a_record_that_is_not_a_movement_is_rejected_by_the_handler() {
    let record = Record::new(
        LeaseKey::new("accounts", "shardId-000000000000"),
        "1".parse().unwrap(),
        "c",
        "{}",
    );
    let outcome = handler(Balances::default()).handle(record).await;
    assert!(matches!(outcome, Outcome::Reject(_)));
}

#[tokio::test]
async fn every_balance_comes_out_right_under_redeliveries_concurrent_deliveries_and_a_split() {
    // The movements, and the balances and overdrafts of applying each once, in order.
    let stream = MemoryStream::new("accounts", 2);
    let mut model = [0_i64; CUSTOMERS];
    let mut overdrafts = Vec::new();
    for n in 0..300 {
        if n == 150 {
            stream.split("shardId-000000000000");
        }
        let customer = n % CUSTOMERS;
        // Deposits, then withdrawals, then one overdraft each: applied out of order, a
        // withdrawal would come before the deposits that cover it.
        let cents = match n {
            0..150 => 100,
            150..290 => -100,
            _ => -1_000,
        };
        stream.put(&format!("customer-{customer}"), movement(customer, cents));
        if model[customer] + cents < 0 {
            overdrafts.push(movement(customer, cents));
        } else {
            model[customer] += cents;
        }
    }

    let balances = Balances::default();
    let letters = Arc::new(MemoryDeadLetters::new());
    let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), handler(balances.clone()))
        .dead_letters(letters.clone())
        // The stream in memory knows its shards' parents, as Kinesis does.
        .gate(Gate::new(
            Arc::new(stream.clone()),
            StartingPosition::TrimHorizon,
        ));
    let mapping = Mapping::default()
        .batch_size(20)
        .duplicate_deliveries(0.2)
        .concurrent_deliveries(0.2)
        .children_before_parents(1.0)
        .seed(42);
    let run = EventSource::new(stream, mapping)
        .run(Arc::new(processor))
        .await
        .unwrap();

    assert!(
        run.redeliveries > 0 && run.strays > 0 && run.early_children > 0,
        "{run:?}"
    );
    assert!(run.discarded.is_empty(), "the mapping gave up on nothing");
    for (customer, balance) in model.iter().enumerate() {
        assert_eq!(
            balances.of(&format!("customer-{customer}")),
            *balance,
            "customer-{customer}"
        );
    }
    let mut dead: Vec<String> = letters
        .letters()
        .iter()
        .map(|letter| String::from_utf8(letter.record.data().to_vec()).unwrap())
        .collect();
    dead.sort();
    overdrafts.sort();
    assert!(!overdrafts.is_empty());
    assert_eq!(dead, overdrafts, "exactly the overdrafts are dead-lettered");
}

#[tokio::test]
async fn an_overdraft_is_dead_lettered_with_its_payload_and_its_customer_goes_on() {
    let stream = MemoryStream::new("accounts", 1);
    for cents in [100, -500, 50] {
        stream.put("customer-1", movement(1, cents));
    }
    let balances = Balances::default();
    let letters = Arc::new(MemoryDeadLetters::new());
    let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), handler(balances.clone()))
        .dead_letters(letters.clone());
    EventSource::new(stream, Mapping::default())
        .run(Arc::new(processor))
        .await
        .unwrap();

    assert_eq!(balances.of("customer-1"), 150);
    let letters = letters.letters();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].record.data(), movement(1, -500).as_bytes());
    assert!(
        letters[0].error.contains("would overdraw"),
        "{}",
        letters[0].error
    );
}
