//! Lambda's event read in one pass, from the bytes to [`KinesisEvent`]: the deserializer of
//! [`LambdaKinesisEvent`].
//!
//! `aws_lambda_events`' own reading of a timestamp is wrong (see [`LambdaKinesisEvent`]), and
//! the event used to be read twice to fix it: into a `serde_json::Value`, whose timestamps were
//! rewritten, then from it into `KinesisEvent`. Here each record is read once, every field with
//! `aws_lambda_events`' own type (so the same defaults, the same refusals and the same
//! messages) but two: the timestamp, read to the microsecond, and the payload, decoded where it
//! lies by a faster decoder that refuses the same texts with the same messages.

use std::fmt;
use std::time::{Duration, UNIX_EPOCH};

use aws_lambda_events::encodings::{Base64Data, SecondTimestamp};
use aws_lambda_events::event::kinesis::{KinesisEvent, KinesisEventRecord, KinesisRecord};
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::LambdaKinesisEvent;

impl<'de> Deserialize<'de> for LambdaKinesisEvent {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(EventVisitor).map(Self)
    }
}

/// Reads a map key as one of `names` (its index), or `None` for a key to ignore; the key is
/// compared where it lies in the input, never copied.
struct Field(&'static [&'static str]);

impl<'de> DeserializeSeed<'de> for Field {
    type Value = Option<usize>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_identifier(self)
    }
}

impl Visitor<'_> for Field {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a field name")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<Self::Value, E> {
        Ok(self.0.iter().position(|name| *name == key))
    }
}

/// Reads the next value of `map` into `slot`, refusing a second one as a derived struct does.
fn once<'de, A: MapAccess<'de>, T: Deserialize<'de>>(
    map: &mut A,
    slot: &mut Option<T>,
    name: &'static str,
) -> Result<(), A::Error> {
    if slot.is_some() {
        return Err(de::Error::duplicate_field(name));
    }
    *slot = Some(map.next_value()?);
    Ok(())
}

struct EventVisitor;

impl<'de> Visitor<'de> for EventVisitor {
    type Value = KinesisEvent;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Lambda's Kinesis event (a JSON object)")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<KinesisEvent, A::Error> {
        let mut records = None;
        while let Some(field) = map.next_key_seed(Field(&["Records"]))? {
            match field {
                Some(_) if records.is_some() => return Err(de::Error::duplicate_field("Records")),
                Some(_) => records = Some(map.next_value_seed(Records)?),
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let mut event = KinesisEvent::default();
        event.records = records.ok_or_else(|| de::Error::missing_field("Records"))?;
        Ok(event)
    }
}

/// `Records`: every record read as it comes, an error in an earlier one first.
struct Records;

impl<'de> DeserializeSeed<'de> for Records {
    type Value = Vec<KinesisEventRecord>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Records {
    type Value = Vec<KinesisEventRecord>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a sequence")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut records = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(record) = seq.next_element_seed(RecordSeed)? {
            records.push(record);
        }
        Ok(records)
    }
}

/// The fields of a record, in `RECORD_FIELDS`' order.
const RECORD_FIELDS: &[&str] = &[
    "awsRegion",
    "eventID",
    "eventName",
    "eventSource",
    "eventSourceARN",
    "eventVersion",
    "invokeIdentityArn",
    "kinesis",
];

struct RecordSeed;

impl<'de> DeserializeSeed<'de> for RecordSeed {
    type Value = KinesisEventRecord;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for RecordSeed {
    type Value = KinesisEventRecord;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a record of Lambda's Kinesis event (a JSON object)")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        // `Option<Option<String>>`: whether the field came, and its value (`null` is `None`).
        let mut strings: [Option<Option<String>>; 7] = Default::default();
        let mut kinesis = None;
        while let Some(field) = map.next_key_seed(Field(RECORD_FIELDS))? {
            match field {
                Some(7) if kinesis.is_some() => return Err(de::Error::duplicate_field("kinesis")),
                Some(7) => kinesis = Some(map.next_value_seed(KinesisSeed)?),
                Some(index) => once(&mut map, &mut strings[index], RECORD_FIELDS[index])?,
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let [region, id, name, source, arn, version, identity] = strings.map(Option::flatten);
        let mut record = KinesisEventRecord::default();
        record.aws_region = region;
        record.event_id = id;
        record.event_name = name;
        record.event_source = source;
        record.event_source_arn = arn;
        record.event_version = version;
        record.invoke_identity_arn = identity;
        record.kinesis = kinesis.ok_or_else(|| de::Error::missing_field("kinesis"))?;
        Ok(record)
    }
}

const KINESIS_FIELDS: &[&str] = &[
    "approximateArrivalTimestamp",
    "data",
    "encryptionType",
    "partitionKey",
    "sequenceNumber",
    "kinesisSchemaVersion",
];

struct KinesisSeed;

impl<'de> DeserializeSeed<'de> for KinesisSeed {
    type Value = KinesisRecord;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for KinesisSeed {
    type Value = KinesisRecord;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a record's `kinesis` (a JSON object)")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut arrival = None;
        let mut data = None;
        let mut encryption = None;
        let mut partition_key: Option<Option<String>> = None;
        let mut sequence = None;
        let mut version: Option<Option<String>> = None;
        while let Some(field) = map.next_key_seed(Field(KINESIS_FIELDS))? {
            match field {
                Some(0) if arrival.is_some() => {
                    return Err(de::Error::duplicate_field(KINESIS_FIELDS[0]));
                }
                Some(0) => arrival = Some(map.next_value_seed(Arrival)?),
                Some(1) if data.is_some() => {
                    return Err(de::Error::duplicate_field(KINESIS_FIELDS[1]));
                }
                Some(1) => data = Some(map.next_value_seed(Payload)?),
                Some(2) => once(&mut map, &mut encryption, KINESIS_FIELDS[2])?,
                // A `null` partition key is no key (`aws_lambda_events` refuses `null` for its
                // `String` but reads a missing one as ""): see `Record::partition_key`.
                Some(3) => once(&mut map, &mut partition_key, KINESIS_FIELDS[3])?,
                Some(4) => once::<_, String>(&mut map, &mut sequence, KINESIS_FIELDS[4])?,
                Some(5) => once(&mut map, &mut version, KINESIS_FIELDS[5])?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let mut kinesis = KinesisRecord::default();
        kinesis.approximate_arrival_timestamp =
            arrival.ok_or_else(|| de::Error::missing_field(KINESIS_FIELDS[0]))?;
        kinesis.data = data.ok_or_else(|| de::Error::missing_field(KINESIS_FIELDS[1]))?;
        kinesis.encryption_type = encryption.unwrap_or_default();
        kinesis.partition_key = partition_key.flatten().unwrap_or_default();
        kinesis.sequence_number = sequence.unwrap_or_default();
        kinesis.kinesis_schema_version = version.flatten();
        Ok(kinesis)
    }
}

/// `data`: the payload, decoded from base64 where it lies in the input.
///
/// `aws_lambda_events` copies the text into a `String`, then decodes it with the `base64` crate:
/// a quarter of the instructions an invocation spends on each 1 KB record went to that decoder
/// alone (BENCHMARKS.md, section 1, eleventh round). `base64-simd` (already built for the AWS
/// SDK's `aws-smithy-types`) decodes the text where the parser found it, with no `String`
/// copied from it, using the processor's vector instructions, into a vector of the payload's
/// exact length. Both decoders take the standard alphabet with canonical padding and refuse the
/// same texts (tested below, text by text); a refused text is decoded again by `base64`, rare
/// as it is, for `aws_lambda_events`' own message.
struct Payload;

impl<'de> DeserializeSeed<'de> for Payload {
    type Value = Base64Data;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for Payload {
    type Value = Base64Data;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `aws_lambda_events` reads the text as a `String`: the same words for a wrong type.
        f.write_str("a string")
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
        let mut data = Base64Data::default();
        data.0 = decode_base64(text).map_err(E::custom)?;
        Ok(data)
    }
}

/// `text` decoded as `aws_lambda_events` decodes a payload (the `base64` crate's standard
/// engine), by `base64-simd`.
fn decode_base64(text: &str) -> Result<Vec<u8>, base64::DecodeError> {
    use base64::Engine;
    base64_simd::STANDARD
        .decode_to_vec(text)
        .or_else(|_| base64::engine::general_purpose::STANDARD.decode(text))
}

/// `approximateArrivalTimestamp`, to the microsecond; what this reading refuses (negative, past
/// 2^53 microseconds, not a number) goes to `aws_lambda_events`' own, with its errors.
struct Arrival;

impl<'de> DeserializeSeed<'de> for Arrival {
    type Value = SecondTimestamp;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        // A number or a short string: the `Value` holds no allocation but the string's.
        let timestamp = Value::deserialize(deserializer)?;
        match arrival_micros(&timestamp) {
            Some(micros) => Ok(SecondTimestamp(
                (UNIX_EPOCH + Duration::from_micros(micros)).into(),
            )),
            None => SecondTimestamp::deserialize(timestamp).map_err(de::Error::custom),
        }
    }
}

/// Microseconds since the epoch of a timestamp in float seconds (a number, or a string holding
/// one); `None` for anything else, negative, or past 2^53 microseconds (year 2255), which is
/// left to `aws_lambda_events` to refuse.
fn arrival_micros(timestamp: &Value) -> Option<u64> {
    /// Below this, `seconds * 1e6` is an integer an `f64` holds exactly.
    const LIMIT: f64 = 9_007_199_254.0;
    let seconds = match timestamp {
        Value::Number(number) => number.as_f64()?,
        Value::String(text) => text.trim().parse().ok()?,
        _ => return None,
    };
    if !(0.0..LIMIT).contains(&seconds) {
        return None;
    }
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "finite, non-negative and below 2^53: the conversion is exact"
    )]
    Some((seconds * 1e6).round() as u64)
}

#[cfg(test)]
mod tests {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;
    use proptest::prelude::*;

    use super::*;

    /// What `aws_lambda_events` makes of a payload's text: its bytes, or its error's message.
    fn as_aws_lambda_events_reads(text: &str) -> Result<Vec<u8>, String> {
        STANDARD.decode(text).map_err(|error| error.to_string())
    }

    /// Texts near the edges of base64: each character of the alphabet and beyond it, padding
    /// in and out of place, and the bits a canonical encoding leaves at zero.
    fn near_base64() -> impl Strategy<Value = String> {
        let encoded =
            prop::collection::vec(any::<u8>(), 0..48).prop_map(|data| STANDARD.encode(data));
        prop_oneof![
            encoded.clone(),
            "[A-Za-z0-9+/=]{0,24}",
            "[A-Za-z0-9+/=_\\- \n\r\t.!\"é]{0,24}",
            (
                encoded,
                any::<prop::sample::Index>(),
                "[A-Za-z0-9+/=_\\- é]|"
            )
                .prop_map(|(text, at, with)| {
                    let mut chars: Vec<char> = text.chars().collect();
                    if chars.is_empty() {
                        return with;
                    }
                    let at = at.index(chars.len());
                    match with.chars().next() {
                        Some(with) => chars[at] = with,
                        None => {
                            chars.truncate(at);
                        }
                    }
                    chars.into_iter().collect()
                }),
        ]
    }

    proptest! {
        #[test]
        fn the_fast_decoder_takes_and_refuses_the_texts_aws_lambda_events_does(
            text in near_base64()
        ) {
            let fast = base64_simd::STANDARD.decode_to_vec(&text).ok();
            prop_assert_eq!(fast, as_aws_lambda_events_reads(&text).ok(), "{:?}", text);
        }

        #[test]
        fn a_payload_reads_as_aws_lambda_events_reads_it_with_the_same_message(
            text in near_base64()
        ) {
            let ours = decode_base64(&text).map_err(|error| error.to_string());
            prop_assert_eq!(ours, as_aws_lambda_events_reads(&text), "{:?}", text);
        }
    }

    #[test]
    fn non_canonical_padding_and_trailing_bits_are_refused_as_aws_lambda_events_refuses_them() {
        // "QQ==" is "A"; "QR==" sets bits a canonical encoding leaves at zero; "QQ", "QQ=",
        // "aA" (what a lenient decoder takes, found by the property tests) and "QUJDRA=" lack
        // padding; "QUJD=" has one too many; the rest put it where no text
        // can end or continue.
        for text in [
            "QR==", "QQ", "QQ=", "aA", "QUJD=", "QUJDRA=", "Q===", "====", "QQ==QQ==",
        ] {
            assert!(as_aws_lambda_events_reads(text).is_err(), "{text}");
            assert!(base64_simd::STANDARD.decode_to_vec(text).is_err(), "{text}");
            assert_eq!(
                decode_base64(text).map_err(|e| e.to_string()),
                as_aws_lambda_events_reads(text),
                "{text}"
            );
        }
        assert_eq!(decode_base64("QQ==").unwrap(), b"A");
        assert_eq!(decode_base64("").unwrap(), b"");
    }

    #[test]
    fn a_payload_that_is_not_base64_fails_the_event_with_aws_lambda_events_message() {
        let event = |data: &str| {
            format!(
                r#"{{"Records":[{{"kinesis":{{"sequenceNumber":"1","data":{data},
                "approximateArrivalTimestamp":1}}}}]}}"#
            )
        };
        for data in [r#""not base64!""#, r#""QUJD=""#, "null", "17", "[1,2]"] {
            let ours = serde_json::from_str::<LambdaKinesisEvent>(&event(data)).map(|e| e.0);
            let theirs = serde_json::from_str::<KinesisEvent>(&event(data));
            assert_eq!(
                ours.map_err(|e| e.to_string()),
                theirs.map_err(|e| e.to_string()),
                "{data}"
            );
        }
        let LambdaKinesisEvent(event) = serde_json::from_str(&event(r#""aGk=""#)).unwrap();
        assert_eq!(event.records[0].kinesis.data.0, b"hi");
    }
}
