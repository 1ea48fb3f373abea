"""Task outputs (TORCH-FREE): the one NLI path and the prediction dicts of /nli and /sentiment.

`disan.Encoder.nli`, the service's /nli (service.inference.engine) and `disan eval --task
snli|mnli|sick-e` run the same `nli_steps`: a generator of graph calls that a driver runs directly
(`run_steps`) or through the service's micro-batchers (`run_steps_async`). `prediction` and
`sentiment_prediction` turn class probabilities into the answers both give.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import Any

import numpy as np

from disan.text.prepare import PreparedText, flat_rows, pool


def polarity_of(label: str) -> str:
    """Coarse polarity of a fine sentiment label ('very negative' -> 'negative')."""
    low = label.lower()
    return "negative" if "neg" in low else "positive" if "pos" in low else "neutral"


Call = tuple[str, list]  # a route ("nli": its encoder, on id rows; "nli_head": on vector pairs), payloads
Steps = Generator[Call, Sequence[Any], list[dict]]


def nli_steps(premises: Sequence[PreparedText], hypotheses: Sequence[PreparedText], labels: list[str]
              ) -> Steps:
    """NLI of prepared (premise, hypothesis) pairs (`disan.text.prepare`: each side fitted,
    windowed, truncated or refused under the caller's limits), as the steps a driver runs:

        the NLI route's encoder on every row of both sides  ->  each side's windows pooled
        ->  nli_head on the (premise, hypothesis) vector pairs  ->  {label, scores} per pair

    A generator that yields each graph call (route, payloads) and is sent back one result per
    payload, so the same steps run where the graphs are called directly (`run_steps`:
    `Encoder.nli`, hence `disan eval`) and where they queue in the service's micro-batchers
    (`run_steps_async`: service.inference.engine)."""
    if not premises:
        return []
    split = len(flat_rows(premises))
    outs = yield "nli", flat_rows(premises) + flat_rows(hypotheses)
    sides = zip(pool(premises, outs[:split]), pool(hypotheses, outs[split:]), strict=True)
    probs = yield "nli_head", list(sides)
    return [prediction(p, labels) for p in probs]


def run_steps(steps: Steps, run: Callable[[str, list], Sequence[Any]]) -> list[dict]:
    """Drive `steps`, each call run by `run(route, payloads)`."""
    reply = None
    while True:
        try:
            route, payloads = steps.send(reply)
        except StopIteration as done:
            return done.value
        reply = run(route, payloads)


async def run_steps_async(steps: Steps, run: Callable[[str, list], Awaitable[Sequence[Any]]]) -> list[dict]:
    """`run_steps` with an awaited `run` (the service's batchers)."""
    reply = None
    while True:
        try:
            route, payloads = steps.send(reply)
        except StopIteration as done:
            return done.value
        reply = await run(route, payloads)


def prediction(probs: np.ndarray, labels: list[str]) -> dict:
    """{label, scores} of one row of class probabilities."""
    scores = {label: float(p) for label, p in zip(labels, probs, strict=True)}
    return {"label": labels[int(np.argmax(probs))], "scores": scores}


def sentiment_prediction(probs: np.ndarray, labels: list[str]) -> dict:
    """`prediction` plus the coarse polarity the fine labels add up to most."""
    pred = prediction(probs, labels)
    coarse = {"negative": 0.0, "neutral": 0.0, "positive": 0.0}
    for label, p in pred["scores"].items():
        coarse[polarity_of(label)] += p
    pred["polarity"] = max(coarse, key=coarse.__getitem__)
    return pred
