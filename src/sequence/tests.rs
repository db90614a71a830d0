//! Sequence numbers' order, validation and forms, and positions' extended order.

use super::*;

fn seq(digits: &str) -> SequenceNumber {
    digits.parse().expect("valid sequence number")
}

#[test]
fn a_longer_sequence_number_is_larger_even_when_its_text_sorts_first() {
    assert!(seq("9") < seq("10"));
    assert!(seq("100") > seq("99"));
    assert!(seq("12") < seq("13"));
    assert_eq!(seq("12").cmp(&seq("12")), Ordering::Equal);
}

#[test]
fn numbers_beyond_u128_still_compare_by_value() {
    let u128_max = u128::MAX.to_string();
    let beyond = format!("{}0", u128::MAX);
    let longest = "9".repeat(MAX_DIGITS);
    assert!(seq(&u128_max) < seq(&beyond));
    assert!(seq(&beyond) < seq(&longest));
}

#[test]
fn malformed_sequence_numbers_are_refused_with_the_reason() {
    assert_eq!("".parse::<SequenceNumber>(), Err(SequenceError::Empty));
    assert_eq!(
        "12a".parse::<SequenceNumber>(),
        Err(SequenceError::NotDigits("12a".into()))
    );
    assert_eq!(
        "-1".parse::<SequenceNumber>(),
        Err(SequenceError::NotDigits("-1".into()))
    );
    assert_eq!(
        "012".parse::<SequenceNumber>(),
        Err(SequenceError::LeadingZero("012".into()))
    );
    let too_long = "1".repeat(MAX_DIGITS + 1);
    assert_eq!(
        too_long.parse::<SequenceNumber>(),
        Err(SequenceError::TooLong(MAX_DIGITS + 1))
    );
    // Zero itself is a number, not a leading zero.
    assert_eq!(seq("0").as_str(), "0");
    assert_eq!(seq(&"9".repeat(MAX_DIGITS)).as_str().len(), MAX_DIGITS);
}

#[test]
fn sub_records_sort_inside_their_record_and_shard_end_after_everything() {
    let longest = Position::record(seq(&"9".repeat(MAX_DIGITS)));
    let mut positions = vec![
        Position::ShardEnd,
        Position::record(seq("11")),
        Position::sub_record(seq("10"), 9),
        longest.clone(),
        Position::record(seq("10")),
        Position::sub_record(seq("10"), 0),
        Position::sub_record(seq("11"), 0),
    ];
    positions.sort();
    assert_eq!(
        positions,
        vec![
            Position::sub_record(seq("10"), 0),
            Position::sub_record(seq("10"), 9),
            Position::record(seq("10")),
            Position::sub_record(seq("11"), 0),
            Position::record(seq("11")),
            longest,
            Position::ShardEnd,
        ]
    );
}

#[test]
fn a_checkpoint_round_trips_through_its_row_form() {
    for position in [
        Position::ShardEnd,
        Position::record(seq("42")),
        Position::sub_record(seq("42"), 7),
    ] {
        let back = Position::from_checkpoint(position.checkpoint(), position.sub_sequence())
            .expect("a written checkpoint reads back");
        assert_eq!(back, position);
    }
    assert!(Position::from_checkpoint("latest", None).is_err());
}

#[test]
fn numbers_held_in_place_and_shared_ones_read_compare_and_hash_by_their_digits() {
    use std::collections::HashSet;
    // Either side of the longest number held in place, and the longest Kinesis issues.
    let in_place = format!("1{}", "0".repeat(INLINE - 1));
    let shared = format!("1{}", "0".repeat(INLINE));
    let longest = "9".repeat(MAX_DIGITS);
    let numbers: Vec<SequenceNumber> = [in_place.as_str(), &shared, &longest, "9"]
        .iter()
        .map(|digits| seq(digits))
        .collect();
    assert!(matches!(numbers[0].0, Digits::Inline { .. }));
    assert!(matches!(numbers[1].0, Digits::Shared(_)));
    assert_eq!(numbers[0].as_str(), in_place);
    assert_eq!(numbers[1].as_str(), shared);
    assert_eq!(numbers[2].to_string(), longest);
    assert!(numbers[3] < numbers[0] && numbers[0] < numbers[1] && numbers[1] < numbers[2]);
    for number in &numbers {
        let copy = number.clone();
        assert_eq!(&copy, number);
        assert_eq!(copy.cmp(number), Ordering::Equal);
    }
    let set: HashSet<SequenceNumber> = numbers.iter().chain(&numbers).cloned().collect();
    assert_eq!(set.len(), numbers.len(), "clones hash alike");
    assert!(set.contains(&seq(&shared)) && set.contains(&seq(&in_place)));
}

#[test]
fn a_number_read_in_place_is_the_number_parsed_and_a_refused_one_leaves_the_slot_as_it_was() {
    let in_place = "49590338271490256608559692538361571095921575989136588898";
    let shared = format!("1{}", "0".repeat(INLINE));
    let mut number = SequenceNumber::ZERO;
    assert_eq!(number.as_str(), "0");
    for digits in [in_place, shared.as_str(), "7", in_place] {
        number.read_into(digits).expect("a sequence number");
        let parsed = seq(digits);
        assert_eq!(number, parsed);
        assert_eq!(number.as_str(), digits);
        assert_eq!(number.cmp(&parsed), Ordering::Equal);
        let state = std::hash::RandomState::new();
        assert_eq!(
            std::hash::BuildHasher::hash_one(&state, &number),
            std::hash::BuildHasher::hash_one(&state, &parsed),
            "hashed by its digits"
        );
    }
    // A short number read over a longer one keeps none of the longer one's digits.
    number.read_into("7").expect("a sequence number");
    assert!(
        matches!(number.0, Digits::Inline { len: 1, bytes } if bytes[1..].iter().all(|b| *b == 0))
    );
    for refused in ["", "12a", "012", &"1".repeat(MAX_DIGITS + 1)] {
        assert_eq!(
            number.read_into(refused),
            refused.parse::<SequenceNumber>().map(|_| ()),
            "the same reason as parsing gives"
        );
        assert_eq!(number.as_str(), "7", "left as it was");
    }
}
