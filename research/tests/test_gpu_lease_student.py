"""The lease kit's student and static steps, and the student packer, on a stand-in machine."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import LEASE_SCRIPTS as SCRIPTS
from conftest import REPO as ROOT
from conftest import stub_machine

from disan.distill import supervision
from disan.text.tokenizer import Vocab

DATA = ROOT.parent / "shared" / "data"


def test_the_student_packer_names_a_missing_corpus_file_before_any_work(tmp_path: Path, bash: str) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("corpus.json", "sentences.txt", "kinds.npy"):
        (corpus / name).write_text("x")
    got = subprocess.run([bash, str(SCRIPTS[3]), str(corpus)], capture_output=True, text=True, cwd=ROOT,
                         check=False)
    assert got.returncode == 2 and got.stdout.strip().endswith("pairs.npy: missing (a corpus from "
                                                               "`disan distill corpus`?)"), got.stdout


STUDENT_STUB = """#!/bin/sh
# python3 for device.sh's student step: `-m disan.cli distill`, `-m research slim` stand-ins
echo "$*" >> "$KIT/calls"
if [ "$3 $4" = "distill student" ]; then
  out=; prev=
  for a in "$@"; do [ "$prev" = --out ] && out=$a; prev=$a; done
  echo '{"step": 1}' > "$out/metrics.jsonl"
  echo trained > "$out/student.pt"
fi
if [ "$3" = slim ]; then cp "$4" "$5"; fi
"""


def test_a_student_starts_from_the_kits_init_and_leaves_its_borrowed_table_behind(
        tmp_path: Path, bash: str) -> None:
    """The anchored phase from the shipped encoder on a lent GPU: ARGS name the kit's start as
    KIT/init.pt, and the trained student comes back without the 112 MB word table it borrows."""
    kit, out, env = stub_machine(tmp_path, STUDENT_STUB)
    (kit / ".unpacked").touch()
    got = subprocess.run([bash, str(SCRIPTS[1]), "student", "3", "--init", "KIT/init.pt", "--anchor", "0.5"],
                         capture_output=True, text=True, cwd=ROOT, env=env | {"KIT": str(kit)}, check=False)
    assert got.returncode == 0, got.stdout + got.stderr
    calls = (kit / "calls").read_text().splitlines()
    check = calls[0].split()  # the inputs read before any teacher minute is spent
    assert check[2:4] == ["distill", "student"] and check[-3:] == ["--anchor", "0.5", "--check"]
    assert check[check.index("--init") + 1] == f"{kit}/init.pt"
    assert calls[1].split()[2:4] == ["distill", "teacher"] and "--max-minutes 3" in calls[1]
    student = calls[2].split()
    assert student[student.index("--init") + 1] == f"{kit}/init.pt"
    assert student[-2:] == ["--anchor", "0.5"]
    assert calls[3].split()[2] == "slim" and calls[3].endswith("--without-borrowed")
    assert (out / "student16.pt.part-0").read_text() == "trained\n"
    assert (out / "metrics.jsonl").is_file()


def test_students_train_side_by_side_each_with_its_flags_and_come_back_numbered(
        tmp_path: Path, bash: str) -> None:
    """Two phases on one lease: no more teacher rows when MINUTES is 0, each set of flags its own
    run, and each student back as studentN-fp16.pt with its metrics, in the order given."""
    kit, out, env = stub_machine(tmp_path, STUDENT_STUB)
    (kit / ".unpacked").touch()
    got = subprocess.run([bash, str(SCRIPTS[1]), "students", "0", "--init", "KIT/init.pt", "--anchor", "0.5",
                          "--", "--init", "KIT/init.pt", "--batch-size", "256"],
                         capture_output=True, text=True, cwd=ROOT, env=env | {"KIT": str(kit)}, check=False)
    assert got.returncode == 0, got.stdout + got.stderr
    calls = (kit / "calls").read_text().splitlines()
    assert not any("distill teacher" in c for c in calls)
    checked = [c.split() for c in calls if c.endswith("--check")]
    assert [c[-2] for c in checked] == ["0.5", "256"] and calls.index(" ".join(checked[-1])) == 1
    trained = sorted(c.split() for c in calls if "distill student" in c and not c.endswith("--check"))
    assert [c[-2:] for c in trained] == [["--anchor", "0.5"], ["--batch-size", "256"]]
    assert all(c[c.index("--init") + 1] == f"{kit}/init.pt" for c in trained)
    outs = {c[c.index("--out") + 1].rsplit("/", 1)[1].split("-")[0]: c[-1] for c in trained}
    assert outs == {"student1": "0.5", "student2": "256"}
    for n in (1, 2):
        assert (out / f"student{n}-fp16.pt.part-0").read_text() == "trained\n"
    assert (out / "students.sha256").read_text().split()[1::2] == ["student1-fp16.pt", "student2-fp16.pt"]
    assert (out / "metrics-1.jsonl").is_file() and (out / "metrics-2.jsonl").is_file()


CHECK_FAILS = STUDENT_STUB.replace("#!/bin/sh\n", """#!/bin/sh
case "$*" in
  *--check) echo "$*" >> "$KIT/calls"; echo "--whiten-targets: no whitening map" >&2; exit 2 ;;
esac
""", 1)


def test_a_student_whose_inputs_fail_the_check_stops_before_the_teacher(tmp_path: Path, bash: str) -> None:
    """A start without the whitening map --whiten-targets needs (or a bad flag, a missing --data
    file) stops the step at its check: no teacher minute of the lease is spent on a run that would
    stop after them."""
    kit, out, env = stub_machine(tmp_path, CHECK_FAILS)
    (kit / ".unpacked").touch()
    got = subprocess.run([bash, str(SCRIPTS[1]), "student", "3", "--init", "KIT/init.pt", "--whiten-targets"],
                         capture_output=True, text=True, cwd=ROOT, env=env | {"KIT": str(kit)}, check=False)
    assert got.returncode != 0 and "no whitening map" in got.stderr
    calls = (kit / "calls").read_text().splitlines()
    assert len(calls) == 1 and calls[0].endswith("--whiten-targets --check")


def test_the_student_packer_names_a_missing_start_before_any_work(tmp_path: Path, bash: str) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("corpus.json", "sentences.txt", "kinds.npy", "pairs.npy"):
        (corpus / name).write_text("x")
    got = subprocess.run([bash, str(SCRIPTS[3]), "--init", str(tmp_path / "embed.pt"), str(corpus)],
                         capture_output=True, text=True, cwd=ROOT, check=False)
    assert got.returncode == 2 and got.stdout.strip() == f"{tmp_path}/embed.pt: missing", got.stdout


STATIC_STUB = """#!/bin/sh
# python3 for device.sh's static step: `-m disan.cli distill teacher`, `-m research.static_pieces`
# and the fp16 copy back, recorded
echo "$*" >> "$KIT/calls"
"""


def test_the_static_step_trains_the_kits_table_in_place_after_the_teacher(tmp_path: Path, bash: str) -> None:
    """`static MINUTES EPOCHS`: the teacher first, then the kit's piece table trains on every cached
    row and replaces itself (the students that follow copy it), and comes back with its map."""
    kit, out, env = stub_machine(tmp_path, STATIC_STUB)
    (kit / ".unpacked").touch()
    (kit / "cache").mkdir()
    (kit / "cache" / "pieces.npy").write_text("table")
    got = subprocess.run([bash, str(SCRIPTS[1]), "static", "3", "2"], capture_output=True, text=True,
                         cwd=ROOT, env=env, check=False)
    assert got.returncode == 0, got.stdout + got.stderr
    calls = [c.split() for c in (kit / "calls").read_text().splitlines()]
    assert calls[0][2:4] == ["distill", "teacher"] and calls[0][calls[0].index("--max-minutes") + 1] == "3"
    static = calls[1]
    assert static[:2] == ["-m", "research.static_pieces"]
    flag = {static[i]: static[i + 1] for i in range(2, len(static) - 1) if static[i].startswith("--")}
    assert flag["--table"] == flag["--save-table"] == f"{kit}/cache/pieces.npy"
    assert flag["--train"] == f"{kit}/corpus" and flag["--epochs"] == "2" and flag["--device"] == "cpu"
    assert flag["--out"] == f"{out}/static.json"
    # the fp16 copy back: a two-line `python3 -c` script, then $OUT and the files
    assert calls[2][0] == "-c" and calls[-1][-3:] == [str(out), f"{kit}/cache/pieces.npy", f"{kit}/map.npy"]


def test_the_static_step_without_a_piece_table_stops_before_the_teacher(tmp_path: Path, bash: str) -> None:
    kit, out, env = stub_machine(tmp_path, STATIC_STUB)
    (kit / ".unpacked").touch()
    got = subprocess.run([bash, str(SCRIPTS[1]), "static", "3", "2"], capture_output=True, text=True,
                         cwd=ROOT, env=env, check=False)
    assert got.returncode == 2 and "no piece table" in got.stdout, got.stdout
    assert not (kit / "calls").exists()


@pytest.mark.parametrize("name", ["pieces.npy", "pieces-trained.npy"])
def test_the_student_kit_carries_its_piece_table_as_pieces_npy_whatever_its_name(
        tmp_path: Path, bash: str, name: str) -> None:
    """The students and the static step read KIT/cache/pieces.npy: a trained table packed from
    pieces-trained.npy must land there (in fp16), not under its own name."""
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.save(tmp_path / name, table)
    (tmp_path / "cache").mkdir()
    line = [s for s in SCRIPTS[3].read_text().splitlines() if "add_cache_file" in s and not s.startswith("#")]
    assert len(line) == 1, line
    script = f'. {SCRIPTS[4]}; pieces={tmp_path / name}; kit={tmp_path}; {line[0]}'
    got = subprocess.run([bash, "-c", script], capture_output=True, text=True, cwd=ROOT,
                         env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}, check=False)
    assert got.returncode == 0, got.stdout + got.stderr
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["pieces.npy"]
    carried = np.load(tmp_path / "cache" / "pieces.npy")
    assert carried.dtype == np.float16 and np.array_equal(carried, table)


def test_the_student_kit_carries_every_staged_file_the_label_terms_read(tmp_path: Path, bash: str) -> None:
    """`--data KIT/data --scored-weight 0.5 --sentiment-weight 1` on a lease: the kit held only the
    three STS dev sets, so a phase with the labels stopped at its first read of a training set."""
    data, kit = tmp_path / "staged", tmp_path / "kit" / "data"
    for rel in [*supervision.staged_files(), "unread/other.jsonl.gz"]:
        (data / rel).parent.mkdir(parents=True, exist_ok=True)
        (data / rel).write_text(rel)
    line = [s for s in SCRIPTS[3].read_text().splitlines() if s.startswith("add_staged_files")]
    assert len(line) == 1, line
    script = f'. {SCRIPTS[4]}; data={data}; kit={kit.parent}; mkdir -p {kit}; {line[0]}'
    got = subprocess.run([bash, "-c", script], capture_output=True, text=True, cwd=ROOT,
                         env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}, check=False)
    assert got.returncode == 0, got.stdout + got.stderr
    carried = sorted(str(p.relative_to(kit)) for p in kit.rglob("*") if p.is_file())
    assert carried == sorted(supervision.staged_files())
    assert all((kit / rel).read_text() == rel for rel in carried)


@pytest.mark.skipif(not (DATA / "stsb" / "train.jsonl.gz").is_file(), reason="staged data not here")
def test_the_label_terms_read_nothing_beyond_the_staged_files(tmp_path: Path) -> None:
    """A data folder holding only `staged_files` is enough for the four label terms."""
    for rel in supervision.staged_files():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(DATA / rel, tmp_path / rel)
    vocab = Vocab("a the film good".split())
    assert len(supervision.ScoredPairs(tmp_path, vocab).scores) > 1000
    assert len(supervision.NLITriples(tmp_path, vocab)) > 1000
    assert len(supervision.SentimentPhrases(tmp_path, vocab)) > 1000
    assert len(supervision.NLIClasses(tmp_path, vocab)) > 1000


def test_the_student_packer_names_a_missing_staged_file_before_any_work(tmp_path: Path, bash: str) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("corpus.json", "sentences.txt", "kinds.npy", "pairs.npy"):
        (corpus / name).write_text("x")
    data = tmp_path / "staged"
    got = subprocess.run([bash, str(SCRIPTS[3]), str(corpus), "-", str(data)], capture_output=True, text=True,
                         cwd=ROOT, env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}, check=False)
    first = supervision.staged_files()[0]
    assert got.returncode == 2, got.stdout + got.stderr
    assert got.stdout.strip() == f"{data}/{first}: missing (staged data the student reads)", got.stdout
