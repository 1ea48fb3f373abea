"""Labelled training signals a distilled student may learn from beside its teacher (`disan pretrain
--corpus --pairs-weight / --nli-weight`), as sentence-transformers models are trained:

- scored pairs (STS-B train, SICK train relatedness), with an MSE loss on the cosine
  (CosineSimilarityLoss) or CoSENT's ranking loss (a pair scored higher must have the higher
  cosine), which optimises the order that the Spearman measure reads;
- NLI triples (premise, an entailed hypothesis, a contradicting one) from the NLI training files,
  with in-batch negatives (MultipleNegativesRankingLoss with a hard negative);
- SST-5 train phrases and their sentiment (0-4), through a training-only linear head on the
  normalised served vector (cross-entropy), so the vector itself carries the sentiment a frozen
  probe reads.

Never a dev or test pair: the NLI triples leave out the held-out SNLI dev slice that NLI model
selection uses, as the corpus does, and the sentiment phrases every evaluation text the corpus
excludes (`disan.distill.corpus.build.eval_keys`, by exact match).

`StudentLabels` gathers the scored pairs, the sentiment phrases and the NLI triples for `disan distill
student` (`--scored-weight`, `--sentiment-weight`, `--nli-weight`): the signals the shipped word student
learned in its last phases, which a phase from it keeps so that what the frozen-vector transfer tasks
read (sentiment, relatedness, entailment) stays. Its head is not exported.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from disan.bundle.manifest import NLI_LABELS
from disan.data.readers import nli_training_examples, read_jsonl
from disan.data.recipes import PAIR_LOSSES, RECIPES
from disan.data.sts import STS_SETS, STS_TRAIN_SETS, train_pairs
from disan.distill.corpus.build import EVAL_FILES, RETRIEVAL_FILES, RETRIEVAL_SETS, eval_keys, key
from disan.model import DiSANEncoder
from disan.optional import require
from disan.runtime.batching import sorted_batches
from disan.text.tokenizer import Vocab

if TYPE_CHECKING:
    from disan.distill.student.config import StudentConfig
    from disan.text.pieces import PieceTokenizer

MAX_TOKENS = 64


def staged_files() -> list[str]:
    """Every staged file, relative to --data, that a student run reads: the STS dev sets it is checked
    on, the scored pairs', NLI triples' and sentiment phrases' training sets, and the evaluation texts
    the phrases are kept apart from (`eval_keys`). A run on another machine (a GPU lease's kit) needs
    all of them."""
    checks = [spec[0] for spec in STS_SETS.values()]
    training = ([spec[0] for spec in STS_TRAIN_SETS.values()] + RECIPES["nli"]["train"]
                + RECIPES["sst5"]["train"])
    evaluation = [rel for rel, _ in EVAL_FILES] + [f"{rel}/{name}" for rel in RETRIEVAL_SETS
                                                    for name in RETRIEVAL_FILES]
    return list(dict.fromkeys(checks + training + evaluation))


def batch_tensors(rows: list[list[int]], idx,
                  device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded ids and mask of rows[idx], on `device` (the model's)."""
    enc = Vocab.pad([rows[i] for i in idx])
    return torch.from_numpy(enc.ids).to(device), torch.from_numpy(enc.mask).to(device)


def device_of(module: torch.nn.Module) -> torch.device:
    return next(module.parameters()).device


class ScoredPairs:
    """STS-B train + SICK train pairs as ids, scores in [0, 1]."""

    def __init__(self, data: Path, vocab: Vocab):
        left, right, scores = train_pairs(data)
        self.left = [vocab.text_ids(t, MAX_TOKENS) or [1] for t in left]
        self.right = [vocab.text_ids(t, MAX_TOKENS) or [1] for t in right]
        self.scores = torch.from_numpy(scores)

    def loss(self, encoder: DiSANEncoder, rng: np.random.Generator, size: int,
             kind: str = "mse") -> torch.Tensor:
        idx = rng.integers(0, len(self.scores), size=max(size, 2))
        device = device_of(encoder)
        cos = F.cosine_similarity(encoder(*batch_tensors(self.left, idx, device)),
                                  encoder(*batch_tensors(self.right, idx, device)), dim=-1)
        scores = self.scores[idx].to(device)
        if kind == "cosent":
            return cosent_loss(cos, scores)
        if kind == "mse":
            return F.mse_loss(cos, scores)
        raise ValueError(f"pair loss must be one of {', '.join(PAIR_LOSSES)}, not {kind!r}")


def cosent_loss(cos: torch.Tensor, scores: torch.Tensor, scale: float = 20.0) -> torch.Tensor:
    """log(1 + sum over pairs (i, j) with score_i > score_j of exp(scale * (cos_j - cos_i)))."""
    diff = scale * (cos[None, :] - cos[:, None])          # [B,B]: entry (i, j) = cos_j - cos_i
    wrong_order = scores[:, None] > scores[None, :]       # i should rank above j
    diff = diff.masked_fill(~wrong_order, float("-inf")).flatten()
    return torch.logsumexp(torch.cat([diff.new_zeros(1), diff]), dim=0)


def nli_triples(data: Path) -> list[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]]:
    """(premise, entailed hypothesis, contradicting hypothesis) token triples from the NLI training
    files, every premise with at least one of each; the held-out SNLI dev slice is left out."""
    by_premise: dict[tuple[str, ...], dict[str, list[tuple[str, ...]]]] = {}
    for ex in nli_training_examples(data):
        by_premise.setdefault(ex.texts[0], {}).setdefault(ex.label, []).append(ex.texts[1])
    return [(premise, pos, neg) for premise, hyps in by_premise.items()
            for pos, neg in zip(hyps.get("entailment", []), hyps.get("contradiction", []), strict=False)]


class NLITriples:
    """NLI triples as ids, for an in-batch ranking loss."""

    def __init__(self, data: Path, vocab: Vocab):
        triples = nli_triples(data)
        if not triples:
            raise ValueError(f"{data}: no NLI training triples found")
        self.anchor, self.pos, self.neg = ([vocab.token_ids(t[k], MAX_TOKENS) or [1] for t in triples]
                                           for k in range(3))

    def __len__(self) -> int:
        return len(self.anchor)

    def loss(self, encoder: DiSANEncoder, rng: np.random.Generator, size: int,
             temperature: float = 0.05) -> torch.Tensor:
        """Each premise must pick its own entailed hypothesis among the batch's entailed and
        contradicting hypotheses."""
        idx = rng.choice(len(self), size=min(max(size, 2), len(self)), replace=False)
        device = device_of(encoder)
        a = F.normalize(encoder(*batch_tensors(self.anchor, idx, device)), dim=-1)
        candidates = torch.cat([encoder(*batch_tensors(self.pos, idx, device)),
                                encoder(*batch_tensors(self.neg, idx, device))])
        logits = a @ F.normalize(candidates, dim=-1).T / temperature      # [B, 2B]
        return F.cross_entropy(logits, torch.arange(len(idx), device=device))


SENTIMENT_CLASSES = 5


class SentimentPhrases:
    """SST-5 train phrases of at least `min_tokens` tokens as ids, with their labels; single words
    and pairs are left out (mostly neutral, they would teach the head word polarity, not the
    sentence's)."""

    def __init__(self, data: Path, vocab: Vocab, min_tokens: int = 3):
        excluded = eval_keys(data)
        long = [r for rel in RECIPES["sst5"]["train"] for r in read_jsonl(data / rel)
                if len(r["text"].split()) >= min_tokens]
        kept = [r for r in long if key(r["text"]) not in excluded]
        if not kept:
            raise ValueError(f"{data}: no SST-5 training phrases of {min_tokens}+ tokens found")
        self.excluded = len(long) - len(kept)
        self.rows = [vocab.text_ids(r["text"], MAX_TOKENS) or [1] for r in kept]
        self.labels = torch.tensor([int(r["label"]) for r in kept])

    def __len__(self) -> int:
        return len(self.rows)

    def loss(self, encoder: DiSANEncoder, head: torch.nn.Linear, rng: np.random.Generator,
             size: int) -> torch.Tensor:
        idx = rng.integers(0, len(self), size=max(size, 2))
        return F.cross_entropy(head(served(encoder, self.rows, idx)), self.labels[idx].to(device_of(encoder)))

    def probe(self, encoder: DiSANEncoder, head: torch.nn.Linear, batch: int = 256) -> float:
        """Set `head` to the logistic regression fitted on the frozen encoder's vectors of every
        phrase, and return its training accuracy. A phase that starts from a trained student with
        a random head first moves the encoder to suit that head; probing first, then fine-tuning
        (Kumar et al. 2022, "Fine-Tuning can Distort Pretrained Features") starts the phase at a
        head that already reads the vector."""
        return probe_head(encoder, head, [len(r) for r in self.rows], batch,
                          lambda idx: served(encoder, self.rows, idx), self.labels)


NLI_CLASSES = len(NLI_LABELS)


class NLIClasses:
    """NLI training pairs as ids with their three labels, read by a training-only linear head on
    [u, v, |u - v|, u * v] of the served vectors (sentence-transformers' SoftmaxLoss): the features
    SICK-E's and the SNLI probe's regressions read, which ranking pairs alone wear away. SICK train
    is left out: the SICK-E transfer task fits its classifier on it."""

    skipped = ("senteval/SICK/sick_train.jsonl.gz",)

    def __init__(self, data: Path, vocab: Vocab):
        examples = nli_training_examples(data, skip=self.skipped)
        if not examples:
            raise ValueError(f"{data}: no NLI training pairs found")
        self.left = [vocab.token_ids(ex.texts[0], MAX_TOKENS) or [1] for ex in examples]
        self.right = [vocab.token_ids(ex.texts[1], MAX_TOKENS) or [1] for ex in examples]
        self.labels = torch.tensor([NLI_LABELS.index(ex.label) for ex in examples])

    def __len__(self) -> int:
        return len(self.labels)

    def features(self, encoder: DiSANEncoder, idx) -> torch.Tensor:
        u, v = served(encoder, self.left, idx), served(encoder, self.right, idx)
        return torch.cat([u, v, (u - v).abs(), u * v], dim=-1)

    def loss(self, encoder: DiSANEncoder, head: torch.nn.Linear, rng: np.random.Generator,
             size: int) -> torch.Tensor:
        idx = rng.integers(0, len(self), size=max(size, 2))
        return F.cross_entropy(head(self.features(encoder, idx)), self.labels[idx].to(device_of(encoder)))

    def probe(self, encoder: DiSANEncoder, head: torch.nn.Linear, batch: int = 256) -> float:
        """Set `head` to the logistic regression on the frozen encoder's pair features (as
        `SentimentPhrases.probe`); returns its training accuracy."""
        lengths = [max(len(a), len(b)) for a, b in zip(self.left, self.right, strict=True)]
        return probe_head(encoder, head, lengths, batch, lambda idx: self.features(encoder, idx), self.labels)


def served(encoder: DiSANEncoder, rows: list[list[int]], idx) -> torch.Tensor:
    """What a training-only head reads: the normalised served vectors of rows[idx], scaled to unit
    size per coordinate, as a probe's standardised features are, so a head starting small reaches
    useful logits at a distillation phase's low learning rate."""
    vectors = F.normalize(encoder(*batch_tensors(rows, idx, device_of(encoder))), dim=-1)
    return vectors * vectors.shape[-1] ** 0.5


def probe_head(encoder: DiSANEncoder, head: torch.nn.Linear, lengths: list[int], batch: int,
               features, labels: torch.Tensor) -> float:
    """Set `head` to the logistic regression fitted on `features(idx)` of every example (the frozen
    encoder, no dropout), and return its training accuracy."""
    linear_model = require("sklearn.linear_model", "train")
    batches = sorted_batches(lengths, batch)  # like lengths pad little
    training = encoder.training
    encoder.eval()  # no dropout: the vectors the start serves
    with torch.no_grad():
        x = torch.cat([features(idx) for idx in batches]).cpu().numpy()
    encoder.train(training)
    y = labels.numpy()[np.concatenate(batches)]
    fit = linear_model.LogisticRegression(max_iter=1000).fit(x, y)
    # sklearn keeps one row per class it saw (one row in all for two); a class never seen gets
    # a logit far below the others.
    coef = fit.coef_ if len(fit.classes_) > 2 else np.vstack([np.zeros_like(fit.coef_), fit.coef_])
    bias = fit.intercept_ if len(fit.classes_) > 2 else np.array([0.0, fit.intercept_[0]])
    weight = np.zeros((head.out_features, x.shape[1]), dtype=np.float32)
    offset = np.full(head.out_features, bias.min() - 20.0, dtype=np.float32)
    weight[fit.classes_], offset[fit.classes_] = coef, bias
    with torch.no_grad():
        head.weight.copy_(torch.from_numpy(weight))
        head.bias.copy_(torch.from_numpy(offset))
    return float(fit.score(x, y))


class StudentLabels:
    """The labelled terms of one run, or none (`active` False) when every weight is 0."""

    def __init__(self, cfg: StudentConfig, tok: PieceTokenizer, out_dim: int):
        self.cfg = cfg
        self.scored = ScoredPairs(cfg.data, tok) if cfg.scored_weight > 0 else None
        self.nli = NLITriples(cfg.data, tok) if cfg.nli_weight > 0 else None
        self.phrases = SentimentPhrases(cfg.data, tok) if cfg.sentiment_weight > 0 else None
        self.nli_classes = NLIClasses(cfg.data, tok) if cfg.nli_classes_weight > 0 else None
        self.heads = torch.nn.ModuleDict()  # training-only: none is exported
        if self.phrases is not None:
            self.heads["sentiment"] = torch.nn.Linear(out_dim, SENTIMENT_CLASSES)
        if self.nli_classes is not None:
            self.heads["nli_classes"] = torch.nn.Linear(4 * out_dim, NLI_CLASSES)
        self.heads.to(cfg.device)

    @property
    def active(self) -> bool:
        return any(term is not None for term in (self.scored, self.phrases, self.nli, self.nli_classes))

    def parameters(self) -> list[torch.nn.Parameter]:
        return list(self.heads.parameters())

    def probe(self, encoder: DiSANEncoder) -> dict[str, float]:
        """Fit each head on the start's frozen vectors (a new run, not a resumed one); returns their
        training accuracies by head."""
        fitted = {}
        if self.phrases is not None:
            fitted["sentiment_probe"] = self.phrases.probe(encoder, self.heads["sentiment"])
        if self.nli_classes is not None:
            fitted["nli_classes_probe"] = self.nli_classes.probe(encoder, self.heads["nli_classes"])
        return fitted

    def loss(self, encoder: DiSANEncoder, rng: np.random.Generator) -> tuple[torch.Tensor | None, dict]:
        """The weighted sum of the labelled terms on one batch each, and the terms."""
        terms, size = {}, self.cfg.labels_batch
        if self.scored is not None:
            terms["scored"] = (self.cfg.scored_weight, self.scored.loss(encoder, rng, size, kind="mse"))
        if self.phrases is not None:
            terms["sentiment"] = (self.cfg.sentiment_weight,
                                  self.phrases.loss(encoder, self.heads["sentiment"], rng, size))
        if self.nli is not None:
            terms["nli"] = (self.cfg.nli_weight, self.nli.loss(encoder, rng, size))
        if self.nli_classes is not None:
            terms["nli_classes"] = (self.cfg.nli_classes_weight,
                                    self.nli_classes.loss(encoder, self.heads["nli_classes"], rng, size))
        if not terms:
            return None, {}
        total = sum(weight * loss for weight, loss in terms.values())
        return total, {name: loss.item() for name, (_, loss) in terms.items()}

    def state(self) -> dict | None:
        return self.heads.state_dict() if len(self.heads) else None

    def load_state(self, state: dict | None) -> None:
        if state is None or not len(self.heads):
            return
        if "weight" in state:  # a state written when the sentiment head was the only one
            state = {f"sentiment.{k}": v for k, v in state.items()}
        self.heads.load_state_dict(state)
