"""The input side of `bench/chaos.py`'s attacks: the largest accepted requests (RSS growth of
each, then unread answers), JSON bombs just under the body limit and odd text. Each attack fills one
`Row`; the driver and its table are in `bench/chaos.py`.
"""

from __future__ import annotations

import asyncio
import json
import time

from bench.chaos_kit import NO_ANSWER, Conn, Row, RssSampler, Served

MAX_REQUESTS = {
    "explain at its limits (8 x 128 tokens)":
        ("/sentiment", {"texts": [" ".join(["word"] * 200)] * 8, "truncate": True, "explain": True}),
    "explain 256 x 128 tokens":
        ("/sentiment", {"texts": [" ".join(["word"] * 200)] * 256, "truncate": True, "explain": True}),
    "256 x 10,000 characters":
        ("/embed", {"texts": ["the movie was great and " * 416 + "ok"] * 256, "truncate": True}),
    "256 pairs x 2 x 8,000 characters":
        ("/nli", {"pairs": [{"premise": "a man " * 1333, "hypothesis": "a dog " * 1333}] * 256,
                  "truncate": True}),
    # the default long_text=window at its limits: 128 texts x 8,190 tokens (under
    # max_tokens_per_text), 1.05M tokens (just under max_tokens_per_request), 8,192 windows
    "windowed 128 x 8,190 tokens":
        ("/embed", {"texts": ["the movie was great and " * 1638] * 128}),
}
_HALF = (4 << 20) // 2 - 16  # two bytes per item: the bodies stay just under 4 MiB
BOMBS = {
    "4 MiB of JSON items": b'{"texts": [' + b"1," * _HALF + b"1]}",
    "4 MiB of nesting": b'{"texts": ' + b"[" * _HALF + b"]" * _HALF + b"}",
}


async def max_requests(port: int, row: Row, served: Served) -> None:
    bodies = {name: (path, json.dumps(body).encode()) for name, (path, body) in MAX_REQUESTS.items()}
    bodies.update({name: ("/embed", body) for name, body in BOMBS.items()})
    notes = []
    for name, (path, body) in bodies.items():
        assert len(body) <= 16 << 20, (name, len(body))
        conn = Conn(port)
        await asyncio.sleep(0.5)
        before = served.rss_mb()
        with RssSampler(served) as rss:
            try:
                status, answer = await conn.request("POST", path, body, timeout=600)
                row.count(str(status))
            except NO_ANSWER:
                row.count("err")
                status, answer = 0, b""
            await asyncio.sleep(0.5)
        after = served.rss_mb()
        notes.append(f"{name} ({len(body) / 2**20:.1f} MiB): {status}, {len(answer) / 1e6:.1f} MB "
                     f"answer, RSS +{rss.peak - before:.0f} MB at peak, +{after - before:.0f} after")
        conn.close()
    # Six clients that send the heaviest accepted request and never read the answer.
    path, body = bodies["explain at its limits (8 x 128 tokens)"]
    silent = [Conn(port) for _ in range(6)]
    for conn in silent:
        await conn.request("POST", path, body, read=False)
        row.count("unread")
    await asyncio.sleep(10)
    for conn in silent:
        conn.close()
    await asyncio.sleep(1)
    row.note = "; ".join(notes)


ODD_TEXTS = ["\ud800 lone surrogate", "nul \x00 inside", "\u202e\u0645\u0631\u062d\u0628\u0627 rtl",
             "e\u0301\u0301\u0301 combining", "\U0001f600\U0001f680 emoji", "\x1b[31m ansi \x07",
             "\ufeff bom", "\u3000ideographic\u3000space", "a" * 10_000, "\u00ad soft hyphen"]


async def odd_input(port: int, row: Row) -> None:
    bodies: list[tuple[str, bytes]] = []
    for text in ODD_TEXTS:
        encoded = json.dumps({"texts": [text], "truncate": True}).encode()  # \ud800 as an escape
        bodies += [("/embed", encoded), ("/sentiment", encoded.replace(b"}", b', "explain": true}')),
                   ("/v1/embeddings", json.dumps({"input": text}).encode()),
                   ("/nli", json.dumps({"pairs": [{"premise": text, "hypothesis": text}],
                                        "truncate": True}).encode())]
    bodies += [("/embed", b'{"texts": ["\xff\xfe invalid utf-8"]}'), ("/embed", b'{"texts": [1e999]}'),
               ("/embed", b'{"texts": ' + b"[" * 1000 + b"]" * 1000 + b"}"),
               ("/embed", b'{"texts": ["a"], "normalize": "yes"}'), ("/embed", b"\x00\x00"),
               ("/nli", b'{"pairs": [[1, 2]]}'), ("/v1/embeddings", b'{"input": [[1, 2, 3]]}')]
    conn = Conn(port)
    fives = []
    for path, body in bodies:
        t0 = time.perf_counter()
        try:
            status, answer = await conn.request("POST", path, body, timeout=30)
        except NO_ANSWER:
            row.count("err")
            conn.close()
            continue
        row.probe_ms.append((time.perf_counter() - t0) * 1000)
        row.count(str(status))
        if status >= 500:
            fives.append(f"{path} {body[:40]!r}: {answer[:120]!r}")
    conn.close()
    row.note = "5xx: " + " | ".join(fives) if fives else "no 5xx"
