"""Where `disan verify`'s PyTorch reference comes from: the source checkpoints (found by the
sha256 the manifest records) or the bundle's own parameter-named fp32 weights. torch is imported
inside the functions, so the torch-free consistency mode of verify never loads it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from disan.bundle.manifest import BundleError, available_variants, sha256_file, variant_files
from disan.text.tokenizer import Vocab


def storage_of(manifest: dict[str, Any], task: str, field: str = "embedding_storage") -> str:
    """How `task`'s word-vector table is stored (`weights.embedding_storage`), or with `field`
    "matrix_storage" its other parameters: the manifest's one storage, or its per-model one;
    fp32 when absent (bundles before that field)."""
    storage = (manifest.get("weights") or {}).get(field) or "fp32"
    return storage if isinstance(storage, str) else storage.get(task, "fp32")


def references_from_models(nli, sent, embed=None) -> dict[str, Any]:
    """Graph name (and "nli", the whole model) -> PyTorch wrapper: the reference of each graph
    (`embed`: the distilled encoder, over the bundle's vocabulary, if the bundle has one)."""
    # torch: only the parity modes need it
    from model_export.graphs.wrappers import NLIGraph, build_wrappers

    return {**build_wrappers(nli, sent, embed), "nli": NLIGraph(nli).eval()}


def references_from_checkpoints(manifest: dict[str, Any], places: list[Path],
                                vocab: Vocab | None = None) -> dict[str, Any]:
    """Wrappers from the source checkpoints among `places` (.pt files, or directories of them),
    found by the sha256 the manifest records; a distilled encoder re-indexed to the bundle's
    `vocab` and every table rounded to its storage, as the export did."""
    from disan.train.checkpoint import load_checkpoint, model_from_checkpoint  # torch, as above
    from model_export.embed import as_stored, reindexed  # as above

    models = {}
    candidates = [f for p in map(Path, places) for f in (sorted(p.glob("*.pt")) if p.is_dir() else [p])]
    hashes = {p: sha256_file(p) for p in candidates if p.is_file()}
    for task in manifest.get("models") or ("nli", "sentiment"):
        src = (manifest.get("sources") or {}).get(task) or {}
        match = next((p for p, h in hashes.items() if h == src.get("sha256")), None)
        if match is None:
            raise ValueError(f"--checkpoints: no .pt file with sha256 {src.get('sha256')} among "
                             f"{[str(p) for p in places]} (the {task} source, exported from a file "
                             f"named {src.get('file')!r})")
        payload = load_checkpoint(match)
        model, own_vocab, _ = model_from_checkpoint(payload)
        if task == "embed" and not payload.get("tokenizer"):  # a piece encoder keeps its own ids
            if vocab is None:
                raise ValueError("the bundle's vocabulary is needed to check its distilled encoder")
            model = reindexed(model, own_vocab, vocab)
        models[task] = model
    pieces = any("tokenizer" in (g or {}) for g in (manifest.get("graphs") or {}).values())
    storage = {task: storage_of(manifest, task) for task in (*models, *(["borrowed"] if pieces else []))}
    as_stored(models, storage, {task: storage_of(manifest, task, "matrix_storage") for task in models},
              keep_borrowed=pieces)  # as the export did
    return references_from_models(models["nli"], models["sentiment"], models.get("embed"))


def bundle_models(bundle_dir: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """{task: model} for every model the manifest lists, rebuilt from the parameter-named
    weights of the fp32 graphs (tables stored in fp16 or int8 read back as the values served)."""
    from disan.model import DiSANConfig, build_model  # torch, as above
    from model_export.graphs.storage import state_dicts_from_graphs

    files = {f for s, v in available_variants(manifest) if v == "fp32"
             for f in variant_files(manifest, s, v).values()}
    found = state_dicts_from_graphs((bundle_dir / f for f in sorted(files)),
                                    (manifest.get("weights") or {}).get("aliases"))
    return {task: load_state(build_model(DiSANConfig.from_dict(info["config"])), found.get(task, {}), task)
            for task, info in manifest["models"].items()}


def load_state(model, arrays: dict[str, np.ndarray], task: str):
    """Load named arrays into `model` (eval mode); every parameter must be there."""
    import torch  # torch, as above

    state = model.state_dict()
    # The exporter drops a Linear's all-zero bias (a Gemm's C is optional), so a bias the graphs lack
    # beside its weight was zero; were it not, the parity check against the graphs would fail.
    dropped = [k for k in state if k.endswith(".bias") and k not in arrays
               and k.removesuffix(".bias") + ".weight" in arrays]
    arrays = {**{k: np.zeros(tuple(state[k].shape), np.float32) for k in dropped}, **arrays}
    missing = [k for k in state if k not in arrays and not k.endswith("trainable_rows")]
    if missing:
        raise BundleError(f"{task}: the graphs hold no weights for {missing[:5]}"
                          f"{' ...' if len(missing) > 5 else ''}")
    # trainable_rows only steers training (which embedding rows get gradients): not in graphs
    state.update({k: torch.from_numpy(np.array(arrays[k])).to(state[k].dtype) for k in state if k in arrays})
    model.load_state_dict(state)
    return model.eval()


def references_from_bundle(bundle_dir: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Wrappers around the PyTorch models rebuilt from the bundle's own fp32 weights."""
    models = bundle_models(bundle_dir, manifest)
    return references_from_models(models["nli"], models["sentiment"], models.get("embed"))
