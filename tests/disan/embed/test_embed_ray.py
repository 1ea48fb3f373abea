"""`disan embed --ray local`: Ray Data gives the single-process path's vectors and row ids, and an
actor killed mid-run loses and duplicates no row. A local Ray instance of 2 CPUs, a tiny bundle."""

from __future__ import annotations

import argparse
import gzip
import os
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
ray = pytest.importorskip("ray", reason="the `ray` extra is not installed (pip install '.[ray]')")
pytest.importorskip("ray.data", reason="the `ray` extra is not installed (pip install '.[ray]')")

from support_files import write_awkward_corpus  # noqa: E402

import disan  # noqa: E402
from disan.cli import main  # noqa: E402
from disan.embed.cli import add_arguments, config  # noqa: E402
from disan.embed.config import EmbedConfig  # noqa: E402
from disan.embed.on_ray import EmbedActor, actor_options, bundle_files, run_ray  # noqa: E402
from disan.embed.shards import read_output, read_sparse  # noqa: E402

WORDS = "a man woman dog cat is playing reading the guitar book in park street good bad movie".split()
ROWS = 300


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    rng = np.random.default_rng(3)
    texts = [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 25)))) for _ in range(ROWS)]
    texts[17] = None  # an unreadable row: skipped by both paths
    path = tmp_path_factory.mktemp("corpus") / "in.parquet"
    pq.write_table(pa.table({"text": texts, "key": [f"k{i}" for i in range(ROWS)]}), path, row_group_size=90)
    return path


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    """One local instance for the module (run_ray leaves a Ray it did not start running)."""
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False,
             runtime_env={"py_modules": [disan]})
    yield
    ray.shutdown()


def by_id(out: Path) -> dict:
    ids, vectors = read_output(out, "parquet")
    assert len(ids) == len(set(ids)), "a row was written twice"
    return dict(zip(ids, vectors, strict=True))


def args_for(*argv: str) -> EmbedConfig:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return config(parser.parse_args(list(argv)))


@pytest.mark.parametrize("id_column", [None, "key"])
def test_ray_gives_the_single_process_vectors_and_ids(tiny_bundle, corpus, tmp_path, id_column):
    flags = ["--bundle", str(tiny_bundle), "--shard-size", "40", "--no-progress", "--normalize",
             *(["--id-column", id_column] if id_column else [])]
    assert main(["embed", str(corpus), "-o", str(tmp_path / "single"), *flags]) == 0
    assert main(["embed", str(corpus), "-o", str(tmp_path / "ray"), "--ray", "local", "--ray-cpus", "2",
                 *flags]) == 0
    single, distributed = by_id(tmp_path / "single"), by_id(tmp_path / "ray")
    assert sorted(distributed, key=str) == sorted(single, key=str) and len(single) == ROWS - 1
    for key, vector in single.items():
        np.testing.assert_allclose(distributed[key], vector, rtol=1e-5, atol=1e-6)


def test_ray_writes_the_single_process_sparse_vectors(sparse_bundle, corpus, tmp_path):
    flags = ["--bundle", str(sparse_bundle), "--shard-size", "40", "--no-progress", "--sparse",
             "--id-column", "key"]
    assert main(["embed", str(corpus), "-o", str(tmp_path / "single"), *flags]) == 0
    assert main(["embed", str(corpus), "-o", str(tmp_path / "ray"), "--ray", "local", "--ray-cpus", "2",
                 *flags]) == 0
    single, distributed = ({key: pair for key, pair in zip(read_output(out, "parquet")[0],
                                                           read_sparse(out, "parquet"), strict=True)}
                           for out in (tmp_path / "single", tmp_path / "ray"))
    assert sorted(distributed) == sorted(single) and len(single) == ROWS - 1
    for key, (idx, val) in single.items():
        np.testing.assert_array_equal(distributed[key][0], idx)
        np.testing.assert_allclose(distributed[key][1], val, rtol=1e-6)


def least_cosine(a: dict, b: dict) -> float:
    """The smallest cosine between two outputs' vectors of the same id."""
    x, y = (np.stack([v[k] for k in sorted(a, key=str)]) for v in (a, b))
    return float(((x * y).sum(-1) / (np.linalg.norm(x, axis=-1) * np.linalg.norm(y, axis=-1))).min())


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".txt"])
def test_ray_reads_jsonl_csv_and_txt_as_the_single_process_path_does(tiny_bundle, corpus, tmp_path, suffix):
    """`--ray` over JSONL, CSV and TXT (it used to refuse all but Parquet): the single-process
    path's ids and vectors, through what each reader does its own way (blank lines are no rows,
    unreadable rows are skipped but numbered, CSV ids stay strings, a raw U+2028 splits no line).
    JSONL also equals the Parquet file of the same rows (the issue's goal: the same vectors and ids
    from JSONL as from Parquet)."""
    texts = pq.read_table(corpus).column("text").to_pylist()
    texts = [t for t in texts if t is not None][:60]
    src = tmp_path / f"in{suffix}"
    flags, rows = write_awkward_corpus(src, texts)
    flags += ["--bundle", str(tiny_bundle), "--shard-size", "7", "--no-progress"]
    assert main(["embed", str(src), "-o", str(tmp_path / "single"), *flags]) == 0
    assert main(["embed", str(src), "-o", str(tmp_path / "ray"), "--ray", "local", *flags]) == 0
    single, distributed = by_id(tmp_path / "single"), by_id(tmp_path / "ray")
    assert sorted(distributed, key=str) == sorted(single, key=str)
    assert len(single) == sum(r is not None for r in rows) < len(rows)
    assert least_cosine(single, distributed) >= 0.9999
    if suffix == ".csv":
        assert all(isinstance(k, str) and len(k) == 3 for k in distributed)  # "007", not 7
    if suffix == ".jsonl":  # the same rows as Parquet (an unreadable row a null text)
        pq.write_table(pa.table({"text": rows}), tmp_path / "same.parquet")
        assert main(["embed", str(tmp_path / "same.parquet"), "-o", str(tmp_path / "parquet"), *flags]) == 0
        parquet = by_id(tmp_path / "parquet")
        assert sorted(parquet) == sorted(distributed) and least_cosine(parquet, distributed) >= 0.9999


def test_what_ray_cannot_cut_is_refused_in_one_line(tiny_bundle, tmp_path, capsys):
    """A gzip line file cannot be cut by byte offset, a directory or a URI is read as Parquet:
    one line naming it, exit 2, before Ray runs anything."""
    gz = tmp_path / "in.jsonl.gz"
    gz.write_bytes(gzip.compress(b'{"text": "a dog"}\n'))
    (tmp_path / "dir").mkdir()
    refused = ((gz, [], "gzip"), (tmp_path / "dir", ["--input-format", "csv"], "as Parquet"))
    for source, extra, says in refused:
        out = ["-o", str(tmp_path / "out"), "--bundle", str(tiny_bundle), "--ray", "local"]
        assert main(["embed", str(source), *out, *extra]) == 2
        lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("disan embed: error: ") and says in lines[0], lines
        assert not (tmp_path / "out").exists()


def test_an_actor_leaves_no_copy_of_the_bundle_behind(tiny_bundle, corpus, tmp_path, monkeypatch):
    """Each actor writes the bundle it was sent to a folder to load it from. The folder goes once
    the bundle is loaded, so neither a finished job nor a killed actor leaves a copy (a real
    bundle's 62 MB per actor per job) in the node's temporary directory."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    args = args_for(str(corpus), "-o", str(tmp_path / "out"), "--providers", "cpu")
    options = actor_options(args, threads=1)
    actor = EmbedActor(bundle_files(tiny_bundle), str(corpus), "text", None, options)
    assert list(tmp_path.iterdir()) == []
    table = actor.embed_piece(str(corpus), 0, 0, 10, 0)  # and it embeds without the folder
    assert table.num_rows == 10 and len(table.column("embedding")[0]) == actor.encoder.dim


class CrashOnce(EmbedActor):
    """An actor whose process dies (as a killed or OOM-killed worker does) on the first piece past
    row 100, once: the marker file says it already happened."""

    marker = ""

    def __call__(self, batch):
        if int(batch["first"][0]) >= 100 and not os.path.exists(self.marker):
            Path(self.marker).write_text(str(os.getpid()))
            os._exit(1)
        return super().__call__(batch)


def test_a_killed_actor_loses_and_duplicates_no_row(tiny_bundle, corpus, tmp_path):
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/
    CrashOnce.marker = str(tmp_path / "crashed")
    args = args_for(str(corpus), "-o", str(tmp_path / "ray"), "--bundle", str(tiny_bundle), "--ray", "local",
                    "--shard-size", "30", "--ray-actors", "2", "--id-column", "key")
    assert run_ray(args, actor=CrashOnce) == 0
    assert Path(CrashOnce.marker).exists(), "no actor was killed"
    got = by_id(tmp_path / "ray")
    assert sorted(got) == sorted(f"k{i}" for i in range(ROWS) if i != 17)


def test_a_refused_row_stops_the_job_in_one_line(tiny_bundle, corpus, tmp_path, capsys):
    """--on-bad-row fail: the row's reason, not Ray's traceback, is the CLI's error line."""
    argv = ["embed", str(corpus), "-o", str(tmp_path / "ray"), "--bundle", str(tiny_bundle), "--ray", "local",
            "--shard-size", "40", "--on-bad-row", "fail"]
    assert main(argv) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("disan embed: error: row 17: 'text' is missing or null (Ray job stopped"), last
