"""The graphs of a bundle (torch + onnx): `wrappers` (thin export wrappers around `disan.model`
and the fp32 export), `cache` (traced graphs reused across exports, $DISAN_GRAPH_CACHE),
`onnx_files` (fp16 / int8 variants, extraction, checks), `weights` (parameter-named weights stored
once), `storage` (fp16 / int8 storage of tables and matrices) and `int4_tail` (a table's rarest
rows in int4).

May import: `disan` and `disan.optional`; the rest of `model_export` imports it, never the reverse.
"""
