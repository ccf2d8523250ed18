"""The NMT evaluation recipe of ``benchmarks/nmt_multi30k.py --full``: beam 5 with ``-replace_unk``.

OpenNMT-py 3.5.1's RNN decoders return a decoding step's attention time-major while its beam
search indexes it batch-first, so the plain ``onmt_translate -beam_size 5 -replace_unk`` fails for
every RNN-decoder model (OpenNMT's own ``brnn`` included); the benchmark's wrapper fixes that.
Trained for 2 steps on the tiny fixture corpus, with OpenNMT's ``brnn`` and our ``bran``."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("onmt", reason="OpenNMT-py is not installed (bash scripts/setup.sh)")

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "onmt"
BIN = Path(sys.executable).parent

_spec = importlib.util.spec_from_file_location("nmt_multi30k", REPO / "benchmarks" / "nmt_multi30k.py")
nmt_multi30k = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nmt_multi30k)


def _run(args, cwd, check=True):
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"{args[0]} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return proc


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = tmp_path_factory.mktemp("nmt_recipe")
    models = {}
    for enc_type in ("brnn", "bran"):
        cfg = d / f"{enc_type}.yaml"
        cfg.write_text("\n".join([
            f"save_data: {d}/ex", f"src_vocab: {d}/vocab.src", f"tgt_vocab: {d}/vocab.tgt",
            f"save_model: {d}/{enc_type}/model", "train_steps: 2", "save_checkpoint_steps: 2",
            "valid_steps: 2", "report_every: 1", "batch_size: 8", "valid_batch_size: 8",
            "bucket_size: 32", "num_workers: 0", "world_size: 1", "layers: 1", "hidden_size: 8",
            "word_vec_size: 4", "seed: 1", f"encoder_type: {enc_type}", "overwrite: true",
            "data:", "  toy:", f"    path_src: {FIXTURES / 'src-train.txt'}",
            f"    path_tgt: {FIXTURES / 'tgt-train.txt'}", "  valid:",
            f"    path_src: {FIXTURES / 'src-val.txt'}", f"    path_tgt: {FIXTURES / 'tgt-val.txt'}",
        ]) + "\n")
        if not (d / "vocab.src").exists():
            _run([BIN / "onmt_build_vocab", "-config", cfg, "-n_sample", "-1"], d)
        _run([BIN / "onmt_train", "-config", cfg], d)
        models[enc_type] = d / enc_type / "model_step_2.pt"
    return d, models


@pytest.mark.parametrize("enc_type", ["brnn", "bran"])
def test_beam_5_with_replace_unk(trained, enc_type):
    d, models = trained
    src = FIXTURES / "src-val.txt"
    n = len(src.read_text().splitlines())
    args = ["-model", models[enc_type], "-src", src, "-beam_size", "5", "-replace_unk",
            "-max_length", "10", "-output"]
    if enc_type == "brnn":  # OpenNMT-py 3.5.1's bug, with OpenNMT's own encoder
        plain = _run([BIN / "onmt_translate"] + args + [d / "plain.txt"], d, check=False)
        assert plain.returncode != 0 and "IndexError" in plain.stderr
    fixed = d / f"{enc_type}.fixed.txt"
    _run(nmt_multi30k._translate_cmd() + args + [fixed], d)
    assert len(fixed.read_text().splitlines()) == n
