"""`recipes/benchmarks/streaming/`: the paired ratio, its report, and the shards it streams (fast, no training)."""

import json
import os

import datasets
import pytest

from recipes.benchmarks import streaming


def run(repeat, variant, tps):
    return {"repeat": repeat, "variant": variant, "tokens_per_second": tps}


def test_the_ratio_pairs_the_variants_within_each_repeat():
    runs = [
        run(0, "materialised", 100.0), run(0, "streamed", 90.0),
        run(1, "streamed", 110.0), run(1, "materialised", 100.0),
        run(2, "materialised", 200.0), run(2, "streamed", 196.0),
        run(3, "materialised", 1.0),  # incomplete: left out
    ]  # fmt: skip
    summary = streaming.summarize(runs)
    assert summary["repeats"] == 3
    assert summary["throughput_ratio"] == pytest.approx(0.98)  # median of 0.9, 1.1, 0.98, not of the pooled tokens/s
    assert summary["throughput_ratio_spread"]["min"] == pytest.approx(0.9)
    assert summary["tokens_per_second"] == {"materialised": 100.0, "streamed": 110.0}
    assert summary["holds"] is True
    missed = streaming.summarize([run(0, "materialised", 100.0), run(0, "streamed", 94.0)])
    assert missed["holds"] is False and "criterion >= 0.95: MISSED" in streaming.format_report(missed, 1e5)
    with pytest.raises(ValueError, match="no repeat ran every variant"):
        streaming.summarize([run(0, "streamed", 1.0)])


def test_the_shards_hold_the_train_documents_in_order_once(tmp_path):
    texts = datasets.Dataset.from_dict(
        {"text": [f"doc {i}" for i in range(37)], "split": ["eval" if i % 9 == 0 else "train" for i in range(37)]}
    )
    files = streaming.write_shards(texts, str(tmp_path), num_shards=4)
    assert [os.path.basename(f) for f in files] == [f"c4-train.{i:05d}-of-00004.json" for i in range(4)]
    rows = [[json.loads(line) for line in open(f)] for f in files]
    assert [len(r) for r in rows] == [8, 8, 8, 8]  # 32 train documents, contiguous slices
    assert [row["text"] for r in rows for row in r] == [f"doc {i}" for i in range(37) if i % 9]
    assert set(rows[0][0]) == {"text", "timestamp", "url"}  # C4's schema
    stamp = os.stat(files[0]).st_mtime_ns
    assert streaming.write_shards(texts, str(tmp_path), num_shards=4) == files
    assert os.stat(files[0]).st_mtime_ns == stamp  # cached: not written again
