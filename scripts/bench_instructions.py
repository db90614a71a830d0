#!/usr/bin/env python3
"""Counts the instructions each benchmark of `benches/processor.rs` executes per record.

On a machine shared with other work, criterion's times move by up to 8 x between runs (see
BENCHMARKS.md, section 1); an instruction count does not: the same binary given the same input
executes the same instructions whatever else runs. This script runs the bench binary in its
count mode (`PROCESSOR_BENCH_COUNT=<group>/<function>/<size>/<iterations>`: the benchmark's body
`iterations` times, outside criterion) under `valgrind --tool=callgrind`, counting only inside
the bench's `counted` function (the copy of the input is made outside it, as criterion makes it
outside the timed part), and prints instructions per record, the bare loop beside the processor,
and what the processor adds per record; and, from the `KinesisEvent`, what the bench's bounds
add: the least one-pass processor (`least_processor`), and its work in the processor's passes,
over the whole batch (`least_in_passes`), 64 records at a time (`least_in_chunks`), and in two
steps, positions first (`least_in_two_phases`), and in two passes over the event where it lies
(`least_in_place`).

With `--cache`, callgrind also simulates the data caches (`--cache-sim=yes`, this machine's L1d
as the first level and its L2 per core as the last, read from `/sys`; callgrind simulates two
levels only, and with a shared L3 of many megabytes as the last, most batches would fit; 48 KB
and 2 MB, an Intel Xeon's, where `/sys` does not say) and the script prints the
misses per record beside the instructions: D1 (first level) and LL (the L2, the last level
simulated), the bare loop's, the processor's and what it adds. Like the instruction count, a
simulated miss count is the same whatever else the machine runs; it shows what an instruction
count cannot, the passes over memory that a record costs.

It judges nothing: an instruction is not a unit of time (a cache miss or an atomic costs many
cycles, an allocation's cost depends on the heap's state), so the targets of issue 17, which
are times, stay judged on criterion's figures by `scripts/bench_summary.py`. What the count
shows is where the processor's own work is, and whether a change removed some of it.

By default each benchmark runs until at least 2,000 records are counted (20 iterations of 100
records, 2 of 1,000 or 10,000): over 2 iterations of 100, one consolidation of glibc's fast bins
falling inside the counted part rather than outside it moved the count by 300 instructions
per record. `--iterations N` sets one count for all.

Usage: scripts/bench_instructions.py BENCH_BINARY [--iterations N] [--sizes 100,1000,10000]
       [--only GROUP/FUNCTION] [--keep DIR] [--cache]

BENCH_BINARY is `target/release/deps/processor-<hash>` (printed by
`cargo bench --bench processor --no-run`). With `--keep DIR`, callgrind's output files stay in
DIR for `callgrind_annotate`.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

BENCHMARKS = (
    ("batch_json", "bare_loop"),
    ("batch_json", "least_processor"),
    ("batch_json", "least_in_chunks"),
    ("batch_json", "least_in_passes"),
    ("batch_json", "least_in_two_phases"),
    ("batch_json", "least_in_place"),
    ("batch_json", "processor"),
    ("batch_json", "processor_new_store"),
    ("batch_empty", "bare_loop"),
    ("batch_empty", "least_processor"),
    ("batch_empty", "least_in_chunks"),
    ("batch_empty", "least_in_passes"),
    ("batch_empty", "least_in_two_phases"),
    ("batch_empty", "least_in_place"),
    ("batch_empty", "processor"),
    ("batch_empty", "processor_new_store"),
    ("bytes_json", "bare_loop"),
    ("bytes_json", "processor"),
    ("bytes_empty", "bare_loop"),
    ("bytes_empty", "processor"),
    ("duplicate", "processor"),
    ("duplicate", "processor_from_bytes"),
    ("duplicate", "runtime_reading"),
)


# The caches `--cache` simulates when the machine does not say (an Intel Xeon's): its L1d and L2 per core (size, ways, line).
DEFAULT_CACHES = ("--D1=49152,12,64", "--LL=2097152,16,64")

# The bounds the bench runs beside the processor (`benches/processor.rs`), printed under it.
BOUNDS = (
    ("least_processor", "the least a one-pass processor executes (least_processor)"),
    ("least_in_chunks", "the same in the processor's passes, 64 records at a time"),
    ("least_in_passes", "the same in the processor's passes over the whole batch"),
    ("least_in_two_phases", "the same in two steps, positions first, then 64 at a time"),
    ("least_in_place", "the same in two passes over the event where it lies, no block"),
)


def machine_caches() -> tuple[str, ...]:
    """This machine's L1d and L2 per core as callgrind's options, read from
    `/sys/devices/system/cpu/cpu0/cache`: the misses counted are those of the machine whose
    times they explain (32 KB and 512 KB on an AMD EPYC, 48 KB and 2 MB on
    an Intel Xeon)."""
    found = {}
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level, kind, size, ways, line = (
                (index / name).read_text().strip()
                for name in ("level", "type", "size", "ways_of_associativity",
                             "coherency_line_size")
            )
        except OSError:
            continue
        if (level, kind) in (("1", "Data"), ("2", "Unified")) and size.endswith("K"):
            found[level] = f"{int(size[:-1]) * 1024},{ways},{line}"
    if set(found) != {"1", "2"}:
        return DEFAULT_CACHES
    return (f"--D1={found['1']}", f"--LL={found['2']}")


def counts(binary: str, spec: str, out: Path, cache: bool) -> dict[str, int]:
    """The events counted inside `counted` for the benchmark `spec`: `Ir` (instructions) and,
    with `cache`, the simulated misses (`D1mr`, `D1mw`, `DLmr`, `DLmw`, ...)."""
    subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--toggle-collect=*counted*",
            f"--callgrind-out-file={out}",
            *(("--cache-sim=yes", *machine_caches()) if cache else ()),
            binary,
        ],
        env={**os.environ, "PROCESSOR_BENCH_COUNT": spec},
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    events: list[str] = []
    for line in out.read_text().splitlines():
        if line.startswith("events:"):
            events = line.split()[1:]
        match = re.match(r"(?:summary|totals):\s+([\d ]+)$", line)
        if match and events:
            return dict(zip(events, (int(n) for n in match.group(1).split())))
    raise RuntimeError(f"no total in {out}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("binary")
    parser.add_argument("--iterations", type=int)
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--only", action="append", default=[])
    parser.add_argument("--keep")
    parser.add_argument("--cache", action="store_true")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp())
    folder.mkdir(parents=True, exist_ok=True)
    wanted = [b for b in BENCHMARKS if not args.only or "/".join(b) in args.only]
    # (group, function, size) -> per record: instructions, D1 misses, LL misses.
    per_record: dict[tuple[str, str, int], tuple[float, float, float]] = {}
    for group, function in wanted:
        for size in sizes:
            iterations = args.iterations or max(2, -(-2_000 // size))
            spec = f"{group}/{function}/{size}/{iterations}"
            out = folder / f"callgrind.{group}.{function}.{size}.out"
            total = counts(args.binary, spec, out, args.cache)
            records = iterations * size
            figures = (
                total["Ir"] / records,
                (total.get("D1mr", 0) + total.get("D1mw", 0)) / records,
                (total.get("DLmr", 0) + total.get("DLmw", 0)) / records,
            )
            per_record[(group, function, size)] = figures
            misses = f"  {figures[1]:6.1f} D1 {figures[2]:6.1f} LL misses" if args.cache else ""
            print(f"{group:12} {function:21} {size:6}  {figures[0]:10.0f} instructions/record{misses}", flush=True)
    print()
    print("start  handler  records   bare loop   processor   added   ratio   (instructions per record)")
    for start in ("batch", "bytes"):
        for name in ("json", "empty"):
            for size in sizes:
                bare = per_record.get((f"{start}_{name}", "bare_loop", size))
                processor = per_record.get((f"{start}_{name}", "processor", size))
                if bare is None or processor is None:
                    continue
                print(f"{start:6} {name:7} {size:8}  {bare[0]:10.0f}  {processor[0]:10.0f}  {processor[0] - bare[0]:6.0f}  {processor[0] / bare[0]:6.2f}")
                if args.cache:
                    for index, level in ((1, "D1"), (2, "LL")):
                        print(f"{'':6} {'':7} {'':8}  {bare[index]:10.1f}  {processor[index]:10.1f}  {processor[index] - bare[index]:6.1f}  {level} misses per record")
                for bound, label in BOUNDS:
                    least = per_record.get((f"{start}_{name}", bound, size))
                    if least is None:
                        continue
                    print(f"{'':6} {'':7} {'':8}  {'':10}  {least[0]:10.0f}  {least[0] - bare[0]:6.0f}  {least[0] / bare[0]:6.2f}  {label}")
                    if args.cache:
                        print(f"{'':6} {'':7} {'':8}  {'':10}  {least[1]:10.1f}  {least[1] - bare[1]:6.1f}  {'':6}  D1 misses added, and {least[2]:.1f} LL ({least[2] - bare[2]:+.1f}), by the same")
    for function in ("processor", "processor_from_bytes", "runtime_reading"):
        for size in sizes:
            figure = per_record.get(("duplicate", function, size))
            if figure is not None:
                misses = f"  {figure[1]:6.1f} D1 {figure[2]:6.1f} LL misses" if args.cache else ""
                print(f"duplicate {function:21} {size:6}  {figure[0]:10.0f} instructions/record{misses}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
