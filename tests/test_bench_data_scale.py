"""``bench/data_scale.py``'s pure part: memory growth per corpus token, the peak RSS and
(where the runs read ``/proc/self/status``) the anonymous and file-backed memory apart."""

from __future__ import annotations

import pytest
from conftest import load_bench

bench = load_bench("data_scale.py")


def test_growth_splits_anonymous_from_file_backed_memory_per_token():
    small = {"peak_rss_mb": 700.0, "RssAnon": 480.0, "RssFile": 100.0}
    large = {"peak_rss_mb": 736.0, "RssAnon": 481.0, "RssFile": 134.0}
    got = bench.growth(small, large, tokens=36 * 2**20)
    assert got == pytest.approx({"peak_rss_mb": 1.0, "RssAnon": 1 / 36, "RssFile": 34 / 36})


def test_growth_without_proc_reports_the_peak_alone():
    got = bench.growth({"peak_rss_mb": 1.0}, {"peak_rss_mb": 2.0, "RssAnon": 5.0}, tokens=2**20)
    assert got == {"peak_rss_mb": 1.0}
