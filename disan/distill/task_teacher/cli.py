"""A task teacher (`disan task-teacher`): a sentence-transformer fine-tuned on a sentiment task,
whose class probabilities a DiSAN model then learns from (`disan train --soft-targets`).

Knowledge distillation of a fine-tuned transformer into a small network (Tang et al., 2019,
"Distilling Task-Specific Knowledge from BERT into Simple Neural Networks"): the teacher sees the
task's labelled sentences; the student learns from its soft labels on every training example
(for SST, every phrase), where the gold labels alone say less. Up to four steps; rerunning the
command goes on where it stopped (the fit is here; the labels, steps 2 to 4, in
`disan.distill.task_teacher.labels`):

1. `fit`: the teacher's transformer + mean pooling + a linear head, fine-tuned end to end on the
   recipe's sentence-level training file; the epoch with the best dev accuracy is kept
   (`teacher.pt`, with its dev and test accuracy in `teacher.json`). A finished fit is not rerun;
   an interrupted one goes on from its last saved state (`fit_state.pt`, every --save-every
   steps and at each epoch's end: a fit on every SST phrase runs for an hour on a CPU).
2. `label`: the kept teacher's logits of every training example of the recipe, written in chunks
   to `soft/` (`logits.f32.npy` + `progress.json`, as `disan teacher`'s cache); `soft.npz` (the
   examples' token keys and logits) once every chunk is there, and `soft_sentences.npz`, the same
   with the logits of every example that is not one of the fine-tuning sentences left out (NaN).
3. with `--augment N`: N new variants of each fine-tuning sentence
   (`disan.distill.task_teacher.augment`: masked and swapped words, n-grams), none of them a
   training example, and the teacher's logits of them, in chunks to `augmented/`; then
   `augmented.npz`, extra examples for `disan train --augmented`.
4. with `--unlabelled CORPUS`: the sentences of a `disan corpus` folder (text from the task's
   domain, every evaluation text already left out), none of them a training example, and the
   teacher's logits of them, in chunks to `unlabelled_<folder name>/`; then
   `unlabelled_<folder name>.npz`, read the same way (`disan train --augmented`).
"""

from __future__ import annotations

import argparse
import json
import math
import pickle
import time
from pathlib import Path

import numpy as np

from disan.data.recipes import RECIPES
from disan.distill.config import TaskTeacherConfig
from disan.distill.task_teacher.classifier import Classifier, accuracy, predict
from disan.distill.task_teacher.labels import class_count, label, label_augmented, label_unlabelled
from disan.distill.teacher import bf16_autocast, resolved_precision
from disan.train.soft_labels import labelled, training_keys

# the sentence-level training file of each recipe: what the teacher is fine-tuned on by default
SENTENCE_TRAIN = {"sst5": "sst/sst5_train.jsonl.gz", "sst2": "sst/sst2_train.jsonl.gz"}

FIT_STATE = "fit_state.pt"  # the interrupted fit's progress; removed once teacher.json is written
# the settings a saved fit state must share with this run to be continued
FIT_SETTINGS = ("recipe", "teacher", "train_file", "epochs", "lr", "batch_size", "seed", "precision")


def _fit_settings(cfg: TaskTeacherConfig) -> dict:
    return {k: getattr(cfg, k) for k in FIT_SETTINGS}


def _epoch_batches(rng: np.random.Generator, lengths: list[int], batch_size: int) -> list[list[int]]:
    """One epoch's batches: a permutation cut into batches of similar length (sorted within
    windows of 50 batches, for speed), in shuffled order."""
    perm = rng.permutation(len(lengths))
    window = batch_size * 50
    chunks = [sorted(perm[i:i + window], key=lambda j: lengths[j]) for i in range(0, len(perm), window)]
    batches = [c[i:i + batch_size] for c in chunks for i in range(0, len(c), batch_size)]
    rng.shuffle(batches)
    return batches


def eta_seconds(spent: float, taken: int, left: int) -> float:
    """Seconds until the last of `left` more steps, at the mean rate of the `taken` steps so far
    (the epochs' dev evaluations not counted)."""
    return round(spent / max(1, taken) * left, 1)


def _load_fit_state(cfg: TaskTeacherConfig, out: Path, torch) -> dict | None:
    """The saved progress of an interrupted fit with these settings; None without one; a one-line
    error when it was written with other settings (continuing it would mix two fits)."""
    path = out / FIT_STATE
    if not path.is_file():
        return None
    try:
        state = torch.load(path, map_location=cfg.device, weights_only=True)  # plain data, no code
        saved = state["settings"]
    except (RuntimeError, EOFError, pickle.UnpicklingError, KeyError, TypeError) as e:  # truncated, other
        raise ValueError(f"{path}: not a saved fit ({type(e).__name__}); remove it to start again") from e
    ours = _fit_settings(cfg)
    if saved.get("precision") == "auto":  # written before the precision was resolved: as then, not checked
        saved = {**saved, "precision": ours["precision"]}
    if saved != ours:
        diff = ", ".join(f"{k}: {saved.get(k)!r} there, {v!r} now" for k, v in ours.items()
                         if saved.get(k) != v)
        raise ValueError(f"{path}: an interrupted fit with other settings ({diff}); give its settings "
                         "to continue it, or remove the file to start again")
    return state


def fit(cfg: TaskTeacherConfig, out: Path) -> dict:
    """Fine-tune the teacher; keep the best-dev epoch in `teacher.pt`; its numbers in `teacher.json`.
    Every --save-every steps and at each epoch's end the whole fit (weights, optimiser, schedule,
    random states, where it is) goes to `fit_state.pt`, so a rerun goes on from there and ends
    with the same weights as an uninterrupted fit."""
    import torch  # optional (`train` extra)

    from disan.train.checkpoint import write_checkpoint  # torch, as above

    recipe = RECIPES[cfg.recipe]
    data = cfg.data
    num_classes = class_count(cfg.recipe)
    train_x, train_y = labelled(data / cfg.train_file, num_classes)
    dev_x, dev_y = labelled(data / recipe["dev"], num_classes)
    test_x, test_y = labelled(data / recipe["test"], num_classes)
    torch.manual_seed(cfg.seed)
    model = Classifier(cfg.teacher, num_classes, cfg.device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    steps_per_epoch = math.ceil(len(train_x) / cfg.batch_size)
    total = steps_per_epoch * cfg.epochs
    warmup = max(1, int(0.1 * total))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warmup, max(0.0, (total - s) / max(1, total - warmup))))
    rng = np.random.default_rng(cfg.seed)
    lengths = [len(x) for x in train_x]
    best, log, first_epoch, done, loss_sum, spent = -1.0, [], 0, 0, 0.0, 0.0
    state = _load_fit_state(cfg, out, torch)
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["torch_rng"])
        rng.bit_generator.state = state["epoch_rng"]
        best, log, first_epoch, done = state["best"], state["log"], state["epoch"], state["step"]
        loss_sum, spent = state["loss_sum"], state["elapsed_s"]
        print(json.dumps({"resumed": str(out / FIT_STATE), "epoch": first_epoch + 1, "step": done}),
              flush=True)
    started = time.monotonic() - spent
    this_run, taken = time.monotonic(), 0  # this process's own rate gives the progress lines' ETA

    def save_state(epoch: int, step: int, epoch_rng: dict) -> None:
        state = {"settings": _fit_settings(cfg), "model": model.state_dict(),
                 "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                 "torch_rng": torch.get_rng_state(), "epoch_rng": epoch_rng, "epoch": epoch, "step": step,
                 "best": best, "log": log, "loss_sum": loss_sum,
                 "elapsed_s": round(time.monotonic() - started, 1)}
        write_checkpoint(out / FIT_STATE, state)

    for epoch in range(first_epoch, cfg.epochs):
        model.train(True)
        epoch_rng = rng.bit_generator.state  # the batches are drawn again from here on resume
        batches = _epoch_batches(rng, lengths, cfg.batch_size)
        for step, idx in enumerate(batches, 1):
            if step <= done:  # this epoch's steps before the saved state
                continue
            with bf16_autocast(cfg.device, cfg.precision):
                logits = model.logits([train_x[j] for j in idx])
            loss = torch.nn.functional.cross_entropy(logits.float(), torch.tensor([train_y[j] for j in idx],
                                                                                  device=cfg.device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            loss_sum += loss.item()
            taken += 1
            if step % cfg.log_every == 0:  # a fit on every phrase runs for hours on a CPU
                left = len(batches) - step + (cfg.epochs - epoch - 1) * len(batches)
                now = time.monotonic()
                print(json.dumps({"epoch": epoch + 1, "step": step, "of": len(batches),
                                  "train_loss": loss_sum / step, "elapsed_s": round(now - started, 1),
                                  "eta_s": eta_seconds(now - this_run, taken, left)}), flush=True)
            if step % cfg.save_every == 0 and step < len(batches):
                save_state(epoch, step, epoch_rng)
        dev_acc = accuracy(predict(model, dev_x, 64, cfg.precision), dev_y)
        row = {"epoch": epoch + 1, "train_loss": loss_sum / len(batches), "dev_acc": dev_acc,
               "elapsed_s": round(time.monotonic() - started, 1)}
        log.append(row)
        print(json.dumps(row), flush=True)
        if dev_acc > best:
            best = dev_acc
            write_checkpoint(out / "teacher.pt", model.state_dict())
        done, loss_sum = 0, 0.0
        save_state(epoch + 1, 0, rng.bit_generator.state)
    model.load_state_dict(torch.load(out / "teacher.pt", map_location=cfg.device))
    test_acc = accuracy(predict(model, test_x, 64, cfg.precision), test_y)
    info = {"teacher": cfg.teacher, "recipe": cfg.recipe, "train_file": cfg.train_file,
            "train_examples": len(train_x), "epochs": cfg.epochs, "lr": cfg.lr,
            "batch_size": cfg.batch_size, "seed": cfg.seed, "precision": cfg.precision,
            "best_dev_acc": best, "test_acc_at_best_dev": test_acc, "log": log}
    (out / "teacher.json").write_text(json.dumps(info, indent=1) + "\n")
    (out / FIT_STATE).unlink(missing_ok=True)  # the size of the model three times over
    return info


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = TaskTeacherConfig  # the defaults
    parser.add_argument("--recipe", choices=["sst5", "sst2"], default=d.recipe)
    parser.add_argument("--data", default=str(d.data), help="the staged data folder")
    parser.add_argument("--train-file", help="what the teacher is fine-tuned on, under --data "
                        f"(default: the recipe's sentence-level training file: {SENTENCE_TRAIN})")
    parser.add_argument("--teacher", choices=["mpnet", "minilm"], default=d.teacher)
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=d.epochs)
    parser.add_argument("--lr", type=float, default=d.lr)
    parser.add_argument("--batch-size", type=int, default=d.batch_size)
    parser.add_argument("--chunk", type=int, default=d.chunk,
                        help="examples labelled between progress records")
    parser.add_argument("--log-every", type=int, default=d.log_every,
                        help="fine-tuning steps between progress lines")
    parser.add_argument("--save-every", type=int, default=d.save_every,
                        help="fine-tuning steps between saves of the whole fit (fit_state.pt), so a "
                        "rerun goes on from the last one")
    parser.add_argument("--precision", choices=["auto", "bf16", "fp32"], default=d.precision,
                        help="auto: bf16 where the device runs it natively and faster (a CPU is timed "
                             "once), else fp32; the fit records which")
    parser.add_argument("--device", default=d.device)
    parser.add_argument("--threads", type=int, default=d.threads, help="torch threads (0: torch's default)")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--checkpoints", nargs="+", metavar="CKPT",
                        help="no fine-tuning: the teacher is the mean of these sentiment checkpoints' "
                        "probabilities (`disan.distill.task_teacher.checkpoints`); writes soft.npz only")
    parser.add_argument("--augment", type=int, default=d.augment, metavar="N",
                        help="also label N new variants of each fine-tuning sentence (masked words, "
                        "swapped words, n-grams: Tang et al., 2019) -> augmented.npz, for `disan "
                        "train --augmented`")
    parser.add_argument("--unlabelled", metavar="CORPUS",
                        help="also label the sentences of this `disan corpus` folder that are not "
                        "training examples (e.g. `--sources movie-reviews`) -> unlabelled_<folder>.npz, "
                        "for `disan train --augmented`")


def run(args: argparse.Namespace) -> int:
    import torch  # optional (`train` extra)

    for name in ("epochs", "batch_size", "chunk", "log_every", "save_every"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} {getattr(args, name)}: give at least 1")
    if args.augment < 0:
        raise ValueError(f"--augment {args.augment}: give 0 or more variants per sentence")
    if args.lr <= 0:
        raise ValueError(f"--lr {args.lr}: give a learning rate above 0")
    if args.unlabelled and not (Path(args.unlabelled) / "corpus.json").is_file():
        raise ValueError(f"--unlabelled {args.unlabelled}: not a `disan corpus` folder (no corpus.json)")
    cfg = TaskTeacherConfig(
        out=Path(args.out), recipe=args.recipe, data=Path(args.data),
        train_file=args.train_file or SENTENCE_TRAIN[args.recipe], teacher=args.teacher, epochs=args.epochs,
        lr=args.lr, batch_size=args.batch_size, seed=args.seed,
        # what auto means differs between machines; a fit saved on one and resumed on another must
        # not change precision halfway, so the settings hold the resolved one
        precision=resolved_precision(args.device, args.precision), device=args.device,
        threads=args.threads, chunk=args.chunk, log_every=args.log_every, save_every=args.save_every,
        checkpoints=tuple(args.checkpoints or ()), augment=args.augment, unlabelled=args.unlabelled)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    out = cfg.out
    if cfg.checkpoints:
        from disan.distill.task_teacher.checkpoints import label_with_checkpoints  # torch (`train` extra)

        return label_with_checkpoints(cfg, out)
    out.mkdir(parents=True, exist_ok=True)
    if (out / "teacher.json").is_file():
        info = json.loads((out / "teacher.json").read_text())
        print(f"teacher already fitted: dev {info['best_dev_acc']:.4f}, "
              f"test {info['test_acc_at_best_dev']:.4f}")
    else:
        info = fit(cfg, out)
    print(json.dumps({k: v for k, v in info.items() if k != "log"}), flush=True)
    keys, sentences = training_keys(cfg.recipe, cfg.data, cfg.train_file)
    print(f"soft targets: {label(cfg, out, keys, sentences)}")
    if cfg.augment:
        print(f"teacher-labelled variants: {label_augmented(cfg, out, keys, sentences)}")
    if cfg.unlabelled:
        print(f"teacher-labelled corpus sentences: {label_unlabelled(cfg, out, keys)}")
    return 0
