"""How fast can the teacher (all-mpnet-base-v2) encode the corpus on this CPU, and at what fidelity?

`disan teacher` runs the teacher in PyTorch (sentence-transformers), in fp32 or under bf16 autocast
(`--precision auto` picks one per machine; the run records which). This compares both with
onnxruntime, in one run on the same corpus sentences and threads: the teacher exported to ONNX, in
fp32 and with its weights quantised to int8 (onnxruntime's dynamic quantisation, as `model_export` does for
DiSAN). Fidelity is the cosine of each sentence's vector to PyTorch fp32's (min and mean): a teacher
that is faster but points elsewhere teaches the student something else.

    python -m research.analyses.teacher_backends --corpus runs/corpus --threads 2 [--sentences 512]
"""

from __future__ import annotations

import argparse
import logging
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import QuantType, quant_pre_process, quantize_dynamic

from bench.report import run_and_report
from disan.distill.corpus.build import read_corpus
from disan.distill.teacher import TEACHERS, bf16_autocast, native_bf16, resolved_precision
from disan.train.word_vectors import _sentence_encoder

# name -> quantize_dynamic keyword arguments (None: the fp32 graph as exported)
VARIANTS: dict[str, dict | None] = {
    "onnxruntime fp32": None,
    # onnxruntime's defaults for op type MatMul
    "onnxruntime int8, all MatMuls": {},
    # MatMulConstBOnly: only the MatMuls whose second input is a weight
    "onnxruntime int8, weight MatMuls": {"extra_options": {"MatMulConstBOnly": True}},
    "onnxruntime int8, weight MatMuls, per channel, reduced range": {
        "extra_options": {"MatMulConstBOnly": True}, "per_channel": True, "reduce_range": True},
    # each layer's second feed-forward MatMul kept in fp32: its input, after GELU, carries the
    # outliers that one int8 scale per tensor cannot hold
    "onnxruntime int8, weight MatMuls but the feed-forward outputs, per channel": {
        "extra_options": {"MatMulConstBOnly": True}, "per_channel": True,
        "exclude": "/output/dense/"},
}


def export_teacher(model, path: Path, sample: list[str]) -> None:
    """The transformer plus mean pooling and L2 normalisation (what the teacher's vector is)."""
    import torch  # optional (`train` extra), as in disan.distill.teacher

    class Pooled(torch.nn.Module):
        def __init__(self, transformer: torch.nn.Module) -> None:
            super().__init__()
            self.transformer = transformer

        def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            hidden = self.transformer(input_ids=ids, attention_mask=mask).last_hidden_state  # [B,n,768]
            weight = mask.unsqueeze(-1).to(hidden.dtype)                                   # [B,n,1]
            mean = (hidden * weight).sum(1) / weight.sum(1).clamp(min=1e-9)                # [B,768]
            return torch.nn.functional.normalize(mean, dim=-1)

    batch = model.tokenizer(sample, padding=True, return_tensors="pt")
    dynamic = {"ids": {0: "batch", 1: "tokens"}, "mask": {0: "batch", 1: "tokens"}}
    # the TorchScript exporter: HF's MPNet attention traces there without a dynamic-shape spec
    torch.onnx.export(Pooled(model[0].auto_model.eval()), (batch["input_ids"], batch["attention_mask"]),
                      str(path), input_names=["ids", "mask"], output_names=["vector"],
                      dynamic_axes=dynamic, opset_version=17, dynamo=False)


def ort_encoder(path: Path, tokenizer, threads: int, batch_size: int):
    """`encode(sentences)` of an exported teacher graph: vectors in input order, from
    length-sorted batches as sentence-transformers makes them. The session is made here, so
    loading and optimising the graph is not timed."""
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return lambda sentences: _ort_encode(session, tokenizer, sentences, batch_size)


def _ort_encode(session, tokenizer, sentences: list[str], batch_size: int) -> np.ndarray:
    order = np.argsort([-len(s) for s in sentences], kind="stable")
    out = np.zeros((len(sentences), session.get_outputs()[0].shape[-1] or 768), dtype=np.float32)
    for i in range(0, len(order), batch_size):
        idx = order[i:i + batch_size]
        batch = tokenizer([sentences[j] for j in idx], padding=True, truncation=True, return_tensors="np")
        out[idx] = session.run(None, {"ids": batch["input_ids"].astype(np.int64),
                                      "mask": batch["attention_mask"].astype(np.int64)})[0]
    return out


def timed(encode, sentences: list[str], warm: list[str], repeats: int) -> tuple[np.ndarray, float]:
    """(vectors, best seconds) of `encode(sentences)` over `repeats` calls, after one untimed call
    on `warm`."""
    encode(warm)
    best, vectors = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        vectors = encode(sentences)
        best = min(best, time.perf_counter() - start)
    return vectors, best


def run(args: argparse.Namespace) -> dict:
    import torch  # optional (`train` extra), as in disan.distill.teacher

    torch.set_num_threads(args.threads)
    sentences = read_corpus(args.corpus)[0][args.start:args.start + args.sentences]
    warm = sentences[:args.batch_size]
    model = _sentence_encoder(TEACHERS["mpnet"][0], "cpu")

    def torch_fp32(texts: list[str]) -> np.ndarray:
        with torch.inference_mode():
            return model.encode(texts, batch_size=args.batch_size, normalize_embeddings=True,
                                convert_to_numpy=True, show_progress_bar=False)

    def torch_bf16(texts: list[str]) -> np.ndarray:
        with bf16_autocast("cpu", "bf16"):
            return torch_fp32(texts)

    reference, seconds = timed(torch_fp32, sentences, warm, args.repeats)
    rows = [{"backend": "PyTorch fp32", "sentences_per_s": len(sentences) / seconds,
             "cos_min": 1.0, "cos_mean": 1.0}]

    def measure(name: str, encode) -> None:  # a row: its speed, and its vectors against fp32's
        vectors, seconds = timed(encode, sentences, warm, args.repeats)
        cos = (vectors * reference).sum(axis=1)
        rows.append({"backend": name, "sentences_per_s": len(sentences) / seconds,
                     "cos_min": float(cos.min()), "cos_mean": float(cos.mean())})

    measure("PyTorch bf16 autocast", torch_bf16)
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "mpnet.onnx"
        export_teacher(model, plain, sentences[:4])
        pre = Path(tmp) / "mpnet-pre.onnx"
        logging.getLogger().setLevel(logging.ERROR)  # the quantiser's advice to pre-process, done
        quant_pre_process(str(plain), str(pre), skip_symbolic_shape=True)
        for name, quant in VARIANTS.items():
            path = plain
            if quant is not None:
                path = Path(tmp) / f"mpnet-{len(rows)}.onnx"
                quant = dict(quant)
                if "exclude" in quant:  # node names that hold this piece (the exporter's module paths)
                    part = quant.pop("exclude")
                    quant["nodes_to_exclude"] = [node.name for node in onnx.load(str(pre)).graph.node
                                                 if node.op_type == "MatMul" and part in node.name
                                                 and "/attention/" not in node.name]
                quantize_dynamic(str(pre), str(path), weight_type=QuantType.QInt8,
                                 op_types_to_quantize=["MatMul"], **quant)
            measure(name, ort_encoder(path, model.tokenizer, args.threads, args.batch_size))
    return {"machine": platform.processor() or platform.machine(), "cpu_flags_bf16": native_bf16("cpu"),
            "auto_precision": resolved_precision("cpu", "auto"),  # what `disan teacher` runs in here
            "threads": args.threads, "sentences": len(sentences), "start_row": args.start,
            "batch_size": args.batch_size, "repeats": args.repeats, "rows": rows}


def markdown(results: dict) -> str:
    base = results["rows"][0]["sentences_per_s"]
    lines = [f"{results['sentences']} corpus sentences, {results['threads']} threads, batch "
             f"{results['batch_size']}, best of {results['repeats']}; "
             f"native bf16: {results['cpu_flags_bf16']}; `--precision auto` runs "
             f"{results.get('auto_precision', 'not recorded')}",
             "", "| backend | sentences/s | x PyTorch fp32 | cosine to PyTorch fp32 (min / mean) |",
             "| --- | ---: | ---: | --- |"]
    for row in results["rows"]:
        rate = row["sentences_per_s"]
        lines.append(f"| {row['backend']} | {rate:.1f} | {rate / base:.2f} | "
                     f"{row['cos_min']:.4f} / {row['cos_mean']:.4f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=Path("runs/corpus"))
    parser.add_argument("--start", type=int, default=40_000, help="first corpus row used")
    parser.add_argument("--sentences", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64, help="disan teacher's default")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--json", type=Path, default=Path("bench/results/teacher_backends.json"))
    return run_and_report(parser, run, markdown, argv)


if __name__ == "__main__":
    from research.cli import run_tool  # only a script run needs it

    raise SystemExit(run_tool(main, "research.analyses.teacher_backends"))
