#!/usr/bin/env python3
"""Draws the guide's two diagrams as plain SVG: docs/src/diagrams/invocation.svg (one invocation
in the shard mode) and docs/src/diagrams/rows.svg (the two row kinds of the lease table).

    python3 docs/dev/diagrams.py

Text labels, a generic font family, no script and no external resource, so GitHub and the mdBook
both show them as images. Standard library only. Edit the steps and attributes here, then run it.
"""
from pathlib import Path
from xml.sax.saxutils import escape
FONT = 'font-family="Helvetica, Arial, sans-serif"'
BLUE, BLUE_BG = "#0072B2", "#EAF2FA"
ORANGE, ORANGE_BG = "#B86E00", "#FFF3E0"
GREY = "#444444"

def text(x, y, s, size=13, weight="normal", anchor="start", fill="#1a1a1a"):
    return f'<text x="{x}" y="{y}" font-size="{size}" font-weight="{weight}" text-anchor="{anchor}" fill="{fill}">{escape(s)}</text>'

def box(x, y, w, h, fill, stroke, dash=False):
    d = ' stroke-dasharray="5 3"' if dash else ''
    return f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="6" fill="{fill}" stroke="{stroke}" stroke-width="1.5"{d}/>'

def arrow(x1, y1, x2, y2, color=GREY, dash=False):
    d = ' stroke-dasharray="5 3"' if dash else ''
    m = "arrow" if color == GREY else "arrow-o"
    return f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="{color}" stroke-width="1.5"{d} marker-end="url(#{m})"/>'

def svg(width, height, body, title):
    defs = ('<defs>'
            f'<marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="{GREY}"/></marker>'
            f'<marker id="arrow-o" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="{ORANGE}"/></marker>'
            '</defs>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" {FONT}>\n'
            f'<title>{escape(title)}</title>\n{defs}\n<rect width="{width}" height="{height}" fill="#ffffff"/>\n' + "\n".join(body) + "\n</svg>\n")

def invocation():
    steps = [
        ("1. Parse", "The shard from eventID; KPL aggregates unpacked."),
        ("2. Claim", "One UpdateItem: take the lease, read the row."),
        ("3. Gate", "A child shard waits until its parents are finished."),
        ("4. Dedupe", "Skip every record at or below the checkpoint."),
        ("5. Dispatch", "The handler, in order; stop at the first retry."),
        ("6. Dead letters", "Rejected, or failed max_attempts times: to the sink."),
        ("7. Checkpoint and release", "One UpdateItem, on condition of the lease."),
        ("8. Answer", "batchItemFailures: the first record not done, if any."),
    ]
    sides = {
        1: [("Another live invocation holds the lease", "Run nothing; report the first record."),
            ("The last owner died inside this batch", "Careful run: one record at a time, each pinned.")],
        2: [("A parent is not finished", "Run nothing; report the first record.")],
        5: [("No sink configured", "Report the record; never drop it.")],
    }
    W, top, bh, gap, x, w = 860, 56, 50, 30, 30, 390
    sx, sw, sbh = 480, 350, 44
    body = [text(W / 2, 30, "One invocation in the shard mode (Processor::new)", 16, "bold", "middle")]
    for i, (title, detail) in enumerate(steps):
        y = top + i * (bh + gap)
        body.append(box(x, y, w, bh, BLUE_BG, BLUE))
        body.append(text(x + 12, y + 20, title, 14, "bold", fill=BLUE))
        body.append(text(x + 12, y + 38, detail, 12.5))
        if i + 1 < len(steps):
            body.append(arrow(x + w / 2, y + bh, x + w / 2, y + bh + gap - 1))
        for j, (stitle, sdetail) in enumerate(sides.get(i, [])):
            n = len(sides[i])
            cy = y + bh / 2
            syc = cy + (j - (n - 1) / 2) * (sbh + 8)
            sy = syc - sbh / 2
            body.append(box(sx, sy, sw, sbh, ORANGE_BG, ORANGE, dash=True))
            body.append(text(sx + 10, sy + 18, stitle, 12.5, "bold", fill=ORANGE))
            body.append(text(sx + 10, sy + 35, sdetail, 12.5))
            body.append(arrow(x + w, cy, sx - 1, syc, ORANGE, dash=True))
    H = top + len(steps) * (bh + gap) - gap + 44
    body.append(text(x, H - 18, "A healthy batch costs two DynamoDB requests: the claim (2) and the last write (7). Kinesis: none.", 12.5, fill=GREY))
    return svg(W, H, body, "One invocation in the shard mode")

def rows():
    W = 980
    body = [text(W / 2, 30, "The two row kinds of the lease table (partition key lease_key)", 16, "bold", "middle")]
    shard = [
        ("lease_key", "S", "stream:shard", True),
        ("lease_owner", "S", "who holds the lease now", True),
        ("lease_expiry", "N", "when the lease lapses (epoch ms)", True),
        ("lease_counter", "N", "fencing counter, +1 on every write", True),
        ("checkpoint", "S", "last record done whole, or SHARD_END", True),
        ("aggregate_sequence", "S", "KPL aggregate in progress", False),
        ("aggregate_sub", "N", "its last sub-record done", False),
        ("failing", "M", "the record that keeps failing", False),
        ("reported", "S", "last record reported, or the claim's mark", False),
        ("done_above", "SS", "records done above the checkpoint", False),
        ("parent_shards", "SS", "the shard's parents", False),
        ("parentless", "BOOL", "true: an original shard", False),
        ("expires_at", "N", "TTL, set once the shard is finished", False),
    ]
    key = [
        ("lease_key", "S", "stream:shard:partition-key"),
        ("lease_counter", "N", "fencing counter, +1 on every write"),
        ("checkpoint", "S", "the key's last record done whole"),
        ("aggregate_sequence", "S", "KPL aggregate in progress"),
        ("aggregate_sub", "N", "its last sub-record done"),
        ("failing", "M", "the key's record that keeps failing"),
        ("expires_at", "N", "TTL: key_ttl after the last write"),
    ]
    rh, top = 24, 92
    def table(x, w, title, sub, items, seed_marks):
        out = [box(x, top - 40, w, 40 + rh * len(items) + 10, "#ffffff", BLUE)]
        out.append(text(x + 12, top - 20, title, 14, "bold", fill=BLUE))
        out.append(text(x + 12, top - 4, sub, 12, fill=GREY))
        for i, item in enumerate(items):
            name, typ, meaning = item[0], item[1], item[2]
            seed = item[3] if seed_marks else False
            y = top + 8 + i * rh
            fill = ORANGE_BG if seed else BLUE_BG
            out.append(f'<rect x="{x + 8}" y="{y}" width="{w - 16}" height="{rh - 3}" rx="3" fill="{fill}"/>')
            out.append(f'<text x="{x + 16}" y="{y + 15}" font-size="12.5" font-family="Menlo, Consolas, monospace" fill="#1a1a1a">{escape(name)}</text>')
            out.append(text(x + 160, y + 15, typ, 12, fill=GREY))
            out.append(text(x + 200, y + 15, meaning, 12.5))
        return out
    body += table(20, 470, "Shard row", "Shard mode: one per shard. Partition-key mode: SHARD_END only.", shard, True)
    body += table(510, 450, "Partition-key row", "Partition-key mode: one per partition key.", key, False)
    ly = top + 8 + 7 * rh + 30
    body.append(f'<rect x="520" y="{ly}" width="14" height="14" rx="3" fill="{ORANGE_BG}" stroke="{ORANGE}"/>')
    body.append(text(542, ly + 12, "The seed crate's schema: a container consumer", 12.5))
    body.append(text(542, ly + 28, "on the seed crate reads and writes these five.", 12.5))
    body.append(f'<rect x="520" y="{ly + 42}" width="14" height="14" rx="3" fill="{BLUE_BG}" stroke="{BLUE}"/>')
    body.append(text(542, ly + 54, "The toolkit's own; other readers ignore them.", 12.5))
    body.append(text(520, ly + 86, "No shard id holds a colon, so a key's row", 12.5, fill=GREY))
    body.append(text(520, ly + 102, "is never mistaken for a shard's.", 12.5, fill=GREY))
    H = top + 8 + rh * len(shard) + 24
    return svg(W, H, body, "The two row kinds of the lease table")

OUT = Path(__file__).resolve().parent.parent / "src" / "diagrams"
(OUT / "invocation.svg").write_text(invocation())
(OUT / "rows.svg").write_text(rows())
print(f"written to {OUT}")
