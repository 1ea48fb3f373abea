"""Where a one-sentence POST /embed spends its CPU, stage by stage (CPU host, loopback only).

    python -m bench.stages --bundle models/default --data ../shared/data [--seconds 6] [--json OUT]
    python -m bench.stages ... --before /tmp/before    # also the same stages on an older checkout

Two kinds of measurement, on the same SNLI-length sentences (one per request):

- servers under `wrk` at concurrency 64 (bench.server.load), server CPU per request from /proc:
  "HTTP alone" is uvicorn (run as `disan serve` runs it) with a bare ASGI app that reads the
  body and answers a fixed 600-float JSON body (HTTP parsing, the event loop, writing the
  response); "whole path, encoder stubbed" is the service with the encoder replaced by zeros
  (bench.overhead's stub: everything but inference);
- the stages in between, timed in this process over the same request bodies (best of
  --repeats): JSON decode and request validation as the fast path does them, tokenizing + ids
  (the tokenized SNLI sentences the load uses, and raw SNLI dev sentences), the micro-batcher's
  round trip with a stub runner (one request at a time, and 64 at once: CPU per request,
  executor thread included), inference (one sentence per call, and per sentence in the batches
  the batcher cuts, 1 ORT thread), and encoding the response (floats; base64 where the checkout
  has it).

"rest" = whole path - (HTTP alone + the in-process stages but inference): the glue between
stages (the fast path's ASGI handling, metrics, futures, task switches).

`--before DIR` runs the same stages on another checkout (e.g. `git worktree add /tmp/before
<commit>`), alternating with this one, --rounds times; this file is run from its own path
with the other checkout on PYTHONPATH, so that checkout needs no copy of it. The table then
shows both and their ratio. Linux only (reads /proc).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson

HERE = Path(__file__).resolve()
# Run by path (see --before), Python puts bench/ itself first on sys.path, where bench/service.py
# would shadow the `service` package: the checkout on PYTHONPATH must be what is imported.
if sys.path and Path(sys.path[0]).resolve() == HERE.parent:
    sys.path.pop(0)
# Both servers need a free port and `wrk` (else bench.load); both come from bench.server.
STAGE_NAMES = {
    "http_alone": "HTTP alone (uvicorn + bare ASGI app), wrk c=64",
    "whole_stubbed": "whole path, encoder stubbed, wrk c=64",
    "json_decode": "JSON decode (json.loads)",
    "validation": "request validation (EmbedRequest, strict)",
    "tokenize_tok": "tokenize + ids, tokenized SNLI (the load's sentences)",
    "tokenize_raw": "tokenize + ids, raw SNLI dev sentences",
    "batcher_c1": "micro-batcher round trip, stub runner, 1 at a time",
    "batcher_c64": "micro-batcher round trip, stub runner, 64 at once",
    "inference_1": "inference, 1 sentence per call (1 ORT thread)",
    "inference_batched": "inference per sentence, batcher-cut batches (1 ORT thread)",
    "encode_float": "response encoding, floats (orjson)",
    "encode_base64": "response encoding, base64",
    "rest": "rest: glue (fast path, metrics, futures, switches)",
}
IN_PATH = ("json_decode", "validation", "tokenize_tok", "batcher_c64", "encode_float")


def bare_app_body() -> bytes:
    """A response body of /embed's size: one 600-d float32 vector written by orjson."""
    rng = np.random.default_rng(0)
    vec = (rng.standard_normal((1, 600)) * 0.05).astype(np.float32)
    return orjson.dumps({"model": "disan-600d", "dim": 600, "embeddings": vec,
                         "usage": {"tokens": 14}}, option=orjson.OPT_SERIALIZE_NUMPY)


def serve_bare() -> None:
    """Child process: uvicorn with a bare ASGI app (no FastAPI, no model), DISAN_HOST/PORT."""
    import uvicorn  # the child's own import (a fresh interpreter)

    body = bare_app_body()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        more = True
        while more:
            message = await receive()
            more = message.get("more_body", False)
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    uvicorn.run(app, host=os.environ["DISAN_HOST"], port=int(os.environ["DISAN_PORT"]),
                log_level="warning", access_log=False, proxy_headers=False)


def server_cpu_per_request(bundle: Path, command: list[str], bodies: Path, seconds: float) -> float:
    """Server CPU µs per answered request at concurrency 64."""
    from bench.server import Server, load, process_cpu  # the checkout's own (see --before)

    with Server(bundle, command=command) as server:
        load(server.url, bodies, 64, 1.0)  # warm-up
        before = process_cpu(server.proc.pid)
        stats = load(server.url, bodies, 64, seconds)
        used = process_cpu(server.proc.pid) - before
    return 1e6 * used / max(1, stats["requests"] - stats["non2xx"])


def best_us(fn: Callable[[], object], items: int, repeats: int) -> float:
    """Best-of-`repeats` CPU µs per item of `fn()` (which processes `items` items).

    CPU time of the process, not wall time: on a shared machine a stage preempted by another
    process would otherwise count the other's time as its own.
    """
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t = time.process_time()
        fn()
        best = min(best, time.process_time() - t)
    return 1e6 * best / items


def batcher_cpu_us(concurrency: int, rows: list[list[int]], repeats: int) -> float:
    """Process CPU µs per request through a MicroBatcher whose runner returns zeros at once."""
    from concurrent.futures import ThreadPoolExecutor  # only this stage runs an executor

    from service.backend.batcher import MicroBatcher  # the checkout under test's (see measure_in_process)

    zeros = np.zeros(600, np.float32)

    async def run() -> float:
        with ThreadPoolExecutor(2) as pool:
            batcher = MicroBatcher("encoder", lambda batch: [zeros] * len(batch), executor=pool,
                                   concurrency=2)
            await batcher.start()
            best = float("inf")
            for _ in range(repeats + 1):  # the first pass warms up
                t = time.process_time()
                for i in range(0, len(rows), concurrency):
                    await asyncio.gather(*(batcher.run([r]) for r in rows[i:i + concurrency]))
                best = min(best, time.process_time() - t)
            await batcher.stop()
        return 1e6 * best / len(rows)

    return asyncio.run(run())


def raw_sentences(data: Path, count: int) -> list[str]:
    """Raw (untokenized) SNLI dev sentences of 11-25 tokens."""
    from disan.text.tokenizer import (
        tokenize,  # the checkout under test's (see --before), like every import here
    )

    out: list[str] = []
    with gzip.open(data / "snli" / "dev.jsonl.gz", "rt", encoding="utf-8") as fh:
        for line in fh:
            s = json.loads(line)["sentence1"]
            if 11 <= len(tokenize(s)) <= 25 and s not in out:
                out.append(s)
            if len(out) >= count:
                break
    return out


def measure_in_process(args: argparse.Namespace) -> dict[str, float]:
    """The in-process stages (see the module docstring), µs per request."""
    # Imported here, not at the top: the code of the checkout under test (--before runs this
    # file with another checkout on PYTHONPATH, after the sys.path fix above).
    from bench.offline import length_batches, load_sentences
    from disan.runtime.runtime import load_offline
    from disan.text.tokenizer import tokenize  # (same reason)
    from service.http.handlers import encode_json  # (same reason)
    from service.http.schemas import EmbedRequest  # (same reason)

    sentences = load_sentences(args.data, args.sentences)["11-25"]
    raw = raw_sentences(args.data, args.sentences)
    bodies = [json.dumps({"texts": [s]}).encode() for s in sentences]
    n = len(bodies)
    decoded = [json.loads(b) for b in bodies]
    rt = load_offline(args.bundle, threads=1)
    vocab = rt.vocab
    words = getattr(vocab, "tokens", tokenize)  # what the service reads; older checkouts (--before) lack it
    rows = [vocab.ids(words(s)) for s in sentences]
    vectors = [rt.embed([r]) for r in rows[:64]]
    out = {
        "json_decode": best_us(lambda: [json.loads(b) for b in bodies], n, args.repeats),
        "validation": best_us(lambda: [EmbedRequest.model_validate(d, from_attributes=True)
                                       for d in decoded], n, args.repeats),
        "tokenize_tok": best_us(lambda: [vocab.ids(words(s)) for s in sentences], n, args.repeats),
        "tokenize_raw": best_us(lambda: [vocab.ids(words(s)) for s in raw], len(raw), args.repeats),
        "batcher_c1": batcher_cpu_us(1, rows, args.repeats),
        "batcher_c64": batcher_cpu_us(64, rows, args.repeats),
        "inference_1": best_us(lambda: [rt.embed([r]) for r in rows[:128]], 128, args.repeats),
        "encode_float": best_us(lambda: [encode_json({"model": rt.name, "dim": rt.dim, "embeddings": v,
                                                      "usage": {"tokens": 14}}) for v in vectors],
                                len(vectors), args.repeats),
    }
    batches = [[rows[sentences.index(s)] for s in b] for b in length_batches(sentences, 64, 4096)]
    out["inference_batched"] = best_us(lambda: [rt.embed(b) for b in batches], n, args.repeats)
    from service.http import handlers  # the checkout decides whether /embed has base64

    if "encoding_format" in EmbedRequest.model_fields and hasattr(handlers, "encode_embeddings"):
        out["encode_base64"] = best_us(
            lambda: [encode_json({"model": rt.name, "dim": rt.dim,
                                  "embeddings": handlers.encode_embeddings(v, "base64"),
                                  "usage": {"tokens": 14}}) for v in vectors], len(vectors), args.repeats)
    else:  # what a base64 body would cost there: the same encoding the OpenAI route does
        out["encode_base64"] = best_us(
            lambda: [encode_json({"model": rt.name, "dim": rt.dim,
                                  "embeddings": [base64.b64encode(r.astype("<f4").tobytes()).decode()
                                                 for r in v], "usage": {"tokens": 14}})
                     for v in vectors], len(vectors), args.repeats)
    return out


def measure_servers(args: argparse.Namespace) -> dict[str, float]:
    """HTTP alone and the whole stubbed path under wrk, µs of server CPU per request."""
    from bench.offline import load_sentences  # the checkout under test's (see measure_in_process)

    sentences = load_sentences(args.data, args.sentences)["11-25"]
    bodies = Path(tempfile.mkstemp(suffix=".jsonl")[1])
    bodies.write_text("".join(json.dumps({"texts": [s]}) + "\n" for s in sentences))
    try:
        bare = [sys.executable, str(HERE), "--serve-bare"]
        stub = [sys.executable, "-c", "from bench.overhead import serve_stub; serve_stub()"]
        return {"http_alone": server_cpu_per_request(args.bundle, bare, bodies, args.seconds),
                "whole_stubbed": server_cpu_per_request(args.bundle, stub, bodies, args.seconds)}
    finally:
        bodies.unlink()


def measure(args: argparse.Namespace) -> dict[str, float]:
    """Every stage of this checkout, µs per request (rounded)."""
    out = {**measure_servers(args), **measure_in_process(args)}
    out["rest"] = out["whole_stubbed"] - out["http_alone"] - sum(out[k] for k in IN_PATH)
    return {k: round(v, 2) for k, v in out.items()}


def measure_checkout(tree: Path, args: argparse.Namespace) -> dict[str, float]:
    """`measure` run in another checkout: this file, that checkout's code (PYTHONPATH, cwd)."""
    out = Path(tempfile.mkstemp(suffix=".json")[1])
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, str(HERE), "--bundle", str(args.bundle.resolve()), "--data",
           str(args.data.resolve()), "--seconds", str(args.seconds), "--repeats", str(args.repeats),
           "--sentences", str(args.sentences), "--measure-only", str(out)]
    subprocess.run(cmd, env=env, cwd=tree, check=True)
    result = json.loads(out.read_text())
    out.unlink()
    return result


def run_stages(args: argparse.Namespace) -> dict:
    """This checkout (and --before, alternating, best of --rounds per stage)."""
    trees = {"after": Path.cwd()} if args.before is None else {"before": args.before, "after": Path.cwd()}
    runs: dict[str, dict[str, float]] = {}
    for _ in range(args.rounds):
        for label, tree in trees.items():
            got = measure_checkout(tree, args)
            print(label, got, flush=True)
            best = runs.setdefault(label, got)
            for k, v in got.items():  # "rest" is a difference, so keep the round with the best total
                if k != "rest":
                    best[k] = min(best[k], v)
            best["rest"] = round(best["whole_stubbed"] - best["http_alone"]
                                 - sum(best[k] for k in IN_PATH), 2)
    return {"date": time.strftime("%Y-%m-%d"), "machine": f"{os.cpu_count()} cores",
            "rounds": args.rounds, "runs": runs}


def markdown(results: dict) -> str:
    """One row per stage: µs per request (before, after, after/before when compared)."""
    runs = results["runs"]
    labels = list(runs)
    head = "| stage (one SNLI-length sentence per request) | " + " | ".join(
        f"{lab} µs" for lab in labels) + (" | after / before |" if len(labels) == 2 else " |")
    lines = [head, "|---" * (len(labels) + 1 + (len(labels) == 2)) + "|"]
    for key, name in STAGE_NAMES.items():
        vals = [runs[lab].get(key) for lab in labels]
        cells = " | ".join("-" if v is None else f"{v:.1f}" for v in vals)
        ratio = ""
        if len(labels) == 2:
            ratio = f" | {vals[1] / vals[0]:.2f}" if vals[0] and vals[1] and vals[0] > 0 else " | -"
        lines.append(f"| {name} | {cells}{ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, default=Path("models/default"))
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--seconds", type=float, default=6.0, help="per wrk run")
    parser.add_argument("--repeats", type=int, default=5, help="in-process passes; best kept")
    parser.add_argument("--rounds", type=int, default=2, help="alternating runs of each checkout")
    parser.add_argument("--sentences", type=int, default=512)
    parser.add_argument("--before", type=Path, help="another checkout to measure alternately")
    parser.add_argument("--json", type=Path, default=Path("bench/results/stages.json"))
    parser.add_argument("--measure-only", type=Path, help=argparse.SUPPRESS)  # child: write JSON
    parser.add_argument("--serve-bare", action="store_true", help=argparse.SUPPRESS)  # child
    args = parser.parse_args(argv)
    if args.serve_bare:
        serve_bare()
        return 0
    if args.measure_only:
        args.measure_only.write_text(json.dumps(measure(args)))
        return 0
    from bench.report import run_and_report  # parsed again there: same flags

    return run_and_report(parser, run_stages, markdown, argv)


if __name__ == "__main__":
    raise SystemExit(main())
