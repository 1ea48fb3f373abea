"""`disan export --nli CKPT --sentiment CKPT [--embed CKPT] --out DIR`: checkpoints -> verified bundle.

A bundle carries one graph set per provider (see `disan.bundle.manifest`): `cpu` (attention in
query-row chunks, fp32; int8 with --quantize) and `gpu` (unchunked; fp16 by default, fp32 kept
for parity). All graphs read their weights from one shared file, each tensor stored once.
With --embed, a distilled sentence encoder serves the embedding routes (`encoder` graphs, over
the vocabulary of model_export.embed) and the NLI model's own encoder `nli_encoder` feeds
`nli_head`; the manifest's `routes` say so.
The bundle is built in a temporary sibling directory and moved into place only after every
graph passed `onnx.checker` and the ORT-vs-PyTorch parity check, so a failed export never
leaves a half-written bundle where the service would look for one.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from disan.bundle.manifest import (
    EMBEDDING_STORAGES,
    GRAPH_SETS,
    GRAPHS,
    MANIFEST_NAME,
    MATRIX_STORAGES,
    WEIGHTS_FILE,
    int4_rows,
    load_manifest,
    storage_kind,
    write_manifest,
)
from disan.text.tokenizer import merged_vocab
from model_export.bundle_diff import route_fingerprints
from model_export.bundle_manifest import PIECES_FILE, VOCAB_FILE, bundle_manifest
from model_export.served import served_accuracy

FP16_NOTE = ("onnxruntime float16 converter on the gpu set's fp32 graphs (keep_io_types: ids int64, "
             "mask bool in, float32 out); fp16 weights and activations, the weights stored once in "
             "fp32 (shared with the fp32 graphs) and cast when the session loads; meant for CUDA")


@dataclass(frozen=True)
class ExportConfig:
    """What `build_bundle` exports: the checkpoints, the bundle's folder, its graph sets and
    variants, how its weights are stored; `disan export` builds one from its flags (whose
    defaults are these)."""

    nli: Path                          # the NLI checkpoint: nli_head and /nli's encoder
    sentiment: Path                    # the sentiment checkpoint
    out: Path                          # the bundle's folder
    embed: Path | None = None          # a distilled encoder serving the embedding routes
    max_len: int = 128                 # the longest input the service accepts
    sets: tuple[str, ...] = ("cpu", "gpu")  # graph sets: cpu (chunked attention), gpu (unchunked)
    fp16: bool = True                  # the gpu set's fp16 variant (its default) beside fp32
    int8: bool = False                 # a dynamically quantised cpu variant
    int8_embedding: bool = True        # the int8 variant quantises the word-vector table too
    dev_data: Path | None = None       # staged data: the variants' agreement, served accuracy
    dev_limit: int = 2000              # dev examples per task for agreement
    force: bool = False                # replace an existing bundle at out
    name: str = "disan"                # the model name the service reports
    chunk_cells: int | None = None     # cpu set's attention chunks (None: ATTENTION_CHUNK_CELLS; 0: off)
    embedding_storage: str | dict[str, str] = "fp32"  # word-vector tables (storage_by_model)
    matrix_storage: str | dict[str, str] = "fp32"     # every other parameter: fp32 or fp16


def storage_by_model(spec: str | dict[str, str], models, allowed=EMBEDDING_STORAGES,
                     flag: str = "--embedding-storage") -> dict[str, str]:
    """{model: storage} from an --embedding-storage (or `flag`) value: "int8" (every model),
    "int8,nli=fp16" (a default, then per-model overrides) or such a dict already; raises
    ValueError if a storage is not `allowed` or a model unknown."""
    parts = dict(spec) if isinstance(spec, dict) else {
        (p.split("=", 1)[0] if "=" in p else "*"): p.split("=", 1)[-1] for p in spec.split(",") if p}
    default = parts.pop("*", "fp32")
    out = {model: parts.pop(model, default) for model in models}
    bad = [v for v in out.values() if storage_kind(v) not in allowed]
    if parts or bad:
        raise ValueError(f"{flag} {spec!r}: storages are {', '.join(allowed)}, models {', '.join(models)}")
    return out


def load_sources(nli_path: Path, sentiment_path: Path):
    """Load both checkpoints; refuse wrong tasks or different vocabularies with a clear message."""
    # torch/onnx load only once there is work: `disan export --help` and flag errors answer at once
    from disan.train.checkpoint import load_checkpoint, model_from_checkpoint

    payloads = {"nli": load_checkpoint(nli_path), "sentiment": load_checkpoint(sentiment_path)}
    loaded = {task: model_from_checkpoint(p) for task, p in payloads.items()}
    for task, path in (("nli", nli_path), ("sentiment", sentiment_path)):
        got = loaded[task][0].cfg.task
        if got != task:
            raise ValueError(f"{path}: is a '{got}' checkpoint, expected '{task}' for --{task}")
    v_nli, v_sent = loaded["nli"][1], loaded["sentiment"][1]
    longer = max(v_nli, v_sent, key=len)
    first = next((i for i, (a, b) in enumerate(zip(v_nli.itos, v_sent.itos, strict=False)) if a != b), None)
    if first is not None:
        raise ValueError(
            f"checkpoints use different vocabularies ({nli_path}: {len(v_nli)} words, {sentiment_path}: "
            f"{len(v_sent)} words, first difference at id {first}); the bundle has one vocab.json, "
            "so train both models with the same vocabulary")
    # One list may extend the other (a recovered checkpoint carries the whole bundle vocabulary, a
    # retrained one the words it was trained over): every id both use means the same word, and
    # a model reads the ids past its own table as UNK, so the longer list serves both.
    loaded = {task: (model, longer, labels) for task, (model, _, labels) in loaded.items()}
    return payloads, loaded


def set_layout(fp32_files: set[str], sets: tuple[str, ...], fp16: bool, int8: bool
               ) -> dict[str, dict[str, dict[str, str]]]:
    """{set: {variant: {graph: file}}} from the exported fp32 files (see export_fp32_graphs)."""
    def pick(graph: str, chunked: bool) -> str | None:
        base = f"{graph}.onnx"
        if chunked and f"{graph}.chunked.onnx" in fp32_files:
            return f"{graph}.chunked.onnx"
        return base if base in fp32_files else None

    layout: dict[str, dict[str, dict[str, str]]] = {}
    for set_name in sets:
        files = {g: pick(g, set_name == "cpu") for g in GRAPHS}
        fp32 = {g: f for g, f in files.items() if f}
        layout[set_name] = {"fp32": fp32}
        if set_name == "gpu" and fp16:  # the gpu set's default: first
            layout[set_name] = {"fp16": {g: f.replace(".onnx", ".fp16.onnx") for g, f in fp32.items()},
                                **layout[set_name]}
        if set_name == "cpu" and int8:  # optional, after fp32 (the cpu set's default)
            layout[set_name]["int8"] = {g: f.replace(".onnx", ".int8.onnx") for g, f in fp32.items()}
    return layout


def stage_graphs(nli_model, sent_model, stage: Path, layout_args: tuple, chunk_cells: int,
                 int8_embedding: bool, log=print, embed=None) -> tuple[dict, dict[str, Path], dict[str, str]]:
    """Every graph file as a self-contained ONNX file in `stage`: (layout, {file: path}, the
    weight aliases of name_by_parameters). `embed`: the distilled encoder, re-indexed."""
    # torch and onnx: imported when exporting (see load_sources)
    import onnx

    from model_export.graphs.onnx_files import convert_fp16, quantize_int8  # onnx, as above
    from model_export.graphs.weights import name_by_parameters, share_fp32_weights  # onnx, as above
    from model_export.graphs.wrappers import export_fp32_graphs, graph_source  # torch, as above

    t0 = time.perf_counter()
    paths = export_fp32_graphs(nli_model, sent_model, stage, chunk_cells, embed)
    log(f"exported {len(paths)} fp32 graphs in {time.perf_counter() - t0:.1f}s")
    sources = {"nli": nli_model, "sentiment": sent_model, **({"embed": embed} if embed is not None else {})}
    params = {task: {k: v.detach().numpy() for k, v in m.state_dict().items()} for task, m in sources.items()}
    # the wrappers hold a model as `model` and an encoder as `encoder`: a bare encoder's own keys
    prefixes = {"embed": ("encoder.",)}
    models, aliases = {}, {}
    for file, path in paths.items():
        task = graph_source(file, embed is not None)
        models[file] = onnx.load(str(path))
        aliases.update(name_by_parameters(models[file], task, params[task], prefixes.get(task, ("model.",))))
        onnx.save(models[file], str(path))
    layout = set_layout(set(paths), *layout_args)
    for variants in layout.values():
        for variant, files in variants.items():
            for graph, file in files.items():
                if file in paths:
                    continue
                source = variants["fp32"][graph]
                if variant == "fp16":
                    half = onnx.load(str(convert_fp16(paths[source], stage / file)))
                    share_fp32_weights(half, models[source])
                    onnx.save(half, str(stage / file))
                    paths[file] = stage / file
                else:
                    paths[file] = quantize_int8(paths[source], stage / file, int8_embedding)
    log(f"staged {len(paths)} graph files in {time.perf_counter() - t0:.1f}s")
    return layout, paths, dict(sorted(aliases.items()))


def write_graphs(paths: dict[str, Path], files: set[str], out: Path,
                 storage: dict[str, str] | None = None,
                 matrices: dict[str, str] | None = None) -> dict[str, Any]:
    """Write `files` into `out` with their large initializers in the shared weights file (each
    model's word-vector table in fp16 or int8 if `storage` {model: storage} says so, its other
    parameters in fp16 if `matrices` {model: storage} does)."""
    import onnx  # as above

    from model_export.graphs.onnx_files import check_onnx, strip_node_metadata
    from model_export.graphs.storage import MATRIX_NOTE, matrices_of, store_tables, table_storages
    from model_export.graphs.weights import SharedWeights  # onnx, as above

    storage = storage or {"nli": "fp32", "sentiment": "fp32"}
    matrices = matrices or {}
    halved = sorted(task for task, kind in matrices.items() if kind == "fp16")
    tables = table_storages(storage)
    weights = SharedWeights(out / WEIGHTS_FILE)
    try:
        for file in sorted(files):
            model = onnx.load(str(paths[file]))
            strip_node_metadata(model)
            store_tables(model, matrices_of(model, halved, tables), "fp16")  # before the tables' renames
            for name, kind in tables.items():
                store_tables(model, {name}, kind)
            weights.externalize(model)
            onnx.save(model, str(out / file))
    finally:
        weights.close()
    for file in sorted(files):
        check_onnx(out / file)
    kinds = sorted(set(storage.values()))
    # written only when some model's are halved: bundles before --matrix-storage read as all fp32
    matrix_fields = ({"matrix_storage": {task: matrices.get(task, "fp32") for task in storage
                                         if task in matrices}}
                     if halved else {})
    matrix_note = "; " + MATRIX_NOTE.format(models=", ".join(halved)) if halved else ""
    return {"file": WEIGHTS_FILE, "tensors": weights.tensors, "bytes": (out / WEIGHTS_FILE).stat().st_size,
            # one storage for every table (all bundles before per-model storage), else each model's
            "embedding_storage": kinds[0] if len(kinds) == 1 else storage, **matrix_fields,
            "note": "every initializer of 1 KiB or more of every graph, each distinct tensor once "
                    "(ONNX external data); initializers are named <task>/<parameter> (/T: transposed; "
                    "/half: an fp32 parameter stored in fp16; /int8 + /scale: stored as per-row int8 "
                    "and fp32 scales); " + "; ".join(
                        storage_note(kind) + ("" if len(kinds) == 1 else
                                              f" ({', '.join(t for t, k in storage.items() if k == kind)})")
                        for kind in kinds) + matrix_note}


def storage_note(storage: str) -> str:
    """What the manifest says of a table storage (an int4 tail's row count filled in)."""
    from model_export.graphs.storage import STORAGE_NOTES  # onnx, as above

    return STORAGE_NOTES[storage_kind(storage)].format(rows=int4_rows(storage))


def build_bundle(cfg: ExportConfig, log=print) -> dict[str, Any]:
    """Export, verify and atomically install a bundle at `cfg.out`; return its manifest."""
    # torch and onnx: imported when exporting (see load_sources)
    from model_export.agreement import agreement_data, meets_bars, variant_agreement
    from model_export.embed import as_stored  # torch, as above
    from model_export.graphs.storage import BORROWED  # onnx, as above
    from model_export.graphs.wrappers import ATTENTION_CHUNK_CELLS
    from model_export.references import references_from_models
    from model_export.verify import FP32_TOL, check_parity

    out, max_len, embed_path = Path(cfg.out), cfg.max_len, cfg.embed
    if out.exists() and any(out.iterdir()) and not (cfg.force and (out / MANIFEST_NAME).is_file()):
        raise ValueError(f"{out}: exists and is not empty (use --force to replace an existing bundle)")
    if max_len < 1:
        raise ValueError(f"--max-len must be >= 1, got {max_len}")
    chunk_cells = ATTENTION_CHUNK_CELLS if cfg.chunk_cells is None else cfg.chunk_cells
    if chunk_cells < 0:
        raise ValueError(f"--attention-chunk-cells must be >= 0, got {chunk_cells}")
    sets = tuple(sorted(set(cfg.sets)))
    unknown = [s for s in sets if s not in GRAPH_SETS]
    if unknown or not sets:
        raise ValueError(f"--sets: choose from {sorted(GRAPH_SETS)}, got {list(sets)}")
    # flag errors before any loading; BORROWED is known once the encoder is (below)
    named = ("nli", "sentiment", "embed") if embed_path else ("nli", "sentiment")
    storage_by_model(cfg.embedding_storage, (*named, BORROWED) if embed_path else named)
    storage_by_model(cfg.matrix_storage, named, MATRIX_STORAGES, "--matrix-storage")
    payloads, loaded = load_sources(cfg.nli, cfg.sentiment)
    nli_model, vocab = loaded["nli"][0], loaded["nli"][1]
    embed = None
    pieces = None  # the distilled encoder's subword tokenizer, when it reads pieces
    if embed_path is not None:
        from model_export.embed import load_embed, piece_tokenizer, reindexed  # torch, as above

        payloads["embed"], own_model, own_vocab = load_embed(embed_path)
        pieces = piece_tokenizer(payloads["embed"])
        if pieces is None:
            vocab = merged_vocab(loaded["nli"][1], own_vocab)
            embed = reindexed(own_model, own_vocab, vocab)
            log(f"vocabulary: {len(vocab)} words, the NLI model's {len(loaded['nli'][1])} then "
                f"{len(vocab) - len(loaded['nli'][1])} of the encoder's {len(own_vocab)}")
        else:
            embed = own_model.eval()
            lent = embed.cfg.borrowed_rows
            words = f" and whole words (the {lent}-word table the task models borrow)" if lent else ""
            log(f"the encoder reads {embed.cfg.vocab_size - 1} subword pieces{words} ({PIECES_FILE}); /nli "
                f"and /sentiment read the NLI model's {len(vocab)} words ({VOCAB_FILE})")
        loaded["embed"] = (embed, own_vocab, [])
    tasks = tuple(loaded)
    matrices = storage_by_model(cfg.matrix_storage, tasks, MATRIX_STORAGES, "--matrix-storage")
    lent = pieces is not None and any(model.cfg.borrowed_rows for model, _, _ in loaded.values())
    storage = storage_by_model(cfg.embedding_storage, (*tasks, BORROWED) if lent else tasks)
    # the models the graphs and the parity check use hold exactly the stored tables
    as_stored({task: model for task, (model, _, _) in loaded.items()}, storage, matrices, keep_borrowed=lent)
    sent_model = loaded["sentiment"][0]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp's 0700 would keep the bundle from a server running as another user
    try:
        with tempfile.TemporaryDirectory(prefix="disan-export-") as stage:
            layout, paths, aliases = stage_graphs(nli_model, sent_model, Path(stage),
                                                  (sets, cfg.fp16, cfg.int8), chunk_cells,
                                                  cfg.int8_embedding, log, embed)
            files = {f for variants in layout.values() for v in variants.values() for f in v.values()}
            weights = {**write_graphs(paths, files, tmp, storage, matrices), "aliases": aliases}
        vocab.save(tmp / VOCAB_FILE)
        if pieces is not None:
            pieces.save(tmp / PIECES_FILE)
        paths_by_task = {"nli": cfg.nli, "sentiment": cfg.sentiment, "embed": embed_path}
        manifest = bundle_manifest(cfg.name, vocab, max_len, layout, chunk_cells, weights, loaded, payloads,
                                   {t: p for t, p in paths_by_task.items() if t in loaded})
        write_manifest(tmp, manifest)  # hashes first, so the checks below see a complete bundle
        manifest["route_fingerprints"] = route_fingerprints(tmp, manifest)
        refs, done, parity = references_from_models(nli_model, sent_model, embed), {}, {}
        for s in layout:
            parity[s] = {"fp32": check_parity(tmp, manifest, refs, layout[s]["fp32"], done=done)}
        passed = all(g["passed"] for p in parity.values() for g in p["fp32"].values())
        manifest["verification"] = {"mode": "parity_vs_checkpoints", "device": "cpu", "tolerance": FP32_TOL,
                                    "sets": parity, "passed": passed}
        data = None
        for s, variants in layout.items():
            for variant in variants:
                if variant == "fp32":
                    continue
                data = data or agreement_data(cfg.dev_data, vocab, cfg.dev_limit)
                entry = manifest["sets"][s]["variants"][variant]
                entry["agreement_vs_fp32"] = variant_agreement(tmp, manifest, s, variant, data)
                entry["meets_bars"] = meets_bars(entry["agreement_vs_fp32"])
                if variant == "fp16":
                    entry["note"] = FP16_NOTE
                else:
                    entry["embedding"] = "int8" if cfg.int8_embedding else "fp32"
        if cfg.dev_data is not None and cfg.dev_data.is_dir():
            manifest["served_accuracy"] = served_accuracy(tmp, cfg.dev_data, log)
        write_manifest(tmp, manifest)
        load_manifest(tmp)  # the service's own check must accept what we wrote
        if not passed:
            failed = {s: [g for g, r in p["fp32"].items() if not r["passed"]] for s, p in parity.items()}
            raise ValueError(f"parity check failed for {failed}: {json.dumps(parity)}")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return manifest
