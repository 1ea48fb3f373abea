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
output, as static-embedding distillation does), reduced to `embed_dim` by PCA (`piece_vectors`).
Writes to `out`: `pieces.npy` (that start, cached), `student.pt` (an encoder checkpoint that carries
its tokenizer.json), `metrics.jsonl`.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from disan.distill.corpus.build import read_corpus
from disan.distill.student_config import StudentConfig
from disan.distill.supervision import StudentLabels
from disan.distill.teacher import TeacherCache, teacher_tokenizer_file
from disan.model import DiSANConfig, DiSANEncoder
from disan.text.pieces import PAD, PieceTokenizer
from disan.train.checkpoint import load_checkpoint, write_checkpoint


class PieceRows:
    """Piece ids of every corpus text, held flat (one int32 array and offsets), cut to `max_pieces`."""

    def __init__(self, tok: PieceTokenizer, texts: list[str], max_pieces: int, chunk: int = 65536):
        parts, lengths = [], []
        for start in range(0, len(texts), chunk):
            for ids in tok.batch_ids(texts[start:start + chunk]):
                ids = ids[:max_pieces] or [tok.unk_id or 1]
                parts.append(np.asarray(ids, np.int32))
                lengths.append(len(ids))
        self.flat = np.concatenate(parts)
        self.lengths = np.asarray(lengths, np.int32)
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)[:-1]])

    def batch(self, rows: np.ndarray, device: str) -> tuple[torch.Tensor, torch.Tensor]:
        width = int(self.lengths[rows].max())
        ids = np.full((len(rows), width), PAD, np.int64)
        for i, r in enumerate(rows):
            ids[i, :self.lengths[r]] = self.flat[self.offsets[r]:self.offsets[r] + self.lengths[r]]
        ids_t = torch.from_numpy(ids).to(device)
        return ids_t, ids_t != PAD

    def encode(self, encoder: DiSANEncoder, rows: np.ndarray, device: str, buckets: int = 1) -> torch.Tensor:
        """`encoder`'s vectors of `rows`, in order, run as `buckets` length-sorted parts: the
        attention costs n^2 a row, so one long passage must not pad a whole batch to its length."""
        order = np.argsort(self.lengths[rows], kind="stable")
        parts = [encoder(*self.batch(rows[part], device))
                 for part in np.array_split(order, buckets) if len(part)]
        out = torch.cat(parts)
        return out[torch.from_numpy(np.argsort(order, kind="stable")).to(out.device)]

    def encode_all(self, encoder: DiSANEncoder, rows: np.ndarray, device: str, buckets: int = 1,
                   chunk: int = 256) -> torch.Tensor:
        """`encode` of any number of rows, `chunk` at a time (evaluation and the head's fit)."""
        return torch.cat([self.encode(encoder, rows[i:i + chunk], device, buckets)
                          for i in range(0, len(rows), chunk)])


@torch.no_grad()
def piece_vectors(tok: PieceTokenizer, dim: int, encode, cache: Path) -> np.ndarray:
    """[len(tok), dim] start of the token table: each piece's teacher vector alone, PCA-reduced and
    scaled to unit mean norm (row 0, padding, is zero). `encode(texts) -> [N, D]` is the teacher."""
    if cache.is_file():
        table = np.load(cache)
        if table.shape == (len(tok), dim):
            return table
    words = tok.pieces_by_id()[PAD + 1:]
    texts = [w[2:] if w.startswith("##") else w for w in words]  # a continuation piece as a word
    raw = np.asarray(encode(texts), np.float32)
    raw = raw - raw.mean(0)
    _, _, vt = np.linalg.svd(raw[np.random.default_rng(0).permutation(len(raw))[:20000]],
                             full_matrices=False)
    reduced = raw @ vt[:dim].T
    reduced /= np.linalg.norm(reduced, axis=1).mean()
    table = np.zeros((len(tok), dim), np.float32)
    table[1:] = reduced
    cache.parent.mkdir(parents=True, exist_ok=True)
    np.save(cache, table)
    return table


def principal_axes(vectors: np.ndarray) -> np.ndarray:
    """[D, D] orthonormal rows, the uncentred principal axes of `vectors` by falling energy: turning
    vectors onto them keeps every cosine and puts the most of each vector first."""
    _, _, vt = np.linalg.svd(np.asarray(vectors, np.float64), full_matrices=False)
    return vt.astype(np.float32)


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
def fit_head(encoder: DiSANEncoder, rows: PieceRows, target: np.ndarray, chosen: np.ndarray,
             cfg: StudentConfig, ridge: float = 1e-3) -> None:
    """Set `encoder.proj` to the ridge-regression map from the encoder's own vectors (before the
    projection) of `chosen` rows to the teacher's vectors of them."""
    was, proj = encoder.training, encoder.proj
    encoder.eval()
    encoder.proj = None
    try:
        feats = rows.encode_all(encoder, chosen, cfg.device, cfg.length_buckets).double()
    finally:
        encoder.proj = proj
    x = torch.cat([feats, torch.ones(len(feats), 1, dtype=feats.dtype, device=feats.device)], 1)
    y = torch.from_numpy(target[chosen]).double().to(x.device)
    gram = x.T @ x
    gram += ridge * gram.diagonal().mean() * torch.eye(len(gram), dtype=gram.dtype, device=gram.device)
    w = torch.linalg.solve(gram, x.T @ y)
    proj.weight.copy_(w[:-1].T.float())
    proj.bias.copy_(w[-1].float())
    encoder.train(was)


@torch.no_grad()
def read_as_static(encoder: DiSANEncoder, shift: float = 4.0, gate: float = 3.0) -> None:
    """Set a fresh encoder's blocks so that its vector (before the projection) is, up to dropout and
    the little the fusion gate lets through, a linear map of the mean of its table's rows of a
    text: the two directions' maps are the halves of one orthogonal map, shifted by `shift` times the
    table's RMS so that ELU is linear where the rows lie; the fusion gate's bias keeps mostly h;
    source2token starts uniform (zero logits). Training then starts where a static encoder is."""
    cfg = encoder.cfg
    if cfg.encoder_kind != "disan" or cfg.mask_kind != "directional":
        raise ValueError("--static-start sets a directional DiSAN's blocks")
    both = torch.empty(2 * cfg.d_h, cfg.embed_dim)
    torch.nn.init.orthogonal_(both)
    rms = encoder.embed.weight[1:].pow(2).mean().sqrt()  # row 0 is PAD
    for block, part in ((encoder.fw, both[:cfg.d_h]), (encoder.bw, both[cfg.d_h:])):
        block.map.linear.weight.copy_(part)
        block.map.linear.bias.fill_(shift * rms)
        block.gate_s.linear.bias.fill_(gate)
    encoder.s2t.map2.linear.weight.zero_()
    encoder.s2t.map2.linear.bias.zero_()


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


def train_student(cfg: StudentConfig, teacher_encode=None) -> dict:
    """Train a piece-reading student; returns the last evaluation. `teacher_encode` (texts ->
    vectors) is needed only when the piece table's start is not cached yet."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    texts, info = read_corpus(cfg.corpus)
    cache = TeacherCache.read(cfg.teacher or cfg.corpus / "teacher-mpnet")
    done = cache.done
    if done < cfg.val_rows + cfg.batch_size:
        raise ValueError(f"{cache.folder}: only {done} rows encoded; the student needs more than "
                         f"{cfg.val_rows + cfg.batch_size}")
    target = np.asarray(cache.vectors()[:done], np.float32)
    if cfg.rotate_teacher:
        target = target @ principal_axes(target[cfg.val_rows:cfg.val_rows + 50_000]).T
    init = load_checkpoint(cfg.init) if cfg.init is not None else None
    tok = run_tokenizer(cfg, init)
    pairs = np.load(cfg.corpus / "pairs.npy")
    needed = np.zeros(len(texts), bool)  # the rows the teacher encoded and the pairs' texts
    needed[:done] = True
    needed[pairs[:, :2].ravel()] = True
    rows = PieceRows(tok, [t if keep else "" for t, keep in zip(texts, needed, strict=True)], cfg.max_pieces)
    relations = list(info.get("relations", {}))
    if cfg.relations:
        pairs = pairs[np.isin(pairs[:, 2], [relations.index(r) for r in cfg.relations if r in relations])]
    pairs = pairs[rng.permutation(len(pairs))]
    held = min(512, len(pairs) // 5)
    val_pairs, pairs = pairs[:held], pairs[held:]
    val, train_rows = np.arange(cfg.val_rows), np.arange(cfg.val_rows, done)  # the corpus is shuffled

    # a start that reads whole words (disan distill whole-words) keeps its tables' layout
    lent = ("vocab_size", "borrowed_rows", "borrowed_dim", "borrowed_offset")
    layout = ({k: init["config"][k] for k in lent} if init is not None and init["config"].get("borrowed_rows")
              else {"vocab_size": len(tok)})
    model_cfg = DiSANConfig(**layout, embed_dim=cfg.embed_dim, d_h=cfg.d_h, task="encoder",
                            proj_dim=cfg.proj_dim, keep_prob=cfg.keep_prob)
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
    body = [p for n, p in encoder.named_parameters() if not n.startswith("proj.") and p.requires_grad]
    labels = StudentLabels(cfg, tok, encoder.out_dim)
    groups = [{"params": body, "lr": cfg.lr}]
    groups += [{"params": head, "lr": cfg.lr * cfg.head_lr_scale}] if head else []
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
            init_from(cfg, encoder, tok, init)
            if cfg.tune == "all":
                encoder.trainable_rows.fill_(True)
            if cfg.anchor > 0:
                target = anchored(target, start_vectors(encoder, rows, done, cfg), cfg.anchor)
        else:
            fit_head(encoder, rows, target, train_rows[:cfg.fit_head_rows], cfg)
        probed = labels.probe(encoder)
        start_metrics = {"step": 0, **evaluate(encoder, rows, target, val, val_pairs, cfg)}
        start_metrics |= {"sentiment_probe": round(probed, 4)} if probed is not None else {}
        log.write(json.dumps(start_metrics) + "\n")
        print(json.dumps(start_metrics), flush=True)
    else:
        labels.probe(encoder)  # a fresh start without a fitted head: no step-0 evaluation to log it in
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
            save_student(cfg.out / "student.pt", encoder, tok, cfg, info, last)
            save_state(cfg, step, encoder, optimizer, schedule, rng, labels)
        if out_of_time:
            break
    return last


STATE_KEYS = ("embed_dim", "d_h", "proj_dim", "keep_prob", "dims", "max_pieces", "batch_size", "pairs_batch",
              "steps", "lr", "warmup_steps", "head_lr_scale", "rotate_teacher", "tune", "anchor", "seed",
              "scored_weight", "sentiment_weight", "labels_batch")


@torch.no_grad()
def start_vectors(encoder: DiSANEncoder | None, rows: PieceRows, done: int, cfg: StudentConfig) -> np.ndarray:
    """The --init student's own vectors of the first `done` rows [done, proj_dim], written to
    OUT/anchor.f16.npy. A resumed run (`encoder` None: its weights have moved) reads that file; a new
    run always computes them, so a file left by another start is never read as this one's."""
    path = cfg.out / "anchor.f16.npy"
    if encoder is None:
        cached = np.load(path) if path.is_file() else None
        if cached is None or len(cached) != done:
            raise ValueError(f"--resume with --anchor: {path} does not hold the start's vectors "
                             f"of {done} rows")
        return cached.astype(np.float32)
    was = encoder.training
    encoder.eval()
    own = rows.encode_all(encoder, np.arange(done), cfg.device, cfg.length_buckets, chunk=1024)
    encoder.train(was)
    vectors = own.float().cpu().numpy()
    cfg.out.mkdir(parents=True, exist_ok=True)
    np.save(path, vectors.astype(np.float16))
    return vectors


def anchored(target: np.ndarray, own: np.ndarray, share: float) -> np.ndarray:
    """Unit targets `share` of the way from the teacher's direction to the start's own."""
    def unit(x: np.ndarray) -> np.ndarray:
        return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    return unit((1.0 - share) * unit(target) + share * unit(own)).astype(np.float32)


def save_state(cfg: StudentConfig, step: int, encoder: DiSANEncoder, optimizer, schedule,
               rng: np.random.Generator, labels: StudentLabels | None = None) -> None:
    """What `--resume` needs to go on where this step left off, written beside student.pt."""
    state = {"step": step, "model": encoder.state_dict(), "labels_head": labels.state() if labels else None,
             "optimizer": optimizer.state_dict(),
             "schedule": schedule.state_dict(), "rng": rng.bit_generator.state,
             "torch_rng": torch.get_rng_state(), "config": {k: getattr(cfg, k) for k in STATE_KEYS}}
    tmp = cfg.out / "state.pt.tmp"
    torch.save(state, tmp)
    tmp.replace(cfg.out / "state.pt")


def resume_state(cfg: StudentConfig, encoder: DiSANEncoder, optimizer, schedule,
                 labels: StudentLabels | None = None) -> tuple[int, np.random.Generator]:
    """(first step, sampler) of a resumed run; refuses a state written with other flags."""
    path = cfg.out / "state.pt"
    if not path.is_file():
        raise ValueError(f"--resume: {path} not found (no evaluation step was reached)")
    state = torch.load(path, map_location=cfg.device, weights_only=False)
    asked = {k: getattr(cfg, k) for k in STATE_KEYS}
    fields = StudentConfig.__dataclass_fields__  # a key newer than the state: its default then
    changed = sorted(k for k in STATE_KEYS if state["config"].get(k, fields[k].default) != asked[k])
    if changed:
        raise ValueError(f"--resume: {path} was written with other {', '.join(changed)}")
    encoder.load_state_dict(state["model"])
    if labels is not None:
        labels.load_state(state.get("labels_head"))
    optimizer.load_state_dict(state["optimizer"])
    schedule.load_state_dict(state["schedule"])
    torch.set_rng_state(state["torch_rng"])
    rng = np.random.default_rng()
    rng.bit_generator.state = state["rng"]
    return state["step"] + 1, rng


def run_tokenizer(cfg: StudentConfig, init: dict | None) -> PieceTokenizer:
    """The run's tokenizer: --tokenizer, else the --init student's own (whole words too, after
    `disan distill whole-words`), else the teacher's WordPiece."""
    if cfg.tokenizer is not None:
        return PieceTokenizer.from_file(cfg.tokenizer)
    if init is not None and init.get("tokenizer"):
        return PieceTokenizer.from_str(init["tokenizer"])
    return PieceTokenizer.from_file(teacher_tokenizer_file())


def init_from(cfg: StudentConfig, encoder: DiSANEncoder, tok: PieceTokenizer, ckpt: dict) -> None:
    """Load the --init checkpoint `ckpt`'s weights into `encoder`; refuses a student of another
    shape, tokenizer or target space (a turned teacher's coordinates are not the teacher's own). The
    dropout rate may differ: it is a setting of training, not of the weights."""
    trained = ckpt.get("train_config", {})
    problems = [k for k, v in encoder.cfg.to_dict().items()
                if k != "keep_prob" and ckpt["config"].get(k) != v]
    problems += ["tokenizer"] if ckpt.get("tokenizer") != tok.to_str() else []
    problems += ["rotate_teacher"] if trained.get("rotate_teacher", False) != cfg.rotate_teacher else []
    if problems:
        raise ValueError(f"--init: {cfg.init} differs from this run in {', '.join(problems)}")
    encoder.load_state_dict(ckpt["model_state"])


def save_student(path: Path, encoder: DiSANEncoder, tok: PieceTokenizer, cfg: StudentConfig, corpus: dict,
                 metrics: dict) -> None:
    """An `encoder` checkpoint whose vocabulary is a tokenizer.json (no word list)."""
    write_checkpoint(path, {
        "format": "disan-checkpoint", "version": 1, "model_state": encoder.state_dict(),
        "config": encoder.cfg.to_dict(), "vocab": [], "tokenizer": tok.to_str(), "labels": [],
        "train_config": {k: v for k, v in asdict(cfg).items() if not isinstance(v, Path)},
        "corpus_sha256": corpus["sha256"], "metrics": metrics, "matryoshka_dims": list(cfg.dims)})
