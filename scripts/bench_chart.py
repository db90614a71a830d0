#!/usr/bin/env python3
"""Draws the side-by-side with Powertools as an SVG bar chart, from `make bench-compare`'s JSON.

    python3 scripts/bench_chart.py [--source kinesis|dynamodb-streams] [JSON] [SVG]
    (defaults: kinesis, target/bench-compare.json, and docs/benchmarks/powertools.svg for
    Kinesis or docs/benchmarks/powertools-dynamodb.svg for DynamoDB Streams)

`scripts/bench-compare` writes the JSON: a list of `rows`, one per source, scenario and batch
size (a row without `source` is a Kinesis row, as earlier runs wrote them), each with a
`powertools` and a `toolkit` side (medians over the repetitions: DynamoDB requests
per batch, wall and CPU microseconds per record) and their `ratio` (Powertools / toolkit).
This script draws three panels from those rows, for each batch size of the run:
- DynamoDB requests per batch (dedupe, effect and any other, together);
- wall time per record;
- CPU time per record.
The scenarios drawn are first delivery, redelivery, and a failing batch with its retry.

Every figure comes from the JSON; nothing is typed in. The SVG is plain: text labels, a
generic font family, no script, no external resource, so GitHub shows it as an image.
Standard library only.
"""

import json
import math
import sys
from pathlib import Path
from xml.sax.saxutils import escape

SCENARIOS = ("first delivery", "redelivery", "failing + retry")
SIDES = (("powertools", "Powertools", "#E69F00"), ("toolkit", "kinesis-checkpoint", "#0072B2"))
PANELS = (
    # (title, what is read from a side, the ratio's key)
    ("DynamoDB requests per batch", lambda side: side["requests"]["total"], "requests"),
    ("Wall time per record (µs)", lambda side: side["wall_us_per_record"], "wall"),
    ("CPU time per record (µs)", lambda side: side["cpu_us_per_record"], "cpu"),
)

WIDTH = 960
LEFT = 78
RIGHT = 16
HEADER = 92
PANEL_TITLE = 26
PLOT = 170
HEADROOM = 18
X_LABELS = 58
FOOTER = 44
BAR = 38
BAR_GAP = 6
FONT = "font-family=\"sans-serif\""


def number(value: float) -> str:
    """A figure as a label: whole numbers with separators, others to three significant digits."""
    if value >= 100 or float(value).is_integer():
        return f"{value:,.0f}"
    return f"{value:.3g}"


def ratio_label(ratio: float) -> str:
    """A ratio to three significant digits at most: 2.94 ×, 45.1 ×, 500 ×."""
    if ratio >= 100:
        return f"{ratio:,.0f} ×"
    return f"{ratio:.1f} ×" if ratio >= 10 else f"{ratio:.2f} ×"


def decade_label(exponent: int) -> str:
    return f"{10 ** exponent:,}" if exponent >= 0 else f"{10.0 ** exponent:g}"


class Svg:
    def __init__(self) -> None:
        self.parts: list[str] = []

    def add(self, element: str) -> None:
        self.parts.append(element)

    def text(self, x: float, y: float, content: str, size: int = 12, anchor: str = "start",
             weight: str = "normal", fill: str = "#222") -> None:
        self.add(f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" '
                 f'font-weight="{weight}" fill="{fill}">{escape(content)}</text>')

    def line(self, x1: float, y1: float, x2: float, y2: float, stroke: str = "#ccc") -> None:
        self.add(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
                 f'stroke="{stroke}" stroke-width="1"/>')

    def rect(self, x: float, y: float, w: float, h: float, fill: str) -> None:
        self.add(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" fill="{fill}"/>')


SOURCE_TITLES = {"kinesis": "Kinesis", "dynamodb-streams": "DynamoDB Streams"}
DEFAULT_OUTPUT = {"kinesis": "docs/benchmarks/powertools.svg",
                  "dynamodb-streams": "docs/benchmarks/powertools-dynamodb.svg"}


def groups(data: dict, source: str = "kinesis") -> list[dict]:
    """The rows drawn, in order: each scenario, each batch size, both sides present."""
    rows = {(row["scenario"], row["records"]): row for row in data["rows"]
            if row.get("source", "kinesis") == source}
    chosen = []
    for scenario in SCENARIOS:
        for size in data["sizes"]:
            row = rows.get((scenario, size))
            if row and all(side in row for side, _, _ in SIDES):
                chosen.append(row)
    if not chosen:
        sys.exit(f"bench_chart: no {SOURCE_TITLES[source]} row with both sides in the JSON; "
                 "run `make bench-compare`")
    return chosen


def panel(svg: Svg, top: float, title: str, read, ratio_key: str, rows: list[dict]) -> None:
    svg.text(LEFT, top + 17, title, size=14, weight="bold")
    plot_top = top + PANEL_TITLE
    bottom = plot_top + PLOT
    values = [read(row[side]) for row in rows for side, _, _ in SIDES]
    positive = [v for v in values if v > 0]
    low = math.floor(math.log10(min(positive))) if positive else 0
    high = math.ceil(math.log10(max(positive))) if positive else 1
    high = max(high, low + 1)
    span = PLOT - HEADROOM

    def y(value: float) -> float:
        return bottom - (math.log10(value) - low) / (high - low) * span

    for exponent in range(low, high + 1):
        gy = y(10.0 ** exponent)
        svg.line(LEFT, gy, WIDTH - RIGHT, gy, stroke="#ddd")
        svg.text(LEFT - 6, gy + 4, decade_label(exponent), size=11, anchor="end", fill="#555")
    svg.line(LEFT, bottom, WIDTH - RIGHT, bottom, stroke="#888")

    width = (WIDTH - LEFT - RIGHT) / len(rows)
    for index, row in enumerate(rows):
        centre = LEFT + width * (index + 0.5)
        pair = 2 * BAR + BAR_GAP
        for offset, (side, _, colour) in enumerate(SIDES):
            value = read(row[side])
            x = centre - pair / 2 + offset * (BAR + BAR_GAP)
            if value > 0:
                top_y = y(value)
                svg.rect(x, top_y, BAR, bottom - top_y, colour)
                svg.text(x + BAR / 2, top_y - 4, number(value), size=11, anchor="middle")
            else:
                svg.text(x + BAR / 2, bottom - 4, "0", size=11, anchor="middle")
        svg.text(centre, bottom + 16, row["scenario"], size=12, anchor="middle")
        svg.text(centre, bottom + 31, f"{row['records']:,} records", size=12, anchor="middle")
        ratio = (row.get("ratio") or {}).get(ratio_key)
        if ratio is not None:
            svg.text(centre, bottom + 47, f"ratio {ratio_label(ratio)}", size=11, anchor="middle",
                     fill="#555")


def load(data: dict) -> str:
    """The machine's 1-minute load average before and after the run, when the JSON has both."""
    before = data.get("machine", {}).get("load_average")
    after = data.get("load_average_after")
    if not (before and after):
        return ""
    return f", load average {before[0]:.1f} before and {after[0]:.1f} after"


def chart(data: dict, source: str, stream_source: str = "kinesis") -> str:
    rows = groups(data, stream_source)
    height = HEADER + len(PANELS) * (PANEL_TITLE + PLOT + X_LABELS) + FOOTER
    svg = Svg()
    machine = data.get("machine", {})
    versions = machine.get("versions", {})
    title = ("kinesis-checkpoint beside Powertools for AWS Lambda (Python), same events on one moto"
             if stream_source == "kinesis" else
             "kinesis-checkpoint beside Powertools for AWS Lambda (Python), DynamoDB Streams, one moto")
    svg.add(f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
            f'viewBox="0 0 {WIDTH} {height}" role="img" {FONT}>')
    svg.add(f"<title>{escape(title)}</title>")
    svg.rect(0, 0, WIDTH, height, "#ffffff")
    svg.text(LEFT, 26, title, size=16, weight="bold")
    svg.text(LEFT, 46, f"Medians of {data.get('repeats', '?')} repetitions. "
             "Log scales. Ratios are Powertools / kinesis-checkpoint.", size=12, fill="#444")
    svg.text(LEFT, 63, f"Machine: {machine.get('nproc', '?')} vCPUs, {machine.get('cpu', '?')}, "
             f"{machine.get('memory_gib', '?')} GiB, Python {machine.get('python', '?')}, "
             f"Powertools {versions.get('aws-lambda-powertools', '?')}, "
             f"moto {versions.get('moto', '?')}{load(data)}.", size=12, fill="#444")
    legend_x = LEFT
    for _, label, colour in SIDES:
        svg.rect(legend_x, 72, 12, 12, colour)
        svg.text(legend_x + 17, 82, label, size=12)
        legend_x += 30 + 7 * len(label)
    top = HEADER
    for title_text, read, ratio_key in PANELS:
        panel(svg, top, title_text, read, ratio_key, rows)
        top += PANEL_TITLE + PLOT + X_LABELS
    svg.text(LEFT, height - 26, "Failing + retry: both batches, per record of the failing batch, "
             "the same work on both sides.", size=11, fill="#666")
    svg.text(LEFT, height - 10, f"Generated by scripts/bench_chart.py from {source} "
             "(make bench-compare).", size=11, fill="#666")
    svg.add("</svg>")
    return "\n".join(svg.parts) + "\n"


def main() -> None:
    args = sys.argv[1:]
    stream_source = "kinesis"
    if args[:1] == ["--source"] and len(args) > 1:
        stream_source, args = args[1], args[2:]
    if (len(args) > 2 or any(a in ("-h", "--help") for a in args)
            or stream_source not in SOURCE_TITLES):
        sys.exit(__doc__)
    source = Path(args[0] if args else "target/bench-compare.json")
    output = Path(args[1] if len(args) > 1 else DEFAULT_OUTPUT[stream_source])
    data = json.loads(source.read_text())
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(chart(data, source.name if source.is_absolute() else str(source), stream_source))
    print(f"written to {output}")


if __name__ == "__main__":
    main()
