"""What an exported bundle's manifest says before its hashes and verification are added: its
graphs and routes, graph sets, weights, models (configs, labels, training metrics), sources (by
file name and sha256, with their provenance and its lineage) and the library versions (`disan export`)."""

from __future__ import annotations

import platform
import time
from pathlib import Path
from typing import Any

from disan.bundle.lineage import flat
from disan.bundle.manifest import GRAPH_SETS, GRAPHS, ROUTES

# Routes of a bundle with a distilled sentence encoder: /nli keeps the NLI model's own encoder.
EMBED_ROUTES = {"nli": "nli_encoder", "nli_explain": "nli_encoder_explain"}
VOCAB_FILE = "vocab.json"  # the word vocabulary (every bundle)
PIECES_FILE = "tokenizer.json"  # a piece encoder's subword tokenizer (model_export.embed.piece_tokenizer)


def versions() -> dict[str, str]:
    """Library versions used for the export (recorded in the manifest)."""
    # torch and onnx: imported when exporting (model_export.export.load_sources), not to read this
    import onnx
    import onnxruntime
    import torch

    from model_export.graphs.wrappers import OPSET  # torch, as above

    return {"torch": torch.__version__, "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__,
            "python": platform.python_version(), "opset": OPSET}


def bundle_manifest(name: str, vocab, max_len: int, layout: dict, chunk_cells: int, weights: dict[str, Any],
                    loaded: dict[str, tuple], payloads: dict[str, dict], paths: dict[str, Path]
                    ) -> dict[str, Any]:
    """The manifest of an exported bundle, before its hashes and verification (write_manifest)."""
    from disan.train.checkpoint import provenance  # torch, imported when exporting, as in versions()
    from model_export.graphs.wrappers import graph_source  # torch, as above

    has_embed = "embed" in loaded
    encoder = loaded["embed" if has_embed else "nli"][0]
    encoder = getattr(encoder, "encoder", encoder)  # the NLI model's, or the bare distilled one
    present = set().union(*(v["fp32"] for v in layout.values()))
    labels = {"nli": loaded["nli"][2], "sentiment": loaded["sentiment"][2]}
    # the sizes the distilled encoder was trained to serve (`disan distill student` records them;
    # model_export.embed.load_embed checked them); only when it has them: a bundle without serves
    # only embedding_dim (disan.bundle.manifest.matryoshka_dims)
    pieces = has_embed and bool(payloads["embed"].get("tokenizer"))  # the encoder reads subword pieces
    trained = payloads["embed"].get("matryoshka_dims") if has_embed else None
    dims = {} if trained is None else {"matryoshka_dims": [int(m) for m in trained]}
    manifest: dict[str, Any] = {
        "name": name,  # the model name the service reports
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "vocab": VOCAB_FILE, "vocab_size": len(vocab), "max_len": max_len,
        "embedding_dim": encoder.out_dim, "word_embedding_dim": encoder.cfg.embed_dim, **dims,
        "graphs": {g: {"inputs": list(spec.inputs), "outputs": list(spec.outputs),
                       "source": graph_source(g, has_embed),
                       "labels": labels[spec.task] if spec.outputs[0] == "probs" else None,
                       **({"tokenizer": PIECES_FILE} if pieces and graph_source(g, has_embed) == "embed"
                          else {})}
                   for g, spec in GRAPHS.items() if g in present},
    }
    if has_embed:  # without, the defaults (disan.bundle.manifest.ROUTES): the bundle reads as before routes
        manifest["routes"] = {route: graph for route, graph in {**ROUTES, **EMBED_ROUTES}.items()
                              if graph in present}
    # the distilled encoder's config as served: over the bundle's vocabulary (model_export.embed)
    configs = {task: loaded[task][0].cfg.to_dict() if task == "embed" else payloads[task]["config"]
               for task in loaded}
    manifest.update({
        "sets": {s: {"provider": GRAPH_SETS[s],
                     "attention_chunk_cells":
                         chunk_cells if ".chunked." in variants["fp32"]["encoder"] else 0,
                     "default_variant": next(iter(variants)),
                     "variants": {v: {"files": f} for v, f in variants.items()}}
                 for s, variants in layout.items()},
        "weights": weights,
        "models": {task: {"config": configs[task], "labels": loaded[task][2],
                          "metrics": payloads[task].get("metrics", {}),
                          "step": payloads[task].get("step"), "epoch": payloads[task].get("epoch")}
                   for task in loaded},
        "versions": versions(),
    })
    # each source named by file name and sha256 (never a path), with the provenance it carries:
    # every checkpoint it names once, in the lineage (disan.bundle.lineage)
    manifest["sources"], manifest["lineage"] = flat(
        {task: provenance(path, payloads[task]) for task, path in paths.items()})
    if pieces:
        manifest["models"]["embed"]["vocab"] = {
            "tokenizer": PIECES_FILE, "pieces": loaded["embed"][0].cfg.vocab_size - 1,
            "note": "the encoder reads subword pieces through tokenizer.json (model id = piece id + 1, "
                    "0 = padding); its graphs name it, /nli and /sentiment read vocab.json"}
        cfg = loaded["embed"][0].cfg
        if cfg.borrowed_rows:
            manifest["models"]["embed"]["borrowed"] = {
                "from": "own", "rows": cfg.borrowed_rows, "offset": cfg.borrowed_offset,
                "whole_words": (payloads["embed"].get("whole_words") or {}).get("whole_words"),
                "note": "tokenizer.json also lists the words of the word table the NLI and sentiment models "
                        "borrowed, as whole pieces (disan distill whole-words): id offset + row reads that "
                        "row of the same stored table (storage `borrowed`), through the model's borrow_map"}
    elif has_embed:
        own = loaded["embed"][1]
        manifest["models"]["embed"]["vocab"] = {
            "own_words": len(own), "bundle_words": len(vocab), "unknown_rows": vocab.unknown_rows,
            "note": "the checkpoint's table re-indexed to the bundle vocabulary (its config's "
                    "vocab_size is the bundle's); bundle words it lacks read its UNK row; a word "
                    "the vocabulary lacks reads as one of its last unknown_rows words (vocab.json), "
                    "past the NLI and sentiment tables, so those models read it as UNK unless "
                    "they borrow this table (their config's borrowed_rows)"}
    for task in ("nli", "sentiment"):
        if loaded[task][0].cfg.borrowed_rows and pieces:
            manifest["models"][task]["borrowed"] = {
                "from": "own", "rows": loaded[task][0].cfg.borrowed_rows,
                "note": "ids past the model's own table read rows of the word table it borrowed from the "
                        "word encoder it was fitted to (disan borrow-words), kept as its own copy "
                        "(storage `borrowed`, the same bytes for every model that has it) because the "
                        "bundle's encoder reads subword pieces"}
        elif loaded[task][0].cfg.borrowed_rows:
            manifest["models"][task]["borrowed"] = {
                "from": "embed", "rows": loaded[task][0].cfg.borrowed_rows,
                "note": "ids past the model's own table read the embed model's row (the same stored "
                        "tensor, in the embed model's storage) through the model's borrow_map "
                        "(disan borrow-words), not UNK"}
    return manifest
