"""Distil a teacher's cached sentence vectors of a corpus into a DiSAN encoder (`disan pretrain
--corpus`): the training loop at scale, with resume.

Loss: 1 - cosine(student, teacher) plus, with weight --contrastive, an in-batch InfoNCE term
(each student vector must pick its own teacher vector among the batch's), which keeps unrelated
sentences apart, the property unsupervised STS rewards; with --relational, the squared error
between the student's and the teacher's cosines of every two sentences of the batch; and, with
--pairs-weight / --nli-weight / --sentiment-weight, the labelled signals of `disan.distill.supervision`;
with --whitened, a cosine in the teacher's space with its principal directions evened out
(`disan.distill.whitening`); with --anchor, 1 - cosine between the student's served vector and that of the
--init-from student it started as (frozen): a further phase adds its new term's change while the
rest of the function stays where it was selected (with --distill-weight 0 the teacher's terms are
off and the anchor alone holds the phase, over every corpus sentence, encoded by the teacher or
not). --neighbour-group builds each batch from
groups of sentences that are neighbours in the teacher's space (`disan.distill.neighbours`) instead of at
random. The student's vector enters the teacher's space through a linear map: inside the encoder
(--serve-proj: the served vector is the projected one) or beside it (the served vector is DiSAN's
own 2*d_h vector).

Model selection: cosine Spearman on STS-B dev (`disan.data.sts`); SICK dev and the mean cosine to the
teacher on a held-out slice of the corpus are logged beside it. Writes to --out: vocab.json,
best.pt (an `encoder` checkpoint), last.pt (+ optimizer and step, for --resume), metrics.jsonl.
--init-from starts from a trained student's `encoder` checkpoint (its vocabulary and shape) with a
fresh optimizer: a further phase on other data or losses.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from disan.data.recipes import decayed_lr
from disan.data.sts import sts_scores
from disan.distill.config import DistillConfig
from disan.distill.neighbours import neighbour_batches
from disan.distill.supervision import (
    MAX_TOKENS,
    SENTIMENT_CLASSES,
    NLITriples,
    ScoredPairs,
    SentimentPhrases,
    device_of,
)
from disan.distill.supervision import batch_tensors as _batch
from disan.distill.whitening import TeacherWhitening
from disan.model import DiSANConfig, DiSANEncoder
from disan.runtime.batching import length_batches, sorted_batches
from disan.text.pieces import AnyTokenizer
from disan.text.tokenizer import Vocab, tokenize
from disan.train import word_vectors as E
from disan.train.checkpoint import (
    checkpoint_vocab,
    load_checkpoint,
    model_from_checkpoint,
    provenance,
    save_checkpoint,
)
from disan.train.loop import resolve_device


def corpus_vocab(texts: list[list[str]], size: int, min_count: int = 2) -> Vocab:
    """The `size` most frequent tokens of the corpus (seen at least `min_count` times)."""
    counts = Counter(t for toks in texts for t in toks)
    return Vocab(w for w, c in counts.most_common(size) if c >= min_count)


def corpus_tokens(sentences: list[str]) -> list[list[str]]:
    """The tokens a student reads of each corpus sentence (and counts for its vocabulary)."""
    return [tokenize(s)[:MAX_TOKENS] for s in sentences]


def scratch_word_vectors(cfg: DistillConfig, sentences: list[str]) -> Path:
    """Compute (or find) the static word vectors a student from scratch starts from: `--init`'s
    vectors at `--embed-dim` of the `--vocab-size` corpus words that `distill` would choose.
    Returns their cache file. A lease carries it (research/gpu-lease/pack.sh CACHE_FILES), so the
    GPU machine neither encodes the words nor needs scikit-learn for their PCA."""
    vocab = corpus_vocab(corpus_tokens(sentences), cfg.vocab_size)
    path = E.static_vectors_file(vocab, cfg.embed_dim, cfg.init)
    E.static_vectors(vocab, cfg.embed_dim, cfg.init)
    print(f"vocab {len(vocab)}: {cfg.init} vectors at {cfg.embed_dim}-d -> {path}")
    return path


class Student(torch.nn.Module):
    """The encoder plus, unless the encoder ends in its own projection, a training-only map into
    the teacher's space; with `sentiment`, a training-only sentiment head on the served vector
    (--sentiment-weight). Neither is exported: only `encoder` is."""

    def __init__(self, cfg: DiSANConfig, teacher_dim: int, sentiment: bool = False):
        super().__init__()
        self.encoder = DiSANEncoder(cfg)
        self.map = None if cfg.proj_dim else torch.nn.Linear(self.encoder.out_dim, teacher_dim)
        self.sentiment = torch.nn.Linear(self.encoder.out_dim, SENTIMENT_CLASSES) if sentiment else None

    def to_teacher(self, served: torch.Tensor) -> torch.Tensor:
        """The served vector in the teacher's space."""
        return served if self.map is None else self.map(served)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.to_teacher(self.encoder(ids, mask))


def distill_loss(pred: torch.Tensor, target: torch.Tensor, contrastive: float, temperature: float,
                 relational: float = 0.0, second: torch.Tensor | None = None, mix: float = 0.0):
    """Cosine to the teacher, + in-batch InfoNCE, + the relational term: the squared error between
    the student's in-batch cosine matrix and the teacher's (mixed with a `second` teacher's, its
    share `mix`, where one is given: its vectors may live in another space)."""
    pred_n, target_n = F.normalize(pred, dim=-1), F.normalize(target, dim=-1)
    loss = 1.0 - (pred_n * target_n).sum(-1).mean()
    if contrastive > 0:
        logits = pred_n @ target_n.T / temperature                      # [B,B]
        loss = loss + contrastive * F.cross_entropy(logits, torch.arange(len(pred), device=pred.device))
    if relational > 0:
        # The cosine between two sentences is what STS scores: match the student's batch of them to
        # the teacher's, not only each vector to its own target.
        related = target_n @ target_n.T                                  # [B,B]
        if second is not None:
            second_n = F.normalize(second, dim=-1)
            related = (1.0 - mix) * related + mix * (second_n @ second_n.T)
        loss = loss + relational * F.mse_loss(pred_n @ pred_n.T, related)
    return loss


@torch.no_grad()
def encode_rows(encoder: DiSANEncoder, rows: list[list[int]]) -> np.ndarray:
    """Served vectors of token id rows, in order (eval mode; training mode restored)."""
    was = encoder.training
    encoder.eval()
    out = np.zeros((len(rows), encoder.out_dim), dtype=np.float32)
    for b in sorted_batches([len(r) for r in rows], 256):
        out[b] = encoder(*_batch(rows, b, device_of(encoder))).cpu().numpy()
    encoder.train(was)
    return out


def encode_texts(encoder: DiSANEncoder, vocab: Vocab, texts: list[str]) -> np.ndarray:
    """Served vectors of raw texts, in order, each cut to MAX_TOKENS (`encode_rows`)."""
    return encode_rows(encoder, [vocab.text_ids(t, MAX_TOKENS) or [0] for t in texts])


def checkpoint_encoder(path: Path):
    """`encode(texts)` of a checkpoint's sentence vectors (eval mode): an `encoder` checkpoint's
    served vectors, or the encoder of an NLI or sentiment model (an ensemble's first member), which
    is what a bundle exported without `--embed` serves at /embed."""
    model, vocab, _ = model_from_checkpoint(load_checkpoint(path))
    encoder = getattr(model, "encoder", model)
    return lambda texts: encode_texts(encoder, vocab, texts)


def checkpoint_rows(path: Path) -> tuple[Callable[[list[list[int]]], np.ndarray], AnyTokenizer]:
    """(token id rows -> a checkpoint's sentence vectors, its tokenizer): rows already cut to a
    window, as a bundle's graph reads them, through the checkpoint's encoder in eval mode."""
    model, vocab, _ = model_from_checkpoint(load_checkpoint(path))
    encoder = getattr(model, "encoder", model)
    return (lambda rows: encode_rows(encoder, rows)), vocab


@torch.no_grad()
def _val_cosine(student: Student, rows, target, idx: np.ndarray) -> float:
    student.eval()
    total = 0.0
    for b in sorted_batches([len(rows[i]) for i in idx], 256):
        pred = student(*_batch(rows, idx[b], device_of(student)))
        total += F.cosine_similarity(pred, target[idx[b]].to(pred.device), dim=-1).sum().item()
    student.train()
    return total / len(idx)


def _same_on_resume(out: Path, flag: str, asked: bool, trained: bool) -> None:
    if asked != trained:
        done = "with" if trained else "without"
        raise ValueError(f"{out / 'last.pt'}: trained {done} {flag}; resume it the same way")


def distill(cfg: DistillConfig, sentences: list[str], teacher_prefix: Callable[[], np.ndarray],
            second_prefix: Callable[[], np.ndarray] | None = None) -> dict:
    """Train on the sentences whose teacher vectors are cached, as `cfg` says; returns the best
    record. `second_prefix` (--relational-teacher): a second teacher's vectors of the same rows,
    mixed into the relational term's target.

    `teacher_prefix()` gives the vectors of the corpus's first rows; it is asked again before each
    pass over the data, so a student trains while its teacher is still encoding the corpus. The
    vocabulary comes from the whole corpus; the first rows are the validation slice.
    """
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    teacher = teacher_prefix()
    texts = corpus_tokens(sentences)
    resume = load_checkpoint(out / "last.pt") if cfg.resume and (out / "last.pt").is_file() else None
    start = load_checkpoint(cfg.init_from) if cfg.init_from and not resume else None
    known = resume or start
    # A further phase names the student it went on from (and that one's own origin) in its
    # checkpoints, so a bundle exported from it can say where its weights came from.
    origin = resume.get("init_from") if resume else start and provenance(cfg.init_from, start)
    lineage = {"init_from": origin} if origin else {}
    vocab = checkpoint_vocab(known) if known else corpus_vocab(texts, cfg.vocab_size)
    vocab.save(out / "vocab.json")
    rows = [vocab.token_ids(t, MAX_TOKENS) or [1] for t in texts]
    if known:  # a trained student goes on (or a run resumes): its own architecture, not the flags'
        model_cfg = DiSANConfig.from_dict(known["config"])
        if model_cfg.proj_dim not in (0, teacher.shape[1]):
            raise ValueError(f"{out / 'last.pt' if resume else cfg.init_from}: serves {model_cfg.proj_dim}-d "
                             f"vectors, the teacher {teacher.shape[1]}-d")
    else:
        model_cfg = DiSANConfig(vocab_size=len(vocab), embed_dim=cfg.embed_dim, d_h=cfg.d_h,
                                keep_prob=cfg.keep_prob, task="encoder",
                                proj_dim=teacher.shape[1] if cfg.serve_proj else 0)
    torch.manual_seed(cfg.seed)
    device = resolve_device(cfg.device)
    whitening = (TeacherWhitening.fit(teacher, cfg.whiten_power).to(device)
                 if cfg.whitened > 0 else None)
    sentiment = cfg.sentiment_weight > 0
    if resume:
        # The saved state has the sentiment head, and the optimizer the table's moments, or not:
        # each loads only into a student and optimizer built the same way.
        _same_on_resume(out, "--sentiment-weight", sentiment,
                        any(k.startswith("sentiment.") for k in resume["student_state"]))
        _same_on_resume(out, "--freeze-words", cfg.freeze_words,
                        resume["train_config"].get("freeze_words", False))
    # On its device before the optimizer exists: loaded optimizer state follows the parameters.
    student = Student(model_cfg, teacher.shape[1], sentiment=sentiment).to(device)
    if cfg.freeze_words:  # before the optimizer: Adam then keeps no state for it
        student.encoder.embed.weight.requires_grad_(False)
    optimizer = torch.optim.Adam([p for p in student.parameters() if p.requires_grad], lr=cfg.lr)
    step, best = 0, {"stsb": -1.0}
    if resume:
        student.load_state_dict(resume["student_state"])
        optimizer.load_state_dict(resume["optimizer_state"])
        for group in optimizer.param_groups:  # --lr applies on resume too: a cool-down phase
            group["lr"] = cfg.lr
        step, best = resume["step"], resume["best"]
    elif start:
        student.encoder.load_state_dict(start["model_state"])
        print(f"from {cfg.init_from}: vocab {len(vocab)}, d_h {model_cfg.d_h}, "
              f"served {student.encoder.out_dim}-d")
    else:
        vectors = None if cfg.init == "random" else E.static_vectors(vocab, cfg.embed_dim, cfg.init)
        matrix, found = E.init_matrix(vocab, vectors, cfg.embed_dim, cfg.seed)
        with torch.no_grad():
            student.encoder.embed.weight.copy_(torch.from_numpy(matrix))
        print(f"vocab {len(vocab)} ({found} from {cfg.init})")
    anchor = _anchor(cfg, model_cfg, start).to(device) if cfg.anchor > 0 else None
    rng = np.random.default_rng(cfg.seed + step)
    pairs = ScoredPairs(cfg.data, vocab) if cfg.pairs_weight > 0 else None
    triples = NLITriples(cfg.data, vocab) if cfg.nli_weight > 0 else None
    phrases = SentimentPhrases(cfg.data, vocab) if cfg.sentiment_weight > 0 else None
    if phrases is not None:
        print(f"sentiment: {len(phrases)} SST-5 train phrases "
              f"({phrases.excluded} left out as evaluation text)")
        if cfg.probe_first and not resume:
            accuracy = phrases.probe(student.encoder, student.sentiment)
            print(f"sentiment head probed on the start's vectors: training accuracy {accuracy:.4f}")
    teacher_free = cfg.distill_weight == 0 and whitening is None and not cfg.neighbour_group
    first_step = step  # --lr-decay runs over this invocation's steps (a resume decays afresh)
    n_val = min(2000, len(teacher) // 10)
    val = np.arange(n_val)
    started = time.monotonic()
    log = (out / "metrics.jsonl").open("a", encoding="utf-8")
    done = False
    while not done:
        teacher = teacher_prefix()
        target = torch.from_numpy(np.asarray(teacher, dtype=np.float32))
        second = (torch.from_numpy(np.asarray(second_prefix()[: len(teacher)], dtype=np.float32))
                  if second_prefix else None)
        # A phase held by its start alone reads no teacher vector while it trains: every corpus
        # sentence can hold the anchor, not only the rows the teacher has encoded so far.
        train = np.arange(n_val, len(rows) if teacher_free else len(teacher))
        print(f"pass from step {step}: train {len(train)}, val {n_val} sentences", flush=True)
        lengths = [len(rows[i]) for i in train]
        if cfg.neighbour_group:
            batches = neighbour_batches(teacher[n_val:], lengths, cfg.batch_size, cfg.neighbour_group, rng)
        else:
            batches = length_batches(lengths, cfg.batch_size, rng)
        for b in batches:
            ids, mask = _batch(rows, train[b], device)
            served = student.encoder(ids, mask)
            loss = served.new_zeros(())
            if not teacher_free:
                pred = student.to_teacher(served)
                wanted = target[train[b]].to(device)
                loss = cfg.distill_weight * distill_loss(
                    pred, wanted, cfg.contrastive, cfg.temperature, cfg.relational,
                    None if second is None else second[train[b]].to(device), cfg.relational_mix)
                if whitening is not None:
                    loss = loss + cfg.whitened * whitening.loss(pred, wanted)
            if anchor is not None:
                with torch.no_grad():
                    kept = anchor(ids, mask)
                loss = loss + cfg.anchor * (1.0 - F.cosine_similarity(served, kept, dim=-1).mean())
            if pairs is not None:
                pair_loss = pairs.loss(student.encoder, rng, cfg.batch_size // 4, kind=cfg.pair_loss)
                loss = loss + cfg.pairs_weight * pair_loss
            if triples is not None:
                nli_loss = triples.loss(student.encoder, rng, cfg.batch_size // 4, cfg.temperature)
                loss = loss + cfg.nli_weight * nli_loss
            if phrases is not None:
                sentiment_loss = phrases.loss(student.encoder, student.sentiment, rng, cfg.batch_size // 4)
                loss = loss + cfg.sentiment_weight * sentiment_loss
            for group in optimizer.param_groups:
                group["lr"] = decayed_lr(cfg.lr, cfg.lr_decay, step - first_step, cfg.steps - first_step)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            out_of_time = cfg.max_minutes and time.monotonic() - started > 60 * cfg.max_minutes
            done = step >= cfg.steps or bool(out_of_time)
            if step % cfg.eval_every == 0 or done:
                best = _evaluate(student, vocab, rows, target, val, step, float(loss.detach()), best, out,
                                 optimizer, cfg, log, lineage)
            if done:
                break
    log.close()
    return best


def _anchor(cfg: DistillConfig, model_cfg: DiSANConfig, start: dict | None) -> torch.nn.Module:
    """The --init-from student, frozen: what --anchor keeps the phase near. `start` is that
    checkpoint where this run loaded it already; a --resume reads it again."""
    if not cfg.init_from:
        raise ValueError("--anchor needs --init-from: the student whose vectors the phase stays near")
    start = start or load_checkpoint(cfg.init_from)
    if start["config"] != model_cfg.to_dict():
        raise ValueError(f"--anchor: {cfg.init_from} has another shape than the student trained here")
    anchor, _, _ = model_from_checkpoint(start)  # eval mode
    return anchor.requires_grad_(False)


def _evaluate(student, vocab, rows, target, val, step, loss, best, out, optimizer, cfg: DistillConfig,
              log, lineage: dict) -> dict:
    sts = sts_scores(lambda t: encode_texts(student.encoder, vocab, t), cfg.data, ["STS-B dev", "SICK dev"])
    val_cosine = round(_val_cosine(student, rows, target, val), 4)
    record = {"step": step, "loss": round(loss, 4), "val_cosine": val_cosine,
              "stsb": round(sts["STS-B dev"], 4), "sick": round(sts["SICK dev"], 4)}
    log.write(json.dumps(record) + "\n")
    log.flush()
    print(json.dumps(record), flush=True)
    config = cfg.record()
    if record["stsb"] > best["stsb"]:
        best = record
        save_checkpoint(out / "best.pt", student.encoder, vocab, [], train_config=config, step=step,
                        metrics=record, **lineage)
    save_checkpoint(out / "last.pt", student.encoder, vocab, [], train_config=config, step=step, best=best,
                    student_state=student.state_dict(), optimizer_state=optimizer.state_dict(), **lineage)
    return best
