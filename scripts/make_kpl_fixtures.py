#!/usr/bin/env python3
"""Writes tests/fixtures/kpl/*.json: KPL aggregates made by AWS's own aggregator.

Why: `src/kpl/` decodes a format that another library writes. Testing it only against
aggregates our own encoder built would prove that our encoder and decoder agree, not that we
read what producers send. So the fixtures come from `aws-kinesis-agg`, AWS's Python
implementation of the KPL aggregation format, and are committed: `cargo test` needs no Python.

Run it again only to change the cases; the output is deterministic:

    python3 -m venv /tmp/kplvenv
    /tmp/kplvenv/bin/pip install aws-kinesis-agg==1.2.3 six==1.17.0 protobuf==7.36.2
    /tmp/kplvenv/bin/python scripts/make_kpl_fixtures.py

`aws-kinesis-agg` imports `six` and `google.protobuf` without declaring them, hence the two
extra packages. Its generated `messages_pb2.py` works with protobuf 7.36.2 (the newest when the
fixtures were made); should a later protobuf break it, pin `protobuf<8`.

Each fixture is one JSON object:

    name, description          what the case shows
    expect                     "sub_records" | "pass_through" | "error"
    outer_partition_key        the partition key the aggregate itself would be put with
    data_base64                the record's payload as Kinesis would deliver it
    sub_records                (expect == "sub_records") each {partition_key,
                               explicit_hash_key (or null), data_base64}, in order
"""

import base64
import hashlib
import json
import pathlib
import sys

from aws_kinesis_agg import MAGIC
from aws_kinesis_agg.aggregator import RecordAggregator
from aws_kinesis_agg import messages_pb2
import google.protobuf.message

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "kpl"
DIGEST_SIZE = 16


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def as_bytes(value) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else value


def aggregate(user_records):
    """Packs (partition_key, data, explicit_hash_key) triples into one aggregate."""
    aggregator = RecordAggregator()
    for partition_key, data, explicit_hash_key in user_records:
        # A full aggregate would come back here; every case is far below the 1 MB limit, so
        # this guards the fixture against silently splitting.
        assert aggregator.add_user_record(partition_key, data, explicit_hash_key) is None
    outer_partition_key, _outer_hash_key, payload = aggregator.clear_and_get().get_contents()
    assert payload.startswith(MAGIC)
    return outer_partition_key, payload


def sub_records(user_records):
    return [
        {
            "partition_key": partition_key,
            "explicit_hash_key": explicit_hash_key,
            "data_base64": b64(as_bytes(data)),
        }
        for partition_key, data, explicit_hash_key in user_records
    ]


def aggregate_case(name, description, user_records):
    outer_partition_key, payload = aggregate(user_records)
    return {
        "name": name,
        "description": description,
        "expect": "sub_records",
        "outer_partition_key": outer_partition_key,
        "data_base64": b64(payload),
        "sub_records": sub_records(user_records),
    }


def orders(count, partition_key=None):
    return [
        (
            partition_key or f"order-{i}",
            json.dumps({"order_id": str(i), "amount_cents": 100 * i + 50}),
            None,
        )
        for i in range(count)
    ]


def cases():
    yield aggregate_case(
        "one_partition_key",
        "Three sub-records under one partition key: the table holds it once.",
        orders(3, partition_key="customer-17"),
    )
    yield aggregate_case(
        "many_partition_keys",
        "Six sub-records over three partition keys, each key used twice, out of order.",
        [
            (f"customer-{key}", f"event {i} of customer {key}", None)
            for i, key in enumerate(["a", "b", "a", "c", "b", "c"])
        ],
    )
    yield aggregate_case(
        "explicit_hash_keys",
        "Explicit hash keys: two shared, one sub-record without any.",
        [
            ("k1", "routed low", "0"),
            ("k2", "routed high", "340282366920938463463374607431768211455"),
            ("k3", "routed low again", "0"),
            ("k4", "routed by partition key", None),
        ],
    )
    yield aggregate_case(
        "ten_sub_records",
        "Ten JSON orders, one partition key each, so that a test can fail the fifth.",
        orders(10),
    )
    yield aggregate_case(
        "binary_and_unicode",
        "Every byte value, an empty payload and non-ASCII partition keys.",
        [
            ("ключ-7", bytes(range(256)), None),
            ("empty", b"", None),
            ("键-😀", "payload ünïcödé", None),
        ],
    )

    outer_key, payload = aggregate(orders(4))
    corrupted = bytearray(payload)
    corrupted[-1] ^= 0x01
    yield {
        "name": "corrupted_md5",
        "description": "A valid aggregate whose last digest byte is flipped: not an aggregate, "
        "so it passes through unchanged.",
        "expect": "pass_through",
        "outer_partition_key": outer_key,
        "data_base64": b64(bytes(corrupted)),
    }

    outer_key, payload = aggregate(orders(4))
    body = payload[len(MAGIC) : -DIGEST_SIZE]
    # Cut inside the last sub-record's payload, then checksum the cut body: the digest vouches
    # for bytes that do not decode, as when a producer aggregated a buffer it had not finished.
    truncated = body[:-5]
    try:
        messages_pb2.AggregatedRecord().ParseFromString(truncated)
    except google.protobuf.message.DecodeError:
        pass
    else:
        sys.exit("the truncated body still decodes; cut elsewhere")
    yield {
        "name": "truncated_protobuf",
        "description": "Magic and a recomputed, valid MD5 around a truncated protobuf: an "
        "aggregate that cannot be decoded, an error.",
        "expect": "error",
        "outer_partition_key": outer_key,
        "data_base64": b64(MAGIC + truncated + hashlib.md5(truncated).digest()),
    }

    yield {
        "name": "plain",
        "description": "A plain JSON payload, put without aggregation: passes through unchanged.",
        "expect": "pass_through",
        "outer_partition_key": "order-42",
        "data_base64": b64(b'{"order_id":"42","amount_cents":4250}'),
    }


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    for case in cases():
        path = OUT / f"{case['name']}.json"
        path.write_text(json.dumps(case, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"wrote {path.relative_to(OUT.parent.parent.parent)}")


if __name__ == "__main__":
    main()
