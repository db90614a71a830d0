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


# --- DynamoDB Streams ---------------------------------------------------------------------------
# Window events of the orders table's stream (template.yaml's OrdersTable, StreamViewType
# NEW_IMAGE), as Lambda sends them to a mapping with TumblingWindowInSeconds: the records plus
# `shardId`, `eventSourceARN`, `window`, `state`, `isFinalInvokeForWindow` and
# `isWindowTerminatedEarly`. Written as dynamodb-*.json. Shapes from real AWS where known:
# - stream label `YYYY-MM-DDTHH:MM:SS.mmm`; shard id `shardId-<20-digit creation epoch ms>-<8 hex>`,
#   created just after the stream (FACTS.md section 5);
# - sequence numbers of 21 digits, increasing, not consecutive; `eventID` 32 hex digits;
#   `eventVersion` 1.1; `ApproximateCreationDateTime` whole epoch seconds.
import datetime  # noqa: E402
import hashlib  # noqa: E402

TABLE = "kinesis-checkpoint-orders-table"
LABEL = "2025-11-30T13:58:07.614"
STREAM_ARN = f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{TABLE}/stream/{LABEL}"
CREATED_MS = int(datetime.datetime(2025, 11, 30, 13, 58, 8, 214000, datetime.timezone.utc).timestamp() * 1000)
DDB_SHARD = f"shardId-{CREATED_MS:020d}-5c1d9a7e"
DDB_BASE = 800000000031415926535
WINDOW = {"start": "2025-11-30T14:00:00Z", "end": "2025-11-30T14:15:00Z"}


def change(n, event_name, order_id, amount_cents=None, **extra):
    """One change of the orders table: INSERT and MODIFY carry the new image, REMOVE the keys."""
    sequence = str(DDB_BASE + 137 * n)
    keys = {"order_id": {"S": order_id}}
    dynamodb = {"ApproximateCreationDateTime": 1764511500 + n, "Keys": keys}
    if event_name != "REMOVE":
        image = {"order_id": {"S": order_id}, "amount_cents": {"N": str(amount_cents)}, "currency": {"S": "EUR"}}
        image.update({name: {"S": value} for name, value in extra.items()})
        dynamodb["NewImage"] = image
    dynamodb.update(
        SequenceNumber=sequence,
        SizeBytes=len(json.dumps(keys)) + len(json.dumps(dynamodb.get("NewImage", {}))) // 2,
        StreamViewType="NEW_IMAGE",
    )
    return {
        "eventID": hashlib.md5(f"{DDB_SHARD}:{sequence}".encode()).hexdigest(),
        "eventName": event_name,
        "eventVersion": "1.1",
        "eventSource": "aws:dynamodb",
        "awsRegion": REGION,
        "dynamodb": dynamodb,
        "eventSourceARN": STREAM_ARN,
    }


def write_window(name, records, final=False):
    event = {
        "Records": records,
        "window": WINDOW,
        "state": {},
        "shardId": DDB_SHARD,
        "eventSourceARN": STREAM_ARN,
        "isFinalInvokeForWindow": final,
        "isWindowTerminatedEarly": False,
    }
    (HERE / f"dynamodb-{name}").write_text(json.dumps(event, indent=2) + "\n")


changes = [
    change(0, "INSERT", "A-1", 1250),
    change(1, "INSERT", "A-2", 800),
    change(2, "MODIFY", "A-1", 1500),
    change(3, "REMOVE", "A-2"),
]
write_window("window.json", changes)
write_window("window-redelivered.json", changes)
transient_changes = [
    change(10, "INSERT", "B-1", 400),
    change(11, "INSERT", "B-2", 410, fail="transient"),
    change(12, "MODIFY", "B-1", 420),
]
write_window("transient.json", transient_changes)
write_window("transient-redelivered.json", transient_changes[1:])
write_window("poison.json", [
    change(20, "INSERT", "C-1", 990, fail="poison"),
    change(21, "INSERT", "C-2", 995),
])
# The window's end: Lambda's last, synchronous invoke for it; here with no records.
write_window("final.json", [], final=True)
