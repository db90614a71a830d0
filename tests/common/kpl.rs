//! KPL aggregates for tests, encoded by hand (not with the decoder's schema), so a test of
//! de-aggregation does not share the code it checks.

use kinesis_checkpoint::kpl::MAGIC;
use md5::{Digest, Md5};

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(u8::try_from(value & 0x7f).unwrap() | 0x80);
        value >>= 7;
    }
    out.push(u8::try_from(value).unwrap());
}

fn field(out: &mut Vec<u8>, tag: u64, value: &[u8]) {
    varint(out, (tag << 3) | 2);
    varint(out, value.len() as u64);
    out.extend_from_slice(value);
}

/// The aggregate of `records` (partition key, data), in order: the magic, the protobuf
/// `AggregatedRecord` (a partition key table without repeats, no explicit hash keys), its MD5.
pub fn aggregate(records: &[(&str, &[u8])]) -> Vec<u8> {
    let mut keys: Vec<&str> = Vec::new();
    let mut message = Vec::new();
    let mut entries = Vec::new();
    for (key, data) in records {
        let index = keys.iter().position(|k| k == key).unwrap_or_else(|| {
            keys.push(key);
            keys.len() - 1
        });
        let mut record = Vec::new();
        varint(&mut record, 1 << 3);
        varint(&mut record, index as u64);
        field(&mut record, 3, data);
        entries.push(record);
    }
    for key in &keys {
        field(&mut message, 1, key.as_bytes());
    }
    for record in &entries {
        field(&mut message, 3, record);
    }
    [&MAGIC[..], &message, Md5::digest(&message).as_slice()].concat()
}
