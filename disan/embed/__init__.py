"""`disan embed`: a corpus file to vectors, resumable (TORCH-FREE). `cli` (the command), `inputs`
(JSONL / CSV / TXT / Parquet readers), `shards` (committed output shards, atomic writes) and
`on_ray` (`disan embed --ray`: the same work on Ray Data).

Owns: embedding a corpus offline with `disan.Encoder`.
May import: `disan.text`, `disan.bundle`, `disan.runtime`, `disan.optional`.
"""
