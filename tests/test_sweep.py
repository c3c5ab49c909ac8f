"""sweep.py: the aggregation over seeds on hand-made numbers; a tiny two-seed sweep that is interrupted, resumed
without retraining what it finished, and never reuses a run of another configuration; the ablations' points,
which reuse the main table's runs by key, and every ablation's table and figure on a tiny run; two sweeps into one
results folder at once."""
import json
import math
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from conftest import ROOT
from tools import stats, sweep
from train import ConfigError


def runs(label, losses):
    return [{"label": label, "seed": seed, "val_loss": loss} for seed, loss in losses.items()]


def test_aggregate_mean_std_and_paired_standard_error():
    rows = sweep.aggregate(
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


def test_frontier_pairs_each_run_with_the_dense_models_of_its_seed_at_the_same_x():
    dense = [{"label": f"dense-{n}", "seed": s, "key": f"d{n}{s}", "val_loss": 3.0 - 0.2 * n - 0.01 * s}
             for n in (1, 2, 3) for s in (1, 2)]
    gated = [{"label": "gated", "seed": s, "key": f"g{s}", "val_loss": 2.5} for s in (1, 2)]
    xs = {r["key"]: [("flops", "dense", 10.0 * int(r["label"][-1]))] for r in dense}
    xs |= {"g1": [("flops", "gated", 15.0)], "g2": [("flops", "gated", 40.0)]}  # g2: more FLOPs than dense-3
    pair = sweep.frontier_pair(dense + gated, xs, "dense")
    assert pair(gated[0]) == pytest.approx((2.8 - 0.01 + 2.6 - 0.01) / 2)  # halfway between dense-1 and dense-2
    assert pair(gated[1]) == pytest.approx(2.4 - 0.02)  # held at the largest dense model of its seed
    assert pair(dense[0]) is None  # the reference series itself
    row = sweep.aggregate(dense + gated, ["dense-1", "gated"], pair)[1]
    assert row["n_pairs"] == 2 and row["delta"] == pytest.approx(((2.5 - 2.69) + (2.5 - 2.38)) / 2)


def cut_data(data_dir, tmp_path, val_tokens):
    """The prepared Shakespeare set with its validation split cut short: each run's final evaluation over the
    whole split stays quick."""
    folder = tmp_path / "data" / "shakespeare"
    shutil.copytree(os.path.join(data_dir, "shakespeare"), folder)
    meta = json.load(open(folder / "meta.json"))
    np.fromfile(folder / "val.bin", dtype=meta["dtype"])[:val_tokens].tofile(folder / "val.bin")
    json.dump({**meta, "val_tokens": val_tokens}, open(folder / "meta.json", "w"))
    return str(tmp_path / "data")


@pytest.fixture
def small_data(data_dir, tmp_path):
    return cut_data(data_dir, tmp_path, 4096)


@pytest.fixture
def tiny_data(data_dir, tmp_path):
    return cut_data(data_dir, tmp_path, 1024)


def run_sweep(data_dir, tmp_path, *extra):
    return sweep.main(["--size=small", "--block_size=32", "--batch_size=2", "--device=cpu", "--runs=vertical",
                       "--train_iters=4", "--seeds=2", "--eval_points=2", f"--data_dir={data_dir}",
                       f"--results={tmp_path / 'results'}", f"--runs_dir={tmp_path / 'runs'}", "--reuse=",
                       "--n_layer=2", "--train_args=--eval_iters=1", *extra])


def test_a_learners_sweep_trains_into_their_folder_and_says_so(small_data, tmp_path, monkeypatch, capsys):
    """The README's comparison as a learner runs it: its defaults train every run (the committed runs are copied only
    where --reuse names them) into out/sweep of the folder it runs in, each as `train.py --model LABEL`; the table
    says which runs this command trained, and on which machine; the repository's results and README stay as they
    are, --update_readme included (no page holds a table of out/sweep)."""
    def snapshot():
        return {p: open(os.path.join(ROOT, p), "rb").read() for p in ("README.md", "results/results.json",
                                                                      "results/RESULTS.md", "docs/results.md")}
    before = snapshot()
    monkeypatch.chdir(tmp_path)
    argv = ["--size=small", "--block_size=32", "--batch_size=2", "--device=cpu", "--runs=vertical-unet",
            "--train_iters=2", "--seeds=1", "--eval_points=1", f"--data_dir={small_data}", "--n_layer=2",
            "--train_args=--eval_iters=1", "--update_readme"]
    sweep.main(argv)
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("done in ") and last.endswith(": 2 runs trained by this command; the table: "
                                                         f"{os.path.join('out', 'sweep', 'RESULTS.md')}"), last
    table = open(tmp_path / "out" / "sweep" / "RESULTS.md").read()
    assert "| trained | 2 by this command, on CPU (" in table and "earlier" not in table and "copied" not in table
    runs = json.load(open(tmp_path / "out" / "sweep" / "results.json"))["runs"]
    assert [r["label"] for r in runs] == ["vanilla", "vertical-unet"] and not any(r.get("reused") for r in runs)
    folder = next(p for p in os.listdir(tmp_path / "out" / "sweep") if p.startswith("vertical-unet-seed"))
    ckpt = torch.load(tmp_path / "out" / "sweep" / folder / "ckpt.pt", weights_only=True)
    assert (ckpt["label"], ckpt["model_name"], ckpt["model_args"]["va_map"]) == ("vertical-unet", "vertical", "unet")
    sweep.main([*argv, "--table_only"])  # the same table again: nothing trained now
    table = open(tmp_path / "out" / "sweep" / "RESULTS.md").read()
    assert "| trained | none by this command; 2 by an earlier command, on CPU (" in table
    assert snapshot() == before
    # a statistic over training, from the sweep's results: the unet map's entropy, logged at each evaluation
    capsys.readouterr()
    stats.main(["--stat", "va_entropy"])
    out = capsys.readouterr().out
    logged = runs[1]["stats_curve"]
    assert f"vertical-unet, seed 1337: va_entropy {logged[-1][1]['va_entropy']:.4g} at {logged[-1][0]:,} tokens" in out
    assert os.path.getsize(tmp_path / "out" / "sweep" / "va_entropy.png") > 0
    with pytest.raises(ConfigError, match="no run of vanilla .* logged --stat va_entropy"):
        stats.main(["--stat", "va_entropy", "--runs", "vanilla"])


def test_sweep_is_interrupted_resumed_and_keyed_by_configuration(small_data, tmp_path):
    data_dir = small_data
    readme_before = open(os.path.join(ROOT, "README.md")).read()
    json_path = tmp_path / "results" / "results.json"
    run_sweep(data_dir, tmp_path, "--max_runs", "3")  # stops after 3 of the 4 runs (vanilla, vertical) x (1337, 1338)
    first = json.load(open(json_path))["runs"]
    assert [(r["label"], r["seed"]) for r in first] == [("vanilla", 1337), ("vertical", 1337), ("vanilla", 1338)]
    assert "**In progress: 3 of 4 runs** (every point of seed 1337)" in open(tmp_path / "results" / "RESULTS.md").read()
    stamps = {p: os.path.getmtime(tmp_path / "runs" / p / "ckpt.pt") for p in os.listdir(tmp_path / "runs")}

    rows = run_sweep(data_dir, tmp_path)  # the same command again: trains only the missing run
    saved = json.load(open(json_path))
    assert saved["runs"][:3] == first and (saved["runs"][3]["label"], saved["runs"][3]["seed"]) == ("vertical", 1338)
    assert {p: os.path.getmtime(tmp_path / "runs" / p / "ckpt.pt") for p in stamps} == stamps  # none retrained
    assert len(os.listdir(tmp_path / "runs")) == 4
    for r in saved["runs"]:
        assert r["steps"] == 4 and math.isfinite(r["val_loss"]) and r["val_tokens"] == 4095
        assert [p[0] for p in r["curve"]] == [0, 2 * 2 * 32, 4 * 2 * 32]  # tokens seen at each evaluation
        assert 0 < r["cpu_seconds"]
        # the stats() train.py logged at each evaluation (vertical: its map's entropy; vanilla has none)
        assert [p[0] for p in r["stats_curve"]] == [p[0] for p in r["curve"]]
        assert all(("va_entropy" in p[1]) == (r["label"] == "vertical") for p in r["stats_curve"])
        assert r["machine"].startswith("CPU (") and f"torch {torch.__version__}" in r["machine"]
    by = {r["label"]: r for r in rows}
    losses = {(r["label"], r["seed"]): r["val_loss"] for r in saved["runs"]}
    assert by["vertical"]["delta"] == pytest.approx(((losses["vertical", 1337] - losses["vanilla", 1337]) +
                                                     (losses["vertical", 1338] - losses["vanilla", 1338])) / 2)
    assert saved["summary"] == rows
    table = open(tmp_path / "results" / "RESULTS.md").read()
    assert f"| vertical | 2 | {by['vertical']['mean']:.4f} ± {by['vertical']['std']:.4f} |" in table
    assert "| vanilla | 2 |" in table and "In progress" not in table
    assert "--max_runs" not in table and "`python -m tools.sweep --size=small" in table and "--runs=vertical" in table
    assert saved["command"][:2] == ["-m", "tools.sweep"]
    try:
        import matplotlib  # noqa: F401
        assert (tmp_path / "results" / "curves.png").stat().st_size > 10_000
    except ImportError:
        assert not (tmp_path / "results" / "curves.png").exists()

    run_sweep(data_dir, tmp_path, "--eval_batch_size=8", "--seed=1338", "--seeds=1")  # the same runs: none trained
    assert len(json.load(open(json_path))["runs"]) == 4
    changed_lr = "--train_args=--eval_iters=1 --learning_rate=2e-3"
    assert run_sweep(data_dir, tmp_path, "--table_only", changed_lr) == []  # new configuration, nothing trained
    assert len(json.load(open(json_path))["runs"]) == 4
    run_sweep(data_dir, tmp_path, "--max_runs=1", changed_lr)
    changed = json.load(open(json_path))["runs"]
    assert len(changed) == 5 and changed[4]["label"] == "vanilla" and changed[4]["key"] != first[0]["key"]
    assert open(os.path.join(ROOT, "README.md")).read() == readme_before  # only --update_readme rewrites it
    # what a run's table names is what ran: --train_args may not set the seed or the shape the sweep sets
    for owned in ("--seed=5", "--n_embd=32", "--max_iters 9"):
        with pytest.raises(ConfigError, match=f"--train_args sets {owned.split('=')[0].split()[0]}"):
            run_sweep(data_dir, tmp_path, "--table_only", f"--train_args=--eval_iters=1 {owned}")
    assert len(json.load(open(json_path))["runs"]) == 5


def plans(data_dir, *extra):
    """{ablation (or "" for the main table): {label: (options, key) of seed 1337}} at the main table's budget."""
    args = sweep.parse_args([f"--data_dir={data_dir}", *extra])
    meta = sweep.read_meta(data_dir, "shakespeare")
    shape = sweep.model_shape(args, meta)
    out = {}
    for s in [sweep.main_sweep(args)] + [sweep.ablation_sweep(name, args) for name in sweep.ABLATIONS]:
        out[s["name"]] = {label: (options, key) for label, options, key in
                          sweep.plan(s, shape, args, "cpu", "float32", meta)[args.seed]}
    return out


def test_ablation_points_and_the_main_table_runs_they_reuse(data_dir):
    p = plans(data_dir)
    main = p[""]
    assert list(p["skipmiddle"]) == ([f"dense-{n}" for n in range(1, 7)] +
                                     ["gated-1.0", "gated-0.75", "gated-0.5", "gated-0.25", "gated-0.0",
                                      "gated-nocontrol", "gated-0.5-paper"])
    assert "--n_layer=3" in p["skipmiddle"]["dense-3"][0] and "--gated=False" in p["skipmiddle"]["dense-3"][0]
    assert {"--gate_target=0.25", "--gate_gamma=0.01"} <= set(p["skipmiddle"]["gated-0.25"][0])
    assert "--gate_gamma=0.0" in p["skipmiddle"]["gated-nocontrol"][0]
    assert list(p["va_lr"]) == ["vanilla", "va_lr-1e-4", "va_lr-1e-3", "va_lr-1e-2", "va_lr-1e-1"]
    assert "--va_lr=0.0001" in p["va_lr"]["va_lr-1e-4"][0]
    assert list(p["skiplayer"]) == ["vanilla", "nl1-nh2", "nl2-nh2", "nl3-nh2", "nl4-nh2", "nl5-nh2",
                                    "nl4-nh1", "nl4-nh3", "nl4-nh4"]
    assert {"--skip_layers=5", "--skip_heads=2"} <= set(p["skiplayer"]["nl5-nh2"][0])
    assert list(p["attnres_blocks"]) == ["vanilla", "blocks-1", "blocks-2", "blocks-3", "blocks-4", "blocks-6",
                                         "blocks-8", "full"]
    # the model defaults are the main table's runs, by key: copied, not trained again
    same = {("skipmiddle", "dense-6"): "skipmiddle-dense", ("skipmiddle", "gated-0.5-paper"): "skipmiddle",
            ("va_lr", "vanilla"): "vanilla", ("va_lr", "va_lr-1e-2"): "vertical",
            ("skiplayer", "nl4-nh3"): "skiplayer", ("attnres_blocks", "blocks-4"): "attnres",
            ("attnres_blocks", "full"): "attnres-full"}
    for (ablation, label), main_label in same.items():
        assert p[ablation][label] == main[main_label], (ablation, label)
    new = {(a, label) for a in sweep.ABLATIONS for label in p[a]} - set(same) - {(a, "vanilla") for a in p}
    assert len(new) == 11 + 3 + 7 + 5  # trained by the ablations: 26 per seed
    assert all(p[a][label][1] not in {key for _, key in main.values()} for a, label in new)
    saved = sweep.saved_runs(os.path.join(ROOT, "results", "results.json"))  # the committed main table holds them
    for seed in ("--seed=1337", "--seed=1338", "--seed=1339"):
        q = plans(data_dir, seed)
        assert all(q[a][label][1] in saved for a, label in same), seed

    # the x-axes read the resolved configs: the defaults' values come from the model files
    args = sweep.parse_args([f"--data_dir={data_dir}"])
    shape = sweep.model_shape(args, sweep.read_meta(data_dir, "shakespeare"))
    for name, want in {"va_lr": {"va_lr-1e-2": 0.01, "va_lr-1e-1": 0.1}, "attnres_blocks": {"blocks-4": 4, "full": 12},
                       "skiplayer": {"nl4-nh3": 3, "nl2-nh2": 2}}.items():
        s = sweep.ablation_sweep(name, args)
        configs = sweep.point_configs(s, {"shape": shape})
        for label, x in want.items():
            assert s["x"](configs[label], {})[-1][2] == x, (name, label)
    s = sweep.ablation_sweep("skiplayer", args)
    configs = sweep.point_configs(s, {"shape": shape})
    assert [a[2] for a in s["x"](configs["nl4-nh2"], {})] == [4, 2]  # on both axes: Table 1's and Table 2's
    s = sweep.ablation_sweep("skipmiddle", args)
    configs = sweep.point_configs(s, {"shape": shape})
    flops = [s["x"](configs[f"dense-{n}"], {})[0][2] for n in range(1, 7)]
    assert all(b > a for a, b in zip(flops, flops[1:]))
    assert s["x"](configs["gated-0.5"], {"est_flops_ratio": 0.5})[0][2] == pytest.approx(flops[-1] / 2)


def test_ablation_options_are_checked(data_dir):
    for bad in (["--ablation=nope"], ["--ablation=va_lr", "--n_layer=12"], ["--ablation=va_lr", "--runs=vertical"]):
        with pytest.raises(ConfigError):
            sweep.main([f"--data_dir={data_dir}", "--table_only", *bad])


@pytest.mark.slow  # (the default tier: at most 7 times a 100-step quick start)
def test_every_ablation_on_a_tiny_run(tiny_data, tmp_path):
    """One command for all four, a few points each, two seeds: vanilla is trained once per seed and copied into
    the other ablations; each gets its results.json, RESULTS.md (In progress while points are missing) and figure."""
    points = "vanilla,dense-1,gated-0.0,va_lr-1e-1,nl4-nh2,blocks-1"  # nl4-nh2: on Table 1's and Table 2's axes
    args = ["--ablation=all", "--block_size=32", "--batch_size=2", "--device=cpu", "--train_iters=2", "--seeds=2",
            "--eval_points=1", f"--data_dir={tiny_data}", f"--results={tmp_path / 'results'}",
            f"--runs_dir={tmp_path / 'runs'}", "--reuse=", "--train_args=--eval_iters=1"]
    sweep.main([*args, f"--runs={points}"])
    assert len(os.listdir(tmp_path / "runs")) == 2 * 6  # 6 labels, vanilla trained once per seed
    saved = {a: json.load(open(tmp_path / "results" / "ablations" / a / "results.json")) for a in sweep.ABLATIONS}
    assert [(r["label"], r["seed"]) for r in saved["skipmiddle"]["runs"]] == [
        (label, seed) for seed in (1337, 1338) for label in ("dense-1", "gated-0.0")]
    vanilla = [r for r in saved["va_lr"]["runs"] if r["label"] == "vanilla"]
    for a in ("skiplayer", "attnres_blocks"):
        copies = [r for r in saved[a]["runs"] if r["label"] == "vanilla"]
        assert [c["val_loss"] for c in copies] == [v["val_loss"] for v in vanilla] and all(c["reused"] for c in copies)
    gated = {r["seed"]: r for r in saved["skipmiddle"]["runs"] if r["label"] == "gated-0.0"}
    assert all("est_flops_ratio" in r["stats"] and "gate2_zero" in r["stats"] for r in gated.values())
    rows = {r["label"]: r for r in saved["skipmiddle"]["summary"]}
    assert rows["dense-1"]["delta"] is None and rows["gated-0.0"]["n_pairs"] == 2  # against the dense frontier
    table = open(tmp_path / "results" / "ablations" / "skipmiddle" / "RESULTS.md").read()
    assert "Learning to Skip the Middle Layers" in table and "| dense-1 | 2 |" in table and "(reference)" in table
    assert "`python -m tools.sweep --ablation skipmiddle --block_size=32" in table and "--runs=" in table
    assert "In progress" not in table
    try:
        import matplotlib  # noqa: F401
        for a in sweep.ABLATIONS:
            assert (tmp_path / "results" / "ablations" / a / "figure.png").stat().st_size > 10_000, a
    except ImportError:
        pass

    sweep.main([*args, "--table_only", f"--runs={points},va_lr-1e-3"])  # one more point: planned, not trained
    table = open(tmp_path / "results" / "ablations" / "va_lr" / "RESULTS.md").read()
    assert "**In progress: 4 of 6 runs**" in table and len(os.listdir(tmp_path / "runs")) == 2 * 6


# The first of two sweeps, run by this script: its first write of results.json (after it re-read the file) waits until
# the other sweep has written WAITS: it found the results folder's lock held, or it ended. Without the lock, the other
# writes its run meanwhile, which this write would drop.
FIRST = """
import os, sys, time
from tools import stats, sweep
paused, waits = sys.argv[1:3]
write = sweep.write_json

def write_when_the_other_has(path, value):
    if not os.path.exists(paused):
        open(paused, "w").close()
        while not os.path.exists(waits):
            time.sleep(0.05)
    write(path, value)

sweep.write_json = write_when_the_other_has
sweep.main(sys.argv[3:])
"""
# The second: it writes WAITS where it finds the lock held (then waits for it), and as it ends.
SECOND = """
import sys
from tools import stats, sweep
waits = sys.argv[1]
take = sweep.held

def held_or_said(path, timeout=0):
    lock = take(path)
    if lock is None:
        open(waits, "w").close()
        lock = take(path, timeout)
    return lock

sweep.held = held_or_said
try:
    sweep.main(sys.argv[2:])
finally:
    open(waits, "w").close()
"""


@pytest.mark.slow  # (the default tier: at most 7 times a 100-step quick start)
def test_two_sweeps_at_once_into_one_results_folder_keep_every_run(tiny_data, tmp_path):
    """Two sweeps at once into one --results folder, each training a seed of its own (two processes): the first
    holds its write of results.json until the second has written its run, or waits to; every run that either
    finished is in results.json."""
    def sweep_argv(seed):
        return ["--size=small", "--n_layer=1", "--block_size=32", "--batch_size=2", "--device=cpu", "--runs=vanilla",
                "--train_iters=2", "--seeds=1", f"--seed={seed}", "--eval_points=1", f"--data_dir={tiny_data}",
                f"--results={tmp_path / 'results'}", f"--runs_dir={tmp_path / 'runs'}", "--reuse=",
                "--train_args=--eval_iters=1"]
    env = {**os.environ, "PYTHONPATH": ROOT}
    logs = [open(tmp_path / f"{name}.log", "w+") for name in ("first", "second")]
    first = subprocess.Popen([sys.executable, "-c", FIRST, str(tmp_path / "paused"), str(tmp_path / "waits"),
                              *sweep_argv(1337)], env=env, stdout=logs[0], stderr=subprocess.STDOUT)
    start = time.time()
    while not (tmp_path / "paused").exists():  # the first has trained its run, read results.json, and waits
        assert first.poll() is None and time.time() - start < 300, open(tmp_path / "first.log").read()
        time.sleep(0.1)
    second = subprocess.Popen([sys.executable, "-c", SECOND, str(tmp_path / "waits"), *sweep_argv(1338)],
                              env=env, stdout=logs[1], stderr=subprocess.STDOUT)
    codes = [second.wait(timeout=300), first.wait(timeout=300)]
    assert codes == [0, 0], [open(tmp_path / f"{name}.log").read() for name in ("second", "first")]
    runs = json.load(open(tmp_path / "results" / "results.json"))["runs"]
    assert sorted((r["label"], r["seed"]) for r in runs) == [("vanilla", 1337), ("vanilla", 1338)]
