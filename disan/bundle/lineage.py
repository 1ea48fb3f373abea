"""Where a bundle's models came from, each checkpoint once (TORCH-FREE).

A checkpoint's provenance (`disan.train.checkpoint.provenance`) names the checkpoints it was made from
inside its own records ("init_from", "recovered_from", "merge", ...), each with their records in
turn, so a model trained over many phases nests one level per step, and a checkpoint that several
steps share (the start of a merge of four seeds) is repeated in each. The manifest stores it flat:
`sources` keeps each model's entry with every checkpoint it names cut down to a reference
`{"file", "sha256"}`, and `lineage` holds each named checkpoint's entry, flattened the same way,
once under its sha256. `nested` puts the references back, so the pair carries exactly what the
nested form did.
"""

from __future__ import annotations

from typing import Any

REFERENCE_KEYS = ("file", "sha256")


def is_entry(value: Any) -> bool:
    """A checkpoint's provenance entry: a dict naming a file by name and sha256."""
    return isinstance(value, dict) and all(isinstance(value.get(k), str) for k in REFERENCE_KEYS)


def flat(sources: dict[str, dict[str, Any]]) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """(sources, lineage): each source entry with the checkpoints its records name replaced by
    references, and those checkpoints' entries by sha256. An entry whose sha256 is already in the
    lineage with other records stays nested, and if a file is named both with records and
    without (neither of which a file's own provenance can give), the sources stay as they are
    with an empty lineage: `nested` always gives back exactly what was flattened."""
    lineage: dict[str, dict[str, Any]] = {}

    def shallow(entry: dict[str, Any]) -> dict[str, Any]:  # its name kept, its records cut
        return {k: (v if k in REFERENCE_KEYS else cut(v)) for k, v in entry.items()}

    def cut(value: Any) -> Any:
        if is_entry(value) and _records(value):  # one without records is its own reference
            entry = shallow(value)
            known = lineage.setdefault(value["sha256"], entry)
            if _records(known) != _records(entry):
                return entry
            return {k: value[k] for k in REFERENCE_KEYS}
        return walk(value)

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: cut(v) for k, v in value.items()}
        if isinstance(value, list):
            return [cut(v) for v in value]
        return value

    top = {name: shallow(entry) for name, entry in sources.items()}
    if {name: nested(entry, lineage) for name, entry in top.items()} != sources:
        return sources, {}
    return top, lineage


def nested(entry: Any, lineage: dict[str, dict[str, Any]], _open: tuple[str, ...] = ()) -> Any:
    """`entry` with every reference into `lineage` replaced by the entry it names (its own file
    name kept), recursively: the provenance as the checkpoint itself carried it. A source of a
    manifest without a lineage (bundles exported before it) comes back as it is. A lineage in
    which a checkpoint names itself, which no real files can give, is refused."""
    if is_entry(entry) and set(entry) == set(REFERENCE_KEYS) and entry["sha256"] in lineage:
        sha = entry["sha256"]
        if sha in _open:
            raise ValueError(f"lineage: checkpoint {sha[:12]}... is named among its own sources")
        return {**nested(lineage[sha], lineage, (*_open, sha)), "file": entry["file"]}
    if isinstance(entry, dict):
        return {k: nested(v, lineage, _open) for k, v in entry.items()}
    if isinstance(entry, list):
        return [nested(v, lineage, _open) for v in entry]
    return entry


def _records(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if k not in REFERENCE_KEYS}
