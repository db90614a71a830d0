//! Lambda's event read in one pass, from the bytes to [`KinesisEvent`]: the deserializers of
//! [`LambdaKinesisEvent`] (every field) and [`InvocationEvent`] (what the processor reads; the
//! rest checked where it lies and not copied), one reading with a switch between the two.
//!
//! `aws_lambda_events`' own reading of a timestamp is wrong (see [`LambdaKinesisEvent`]).
//! Fixing it through a `serde_json::Value` would read the event twice. Here each record is read
//! once, every field with
//! `aws_lambda_events`' own type (so the same defaults, the same refusals and the same
//! messages) but two: the timestamp, read to the microsecond, and the payload, read as bytes
//! and decoded where it lies by a faster decoder that refuses the same texts with the same
//! messages (but for the column of a payload that is an array, and the words for one that is
//! not UTF-8, neither of which Lambda sends).

use std::fmt;
use std::marker::PhantomData;
use std::time::{Duration, UNIX_EPOCH};

use aws_lambda_events::encodings::{Base64Data, SecondTimestamp};
use aws_lambda_events::event::kinesis::{KinesisEvent, KinesisEventRecord, KinesisRecord};
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::{InvocationEvent, LambdaKinesisEvent};

impl<'de> Deserialize<'de> for LambdaKinesisEvent {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(EventVisitor::<true>).map(Self)
    }
}

impl<'de> Deserialize<'de> for InvocationEvent {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_map(EventVisitor::<false>)
            .map(Self)
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

/// Reads the next value of `map` with `seed` (`PhantomData`: as its type reads itself) into
/// `slot`, refusing a second one as a derived struct does.
fn once<'de, A: MapAccess<'de>, S: DeserializeSeed<'de>>(
    map: &mut A,
    slot: &mut Option<S::Value>,
    name: &'static str,
    seed: S,
) -> Result<(), A::Error> {
    if slot.is_some() {
        return Err(de::Error::duplicate_field(name));
    }
    *slot = Some(map.next_value_seed(seed)?);
    Ok(())
}

/// A field no part of the processor reads, as an `Option<String>` that is always `None`: a
/// string or `null` is taken where it lies, not copied out of the input, and anything else is
/// refused as `aws_lambda_events` refuses it.
struct Unkept;

impl<'de> DeserializeSeed<'de> for Unkept {
    type Value = Option<String>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for Unkept {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `aws_lambda_events` reads the field as an `Option<String>`: the same words.
        f.write_str("a string")
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }
}

/// The event, every field kept (`ALL`, [`LambdaKinesisEvent`]) or only those the processor
/// reads ([`InvocationEvent`]).
struct EventVisitor<const ALL: bool>;

impl<'de, const ALL: bool> Visitor<'de> for EventVisitor<ALL> {
    type Value = KinesisEvent;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Lambda's Kinesis event (a JSON object)")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<KinesisEvent, A::Error> {
        let mut records = None;
        while let Some(field) = map.next_key_seed(Field(&["Records"]))? {
            match field {
                Some(_) if records.is_some() => return Err(de::Error::duplicate_field("Records")),
                Some(_) => records = Some(map.next_value_seed(Records::<ALL>)?),
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
struct Records<const ALL: bool>;

impl<'de, const ALL: bool> DeserializeSeed<'de> for Records<ALL> {
    type Value = Vec<KinesisEventRecord>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de, const ALL: bool> Visitor<'de> for Records<ALL> {
    type Value = Vec<KinesisEventRecord>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a sequence")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut records = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(record) = seq.next_element_seed(RecordSeed::<ALL>)? {
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

/// The fields of a record `InvocationEvent` keeps: `eventID` and `eventSourceARN`.
const RECORD_KEPT: [usize; 2] = [1, 4];

struct RecordSeed<const ALL: bool>;

impl<'de, const ALL: bool> DeserializeSeed<'de> for RecordSeed<ALL> {
    type Value = KinesisEventRecord;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de, const ALL: bool> Visitor<'de> for RecordSeed<ALL> {
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
                Some(7) => kinesis = Some(map.next_value_seed(KinesisSeed::<ALL>)?),
                Some(index) if ALL || RECORD_KEPT.contains(&index) => {
                    once(
                        &mut map,
                        &mut strings[index],
                        RECORD_FIELDS[index],
                        PhantomData,
                    )?;
                }
                Some(index) => once(&mut map, &mut strings[index], RECORD_FIELDS[index], Unkept)?,
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

struct KinesisSeed<const ALL: bool>;

impl<'de, const ALL: bool> DeserializeSeed<'de> for KinesisSeed<ALL> {
    type Value = KinesisRecord;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de, const ALL: bool> Visitor<'de> for KinesisSeed<ALL> {
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
                // An enumeration: read as `aws_lambda_events` reads it, with no allocation.
                Some(2) => once(&mut map, &mut encryption, KINESIS_FIELDS[2], PhantomData)?,
                // A `null` partition key is no key (`aws_lambda_events` refuses `null` for its
                // `String` but reads a missing one as ""): see `Record::partition_key`.
                Some(3) => once(&mut map, &mut partition_key, KINESIS_FIELDS[3], PhantomData)?,
                Some(4) => once(
                    &mut map,
                    &mut sequence,
                    KINESIS_FIELDS[4],
                    PhantomData::<String>,
                )?,
                Some(5) if ALL => once(&mut map, &mut version, KINESIS_FIELDS[5], PhantomData)?,
                Some(5) => once(&mut map, &mut version, KINESIS_FIELDS[5], Unkept)?,
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
/// alone (the `processor` bench). `base64-simd` (already built for the AWS
/// SDK's `aws-smithy-types`) decodes the text where the parser found it, with no `String`
/// copied from it, using the processor's vector instructions, into a vector of the payload's
/// exact length. Both decoders take the standard alphabet with canonical padding and refuse the
/// same texts (tested below, text by text); a refused text is decoded again by `base64`, rare
/// as it is, for `aws_lambda_events`' own message.
struct Payload;

impl<'de> DeserializeSeed<'de> for Payload {
    type Value = Base64Data;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        // As bytes, not as text: `serde_json` then hands over the string's bytes unescaped but
        // not checked as UTF-8, a pass over the whole payload that the decoder makes anyway,
        // since a byte outside the base64 alphabet (every byte of a multibyte character among
        // them) is refused there. The same texts are taken; a text that is not UTF-8, which
        // Lambda never sends, is refused by the decoder instead of the parser.
        deserializer.deserialize_bytes(self)
    }
}

impl Visitor<'_> for Payload {
    type Value = Base64Data;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `aws_lambda_events` reads the text as a `String`: the same words for a wrong type.
        f.write_str("a string")
    }

    fn visit_bytes<E: de::Error>(self, text: &[u8]) -> Result<Self::Value, E> {
        let mut data = Base64Data::default();
        data.0 = decode_base64(text).map_err(E::custom)?;
        Ok(data)
    }

    /// A deserializer that holds the text as a string (a `serde_json::Value`) gives it so.
    fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
        self.visit_bytes(text.as_bytes())
    }
}

/// `text` decoded as `aws_lambda_events` decodes a payload (the `base64` crate's standard
/// engine), by `base64-simd`.
fn decode_base64(text: &[u8]) -> Result<Vec<u8>, base64::DecodeError> {
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
mod tests;
