"""Training loop of `disan pretrain`: DiSAN encoder + linear map -> MiniLM vector (cosine loss).

Writes to --out: vocab.json, best.pt (an `encoder` checkpoint: load it into an NLI or sentiment
run with `disan train --init-encoder`), metrics.jsonl. Selection uses the mean cosine on a fixed
2% validation slice of the sentences (never a task's dev or test set).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from disan.distill.config import PretrainConfig
from disan.model import DiSANConfig, DiSANEncoder
from disan.runtime.batching import length_batches, sorted_batches
from disan.text.tokenizer import Vocab
from disan.train import word_vectors as E
from disan.train.checkpoint import save_checkpoint


def _vocab(cfg: PretrainConfig, texts: list[list[str]]) -> tuple[Vocab, E.WordVectors | None]:
    vectors = None
    if cfg.init == "glove" or cfg.vocab is None:
        vectors = (E.load_text_vectors(cfg.glove, {w for t in texts for w in t}, cfg.glove_extra)
                   if cfg.glove else E.load_glove_package())
    vocab = Vocab.load(cfg.vocab) if cfg.vocab else E.build_vocab(texts, vectors, cfg.glove_extra)
    if cfg.init in E.STATIC_SOURCES:
        vectors = E.static_vectors(vocab, cfg.embed_dim, cfg.init)
    elif cfg.init == "random":
        vectors = None
    return vocab, vectors


def _batch(rows: list[list[int]], idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    enc = Vocab.pad([rows[i] for i in idx])
    return torch.from_numpy(enc.ids), torch.from_numpy(enc.mask)


@torch.no_grad()
def _mean_cosine(encoder, proj, rows, target, idx: np.ndarray) -> float:
    encoder.eval()
    total = 0.0
    for b in sorted_batches([len(rows[i]) for i in idx], 256):
        ids, mask = _batch(rows, idx[b])
        pred = proj(encoder(ids, mask))
        total += F.cosine_similarity(pred, target[idx[b]], dim=-1).sum().item()
    encoder.train()
    return total / len(idx)


def pretrain_encoder(cfg: PretrainConfig, sentences: list[str], teacher: np.ndarray) -> dict:
    """Distil `teacher` [N, 384] vectors of `sentences` into a new DiSAN encoder, as `cfg` says;
    returns the best metrics."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    texts = [s.split(" ") for s in sentences]
    vocab, vectors = _vocab(cfg, texts)
    vocab.save(out / "vocab.json")
    matrix, found = E.init_matrix(vocab, vectors, vectors.dim if vectors else cfg.embed_dim, cfg.seed)
    model_cfg = DiSANConfig(vocab_size=len(vocab), embed_dim=matrix.shape[1], d_h=cfg.d_h, keep_prob=0.9,
                            task="encoder")
    torch.manual_seed(cfg.seed)
    encoder = DiSANEncoder(model_cfg)
    with torch.no_grad():
        encoder.embed.weight.copy_(torch.from_numpy(matrix))
        encoder.trainable_rows.copy_(torch.from_numpy(E.trainable_rows(vocab, texts)))
    proj = torch.nn.Linear(encoder.out_dim, teacher.shape[1])
    optimizer = torch.optim.Adam([*encoder.parameters(), *proj.parameters()], lr=cfg.lr)
    rows = [vocab.token_ids(t, 128) for t in texts]
    target = torch.from_numpy(teacher.astype(np.float32))
    rng = np.random.default_rng(cfg.seed)
    perm = rng.permutation(len(rows))
    val, train = perm[: max(1, len(rows) // 50)], perm[max(1, len(rows) // 50):]
    print(f"vocab {len(vocab)} ({found} pre-trained), train {len(train)}, val {len(val)} sentences")
    started, step, best = time.monotonic(), 0, {"val_cosine": -1.0}
    log = (out / "metrics.jsonl").open("a", encoding="utf-8")
    out_of_time = False
    for epoch in range(cfg.epochs):
        batches = length_batches([len(rows[i]) for i in train], cfg.batch_size, rng)
        for b in tqdm(batches, desc=f"pretrain epoch {epoch + 1}", mininterval=10):
            ids, mask = _batch(rows, train[b])
            loss = 1.0 - F.cosine_similarity(proj(encoder(ids, mask)), target[train[b]], dim=-1).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            out_of_time = bool(cfg.max_minutes) and time.monotonic() - started > 60 * cfg.max_minutes
            if step % 1000 == 0 or out_of_time:
                best = _checkpoint(encoder, proj, rows, target, val, vocab, out, step, epoch, best, log,
                                   cfg.record())
            if out_of_time:
                break
        if out_of_time:
            break
        best = _checkpoint(encoder, proj, rows, target, val, vocab, out, step, epoch, best, log, cfg.record())
    log.close()
    print(json.dumps({"out": str(out), **best}))
    return best


def _checkpoint(encoder, proj, rows, target, val, vocab, out: Path, step: int, epoch: int, best: dict,
                log, train_config: dict) -> dict:
    cos = _mean_cosine(encoder, proj, rows, target, val)
    record = {"step": step, "epoch": epoch, "val_cosine": round(cos, 5)}
    log.write(json.dumps(record) + "\n")
    log.flush()
    print(json.dumps(record))
    if cos > best["val_cosine"]:
        best = record
        save_checkpoint(out / "best.pt", encoder, vocab, [], train_config=train_config, step=step,
                        epoch=epoch, metrics=record)
    return best
