"""Training loop: Adadelta, length-bucketed batches, dev evaluation, early stopping, checkpoints, curves.

Outputs in `out/`: best.pt (best dev accuracy; its `metrics` get the final test result), last.pt
(+ optimizer and RNG state for --resume), vocab.json, metrics.jsonl (one JSON per evaluation),
curves.png. With --ema, dev and test see the weights' moving average, and best.pt holds it.
Resuming replays the same batch order (it is a function of seed and epoch), so an interrupted run
continues where it stopped.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from disan.data.readers import EncodedDataset
from disan.data.recipes import decayed_lr
from disan.model import DiSANConfig, build_model
from disan.runtime.batching import length_batches, sorted_batches
from disan.text.tokenizer import Vocab
from disan.train.checkpoint import load_checkpoint, model_from_checkpoint, save_checkpoint, write_checkpoint
from disan.train.config import TrainConfig


def collate(data: EncodedDataset, idx: Sequence[int]) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """Batch `idx` -> (model inputs: ids, mask [, ids2, mask2]; labels [B])."""
    inputs: list[torch.Tensor] = []
    for k in range(len(data.ids[idx[0]])):
        enc = Vocab.pad([data.ids[i][k] for i in idx])
        inputs += [torch.from_numpy(enc.ids), torch.from_numpy(enc.mask)]
    return tuple(inputs), torch.from_numpy(data.labels[np.asarray(idx)])


def evaluate(model: torch.nn.Module, data: EncodedDataset, device: torch.device, num_classes: int,
             max_cells: int) -> dict:
    """Accuracy, mean loss, macro-F1 and confusion matrix (rows = gold, columns = predicted)."""
    logits = torch.from_numpy(predict_logits(model, data, device, max_cells))
    loss_sum = F.cross_entropy(logits, torch.from_numpy(data.labels), reduction="sum").item()
    confusion = np.zeros((num_classes, num_classes), dtype=np.int64)
    np.add.at(confusion, (data.labels, logits.argmax(dim=-1).numpy()), 1)
    total = int(confusion.sum())
    tp = np.diag(confusion).astype(float)
    f1 = 2 * tp / np.maximum(confusion.sum(0) + confusion.sum(1), 1)
    return {"acc": float(tp.sum() / total), "loss": loss_sum / total,
            "macro_f1": float(f1.mean()), "confusion": confusion.tolist(), "n": int(total)}


def predict_logits(model: torch.nn.Module, data: EncodedDataset, device: torch.device,
                   max_cells: int) -> np.ndarray:
    """The model's logits [N, C] of every example, in `data`'s order."""
    model.eval()
    out: np.ndarray | None = None
    with torch.no_grad():
        for idx in sorted_batches(data.lengths, 128):
            for piece in _pieces(idx, data, max_cells):
                inputs, _ = collate(data, piece)
                logits = model(*(t.to(device) for t in inputs)).float().cpu().numpy()
                if out is None:
                    out = np.empty((len(data), logits.shape[1]), dtype=np.float32)
                out[piece] = logits
    return out if out is not None else np.empty((0, 0), dtype=np.float32)


def _pieces(idx: np.ndarray, data: EncodedDataset, max_cells: int) -> list[np.ndarray]:
    """Split a batch so each forward holds at most `max_cells` = rows * len^2 (attention is n^2 * d)."""
    n = int(data.lengths[idx].max()) if len(idx) else 1
    rows = max(1, max_cells // (n * n))
    return [idx[i:i + rows] for i in range(0, len(idx), rows)]


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """Adadelta (paper) or Adam; L2 decay only on `model.decay_parameters()` (weight matrices)."""
    decay_ids = {id(p) for p in model.decay_parameters()}
    decay = [p for p in model.parameters() if id(p) in decay_ids]
    rest = [p for p in model.parameters() if id(p) not in decay_ids]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    if cfg.optimizer == "adam":  # converges in fewer steps: for CPU time budgets
        return torch.optim.Adam(groups, lr=cfg.lr)
    return torch.optim.Adadelta(groups, lr=cfg.lr)


def ema_with_warmup(decay: float):
    """AveragedModel's update for a moving average whose decay grows to `decay` as TensorFlow's
    ExponentialMovingAverage does when given the step count: min(decay, (1 + t) / (10 + t)).
    A constant 0.999 from step one keeps 8% of the random start after one SST-5 epoch (2,489
    steps); the paper's code could, at its 120,000 steps."""
    def update(averaged: list[torch.Tensor], current: list[torch.Tensor], num_averaged) -> None:
        t = int(num_averaged)
        weight = 1.0 - min(decay, (1 + t) / (10 + t))
        for avg, cur in zip(averaged, current, strict=True):
            avg.lerp_(cur, weight)
    return update


def resolve_device(choice: str) -> torch.device:
    """auto: the first GPU where PyTorch has one, else the CPU; otherwise as given (cpu, cuda:1)."""
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(choice)


def distillation_loss(logits: torch.Tensor, teacher: torch.Tensor, temperature: float,
                      reduction: str = "sum") -> torch.Tensor:
    """T^2 * KL(teacher || student) of the softened distributions, summed over the rows, or one
    per row with reduction="none" (Hinton et al., 2015: the T^2 keeps its gradients' scale as T
    changes)."""
    t = temperature
    kl = F.kl_div(F.log_softmax(logits / t, -1), F.log_softmax(teacher / t, -1), log_target=True,
                  reduction="none").sum(-1) * t * t
    return kl.sum() if reduction == "sum" else kl


def train_step(model, optimizer, data: EncodedDataset, idx: np.ndarray, device, max_cells: int,
               kd_weight: float = 0.0, kd_temperature: float = 1.0):
    """One optimizer step over batch `idx` (accumulated over pieces) -> (loss, correct).

    With a teacher's logits in `data.soft` (`disan train --soft-targets`), the loss of a row is
    (1 - w) times the cross-entropy on its gold label plus w = `kd_weight` times
    `distillation_loss`. A row whose logits are NaN (the teacher gave none: `disan task-teacher`'s
    soft_sentences.npz) has the cross-entropy alone; a row without a gold label (label id -1:
    `--augmented`) has the distillation loss alone, and `correct` does not count it."""
    model.train()
    optimizer.zero_grad(set_to_none=True)
    loss_total, correct = 0.0, 0
    for piece in _pieces(idx, data, max_cells):
        inputs, y = collate(data, piece)
        y = y.to(device)
        logits = model(*(t.to(device) for t in inputs))
        if data.soft is None:
            loss = F.cross_entropy(logits, y, reduction="sum")
        else:
            teacher = torch.from_numpy(np.asarray(data.soft[piece], dtype=np.float32)).to(device)
            taught, gold = ~teacher.isnan().any(-1), y >= 0
            ce = F.cross_entropy(logits, y.clamp(min=0), reduction="none")
            kd_rows = distillation_loss(logits[taught], teacher[taught], kd_temperature, reduction="none")
            share = torch.where(gold[taught], kd_weight, 1.0)  # no gold label: the teacher alone
            loss = (ce[gold & ~taught].sum() + (1 - kd_weight) * ce[gold & taught].sum()
                    + (share * kd_rows).sum())
        loss = loss / len(idx)  # mean over the whole batch
        loss.backward()
        loss_total += loss.item()
        correct += int((logits.argmax(-1) == y).sum())  # -1 never matches
    optimizer.step()
    return loss_total, correct


class Trainer:
    """Runs one training job; `fit()` returns the final metrics of the best checkpoint."""

    def __init__(self, cfg: TrainConfig, model, vocab, labels: list[str], train: EncodedDataset,
                 dev: EncodedDataset, test: EncodedDataset | None, sizes: dict, resume: dict | None = None):
        self.cfg, self.model, self.vocab, self.labels = cfg, model, vocab, labels
        self.train, self.dev, self.test, self.sizes = train, dev, test, sizes
        self.out = Path(cfg.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.device = resolve_device(cfg.device)
        self.model.to(self.device)
        self.optimizer = make_optimizer(model, cfg)
        # The average is a copy of the model updated after each step; the optimizer trains the raw
        # weights, which last.pt keeps (with the average's state) so a resumed run goes on exactly.
        self.averaged = None if not cfg.ema else torch.optim.swa_utils.AveragedModel(
            model, multi_avg_fn=ema_with_warmup(cfg.ema))
        self.state = {"step": 0, "epoch": 0, "pos": 0, "best_dev": -1.0, "best_step": 0, "bad_evals": 0,
                      "elapsed_s": 0.0}
        self.history: list[dict] = []
        self._run = {"loss": 0.0, "correct": 0, "seen": 0}
        if resume is not None:
            self._restore(resume)
        else:
            torch.manual_seed(cfg.seed)
            (self.out / "metrics.jsonl").write_text("")
        vocab.save(self.out / "vocab.json")

    @property
    def eval_model(self) -> torch.nn.Module:
        """The weights that dev and test see, and best.pt holds."""
        return self.model if self.averaged is None else self.averaged.module

    def _restore(self, ckpt: dict) -> None:
        self.optimizer.load_state_dict(ckpt["optimizer_state"])
        if self.averaged is not None:  # the run's own last.pt: its config says --ema, so it has one
            self.averaged.load_state_dict(ckpt["ema_state"])
        self.state.update(ckpt["trainer_state"])
        torch.set_rng_state(ckpt["rng_state"])
        path = self.out / "metrics.jsonl"  # drop records written after the checkpoint
        rows = [json.loads(r) for r in path.read_text().splitlines() if r.strip()] if path.exists() else []
        self.history = [r for r in rows if r.get("step", 0) <= self.state["step"] and "event" not in r]
        path.write_text("".join(json.dumps(r) + "\n" for r in self.history))

    def _save(self, name: str, metrics: dict, full: bool) -> None:
        extra = {"train_config": self.cfg.to_dict(), "step": self.state["step"],
                 "epoch": self.state["epoch"], "metrics": metrics, "sizes": self.sizes}
        if full:
            extra.update(optimizer_state=self.optimizer.state_dict(), trainer_state=dict(self.state),
                         rng_state=torch.get_rng_state())
            if self.averaged is not None:
                extra["ema_state"] = self.averaged.state_dict()
        model = self.model if full else self.eval_model
        save_checkpoint(self.out / name, model, self.vocab, self.labels, **extra)

    def _evaluate_and_save(self, started: float) -> bool:
        """Dev eval, metrics record, best/last checkpoints. Returns True when patience ran out."""
        st = self.state
        dev = evaluate(self.eval_model, self.dev, self.device, len(self.labels), self.cfg.max_cells)
        run = self._run
        st["elapsed_s"] = self._elapsed_base + time.monotonic() - started
        record = {"step": st["step"],
                  "epoch": round(st["epoch"] + st["pos"] / max(self._steps_per_epoch, 1), 3),
                  "elapsed_s": round(st["elapsed_s"], 1),
                  "train_loss": run["loss"] / max(run["batches"], 1),
                  "train_acc": run["correct"] / max(run["seen"], 1), "dev_loss": dev["loss"],
                  "dev_acc": dev["acc"], "dev_macro_f1": dev["macro_f1"]}
        self._run = {"loss": 0.0, "correct": 0, "seen": 0, "batches": 0}
        improved = dev["acc"] > st["best_dev"]
        if improved:
            st.update(best_dev=dev["acc"], best_step=st["step"], bad_evals=0)
            self._save("best.pt", {"dev_acc": dev["acc"], "dev_loss": dev["loss"],
                                   "dev_macro_f1": dev["macro_f1"], "dev_confusion": dev["confusion"]}, False)
        else:
            st["bad_evals"] += 1
        record["best_dev_acc"] = st["best_dev"]
        self.history.append(record)
        with (self.out / "metrics.jsonl").open("a") as fh:
            fh.write(json.dumps(record) + "\n")
        self._save("last.pt", {"dev_acc": dev["acc"], "dev_loss": dev["loss"]}, True)
        plot_curves(self.history, self.out / "curves.png")
        return st["bad_evals"] >= self.cfg.patience

    def fit(self) -> dict:
        """Train until epochs, patience or the time budget run out; then test the best checkpoint."""
        cfg, st = self.cfg, self.state
        started = time.monotonic()
        self._elapsed_base = st["elapsed_s"]
        budget_s = cfg.max_minutes * 60 if cfg.max_minutes > 0 else math.inf
        lengths = self.train.lengths
        self._steps_per_epoch = math.ceil(len(self.train) / cfg.batch_size)
        total_steps = self._steps_per_epoch * cfg.epochs
        self._run = {"loss": 0.0, "correct": 0, "seen": 0, "batches": 0}
        bar = _progress(cfg, self._steps_per_epoch * cfg.epochs, st["step"])
        stop, reason, ema = False, "epochs", None
        while st["epoch"] < cfg.epochs and not stop:
            batches = length_batches(lengths, cfg.batch_size, np.random.default_rng([cfg.seed, st["epoch"]]))
            for idx in batches[st["pos"]:]:
                if cfg.lr_decay != "none":  # from the step count, so a resumed run goes on the same curve
                    for group in self.optimizer.param_groups:
                        group["lr"] = decayed_lr(cfg.lr, cfg.lr_decay, st["step"], total_steps)
                loss, correct = train_step(self.model, self.optimizer, self.train, idx, self.device,
                                           cfg.max_cells, cfg.kd_weight, cfg.kd_temperature)
                if self.averaged is not None:
                    self.averaged.update_parameters(self.model)
                st["step"] += 1
                st["pos"] += 1
                self._run["loss"] += loss
                self._run["batches"] += 1
                self._run["correct"] += correct
                gold = int((self.train.labels[idx] >= 0).sum())  # rows with a gold label
                self._run["seen"] += gold
                acc = correct / max(gold, 1)
                ema = (loss, acc) if ema is None else (0.98 * ema[0] + 0.02 * loss,
                                                       0.98 * ema[1] + 0.02 * acc)
                bar.update(1)
                bar.set_postfix(loss=f"{ema[0]:.3f}", acc=f"{ema[1]:.3f}",
                                best=f"{max(st['best_dev'], 0):.3f}")
                out_of_time = time.monotonic() - started >= budget_s
                if (cfg.eval_every and st["step"] % cfg.eval_every == 0) or out_of_time:
                    stop = self._evaluate_and_save(started)
                    reason = "patience" if stop else reason
                    if out_of_time:
                        stop, reason = True, "time budget"
                    if stop:
                        break
            if not stop:
                st["epoch"] += 1
                st["pos"] = 0
                if not (self.history and self.history[-1]["step"] == st["step"]):
                    stop = self._evaluate_and_save(started)
                    reason = "patience" if stop else reason
                else:  # already evaluated at this step: refresh last.pt with the epoch boundary
                    self._save("last.pt", {"dev_acc": self.history[-1]["dev_acc"]}, True)
        bar.close()
        return self._finish(reason)

    def _finish(self, reason: str) -> dict:
        best_path = self.out / "best.pt"
        best = load_checkpoint(best_path)
        self.model.load_state_dict(best["model_state"])
        metrics = dict(best["metrics"])
        if self.test is not None:
            test = evaluate(self.model, self.test, self.device, len(self.labels), self.cfg.max_cells)
            metrics.update(test_acc=test["acc"], test_macro_f1=test["macro_f1"],
                           test_confusion=test["confusion"], test_loss=test["loss"])
        metrics.update(labels=self.labels, stop_reason=reason, sizes=self.sizes)
        best["metrics"] = metrics
        write_checkpoint(best_path, best)
        final = {"event": "final", "best_step": self.state["best_step"], **metrics}
        with (self.out / "metrics.jsonl").open("a") as fh:
            fh.write(json.dumps(final) + "\n")
        return final


def _progress(cfg: TrainConfig, total: int, initial: int):
    return tqdm(total=total, initial=initial, disable=not cfg.progress, dynamic_ncols=True,
                unit="step", mininterval=1.0)


def plot_curves(history: list[dict], path: Path) -> None:
    """Loss and accuracy (train running mean, dev) against steps -> PNG.

    Skipped where matplotlib is missing (a lent GPU's Python has none, and nothing can be installed
    there): the figure only redraws metrics.jsonl, which every run writes."""
    try:
        import matplotlib  # here, not at the top: optional where the runs are trained (see above)
    except ImportError:
        return
    matplotlib.use("Agg")  # curves are written to PNG files, never shown
    import matplotlib.pyplot as plt
    steps = [r["step"] for r in history]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(steps, [r["train_loss"] for r in history], label="train")
    ax1.plot(steps, [r["dev_loss"] for r in history], label="dev")
    ax2.plot(steps, [r["train_acc"] for r in history], label="train")
    ax2.plot(steps, [r["dev_acc"] for r in history], label="dev")
    for ax, name in ((ax1, "loss"), (ax2, "accuracy")):
        ax.set_xlabel("step")
        ax.set_ylabel(name)
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def new_model(cfg: TrainConfig, vocab_size: int, embed_dim: int, num_classes: int, matrix: np.ndarray,
              trainable: np.ndarray) -> torch.nn.Module:
    """Build the task model and load the initial embedding matrix and trainable-row mask."""
    mcfg = DiSANConfig(vocab_size=vocab_size, embed_dim=embed_dim, d_h=cfg.d_h, c=cfg.c,
                       activation=cfg.activation, keep_prob=cfg.keep_prob, attention_kind=cfg.attention_kind,
                       mask_kind=cfg.mask_kind, coda_gate=cfg.coda_gate, s2t_kind=cfg.s2t_kind,
                       encoder_kind=cfg.encoder_kind, task=cfg.task, num_classes=num_classes,
                       head_dim=cfg.d_h)
    torch.manual_seed(cfg.seed)
    model = build_model(mcfg)
    with torch.no_grad():
        model.encoder.embed.weight.copy_(torch.from_numpy(matrix))
        model.encoder.trainable_rows.copy_(torch.from_numpy(trainable))
    return model


def resume_model(path: str):
    """(checkpoint dict, model, vocab, labels) from a last.pt written by this trainer."""
    ckpt = load_checkpoint(path)
    if "optimizer_state" not in ckpt:
        raise ValueError(f"{path}: no optimizer state (resume from last.pt, not best.pt)")
    model, vocab, labels = model_from_checkpoint(ckpt)
    return ckpt, model, vocab, labels
