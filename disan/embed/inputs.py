"""Corpus files in, one row at a time (TORCH-FREE): JSONL, CSV, TXT and Parquet readers for `disan embed`.

Every reader yields `Row`s in file order, starting at a given row (a resumed job), holding little
more than the row it is on (Parquet: one record batch), so memory does not grow with the file.
A row's number is its position: JSONL/TXT the 0-based count of non-blank lines before it (a blank
line is no row), CSV the 0-based record after the header,
Parquet the 0-based row over the file's row groups. It is the row's id unless `--id-column` names
one. A row that cannot be read (not UTF-8, not JSON, no text, a null) comes back with `error` set,
so the caller decides whether to skip it or stop. A column the file does not have at all is a
`CorpusError` before any row.

A JSONL, CSV or TXT file read without gzip can be started at a byte offset (`Position`): a resumed
job seeks there, and `cut` cuts such a file into pieces that `--ray`'s workers read with these
same readers (so their rows, ids and unreadable rows are this module's, whichever path runs).
"""

from __future__ import annotations

import csv
import gzip
import json
import os
import re
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
    """Where a reader stopped: rows consumed (read or skipped as unreadable) and, for JSONL, CSV
    and TXT read without gzip, the byte offset where the next row begins (a resumed job seeks
    there; None: read from the start, skipping `rows` rows)."""

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


def cut(path: Path, fmt: str, size: int) -> Iterator[tuple[Position, int]]:
    """A JSONL, CSV or TXT file (not gzip) cut into pieces of at most `size` rows, in file order:
    (where the piece starts, its rows). `read_rows(start=that position)`, stopped after that many
    rows, reads one piece: the rows, numbers, ids and unreadable rows of reading the whole file.
    One scan of the lines (CSV: of the records), without parsing JSON."""
    if fmt not in ("jsonl", "txt", "csv"):
        raise CorpusError(f"cannot cut a {fmt} file by byte offset (JSONL, CSV and TXT only)")
    if path.suffix.lower() == ".gz":
        raise CorpusError(f"{path}: a gzip file cannot be cut by byte offset; gunzip it")
    if fmt == "csv":
        yield from _pieces(((n, o) for _, n, o, _ in _csv_records(path, None, None, Position())), size)
        return
    with _open_binary(path) as fh:
        yield from _pieces(((n, o) for n, o, _ in _numbered_lines(fh, Position())), size)


def _pieces(rows: Iterator[tuple[int, int]], size: int) -> Iterator[tuple[Position, int]]:
    """Pieces of `size` rows from (row number, byte offset after the row) pairs (the first piece
    starts at byte 0: a CSV reader reads the header there and goes on)."""
    begin, count = Position(0, 0), 0
    for number, after in rows:
        count = number + 1
        if count - begin.rows == size:
            yield begin, size
            begin = Position(count, after)
    if count > begin.rows:
        yield begin, count - begin.rows


def _delimiter(path: Path) -> str:
    return "\t" if ".tsv" in [s.lower() for s in path.suffixes] else ","


def _open_binary(path: Path) -> IO[bytes]:
    return gzip.open(path, "rb") if path.suffix.lower() == ".gz" else open(path, "rb")  # noqa: SIM115


def _numbered_lines(fh: IO[bytes], start: Position) -> Iterator[tuple[int, int, bytes]]:
    """(row number, byte offset after it, the line stripped) of each non-blank line, from
    `start` (seeked to when it has an offset). A blank line is no row (keeps trailing newlines
    harmless)."""
    number, offset = 0, 0
    if start.offset is not None:
        fh.seek(start.offset)
        number, offset = start.rows, start.offset
    for raw in fh:
        offset += len(raw)
        line = raw.strip()
        if line:
            yield number, offset, line
            number += 1


def _line_rows(path: Path, fmt: str, column: str, id_column: str | None, start: Position,
               position: Position) -> Iterator[Row]:
    seekable = path.suffix.lower() != ".gz"
    with _open_binary(path) as fh:
        checked = start.rows > 0  # a resumed job's columns were checked on its first row
        for this, offset, line in _numbered_lines(fh, start if seekable else Position()):
            if this < start.rows:
                continue
            position.rows, position.offset = this + 1, offset if seekable else None
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
    return checked_row(number, obj.get(column), obj.get(id_column) if id_column else number, column,
                       id_column)


def checked_row(number: int, text: Any, ident: Any, column: str, id_column: str | None) -> Row:
    """The row of a text and an id as read (JSON values, Parquet's Python values): an error row
    where the text is not a string, or the id column's value is not a string or an integer."""
    if not isinstance(text, str):
        what = "missing or null" if text is None else f"a {type(text).__name__}, not text"
        return Row(number, ident, None, f"{column!r} is {what}")
    if id_column is not None and (ident is None or isinstance(ident, bool | float | dict | list)):
        return Row(number, ident, None, f"id column {id_column!r} is {ident!r}, not a string or integer")
    return Row(number, ident, text)


_LONE_CR = re.compile(rb"(?<=\r)(?!\n)")


class _CsvLines:
    """A binary file's lines as `TextIOWrapper(encoding="utf-8", errors="surrogateescape",
    newline="")` gives them to the csv module (each ends after a \\n, a \\r\\n or a lone \\r,
    untranslated; bytes that are not UTF-8 kept as surrogates, so such a row is one bad row, not a
    failed file), counting the bytes handed out: once the csv reader returns a record, `offset`
    is where the next record begins (the reader asks for a line only while a record is open)."""

    def __init__(self, fh: IO[bytes], offset: int = 0):
        self.fh, self.offset = fh, offset

    def __iter__(self) -> Iterator[str]:
        for raw in self.fh:
            lone_cr = b"\r" in raw and raw.count(b"\r") > raw.endswith(b"\r\n")  # not just a CRLF end
            for line in _LONE_CR.split(raw) if lone_cr else (raw,):
                if line:
                    self.offset += len(line)
                    yield line.decode("utf-8", "surrogateescape")


def _csv_records(path: Path, column: str | None, id_column: str | None,
                 start: Position) -> Iterator[tuple[list[str], int, int, list[str]]]:
    """(header, record number, byte offset after it, record) of each CSV record after the header,
    from `start` (seeked to when it has an offset and the file is not gzip). The columns are
    checked against the header before any record."""
    csv.field_size_limit(sys.maxsize)  # long documents are rows, not errors
    delimiter = _delimiter(path)
    seekable = path.suffix.lower() != ".gz"
    with _open_binary(path) as fh:
        lines = _CsvLines(fh)
        reader = csv.reader(lines, delimiter=delimiter)
        try:
            header = next(reader, None)
        except csv.Error as exc:
            raise CorpusError(f"CSV header: {exc}") from None
        if header is None:
            return
        for name in (column, id_column):
            if name is not None and name not in header:
                raise CorpusError(f"no column {name!r} (the header has {', '.join(map(repr, header))})")
        number = 0
        if seekable and start.offset is not None and start.offset > lines.offset:
            fh.seek(start.offset)
            lines = _CsvLines(fh, start.offset)
            reader = csv.reader(lines, delimiter=delimiter)
            number = start.rows
        while True:
            try:
                record = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:  # the csv module cannot go on after this: say where
                raise CorpusError(f"CSV record {number}: {exc}") from None
            yield header, number, lines.offset, record
            number += 1


def _csv_rows(path: Path, column: str, id_column: str | None, start: Position,
              position: Position) -> Iterator[Row]:
    seekable = path.suffix.lower() != ".gz"
    at: tuple[int, int | None] | None = None
    for header, this, offset, record in _csv_records(path, column, id_column, start):
        if this < start.rows:
            continue
        position.rows, position.offset = this + 1, offset if seekable else None
        if len(record) != len(header):
            yield Row(this, this, None, f"{len(record)} fields, the header has {len(header)}")
            continue
        if at is None:
            at = header.index(column), header.index(id_column) if id_column else None
        value, ident = record[at[0]], (record[at[1]] if at[1] is not None else this)
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
            yield checked_row(this, text, ids[i] if ids is not None else this, column, id_column)


def file_fingerprint(path: Path) -> dict[str, Any]:
    """What a resumed job checks the input against: its resolved path and size."""
    st = os.stat(path)
    return {"path": str(path.resolve()), "size": st.st_size}
