"""`disan` console script: serve, embed, evaluate, train and export DiSAN sentence embeddings.

Commands: serve | embed | eval | train | export | verify | bundle-diff | calibrate | distill, where
`disan distill STEP` runs the distillation pipeline's steps (corpus | teacher | student | task-teacher |
pretrain | extend-vocab | borrow-words | whole-words | merge). The steps' old top-level spellings (`disan
pretrain ...`) still work and are not listed. Research commands (experiment grids, ensembles,
widening, slimming) run from a checkout: `python -m research COMMAND`.

Benchmarks are scripts run from a checkout: `python -m bench.offline`, `python -m bench.service`.

Each command lives in its own module exposing `add_arguments(parser)` and `run(args) -> int`;
modules are imported only when their command runs, so `disan serve` never imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from disan.optional import EXTRAS, MissingDependency, hint

# command -> (module, one-line help, the extra it needs: what a missing package's hint names)
COMMANDS = {
    "serve": ("service.cli", "serve a bundle over HTTP", "serve-cpu"),
    "embed": ("disan.embed.cli", "embed a corpus file (JSONL/CSV/TXT/Parquet), resumable; --ray: on Ray",
              "embed"),
    "eval": ("disan.eval.evaluate", "evaluate a bundle on its tasks, or bundles and checkpoints on STS "
             "(--sts), frozen-vector transfer (--transfer) and retrieval (--retrieval)", "train"),
    "train": ("disan.train.cli", "train a DiSAN model on NLI or sentiment data", "train"),
    "export": ("model_export.export_cli", "export checkpoints to an ONNX bundle and verify it", "train"),
    "verify": ("model_export.verify", "re-verify a bundle: hashes and ORT vs PyTorch parity", "train"),
    "bundle-diff": ("model_export.bundle_diff", "which routes of two bundles compute the same thing "
                    "(does /embed change: re-embed an index?); exit 1 if any differ", "train"),
    "calibrate": ("model_export.calibrate", "add class offsets chosen on the recipe's dev set, as a bundle "
                  "serves the model, to an NLI or two-class sentiment model's head (a prior shift)", "train"),
    "distill": ("disan.distill", "the distillation pipeline, one step a subcommand: corpus, teacher, "
                "student, task-teacher, pretrain, extend-vocab, borrow-words, whole-words, merge", "train"),
}
# `disan distill STEP`: step -> (module, help, extra), as COMMANDS.
DISTILL = {
    "corpus": ("disan.distill.corpus.build", "build the distillation corpus (texts users embed, their pairs)",
               "train"),
    "teacher": ("disan.distill.teacher", "cache a teacher's sentence vectors of a corpus (resumable)",
                "train"),
    "student": ("disan.distill.student.cli", "distil a subword-piece student from a corpus's teacher cache, "
                "with its pairs and Matryoshka prefixes", "train"),
    "task-teacher": ("disan.distill.task_teacher.cli", "fine-tune a sentence-transformer on a sentiment "
                     "task and write its soft labels of the training examples (for train --soft-targets)",
                     "train"),
    "pretrain": ("disan.distill.pretrain_cli", "pre-train a sentence encoder by distilling a teacher's "
                 "sentence vectors (a corpus's `disan distill teacher` cache, or MiniLM's of staged "
                 "sentences)", "train"),
    "extend-vocab": ("disan.distill.vocab_extend", "give a trained sentence encoder rows for words it "
                     "never saw", "train"),
    "borrow-words": ("disan.distill.borrow_words", "let an NLI or sentiment model read the embedding "
                     "encoder's words past its own table (a fitted map of its word vectors)", "train"),
    "whole-words": ("disan.distill.whole_words", "let a piece encoder read a word encoder's words whole "
                    "(the table the bundle's NLI and sentiment models borrow), other strings as pieces",
                    "train"),
    "merge": ("disan.distill.merge", "add a further phase's change (or the mean of several seeds') to a "
              "student, less a control phase's (task arithmetic)", "train"),
}
GROUPS = {"distill": DISTILL}
# Spellings from before the `distill` group, still accepted (not listed in --help).
ALIASES = {step: ["distill", step] for step in DISTILL}
# Extras that a command's own extra contains: a package missing from one of them is named by the
# command's extra (`disan eval` after a serve-only install is told `.[train]`, `disan embed`
# without pyarrow `.[embed]`); add-ons such as `minilm` or `ray` are named as themselves.
_BASE_EXTRAS = ("serve-cpu", "train")


def entry(command: str) -> tuple[str, str, str]:
    """(module, help, extra) of a command: `train`, or a group's step as `distill pretrain`."""
    group, _, step = command.partition(" ")
    return GROUPS[group][step] if step else COMMANDS[group]


def missing_line(command: str, package: str, extra: str | None = None, note: str = "",
                 command_extra: str | None = None, prog: str = "disan") -> str:
    """One line for a package `disan <command>` lacks, naming the extra that gives the command
    everything: `train` also holds onnxruntime, so `disan eval` after a serve-only install (or
    none) is told `.[train]`, not `.[serve-cpu]` and then `.[train]`."""
    extra = extra or EXTRAS.get(package.split(".")[0])
    command_extra = command_extra or entry(command)[2]
    if extra in _BASE_EXTRAS and command_extra != "serve-cpu":
        extra = command_extra
    return f"{package} is not installed{note}; `{prog} {command}` needs: {hint(package, extra)}"


def build_parser(prog: str = "disan", commands: dict | None = None,
                 description: str | None = None) -> argparse.ArgumentParser:
    """The parser of a command table (the top level by default); each command's own arguments
    are added lazily in `dispatch`."""
    parser = argparse.ArgumentParser(prog=prog, description=description or __doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (_, help_text, _) in (COMMANDS if commands is None else commands).items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def dispatch(prog: str, command: str, spec: tuple[str, str, str], argv: list[str]) -> int:
    """Run one command: import its module, parse `argv` with its arguments, call `run`; a missing
    package or a user error becomes one line on stderr and exit status 2."""
    module_name, help_text, extra = spec
    try:
        module = importlib.import_module(module_name)
        sub = argparse.ArgumentParser(prog=f"{prog} {command}", description=help_text,
                                      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        module.add_arguments(sub)
        args = sub.parse_args(argv)
        return int(module.run(args) or 0)
    except MissingDependency as exc:
        line = missing_line(command, exc.package, exc.extra, exc.note, extra, prog)
        print(f"{prog} {command}: {line}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        line = missing_line(command, (exc.name or "?").split(".")[0], command_extra=extra, prog=prog)
        print(f"{prog} {command}: {line}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError, OSError) as exc:
        print(f"{prog} {command}: error: {exc}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    """Entry point: dispatch to the command's module (a group's step for `disan distill STEP`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ALIASES:
        argv = [*ALIASES[argv[0]], *argv[1:]]
    if not argv or argv[0] not in COMMANDS:
        build_parser().parse_args(argv)  # prints usage / error and exits
        return 2
    if argv[0] in GROUPS:
        group, steps = argv[0], GROUPS[argv[0]]
        if len(argv) < 2 or argv[1] not in steps:
            build_parser(f"disan {group}", steps, COMMANDS[group][1]).parse_args(argv[1:])
            return 2
        return dispatch("disan", f"{group} {argv[1]}", steps[argv[1]], argv[2:])
    return dispatch("disan", argv[0], COMMANDS[argv[0]], argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
