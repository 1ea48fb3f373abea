"""`python -m research COMMAND ...`: the research commands, run from a checkout (not in the wheel).

    python -m research experiment research/experiments/sst5_ablation.toml --data ../shared/data
    python -m research ensemble | widen | slim ...

Same conventions as `disan`'s commands (disan/cli.py): one module a command with
`add_arguments(parser)` and `run(args) -> int`, imported only when it runs.
"""

from __future__ import annotations

import sys

from disan.cli import build_parser, dispatch

PROG = "python -m research"
# command -> (module, one-line help, the extra it needs)
COMMANDS = {
    "experiment": ("research.experiment", "run a resumable grid of training configurations x seeds", "train"),
    "ensemble": ("research.ensemble", "join sentiment models trained over one frozen word table into "
                 "one that serves the mean of their probabilities", "train"),
    "widen": ("research.widen", "grow a trained sentence encoder's d_h, serving the same vectors", "train"),
    "slim": ("research.slim", "copy a checkpoint without its training state, in fp16 (to carry it)",
             "train"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        build_parser(PROG, COMMANDS, __doc__.splitlines()[0]).parse_args(argv)  # usage / error, exits
        return 2
    return dispatch(PROG, argv[0], COMMANDS[argv[0]], argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
