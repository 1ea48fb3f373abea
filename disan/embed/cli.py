"""`disan embed INPUT -o OUTPUT`: embed a corpus file, streaming, resumable (TORCH-FREE).

    disan embed corpus.jsonl -o vectors/ --column text --id-column doc_id
    disan embed corpus.parquet -o vectors/ --ray local          # the same job on Ray Data

Reads JSONL / CSV / TXT / Parquet (disan.embed.inputs) `--shard-size` rows at a time, embeds them with
`disan.Encoder` (the service's runtime, provider and batching), and commits each shard to OUTPUT
(disan.embed.shards: Parquet, NPY or JSONL) before moving the progress file past it. Run the same
command again after an interrupt (Ctrl-C, kill -9, a full disk) and it goes on from the last
committed shard: no row is embedded twice or lost. Memory holds one shard, not the corpus.
"""

from __future__ import annotations

import argparse
import errno
import itertools
import sys
import time
from collections.abc import Iterator
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, get_args

from disan.bundle.dimensions import axes_digest, served_size_problem
from disan.bundle.lexical import NO_TABLE, lexical_entry
from disan.bundle.manifest import fingerprints_in_use, load_manifest
from disan.embed.config import EmbedConfig
from disan.embed.inputs import (
    FORMATS,
    CorpusError,
    Position,
    count_rows,
    detect_format,
    file_fingerprint,
    read_rows,
)
from disan.embed.shards import (
    KEEP_SKIPPED,
    OUTPUT_FORMATS,
    PROGRESS,
    Progress,
    clear_uncommitted,
    write_shard,
)
from disan.optional import require
from disan.runtime.encoder import LONG_TEXT_POLICIES, Encoder, TextTooLong, prefixed
from disan.runtime.ort_session import Providers, Variant

_FULL = (errno.ENOSPC, errno.EDQUOT)


class EmbedError(ValueError):
    """A job that stops, in one line (the CLI prints it and exits 2)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `disan embed`."""
    d = EmbedConfig  # the defaults
    parser.add_argument("input",
                        help="JSONL, CSV/TSV, TXT (one text per line) or Parquet; .gz is read")
    parser.add_argument("-o", "--output", required=True,
                        help="output directory: committed shards part-NNNNNN.* and _progress.json")
    parser.add_argument("--column", default=d.column,
                        help="the text column (JSONL key, CSV header, Parquet column)")
    parser.add_argument("--id-column", help="column whose values are the rows' ids (default: the row number)")
    parser.add_argument("--input-format", choices=FORMATS, help="default: from INPUT's suffix")
    parser.add_argument("--output-format", choices=OUTPUT_FORMATS,
                        help="default: OUTPUT's suffix if it names one, else parquet")
    parser.add_argument("--bundle", type=Path, default=d.bundle)
    parser.add_argument("--providers", choices=get_args(Providers), default=d.providers,
                        help="as `disan serve --providers`: auto = CUDA where it really loads, else CPU")
    parser.add_argument("--variant", choices=get_args(Variant), default=d.variant)
    parser.add_argument("--threads", type=int, default=d.threads,
                        help="onnxruntime intra-op threads (0: its choice)")
    parser.add_argument("--batch-size", type=int, default=d.batch_size,
                        help="most sentences per onnxruntime call (default: the service's for the provider)")
    parser.add_argument("--normalize", action="store_true", help="L2-normalise the vectors")
    parser.add_argument("--dimensions", type=int, default=d.dimensions,
                        help="vectors of this size, one the bundle serves (GET /info matryoshka_dims, or any "
                             "up to dimensions_up_to), as "
                             "/embed's `dimensions` makes them (default: the whole vector)")
    parser.add_argument("--sparse", action="store_true",
                        help="also each text's sparse lexical vector, as POST /embed_sparse sends it (for "
                             "hybrid search; the bundle's lexical table): Parquet columns sparse_indices and "
                             "sparse_values, npy part-N.sparse.npz, JSONL `sparse`")
    parser.add_argument("--long-texts", choices=LONG_TEXT_POLICIES, default=d.long_texts,
                        help="a text over the model's max_tokens: windows of max_tokens whose vectors are "
                             "pooled by token counts (as the service does), cut it, or stop with an error")
    parser.add_argument("--window-overlap", type=int, default=d.window_overlap,
                        help="--long-texts window: tokens consecutive windows share")
    parser.add_argument("--shard-size", type=int, default=d.shard_size,
                        help="rows per committed shard (memory holds one shard; a resume redoes at most one)")
    parser.add_argument("--on-bad-row", choices=["skip", "fail"], default=d.on_bad_row,
                        help="an unreadable row (not UTF-8/JSON, no text): skip and count it, or stop")
    parser.add_argument("--overwrite", action="store_true",
                        help="start over, deleting the shards OUTPUT holds (without it, the same job "
                             "resumes and another job is refused)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--ray", metavar="ADDRESS",
                        help="run on Ray Data: a cluster address (ray://host:10001, auto) or `local` "
                             "(starts a local instance); any input format above, sharded Parquet out")
    parser.add_argument("--ray-actors", type=int, default=d.ray_actors,
                        help="Ray: actors (one onnxruntime session each); 0 = one per GPU, else per 2 CPUs")
    parser.add_argument("--ray-cpus", type=int, default=d.ray_cpus,
                        help="--ray local: CPUs to give it (0: all)")


def config(args: argparse.Namespace) -> EmbedConfig:
    """The job the parsed flags describe."""
    return EmbedConfig(**{f.name: getattr(args, f.name) for f in fields(EmbedConfig)})


def run(args: argparse.Namespace) -> int:
    cfg = config(args)
    # checked here, before any work starts (with --ray, before the actors)
    for flag, value, least in (("--shard-size", cfg.shard_size, 1), ("--batch-size", cfg.batch_size, 1),
                               ("--ray-actors", cfg.ray_actors, 0), ("--ray-cpus", cfg.ray_cpus, 0),
                               ("--threads", cfg.threads, 0)):
        if value is not None and value < least:
            raise EmbedError(f"{flag} must be at least {least}, got {value}")
    if cfg.dimensions is not None:  # a size the bundle serves
        problem = served_size_problem(cfg.dimensions, load_manifest(cfg.bundle, verify_hashes=False))
        if problem:
            raise EmbedError(f"--{problem}")
    if cfg.sparse and lexical_entry(load_manifest(cfg.bundle, verify_hashes=False)) is None:
        raise EmbedError(f"--sparse: {cfg.bundle} {NO_TABLE}")
    if cfg.ray:  # paths stay strings: on a cluster they may be URIs (s3://...)
        from disan.embed.on_ray import run_ray  # Ray is optional (the `ray` extra): imported only for --ray

        return run_ray(cfg)
    cfg = replace(cfg, input=Path(cfg.input), output=Path(cfg.output))
    if not cfg.input.is_file():
        raise EmbedError(f"{cfg.input}: no such file")
    return Job(cfg).run()


def output_format(cfg: EmbedConfig) -> str:
    given = cfg.output_format or Path(cfg.output).suffix.lstrip(".").lower()
    return given if given in OUTPUT_FORMATS else "parquet"


def chunks(rows: Iterator[Any], size: int) -> Iterator[list[Any]]:
    while chunk := list(itertools.islice(rows, size)):
        yield chunk


class Job:
    """One `disan embed` run: open (or resume) OUTPUT, then shard after shard."""

    def __init__(self, cfg: EmbedConfig):
        self.cfg = cfg
        self.fmt_in = detect_format(cfg.input, cfg.input_format)
        self.fmt_out = output_format(cfg)
        self.encoder = Encoder(cfg.bundle, providers=cfg.providers, variant=cfg.variant,
                               threads=cfg.threads, long_texts=cfg.long_texts, overlap=cfg.window_overlap)
        rt = self.encoder.runtime
        self.job = {"input": file_fingerprint(cfg.input), "input_format": self.fmt_in, "column": cfg.column,
                    "id_column": cfg.id_column, "output_format": self.fmt_out, "model": rt.name,
                    **self.model_identity(rt), "graph_set": rt.graph_set,
                    "variant": rt.variant, "dim": cfg.dimensions or rt.dim, "max_tokens": rt.max_tokens,
                    "normalize": cfg.normalize, "long_texts": cfg.long_texts,
                    "window_overlap": cfg.window_overlap, **self.size_identity(rt, cfg.dimensions),
                    **self.sparse_identity(rt, cfg.sparse)}

    @staticmethod
    def size_identity(rt, dimensions: int | None) -> dict[str, str]:
        """What says shorter vectors are made the same way: the sha256 of the principal axes that
        make them (the embed fingerprint does not cover them), when `--dimensions` is served through
        them; axes the bundle adds after those leave a job's vectors the same, and the whole size
        depends on none."""
        if dimensions is None or rt.projection is None or dimensions >= rt.dim:
            return {}
        return {"dimensions_axes": axes_digest(rt.projection, dimensions)}

    @staticmethod
    def sparse_identity(rt, sparse: bool) -> dict[str, str]:
        """With `--sparse`: the lexical table's sha256 (the embed fingerprint does not cover it)."""
        entry = rt.manifest.get("lexical")
        return {"sparse_table": rt.manifest["files"][entry["file"]]} if sparse and entry else {}

    @staticmethod
    def model_identity(rt) -> dict[str, str]:
        """What says the vectors are the same: the embed route's fingerprint (a re-export of the
        same weights keeps it, so a job goes on across it), or the export's time for a bundle that
        records none."""
        fingerprint = fingerprints_in_use(rt.manifest, rt.graph_set, rt.variant).get("embed")
        if fingerprint:
            return {"embed_fingerprint": fingerprint}
        return {"bundle_created": rt.manifest.get("created")}

    def open_output(self) -> Progress:
        """The progress to go on from: a new job, or the committed part of this same job."""
        out = self.cfg.output
        out.mkdir(parents=True, exist_ok=True)
        progress = Progress.load(out)
        if progress is not None and progress.job != self.job and not self.cfg.overwrite:
            diff = sorted(k for k in {*progress.job, *self.job} if progress.job.get(k) != self.job.get(k))
            raise EmbedError(f"{out} holds another job (it differs in {', '.join(diff)}): use another -o, "
                             "or --overwrite to start over")
        ours = any(p.name.startswith("part-") for p in out.iterdir())
        if progress is None and ours and not self.cfg.overwrite:
            raise EmbedError(f"{out} has shard files but no {PROGRESS}: use another -o, or --overwrite")
        if progress is None or progress.job != self.job or self.cfg.overwrite:
            progress = Progress(job=self.job)
            clear_uncommitted(out, 0)
            progress.save(out)
        else:
            clear_uncommitted(out, progress.shards)
        return progress

    def run(self) -> int:
        cfg, out = self.cfg, self.cfg.output
        progress = self.open_output()
        if progress.done:
            print(f"disan embed: {out} is complete ({progress.embedded} rows, {progress.skipped} skipped)",
                  file=sys.stderr)
            return 0
        position = Position()
        rows = read_rows(cfg.input, self.fmt_in, cfg.column, cfg.id_column,
                         start=Position(progress.rows, progress.offset), position=position)
        started, first = time.perf_counter(), progress.embedded
        try:
            head = list(itertools.islice(rows, 1))  # a missing column fails here, before the bar shows
            rows = itertools.chain(head, rows)
            with self.progress_bar(progress) as bar:
                for chunk in chunks(rows, cfg.shard_size):
                    self.commit(chunk, progress, position)
                    bar.update(len(chunk))
            progress.done = True
            self.save(progress)
        except CorpusError as exc:
            raise EmbedError(f"{cfg.input}: {exc}") from None
        except KeyboardInterrupt:
            print(f"\ndisan embed: interrupted; {progress.rows} rows committed in {out}: run the same "
                  "command to go on", file=sys.stderr)
            return 130
        seconds = time.perf_counter() - started
        rate = (progress.embedded - first) / seconds if seconds > 0 else 0.0
        print(f"disan embed: {progress.embedded} rows embedded into {out} ({progress.shards} shards, "
              f"{progress.skipped} unreadable rows skipped, {progress.windowed} long texts windowed, "
              f"{progress.truncated} truncated); "
              f"{rate:.0f} sentences/s this run", file=sys.stderr)
        return 0

    def commit(self, chunk: list, progress: Progress, position: Position) -> None:
        """Embed one shard's rows, write the shard, then move the progress file past it."""
        good = [r for r in chunk if r.error is None]
        bad = [r for r in chunk if r.error is not None]
        if bad and self.cfg.on_bad_row == "fail":
            raise EmbedError(f"row {bad[0].number}: {bad[0].error} ({progress.rows} rows committed; "
                             "--on-bad-row skip skips and counts such rows)")
        try:
            prepared = self.encoder.prepare([r.text for r in good], [r.number for r in good])
        except TextTooLong as exc:
            raise EmbedError(f"row {exc.where}: {exc.tokens} tokens, at most {exc.limit} ({progress.rows} "
                             "rows committed; --long-texts window or truncate embeds such texts)") from None
        vectors = prefixed(self.encoder.embed_prepared(prepared, self.cfg.batch_size), self.cfg.dimensions,
                           self.cfg.normalize, self.encoder.runtime.projection)
        sparse = self.encoder.sparse_prepared(prepared) if self.cfg.sparse else None
        if good:
            self.write(lambda: write_shard(self.cfg.output, progress.shards, self.fmt_out,
                                           [r.id for r in good], vectors, sparse), progress)
            progress.shards += 1
        progress.rows, progress.offset = position.rows, position.offset
        progress.embedded += len(good)
        progress.skipped += len(bad)
        progress.truncated += prepared.truncated
        progress.windowed += prepared.windowed
        room = KEEP_SKIPPED - len(progress.skipped_rows)
        progress.skipped_rows += [{"row": r.number, "error": r.error} for r in bad[:max(0, room)]]
        self.save(progress)

    def save(self, progress: Progress) -> None:
        self.write(lambda: progress.save(self.cfg.output), progress)

    def write(self, action, progress: Progress) -> None:
        """Run a write; a full disk becomes one line that says what is safe and how to go on."""
        try:
            action()
        except OSError as exc:
            if exc.errno in _FULL:
                raise EmbedError(f"no space left on device writing {self.cfg.output} ({progress.rows} rows "
                                 f"committed in {progress.shards} shards; free some space and run the same "
                                 "command again to go on)") from None
            raise

    def progress_bar(self, progress: Progress):
        """tqdm in sentences: rate (sentences/s) and, where the row count is known, the ETA."""
        tqdm = require("tqdm.auto", "embed").tqdm
        total = None if self.cfg.no_progress else count_rows(self.cfg.input, self.fmt_in)
        return tqdm(total=total, initial=progress.rows, unit=" sentences", unit_scale=True, smoothing=0.1,
                    dynamic_ncols=True, disable=self.cfg.no_progress, desc="disan embed")


__all__ = ["CorpusError", "EmbedConfig", "EmbedError", "Job", "add_arguments", "config", "run"]
