"""bench.py's speed and memory table end to end on a tiny shape, with consistent numbers (the sweep: test_sweep.py)."""
import contextlib
import io
import json
import math
import os
import shlex
import shutil
import subprocess
import sys

import pytest
import torch

from tools import bench
import model_skipmiddle as sm
import train
from common import model_from_checkpoint
from plumbing.errors import ConfigError
from conftest import ROOT, model_names


def test_bench_table(tmp_path):
    rows = bench.main(["--size=small", "--block_size=32", "--batch_size=2", "--warmup=1", "--iters=1", "--repeats=2",
                       "--sample_tokens=4", "--device=cpu", "--runs=vertical,attnres", f"--json={tmp_path / 'b.json'}"])
    saved = json.load(open(tmp_path / "b.json"))
    order = [label for label, *_ in bench.RUNS if label in ("vertical", "attnres")]  # measured in RUNS' order
    assert [r["label"] for r in saved["results"]] == ["vanilla", *order]
    by_label = {r["label"]: r for r in rows}
    assert by_label["vanilla"]["train_speed_ratio"] == 1.0 and by_label["vanilla"]["extra_params"] == 0
    assert by_label["vertical"]["extra_params"] == 6 * 7 // 2  # eq. 7 at the default 6 layers
    for r in rows:
        for key in ("train_tok_s", "train_speed_ratio", "peak_mem_ratio", "sample_tok_s_cache"):
            assert math.isfinite(r[key]) and r[key] > 0, (r["label"], key)
        assert r["train_speed_ratio_min"] <= r["train_speed_ratio"] <= r["train_speed_ratio_max"]
        assert r["params"] == by_label["vanilla"]["params"] + r["extra_params"]
    # speed: every model's 2 timed repeats sat between vanilla's (V M V M V); ratios against the two neighbours
    t_vanilla = by_label["vanilla"]["train_seconds"]
    assert len(t_vanilla) == 2 * 3 and "train_speed_ratios" not in by_label["vanilla"]
    for i, label in enumerate(order):
        r, neighbours = by_label[label], t_vanilla[3 * i:3 * i + 3]
        assert len(r["train_seconds"]) == 2
        want = [(a + b) / 2 / t for a, b, t in zip(neighbours, neighbours[1:], r["train_seconds"])]
        assert r["train_speed_ratios"] == want and r["train_speed_ratio"] == sum(want) / 2
        assert (r["train_speed_ratio_min"], r["train_speed_ratio_max"]) == (min(want), max(want))
        assert r["train_tok_s"] == 2 * 32 / (sum(r["train_seconds"]) / 2)  # batch x block_size x iters / median


def test_bench_rejects_empty_measurements():
    for bad in ("--repeats=0", "--iters=0", "--warmup=-1"):
        with pytest.raises(ConfigError, match="or more"):
            bench.main(["--size=small", "--device=cpu", bad])


def test_bench_times_generation_with_and_without_skipping_for_skipmiddle():
    rows = bench.main(["--size=small", "--block_size=32", "--batch_size=2", "--warmup=0", "--iters=1", "--repeats=1",
                       "--sample_tokens=4", "--device=cpu", "--runs=skipmiddle"])
    by_label = {r["label"]: r for r in rows}
    assert "skip_time_ratio" not in by_label["vanilla"]  # its generate() cannot skip
    r = by_label["skipmiddle"]
    assert r["skip_time_ratio"] == pytest.approx(r["sample_tok_s_dense"] / r["sample_tok_s_skip"]) and r["skip_time_ratio"] > 0
    assert 0 < r["est_flops_ratio"] <= 1


def test_bench_closes_the_middle_gates_for_the_skipping_measurement():
    rows = bench.main(["--size=small", "--block_size=32", "--batch_size=2", "--warmup=0", "--iters=1", "--repeats=1",
                       "--sample_tokens=4", "--device=cpu", "--runs=skipmiddle", "--close_gates=1"])
    model = sm.GPT(sm.GPTConfig(block_size=32, vocab_size=50304))  # the shape bench.py measured
    sparse, dense = model.estimated_flops(torch.tensor([0.0, 1.0, 1.0, 1.0, 1.0, 0.0]))  # blocks 1 to 4 skipped
    assert rows[-1]["est_flops_ratio"] == pytest.approx(sparse / dense)
    with pytest.raises(ConfigError, match="--close_gates must be between 0 and 2"):
        bench.main(["--size=small", "--block_size=32", "--batch_size=2", "--warmup=0", "--iters=1", "--repeats=1",
                    "--sample_tokens=4", "--device=cpu", "--runs=skipmiddle", "--close_gates=3"])


def test_bench_times_skipping_on_a_trained_checkpoint(data_dir, tmp_path):
    out = tmp_path / "run"
    train.main(["--model=skipmiddle", f"--data_dir={data_dir}", f"--out_dir={out}", "--max_iters=2", "--n_layer=4",
                "--n_embd=32", "--n_head=2", "--n_kv_head=1", "--ffn_hidden=64", "--block_size=32", "--batch_size=2",
                "--eval_iters=1", "--device=cpu"])
    (row,) = bench.main([f"--checkpoint={out}", f"--data_dir={data_dir}", "--sample_tokens=4", "--device=cpu",
                         "--close_gates=1"])
    assert row["steps"] == 2 and row["skip_time_ratio"] > 0
    model, _, _ = model_from_checkpoint(str(out))
    sparse, dense = model.estimated_flops(torch.tensor([0.0, 1.0, 1.0, 0.0]))
    assert row["est_flops_ratio"] == pytest.approx(sparse / dense)
    train.main(["--model=vanilla", f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'v'}", "--max_iters=0",
                "--n_layer=2", "--n_embd=32", "--n_head=2", "--n_kv_head=1", "--ffn_hidden=64", "--block_size=32",
                "--device=cpu"])
    with pytest.raises(ConfigError, match="without gates: nothing to skip"):
        bench.main([f"--checkpoint={tmp_path / 'v'}", f"--data_dir={data_dir}", "--device=cpu"])


def test_bench_checkpoint_on_a_val_split_too_short_to_prompt_is_one_line(tiny_run, tiny_data, tmp_path, capsys):
    """--checkpoint prompts with the start of the run's val split: an empty one, or one of a single token, is refused
    in one line naming the split (as train.py and eval.py refuse a split too short for a window)."""
    from conftest import run_script
    from test_errors import assert_one_error_line
    import numpy as np
    for n in (0, 1):
        data = tmp_path / f"data{n}"
        shutil.copytree(tiny_data, data)
        meta = json.loads((data / "shakespeare" / "meta.json").read_text())
        np.fromfile(data / "shakespeare" / "val.bin", dtype=meta["dtype"])[:n].tofile(data / "shakespeare" / "val.bin")
        (data / "shakespeare" / "meta.json").write_text(json.dumps({**meta, "val_tokens": n}))
        code, _, err = run_script("tools/bench.py", ["--checkpoint", tiny_run, "--data_dir", data, "--device=cpu"],
                                  capsys)
        assert_one_error_line(code, err, f"the val split of shakespeare holds {n} tokens, too few")


@pytest.mark.slow  # compiles the decode step of three cases
def test_bench_decode_table(tmp_path):
    """--decode: every case timed, eager and compiled, with consistent derived numbers; the JSON and the README
    copy written; a --baseline checkout's eager generate() of the same weights timed beside (here this one). With
    --decode_modes compiled (gpu_tables.py's decode part) only the compiled cases: the table shows '-' for eager,
    and gpu_tables.py's summary reads the compiled ratio from the file."""
    path = tmp_path / "decode.json"
    rows = bench.main(["--size=small", "--block_size=32", "--vocab_size=97", "--decode", "--runs=skipmiddle",
                       "--decode_batches=2", "--prompt_tokens=8", "--decode_tokens=4", "--repeats=2",
                       "--close_gates=1", "--device=cpu", f"--json={path}", f"--baseline={ROOT}"])
    labels = ["vanilla", "skipmiddle", "skipmiddle (skip=False)"]
    assert {(r["label"], r["mode"], r["batch"]) for r in rows} == {
        (label, mode, b) for label in labels for mode in ("eager", "compiled", "baseline") for b in (2,)}
    for r in rows:
        assert len(r["step_seconds"]) == 2 and r["decode_tok_s"] > 0
        assert abs(r["prefill_tok_s"] * r["time_to_first_token_s"] - 8 * r["batch"]) < 1e-6
        assert (r["compile_s"] is not None) == (r["mode"] == "compiled")
        if r["mode"] != "baseline":
            assert r["decode_ratio_min"] <= r["decode_ratio"] <= r["decode_ratio_max"]
            assert "baseline_ratio" in r and ("skip_ratio" in r) == (r["label"] == "skipmiddle")
    assert [r["decode_ratio"] for r in rows if r["label"] == "vanilla" and r["mode"] != "baseline"] == [1.0] * 2
    saved = json.load(open(path))
    assert saved["results"] == rows and saved["command"][:2] == ["-m", "tools.bench"]
    # --table_only renders the file's table from its numbers alone: a number changed in the file changes the table
    table = bench.decoding_table(rows, saved["baseline"])
    capture = io.StringIO()
    with contextlib.redirect_stdout(capture):
        assert bench.main(["--decode", "--table_only", f"--json={path}"]) == rows
    assert capture.getvalue() == table
    saved["results"][0]["decode_tok_s"] = 123456.0
    path.write_text(json.dumps(saved))
    with contextlib.redirect_stdout(io.StringIO()) as capture:
        bench.main(["--decode", "--table_only", f"--json={path}"])
    assert "123,456" in capture.getvalue() and "123,456" not in table
    with pytest.raises(ConfigError, match="give --decode and --json"):
        bench.main(["--table_only", f"--json={path}"])
    from tools import gpu_tables
    gpu = tmp_path / "gpu"
    rows = bench.main(["--size=small", "--n_layer=1", "--block_size=32", "--vocab_size=97", "--decode",
                       "--runs=vanilla", "--decode_modes=compiled", "--decode_batches=1", "--prompt_tokens=8",
                       "--decode_tokens=4", "--repeats=1", "--device=cpu", f"--json={gpu / 'decode.json'}"])
    assert [(r["label"], r["mode"]) for r in rows] == [("vanilla", "compiled")] and rows[0]["decode_ratio"] == 1.0
    (line,) = [line for line in bench.decoding_table(rows, "").splitlines() if "| vanilla |" in line]
    assert line.split(" | ")[4:7] == ["-", f"{rows[0]['decode_tok_s']:,.0f}", "1.00 (1.00-1.00)"]
    assert "| vanilla | - | - | - | - | 1.00 | - | - |" in gpu_tables.summary(str(gpu))


def test_bench_decode_refuses_a_window_that_restarts_and_unknown_modes():
    with pytest.raises(ConfigError, match="--block_size 32"):
        bench.main(["--size=small", "--block_size=32", "--decode", "--prompt_tokens=16", "--decode_tokens=16",
                    "--device=cpu"])
    for modes in ("eager,fast", "compiled,compiled", ""):
        with pytest.raises(ConfigError, match="--decode_modes .*: give eager, compiled or eager,compiled"):
            bench.main(["--size=small", "--decode", f"--decode_modes={modes}", "--device=cpu"])


def test_kernels_counts_every_model_file_and_vanilla_s_matmuls(tmp_path, capsys):
    """kernels.py at a tiny shape: a row per model file, and vanilla's matmuls are what its layers make: per layer
    four linears (the fused wqkv, wo, the fused w13, w2), each one matmul forward and two backward, and the head's
    three."""
    from tools import kernels
    from conftest import model_names
    path = tmp_path / "kernels.json"
    kernels.main(["--n_layer=2", "--n_head=2", "--n_kv_head=1", "--n_embd=16", "--ffn_hidden=32", "--vocab_size=64",
                  "--block_size=16", "--batch_size=2", "--json", str(path)])
    counts = json.loads(path.read_text())["models"]
    assert set(model_names()) <= set(counts)  # every model file (a learner's own, beside them, too)
    assert counts["vanilla"]["train_ops"]["mm"] == 2 * 4 * 3 + 3
    assert all(r["train"] > counts["vanilla"]["train"] * 0.9 and r["decode"] > 0 for r in counts.values())
    assert "| vanilla | " in capsys.readouterr().out


TINY = ["--n_layer=2", "--n_head=2", "--n_kv_head=1", "--n_embd=16", "--ffn_hidden=32", "--vocab_size=64",
        "--block_size=16", "--batch_size=2"]


@pytest.mark.slow  # inductor compiles the training step twice
def test_kernels_compiled_counts_are_deterministic(tmp_path):
    """--compiled: inductor's generated kernels, with its caches off, are the same count on a second compile (a
    cached graph would count 0); fullgraph=True: a graph break would fail here. One layer: compiling is what takes
    the time."""
    from tools import kernels
    from plumbing.config import build_model, load_model_module
    path = tmp_path / "compiled.json"
    kernels.main([*TINY, "--n_layer=1", "--compiled", "--runs", "vanilla", "--json", str(path)])
    table = json.loads(path.read_text())
    vanilla = table["models"]["vanilla"]
    assert table["shape"]["compiled"] and vanilla["train"] > 0 and vanilla["decode"] > 0
    shape = dict(n_layer=1, n_head=2, n_kv_head=1, n_embd=16, ffn_hidden=32, vocab_size=64, block_size=16)
    again = kernels.training_step(build_model(load_model_module("vanilla"), shape), 2, 16, 64, compiled=True)
    assert again["generated"] == vanilla["train"]
    assert "| fwd+bwd | x vanilla | decode step |" in kernels.main(["--table_only", "--json", str(path)])[2]


def test_kernels_table_only_renders_a_saved_file_as_counted(tmp_path):
    """--table_only prints the table of a JSON file counted elsewhere (a GPU's) from its numbers alone: a count
    changed in the file changes the table; without a file it is one line naming --json."""
    from tools import kernels
    saved = json.load(open(os.path.join(ROOT, "results", "kernels_compiled.json")))
    saved["models"]["vertical"]["train"] = 2 * saved["models"]["vanilla"]["train"]
    path = tmp_path / "counted.json"
    path.write_text(json.dumps(saved))
    lines = kernels.main(["--table_only", "--json", str(path)])
    row = next(line for line in lines if line.startswith("| vertical |"))
    assert row.split(" | ")[1:3] == [str(saved["models"]["vertical"]["train"]), "2.00"]
    assert f"`{saved['shape']['command']}`" in lines[0]
    saved["shape"]["command"] = "python kernels.py --compiled --size small"  # recorded by the tool's old top-level file
    path.write_text(json.dumps(saved))
    assert "`python -m tools.kernels --compiled --size small`" in kernels.main(["--table_only", "--json", str(path)])[0]
    for argv, message in [(["--table_only"], "give --json too"),
                          (["--table_only", "--json", str(tmp_path / "none.json")], "none.json does not exist")]:
        with pytest.raises(ConfigError, match=message):
            kernels.main(argv)


@pytest.mark.slow  # inductor compiles two training steps
def test_kernels_compiled_counts_see_the_method():
    """A method's own work shows in the compiled count: attnres-full mixes every sublayer's output, more kernels
    than vanilla's residual adds."""
    from tools import kernels
    from plumbing.config import build_model, load_model_module
    shape = dict(n_layer=1, n_head=2, n_kv_head=1, n_embd=16, ffn_hidden=32, vocab_size=64, block_size=16)
    counts = {name: kernels.training_step(build_model(load_model_module(name), {**shape, **extra}), 2, 16, 64,
                                          compiled=True)["generated"]
              for name, extra in [("vanilla", {}), ("attnres", {"attn_res": "full"})]}
    assert counts["attnres"] > counts["vanilla"] > 0


@pytest.mark.parametrize("args, message", [
    (["--batch_size", "0"], "--batch_size"),
    (["--block_size", "1"], "--block_size"),
    (["--runs", "vertical-x"], "unknown --runs vertical-x"),
    (["--compiled", "--model_file", "model_vanilla.py"], "drop --model_file or --compiled"),
])
def test_kernels_refuses_options_before_counting(args, message):
    from tools import kernels
    with pytest.raises(ConfigError, match=message):
        kernels.main([*TINY, *args])


def test_kernels_model_file_that_is_no_model_is_one_line(tmp_path):
    """--model_file: a file that is missing, not Python, does not import, or holds neither nanoGPT's nor
    gpt-fast's classes, each refused in one line naming the file."""
    from tools import kernels
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "broken.py").write_text("def f(:\n")
    (tmp_path / "empty.py").write_text("x = 1\n")
    for name, message in [("missing.py", "not a file"), ("notes.txt", "no .py file"),
                          ("broken.py", "does not import"), ("empty.py", "defines neither GPT")]:
        with pytest.raises(ConfigError, match=message):
            kernels.main([*TINY, "--model_file", str(tmp_path / name)])


def test_gpu_tables_commands_parse_with_their_scripts(capsys):
    """tools/gpu_tables.py --dry_run: every part's command is one that tools/bench.py or tools/kernels.py takes (its own parser
    checks it), each writing its JSON under the --out folder; so is every job of the first phase: the training
    steps' compiles in one pool, the decode steps' compiles and the counts, a label each, in the other, and each
    count's merge, which is its part's own command with --merge. An unknown part is refused before anything runs."""
    from tools import gpu_tables
    from tools import kernels
    todo = gpu_tables.main(["--dry_run", "--out", "results/gpu"])
    assert list(todo) == list(gpu_tables.PARTS)
    for part, argv in todo.items():
        script, options = argv[1], argv[2:]
        (bench if script == "tools.bench" else kernels).parse_args(options)
        assert options[options.index("--json") + 1].startswith("results/gpu/"), part
    assert bench.parse_args(todo["decode"][2:]).decode_modes == "compiled"  # eager decoding: --decode_eager true
    # the first phase compiles each model of each compiling part once, with that part's options, writing nothing
    args = gpu_tables.parse_args([])
    warm = gpu_tables.warm_commands(todo, args)
    assert set(model_names()) - {"vanilla"} <= set(args.runs.split(","))  # every model file, and vanilla below
    n_models = len(args.runs.split(",")) + 1  # (a learner's own model file beside them too)
    assert len(warm) == 3 * n_models
    for name, argv in warm:
        part, label = name.split()
        parsed = bench.parse_args(argv[2:])
        assert parsed.warm_only and parsed.runs == label and not parsed.json and not parsed.update_readme
        measured = vars(bench.parse_args(todo[part][2:]))
        changed = {k for k, v in vars(parsed).items() if v != measured[k]}
        assert changed <= {"runs", "warm_only", "json", "update_readme"}
    heavy, light, merges = gpu_tables.first_jobs(todo, args)
    assert {name.split()[0] for name, _ in heavy} == {"compiled", "compiled4096"} and len(heavy) == 2 * n_models
    assert [name for name, _ in light if name.startswith("decode ")] == [n for n, _ in warm if n.startswith("decode ")]
    labels = ["vanilla", *args.runs.split(",")]
    for part, merge in merges:  # each label counted alone into the folder that the merge joins
        counts = [(name, argv) for name, argv in light if name.split()[0] == part]
        assert [name for name, _ in counts] == [f"{part} {label}" for label in labels]
        merged = kernels.parse_args(merge[2:])
        assert merge[:-2] == todo[part] and merged.merge == f"results/gpu/logs/{part}" and merged.update_readme
        for (name, argv), label in zip(counts, labels):
            one = kernels.parse_args(argv[2:])
            assert [r[0] for r in one.labels] == [label] and not one.with_vanilla and not one.update_readme
            assert one.json == os.path.join(merged.merge, f"{label}.json")
            assert {k for k, v in vars(one).items() if v != vars(merged)[k]} <= {
                "labels", "runs", "with_vanilla", "json", "update_readme", "merge"}
    out = capsys.readouterr().out
    assert out.count("python ") == len(gpu_tables.PARTS) - 2 + len(heavy) + len(light) + len(merges)
    assert "at most 4 at a time (training" in out and "at most 4 at a time (decode" in out
    with pytest.raises(ConfigError, match="unknown --parts train"):
        gpu_tables.main(["--dry_run", "--parts", "compiled,train"])


@pytest.mark.slow  # (the default tier: at most 7 times a 100-step quick start)
def test_gpu_tables_first_phase_reports_what_failed(capsys, tmp_path):
    """The first phase runs its processes side by side and says how each ended: a failed count fails its part (the
    command then fails), which is then not merged; a failed compile is only reported (its timed part compiles again
    and fails itself)."""
    from tools import gpu_tables
    todo = {"kernels": ["-m", "tools.kernels", "--size", "huge", "--json", str(tmp_path / "kernels.json")],
            "compiled": ["-m", "tools.bench", "--size", "huge"]}
    failed = gpu_tables.first_phase(todo, gpu_tables.parse_args(["--runs", "vertical", "--jobs", "2"]), tmp_path)
    out = capsys.readouterr().out
    assert failed == ["kernels"]
    assert "--size huge" in (tmp_path / "logs" / "compiled_vertical.log").read_text()  # kept as it came
    assert "# compiled vertical: failed (exit 1)" in out and "# compiled vanilla: failed (exit 1)" in out
    assert "# kernels vertical: failed (exit 1)" in out and "# kernels: not merged" in out
    assert out.count("error: --size huge is not one of") == 4  # each one's own message


@pytest.mark.slow  # (the default tier: at most 7 times a 100-step quick start)
def test_gpu_tables_counts_a_label_a_process_and_merges_them_into_one_run_s_file(capsys, tmp_path):
    """A counting part counted a label a process, side by side, then merged: the file is byte for byte the one
    that the part's command writes in one process (its command included, which names that command), and the merge
    prints its table. A merge with a part missing, or counted at another shape, is refused in one line; the command
    it names counts the missing part."""
    from tools import gpu_tables
    from tools import kernels
    path = tmp_path / "kernels.json"
    argv = ["-m", "tools.kernels", *TINY, "--runs", "vanilla,vertical", "--json", str(path)]
    subprocess.run([sys.executable, *argv], check=True, capture_output=True, env={**os.environ, "PYTHONPATH": ROOT})
    one_run = path.read_bytes()
    path.unlink()
    assert gpu_tables.first_phase({"kernels": argv}, gpu_tables.parse_args(["--runs", "vertical", "--jobs", "2"]),
                                  tmp_path) == []
    assert path.read_bytes() == one_run
    assert "| vertical | " in capsys.readouterr().out
    folder = str(tmp_path / "logs" / "kernels")
    with pytest.raises(ConfigError, match="has n_layer 2 where this command .* has 3"):
        kernels.main([*argv[2:], "--n_layer=3", "--merge", folder])
    more = [*TINY, "--runs", "vertical,attnres", "--json", str(tmp_path / "more.json"), "--merge", folder]
    with pytest.raises(ConfigError, match="attnres.json does not exist; count it: `") as missing:
        kernels.main(more)
    kernels.main(shlex.split(str(missing.value).split("`")[1])[3:])  # the command it names, less `python -m tools.kernels`
    lines = kernels.main(more)
    assert [line.split(" | ")[0] for line in lines[4:]] == ["| vanilla", "| attnres", "| vertical"]  # in RUNS' order


@pytest.mark.slow  # compiles in two new processes
def test_bench_warm_only_fills_the_cache_that_the_same_command_compiles_from(tmp_path):
    """bench.py --warm_only compiles and writes nothing else; the same command in a new process then finds every
    compiled graph in inductor's cache on disk (what gpu_tables.py's first phase relies on)."""
    with pytest.raises(ConfigError, match="give it --compile"):
        bench.main(["--warm_only", "--runs", "vanilla"])
    with pytest.raises(ConfigError, match="without --json"):
        bench.main(["--warm_only", "--compile", "--json", str(tmp_path / "x.json")])
    with pytest.raises(ConfigError, match="compiled among --decode_modes"):  # eager decoding compiles nothing
        bench.main(["--warm_only", "--decode", "--decode_modes", "eager", "--runs", "vanilla"])
    script = ("import torch\nfrom tools import bench\nfrom torch._dynamo.utils import counters\n"
              "bench.main(['--device', 'cpu', '--compile', '--warm_only', '--runs', 'vanilla', '--n_layer', '1', "
              "'--block_size', '16', '--batch_size', '1', '--vocab_size', '64', '--warmup', '1'])\n"
              "print('hits', counters['inductor']['fxgraph_cache_hit'], 'misses', "
              "counters['inductor']['fxgraph_cache_miss'])\n")
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": ROOT}
    runs = [subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
            for _ in range(2)]
    (_, hits1, _, misses1), (_, hits2, _, misses2) = (r.stdout.split()[-4:] for r in runs)
    assert int(misses1) > 0 and int(hits1) == 0, runs[0].stdout + runs[0].stderr
    assert int(hits2) == int(misses1) and int(misses2) == 0, runs[1].stdout + runs[1].stderr
    assert not list(tmp_path.glob("*.json"))


def test_gpu_tables_summary_reads_every_table(tmp_path):
    """--summary: one row per label of the JSON files, vanilla's ratios 1, and a part not run shown as '-'."""
    from tools import gpu_tables
    table = gpu_tables.main(["--summary", "--out", os.path.join(ROOT, "results", "h100"), "--update_readme", "false"])
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in table.splitlines() if line.startswith("| ")}
    assert {"vanilla", "vertical", "aila", "attnres", "skiplayer", "skipmiddle"} <= set(rows)
    assert rows["vanilla"][1] == "1.00" and rows["vanilla"][-1] == "- |"
    with pytest.raises(ConfigError, match="no JSON file of python -m tools.bench"):
        gpu_tables.main(["--summary", "--out", str(tmp_path)])
