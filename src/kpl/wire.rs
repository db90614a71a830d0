//! The bytes of a KPL aggregate: `F3 89 9A C2` (the magic), a protobuf `AggregatedRecord`, then
//! the 16-byte MD5 of the protobuf bytes.
//!
//! Apart from what the aggregate means (which sub-record gets which key, and what is an error),
//! so that the framing and the schema can be checked against the KPL's `messages.proto` on
//! their own. The schema is written out for `prost`, so that no build script or `protoc` is
//! needed.

use std::ops::Range;

use bytes::Bytes;
use md5::{Digest, Md5};

/// The four bytes every KPL aggregate starts with.
///
/// ```
/// use kinesis_checkpoint::kpl::MAGIC;
///
/// assert_eq!(MAGIC, [0xF3, 0x89, 0x9A, 0xC2]);
/// ```
pub const MAGIC: [u8; 4] = [0xF3, 0x89, 0x9A, 0xC2];

/// Length of the MD5 digest that ends an aggregate.
const DIGEST_LEN: usize = 16;

/// Where the protobuf message lies in `data`, when `data` is an aggregate: the magic, a
/// non-empty message, and an MD5 that matches.
pub(super) fn checked_message(data: &[u8]) -> Option<Range<usize>> {
    let rest = data.strip_prefix(&MAGIC)?;
    // As in `aws-kinesis-agg`, an empty message is not an aggregate: magic and digest alone
    // are too short to be one.
    let message_len = rest.len().checked_sub(DIGEST_LEN).filter(|&len| len > 0)?;
    let (message, digest) = rest.split_at(message_len);
    (Md5::digest(message).as_slice() == digest).then_some(MAGIC.len()..MAGIC.len() + message_len)
}

/// The aggregate's message (`AggregatedRecord` of `messages.proto`).
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct AggregatedRecord {
    #[prost(string, repeated, tag = "1")]
    pub partition_key_table: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    pub explicit_hash_key_table: Vec<String>,
    #[prost(message, repeated, tag = "3")]
    pub records: Vec<Record>,
}

/// A user record inside the aggregate. The `required` fields are `Option`s here: `prost`
/// would decode a missing one as 0 or empty, and a sub-record silently given the first
/// partition key, or an empty payload, is worse than an error.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct Record {
    #[prost(uint64, optional, tag = "1")]
    pub partition_key_index: Option<u64>,
    #[prost(uint64, optional, tag = "2")]
    pub explicit_hash_key_index: Option<u64>,
    // `Bytes` so that decoding from the record's `Bytes` slices instead of copying.
    #[prost(bytes = "bytes", optional, tag = "3")]
    pub data: Option<Bytes>,
    // Decoded so that a malformed tag makes the aggregate invalid, as it is by the schema,
    // but not exposed: the crate's `Record` has no tags, and producers rarely set them.
    #[prost(message, repeated, tag = "4")]
    pub tags: Vec<Tag>,
}

/// A tag of a user record (`Tag` of `messages.proto`).
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct Tag {
    #[prost(string, optional, tag = "1")]
    pub key: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub value: Option<String>,
}
