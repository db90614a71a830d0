#!/usr/bin/env python3
"""The Powertools side of `make bench-compare` (BENCHMARKS.md, "Side by side with Powertools").

The ledger function as a Powertools for AWS Lambda (Python) user would write it: `BatchProcessor`
with `process_partial_response`, and a record handler made idempotent with `@idempotent_function`
on a `DynamoDBPersistenceLayer`, keyed on the record's `eventID`. The handler does what the
ledger's does (`functions/ledger/src/lib.rs`): reads the order, rejects an empty `order_id` or a
`"fail": "poison"` order, fails a `"fail": "transient"` one on its first `fail_times` attempts
(counted in the ledger table), and adds the amount to the order's item with the same
`UpdateItem`.

Two sources (`--event-type`):
- `kinesis` (the default): `EventType.KinesisDataStreams`; the order is the record's JSON data;
  `eventID` is `shard:sequence`.
- `dynamodb-streams`: `EventType.DynamoDBStreams`; the order is the change's `NewImage`
  (deserialized by Powertools: `amount_cents` is a `Decimal`), a REMOVE is done without an
  effect; `eventID` is the change's own 32-hex id. The event files are the toolkit's window
  events: Powertools reads their `Records` and ignores the window's fields, as it would under a
  mapping without a window (it needs none: it keeps no state per shard). Its answer has no
  `state`, so under the toolkit's window mapping Lambda would fail it; Powertools does not run
  under one.

`scripts/bench-compare` runs it beside the toolkit's driver (`functions/ledger/examples/
bench_compare.rs`) with the same protocol: the event files are arguments, read before the first
batch; each line on standard input names one; each line on standard output is that batch's
figures as JSON (`records`, `processed`, `failures`, `wall_ns`, `cpu_ns`).

The handler runs in this process, as Lambda's Python runtime would run it: the timed part is the
invocation's body read from JSON (the runtime's `json.loads`), the handler, and the answer
serialized. CPU time is `time.process_time()` around it (every thread of this process).

    .venv/bin/python scripts/bench_compare/powertools_side.py --endpoint http://127.0.0.1:PORT \\
        --idempotency-table IDEMPOTENCY --ledger-table LEDGER [--event-type dynamodb-streams] EVENT.json...
"""

import argparse
import json
import os
import sys
import time
from decimal import Decimal

# Powertools names the idempotency key after the function; set before it is imported.
os.environ.setdefault("AWS_LAMBDA_FUNCTION_NAME", "ledger-powertools")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ.setdefault("AWS_ACCESS_KEY_ID", "test")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "test")
# No logs on either side: the toolkit's driver installs no subscriber.
os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")

import boto3  # noqa: E402
from aws_lambda_powertools.utilities.batch import (  # noqa: E402
    BatchProcessor,
    EventType,
    process_partial_response,
)
from aws_lambda_powertools.utilities.data_classes.dynamo_db_stream_event import (  # noqa: E402
    DynamoDBRecord,
    DynamoDBRecordEventName,
)
from aws_lambda_powertools.utilities.data_classes.kinesis_stream_event import (  # noqa: E402
    KinesisStreamRecord,
)
from aws_lambda_powertools.utilities.idempotency import (  # noqa: E402
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)


class Context:
    """The part of Lambda's context that Powertools reads: the time left, for in-progress expiry."""

    function_name = os.environ["AWS_LAMBDA_FUNCTION_NAME"]
    function_version = "$LATEST"
    invoked_function_arn = f"arn:aws:lambda:us-east-1:123456789012:function:{function_name}"
    memory_limit_in_mb = 1024

    def __init__(self, request_id: str, millis: int) -> None:
        self.aws_request_id = request_id
        self._deadline = time.monotonic() + millis / 1000

    def get_remaining_time_in_millis(self) -> int:
        return int((self._deadline - time.monotonic()) * 1000)


class Rejected(Exception):
    """A record that can never succeed (the ledger's `Outcome::reject`)."""


class Transient(Exception):
    """A record to retry (the ledger's `Outcome::retry`)."""


def kinesis_order(record: KinesisStreamRecord) -> tuple[dict | None, str]:
    """A Kinesis record's order (its JSON data) and sequence number."""
    try:
        order = record.kinesis.data_as_json()
    except ValueError as error:
        raise Rejected(f"not an order: {error}") from error
    return order, record.kinesis.sequence_number


def dynamodb_order(record: DynamoDBRecord) -> tuple[dict | None, str]:
    """A DynamoDB change's order (its new image, numbers as `int`) and sequence number; no order
    for a REMOVE."""
    if record.event_name == DynamoDBRecordEventName.REMOVE:
        return None, record.dynamodb.sequence_number
    image = record.dynamodb.new_image
    order = {name: int(value) if isinstance(value, Decimal) and value == int(value) else value
             for name, value in image.items()}
    return order, record.dynamodb.sequence_number


SOURCES = {
    "kinesis": (EventType.KinesisDataStreams, kinesis_order),
    "dynamodb-streams": (EventType.DynamoDBStreams, dynamodb_order),
}


def build(endpoint: str, idempotency_table: str, ledger_table: str, event_type: str = "kinesis"):
    """The function's handler, and a counter of records applied (the handler's body ran)."""
    client = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
    persistence = DynamoDBPersistenceLayer(table_name=idempotency_table, boto3_client=client)
    config = IdempotencyConfig(event_key_jmespath="eventID", raise_on_no_idempotency_key=True)
    powertools_type, read_order = SOURCES[event_type]
    processor = BatchProcessor(event_type=powertools_type)
    applied = [0]

    def attempt(sequence: str) -> int:
        output = client.update_item(
            TableName=ledger_table,
            Key={"order_id": {"S": f"_attempts:{sequence}"}},
            UpdateExpression="ADD attempts :one",
            ExpressionAttributeValues={":one": {"N": "1"}},
            ReturnValues="UPDATED_NEW",
        )
        return int(output.get("Attributes", {}).get("attempts", {}).get("N", "1"))

    @idempotent_function(data_keyword_argument="record", persistence_store=persistence, config=config)
    def record_handler(record: KinesisStreamRecord | DynamoDBRecord) -> dict:
        order, sequence = read_order(record)
        if order is None:
            # A REMOVE: done, nothing to apply.
            return {"sequence": sequence}
        order_id = order.get("order_id") if isinstance(order, dict) else None
        if not isinstance(order_id, str) or not order_id or not isinstance(order.get("amount_cents"), int):
            raise Rejected("not an order, or an empty order_id")
        if order.get("fail") == "poison":
            raise Rejected(f"order {order_id} is marked poison")
        if order.get("fail") == "transient" and attempt(sequence) <= order.get("fail_times", 1):
            raise Transient(f"order {order_id}: simulated transient failure")
        if order.get("pause_ms"):
            time.sleep(order["pause_ms"] / 1000)
        client.update_item(
            TableName=ledger_table,
            Key={"order_id": {"S": order_id}},
            UpdateExpression="ADD total_cents :amount, applied :one SET last_sequence = :seq, currency = :currency",
            ExpressionAttributeValues={
                ":amount": {"N": str(order["amount_cents"])},
                ":one": {"N": "1"},
                ":seq": {"S": sequence},
                ":currency": {"S": order.get("currency", "EUR")},
            },
        )
        applied[0] += 1
        return {"order_id": order_id, "sequence": sequence}

    def handler(event: dict, context: Context) -> dict:
        config.register_lambda_context(context)
        return process_partial_response(
            event=event, record_handler=record_handler, processor=processor, context=context
        )

    return handler, applied


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--idempotency-table", required=True)
    parser.add_argument("--ledger-table", required=True)
    parser.add_argument("--event-type", choices=sorted(SOURCES), default="kinesis")
    parser.add_argument("events", nargs="*")
    args = parser.parse_args()
    handler, applied = build(args.endpoint, args.idempotency_table, args.ledger_table, args.event_type)
    bodies = {}
    for path in args.events:
        with open(path, "rb") as file:
            bodies[path] = file.read()
    for invocation, line in enumerate(sys.stdin, start=1):
        path = line.strip()
        if path not in bodies:
            sys.exit(f"{path} is not one of the event files given as arguments")
        body = bodies[path]
        context = Context(f"bench-{invocation}", 900_000)
        before_applied = applied[0]

        cpu_before = time.process_time_ns()
        started = time.perf_counter_ns()
        event = json.loads(body)
        response = handler(event, context)
        answer = json.dumps(response)
        wall = time.perf_counter_ns() - started
        cpu = time.process_time_ns() - cpu_before

        failures = [f["itemIdentifier"] for f in json.loads(answer)["batchItemFailures"]]
        records = len(event["Records"])
        processed = applied[0] - before_applied
        print(
            json.dumps(
                {
                    "event": path,
                    "records": records,
                    "processed": processed,
                    # Records answered from the idempotency table without running the handler.
                    "duplicates": records - processed - len(failures),
                    "failures": failures,
                    "wall_ns": wall,
                    "cpu_ns": cpu,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
