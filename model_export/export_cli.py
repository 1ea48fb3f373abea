"""`disan export`'s flags and entry point; the export itself is `model_export.export.build_bundle`."""

from __future__ import annotations

import argparse
from pathlib import Path

from disan.bundle.manifest import GRAPH_SETS, routes
from model_export.export import ExportConfig, build_bundle


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `disan export`."""
    d = ExportConfig  # the defaults
    parser.add_argument("--nli", required=True, type=Path, help="NLI checkpoint (.pt)")
    parser.add_argument("--sentiment", required=True, type=Path, help="sentiment checkpoint (.pt)")
    parser.add_argument("--embed", type=Path, help="a distilled sentence encoder checkpoint (task "
                        "'encoder', from `disan pretrain`) to serve /embed, /v1/embeddings, /similarity "
                        "and encode(); /nli keeps the NLI model's own encoder")
    parser.add_argument("--out", required=True, type=Path, help="bundle directory to write")
    parser.add_argument("--max-len", type=int, default=d.max_len, help="longest input the service accepts")
    parser.add_argument("--sets", nargs="+", choices=sorted(GRAPH_SETS), default=list(d.sets),
                        help="graph sets to write: cpu (chunked attention) and/or gpu (unchunked)")
    parser.add_argument("--no-fp16", dest="fp16", action="store_false",
                        help="gpu set in fp32 only (default: fp16, the set's default, plus fp32)")
    parser.add_argument("--quantize", choices=["int8"], help="also write a dynamically quantised cpu set")
    parser.add_argument("--int8-embedding", choices=["int8", "fp32"],
                        default="int8" if d.int8_embedding else "fp32",
                        help="int8 variant: quantise the embedding table too (4x smaller) or keep fp32")
    parser.add_argument("--embedding-storage", default=d.embedding_storage,
                        metavar="STORAGE[,MODEL=STORAGE...]",
                        help="how the word-vector tables are stored (in the file and in a running "
                        "fp32 graph): fp32, fp16 (halves the largest tensors) or int8 (per-row "
                        "symmetric, an fp32 scale per row: a quarter) or int8+int4:N (int8 but the "
                        "table's last N rows, the rarest words, in per-row int4: an eighth); "
                        "MODEL=STORAGE sets one model's "
                        "(nli, sentiment, embed; borrowed: the word table the task models borrowed, "
                        "kept beside an --embed that reads subword pieces), e.g. "
                        "int8,nli=fp16,sentiment=fp16. The tables are "
                        "rounded to what is stored before the parity check: checked as shipped")
    parser.add_argument("--matrix-storage", default=d.matrix_storage, metavar="STORAGE[,MODEL=STORAGE...]",
                        help="how every other parameter (attention, heads, projections, an "
                        "ensemble's members) is stored: fp32, or fp16 (half their bytes; each is cast "
                        "to fp32 once when the session loads); MODEL=STORAGE as for "
                        "--embedding-storage. Rounded before the parity check, like the tables")
    parser.add_argument("--dev-data", type=Path, help="staged data root (snli/dev.jsonl.gz, "
                        "sst/sst5_dev.jsonl.gz) for the variants' agreement with fp32; its test sets "
                        "(SNLI, SST-5, SST-2), where staged, give the manifest's served_accuracy")
    parser.add_argument("--dev-limit", type=int, default=d.dev_limit,
                        help="dev examples per task for agreement")
    parser.add_argument("--force", action="store_true", help="replace an existing bundle in --out")
    parser.add_argument("--name", default=d.name, help="model name the service reports (manifest `name`)")
    parser.add_argument("--attention-chunk-cells", type=int, default=d.chunk_cells, metavar="N",
                        help="cpu set: compute the token2token attention in query-row chunks of ~N "
                        "pairs (an ONNX Scan; default 1024, the fastest with 1 ORT thread per call, "
                        "bench/packing.py); 0: unchunked, like the gpu set")


def run(args: argparse.Namespace) -> int:
    """Entry point of `disan export`."""
    manifest = build_bundle(ExportConfig(
        args.nli, args.sentiment, args.out, embed=args.embed, max_len=args.max_len, sets=tuple(args.sets),
        fp16=args.fp16, int8=args.quantize == "int8", int8_embedding=args.int8_embedding == "int8",
        dev_data=args.dev_data, dev_limit=args.dev_limit, force=args.force, name=args.name,
        chunk_cells=args.attention_chunk_cells, embedding_storage=args.embedding_storage,
        matrix_storage=args.matrix_storage))
    sizes = {p.name: p.stat().st_size for p in sorted(Path(args.out).iterdir())}
    for name, size in sizes.items():
        print(f"{size / 1e6:9.2f} MB  {name}")
    print(f"{sum(sizes.values()) / 1e6:9.2f} MB  total in {args.out}")
    print("routes: " + ", ".join(f"{route} -> {graph}" for route, graph in routes(manifest).items()))
    for set_name, report in manifest["verification"]["sets"].items():
        for graph, g in report["fp32"].items():
            print(f"parity {set_name}/{graph}: max |ORT - torch| = {g['max_abs_diff']:.2e}, "
                  f"labels identical: {g['labels_identical']}")
    for set_name, entry in manifest["sets"].items():
        for variant, info in entry["variants"].items():
            for graph, agr in info.get("agreement_vs_fp32", {}).items():
                if isinstance(agr, dict):
                    print(f"{set_name}/{variant} {graph}: {agr}")
    return 0
