"""Labelled signals beside the distillation in `disan distill student` (`--scored-weight`,
`--sentiment-weight`, both reading `--data`): the signals the shipped word student learned in its
last phases. Those are the STS-B and SICK train pairs' scores (MSE on the cosine) and the SST-5
train phrases, read through a training-only head that is probed on the start's vectors first. A
phase from that student that keeps them keeps what the frozen-vector transfer tasks read
(sentiment, relatedness). The distillation and the corpus pairs alone pull it away from that.

The readers are `disan.distill.supervision`'s: never a dev or test text. The head is not exported.
"""

from __future__ import annotations

import numpy as np
import torch

from disan.distill.student_config import StudentConfig
from disan.distill.supervision import SENTIMENT_CLASSES, ScoredPairs, SentimentPhrases
from disan.model import DiSANEncoder
from disan.text.pieces import PieceTokenizer


class StudentLabels:
    """The labelled terms of one run, or none (`active` False) when both weights are 0."""

    def __init__(self, cfg: StudentConfig, tok: PieceTokenizer, out_dim: int):
        self.cfg = cfg
        self.scored = ScoredPairs(cfg.data, tok) if cfg.scored_weight > 0 else None
        self.phrases = SentimentPhrases(cfg.data, tok) if cfg.sentiment_weight > 0 else None
        self.head = (torch.nn.Linear(out_dim, SENTIMENT_CLASSES).to(cfg.device)
                     if self.phrases is not None else None)

    @property
    def active(self) -> bool:
        return self.scored is not None or self.phrases is not None

    def parameters(self) -> list[torch.nn.Parameter]:
        return list(self.head.parameters()) if self.head is not None else []

    def probe(self, encoder: DiSANEncoder) -> float | None:
        """Fit the sentiment head on the start's frozen vectors (a new run, not a resumed one);
        returns its training accuracy."""
        return self.phrases.probe(encoder, self.head) if self.phrases is not None else None

    def loss(self, encoder: DiSANEncoder, rng: np.random.Generator) -> tuple[torch.Tensor | None, dict]:
        """The weighted sum of the labelled terms on one batch each, and the terms."""
        total, parts, size = None, {}, self.cfg.labels_batch
        if self.scored is not None:
            scored = self.scored.loss(encoder, rng, size, kind="mse")
            total, parts["scored"] = self.cfg.scored_weight * scored, scored.item()
        if self.phrases is not None:
            sentiment = self.phrases.loss(encoder, self.head, rng, size)
            weighted = self.cfg.sentiment_weight * sentiment
            total = weighted if total is None else total + weighted
            parts["sentiment"] = sentiment.item()
        return total, parts

    def state(self) -> dict | None:
        return self.head.state_dict() if self.head is not None else None

    def load_state(self, state: dict | None) -> None:
        if self.head is not None and state is not None:
            self.head.load_state_dict(state)
