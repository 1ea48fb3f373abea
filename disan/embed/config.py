"""`EmbedConfig` (TORCH-FREE): one `disan embed` job, frozen, each default in this one place. The
command line (`disan.embed.cli`) builds it from its flags, whose defaults are these; the
single-process job (`disan.embed.cli.Job`) and the Ray one (`disan.embed.on_ray.run_ray`) read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, kw_only=True)
class EmbedConfig:
    input: str | Path                   # a local file; on Ray also a URI (s3://...)
    output: str | Path                  # a folder of committed shards and _progress.json
    column: str = "text"                # the text column (JSONL key, CSV header, Parquet column)
    id_column: str | None = None        # the rows' ids (None: the row number)
    input_format: str | None = None     # None: from the input's suffix
    output_format: str | None = None    # None: from the output's suffix, else parquet
    bundle: Path = Path("models/default")
    providers: str = "auto"             # as `disan serve --providers`
    variant: str = "auto"
    threads: int = 0                    # onnxruntime intra-op threads (0: its choice)
    batch_size: int | None = None       # sentences per onnxruntime call (None: the provider's)
    normalize: bool = False             # L2-normalise the vectors
    dimensions: int | None = None       # a shorter size the bundle serves (None: the whole vector)
    sparse: bool = False                # also each text's sparse lexical vector (the bundle's lexical table)
    long_texts: str = "window"          # window | truncate | error (disan.Encoder)
    window_overlap: int = 0             # tokens consecutive windows share
    shard_size: int = 10_000            # rows per committed shard
    on_bad_row: str = "skip"            # skip | fail
    overwrite: bool = False             # start over, deleting the shards the output holds
    no_progress: bool = False           # no progress bar
    ray: str | None = None              # a Ray address, or `local`; None: this process
    ray_actors: int = 0                 # 0: one per GPU, else one per 2 CPUs
    ray_cpus: int = 0                   # --ray local: CPUs to give it (0: all)
