"""Explanations as the API returns them, from the explain graphs' per-row outputs, and the limits
of an explain request.

Token weights (source2token), NLI token attribution (leave-one-out through the head) and the
sentiment graph's attention maps and fusion gates; plain lists, ready to serialise.
"""

from __future__ import annotations

import numpy as np

from disan.runtime.runtime import Runtime
from service.common.errors import InvalidRequest, RequestTooLarge
from service.inference.longtext import Tokenized


def check_explain(runtime: Runtime, count: int, field: str, graph: str, limit: int) -> None:
    """Refuse an explain request the bundle cannot serve or with more than `limit` items (cheap,
    before tokenizing)."""
    if graph not in runtime.graphs:
        raise InvalidRequest(f"explain: this bundle has no {graph} graph")
    if count > limit:
        raise RequestTooLarge(f"{field}: {count} items with explain=true, at most {limit} per request")


def check_explain_tokens(limit: int, *sides: list[Tokenized]) -> None:
    """The tokens of an explain request (at most `limit`), after tokenizing and before inference."""
    tokens = sum(len(t.ids) for items in sides for t in items)
    if tokens > limit:
        raise RequestTooLarge(f"explain: {tokens} tokens in the request, at most {limit} with explain=true")


def token_weights(tokens: list[str], out: dict[str, np.ndarray]) -> dict:
    return {"tokens": tokens, "token_weights": out["s2t"].astype(float).tolist()}


def leave_one_out_rows(p: dict[str, np.ndarray], h: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Head inputs of one explained pair: the pair itself, then the premise with each of its
    tokens left out of the pooling, then the hypothesis likewise: ([m, D], [m, D])."""
    n_p, n_h = len(p["loo_embedding"]), len(h["loo_embedding"])
    u = np.concatenate([p["embedding"][None], p["loo_embedding"], np.repeat(p["embedding"][None], n_h, 0)])
    v = np.concatenate([h["embedding"][None], np.repeat(h["embedding"][None], n_p, 0), h["loo_embedding"]])
    return u, v


def nli_explanation(p_tokens: list[str], h_tokens: list[str], p_out: dict[str, np.ndarray],
                    h_out: dict[str, np.ndarray], probs: np.ndarray) -> dict:
    """Per side: tokens, source2token weights and each token's attribution, the drop in the
    predicted label's probability when the token is left out of its sentence's pooling
    (`probs`: the head's rows from `leave_one_out_rows`)."""
    label = int(np.argmax(probs[0]))
    drop = probs[0, label] - probs[1:, label]
    n_p = len(p_tokens)
    return {"premise": {**token_weights(p_tokens, p_out), "attribution": drop[:n_p].astype(float).tolist()},
            "hypothesis": {**token_weights(h_tokens, h_out),
                           "attribution": drop[n_p:].astype(float).tolist()}}


def _per_token(a: np.ndarray) -> list[float]:
    """[n] or [n, d] -> one float per token (mean over features)."""
    return (a.mean(axis=-1) if a.ndim > 1 else a).astype(float).tolist()


def sentiment_explanation(tokens: list[str], out: dict[str, np.ndarray]) -> dict:
    return {
        "tokens": tokens,
        "token_weights": _per_token(out["s2t"]),
        "gate_fw": _per_token(out["gate_fw"]),
        "gate_bw": _per_token(out["gate_bw"]),
        "attention_fw": out["attn_fw"].astype(float).tolist(),
        "attention_bw": out["attn_bw"].astype(float).tolist(),
    }
