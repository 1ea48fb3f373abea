"""The bundle's accuracy on the staged test sets as it is served: its tokenizer, its cpu fp32
graphs, the `disan eval --task` code. Export records it in the manifest (`served_accuracy`)
because the checkpoints' own test accuracy is measured at training time and drifts from what the
service answers once the tokenizer reads more words; a test of a shipped bundle compares with
the served number."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from disan.data.recipes import EVAL_FILES

SERVED_TASKS = ("snli", "sst5", "sst2")  # the test sets the README reports (the others train NLI)


def served_accuracy(bundle: Path, data_root: Path, log=print) -> dict[str, Any]:
    """{task: {accuracy, macro_f1, n, data}} for each of SERVED_TASKS staged under `data_root`."""
    from disan.eval.evaluate import evaluate_task  # scikit-learn (`train` extra, as export's torch)
    from disan.runtime.encoder import Encoder
    from disan.runtime.runtime import load_offline

    served: dict[str, Any] = {}
    tasks = [task for task in SERVED_TASKS if (data_root / EVAL_FILES[task]).is_file()]
    encoder = Encoder(runtime=load_offline(bundle, "fp32")) if tasks else None  # once for every task
    for task in tasks:
        report = evaluate_task(bundle, task, data_root, encoder=encoder)
        served[task] = {"accuracy": report["accuracy"], "macro_f1": report["macro_f1"], "n": report["n"],
                        "data": EVAL_FILES[task]}
        log(f"served {task} test accuracy: {report['accuracy']:.2f} ({report['n']} examples)")
    return served
