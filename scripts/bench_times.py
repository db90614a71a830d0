#!/usr/bin/env python3
"""Times the benchmarks of `benches/processor.rs` per record, one or more builds side by side,
over the stack's alignments.

Criterion's figures on this machine move by several percent between runs of one binary, and by
more between builds: much of it is where the
process's stack starts (the size of its environment sets it) and where its blocks fall on the
heap. With the JSON handler at 100 records, one build took 55 or 65 us per batch by the size of
one block allocated before the batches (the bench's own vector of times), the same instructions
either way, and the bare loop moves in the same way. A comparison from one process is one draw
of that lottery.

This script runs each build's bench binary in its count mode
(`PROCESSOR_BENCH_COUNT=<group>/<function>/<size>/<iterations>`: the benchmark's body
`iterations` times, outside criterion, each copy of the input made before the clock starts, as
criterion makes it outside the timed part), which prints the fastest, the tenth-percentile and
the median iteration. It runs each benchmark `--pads` times, each with the stack and the heap
laid out a little differently: an environment variable `BENCH_PAD` of 0, 592, 1,184, ...
bytes moves the stack's start over 4 KB, and `PROCESSOR_BENCH_HEAP_PAD` (seven times as many
bytes) makes the bench hold a block between the copy of the input and what the iteration
allocates, which moves the handler's blocks against the payloads. The builds and benchmarks are
alternated. It takes each run's tenth-percentile iteration per record and prints per benchmark
the median over the layouts with the fastest and slowest beside it; then the processor against
its build's bare loop in each layout: the median ratio and added time, and their range.

It is a tool for comparing builds; the targets of issue 17 stay judged on criterion's figures by
`scripts/bench_summary.py`, which are one draw each.

Usage: scripts/bench_times.py BENCH_BINARY [BENCH_BINARY ...] [--pads 8]
       [--sizes 100,1000,10000] [--only GROUP/FUNCTION ...]

Each BENCH_BINARY is a copy of `target/release/deps/processor-<hash>` (printed by
`cargo bench --bench processor --no-run`), one per build.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

BENCHMARKS = (
    ("batch_json", "bare_loop"),
    ("batch_json", "least_in_place"),
    ("batch_json", "processor"),
    ("batch_json", "processor_new_store"),
    ("batch_empty", "bare_loop"),
    ("batch_empty", "least_in_place"),
    ("batch_empty", "processor"),
    ("batch_empty", "processor_new_store"),
    ("duplicate", "processor"),
)


def tenth(binary: str, spec: str, pad: int) -> int:
    """The tenth-percentile iteration of `spec` in nanoseconds, as the bench binary prints it,
    run with an environment `pad` bytes larger and a block of `7 * pad` bytes between the copy
    of the input and what the iteration allocates."""
    run = subprocess.run(
        [binary],
        env={
            **os.environ,
            "PROCESSOR_BENCH_COUNT": spec,
            "BENCH_PAD": "x" * pad,
            "PROCESSOR_BENCH_HEAP_PAD": str(pad * 7),
        },
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    match = re.search(r"iteration ns: fastest \d+ tenth (\d+) median \d+", run.stderr)
    if not match:
        raise RuntimeError(f"{binary} printed no iteration times for {spec}")
    return int(match.group(1))


def spread(values: list[float], unit: str, digits: int = 1) -> str:
    """The median of `values`, with their least and greatest."""
    return (
        f"{statistics.median(values):.{digits}f} {unit} "
        f"[{min(values):.{digits}f}-{max(values):.{digits}f}]"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("binaries", nargs="+")
    parser.add_argument("--pads", type=int, default=8)
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--only", action="append", default=[])
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    # Spread over the 4 KB the stack's start can fall in, the cache-line offset moving too: a
    # step of 592 bytes (not 512) changes every bit from the fourth to the twelfth.
    pads = [index * (4096 // args.pads + 80) % 4096 for index in range(args.pads)]
    wanted = [b for b in BENCHMARKS if not args.only or "/".join(b) in args.only]
    # A million records per run: 10,000 iterations of 100, 1,000 of 1,000, 100 of 10,000. Over
    # 3,000 iterations of 100, a build ran slow for most of them and fast after.
    specs = [
        (group, function, size, f"{group}/{function}/{size}/{max(30, 1_000_000 // size)}")
        for group, function in wanted
        for size in sizes
    ]
    # (binary, group, function, size) -> ns per record at each pad, in the order of `pads`.
    per_record: dict[tuple[str, str, str, int], list[float]] = {}
    for pad in pads:
        for group, function, size, spec in specs:
            for binary in args.binaries:
                ns = tenth(binary, spec, pad) / size
                per_record.setdefault((binary, group, function, size), []).append(ns)
    names = [os.path.basename(binary) for binary in args.binaries]
    print(f"ns per record, the median over {len(pads)} layouts [least-greatest]")
    print(f"{'benchmark':28} {'records':>7}  " + "  ".join(f"{n:>28}" for n in names))
    for group, function, size, _ in specs:
        row = [spread(per_record[(b, group, function, size)], "ns") for b in args.binaries]
        print(f"{group + '/' + function:28} {size:7}  " + "  ".join(f"{r:>28}" for r in row))
    print()
    print("the processor against its build's own bare loop in each layout: ratio, then added ns")
    for group in ("batch_json", "batch_empty"):
        for size in sizes:
            ratios, added = [], []
            for binary in args.binaries:
                bare = per_record.get((binary, group, "bare_loop", size))
                processor = per_record.get((binary, group, "processor", size))
                if bare is None or processor is None:
                    continue
                ratios.append(spread([p / b for p, b in zip(processor, bare)], "x", 3))
                added.append(spread([p - b for p, b in zip(processor, bare)], "ns"))
            if ratios:
                print(f"{group:28} {size:7}  " + "  ".join(f"{r:>28}" for r in ratios))
                print(f"{'':28} {'':7}  " + "  ".join(f"{a:>28}" for a in added))
    return 0


if __name__ == "__main__":
    sys.exit(main())
