"""bench.gpu's Markdown tables: the offline rows, the sweep's best point and the service runs
(whichever parts ran). See bench/gpu.py."""

from __future__ import annotations


def markdown(results: dict) -> str:
    """Tables of whatever parts ran."""
    lines = [f"{results['gpu']}; {results['machine']}; onnxruntime {results['onnxruntime']}; "
             f"{results['sentences']} SNLI-test sentences, mean {results['mean_tokens']} tokens."]
    off = results.get("offline")
    if off:
        lines += ["", "| engine | batch profile (sentences / cells) | sentences/s |", "|---|---|---|"]
        for r in off["rows"]:
            rate = f"{r['sentences_per_s']:.0f}" if "sentences_per_s" in r else r.get("skipped", "-")
            lines.append(f"| {r['engine']} | {r.get('profile', '-')} | {rate} |")
        lines += [f"- {k}: {v:.3g}" for k, v in off["agreement"].items()]
    for provider, sw in (results.get("sweep") or {}).items():
        b = sw["best"]
        lines += ["", f"Sweep on {provider} ({sw['encoder']}, {sw['sentences']} sentences in random "
                  f"order): best max_batch_size={b['max_batch_size']}, max_batch_cells="
                  f"{b['max_batch_cells']} ({b['sentences_per_s']:.0f} sentences/s, p99 call "
                  f"{b['p99_call_ms']} ms)."]
    svc = results.get("service")
    if svc:
        lines += ["", "| server | workers | texts/request | sentences/s | requests/s | p50 ms | p99 ms | "
                  "GPU % | mean batch | non-2xx |", "|---" * 10 + "|"]
        for r in svc["runs"]:
            lines.append(f"| {r['config']} | {r['workers']} | {r['texts_per_request']} | "
                         f"{r['sentences_per_s']:.0f} | {r['requests_per_s']:.0f} | {r['p50_ms']} | "
                         f"{r['p99_ms']} | {r['gpu_util_pct'] or '-'} | {r['mean_batch_one_worker']} | "
                         f"{r['non2xx']} |")
    return "\n".join(lines)
