"""bench.py's sweep: the aggregation over seeds on hand-made numbers, and a tiny two-seed sweep that is
interrupted, resumed without retraining what it finished, and never reuses a run of another configuration."""
import json
import math
import os
import shutil

import numpy as np
import pytest

import bench
from conftest import ROOT


def runs(label, losses):
    return [{"label": label, "seed": seed, "val_loss": loss} for seed, loss in losses.items()]


def test_aggregate_mean_std_and_paired_standard_error():
    rows = bench.aggregate(
        runs("vanilla", {1: 2.00, 2: 2.10, 3: 1.90}) +
        runs("steady", {1: 1.95, 2: 2.04, 3: 1.86}) +      # 0.05, 0.06, 0.04 below vanilla, seed by seed
        runs("noisy", {1: 2.10, 2: 2.00, 3: 1.95}) +       # +0.10, -0.10, +0.05: no consistent difference
        runs("unpaired", {1: 2.50, 2: 2.30, 9: 9.99}) +    # seed 9 has no vanilla run to pair with
        runs("single", {2: 2.20}),
        ["vanilla", "steady", "noisy", "unpaired", "single", "absent"])
    by = {r["label"]: r for r in rows}
    assert list(by) == ["vanilla", "steady", "noisy", "unpaired", "single"]  # table order, labels with runs only
    assert by["vanilla"]["mean"] == pytest.approx(2.0) and by["vanilla"]["std"] == pytest.approx(0.1)
    assert by["vanilla"]["delta"] is None and not by["vanilla"]["marked"]
    # steady: differences -0.05, -0.06, -0.04 -> mean -0.05, sample std 0.01, SE 0.01 / sqrt(3)
    assert by["steady"]["delta"] == pytest.approx(-0.05)
    assert by["steady"]["delta_se"] == pytest.approx(0.01 / math.sqrt(3))
    assert by["steady"]["marked"]  # |-0.05| > 2 * 0.0058, although its own std (0.09) is larger than 0.05
    assert by["steady"]["std"] == pytest.approx(0.09)
    # noisy: differences 0.1, -0.1, 0.05 -> mean 0.05/3, SE 0.1041/sqrt(3) = 0.0601: within noise
    assert by["noisy"]["delta"] == pytest.approx(0.05 / 3)
    assert by["noisy"]["delta_se"] == pytest.approx(math.sqrt(((0.1 - 0.05 / 3) ** 2 + (-0.1 - 0.05 / 3) ** 2 +
                                                                (0.05 - 0.05 / 3) ** 2) / 2) / math.sqrt(3))
    assert not by["noisy"]["marked"]
    # unpaired: the mean covers its three seeds, the difference only the two seeds vanilla also ran
    assert by["unpaired"]["n"] == 3 and by["unpaired"]["n_pairs"] == 2
    assert by["unpaired"]["mean"] == pytest.approx((2.5 + 2.3 + 9.99) / 3)
    assert by["unpaired"]["delta"] == pytest.approx((0.5 + 0.2) / 2)
    assert by["unpaired"]["delta_se"] == pytest.approx(0.15) and by["unpaired"]["marked"]  # 0.35 > 2 * 0.15
    # one seed: a difference, but no standard error, so never marked
    assert by["single"]["std"] is None and by["single"]["delta"] == pytest.approx(0.1)
    assert by["single"]["delta_se"] is None and not by["single"]["marked"]


@pytest.fixture
def small_data(data_dir, tmp_path):
    """The prepared Shakespeare set with its validation split cut to 4,096 tokens: each run's final evaluation
    over the whole split stays quick."""
    folder = tmp_path / "data" / "shakespeare"
    shutil.copytree(os.path.join(data_dir, "shakespeare"), folder)
    meta = json.load(open(folder / "meta.json"))
    np.fromfile(folder / "val.bin", dtype=meta["dtype"])[:4096].tofile(folder / "val.bin")
    json.dump({**meta, "val_tokens": 4096}, open(folder / "meta.json", "w"))
    return str(tmp_path / "data")


def sweep(data_dir, tmp_path, *extra):
    return bench.main(["--size=small", "--block_size=32", "--batch_size=2", "--device=cpu", "--runs=vertical",
                       "--train_iters=4", "--seeds=2", "--eval_points=2", f"--data_dir={data_dir}",
                       f"--results={tmp_path / 'results'}", f"--runs_dir={tmp_path / 'runs'}",
                       "--train_args=--eval_iters=1 --n_layer=2", *extra])


def test_sweep_is_interrupted_resumed_and_keyed_by_configuration(small_data, tmp_path):
    data_dir = small_data
    readme_before = open(os.path.join(ROOT, "README.md")).read()
    json_path = tmp_path / "results" / "results.json"
    sweep(data_dir, tmp_path, "--max_runs", "3")  # stops after 3 of the 4 runs (vanilla, vertical) x (1337, 1338)
    first = json.load(open(json_path))["runs"]
    assert [(r["label"], r["seed"]) for r in first] == [("vanilla", 1337), ("vertical", 1337), ("vanilla", 1338)]
    stamps = {p: os.path.getmtime(tmp_path / "runs" / p / "ckpt.pt") for p in os.listdir(tmp_path / "runs")}

    rows = sweep(data_dir, tmp_path)  # the same command again: trains only the missing run
    saved = json.load(open(json_path))
    assert saved["runs"][:3] == first and (saved["runs"][3]["label"], saved["runs"][3]["seed"]) == ("vertical", 1338)
    assert {p: os.path.getmtime(tmp_path / "runs" / p / "ckpt.pt") for p in stamps} == stamps  # none retrained
    assert len(os.listdir(tmp_path / "runs")) == 4
    for r in saved["runs"]:
        assert r["steps"] == 4 and math.isfinite(r["val_loss"]) and r["val_tokens"] == 4095
        assert [p[0] for p in r["curve"]] == [0, 2 * 2 * 32, 4 * 2 * 32]  # tokens seen at each evaluation
    by = {r["label"]: r for r in rows}
    losses = {(r["label"], r["seed"]): r["val_loss"] for r in saved["runs"]}
    assert by["vertical"]["delta"] == pytest.approx(((losses["vertical", 1337] - losses["vanilla", 1337]) +
                                                     (losses["vertical", 1338] - losses["vanilla", 1338])) / 2)
    assert saved["summary"] == rows
    table = open(tmp_path / "results" / "RESULTS.md").read()
    assert f"| vertical | 2 | {by['vertical']['mean']:.4f} ± {by['vertical']['std']:.4f} |" in table
    assert "| vanilla | 2 |" in table
    assert "--max_runs" not in table and "--runs=vertical" in table  # the command that regenerates the table
    try:
        import matplotlib  # noqa: F401
        assert (tmp_path / "results" / "curves.png").stat().st_size > 10_000
    except ImportError:
        assert not (tmp_path / "results" / "curves.png").exists()

    sweep(data_dir, tmp_path, "--eval_batch_size=8", "--seed=1338", "--seeds=1")  # the same runs: none trained
    assert len(json.load(open(json_path))["runs"]) == 4
    changed_lr = "--train_args=--eval_iters=1 --n_layer=2 --learning_rate=2e-3"
    assert sweep(data_dir, tmp_path, "--table_only", changed_lr) == []  # new configuration, nothing trained
    assert len(json.load(open(json_path))["runs"]) == 4
    sweep(data_dir, tmp_path, "--max_runs=1", changed_lr)
    changed = json.load(open(json_path))["runs"]
    assert len(changed) == 5 and changed[4]["label"] == "vanilla" and changed[4]["key"] != first[0]["key"]
    assert open(os.path.join(ROOT, "README.md")).read() == readme_before  # only --update_readme rewrites it
