"""`disan eval`: score an exported bundle (the ONNX graphs the service runs, not a checkpoint).

    disan eval --bundle models/default --task sst5 --data ../shared/data      # SST-5 test
    disan eval --bundle models/default --task snli --data snli_1.0_test.jsonl
    disan eval --bundle models/default --transfer --data ../shared/data       # SentEval-style

Task eval prints accuracy, macro-F1 and the confusion matrix and writes a JSON report. SST-2 is
scored with the 5-class sentiment graph: P(negative) = p0 + p1 against P(positive) = p3 + p4.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

# Default test file per task inside the staged data layout (../shared/data/README.md).
STAGED_FILES = {
    "snli": "snli/test_tok.jsonl.gz",
    "mnli": "mnli/dev_matched.jsonl.gz",
    "sick-e": "senteval/SICK/sick_dev.jsonl.gz",
    "sst5": "sst/sst5_test.jsonl.gz",
    "sst2": "sst/sst2_test.jsonl.gz",
}
NLI_TASKS = {"snli", "mnli", "sick-e"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `disan eval`."""
    parser.add_argument("--bundle", type=Path, default=Path("models/default"))
    parser.add_argument("--task", choices=sorted(STAGED_FILES))
    parser.add_argument("--transfer", action="store_true", help="SentEval-style transfer of /embed vectors")
    parser.add_argument("--data", type=Path, default=Path("../shared/data"),
                        help="a data file, or the staged data directory (the task's test file is used)")
    parser.add_argument("--report", type=Path, default=None, help="JSON report path")
    parser.add_argument("--out-dir", type=Path, default=Path("runs/transfer"),
                        help="--transfer: where the markdown table, JSON and bar chart go")
    parser.add_argument("--baselines", default="glove,minilm", help="--transfer: comma list or ''")
    parser.add_argument("--variant", default="fp32", choices=["fp32", "fp16", "int8"])
    parser.add_argument("--batch-size", type=int, default=64)


def load_runtime(bundle: Path, variant: str = "fp32", threads: int = 0):
    """The service's runtime on CPU: eval scores exactly what `disan serve` runs."""
    from service.runtime import Runtime
    from service.settings import Settings

    # One call at a time (offline loops are sequential), with `threads` ORT threads (0: ORT's choice).
    return Runtime(bundle, Settings(providers="cpu", variant=variant, intra_op_threads=threads,
                                    batch_concurrency=1))


def _batches(rows: list, batch_size: int):
    """Length-sorted batches of indices, so padding (and n^2 attention cost) stays small."""
    order = np.argsort([len(r[0]) if isinstance(r, tuple) else len(r) for r in rows], kind="stable")
    for start in range(0, len(order), batch_size):
        yield order[start:start + batch_size]


def predict(runtime, task: str, examples, batch_size: int = 64) -> np.ndarray:
    """Class probabilities for every example, in input order."""
    max_len = runtime.max_tokens
    if task in NLI_TASKS:
        rows = [(runtime.vocab.ids(ex.texts[0])[:max_len], runtime.vocab.ids(ex.texts[1])[:max_len])
                for ex in examples]
        run = runtime.nli
    else:
        rows = [runtime.vocab.ids(ex.texts[0])[:max_len] for ex in examples]
        run = runtime.sentiment
    probs: list[np.ndarray | None] = [None] * len(rows)
    for idx in _batches(rows, batch_size):
        for i, p in zip(idx, run([rows[i] for i in idx]), strict=True):
            probs[i] = p
    return np.stack(probs)


def score(task: str, labels: list[str], examples, probs: np.ndarray) -> dict:
    """Accuracy, macro-F1 and confusion matrix (rows = gold, columns = predicted)."""
    from sklearn.metrics import accuracy_score, confusion_matrix, f1_score

    if task in NLI_TASKS:
        names = labels
        gold = [labels.index(ex.label) for ex in examples]
        pred = probs.argmax(axis=1)
    elif task == "sst2":
        names = ["negative", "positive"]
        gold = [int(ex.label) for ex in examples]
        pred = (probs[:, 3:].sum(axis=1) > probs[:, :2].sum(axis=1)).astype(int)
    else:
        names = labels
        gold = [int(ex.label) for ex in examples]
        pred = probs.argmax(axis=1)
    return {
        "task": task, "n": len(gold), "labels": names,
        "accuracy": round(100 * accuracy_score(gold, pred), 2),
        "macro_f1": round(100 * f1_score(gold, pred, average="macro"), 2),
        "confusion": confusion_matrix(gold, pred, labels=list(range(len(names)))).tolist(),
    }


def format_report(report: dict) -> str:
    """Human-readable accuracy / macro-F1 / confusion matrix."""
    names = report["labels"]
    width = max(len(n) for n in names) + 2
    lines = [f"{report['task']} ({report['n']} examples, {report['data']}): "
             f"accuracy {report['accuracy']:.2f}, macro-F1 {report['macro_f1']:.2f}",
             "confusion (rows gold, columns predicted):",
             " " * width + "".join(f"{n[:12]:>14}" for n in names)]
    lines += [f"{name:<{width}}" + "".join(f"{c:>14}" for c in row)
              for name, row in zip(names, report["confusion"], strict=True)]
    return "\n".join(lines)


def evaluate_task(bundle: Path, task: str, data: Path, variant: str = "fp32", batch_size: int = 64) -> dict:
    """Run the bundle on a task's data file and score it."""
    from disan.data import read_examples

    path = data / STAGED_FILES[task] if data.is_dir() else data
    kind, examples = read_examples(path)
    if (kind == "nli") != (task in NLI_TASKS):
        raise ValueError(f"{path}: holds {kind} data, not {task}")
    runtime = load_runtime(bundle, variant)
    graph_labels = runtime.labels["nli" if task in NLI_TASKS else "sentiment"]
    probs = predict(runtime, task, examples, batch_size)
    report = score(task, graph_labels, examples, probs)
    report.update(data=str(path), bundle=str(bundle), variant=variant)
    return report


def run(args: argparse.Namespace) -> int:
    """Entry point of `disan eval`."""
    if args.transfer:
        from disan.transfer import run_transfer

        run_transfer(args)
        return 0
    if not args.task:
        raise ValueError("give --task (snli|mnli|sick-e|sst5|sst2) or --transfer")
    report = evaluate_task(args.bundle, args.task, args.data, args.variant, args.batch_size)
    print(format_report(report))
    out = args.report or Path("runs") / f"eval_{args.task}_{args.variant}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"report: {out}")
    return 0
