"""Running a bundle (TORCH-FREE, onnxruntime): `ort_session` (frozen RuntimeOptions, providers,
threads, one graph's session), `runtime` (a loaded bundle: its graph set, routes, numpy in/out),
`batching` (length-sorted batches cut by the provider's cell budget), `encoder` (`disan.Encoder`:
texts in, vectors / similarities / NLI / sentiment out, long texts windowed) and `tasks` (the one
NLI path and the prediction dicts the service shares).

Owns: the product's inference path in Python; the service and `disan embed` run on it.
May import: `disan.text`, `disan.bundle`, `disan.optional`. Never torch, never the training side.
"""
