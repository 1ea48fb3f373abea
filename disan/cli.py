"""`disan` console script: train, export and serve DiSAN sentence embeddings, one subcommand a step.

Subcommands: train | experiment | corpus | teacher | task-teacher | pretrain | extend-vocab |
borrow-words | ensemble | widen | slim | eval | calibrate | export | verify | serve | embed.

Benchmarks are scripts run from a checkout: `python -m bench.offline`, `python -m bench.service`.

Each subcommand lives in its own module exposing `add_arguments(parser)` and `run(args) -> int`;
modules are imported only when their subcommand runs, so `disan serve` never imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from disan.optional import EXTRAS, MissingDependency, hint

# subcommand -> (module, one-line help, the extra it needs: what a missing package's hint names)
COMMANDS = {
    "train": ("disan.train_cli", "train a DiSAN model on NLI or sentiment data", "train"),
    "experiment": ("disan.experiment", "run a resumable grid of training configurations x seeds", "train"),
    "corpus": ("disan.corpus", "build the distillation corpus (staged text + Debian packages)", "train"),
    "teacher": ("disan.teacher", "cache a teacher's sentence vectors of a corpus (resumable)", "train"),
    "task-teacher": ("disan.task_teacher", "fine-tune a sentence-transformer on a sentiment task and "
                     "write its soft labels of the training examples (for train --soft-targets)", "train"),
    "pretrain": ("disan.pretrain_cli", "pre-train a sentence encoder by distilling a teacher's sentence "
                 "vectors (a corpus's `disan teacher` cache, or MiniLM's of staged sentences)", "train"),
    "extend-vocab": ("disan.vocab_extend", "give a trained sentence encoder rows for words it never saw",
                     "train"),
    "borrow-words": ("disan.borrow_words", "let an NLI or sentiment model read the embedding encoder's "
                     "words past its own table (a fitted map of its word vectors)", "train"),
    "ensemble": ("disan.ensemble", "join sentiment models trained over one frozen word table into "
                 "one that serves the mean of their probabilities", "train"),
    "widen": ("disan.widen", "grow a trained sentence encoder's d_h, serving the same vectors", "train"),
    "merge": ("disan.merge", "add a further phase's change (or the mean of several seeds') to a "
              "student, less a control phase's (task arithmetic)", "train"),
    "slim": ("disan.slim", "copy a checkpoint without its training state, in fp16 (to carry it)", "train"),
    "eval": ("disan.evaluate", "evaluate a bundle on its tasks, or bundles and checkpoints on STS (--sts) "
             "and frozen-vector transfer (--transfer)", "train"),
    "calibrate": ("model_export.calibrate", "add class offsets chosen on the recipe's dev set, as a bundle "
                  "serves the model, to an NLI or two-class sentiment model's head (a prior shift)", "train"),
    "export": ("model_export.export", "export checkpoints to an ONNX bundle and verify it", "train"),
    "verify": ("model_export.verify", "re-verify a bundle: hashes and ORT vs PyTorch parity", "train"),
    "bundle-diff": ("model_export.bundle_diff", "which routes of two bundles compute the same thing "
                    "(does /embed change: re-embed an index?); exit 1 if any differ", "train"),
    "serve": ("service.cli", "serve a bundle over HTTP", "serve-cpu"),
    "embed": ("disan.embed_cli", "embed a corpus file (JSONL/CSV/TXT/Parquet), resumable; --ray: on Ray",
              "embed"),
}
# Extras that a command's own extra contains: a package missing from one of them is named by the
# command's extra (`disan eval` after a serve-only install is told `.[train]`, `disan embed`
# without pyarrow `.[embed]`); add-ons such as `minilm` or `ray` are named as themselves.
_BASE_EXTRAS = ("serve-cpu", "train")


def missing_line(command: str, package: str, extra: str | None = None, note: str = "") -> str:
    """One line for a package `disan <command>` lacks, naming the extra that gives the command
    everything: `train` also holds onnxruntime, so `disan eval` after a serve-only install (or
    none) is told `.[train]`, not `.[serve-cpu]` and then `.[train]`."""
    extra = extra or EXTRAS.get(package.split(".")[0])
    if extra in _BASE_EXTRAS and COMMANDS[command][2] != "serve-cpu":
        extra = COMMANDS[command][2]
    return f"{package} is not installed{note}; `disan {command}` needs: {hint(package, extra)}"


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser; subcommand arguments are added lazily in `main`."""
    parser = argparse.ArgumentParser(prog="disan", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (_, help_text, _) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point: dispatch to the subcommand's module; errors become one clear line + exit 2."""
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    if not argv or argv[0] not in COMMANDS:
        parser.parse_args(argv)  # prints usage / error and exits
        return 2
    name = argv[0]
    module_name, help_text, _ = COMMANDS[name]
    try:
        module = importlib.import_module(module_name)
        sub = argparse.ArgumentParser(prog=f"disan {name}", description=help_text,
                                      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        module.add_arguments(sub)
        args = sub.parse_args(argv[1:])
        return int(module.run(args) or 0)
    except MissingDependency as exc:
        print(f"disan {name}: {missing_line(name, exc.package, exc.extra, exc.note)}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        print(f"disan {name}: {missing_line(name, (exc.name or '?').split('.')[0])}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError, OSError) as exc:
        print(f"disan {name}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
