"""A DiSAN student that reads subword pieces (`disan distill student`): distilled from the teacher's
cached vectors of a `disan corpus`, taught query -> passage by its (title, text) pairs, with vectors
whose prefixes are vectors too (Matryoshka).

Loss per step, on a batch of corpus rows the teacher has encoded and a batch of pairs:
- distillation: 1 - cosine(student, teacher) of the full served vector;
- geometry at every prefix m of `dims`: the squared error between the in-batch cosine matrix of the
  student's first m components and the teacher's (a prefix must keep what STS and clustering read);
- pairs: MultipleNegativesRanking (in-batch softmax over the passages, as sentence-transformers
  trains retrievers) at every prefix m, weight `pairs_weight`;
- labels, if asked: STS-B and SICK train scores, SST-5 train phrases
  (`disan.distill.supervision.StudentLabels`).

The token table starts from the teacher: each piece's teacher vector when read alone (mean-pooled
output, as static-embedding distillation does), reduced to `embed_dim` by PCA (`rows.piece_vectors`).
Writes to `out`: `pieces.npy` (that start, cached), `student.pt` (an encoder checkpoint that carries
its tokenizer.json), `metrics.jsonl`.
"""

from __future__ import annotations

import json
import time
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from disan.distill.corpus.build import read_corpus
from disan.distill.student.config import StudentConfig
from disan.distill.student.rows import PieceRows, piece_vectors, principal_axes
from disan.distill.student.starts import (
    anchored,
    fit_head,
    load_start,
    read_as_static,
    refuse_another_start,
    run_tokenizer,
    start_vectors,
    whitened_targets,
    whitening_map,
)
from disan.distill.student.state import resume_state, save_state, save_student
from disan.distill.supervision import StudentLabels
from disan.distill.teacher import TeacherCache
from disan.model import DiSANConfig, DiSANEncoder
from disan.text.pieces import PieceTokenizer
from disan.train.checkpoint import load_checkpoint


def cosine_matrix(x: torch.Tensor) -> torch.Tensor:
    x = F.normalize(x, dim=-1)
    return x @ x.T


def student_loss(pred: torch.Tensor, target: torch.Tensor, q: torch.Tensor | None, p: torch.Tensor | None,
                 cfg: StudentConfig) -> tuple[torch.Tensor, dict]:
    """The loss of one step and its parts (see the module docstring)."""
    distill = 1.0 - F.cosine_similarity(pred, target, dim=-1).mean()
    related = cosine_matrix(target)
    geometry = sum(F.mse_loss(cosine_matrix(pred[:, :m]), related) for m in cfg.dims)
    loss = cfg.geometry_weight * geometry
    if cfg.rotate_teacher:
        loss = loss + sum(1.0 - F.cosine_similarity(pred[:, :m], target[:, :m], dim=-1).mean()
                          for m in cfg.dims)
    else:
        loss = loss + distill
    parts = {"distill": distill.item(), "geometry": geometry.item()}
    if q is not None:
        labels = torch.arange(len(q), device=q.device)
        mnr = sum(F.cross_entropy(cfg.mnr_scale * F.normalize(q[:, :m], dim=-1)
                                  @ F.normalize(p[:, :m], dim=-1).T, labels) for m in cfg.dims)
        loss = loss + cfg.pairs_weight * mnr
        parts["mnr"] = mnr.item()
    return loss, parts


@torch.no_grad()
def evaluate(encoder: DiSANEncoder, rows: PieceRows, target: np.ndarray, val: np.ndarray,
             pairs: np.ndarray, cfg: StudentConfig) -> dict:
    """Held-out cosine to the teacher, and held-out pairs' retrieval accuracy (query -> its passage
    among the held-out passages) at each prefix."""
    encoder.eval()

    def vectors(chosen: np.ndarray) -> torch.Tensor:
        return rows.encode_all(encoder, chosen, cfg.device, cfg.length_buckets)

    pred = vectors(val)
    cos = F.cosine_similarity(pred, torch.from_numpy(target[val]).float().to(pred.device), dim=-1).mean()
    out = {"val_cosine": round(cos.item(), 4)}
    if len(pairs):
        q, p = vectors(pairs[:, 0]), vectors(pairs[:, 1])
        right = torch.arange(len(q), device=q.device)
        for m in cfg.dims:
            hit = (F.normalize(q[:, :m], dim=-1) @ F.normalize(p[:, :m], dim=-1).T).argmax(1)
            out[f"pair_acc@{m}"] = round((hit == right).float().mean().item(), 4)
    encoder.train()
    return out


def teacher_targets(cfg: StudentConfig, corpus_rows: int,
                    init: dict | None) -> tuple[np.ndarray | None, int]:
    """The teacher's vectors of the corpus rows it has encoded, in the coordinates the run distils
    into, and how many rows the run trains on. A phase held by its start alone (--anchor 1) reads
    no cache: None, and the corpus's first --anchor-rows rows, whose targets the start gives."""
    if not cfg.reads_teacher:
        done, folder, target = min(corpus_rows, cfg.anchor_rows), cfg.corpus, None
    else:
        cache = TeacherCache.read(cfg.teacher or cfg.corpus / "teacher-mpnet")
        done, folder = cache.done, cache.folder
        target = np.asarray(cache.vectors()[:done], np.float32)
    if done < cfg.val_rows + cfg.batch_size:
        raise ValueError(f"{folder}: only {done} rows to train on; the student needs more than "
                         f"{cfg.val_rows + cfg.batch_size}")
    if target is not None and cfg.rotate_teacher:
        target = target @ principal_axes(target[cfg.val_rows:cfg.val_rows + 50_000]).T
    if cfg.whiten_targets:
        target = whitened_targets(target, init, cfg.init)
    return target, done


def chosen_relations(pairs: np.ndarray, relations: list[str], wanted: tuple[str, ...], corpus: object
                     ) -> np.ndarray:
    """The pairs of the `wanted` relations (all where none is named). A name the corpus lacks is an
    error, not a run that trains on fewer pairs, or on none, than it was asked to."""
    if not wanted:
        return pairs
    missing = [r for r in wanted if r not in relations]
    if missing:
        raise ValueError(f"--relations {' '.join(missing)}: {corpus} has no such pairs (it has: "
                         f"{', '.join(relations) or 'none'})")
    return pairs[np.isin(pairs[:, 2], [relations.index(r) for r in wanted])]


def student_model_config(cfg: StudentConfig, tok: PieceTokenizer, init: dict | None) -> DiSANConfig:
    """The student's DiSAN config: the run's sizes; a start that reads whole words (disan distill
    whole-words) keeps its tables' layout, and a head that ends in a normalisation
    (research.whiten_head --unit-length) keeps it."""
    lent = ("vocab_size", "borrowed_rows", "borrowed_dim", "borrowed_offset")
    layout = ({k: init["config"][k] for k in lent} if init is not None and init["config"].get("borrowed_rows")
              else {"vocab_size": len(tok)})
    unit_length = bool(init is not None and init["config"].get("unit_length"))
    return DiSANConfig(**layout, embed_dim=cfg.embed_dim, d_h=cfg.d_h, task="encoder",
                       proj_dim=cfg.proj_dim, keep_prob=cfg.keep_prob, unit_length=unit_length,
                       layers=cfg.layers)


class RunInputs(NamedTuple):
    texts: list[str]
    info: dict  # corpus.json
    pairs: np.ndarray  # of the chosen relations
    init: dict | None  # the --init checkpoint
    tok: PieceTokenizer
    model_cfg: DiSANConfig


def read_inputs(cfg: StudentConfig) -> RunInputs:
    """What a run reads before the teacher's rows: the corpus's texts, the pairs of the chosen
    relations, the --init start (refused if another shape, tokenizer or target space, or without the
    whitening map --whiten-targets needs), the run's tokenizer and its model's config."""
    texts, info = read_corpus(cfg.corpus)
    pairs = chosen_relations(np.load(cfg.corpus / "pairs.npy"), list(info.get("relations", {})),
                             cfg.relations, cfg.corpus)
    init = load_checkpoint(cfg.init) if cfg.init is not None else None
    if cfg.whiten_targets:
        whitening_map(init, cfg.init)
    tok = run_tokenizer(cfg, init)
    model_cfg = student_model_config(cfg, tok, init)
    if init is not None:
        refuse_another_start(cfg, model_cfg, tok, init)
    return RunInputs(texts, info, pairs, init, tok, model_cfg)


def check_inputs(cfg: StudentConfig) -> str:
    """`read_inputs` and the staged files of the label terms, and nothing trained, so a bad input
    stops a lease before its minutes of teacher encoding (research/gpu-lease/device.sh runs this
    first); returns a line saying what was read."""
    texts, _, pairs, init, tok, model_cfg = read_inputs(cfg)
    labels = StudentLabels(cfg, tok, model_cfg.out_dim)
    read = [f"{len(texts):,} texts", f"{len(pairs):,} pairs", f"{len(tok):,} tokens"]
    read += [] if init is None else [f"the start {cfg.init}" + (" and its whitening map" if cfg.whiten_targets
                                                                else "")]
    read += ["the label terms' staged files"] if labels.active else []
    return "inputs read: " + ", ".join(read)


def train_student(cfg: StudentConfig, teacher_encode=None) -> dict:
    """Train a piece-reading student; returns the last evaluation. `teacher_encode` (texts ->
    vectors) is needed only when the piece table's start is not cached yet."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    texts, info, pairs, init, tok, model_cfg = read_inputs(cfg)
    target, done = teacher_targets(cfg, len(texts), init)
    needed = np.zeros(len(texts), bool)  # the rows the teacher encoded and the pairs' texts
    needed[:done] = True
    needed[pairs[:, :2].ravel()] = True
    rows = PieceRows(tok, [t if keep else "" for t, keep in zip(texts, needed, strict=True)], cfg.max_pieces,
                     windows=cfg.windows)
    pairs = pairs[rng.permutation(len(pairs))]
    held = min(512, len(pairs) // 5)
    val_pairs, pairs = pairs[:held], pairs[held:]
    val, train_rows = np.arange(cfg.val_rows), np.arange(cfg.val_rows, done)  # the corpus is shuffled

    encoder = DiSANEncoder(model_cfg).to(cfg.device)
    if cfg.starts_fresh and (teacher_encode is not None or (cfg.out / "pieces.npy").is_file()):
        table = piece_vectors(tok, cfg.embed_dim, teacher_encode, cfg.out / "pieces.npy")
        encoder.embed.weight.data.copy_(torch.from_numpy(table))
    if cfg.static_start:
        read_as_static(encoder)
    if cfg.tune != "all":
        for name, param in encoder.named_parameters():
            param.requires_grad_({"rows": name == "embed.weight", "head": name.startswith("proj."),
                                  "blocks": not name.startswith("embed.")}[cfg.tune])
    head = [p for n, p in encoder.named_parameters() if n.startswith("proj.") and p.requires_grad]
    own_table = cfg.table_lr_scale != 1.0  # its own group only then: earlier states keep their layout
    body = [p for n, p in encoder.named_parameters()
            if not n.startswith("proj.") and p.requires_grad and not (own_table and n == "embed.weight")]
    labels = StudentLabels(cfg, tok, encoder.out_dim)
    groups = [{"params": body, "lr": cfg.lr}]
    groups += [{"params": head, "lr": cfg.lr * cfg.head_lr_scale}] if head else []
    groups += [{"params": [encoder.embed.weight], "lr": cfg.lr * cfg.table_lr_scale}] if own_table else []
    groups += [{"params": labels.parameters(), "lr": cfg.lr}] if labels.parameters() else []
    optimizer = torch.optim.AdamW(groups, weight_decay=0.0)

    def rate(s: int) -> float:
        return min(1.0, (s + 1) / max(1, cfg.warmup_steps)) * max(0.0, 1.0 - s / cfg.steps)

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, rate)
    cfg.out.mkdir(parents=True, exist_ok=True)
    first = 1
    log = (cfg.out / "metrics.jsonl").open("a", encoding="utf-8")
    if cfg.resume:
        first, rng = resume_state(cfg, encoder, optimizer, schedule, labels)
        if cfg.anchor > 0:  # the start's vectors, cached by the run's first part
            target = anchored(target, start_vectors(None, rows, done, cfg), cfg.anchor)
    elif cfg.init is not None or (cfg.fit_head_rows > 0 and encoder.proj is not None):
        if init is not None:
            load_start(encoder, init)  # read_inputs refused another start
            if cfg.tune == "all":
                encoder.trainable_rows.fill_(True)
            if cfg.anchor > 0:
                target = anchored(target, start_vectors(encoder, rows, done, cfg), cfg.anchor)
        else:
            fit_head(encoder, rows, target, train_rows[:cfg.fit_head_rows], cfg)
        probed = labels.probe(encoder)
        start_metrics = {"step": 0, **evaluate(encoder, rows, target, val, val_pairs, cfg)}
        start_metrics |= {name: round(accuracy, 4) for name, accuracy in probed.items()}
        log.write(json.dumps(start_metrics) + "\n")
        print(json.dumps(start_metrics), flush=True)
    else:
        labels.probe(encoder)  # a fresh start without a fitted head: no step-0 evaluation to log it in
    # the map of --whiten-targets names the coordinates the student is trained in: a later phase
    # from this student reads it (a phase held by its start alone stays in the start's coordinates)
    keeps_map = cfg.whiten_targets or (not cfg.reads_teacher and "whitening" in init)
    kept = {"whitening": init["whitening"]} if keeps_map else {}
    start, last = time.monotonic(), {}
    for step in range(first, cfg.steps + 1):
        batch = rng.choice(train_rows, cfg.batch_size, replace=False)
        pred = rows.encode(encoder, batch, cfg.device, cfg.length_buckets)
        q = p = None
        if cfg.pairs_weight > 0 and len(pairs):
            chosen = pairs[rng.integers(0, len(pairs), cfg.pairs_batch)]
            q = rows.encode(encoder, chosen[:, 0], cfg.device, cfg.length_buckets)
            p = rows.encode(encoder, chosen[:, 1], cfg.device, cfg.length_buckets)
        loss, parts = student_loss(pred, torch.from_numpy(target[batch]).to(cfg.device), q, p, cfg)
        if labels.active:
            labelled, label_parts = labels.loss(encoder, rng)
            loss, parts = loss + labelled, parts | label_parts
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(encoder.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        out_of_time = cfg.max_minutes is not None and time.monotonic() - start > 60 * cfg.max_minutes
        if step % cfg.eval_every == 0 or step == cfg.steps or out_of_time:
            last = {"step": step, "seconds": round(time.monotonic() - start, 1), **parts,
                    **evaluate(encoder, rows, target, val, val_pairs, cfg)}
            log.write(json.dumps(last) + "\n")
            log.flush()
            print(json.dumps(last), flush=True)
            save_student(cfg.out / "student.pt", encoder, tok, cfg, info, last, kept)
            save_state(cfg, step, encoder, optimizer, schedule, rng, labels)
        if out_of_time:
            break
    return last
