"""`python -m research COMMAND ...`: the research commands, run from a checkout (not in the wheel).

    python -m research experiment research/experiments/sst5_ablation.toml --data ../shared/data
    python -m research ensemble | widen | slim ...

Same conventions as `disan`'s commands (disan/cli.py): one module a command with
`add_arguments(parser)` and `run(args) -> int`, imported only when it runs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from disan.cli import build_parser, dispatch
from disan.optional import MissingDependency

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


def run_tool(main: Callable[[], int | None], module: str) -> int:
    """A research tool run as `python -m MODULE`: its `main()`, with a user error (a checkpoint or
    file that is not there, a value it cannot use, a package not installed) as one line on stderr
    and exit status 2, as `disan`'s commands answer, instead of a traceback."""
    prog = f"python -m {module}"
    try:
        return int(main() or 0)
    except MissingDependency as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError, OSError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        build_parser(PROG, COMMANDS, __doc__.splitlines()[0]).parse_args(argv)  # usage / error, exits
        return 2
    return dispatch(PROG, argv[0], COMMANDS[argv[0]], argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
