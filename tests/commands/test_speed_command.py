"""``rnn-ablations speed`` (``rnn_ablations/commands/speed.py``, ``benchmarks/speed.py``) at tiny
settings: the rows it times, the machine it records, its argument checks, and the files a run cut
off in the middle keeps.  The numbers are not checked (a timing needs a quiet machine)."""
import json

import pytest
import torch

import rnn_ablations as ra
from rnn_ablations.cli import main
from rnn_ablations.commands import speed

from conftest import requires_kernel, threads


def test_speed_command_experiments_tiny(tmp_path, capsys):
    """``benchmarks/speed.py --shapes experiments`` at a tiny setting: train and inference rows
    against nn.LSTM, each bidirectional variant also with sequential directions, the machine
    (CPU model, AVX-512, the kernel's vector path) in the JSON."""
    rows = speed.measure(repeats=1, warmup=0, variants=["ran"], directions="both",
                         shapes=[("tiny", 2, 6, 5, True, 3, 4)])
    assert {(r["model"], r["mode"]) for r in rows} == {
        (m, mode) for m in ("nn.LSTM", "ran", "ran" + speed.SEQUENTIAL_SUFFIX)
        for mode in ("train", "inference")}
    assert all(r["median_ms"] > 0 and r["min_ms"] <= r["median_ms"] <= r["max_ms"] for r in rows)
    assert {r["directions"] for r in rows} == {"-", "auto", "sequential"}
    with pytest.raises(ValueError, match="directions must be one of auto, sequential, both"):
        speed.measure(repeats=1, variants=["ran"], directions="parallel",
                      shapes=[("tiny", 1, 6, 5, True, 3, 4)])
    with threads(torch.get_num_threads()):  # --threads changes the process's setting
        assert main(["speed", "--shapes", "experiments", "--shape-names", "PTB small LM",
                     "--variants", "ran", "--repeats", "1", "--warmup", "0", "--threads", "1",
                     "--out", str(tmp_path)]) == 0
        assert main(["speed", "--shapes", "experiments", "--shape-names", "PTB huge"]) == 2
    assert "unknown shape name(s) ['PTB huge']" in capsys.readouterr().err
    meta = json.loads((tmp_path / "speed_cpu_experiments.json").read_text())
    assert set(meta["cpu"]) >= {"model", "avx512f", "avx2", "kernel_isa", "kernel_isas"}
    assert meta["cpu"]["kernel_isa"] == ra.kernel_isa()
    assert ("no AVX-512" in meta["machine"]) == (not meta["cpu"]["avx512f"])
    assert meta["threads"] == 1 and meta["directions"] == "auto"
    assert {(r["shape"], r["model"], r["mode"]) for r in meta["rows"]} == {
        ("PTB small LM", m, mode) for m in ("nn.LSTM", "ran") for mode in ("train", "inference")}
    md = (tmp_path / "speed_cpu_experiments.md").read_text()
    assert "PTB small LM: 2, 200, 200, uni, 20, 20" in md and meta["cpu"]["model"] in md

def test_speed_command_keeps_the_rows_of_a_cut_off_run(tmp_path, monkeypatch):
    """The speed command rewrites its files after every shape: a run cut off in the middle (a
    device's time limit, Ctrl-C) keeps the rows it measured, and the Markdown says it is
    incomplete; a run that finishes says nothing of the kind."""
    monkeypatch.setattr(speed, "EXPERIMENT_SHAPES", [("tiny one", 1, 6, 5, False, 3, 4),
                                                     ("tiny two", 1, 6, 5, True, 3, 4)])
    real = speed.measure
    calls = []

    def cut_after_first(*args, **kwargs):
        calls.append(kwargs["shapes"])
        if len(calls) == 2:
            raise KeyboardInterrupt("cut off")
        return real(*args, **kwargs)

    monkeypatch.setattr(speed, "measure", cut_after_first)
    with threads(torch.get_num_threads()), pytest.raises(KeyboardInterrupt):
        main(["speed", "--shapes", "experiments", "--variants", "ran", "--repeats", "1",
              "--warmup", "0", "--threads", "1", "--out", str(tmp_path), "--name", "cut"])
    meta = json.loads((tmp_path / "cut.json").read_text())
    assert {r["shape"] for r in meta["rows"]} == {"tiny one"} and meta["dtypes_done"] == []
    assert "INCOMPLETE" in (tmp_path / "cut.md").read_text()
    monkeypatch.setattr(speed, "measure", real)
    with threads(torch.get_num_threads()):
        assert main(["speed", "--shapes", "experiments", "--variants", "ran", "--repeats", "1",
                     "--warmup", "0", "--threads", "1", "--out", str(tmp_path), "--name",
                     "whole"]) == 0
    meta = json.loads((tmp_path / "whole.json").read_text())
    assert {r["shape"] for r in meta["rows"]} == {"tiny one", "tiny two"}
    assert meta["dtypes_done"] == ["float32"]
    assert "INCOMPLETE" not in (tmp_path / "whole.md").read_text()

@requires_kernel
def test_speed_command_isas_ab():
    """--isas times every variant once per CPU kernel vector path in the same rounds (an A/B of
    the AVX-512 path against the AVX2 one on an AVX-512 machine); each row names its path, the
    path in use is restored, and a path this CPU lacks is refused with the ones it has."""
    isas = ra.supported_kernel_isas()
    before = ra.kernel_isa()
    rows = speed.measure(repeats=1, warmup=0, variants=["ran"], isas=isas,
                         shapes=[("tiny", 1, 6, 5, True, 3, 4)])
    want = {("nn.LSTM", "-")} | {(f"ran [{i}]" if len(isas) > 1 else "ran", i) for i in isas}
    assert {(r["model"], r["kernel_isa"]) for r in rows} == want
    assert ra.kernel_isa() == before
    missing = [i for i in ("avx512", "avx2") if i not in isas]
    if missing:
        with pytest.raises(ValueError, match=rf"\['{missing[0]}'\] not available.*choose from"):
            speed.measure(repeats=1, warmup=0, variants=["ran"], isas=[missing[0]],
                          shapes=[("tiny", 1, 6, 5, True, 3, 4)])
