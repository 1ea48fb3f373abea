"""bench/memory.py: each bundle's resident memory, measured in a process of its own."""

from __future__ import annotations

import argparse
import sys

import pytest

from bench import memory

pytest.importorskip("onnxruntime")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_each_bundle_is_measured_after_every_route_ran(tiny_bundle):
    results = memory.run(argparse.Namespace(bundles=[tiny_bundle, tiny_bundle]))
    assert len(results["rows"]) == 2
    for row in results["rows"]:
        assert 0 < row["rss_before_mib"] < row["rss_after_mib"] <= row["peak_mib"]
        assert {"encoder", "nli_head", "sentiment"} <= set(row["graphs"])
    assert str(tiny_bundle) in memory.markdown(results)
