"""Corpus files in, one row at a time (TORCH-FREE): JSONL, CSV, TXT and Parquet readers for `disan embed`.

Every reader yields `Row`s in file order, starting at a given row (a resumed job), holding little
more than the row it is on (Parquet: one record batch), so memory does not grow with the file.
A row's number is its position: JSONL/TXT the 0-based count of non-blank lines before it (a blank
line is no row), CSV the 0-based record after the header,
Parquet the 0-based row over the file's row groups. It is the row's id unless `--id-column` names
one. A row that cannot be read (not UTF-8, not JSON, no text, a null) comes back with `error` set,
so the caller decides whether to skip it or stop. A column the file does not have at all is a
`CorpusError` before any row.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from disan.optional import require

FORMATS = ("jsonl", "csv", "txt", "parquet")
_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv", ".tsv": "csv",
             ".txt": "txt", ".text": "txt", ".parquet": "parquet", ".pq": "parquet"}


class CorpusError(ValueError):
    """The input cannot be read as asked (missing column, unknown format): one line for the CLI."""


@dataclass
class Row:
    """One input row: its number, its id (the number, or the id column's value), its text, or
    why it cannot be read (`text` is then None)."""

    number: int
    id: Any
    text: str | None
    error: str | None = None


@dataclass
class Position:
    """Where a reader stopped: rows consumed (read or skipped as unreadable) and, for line files
    read without gzip, the byte offset of the next line (a resumed job seeks there)."""

    rows: int = 0
    offset: int | None = None


def detect_format(path: Path, given: str | None = None) -> str:
    """The input format: `given`, else from the suffix (a trailing .gz is looked through)."""
    if given:
        return given
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes.pop()
    fmt = _SUFFIXES.get(suffixes[-1] if suffixes else "")
    if fmt is None:
        raise CorpusError(f"{path}: cannot tell the format from the name; pass --input-format "
                          f"({', '.join(FORMATS)})")
    return fmt


def count_rows(path: Path, fmt: str) -> int | None:
    """Rows in the file for the progress bar's total and ETA: exact for Parquet (metadata), the
    line count for line files (a fast byte scan), None for a directory or a stream."""
    if not path.is_file():
        return None
    if fmt == "parquet":
        return require("pyarrow.parquet", "embed").ParquetFile(path).metadata.num_rows
    with _open_binary(path) as fh:
        lines = sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
    return max(0, lines - (1 if fmt == "csv" else 0))


def read_rows(path: Path, fmt: str, column: str, id_column: str | None = None,
              start: Position | None = None, position: Position | None = None) -> Iterator[Row]:
    """The rows of `path` from `start` on. `position` (if given) is kept up to date: after each
    yielded row it says where the next one begins, so a caller can record where it stopped."""
    start = start or Position()
    position = position if position is not None else Position()
    position.rows, position.offset = start.rows, start.offset
    if fmt == "parquet":
        return _parquet_rows(path, column, id_column, start, position)
    if fmt == "csv":
        return _csv_rows(path, column, id_column, start, position)
    if fmt in ("jsonl", "txt"):
        return _line_rows(path, fmt, column, id_column, start, position)
    raise CorpusError(f"unknown input format {fmt!r} (one of {', '.join(FORMATS)})")


def _open_binary(path: Path) -> IO[bytes]:
    return gzip.open(path, "rb") if path.suffix.lower() == ".gz" else open(path, "rb")  # noqa: SIM115


def _line_rows(path: Path, fmt: str, column: str, id_column: str | None, start: Position,
               position: Position) -> Iterator[Row]:
    seekable = path.suffix.lower() != ".gz"
    with _open_binary(path) as fh:
        number, offset = 0, 0
        if seekable and start.offset is not None:
            fh.seek(start.offset)
            number, offset = start.rows, start.offset
        checked = start.rows > 0  # a resumed job's columns were checked on its first row
        for raw in fh:
            offset += len(raw)
            line = raw.strip()
            if not line:
                continue  # blank lines are not rows (keeps trailing newlines harmless)
            this, number = number, number + 1
            if this < start.rows:
                continue
            position.rows, position.offset = number, offset if seekable else None
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield Row(this, this, None, f"not UTF-8 ({exc.reason} at byte {exc.start})")
                continue
            if fmt == "txt":
                yield Row(this, this, text)
                continue
            row = _json_row(this, text, column, id_column, checked)
            checked = True
            yield row


def _json_row(number: int, line: str, column: str, id_column: str | None, checked: bool) -> Row:
    try:
        obj = json.loads(line)
    except ValueError as exc:
        return Row(number, number, None, f"not JSON ({exc})")
    if not isinstance(obj, dict):
        return Row(number, number, None, f"a JSON {type(obj).__name__}, not an object")
    for name in (column, id_column):
        if name is not None and name not in obj and not checked:
            # The first object lacks it: a wrong --column, not one bad row.
            raise CorpusError(f"no column {name!r} (the first row has {', '.join(map(repr, obj)) or 'none'})")
    return _checked_row(number, obj.get(column), obj.get(id_column) if id_column else number, column,
                        id_column)


def _checked_row(number: int, text: Any, ident: Any, column: str, id_column: str | None) -> Row:
    if not isinstance(text, str):
        what = "missing or null" if text is None else f"a {type(text).__name__}, not text"
        return Row(number, ident, None, f"{column!r} is {what}")
    if id_column is not None and (ident is None or isinstance(ident, bool | float | dict | list)):
        return Row(number, ident, None, f"id column {id_column!r} is {ident!r}, not a string or integer")
    return Row(number, ident, text)


def _csv_rows(path: Path, column: str, id_column: str | None, start: Position,
              position: Position) -> Iterator[Row]:
    csv.field_size_limit(sys.maxsize)  # long documents are rows, not errors
    delimiter = "\t" if ".tsv" in [s.lower() for s in path.suffixes] else ","
    with _open_binary(path) as raw:
        # surrogateescape: a row with bytes that are not UTF-8 is one bad row, not a failed file
        text = io.TextIOWrapper(raw, encoding="utf-8", errors="surrogateescape", newline="")
        reader = csv.reader(text, delimiter=delimiter)
        header = next(reader, None)
        if header is None:
            return
        for name in (column, id_column):
            if name is not None and name not in header:
                raise CorpusError(f"no column {name!r} (the header has {', '.join(map(repr, header))})")
        at = header.index(column)
        id_at = header.index(id_column) if id_column else None
        number = 0
        while True:
            try:
                record = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:  # the csv module cannot go on after this: say where
                raise CorpusError(f"CSV record {number}: {exc}") from None
            this, number = number, number + 1
            if this < start.rows:
                continue
            position.rows = number
            if len(record) != len(header):
                yield Row(this, this, None, f"{len(record)} fields, the header has {len(header)}")
                continue
            value, ident = record[at], (record[id_at] if id_at is not None else this)
            if _has_surrogates(value) or (isinstance(ident, str) and _has_surrogates(ident)):
                yield Row(this, this, None, "not UTF-8")
                continue
            yield Row(this, ident, value)


def _has_surrogates(text: str) -> bool:
    return not text.isascii() and any("\udc80" <= ch <= "\udcff" for ch in text)


def _parquet_rows(path: Path, column: str, id_column: str | None, start: Position,
                  position: Position) -> Iterator[Row]:
    pq = require("pyarrow.parquet", "embed")
    pf = pq.ParquetFile(path)
    names = pf.schema_arrow.names
    for name in (column, id_column):
        if name is not None and name not in names:
            raise CorpusError(f"no column {name!r} (the file has {', '.join(map(repr, names))})")
    # Skip whole row groups before `start` through the metadata, without reading them.
    groups, first = [], 0
    for g in range(pf.num_row_groups):
        n = pf.metadata.row_group(g).num_rows
        if first + n > start.rows:
            groups.append(g)
        else:
            first += n
    if not groups:
        return
    columns = [column] + ([id_column] if id_column and id_column != column else [])
    number = first
    for batch in pf.iter_batches(batch_size=8192, row_groups=groups, columns=columns):
        texts = batch.column(column).to_pylist()
        ids = batch.column(id_column).to_pylist() if id_column else None
        for i, text in enumerate(texts):
            this, number = number, number + 1
            if this < start.rows:
                continue
            position.rows = number
            yield _checked_row(this, text, ids[i] if ids is not None else this, column, id_column)


def file_fingerprint(path: Path) -> dict[str, Any]:
    """What a resumed job checks the input against: its resolved path and size."""
    st = os.stat(path)
    return {"path": str(path.resolve()), "size": st.st_size}
