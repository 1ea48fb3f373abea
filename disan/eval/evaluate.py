"""`disan eval`: score an exported bundle (the ONNX graphs the service runs, not a checkpoint).

    disan eval --bundle models/default --task sst5 --data ../shared/data      # SST-5 test
    disan eval --bundle models/default --task snli --data snli_1.0_test.jsonl
    disan eval --bundle models/default --transfer --data ../shared/data       # SentEval-style
    disan eval --bundle models/default --retrieval DIR [DIR ...] --baselines minilm   # BEIR layout
    disan eval --bundle models/default --retrieval DIR --hybrid 0.3 0.5   # + sparse (/embed_sparse)

Task eval prints accuracy, macro-F1 and the confusion matrix and writes a JSON report. It runs the
texts through `disan.Encoder`, the service's inference path (a text over the window is windowed,
as /nli and /sentiment window it, never cut). SST-2 is scored with the 5-class sentiment graph:
P(negative) = p0 + p1 against P(positive) = p3 + p4.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from disan.bundle.manifest import VARIANTS
from disan.data.readers import read_examples
from disan.data.recipes import EVAL_FILES, NLI_EVAL_TASKS
from disan.optional import require
from disan.runtime.encoder import Encoder
from disan.runtime.runtime import load_offline


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `disan eval`."""
    parser.add_argument("--bundle", type=Path, default=Path("models/default"))
    parser.add_argument("--task", choices=sorted(EVAL_FILES))
    parser.add_argument("--transfer", action="store_true", help="SentEval-style transfer of /embed vectors")
    parser.add_argument("--sts", action="store_true",
                        help="unsupervised STS (cosine Spearman) of /embed vectors: STS-B dev, SICK dev, "
                             "and the STS sets from outside STS-B (sts-other/) where staged")
    parser.add_argument("--sts-baselines", default="minilm,mpnet",
                        help="--sts: comma list (minilm, mpnet, wordllama) or ''")
    parser.add_argument("--checkpoint", type=Path, nargs="*", default=[],
                        help="--sts, --transfer: checkpoints instead of --bundle: a student (best.pt), "
                             "or an NLI or sentiment model, whose encoder is read; --retrieval: students "
                             "that read --bundle's tokenizer, run through its windows")
    parser.add_argument("--data", type=Path, default=Path("../shared/data"),
                        help="a data file, or the staged data directory (the task's test file is used)")
    parser.add_argument("--report", type=Path, default=None, help="JSON report path")
    parser.add_argument("--out-dir", type=Path, default=Path("runs/transfer"),
                        help="--transfer: where the markdown table, JSON and bar chart go")
    parser.add_argument("--retrieval", type=Path, nargs="+", metavar="DIR",
                        help="retrieval (nDCG@10, MRR@10, R@100; disan.eval.retrieval) on folders in BEIR's "
                             "layout: corpus.jsonl, queries.jsonl, qrels/test.tsv, gzipped or not")
    parser.add_argument("--split", default="test",
                        help="--retrieval: whose judgements are read, qrels/SPLIT.tsv (BEIR's MS MARCO: dev)")
    parser.add_argument("--baselines", default=None,
                        help="comma list or '': --transfer (default glove,minilm), --retrieval "
                             "(minilm,mpnet,wordllama; default none)")
    parser.add_argument("--protocol", default="fixed",
                        help="--transfer: fixed (C = 1, alpha = 1) or tuned (C and alpha chosen by "
                             "cross-validation on the training data only)")
    parser.add_argument("--dimensions", type=int, nargs="+", metavar="M",
                        help="--retrieval, --sts: also score each vector cut to M components as the "
                             "bundle serves `dimensions=M` (GET /info matryoshka_dims, or any up to "
                             "dimensions_up_to), normalised; a checkpoint's or baseline's first M")
    parser.add_argument("--hybrid", type=float, nargs="+", metavar="W",
                        help="--retrieval: also score the bundle's (1 - W) x dense cosine + W x sparse dot "
                             "(its lexical table: POST /embed_sparse), each W from 0 to 1")
    parser.add_argument("--variant", default="fp32", choices=VARIANTS)
    parser.add_argument("--batch-size", type=int, default=64)


def predict(encoder: Encoder, task: str, examples, batch_size: int = 64) -> np.ndarray:
    """Class probabilities float32 [examples, K] in input order (the graph's label order): each
    example's texts as a client sends them (its tokens joined by spaces) through `disan.Encoder`,
    as the service runs them: a text over max_tokens windowed and its windows pooled."""
    if task in NLI_EVAL_TASKS:
        results = encoder.nli([tuple(" ".join(text) for text in ex.texts[:2]) for ex in examples], batch_size)
    else:
        results = encoder.sentiment([" ".join(ex.texts[0]) for ex in examples], batch_size)
    labels = encoder.runtime.labels["nli" if task in NLI_EVAL_TASKS else "sentiment"]
    return np.asarray([[r["scores"][label] for label in labels] for r in results], dtype=np.float32)


def score(task: str, labels: list[str], examples, probs: np.ndarray) -> dict:
    """Accuracy, macro-F1 and confusion matrix (rows = gold, columns = predicted)."""
    # scikit-learn comes with the `train` extra; a serve-only install reaches this line only for eval.
    metrics = require("sklearn.metrics", "train")

    if task in NLI_EVAL_TASKS:
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
        "accuracy": round(100 * metrics.accuracy_score(gold, pred), 2),
        "macro_f1": round(100 * metrics.f1_score(gold, pred, average="macro"), 2),
        "confusion": metrics.confusion_matrix(gold, pred, labels=list(range(len(names)))).tolist(),
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


def evaluate_task(bundle: Path, task: str, data: Path, variant: str = "fp32", batch_size: int = 64,
                  encoder: Encoder | None = None) -> dict:
    """Run the bundle on a task's data file and score it (`encoder`: the bundle already loaded, so
    several tasks load it once; default: its cpu graphs in `variant`, long texts windowed as the
    service's defaults window them)."""
    require("sklearn.metrics", "train")  # before the long prediction pass, not after it
    path = data / EVAL_FILES[task] if data.is_dir() else data
    kind, examples = read_examples(path)
    if (kind == "nli") != (task in NLI_EVAL_TASKS):
        raise ValueError(f"{path}: holds {kind} data, not {task}")
    encoder = encoder or Encoder(runtime=load_offline(bundle, variant))
    graph_labels = encoder.runtime.labels["nli" if task in NLI_EVAL_TASKS else "sentiment"]
    probs = predict(encoder, task, examples, batch_size)
    report = score(task, graph_labels, examples, probs)
    report.update(data=str(path), bundle=str(bundle), variant=variant)
    return report


def run(args: argparse.Namespace) -> int:
    """Entry point of `disan eval`."""
    for size in args.dimensions or ():
        if size < 1:
            raise ValueError(f"--dimensions {size}: a vector size is 1 or more")
    for weight in getattr(args, "hybrid", None) or ():
        if not 0.0 < weight <= 1.0:
            raise ValueError(f"--hybrid {weight}: a weight above 0, at most 1")
    if args.retrieval:
        from disan.eval.retrieval import run_retrieval  # pytrec_eval (`eval` extra)

        return run_retrieval(args)
    if args.baselines is None:  # --transfer's default
        args.baselines = "glove,minilm"
    if args.transfer:
        # imported here: the transfer suite pulls scikit-learn/scipy, plain task eval does not
        from disan.eval.transfer import run_transfer

        run_transfer(args)
        return 0
    if args.sts:
        from disan.eval.sts_run import run_sts  # scipy (`train` extra)

        run_sts(args)
        return 0
    if not args.task:
        raise ValueError("give --task (snli|mnli|sick-e|sst5|sst2), --transfer, --sts or --retrieval DIR")
    report = evaluate_task(args.bundle, args.task, args.data, args.variant, args.batch_size)
    print(format_report(report))
    out = args.report or Path("runs") / f"eval_{args.task}_{args.variant}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"report: {out}")
    return 0
