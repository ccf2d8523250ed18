"""The benchmark scripts that run where no test can follow them (a lent GPU machine, an AVX-512
host, a profiler): checked here end to end at a tiny setting, so that the scarce run works the
first time."""
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

import rnn_ablations as ra
from conftest import REPO, requires_kernel


def _load(name):
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_profile_cpu_categories():
    """Samples are grouped by library and symbol: our step GEMM and element-wise pass, the
    GEMM libraries (also MKL linked into libtorch_cpu.so), OpenMP waits and the scheduler's
    work for sleeping threads (sync), page faults (memory), the interpreter."""
    cat = _load("profile_cpu").categorise
    so = "_C.cpython-311-x86_64-linux-gnu.so"
    assert cat(so, "rnn_ablations::avx2::(anonymous namespace)::micro_kernel<4, true>") == "step GEMM"
    assert cat(so, "rnn_ablations::pack_b") == "step GEMM"
    assert cat(so, "rnn_ablations::avx512::(anonymous namespace)::sigmoid_inplace<float>") \
        == "element-wise"
    assert cat("libtorch_cpu.so", "mkl_blas_def_sgemm_kernel_0_zen") == "oneDNN / MKL GEMM"
    assert cat("[JIT] tid 14762", "0x00007fe891f40340") == "oneDNN / MKL GEMM"
    assert cat("libgomp.so.1", "0x000000000001de62") == "sync (OpenMP)"
    assert cat("[kernel.kallsyms]", "__schedule") == "sync (OpenMP)"
    assert cat("[kernel.kallsyms]", "clear_page_erms") == "memory (kernel)"
    assert cat("libpython3.11.so.1.0", "gc_collect_main") == "Python"
    assert cat("libc.so.6", "__memset_avx2_unaligned_erms") == "other"


def _perf_works() -> bool:
    perf = shutil.which("perf")
    if perf is None:
        return False
    try:
        run = subprocess.run([perf, "stat", "-e", "task-clock", "true"], capture_output=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return run.returncode == 0


@pytest.mark.slow  # runs a benchmark end to end
@requires_kernel
@pytest.mark.skipif(not _perf_works(), reason="perf is not installed or may not sample here")
def test_profile_cpu_end_to_end(tmp_path):
    """``benchmarks/profile_cpu.py`` on the PTB small shape: perf records only the steady loop
    (not the imports), the shares of each row add up to about 100 %, our kernel's own symbols
    show up, and the JSON and Markdown are written.

    One thread: perf samples CPU time, so with one thread the shares are those of the work
    itself, whatever else loads the machine.  With two threads on a loaded machine a waiting
    OpenMP thread spins while its partner is descheduled, and those samples (``sync``) can
    crowd the kernel's own below any fixed bound.  The time limit is generous for the same
    reason (a loaded machine starts the child's interpreter and ``perf report`` slowly)."""
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "profile_cpu.py"), "--shape",
                          "PTB small LM", "--variants", "ran", "--mode", "inference",
                          "--threads", "1", "--seconds", "1", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=900, cwd=REPO)
    assert run.returncode == 0, run.stdout + run.stderr
    meta = json.loads((tmp_path / "profile_cpu.json").read_text())
    (row,) = meta["rows"]
    assert row["variant"] == "ran" and row["mode"] == "inference" and row["ms_per_iter"] > 0
    assert 97 <= sum(row["shares"].values()) <= 101
    assert row["shares"]["step GEMM"] + row["shares"]["element-wise"] > 5
    assert row["shares"]["Python"] < 20  # the imports were not recorded
    assert "| PTB small LM | inference | ran |" in (tmp_path / "profile_cpu.md").read_text()


@pytest.mark.slow  # runs a benchmark end to end
@requires_kernel
@pytest.mark.skipif(shutil.which("taskset") is None, reason="taskset (util-linux) is not installed")
def test_gpu_machine_check_script_on_a_cpu_machine(tmp_path):
    """``benchmarks/gpu_machine_check.sh``, the one prepared call for a lent GPU machine, on this
    CPU-only machine at a tiny setting: the CPU side (``cpu_isa_check.sh``: the vector-path tests
    and one shape of the experiments' table, pinned) runs and passes, the GPU side says it has no
    CUDA device and is skipped, and everything comes back in one tarball."""
    env = dict(os.environ, PYTHON=sys.executable, SHAPE_NAMES="PTB small LM", REPEATS="1",
               WARMUP="0", MINUS_HIDDEN_SPEED_S="10")
    run = subprocess.run(["bash", "benchmarks/gpu_machine_check.sh", str(tmp_path / "out"), "240"],
                         capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "cpu_isa_check exit 0" in summary, summary
    import torch
    if not torch.cuda.is_available():
        assert "no CUDA device (torch sees none): the GPU side is skipped" in summary
    with tarfile.open(tmp_path / "out" / "results.tgz") as tar:
        names = set(tar.getnames())
        isa = "avx512" if "avx512" in ra.supported_kernel_isas() else ra.kernel_isa()
        member = f"./cpu/speed_cpu_experiments_{isa}.json"
        assert member in names, sorted(names)
        meta = json.load(tar.extractfile(member))
        assert "./cpu/cpu_isa_tests.log" in names and "./summary.txt" in names
        assert any(n.startswith("./cpu/projection_layout_") for n in names), sorted(names)
        tests_log = tar.extractfile("./cpu/cpu_isa_tests.log").read().decode()
    assert " passed" in tests_log and " failed" not in tests_log
    assert {r["shape"] for r in meta["rows"]} == {"PTB small LM"}
    assert meta["threads"] == 2 and meta["cpu"]["kernel_isa"] in ra.supported_kernel_isas()


@pytest.mark.slow  # runs a benchmark end to end
@requires_kernel
def test_ab_checkouts_end_to_end(capsys, tmp_path):
    """``benchmarks/ab_checkouts.py`` at a tiny setting, this checkout against itself: one
    process per side, each importing the checkout's own package and timing the variant against
    nn.LSTM; bad arguments are refused with what to give instead."""
    ab = _load("ab_checkouts")
    assert ab.main(["--other", str(REPO), "--shape", "PTB small LM", "--variant", "ran",
                    "--mode", "inference", "--processes", "1", "--rounds", "1",
                    "--warmup", "0", "--out", str(tmp_path / "ab")]) == 0
    out = capsys.readouterr().out
    assert out.count("ratio ") == 3 and "median of 1 processes: this" in out
    saved = json.loads((tmp_path / "ab.json").read_text())
    assert [(r["shape"], r["variant"], r["mode"]) for r in saved["rows"]] == \
        [("PTB small LM", "ran", "inference")]
    assert "| PTB small LM | ran | inference |" in (tmp_path / "ab.md").read_text()
    with pytest.raises(SystemExit):
        ab.main(["--other", str(REPO), "--shape", "no such shape"])
    assert "unknown shape(s) ['no such shape']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ab.main(["--other", "/nonexistent", "--shape", "parser"])
    assert "no rnn_ablations package there" in capsys.readouterr().err


@requires_kernel
def test_fixed_cost_stages_end_to_end(capsys, tmp_path):
    """``benchmarks/fixed_cost.py`` at a tiny setting: every stage of a step cell (down to the
    C++ entry and the packing of w_hh where the path packs) and of the scan cell is timed, the
    stages nest (the module costs at least its layer call), the statements are listed, and the
    files name the machine."""
    fc = _load("fixed_cost")
    assert fc.main(["--shapes", "fixed cost", "--variants", "nn.LSTM", "lstm",
                    "lstm_minus_srnn_minus_hidden", "--rounds", "1", "--calls", "2",
                    "--threads", "1", "--statements", "--out", str(tmp_path / "fc")]) == 0
    saved = json.loads((tmp_path / "fc.json").read_text())
    stages = {(r["variant"], r["stage"]): r for r in saved["rows"]}
    assert ("nn.LSTM", "module") in stages
    for v in ("lstm", "lstm_minus_srnn_minus_hidden"):
        for s in ("module", "run_layer_call", "plan", "runner", "kernel entry", "C++ entry"):
            assert stages[(v, s)]["cpu_us_1thread"] > 0, (v, s)
    from rnn_ablations.kernels import registry
    assert (("lstm", "C++ pack w_hh") in stages) == bool(registry.cpu_kernel().packed_gemm())
    assert stages[("lstm", "runner")]["runner"] == "cpu_plain"
    assert stages[("lstm_minus_srnn_minus_hidden", "runner")]["runner"] == "fused_scan"
    assert any(r["statement"].startswith("plan: decide") for r in saved["statements"])
    md = (tmp_path / "fc.md").read_text()
    assert saved["machine"] in md and "| fixed cost | lstm | cpu_plain | C++ entry |" in md


@requires_kernel
def test_projection_library_end_to_end(capsys, tmp_path):
    """``benchmarks/projection_library.py`` at a tiny setting: each distinct layer of a shape
    timed on both libraries (a scan cell's weight counts both directions), the supported
    threshold printed and saved beside the one in use, the machine named, and the policy in
    use restored afterwards."""
    pl = _load("projection_library")
    from rnn_ablations import plan as run_plan
    before = run_plan.POLICY
    assert pl.main(["--shape-names", "parser", "--variants", "lstm",
                    "lstm_minus_srnn_minus_hidden", "--repeats", "1", "--warmup", "0",
                    "--threads", "1", "--out", str(tmp_path), "--name", "pl"]) == 0
    assert run_plan.POLICY is before
    saved = json.loads((tmp_path / "pl.json").read_text())
    rows = {(r["layer"], r["variant"], r["mode"]): r for r in saved["rows"]}
    assert len(rows) == 2 * 2 * 2
    # parser: 3 layers, d_in 200, H 400, bidirectional
    assert rows[("parser layer 1", "lstm", "train")]["weight"] == 4 * 400 * 200
    assert rows[("parser layers 2-3", "lstm_minus_srnn_minus_hidden", "inference")]["weight"] \
        == 2 * ra.AblatedRNN("lstm_minus_srnn_minus_hidden", 800, 400).weight_ih_l0.numel()
    assert all(r["mkl_ms"] > 0 and r["onednn_ms"] > 0 for r in saved["rows"])
    assert saved["meta"]["onednn_min_weight_in_use"] == before.onednn_min_weight
    assert pl.suggest([{"weight": 1, "mkl_over_onednn": 0.5},
                       {"weight": 2, "mkl_over_onednn": 1.2}], 0.02) == 2
    assert pl.suggest([{"weight": 1, "mkl_over_onednn": 1.5},
                       {"weight": 2, "mkl_over_onednn": 0.9}], 0.02) == pl.NEVER
    md = (tmp_path / "pl.md").read_text()
    assert saved["meta"]["machine"] in md and "supported Policy.onednn_min_weight" in \
        capsys.readouterr().out


@pytest.mark.slow  # runs a benchmark end to end (compiles two graphs)
@requires_kernel
def test_compile_speed_measures_both_modes():
    """``benchmarks/compile_speed.py`` on a tiny shape: a train and an inference row, each with
    both times and their ratio; bad arguments are refused."""
    cs = _load("compile_speed")
    rows = cs.measure(("tiny", 1, 5, 4, True, 2, 3), "ran", rounds=1, warmup=1)
    assert [r["mode"] for r in rows] == ["train", "inference"]
    for r in rows:
        assert r["eager_ms"] > 0 and r["compiled_ms"] > 0
        assert r["eager_over_compiled"] == pytest.approx(r["eager_ms"] / r["compiled_ms"], rel=0.01)
    with pytest.raises(SystemExit):
        cs.main(["--shapes", "no such shape"])


@requires_kernel
@pytest.mark.parametrize("kernel", ["step", "scan"])
def test_ab_kernel_modules_end_to_end(kernel, capsys, tmp_path):
    """``benchmarks/ab_kernel_modules.py`` with a copy of this build as the other module: both
    kernels give a forward and a forward + backward row, each timed on both modules with the
    same numbers; --out writes the rows; an --isa the CPU
    lacks and a path that is not a module are refused."""
    from rnn_ablations.kernels import registry

    other = tmp_path / Path(registry.cpu_kernel().raw.__file__).name
    shutil.copy(registry.cpu_kernel().raw.__file__, other)
    ab = _load("ab_kernel_modules")  # a fresh copy of the script: its shapes can be cut
    ab.SHAPES, ab.SCAN_SHAPES = ab.SHAPES[-1:], ab.SCAN_SHAPES[:1]
    before = registry.cpu_kernel().raw.kernel_isa()
    try:  # the script sets this process's vector path (its own process ends after it)
        assert ab.main(["--other", str(other), "--kernel", kernel, "--calls", "4", "--isa",
                        "portable", "--out", str(tmp_path / "ab"), "--other-label",
                        "a copy"]) == 0
    finally:
        registry.cpu_kernel().raw.set_kernel_isa(before)
    saved = json.loads((tmp_path / "ab.json").read_text())
    assert [r["call"].rsplit(" ", 1)[1] for r in saved["rows"]] == ["forward", "fwd+bwd"]
    for row in saved["rows"]:
        assert row["this_ms"] > 0 and row["other_ms"] > 0 and row["max_abs_diff"] == 0.0
    assert "against a copy" in (tmp_path / "ab.md").read_text()
    assert "vector path: this module portable, other portable" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="not a vector path"):
        ab.main(["--other", str(other), "--isa", "no-such-isa"])
    with pytest.raises(SystemExit, match="no such file"):
        ab.main(["--other", str(tmp_path / "missing.so")])


def test_speed_variable_length_on_the_cpu(tmp_path, capsys):
    """``benchmarks/speed_variable_length.py`` at a tiny setting on the CPU (its GPU run is
    the one that counts): bucketed lengths give a new T nearly every batch within the bounds;
    every model of every (shape, dtype) cell gets a row with its ratio to nn.LSTM, timed in the
    same loop; the probe names the package's operators each model ran (none for nn.LSTM and for
    the generic path); bad arguments are refused with what to give instead."""
    svl = _load("speed_variable_length")
    lengths = svl.batch_lengths(40, 8, 124, 0.45, 20, 400, seed=1)
    assert len(lengths) == 40 and all(len(b) == 8 for b in lengths)
    assert all(20 <= n <= 400 for b in lengths for n in b)
    ts = [max(b) for b in lengths]
    assert len(set(ts)) >= 30                                   # a new T nearly every batch
    assert statistics.median(max(b) - min(b) for b in lengths) < 20   # bucketed: little padding
    assert ts != sorted(ts)                                     # the batches are shuffled

    out = tmp_path / "svl"
    assert svl.main(["--device", "cpu", "--shape-spec", "tiny:1:6:5:bi:3", "--median-length",
                     "8", "--min-length", "2", "--max-length", "12", "--batches", "2", "--warmup",
                     "1", "--variants", "ran", "lstm_minus_srnn_minus_hidden", "--dtype",
                     "float32", "bfloat16", "--out", str(out)]) == 0
    meta = json.loads((out / "speed_cpu_variable_length.json").read_text())
    assert meta["complete"] and meta["cells_done"] == [["tiny", "float32"], ["tiny", "bfloat16"]]
    rows = {(r["model"], r["dtype"]): r for r in meta["rows"]}
    assert set(rows) == {(m, d) for m in ("nn.LSTM", "ran", "lstm_minus_srnn_minus_hidden")
                         for d in ("float32", "bfloat16")}
    for (model, dtype), r in rows.items():
        base = rows[("nn.LSTM", dtype)]["seconds"]
        assert r["ratio_vs_nn_lstm"] == pytest.approx(base / r["seconds"], rel=0.01, abs=0.002)
        assert r["batches"] == 2 and 2 <= r["T_min"] <= r["T_max"] <= 12
    ops = meta["package_ops"]
    assert ops["tiny float32"]["nn.LSTM"] == []
    if ra.kernel_available():
        assert ops["tiny float32"]["ran"] and ops["tiny float32"]["lstm_minus_srnn_minus_hidden"]
        assert ops["tiny bfloat16"]["ran"]  # bfloat16 runs the float32 CPU kernels
    assert meta["cuda_kernels_in_use"] is None and meta["device_info"]["torch"]
    md = (out / "speed_cpu_variable_length.md").read_text()
    assert "| tiny: 1, 6, 5, bi, 3 |" in md and "ratio_vs_nn_lstm" in md and "Command: `" in md
    capsys.readouterr()
    for bad, said in ((["--shape-spec", "tiny:1:6"], "NAME:LAYERS:INPUT:HIDDEN"),
                      (["--shapes", "no such"], "unknown shape"),
                      (["--variants", "gru"], "gru"),
                      (["--min-length", "9", "--max-length", "3"], "below --min-length"),
                      (["--device", "cuda:7"] if not __import__("torch").cuda.is_available()
                       else ["--batches", "0"], "")):
        with pytest.raises(SystemExit):
            svl.main(["--device", "cpu", *bad] if bad[0] != "--device" else bad)
        assert said in capsys.readouterr().err


@requires_kernel
def test_bf16_step_gemm_benchmark_on_the_cpu(tmp_path, capsys):
    """``benchmarks/bf16_step_gemm.py`` at a tiny setting (its run on a CPU with AVX512-BF16 or
    AMX is the one that counts): one row per shape, variant and mode, its ratios from its own
    times, the machine and whether it has the bfloat16 instructions named; bad arguments
    refused."""
    bench = _load("bf16_step_gemm")
    out = tmp_path / "bf16"
    assert bench.main(["--shape-names", "PTB small LM", "--variants", "lstm", "ran", "--modes",
                       "inference", "--repeats", "1", "--warmup", "0", "--out", str(out),
                       "--name", "t"]) == 0
    data = json.loads((out / "t.json").read_text())
    from rnn_ablations.kernels.registry import cpu_has_bf16_gemm
    assert data["meta"]["bf16_instructions"] == cpu_has_bf16_gemm()
    assert data["meta"]["machine"]
    rows = data["rows"]
    assert [(r["shape"], r["variant"], r["mode"]) for r in rows] == [
        ("PTB small LM", "lstm", "inference"), ("PTB small LM", "ran", "inference")]
    for r in rows:
        assert r["ratio_bf16"] == pytest.approx(r["lstm_ms"] / r["bf16_ms"], rel=0.02, abs=0.01)
        assert r["f32_over_bf16"] == pytest.approx(r["f32_ms"] / r["bf16_ms"], rel=0.02,
                                                   abs=0.01)
    assert "| PTB small LM | ran | inference |" in (out / "t.md").read_text()
    with pytest.raises(SystemExit):
        bench.main(["--variants", "lstm_minus_srnn_minus_hidden", "--out", str(out)])
    assert "has no step GEMM" in capsys.readouterr().err


def test_speed_bounds_formula_and_tables(tmp_path, capsys):
    """nn.LSTM's multiply-adds over each variant's (input projection (R + X)·H·d, recurrent
    product R·H·H per layer and direction), and every row of a speed JSON against it."""
    mod = _load("speed_bounds")
    bound = mod.matmul_bound
    for shape in ((1, 256, 256, False), (3, 400, 128, True), (2, 200, 650, False)):
        assert bound("lstm", *shape) == pytest.approx(1.0)
        assert bound("srnn", *shape) == pytest.approx(4.0)
    assert bound("ran", 1, 64, 64, False) == pytest.approx(8 / 5)
    assert bound("lstm_minus_srnn", 1, 64, 64, False) == pytest.approx(8 / 7)
    # two layers, the second reads both directions: 4H(d+H) summed over (8, 12), against 4H d
    assert bound("lstm_minus_srnn_minus_hidden", 2, 8, 6, True) == pytest.approx(
        _load("speed_minus_hidden").matmul_ratio(2, 8, 6, True))
    table = REPO / "benchmarks/results/speed_cpu_experiments_amd_epyc_avx2_2threads.json"
    rows = json.loads(table.read_text())["rows"]
    out = tmp_path / "bounds"
    assert mod.main([str(table), "--out", str(out)]) == 0
    report = json.loads(out.with_suffix(".json").read_text())[0]
    ours = [r for r in rows if r["model"] != "nn.LSTM"]
    assert len(report["rows"]) == len(ours)
    for got, r in zip(report["rows"], ours):
        b = bound(r["model"], r["layers"], r["input_size"], r["hidden"], r["bidirectional"])
        assert got["bound"] == pytest.approx(b, abs=1e-3)
        assert got["share_of_bound"] == pytest.approx(r["ratio_vs_nn_lstm"] / b, abs=2e-3)
    ran_train = [r for r in report["rows"] if r["model"] == "ran" and r["mode"] == "train"]
    s = next(s for s in report["summary"] if s["model"] == "ran" and s["mode"] == "train")
    assert s["shapes"] == len(ran_train)
    assert s["share_lowest"] == min(r["share_of_bound"] for r in ran_train)
    assert "| ran | train | float32 |" in out.with_suffix(".md").read_text()
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(SystemExit):
        mod.main([str(bad)])
    assert "no 'rows'" in capsys.readouterr().err


def test_projection_layout_end_to_end(tmp_path):
    """``benchmarks/projection_layout.py`` at a tiny setting: every layer of the shape in both
    dtypes for the projection and both weights for the weight gradient, both ways timed, the
    machine and whether bfloat16 is emulated named; --products picks one table; a variant other
    than lstm is refused."""
    mod = _load("projection_layout")
    assert mod.main(["--shape-names", "PTB small LM", "--repeats", "1", "--warmup", "0",
                     "--threads", "1", "--out", str(tmp_path), "--name", "pl"]) == 0
    saved = json.loads((tmp_path / "pl.json").read_text())
    projection = [r for r in saved["rows"] if r["product"] == "projection"]
    grads = [r for r in saved["rows"] if r["product"] == "weight gradient"]
    assert [(r["layer"], r["dtype"]) for r in projection] == [
        ("PTB small LM layer 1", "float32"), ("PTB small LM layer 1", "bfloat16"),
        ("PTB small LM layer 2", "float32"), ("PTB small LM layer 2", "bfloat16")]
    assert all(r["view_ms"] > 0 and r["flat_ms"] > 0 for r in projection)
    assert [(r["layer"], r["weight"], r["k"]) for r in grads] == [
        ("PTB small LM layer 1", "W_ih", 200), ("PTB small LM layer 1", "W_hh", 200),
        ("PTB small LM layer 2", "W_ih", 200), ("PTB small LM layer 2", "W_hh", 200)]
    assert all(r["rows"] == 400 and r["direct_ms"] > 0 and r["transposed_ms"] > 0
               for r in grads)
    md = (tmp_path / "pl.md").read_text()
    assert saved["meta"]["machine"] in md and "bfloat16" in saved["meta"]["bf16"]
    assert "F.linear on the view" in md and "transposed/direct" in md
    assert mod.main(["--shape-names", "PTB small LM", "--repeats", "1", "--warmup", "0",
                     "--products", "weight-grad", "--out", str(tmp_path), "--name", "wg"]) == 0
    assert {r["product"] for r in json.loads((tmp_path / "wg.json").read_text())["rows"]} == {
        "weight gradient"}
    assert "F.linear on the view" not in (tmp_path / "wg.md").read_text()
    with pytest.raises(SystemExit):
        mod.main(["--variants", "ran", "--out", str(tmp_path)])
