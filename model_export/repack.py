"""An older bundle's word vocabulary written as `disan export` writes it today, and its route
fingerprints recorded by today's rule.

Why: a bundle exported before 2026-12-06 stores `vocab.json` with a space after every comma and
colon (187 KB of the shipped bundle's 64 MB budget) and route fingerprints that hashed that file's
bytes. This rewrites the file compact (the same words in the same order, the same JSON content)
and records the fingerprints by the rule that reads the file's content
(model_export.bundle_diff.route_fingerprints), so that `disan verify` still checks them.

Nothing a route computes changes: the graphs and weights are untouched (`disan bundle-diff OLD NEW`
reports every route the same). A bundle whose recorded fingerprints match neither rule is refused:
its files are not what was exported, so export it again instead.

    python -m model_export.repack models/default
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from disan.bundle.manifest import BundleError, load_manifest, write_manifest
from disan.text.tokenizer import Vocab
from model_export.bundle_diff import reading_digest, route_fingerprints
from model_export.verify import fingerprint_check


def repack(bundle: Path) -> dict[str, Any]:
    """Rewrite `bundle`'s word vocabulary and fingerprints in place (module docstring); returns
    {"vocab_bytes": [before, after], "fingerprints": the rule they were recorded by before}."""
    manifest = load_manifest(bundle)  # the files' hashes checked
    digests: dict = {}  # the stored tensors' sha256: hashed once, for the check and the new fingerprints
    check = fingerprint_check(bundle, manifest, digests)
    if check.get("stale"):
        raise BundleError(f"{bundle}: the recorded fingerprints of {', '.join(check['stale'])} are not what "
                          f"its files compute; export the bundle again")
    path = bundle / manifest["vocab"]
    before, content = path.stat().st_size, reading_digest(path)
    rewritten = path.with_name(path.name + ".new")
    Vocab.load(path).save(rewritten)
    if reading_digest(rewritten) != content:  # a field the Vocab does not keep: leave the file as it was
        rewritten.unlink()
        raise BundleError(f"{path}: written again it would not read the same; left as it is")
    rewritten.replace(path)
    fingerprints = route_fingerprints(bundle, manifest, digests=digests)
    write_manifest(bundle, {**manifest, "route_fingerprints": fingerprints})
    return {"vocab_bytes": [before, path.stat().st_size],
            "fingerprints": check.get("rule", "content" if check.get("checked") else "none recorded")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m model_export.repack",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    args = parser.parse_args(argv)
    try:
        report = repack(args.bundle)
    except (BundleError, OSError, ValueError) as exc:
        print(f"repack: error: {exc}", file=sys.stderr)
        return 2
    before, after = report["vocab_bytes"]
    print(f"{args.bundle}: vocabulary {before:,} -> {after:,} bytes; route fingerprints recorded by the "
          f"tokenizer files' content (before: {report['fingerprints']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
