"""The device-machine scripts parse (they only run on a lent GPU, or in a dry run by hand)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import LEASE_SCRIPTS as SCRIPTS
from conftest import REPO as ROOT
from conftest import stub_machine


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_parses(script: Path, bash: str) -> None:
    out = subprocess.run([bash, "-n", str(script)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr


def test_device_script_refuses_an_unknown_step(tmp_path: Path, bash: str) -> None:
    out = subprocess.run([bash, str(SCRIPTS[1]), "nonsense"], capture_output=True, text=True,
                         cwd=tmp_path, check=False)
    assert out.returncode == 2 and "unknown step nonsense" in out.stdout


def test_a_checkpoint_comes_back_in_what_one_reply_holds(tmp_path: Path, bash: str) -> None:
    """A reply brings back at most 8 files and 64 MiB from $OUT; the 2026-11-27 lease's 70 MB
    student came back in 4 of the 6 pieces `train` put there (the rest were left out), so the
    script now puts in only what fits and names the pieces to fetch."""
    ckpt, out = tmp_path / "best16.pt", tmp_path / "out"
    out.mkdir()
    with ckpt.open("wb") as f:  # 70 MB, the shipped student's slim size
        f.truncate(70_000_000)
    env = {"PATH": "/usr/bin:/bin", "KIT": str(tmp_path / "kit"), "OUT": str(out)}
    got = subprocess.run([bash, str(SCRIPTS[1]), "pieces", str(ckpt)], capture_output=True, text=True,
                         cwd=tmp_path, env=env, check=False)
    assert got.returncode == 0, got.stderr
    back = sorted(out.iterdir())
    assert len(back) <= 7  # and metrics.jsonl, which `train` adds
    assert sum(p.stat().st_size for p in back) <= 64 * 2**20 - 2**20
    assert all(p.stat().st_size <= 16 * 2**20 for p in back)
    assert "fetch 4" in got.stdout
    kept = sorted((tmp_path / "kit" / "back").iterdir())
    assert b"".join(p.read_bytes() for p in kept) == ckpt.read_bytes()


def test_fetch_brings_the_pieces_a_reply_left_out_whatever_the_file_was_called(
        tmp_path: Path, bash: str) -> None:
    ckpt, out = tmp_path / "phase2.pt", tmp_path / "out"
    out.mkdir()
    ckpt.write_bytes(bytes(range(256)) * 300_000)  # 76.8 MB: six pieces, four in the first reply
    env = {"PATH": "/usr/bin:/bin", "KIT": str(tmp_path / "kit"), "OUT": str(out)}
    run = [bash, str(SCRIPTS[1])]
    first = subprocess.run([*run, "pieces", str(ckpt)], capture_output=True, text=True, cwd=tmp_path,
                           env=env, check=False)
    assert first.returncode == 0, first.stderr
    assert "fetch 4 5" in first.stdout
    later = tmp_path / "later"
    later.mkdir()
    got = subprocess.run([*run, "fetch", "4", "5"], capture_output=True, text=True, cwd=tmp_path,
                         env=env | {"OUT": str(later)}, check=False)
    assert got.returncode == 0, got.stderr
    pieces = sorted(out.glob("phase2.pt.part-*")) + sorted(later.iterdir())
    assert [p.name[-1] for p in pieces] == list("012345")
    assert b"".join(p.read_bytes() for p in pieces) == ckpt.read_bytes()


def test_the_sentiment_runs_come_back_in_one_file_ranked_on_dev(tmp_path: Path) -> None:
    runs = []
    for seed, dev, test in ((0, 0.49, 0.52), (3, 0.50, 0.48), (7, 0.50, 0.53)):
        run = tmp_path / f"sst5-s{seed}"
        run.mkdir()
        rows = [{"step": 250, "dev_acc": dev - 0.01},
                {"event": "final", "best_step": 250, "dev_acc": dev, "test_acc": test}]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        runs.append(run / "metrics.jsonl")
    out = tmp_path / "all.jsonl"
    got = subprocess.run([sys.executable, str(ROOT / "research" / "gpu-lease" / "sentiment_runs.py"),
                          str(out), *map(str, runs)], capture_output=True, text=True, check=False)
    assert got.returncode == 0, got.stderr
    # dev decides, best first, the first given on a tie
    assert got.stdout.split() == [str(tmp_path / f"sst5-s{s}") for s in (3, 7, 0)]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["seed"] for r in rows] == [0, 0, 3, 3, 7, 7]
    assert rows[-1] == {"seed": 7, "event": "final", "best_step": 250, "dev_acc": 0.50, "test_acc": 0.53}


def test_the_sentiment_packer_names_a_missing_file_in_one_line(tmp_path: Path, bash: str) -> None:
    vocab = tmp_path / "vocab.json"
    vocab.write_text("{}")
    for args, missing in (([str(tmp_path / "nope.json")], "nope.json"),
                          ([str(vocab), str(tmp_path / "soft.npz")], "soft.npz")):
        got = subprocess.run([bash, str(SCRIPTS[2]), *args, str(tmp_path / "data")], capture_output=True,
                             text=True, cwd=ROOT, check=False)
        assert got.returncode == 2 and got.stderr.strip().endswith(f"{missing}: not found"), got.stderr
        assert "Traceback" not in got.stderr


def test_a_missing_augmented_file_is_named_before_any_work(tmp_path: Path, bash: str) -> None:
    vocab = tmp_path / "vocab.json"
    vocab.write_text("{}")
    (tmp_path / "data" / "sst").mkdir(parents=True)
    (tmp_path / "data" / "sst" / "sst5_dev.jsonl.gz").touch()
    got = subprocess.run([bash, str(SCRIPTS[2]), str(vocab), "-", str(tmp_path / "data")],
                         capture_output=True, text=True, cwd=tmp_path, check=False,
                         env={**os.environ, "AUGMENTED": str(tmp_path / "reviews.npz")})
    assert got.returncode == 2 and got.stderr.strip().endswith("reviews.npz: not found"), got.stderr


def test_a_sentiment_kit_may_carry_the_teacher_instead_of_its_logits(tmp_path: Path, bash: str) -> None:
    """`mpnet` in place of SOFT.npz asks for MPNet in the kit (device.sh's task-teacher step);
    the arguments are checked before any work, and a missing file is still named."""
    vocab = tmp_path / "vocab.json"
    vocab.write_text("{}")
    run = [bash, str(SCRIPTS[2]), str(vocab)]
    taught = subprocess.run([*run, "mpnet", str(tmp_path / "nodata")], capture_output=True, text=True,
                            cwd=tmp_path, check=False)
    assert taught.returncode == 2
    assert "nodata/sst/sst5_dev.jsonl.gz: not found" in taught.stderr
    assert "mpnet: not found" not in taught.stderr


def test_the_best_runs_come_back_while_one_reply_holds_them(tmp_path: Path, bash: str) -> None:
    """The 2026-11-28 lease brought back the best dev run alone, so two more calls were needed for
    the next two (dev as served ranks runs otherwise than dev as trained). `back` puts checkpoints
    under $OUT, best first, while the reply's 8 files and 64 MiB hold them."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "sentiment-runs.jsonl").write_bytes(b"x" * 100_000)
    runs = []
    for seed in (16, 10, 11, 13):  # a slim d_h 150 sentiment model: 20.5 MB, two pieces
        runs.append(tmp_path / f"sst5-s{seed}.pt")
        runs[-1].write_bytes(bytes([seed]) * 20_451_477)
    env = {"PATH": "/usr/bin:/bin", "KIT": str(tmp_path / "kit"), "OUT": str(out)}
    got = subprocess.run([bash, str(SCRIPTS[1]), "back", *map(str, runs)], capture_output=True, text=True,
                         cwd=tmp_path, env=env, check=False)
    assert got.returncode == 0, got.stderr
    back = sorted(out.iterdir())
    assert len(back) <= 8 and sum(p.stat().st_size for p in back) <= 64 * 2**20
    assert all(p.stat().st_size <= 16 * 2**20 for p in back)
    for run in runs[:3]:
        pieces = sorted(out.glob(run.name + ".part-*"))
        assert b"".join(p.read_bytes() for p in pieces) == run.read_bytes()
    assert not list(out.glob("sst5-s13.pt.part-*"))
    assert f"not in this reply: {runs[3]}" in got.stdout
    sums = (out / "sentiment.sha256").read_text().split()
    assert sums[1::2] == [r.name for r in runs[:3]]


STUB = """#!/bin/sh
# python3 for device.sh's sentiment step: `-m disan.cli train`, `-m research slim` stand-ins,
# anything else real
if [ "$1 $2" = "-m disan.cli" ] || [ "$1 $2" = "-m research" ]; then
  case $3 in
    train)
      out=; seed=; d_h=150; prev=
      for a in "$@"; do
        case $prev in --out) out=$a ;; --seed) seed=$a ;; --d-h) d_h=$a ;; esac; prev=$a
      done
      mkdir -p "$out"
      echo "$*" > "$out/args"
      printf '{"event": "final", "best_step": 250, "dev_acc": %s, "test_acc": 0.5}\\n' "0.$seed" \\
        > "$out/metrics.jsonl"
      head -c $((d_h * 1000)) /dev/zero > "$out/best.pt"
      echo "{\\"out\\": \\"$out\\"}" ;;
    slim) cp "$4" "$5" ;;
  esac
  exit 0
fi
exec "REAL" "$@"
"""


def test_groups_of_seeds_train_with_their_own_flags_side_by_side(tmp_path: Path, bash: str) -> None:
    """`sentiment "SEEDS" ARGS -- "SEEDS" ARGS2`: one lease call compares two recipes (d_h 150 and
    300, say), since a lease's 15 minutes hold one such call; the runs come back ranked together."""
    kit, out, env = stub_machine(tmp_path, STUB.replace("REAL", sys.executable))
    (kit / ".unpacked").touch()  # the kit as `unpack` leaves it
    step = [bash, str(SCRIPTS[1]), "sentiment"]
    got = subprocess.run([*step, "11 13", "--d-h", "150", "--ema", "0.999", "--", "12 14", "--d-h", "300",
                          "--augmented", "KIT/augmented.npz"],
                         capture_output=True, text=True, cwd=ROOT, env=env, check=False)
    assert got.returncode == 0, got.stdout + got.stderr
    runs = {p.parent.name: p.read_text().split() for p in kit.glob("sst5-*/sst5-s*/args")}
    assert sorted(runs) == ["sst5-s11", "sst5-s12", "sst5-s13", "sst5-s14"]
    for name, args in runs.items():
        wide = name in ("sst5-s12", "sst5-s14")
        assert args[args.index("--d-h") + 1] == ("300" if wide else "150")
        assert ("--ema" in args) != wide and "--" not in args
        assert (f"{kit}/augmented.npz" in args) == wide and "KIT/augmented.npz" not in args  # the kit's file
    assert "by dev, best first: " + " ".join(str(kit / "slim" / f"sst5-s{s}.pt") for s in (14, 13, 12, 11)) \
        in got.stdout
    assert (out / "sentiment.sha256").read_text().split()[1::2] == ["sst5-s14.pt", "sst5-s13.pt",
                                                                    "sst5-s12.pt", "sst5-s11.pt"]
    twice = subprocess.run([*step, "1 2", "--", "2"], capture_output=True, text=True, cwd=ROOT, env=env,
                           check=False)
    assert twice.returncode == 2 and "seed 2 is in two groups" in twice.stdout
    assert len(list(kit.glob("sst5-*/sst5-s1"))) == 0  # checked before any run starts


PRETRAIN_STUB = """#!/bin/sh
# python3 for device.sh's pretrain steps: `-m disan.cli pretrain`, `-m research slim` stand-ins
case $3 in
  pretrain)
    out=; prev=
    for a in "$@"; do [ "$prev" = --out ] && out=$a; prev=$a; done
    echo "$*" > "$out/args"
    echo '{"step": 20}' > "$out/metrics.jsonl"
    printf '%s' "$out" > "$out/best.pt" ;;
  slim) cp "$4" "$5" ;;
esac
"""


def test_a_phase_goes_on_from_the_last_run_on_the_machine(tmp_path: Path, bash: str) -> None:
    """The 2026-11-30 lease trained a second phase from its scratch run by hand (a symlink to that
    run's best.pt in place of the kit's student); `phase` does it, and refuses on a fresh machine."""
    kit, out, env = stub_machine(tmp_path, PRETRAIN_STUB)
    step = [bash, str(SCRIPTS[1])]
    first = subprocess.run([*step, "phase", "--lr", "1e-3"], capture_output=True, text=True, cwd=ROOT,
                           env=env, check=False)
    assert first.returncode == 2 and "no earlier run" in first.stdout
    for args in (["scratch", "--d-h", "300"], ["phase", "--lr", "1e-3"], ["phase", "--lr", "3e-4"]):
        got = subprocess.run([*step, *args], capture_output=True, text=True, cwd=ROOT, env=env, check=False)
        assert got.returncode == 0, got.stdout + got.stderr
    argv = {r: (r / "args").read_text().split() for r in kit.glob("run-*")}
    runs = list(argv)
    scratch = next(r for r in runs if "--d-h" in argv[r])
    second = next(r for r in runs if "1e-3" in argv[r])
    third = next(r for r in runs if "3e-4" in argv[r])
    assert "--init-from" not in argv[scratch]

    def start(run: Path) -> Path:
        return Path(argv[run][argv[run].index("--init-from") + 1]).resolve()

    assert start(second) == (scratch / "best.pt").resolve()
    assert start(third) == (second / "best.pt").resolve()
    assert (out / "best16.pt.part-0").read_text() == str(third)  # the last phase came back
