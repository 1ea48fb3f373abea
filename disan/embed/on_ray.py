"""`disan embed --ray ADDRESS`: the same job on Ray Data, for corpora past one machine (the `ray` extra).

The driver reads only the Parquet metadata and cuts the input into pieces of at most
`--shard-size` rows (file, row group, slice), each carrying the row number of its first row. A Ray
Data pipeline maps the pieces over an actor pool (`map_batches` with an `ActorPoolStrategy`): each
actor loads the bundle once (one onnxruntime session set, a GPU per actor where the cluster has
GPUs) and turns a piece into a table of `id` and `embedding`, the same schema and vectors as the
single-process path (both embed through `disan.Encoder`). `write_parquet` writes the output as
shards. The bundle travels through the object store and the `disan` package as a `py_modules`
runtime env, so workers need the `embed` extra's packages but neither the bundle nor this checkout.

Fault tolerance is Ray Data's: an actor that dies is restarted and its pieces run again (actors
get `max_restarts=-1`, `max_task_retries=-1`); a piece's output is a pure function of the piece,
so a retry neither loses nor duplicates rows. A driver that dies loses the run (run it again with
--overwrite); the single-process path is the resumable one.

Input and output are paths every worker can reach: local paths on one machine (`--ray local`),
shared storage or object-store URIs (s3://, gs://) on a cluster (docs/corpus.md).
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import disan
from disan.embed.inputs import CorpusError
from disan.optional import require
from disan.runtime.encoder import Encoder, TextTooLong, normalized

ray = require("ray", "ray")
ray_data = require("ray.data", "ray")
pa = require("pyarrow", "embed")
pq = require("pyarrow.parquet", "embed")
pafs = require("pyarrow.fs", "embed")


def parquet_files(source: str) -> tuple[Any, list[str]]:
    """(filesystem, Parquet files in name order) of a file, a directory or a URI."""
    fs, path = pafs.FileSystem.from_uri(source) if "://" in source else (pafs.LocalFileSystem(),
                                                                         str(Path(source).resolve()))
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        raise CorpusError(f"{source}: no such file or directory")
    if info.type == pafs.FileType.Directory:
        files = sorted(f.path for f in fs.get_file_info(pafs.FileSelector(path, recursive=True))
                       if f.type == pafs.FileType.File and f.path.endswith(".parquet"))
        if not files:
            raise CorpusError(f"{source}: no .parquet files in it")
        return fs, files
    return fs, [path]


def pieces(source: str, column: str, id_column: str | None, size: int) -> list[dict[str, Any]]:
    """The job cut into pieces of at most `size` rows, in input order, each with its first row's
    number; checks the columns once, here, before any worker starts."""
    fs, files = parquet_files(source)
    out, first = [], 0
    for file in files:
        with fs.open_input_file(file) as fh:
            meta = pq.ParquetFile(fh).metadata
            names = meta.schema.to_arrow_schema().names
        for name in (column, id_column):
            if name is not None and name not in names:
                raise CorpusError(f"{file}: no column {name!r} (the file has {', '.join(map(repr, names))})")
        for g in range(meta.num_row_groups):
            rows = meta.row_group(g).num_rows
            for start in range(0, rows, size):
                length = min(size, rows - start)
                out.append({"file": file, "row_group": g, "start": start, "length": length, "first": first})
                first += length
    return out


def bundle_files(bundle: Path) -> dict[str, bytes]:
    """A bundle's files (manifest, vocab, graphs, weights) to ship through the object store."""
    return {p.name: p.read_bytes() for p in bundle.iterdir() if p.is_file() and not p.name.endswith(".md")}


class EmbedActor:
    """One Ray actor: the bundle loaded once, pieces in, `id` + `embedding` tables out."""

    def __init__(self, bundle: Any, source: str, column: str, id_column: str | None, options: dict[str, Any]):
        # The driver put the bundle in the object store (Ray resolves a top-level reference itself).
        files = bundle if isinstance(bundle, dict) else ray.get(bundle)
        # Loading reads every graph, the vocabulary and the weights, and nothing reads the folder
        # afterwards, so it goes at once: no copy is left on the node, even by a killed actor.
        # (ignore_cleanup_errors: Windows cannot delete a file onnxruntime still maps.)
        with tempfile.TemporaryDirectory(prefix="disan-bundle-", ignore_cleanup_errors=True) as folder:
            for name, data in files.items():
                Path(folder, name).write_bytes(data)
            self.encoder = Encoder(folder, providers=options["providers"], variant=options["variant"],
                                   threads=options["threads"], long_texts=options["long_texts"],
                                   overlap=options["overlap"])
        self.fs = parquet_files(source)[0]
        self.column, self.id_column, self.options = column, id_column, options
        self._group: tuple[tuple[str, int], Any] | None = None  # the last row group read (pieces share it)

    def rows(self, file: str, group: int, start: int, length: int) -> Any:
        if self._group is None or self._group[0] != (file, group):
            columns = [self.column] + ([self.id_column] if self.id_column not in (None, self.column) else [])
            with self.fs.open_input_file(file) as fh:
                self._group = ((file, group), pq.ParquetFile(fh).read_row_group(group, columns=columns))
        return self._group[1].slice(start, length)

    def __call__(self, batch: dict[str, np.ndarray]) -> Any:
        tables = [self.embed_piece(*(batch[k][i] for k in ("file", "row_group", "start", "length", "first")))
                  for i in range(len(batch["file"]))]
        return pa.concat_tables(tables)

    def embed_piece(self, file: str, group: int, start: int, length: int, first: int) -> Any:
        table = self.rows(str(file), int(group), int(start), int(length))
        texts = table.column(self.column).to_pylist()
        numbers = range(int(first), int(first) + len(texts))
        ids = table.column(self.id_column).to_pylist() if self.id_column else list(numbers)
        keep = [i for i, t in enumerate(texts) if isinstance(t, str)]
        if len(keep) < len(texts) and self.options["on_bad_row"] == "fail":
            bad = next(i for i, t in enumerate(texts) if not isinstance(t, str))
            raise CorpusError(f"row {numbers[bad]}: {self.column!r} is {texts[bad]!r}, not text")
        prepared = self.encoder.prepare([texts[i] for i in keep], [numbers[i] for i in keep])
        vectors = self.encoder.embed_prepared(prepared, self.options["batch_size"])
        if self.options["normalize"]:
            vectors = normalized(vectors)
        dim = self.encoder.dim
        embedding = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1), pa.float32()), dim)
        return pa.table({"id": pa.array([ids[i] for i in keep]), "embedding": embedding})


def actor_options(args: argparse.Namespace, threads: int) -> dict[str, Any]:
    """What each actor needs of the command line (`EmbedActor`'s `options`)."""
    return {"providers": args.providers, "variant": args.variant, "threads": threads,
            "long_texts": args.long_texts, "overlap": args.window_overlap, "batch_size": args.batch_size,
            "normalize": args.normalize, "on_bad_row": args.on_bad_row}


def actor_layout(args: argparse.Namespace) -> tuple[int, dict[str, float], int]:
    """(actors, resources per actor, onnxruntime threads per actor): a GPU each where the cluster
    has GPUs; else one actor per 2 CPUs, each reserving one (so reads and writes find a free CPU)
    and running 2 onnxruntime threads (--threads overrides), not one per core of its node each."""
    resources = ray.cluster_resources()
    gpus, cpus = int(resources.get("GPU", 0)), int(resources.get("CPU", 1))
    if gpus and args.providers != "cpu":
        return args.ray_actors or gpus, {"num_gpus": 1.0, "num_cpus": 1.0}, args.threads
    return args.ray_actors or max(1, cpus // 2), {"num_cpus": 1.0}, args.threads or 2


def connect(args: argparse.Namespace) -> bool:
    """Start a local Ray instance (`local`) or join a cluster; ship this `disan` to the workers.
    False when this process is already connected (a caller's Ray, left as it is)."""
    if ray.is_initialized():
        return False
    env = {"py_modules": [disan]}  # the workers run the driver's disan, whatever their image holds
    if args.ray == "local":
        ray.init(num_cpus=args.ray_cpus or None, include_dashboard=False, runtime_env=env,
                 configure_logging=False, log_to_driver=False)
    else:
        ray.init(address=args.ray, runtime_env=env, log_to_driver=False)
    return True


def _our_error(exc: BaseException) -> str | None:
    """The message of the CorpusError / TextTooLong an actor raised. Ray Data (2.60) hands the
    driver a UserCodeException without the original object, only its traceback in the text."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, CorpusError | TextTooLong):
            return str(cause)
        cause = getattr(cause, "cause", None) or cause.__cause__ or cause.__context__
    found = re.findall(r"(?:CorpusError|TextTooLong): (.+)", str(exc))
    return found[-1].strip() if found else None


def run_ray(args: argparse.Namespace, actor: type = EmbedActor) -> int:
    """`disan embed --ray`: returns the exit status (the CLI prints the error line on a raise)."""
    source, out = str(args.input), str(args.output)
    if not (source.endswith(".parquet") or Path(source).is_dir() or "://" in source):
        raise CorpusError(f"{source}: --ray reads Parquet (a file or a directory of them); convert it, "
                          "or run without --ray")
    if (args.output_format or "parquet") != "parquet":
        raise CorpusError("--ray writes Parquet (--output-format parquet); npy and jsonl are single-process")
    if "://" not in out and Path(out).exists() and any(Path(out).iterdir()) and not args.overwrite:
        raise CorpusError(f"{out} is not empty: use another -o, or --overwrite")
    work = pieces(source, args.column, args.id_column, args.shard_size)
    started = time.perf_counter()
    ours = connect(args)
    try:
        actors, resources, threads = actor_layout(args)
        options = actor_options(args, threads)
        bundle = ray.put(bundle_files(args.bundle))
        ds = ray_data.from_items(work, override_num_blocks=len(work))
        ds = ds.map_batches(actor, batch_size=1, compute=ray_data.ActorPoolStrategy(size=actors),
                            fn_constructor_args=(bundle, source, args.column, args.id_column, options),
                            **resources)
        mode = ray_data.SaveMode.OVERWRITE if args.overwrite else ray_data.SaveMode.APPEND
        try:
            ds.write_parquet(out, mode=mode)
        except Exception as exc:
            # A row the job refuses (--on-bad-row fail, --long-texts error) arrives wrapped in Ray's
            # task errors: the CLI's one line is the row's, not Ray's traceback.
            ours = _our_error(exc)
            if ours is None:
                raise
            raise CorpusError(f"{ours} (Ray job stopped; rows written so far are in {out})") from None
    finally:
        if ours:
            ray.shutdown()
    rows = sum(p["length"] for p in work)
    seconds = time.perf_counter() - started
    print(f"disan embed: {rows} rows in {len(work)} pieces embedded by {actors} Ray actors into {out} in "
          f"{seconds:.1f} s ({rows / seconds:.0f} sentences/s including start-up)", file=sys.stderr)
    return 0

