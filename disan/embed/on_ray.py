"""`disan embed --ray ADDRESS`: the same job on Ray Data, for corpora past one machine (the `ray` extra).

The driver cuts the input into pieces of at most `--shard-size` rows, each carrying the row number
of its first row: for Parquet from the metadata alone (file, row group, slice); for JSONL, CSV and
TXT from one scan of the lines (CSV: the records) that notes the byte offset where each piece
begins (`disan.embed.inputs.cut`). A Ray Data pipeline maps the pieces over an actor pool
(`map_batches` with an `ActorPoolStrategy`): each actor loads the bundle once (one onnxruntime
session set, a GPU per actor where the cluster has GPUs), reads its pieces with the single-process
path's readers (`disan.embed.inputs`: a line file's piece is a resumed read from its offset), and
turns a piece into a table of `id` and `embedding`. So the rows, their numbers and ids, the
unreadable rows and the vectors are the single-process path's, whatever the format: both read
through `disan.embed.inputs` and embed through `disan.Encoder`. `write_parquet` writes the output
as shards. The bundle travels through the object store and the `disan` package as a `py_modules`
runtime env, so workers need the `embed` extra's packages but neither the bundle nor this checkout.

Why not `ray.data.read_json` / `read_csv` / `read_text` for the line formats: they number no rows
(an id is the row number unless `--id-column`), and they read rows differently from `disan embed`:
`read_text` decodes a whole file at once (one byte that is not UTF-8 fails the job, where
`disan embed` skips that row) and splits lines at U+2028 and the other `str.splitlines` breaks
(which JSON strings may hold raw); `read_json` and `read_csv` infer column types (a CSV id `007`
becomes 7) and fail the whole read at a malformed line, where `disan embed` skips and counts it.

Fault tolerance is Ray Data's: an actor that dies is restarted and its pieces run again (actors
get `max_restarts=-1`, `max_task_retries=-1`); a piece's output is a pure function of the piece,
so a retry neither loses nor duplicates rows. A driver that dies loses the run (run it again with
--overwrite); the single-process path is the resumable one.

Input and output are paths every worker can reach: local paths on one machine (`--ray local`),
shared storage or (Parquet) object-store URIs (s3://, gs://) on a cluster (docs/corpus.md). A
gzip JSONL, CSV or TXT file cannot be cut by byte offset: `--ray` refuses it in one line.
"""

from __future__ import annotations

import itertools
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import disan
from disan.embed.config import EmbedConfig
from disan.embed.inputs import CorpusError, Position, Row, checked_row, cut, detect_format, read_rows
from disan.embed.shards import id_array, sparse_columns
from disan.optional import require
from disan.runtime.encoder import Encoder, TextTooLong, prefixed

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
    """A Parquet job cut into pieces of at most `size` rows, in input order, each with its first
    row's number; checks the columns once, here, before any worker starts."""
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
                out.append({"file": file, "row_group": g, "start": start, "offset": -1, "length": length,
                            "first": first})
                first += length
    return out


def input_format(source: str, given: str | None) -> str:
    """The input's format: Parquet for a directory or a URI, else `--input-format` or the suffix
    (as without --ray); a combination --ray cannot read is a one-line CorpusError."""
    if "://" in source or Path(source).is_dir():
        fmt = given or "parquet"
        if fmt != "parquet":
            where = "a URI" if "://" in source else "a directory"
            raise CorpusError(f"{source}: --ray reads {where} as Parquet; a {fmt} input must be one local "
                              "or shared file")
        return fmt
    return detect_format(Path(source), given)


def line_pieces(source: str, fmt: str, column: str, id_column: str | None,
                size: int) -> list[dict[str, Any]]:
    """A JSONL, CSV or TXT job cut into pieces of at most `size` rows (one scan of the file),
    each with the byte offset it starts at and its first row's number. The columns are checked
    here, on the first row, as the single-process path checks them, before any worker starts."""
    path = Path(source).absolute()  # not resolved: the name (.tsv, .gz) says how to read it, as without --ray
    if not path.is_file():
        raise CorpusError(f"{source}: no such file")
    if path.suffix.lower() == ".gz":
        raise CorpusError(f"{source}: --ray cuts a {fmt} file among its workers by byte offset, which a "
                          "gzip file does not allow; gunzip it, or run without --ray")
    next(iter(read_rows(path, fmt, column, id_column)), None)  # a missing column: one line, now
    return [{"file": str(path), "row_group": -1, "start": 0, "offset": where.offset, "length": length,
             "first": where.rows} for where, length in cut(path, fmt, size)]


def bundle_files(bundle: Path) -> dict[str, bytes]:
    """A bundle's files (manifest, vocab, graphs, weights) to ship through the object store."""
    return {p.name: p.read_bytes() for p in bundle.iterdir() if p.is_file() and not p.name.endswith(".md")}


PIECE = ("file", "row_group", "start", "offset", "length", "first")


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
        self.format = options.get("input_format", "parquet")
        self.fs = parquet_files(source)[0] if self.format == "parquet" else None
        self.column, self.id_column, self.options = column, id_column, options
        self._group: tuple[tuple[str, int], Any] | None = None  # the last row group read (pieces share it)

    def rows(self, file: str, group: int, start: int, length: int) -> Any:
        if self._group is None or self._group[0] != (file, group):
            columns = [self.column] + ([self.id_column] if self.id_column not in (None, self.column) else [])
            with self.fs.open_input_file(file) as fh:
                self._group = ((file, group), pq.ParquetFile(fh).read_row_group(group, columns=columns))
        return self._group[1].slice(start, length)

    def read_piece(self, file: str, group: int, start: int, length: int, first: int,
                   offset: int) -> list[Row]:
        """A piece's rows, as the single-process path reads them (`disan.embed.inputs`)."""
        if self.format != "parquet":  # a resumed read from the piece's offset, `length` rows of it
            rows = read_rows(Path(file), self.format, self.column, self.id_column,
                             start=Position(first, offset))
            return list(itertools.islice(rows, length))
        table = self.rows(file, group, start, length)
        texts = table.column(self.column).to_pylist()
        ids = table.column(self.id_column).to_pylist() if self.id_column else None
        return [checked_row(first + i, text, ids[i] if ids is not None else first + i, self.column,
                            self.id_column) for i, text in enumerate(texts)]

    def __call__(self, batch: dict[str, np.ndarray]) -> Any:
        tables = [self.embed_piece(**{k: batch[k][i] for k in PIECE}) for i in range(len(batch["file"]))]
        return pa.concat_tables(tables)

    def embed_piece(self, file: str, row_group: int, start: int, length: int, first: int,
                    offset: int = -1) -> Any:
        rows = self.read_piece(str(file), int(row_group), int(start), int(length), int(first), int(offset))
        good = [r for r in rows if r.error is None]
        if len(good) < len(rows) and self.options["on_bad_row"] == "fail":
            bad = next(r for r in rows if r.error is not None)
            raise CorpusError(f"row {bad.number}: {bad.error}")
        prepared = self.encoder.prepare([r.text for r in good], [r.number for r in good])
        size = self.options.get("dimensions")
        vectors = prefixed(self.encoder.embed_prepared(prepared, self.options["batch_size"]), size,
                           self.options["normalize"], self.encoder.runtime.projection)
        dim = size or self.encoder.dim
        embedding = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1), pa.float32()), dim)
        # The ids as a single-process shard holds them (integers int64; any string makes them strings).
        columns = {"id": pa.array(id_array([r.id for r in good])), "embedding": embedding}
        if self.options.get("sparse"):
            columns |= sparse_columns(self.encoder.sparse_prepared(prepared))
        return pa.table(columns)


def actor_options(cfg: EmbedConfig, threads: int) -> dict[str, Any]:
    """What each actor needs of the command line (`EmbedActor`'s `options`)."""
    return {"providers": cfg.providers, "variant": cfg.variant, "threads": threads,
            "input_format": input_format(str(cfg.input), cfg.input_format), "long_texts": cfg.long_texts,
            "overlap": cfg.window_overlap, "batch_size": cfg.batch_size, "normalize": cfg.normalize,
            "dimensions": cfg.dimensions, "sparse": cfg.sparse,
            "on_bad_row": cfg.on_bad_row}


def actor_layout(cfg: EmbedConfig) -> tuple[int, dict[str, float], int]:
    """(actors, resources per actor, onnxruntime threads per actor): a GPU each where the cluster
    has GPUs; else one actor per 2 CPUs, each reserving one (so reads and writes find a free CPU)
    and running 2 onnxruntime threads (--threads overrides), not one per core of its node each."""
    resources = ray.cluster_resources()
    gpus, cpus = int(resources.get("GPU", 0)), int(resources.get("CPU", 1))
    if gpus and cfg.providers != "cpu":
        return cfg.ray_actors or gpus, {"num_gpus": 1.0, "num_cpus": 1.0}, cfg.threads
    return cfg.ray_actors or max(1, cpus // 2), {"num_cpus": 1.0}, cfg.threads or 2


def connect(cfg: EmbedConfig) -> bool:
    """Start a local Ray instance (`local`) or join a cluster; ship this `disan` to the workers.
    False when this process is already connected (a caller's Ray, left as it is)."""
    if ray.is_initialized():
        return False
    env = {"py_modules": [disan]}  # the workers run the driver's disan, whatever their image holds
    if cfg.ray == "local":
        ray.init(num_cpus=cfg.ray_cpus or None, include_dashboard=False, runtime_env=env,
                 configure_logging=False, log_to_driver=False)
    else:
        ray.init(address=cfg.ray, runtime_env=env, log_to_driver=False)
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


def run_ray(cfg: EmbedConfig, actor: type = EmbedActor) -> int:
    """`disan embed --ray`: returns the exit status (the CLI prints the error line on a raise)."""
    source, out = str(cfg.input), str(cfg.output)
    fmt = input_format(source, cfg.input_format)
    if (cfg.output_format or "parquet") != "parquet":
        raise CorpusError("--ray writes Parquet (--output-format parquet); npy and jsonl are single-process")
    if "://" not in out and Path(out).exists() and any(Path(out).iterdir()) and not cfg.overwrite:
        raise CorpusError(f"{out} is not empty: use another -o, or --overwrite")
    if fmt == "parquet":
        work = pieces(source, cfg.column, cfg.id_column, cfg.shard_size)
    else:
        work = line_pieces(source, fmt, cfg.column, cfg.id_column, cfg.shard_size)
    if not work:  # no rows: nothing for Ray to do (and Ray Data makes no dataset of no blocks)
        if "://" not in out:
            Path(out).mkdir(parents=True, exist_ok=True)
        print(f"disan embed: {source} has no rows; nothing written to {out}", file=sys.stderr)
        return 0
    started = time.perf_counter()
    ours = connect(cfg)
    try:
        actors, resources, threads = actor_layout(cfg)
        options = actor_options(cfg, threads)
        bundle = ray.put(bundle_files(cfg.bundle))
        ds = ray_data.from_items(work, override_num_blocks=len(work))
        ds = ds.map_batches(actor, batch_size=1, compute=ray_data.ActorPoolStrategy(size=actors),
                            fn_constructor_args=(bundle, source, cfg.column, cfg.id_column, options),
                            **resources)
        mode = ray_data.SaveMode.OVERWRITE if cfg.overwrite else ray_data.SaveMode.APPEND
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

