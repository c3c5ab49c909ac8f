"""bench.py's speed and memory table end to end on a tiny shape, with consistent numbers (the sweep: test_sweep.py)."""
import json
import math

import bench


def test_bench_table(tmp_path):
    rows = bench.main(["--size=small", "--block_size=32", "--batch_size=2", "--warmup=1", "--iters=1", "--repeats=2",
                       "--sample_tokens=4", "--device=cpu", "--runs=vertical,attnres", f"--json={tmp_path / 'b.json'}"])
    saved = json.load(open(tmp_path / "b.json"))
    assert [r["label"] for r in saved["results"]] == ["vanilla", "vertical", "attnres"]
    by_label = {r["label"]: r for r in rows}
    assert by_label["vanilla"]["train_speed_ratio"] == 1.0 and by_label["vanilla"]["extra_params"] == 0
    assert by_label["vertical"]["extra_params"] == 6 * 7 // 2  # eq. 7 at the default 6 layers
    for r in rows:
        for key in ("train_tok_s", "train_speed_ratio", "peak_mem_ratio", "sample_tok_s_cache"):
            assert math.isfinite(r[key]) and r[key] > 0, (r["label"], key)
        assert r["params"] == by_label["vanilla"]["params"] + r["extra_params"]
