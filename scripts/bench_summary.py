#!/usr/bin/env python3
"""Prints the processor's cost beside the bare loop's, and met or missed for each target.

`benches/processor.rs` measures both in one run; criterion stores each estimate in
`target/criterion/<group>/<function>/<size>/new/estimates.json`. Every figure printed here is
read from those files (the median of each benchmark); nothing is assumed.

Per starting point (`batch_*`: the deserialized `KinesisEvent`; `bytes_*`: the event's JSON
bytes), handler and batch size: the median time of each side, their ratio and what the
processor adds per record. Then the targets of issue 17 (BENCHMARKS.md, section 1), each with
the figures it was judged on. The processor is measured as a function runs it: one processor
and store kept across batches, each batch the shard's next. Beside it, from the `KinesisEvent`
and not judged, `processor_new_store`: a processor and store built and freed with each batch,
as a function would if it built them per invocation.

- with the JSON handler, the processor takes at most 1.2 times the bare loop, at every size;
- with the JSON and with the empty handler, it adds under 0.25 us per record at every size,
  and flat from 100 to 10,000 records: the largest cost added per record of the three sizes is
  at most 1.5 times the smallest, or within 50 ns of it (a difference the machine's noise
  makes);
- a fully duplicate batch costs under 0.2 us per record at every size. Its floor is printed
  beside it, not judged. From the `KinesisEvent`: the bare loop with the empty handler, which
  only moves each record out of the event and frees it, as whoever owns the event must. From
  the bytes: `duplicate/runtime_reading`, `lambda_runtime`'s reading of the event for a payload
  type that reads nothing of it (`IgnoredAny`), what every function `lambda_runtime::run` runs
  pays before its handler sees a field. Under it, when `make bench-json-readers` ran into the
  same directory: other JSON readers of the same event (`benches/json_readers`), which a
  function could use on the bytes it took before the runtime reads them (`Runtime::layer`).

Each target is judged from both starting points, and the last lines count what each met. The
issue's item 1 names its hot path "from the event's bytes to dispatch": the `bytes_*` figures
are what an invocation runs (`Processor::service` reads the body the runtime received, where a
bare function's runtime deserializes it into `KinesisEvent`). From the `KinesisEvent` is the
cost for a caller that deserialized the event itself (`Processor::process`).

Beside the ratio from the `KinesisEvent`, and not judged, the bench's bounds: `least_processor`,
the least any processor that dedupes must add to the bare loop in the same one pass (each
record's stream and shard checked, its sequence number read and compared with a checkpoint, the
last one done kept); and the same work in the processor's three passes (read into a block,
dispatched from it, freed), over the whole batch (`least_in_passes`) and 64 records at a time
(`least_in_chunks`), and in two steps (`least_in_two_phases`: each record's shard and sequence
number read first, then the passes 64 records at a time, as the processor reads a large event),
and in two passes over the event where it lies, with no block (`least_in_place`).
So a miss shows how much of it is the processor's design and how much the work itself.

A target whose benchmarks are missing is reported as not measured.

By default each benchmark's figure is criterion's median. With `--fastest`, it is its fastest
sample instead (the least time per iteration among the samples): on a machine shared with
other work, load only ever adds time, so the fastest sample is the closer to the code's own
cost, and the one to compare two runs made at different loads with.

Usage: scripts/bench_summary.py [--fastest] [CRITERION_DIR] (default: target/criterion).
"""
import json
import sys
from pathlib import Path

SIZES = (100, 1_000, 10_000)
RATIO_MAX = 1.2
ADDED_MAX_NS = 250.0
FLAT_RATIO = 1.5
FLAT_SLACK_NS = 50.0
DUPLICATE_MAX_NS = 200.0
# The bench's bounds beside the processor from the `KinesisEvent` (`benches/processor.rs`).
BOUNDS = (
    ("least_processor", "the least a one-pass processor takes"),
    ("least_in_chunks", "the same in the processor's passes, 64 records at a time"),
    ("least_in_passes", "the same in the processor's passes over the whole batch"),
    ("least_in_two_phases", "the same in two steps, positions first, then 64 at a time"),
    ("least_in_place", "the same in two passes over the event where it lies, no block"),
)
# Beside the floor from the bytes, not judged: other readers of the same event, from
# `benches/json_readers` (a workspace of its own; `make bench-json-readers`).
JSON_READERS = (
    ("serde_json_ignored", "serde_json, the event read into nothing, without the runtime"),
    ("serde_json_positions", "serde_json, each record's eventID and sequence number only"),
    ("sonic_rs_ignored", "sonic-rs, the event read into nothing"),
    ("sonic_rs_positions", "sonic-rs, each record's eventID and sequence number only"),
    ("simd_json_positions", "simd-json, the same (parsed in place, the copy not timed)"),
    ("sonic_rs_lazy_unchecked_ignored",
     "sonic-rs, lazily, each record's text found without validating it"),
    ("sonic_rs_lazy_positions", "sonic-rs, lazily, each record's eventID and sequence number"),
    ("sonic_rs_lazy_unchecked_positions", "sonic-rs, the same, unchecked (valid JSON assumed)"),
    ("memchr_quotes", "no reader: the quote characters alone found (memchr)"),
)
STARTS = (("batch", "from the KinesisEvent"), ("bytes", "from the event's bytes"))
# The duplicate batch's benchmark for each starting point.
DUPLICATE_FUNCTION = {"batch": "processor", "bytes": "processor_from_bytes"}
# Issue 17's item 1 names its hot path "from the event's bytes to dispatch": what
# `Processor::service` runs for each invocation, and a bare function's runtime deserializes.
HOT_PATH = "the hot path of issue 17, item 1: what an invocation runs"


ESTIMATOR = "median"


def median_ns(root: Path, group: str, function: str, size: int) -> float | None:
    """One iteration's time by the chosen estimator: criterion's median, or its fastest sample
    (each sample's time over its iterations, the least of them)."""
    folder = root / group / function / str(size) / "new"
    if ESTIMATOR == "fastest":
        path = folder / "sample.json"
        if not path.exists():
            return None
        sample = json.loads(path.read_text())
        return min(time / iters for time, iters in zip(sample["times"], sample["iters"]))
    path = folder / "estimates.json"
    if not path.exists():
        return None
    return json.loads(path.read_text())["median"]["point_estimate"]


def verdict(ok: bool | None) -> str:
    return "not measured" if ok is None else ("met" if ok else "MISSED")


def main() -> None:
    global ESTIMATOR
    args = sys.argv[1:]
    if args[:1] == ["--fastest"]:
        ESTIMATOR = "fastest"
        args = args[1:]
    root = Path(args[0] if args else "target/criterion")
    print(f"estimator: {ESTIMATOR} ({root})")
    # (start, handler) -> {size: (bare, processor)}
    pairs: dict[tuple[str, str], dict[int, tuple[float, float]]] = {}
    print(f"{'start':<6} {'handler':<8} {'records':>8} {'bare loop':>12} {'processor':>12} "
          f"{'ratio':>7} {'added/record':>13}")
    for start, _ in STARTS:
        for handler in ("json", "empty"):
            group = f"{start}_{handler}"
            for size in SIZES:
                bare = median_ns(root, group, "bare_loop", size)
                processor = median_ns(root, group, "processor", size)
                if bare is None or processor is None:
                    continue
                pairs.setdefault((start, handler), {})[size] = (bare, processor)
                print(f"{start:<6} {handler:<8} {size:>8} {bare / 1e3:>10.1f}us "
                      f"{processor / 1e3:>10.1f}us {processor / bare:>7.2f} "
                      f"{(processor - bare) / size:>11.0f}ns")
    for handler in ("json", "empty"):
        for size in SIZES:
            bare = median_ns(root, f"batch_{handler}", "bare_loop", size)
            fresh = median_ns(root, f"batch_{handler}", "processor_new_store", size)
            if bare is not None and fresh is not None:
                print(f"{'batch':<6} {handler:<8} {size:>8} {bare / 1e3:>10.1f}us "
                      f"{fresh / 1e3:>10.1f}us {fresh / bare:>7.2f} "
                      f"{(fresh - bare) / size:>11.0f}ns  a new store each batch (not judged)")
    print()
    duplicates: dict[str, dict[int, float]] = {}
    print(f"{'duplicate batch':<22} {'records':>8} {'processor':>12} {'per record':>11}")
    for function, label in (("processor", "from the KinesisEvent"),
                            ("processor_from_bytes", "from the bytes"),
                            ("runtime_reading", "the runtime's reading")):
        for size in SIZES:
            duplicate = median_ns(root, "duplicate", function, size)
            if duplicate is not None:
                duplicates.setdefault(function, {})[size] = duplicate
                print(f"{label:<22} {size:>8} {duplicate / 1e3:>10.1f}us "
                      f"{duplicate / size:>9.0f}ns")

    print()
    print("targets (issue 17, item 1)")

    def complete(measured: dict | None) -> bool:
        return measured is not None and all(size in measured for size in SIZES)

    # start -> [(target, verdict)]: what each starting point met, summed up at the end.
    verdicts: dict[str, list[bool | None]] = {start: [] for start, _ in STARTS}
    for start, label in STARTS:
        json_pairs = pairs.get((start, "json"))
        ok = None
        figures = ""
        if complete(json_pairs):
            ratios = [json_pairs[s][1] / json_pairs[s][0] for s in SIZES]
            ok = all(r <= RATIO_MAX for r in ratios)
            figures = " / ".join(f"{r:.2f}" for r in ratios)
        verdicts[start].append(ok)
        print(f"  {verdict(ok):<12} {label}: JSON handler <= {RATIO_MAX} x the bare loop "
              f"({figures} x)")
        for bound, what in BOUNDS:
            least = [median_ns(root, f"{start}_json", bound, s) for s in SIZES]
            if complete(json_pairs) and all(ns is not None for ns in least):
                ratios = " / ".join(f"{ns / json_pairs[s][0]:.2f}" for s, ns in zip(SIZES, least))
                print(f"  {'':<12} {what}, in the same run (not judged): {ratios} x")
        for handler in ("json", "empty"):
            measured = pairs.get((start, handler))
            ok_added = ok_flat = None
            figures = ""
            if complete(measured):
                added = [(measured[s][1] - measured[s][0]) / s for s in SIZES]
                ok_added = all(a < ADDED_MAX_NS for a in added)
                # Judged over the three sizes: the largest added cost against the smallest
                # (a negative one, the processor faster than the loop, counts as zero).
                floor = max(min(added), 0.0)
                ok_flat = max(added) <= max(floor * FLAT_RATIO, floor + FLAT_SLACK_NS)
                figures = " / ".join(f"{a:.0f}" for a in added)
            verdicts[start] += [ok_added, ok_flat]
            print(f"  {verdict(ok_added):<12} {label}: {handler} handler adds < "
                  f"{ADDED_MAX_NS:.0f} ns per record ({figures} ns)")
            print(f"  {verdict(ok_flat):<12} {label}: {handler} handler's added cost flat "
                  f"from 100 to 10,000 ({figures} ns)")
        measured = duplicates.get(DUPLICATE_FUNCTION[start])
        ok = None
        figures = ""
        if complete(measured):
            per_record = [measured[s] / s for s in SIZES]
            ok = all(p < DUPLICATE_MAX_NS for p in per_record)
            figures = " / ".join(f"{p:.0f}" for p in per_record)
        verdicts[start].append(ok)
        print(f"  {verdict(ok):<12} {label}: a fully duplicate batch < "
              f"{DUPLICATE_MAX_NS:.0f} ns per record ({figures} ns)")
        # The target is absolute; its floor is not zero. Printed beside the verdict (not
        # judged), so a miss shows whether the processor or the floor is above it.
        if start == "batch":
            # Whoever owns the event frees it, and the bare loop with the empty handler does
            # nothing else with each record.
            floor = {s: median_ns(root, "batch_empty", "bare_loop", s) for s in SIZES}
            what = "the bare loop with the empty handler (it only moves and frees each record)"
        else:
            # `lambda_runtime` reads the bytes through `serde_json` for any payload type; one
            # that reads nothing (`IgnoredAny`) still has every value's end found.
            floor = {s: median_ns(root, "duplicate", "runtime_reading", s) for s in SIZES}
            what = ("lambda_runtime's reading of the event for a payload type that reads "
                    "nothing of it")
        if all(ns is not None for ns in floor.values()):
            floors = " / ".join(f"{floor[s] / s:.0f}" for s in SIZES)
            print(f"  {'':<12} the floor, {what}: {floors} ns per record")
        if start == "bytes":
            # The bytes taken before the runtime reads them, read by another reader
            # (`make bench-json-readers`, into the same directory).
            for reader, what in JSON_READERS:
                times = [median_ns(root, "json_readers", reader, s) for s in SIZES]
                if all(ns is not None for ns in times):
                    figures = " / ".join(f"{ns / s:.0f}" for s, ns in zip(SIZES, times))
                    print(f"  {'':<12} {what}: {figures} ns per record")

    print()
    for start, label in STARTS:
        judged = verdicts[start]
        met = sum(1 for ok in judged if ok)
        measured = sum(1 for ok in judged if ok is not None)
        role = HOT_PATH if start == "bytes" else "an event already deserialized by the caller"
        print(f"  {label} ({role}): {met} of {len(judged)} targets met"
              + ("" if measured == len(judged) else f", {len(judged) - measured} not measured"))

if __name__ == "__main__":
    main()
