"""`disan embed`: every input and output format, ids, one-line errors, and resuming after a full
disk or a real SIGKILL with every row present once."""

from __future__ import annotations

import csv
import errno
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("tqdm")

from support_files import write_awkward_corpus  # noqa: E402

from disan import Encoder  # noqa: E402
from disan.bundle.manifest import load_manifest, write_manifest  # noqa: E402
from disan.cli import main  # noqa: E402
from disan.embed.inputs import Position, cut, read_rows  # noqa: E402
from disan.embed.shards import PROGRESS, read_output, read_sparse  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
WORDS = "a man woman dog cat is playing reading the guitar book in park street good bad movie".split()


def sentences(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 20)))) for _ in range(n)]


TEXTS = sentences(57)


@pytest.fixture(scope="module")
def encoder(tiny_bundle) -> Encoder:
    return Encoder(tiny_bundle)


def write_input(path: Path, texts: list[str], ids: list | None = None) -> Path:
    ids = ids if ids is not None else [f"doc-{i}" for i in range(len(texts))]
    fmt = path.suffix
    if fmt == ".jsonl":
        rows = [{"body": t, "key": k} for t, k in zip(texts, ids, strict=True)]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == ".csv":
        with open(path, "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow(["key", "body"])
            w.writerows(zip(ids, texts, strict=True))
    elif fmt == ".txt":
        path.write_text("".join(t + "\n" for t in texts))
    elif fmt == ".parquet":
        pq.write_table(pa.table({"key": ids, "body": texts}), path, row_group_size=20)
    return path


def embed(tiny_bundle, *argv: str) -> int:
    return main(["embed", *map(str, argv), "--bundle", str(tiny_bundle), "--no-progress"])


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".txt", ".parquet"])
def test_every_input_format_gives_the_encoders_vectors(tiny_bundle, encoder, tmp_path, suffix):
    src = write_input(tmp_path / f"in{suffix}", TEXTS)
    id_flags = [] if suffix == ".txt" else ["--id-column", "key"]
    column = [] if suffix == ".txt" else ["--column", "body"]
    assert embed(tiny_bundle, src, "-o", tmp_path / "out", "--shard-size", 10, *column, *id_flags) == 0
    ids, vectors = read_output(tmp_path / "out")
    assert ids == (list(range(len(TEXTS))) if suffix == ".txt" else [f"doc-{i}" for i in range(len(TEXTS))])
    np.testing.assert_allclose(vectors, encoder.encode(TEXTS), rtol=1e-5, atol=1e-6)
    assert len(list((tmp_path / "out").glob("part-*.parquet"))) == 6


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".txt"])
def test_a_line_file_cut_into_pieces_reads_back_as_the_whole_file(tmp_path, suffix):
    """`--ray`'s workers read a JSONL, CSV or TXT file piece by piece, each from the byte offset
    `cut` found (as a resumed job does): the rows, their numbers, ids and unreadable rows are the
    whole file's, at any piece size, through blank lines, CRLF, a raw U+2028, multi-line CSV fields
    and rows that are not UTF-8."""
    src = tmp_path / f"in{suffix}"
    flags, expected = write_awkward_corpus(src, TEXTS)
    fmt, id_column = suffix[1:], "key" if suffix == ".csv" else None
    whole = list(read_rows(src, fmt, "text", id_column))
    assert [r.text for r in whole] == expected and [r.number for r in whole] == list(range(len(expected)))
    assert [r.id for r in whole if r.error is None][:3] == (["000", "001", "002"] if id_column else [0, 1, 2])
    for size in (1, 4, 10, 1000):
        pieces = list(cut(src, fmt, size))
        assert [n for _, n in pieces] == [min(size, len(whole) - k) for k in range(0, len(whole), size)]
        again = [r for where, n in pieces
                 for r in itertools.islice(read_rows(src, fmt, "text", id_column, start=where), n)]
        assert again == whole
    position = Position()
    rows = read_rows(src, fmt, "text", id_column, position=position)
    head = list(itertools.islice(rows, 25))  # a job stopped after 25 rows, resumed from its progress
    assert position.offset is not None and head + list(read_rows(src, fmt, "text", id_column,
                                                                 start=position)) == whole


@pytest.mark.parametrize("fmt", ["parquet", "npy", "jsonl"])
def test_every_output_format_keeps_ids(tiny_bundle, encoder, tmp_path, fmt):
    src = write_input(tmp_path / "in.jsonl", TEXTS, ids=list(range(100, 100 + len(TEXTS))))
    out = tmp_path / f"vectors.{fmt}"  # the format from the suffix
    assert embed(tiny_bundle, src, "-o", out, "--column", "body", "--id-column", "key", "--shard-size", 25,
                 "--normalize") == 0
    ids, vectors = read_output(out, fmt)
    assert ids == list(range(100, 100 + len(TEXTS)))
    np.testing.assert_allclose(vectors, encoder.encode(TEXTS, normalize=True), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fmt", ["parquet", "npy", "jsonl"])
def test_sparse_vectors_are_written_beside_the_dense_ones(sparse_bundle, tmp_path, fmt):
    texts = [*TEXTS, " ".join(["the man is playing the guitar in the park"] * 20)]  # windowed
    src = write_input(tmp_path / "in.jsonl", texts)
    out = tmp_path / f"vectors.{fmt}"
    assert embed(sparse_bundle, src, "-o", out, "--column", "body", "--shard-size", 25, "--sparse") == 0
    want = Encoder(sparse_bundle).encode_sparse(texts)
    got = read_sparse(out, fmt)
    assert len(got) == len(texts) == len(read_output(out, fmt)[0])
    for (idx, val), (want_idx, want_val) in zip(got, want, strict=True):
        np.testing.assert_array_equal(idx, want_idx)
        np.testing.assert_allclose(val, want_val, rtol=1e-6)
    assert len(got[-1][0]) > 0


def test_sparse_needs_a_lexical_table_and_is_part_of_the_job(tiny_bundle, sparse_bundle, tmp_path, capsys):
    src = write_input(tmp_path / "in.jsonl", TEXTS)
    assert embed(tiny_bundle, src, "-o", tmp_path / "plain", "--column", "body", "--sparse") == 2
    line = one_error(capsys)
    assert "--sparse: " in line and "has no lexical table" in line and "model_export.lexical" in line
    out = tmp_path / "out"
    assert embed(sparse_bundle, src, "-o", out, "--column", "body") == 0
    capsys.readouterr()
    assert embed(sparse_bundle, src, "-o", out, "--column", "body", "--sparse") == 2
    assert "it differs in sparse_table" in one_error(capsys)


def one_error(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("disan embed: error: ")
    return lines[0]


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet"])
def test_a_missing_column_is_one_line(tiny_bundle, tmp_path, capsys, suffix):
    src = write_input(tmp_path / f"in{suffix}", TEXTS)
    assert embed(tiny_bundle, src, "-o", tmp_path / "out", "--column", "text") == 2
    line = one_error(capsys)
    assert "no column 'text'" in line and "'body'" in line and str(src) in line
    assert embed(tiny_bundle, src, "-o", tmp_path / "out2", "--column", "body", "--id-column", "nope") == 2
    assert "no column 'nope'" in one_error(capsys)


@pytest.mark.parametrize("flag,value", [("--shard-size", 0), ("--batch-size", 0), ("--batch-size", -4),
                                        ("--ray-actors", -1)])
@pytest.mark.parametrize("ray", [False, True], ids=["single", "ray"])
def test_a_number_out_of_range_is_one_line_naming_the_flag(tiny_bundle, tmp_path, capsys, flag, value, ray):
    """Checked before any work starts: `--ray` with --batch-size 0 used to fail inside each actor,
    with Ray's traceback, and without it the error named the Python argument (batch_size=0)."""
    src = write_input(tmp_path / "in.jsonl", TEXTS)
    extra = ["--ray", "local"] if ray else []
    assert embed(tiny_bundle, src, "-o", tmp_path / "out", "--column", "body", flag, value, *extra) == 2
    assert f"{flag} must be at least" in one_error(capsys)
    assert not (tmp_path / "out").exists()


def test_unreadable_rows_are_skipped_and_counted_or_stop_the_job(tiny_bundle, encoder, tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    lines = [json.dumps({"body": t}) for t in TEXTS[:5]]
    lines[1] = "{not json"
    lines[3] = json.dumps({"body": None})
    src.write_bytes(("\n".join(lines) + "\n\n").encode() + b'{"body": "caf\xe9"}\n' + b'[1, 2]\n')
    assert embed(tiny_bundle, src, "-o", tmp_path / "out", "--column", "body", "--shard-size", 2) == 0
    ids, vectors = read_output(tmp_path / "out")
    assert ids == [0, 2, 4]  # row numbers: the bad rows are counted, the blank line is no row
    np.testing.assert_allclose(vectors, encoder.encode([TEXTS[0], TEXTS[2], TEXTS[4]]), rtol=1e-5, atol=1e-6)
    progress = json.loads((tmp_path / "out" / PROGRESS).read_text())
    assert (progress["embedded"], progress["skipped"], progress["done"]) == (3, 4, True)
    reasons = {r["row"]: r["error"] for r in progress["skipped_rows"]}
    assert reasons[1].startswith("not JSON") and "null" in reasons[3]
    assert reasons[5].startswith("not UTF-8") and "not an object" in reasons[6]
    capsys.readouterr()
    assert embed(tiny_bundle, src, "-o", tmp_path / "strict", "--column", "body", "--on-bad-row", "fail") == 2
    assert "row 1: not JSON" in one_error(capsys)


def test_long_texts_cut_or_stop(tiny_bundle, encoder, tmp_path, capsys):
    long = " ".join(["dog"] * 300)
    src = write_input(tmp_path / "in.jsonl", ["a dog", long])
    assert embed(tiny_bundle, src, "-o", tmp_path / "out", "--column", "body") == 0
    np.testing.assert_allclose(read_output(tmp_path / "out")[1], encoder.encode(["a dog", long]), atol=1e-6)
    assert json.loads((tmp_path / "out" / PROGRESS).read_text())["windowed"] == 1
    cut = tmp_path / "cut"
    assert embed(tiny_bundle, src, "-o", cut, "--column", "body", "--long-texts", "truncate") == 0
    assert json.loads((cut / PROGRESS).read_text())["truncated"] == 1
    np.testing.assert_allclose(read_output(cut)[1][1], encoder.encode(" ".join(["dog"] * 128)), atol=1e-6)
    strict = tmp_path / "strict"
    capsys.readouterr()
    assert embed(tiny_bundle, src, "-o", strict, "--column", "body", "--long-texts", "error") == 2
    assert "row 1: 300 tokens, at most 128" in one_error(capsys)


def test_a_full_disk_is_one_line_and_the_job_goes_on_after_it(tiny_bundle, encoder, tmp_path, capsys,
                                                               monkeypatch):
    """The third shard's write fails with ENOSPC (as a full disk does): one line that says what is
    safe; the same command afterwards finishes with every row once."""
    from disan.embed import shards

    src = write_input(tmp_path / "in.jsonl", TEXTS)
    real, calls = shards.atomic_write, []

    def full_disk(path, write):
        calls.append(path.name)
        if path.name == "part-000002.parquet":
            with open(path.with_name(path.name + ".tmp"), "wb") as fh:
                fh.write(b"half a shard")  # what a write that runs out of room leaves
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real(path, write)

    monkeypatch.setattr(shards, "atomic_write", full_disk)
    out = tmp_path / "out"
    flags = ["--column", "body", "--id-column", "key", "--shard-size", 10]
    assert embed(tiny_bundle, src, "-o", out, *flags) == 2
    line = one_error(capsys)
    assert "no space left on device" in line and "20 rows committed in 2 shards" in line and "again" in line
    monkeypatch.setattr(shards, "atomic_write", real)
    assert embed(tiny_bundle, src, "-o", out, *flags) == 0
    ids, vectors = read_output(out)
    assert ids == [f"doc-{i}" for i in range(len(TEXTS))]
    np.testing.assert_allclose(vectors, encoder.encode(TEXTS), rtol=1e-5, atol=1e-6)
    assert not list(out.glob("*.tmp"))


def test_output_of_another_job_is_not_mixed_in(tiny_bundle, tmp_path, capsys):
    src = write_input(tmp_path / "in.jsonl", TEXTS)
    out = tmp_path / "out"
    assert embed(tiny_bundle, src, "-o", out, "--column", "body") == 0
    capsys.readouterr()
    assert embed(tiny_bundle, src, "-o", out, "--column", "body", "--normalize") == 2
    assert "holds another job (it differs in normalize)" in one_error(capsys)
    assert embed(tiny_bundle, src, "-o", out, "--column", "body", "--normalize", "--overwrite") == 0
    assert np.allclose(np.linalg.norm(read_output(out)[1], axis=1), 1.0, atol=1e-5)
    capsys.readouterr()
    assert embed(tiny_bundle, src, "-o", out, "--column", "body", "--normalize") == 0
    assert "is complete" in capsys.readouterr().err  # the same job again: nothing to do
    assert embed(tiny_bundle, src, "-o", out, "--column", "body", "--normalize", "--overwrite") == 0
    assert f"{len(TEXTS)} rows embedded" in capsys.readouterr().err  # --overwrite: from the start


def test_a_job_goes_on_across_a_re_export_but_not_across_other_vectors(bundle_copy, tmp_path, capsys):
    # The job is tied to what the embed route computes, not to when the bundle was exported.
    src = write_input(tmp_path / "in.jsonl", TEXTS)
    out = tmp_path / "out"
    assert embed(bundle_copy, src, "-o", out, "--column", "body") == 0
    manifest = load_manifest(bundle_copy)
    write_manifest(bundle_copy, {**manifest, "created": "2099-01-01T00:00:00Z"})  # the same weights again
    capsys.readouterr()
    assert embed(bundle_copy, src, "-o", out, "--column", "body") == 0
    assert "is complete" in capsys.readouterr().err
    fingerprints = manifest["route_fingerprints"]
    fingerprints["embed"] = {k: "0" * 64 for k in fingerprints["embed"]}  # other vectors
    write_manifest(bundle_copy, manifest)
    assert embed(bundle_copy, src, "-o", out, "--column", "body") == 2
    assert "holds another job (it differs in embed_fingerprint)" in one_error(capsys)


def test_resumes_after_sigkill_with_every_row_once(tiny_bundle, encoder, tmp_path):
    """A real `kill -9` of a running `disan embed` (one sentence per onnxruntime call keeps it busy
    long enough), then the same command: every row once, the vectors of an uninterrupted run."""
    texts = sentences(6000, seed=1)
    src = write_input(tmp_path / "in.jsonl", texts)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "disan.cli", "embed", str(src), "-o", str(out), "--column", "body",
           "--id-column", "key", "--bundle", str(tiny_bundle), "--shard-size", "200", "--batch-size", "1",
           "--no-progress", "--providers", "cpu"]
    proc = subprocess.Popen(cmd, cwd=REPO, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    shards = 0
    while proc.poll() is None and time.monotonic() < deadline:
        progress = out / PROGRESS
        shards = json.loads(progress.read_text())["shards"] if progress.exists() else 0
        if shards >= 3:
            break
        time.sleep(0.01)
    assert proc.poll() is None, f"finished before it could be killed: {proc.stderr.read()}"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    killed_at = json.loads((out / PROGRESS).read_text())
    assert not killed_at["done"] and 0 < killed_at["rows"] < len(texts)
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    ids, vectors = read_output(out)
    assert ids == [f"doc-{i}" for i in range(len(texts))]  # each once, in order
    np.testing.assert_allclose(vectors, encoder.encode(texts), rtol=1e-5, atol=1e-6)
