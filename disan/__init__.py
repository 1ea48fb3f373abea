"""DiSAN: Directional Self-Attention Network sentence encoders (Shen et al., AAAI 2018).

`disan.Encoder` (disan/runtime/encoder.py, on onnxruntime) is the Python API: text in, vectors out.
Packages by concept; each may import only those before it in this order (tests/repo/test_structure.py):

    text      tokenizer, long-text windows                          torch-free
    model.py  all model math (one file)                             torch
    bundle    the manifest contract, lineage, fingerprints          torch-free
    runtime   onnxruntime sessions, a loaded bundle, batching, Encoder   torch-free
    embed     `disan embed` (corpus files, shards, Ray)  | data: data sets, recipes, STS pairs
    train     `disan train`: config, loop, checkpoints, word vectors
    distill   `disan distill ...`: corpus, teachers, pretraining and its losses, merge, vocab
    eval      `disan eval`: tasks, STS, transfer
    cli.py    the `disan` console script; optional.py (optional imports -> one-line hints) is
              usable from every layer

The service and `disan embed` need only text, bundle and runtime (never torch).
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    """`from disan import Encoder` without importing onnxruntime for `import disan` itself."""
    if name == "Encoder":
        from disan.runtime.encoder import Encoder  # lazy: onnxruntime is optional (the serve/embed extras)

        return Encoder
    raise AttributeError(f"module 'disan' has no attribute {name!r}")
