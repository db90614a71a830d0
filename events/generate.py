#!/usr/bin/env python3
"""Writes the sample Kinesis events of this folder, in the exact shape Lambda sends.

Run it from anywhere (`python3 events/generate.py`); the files it writes are committed, so
nothing else needs Python. Sequence numbers are 56 digits, as Kinesis issues them, and increase
across the files in the order an event source mapping would deliver them.
"""
import base64
import json
import pathlib

HERE = pathlib.Path(__file__).resolve().parent
REGION, ACCOUNT, STREAM = "us-east-1", "123456789012", "orders"
ARN = f"arn:aws:kinesis:{REGION}:{ACCOUNT}:stream/{STREAM}"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/kinesis-checkpoint-ledger"
# A real sequence number's shape: 56 digits.
BASE = 49656139270218735118962416178386539874290435484613640194
ARRIVAL = 1764512345.125


def record(shard, n, order_id, amount_cents, **extra):
    sequence = str(BASE + n)
    payload = {"order_id": order_id, "amount_cents": amount_cents, "currency": "EUR", **extra}
    return {
        "kinesis": {
            "kinesisSchemaVersion": "1.0",
            "partitionKey": order_id,
            "sequenceNumber": sequence,
            "data": base64.b64encode(json.dumps(payload).encode()).decode(),
            "approximateArrivalTimestamp": ARRIVAL + n,
        },
        "eventSource": "aws:kinesis",
        "eventVersion": "1.0",
        "eventID": f"{shard}:{sequence}",
        "eventName": "aws:kinesis:record",
        "invokeIdentityArn": ROLE,
        "awsRegion": REGION,
        "eventSourceARN": ARN,
    }


def write(name, records):
    (HERE / name).write_text(json.dumps({"Records": records}, indent=2) + "\n")


SHARD0 = "shardId-000000000000"
first = [record(SHARD0, i, f"A-{1000 + i % 3}", 1000 + 250 * i) for i in range(5)]
write("batch.json", first)
# Lambda redelivers a batch unchanged: after a time-out, an error, a mapping update.
write("redelivered.json", first)
# The third record fails once (a downstream outage); Lambda redelivers from it.
transient = [
    record(SHARD0, 10 + i, f"B-{2000 + i % 2}", 500 + i,
           **({"fail": "transient", "fail_times": 1} if i == 2 else {}))
    for i in range(5)
]
write("transient.json", transient)
# What the event source mapping delivers next: the batch again from the reported record.
write("transient-redelivered.json", transient[2:])
# The second record can never succeed.
poison = [
    record(SHARD0, 20 + i, f"C-{3000 + i}", 700 + i, **({"fail": "poison"} if i == 1 else {}))
    for i in range(4)
]
write("poison.json", poison)
# After shardId-000000000000 was split: the first batch of one child.
write("child-shard.json", [record("shardId-000000000001", 100 + i, f"D-{4000 + i}", 900 + i) for i in range(3)])
