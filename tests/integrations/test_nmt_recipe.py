"""The NMT evaluation recipe of ``benchmarks/nmt_multi30k.py --full``: beam 5 with ``-replace_unk``.

OpenNMT-py 3.5.1's input-feeding RNN decoder returns a decoding step's attention time-major while
its beam search indexes it batch-first, so ``onmt_translate -beam_size 5 -replace_unk`` fails for
every such model (OpenNMT's own ``brnn`` included) unless the package's registration fixed it
(:mod:`rnn_ablations.integrations.onmt.translate`): the plain command with the start-up hook, and
without it (``RNN_ABLATIONS_NO_HOOKS=1``, OpenNMT-py alone) the failure it fixes.  Trained for 2
steps on the tiny fixture corpus, with OpenNMT's ``brnn`` and our ``bran``."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # trains OpenNMT-py models

pytest.importorskip("onmt", reason="OpenNMT-py is not installed (bash scripts/setup.sh)")

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "onmt"
BIN = Path(sys.executable).parent

_spec = importlib.util.spec_from_file_location("nmt_multi30k", REPO / "benchmarks" / "nmt_multi30k.py")
nmt_multi30k = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nmt_multi30k)


def _run(args, cwd, check=True, **extra_env):
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    env.pop("RNN_ABLATIONS_NO_HOOKS", None)
    env.update(extra_env)
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"{args[0]} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return proc


#: ``onmt_translate`` without the package (no start-up hook), only able to read a checkpoint
#: under torch >= 2.6 (which loads ``weights_only`` and refuses the ``argparse.Namespace`` in it)
ONMT_TRANSLATE_ALONE = """
import argparse, sys
import torch
torch.serialization.add_safe_globals([argparse.Namespace])
from onmt.bin.translate import main
sys.argv = ["onmt_translate"] + sys.argv[1:]
main()
assert "rnn_ablations" not in sys.modules
"""


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
    if enc_type == "brnn":  # OpenNMT-py 3.5.1 alone, with OpenNMT's own encoder: its bug
        alone = _run([sys.executable, "-c", ONMT_TRANSLATE_ALONE] + args + [d / "alone.txt"], d,
                     check=False, RNN_ABLATIONS_NO_HOOKS="1")
        assert alone.returncode != 0 and "IndexError" in alone.stderr, alone.stderr[-3000:]
        assert "beam_search.py" in alone.stderr
    fixed = d / f"{enc_type}.fixed.txt"
    _run([BIN / "onmt_translate"] + args + [fixed], d)   # registered by the start-up hook
    assert len(fixed.read_text().splitlines()) == n
    recipe = d / f"{enc_type}.recipe.txt"   # what the benchmark runs
    _run(nmt_multi30k._translate_cmd() + args + [recipe], d)
    assert recipe.read_text() == fixed.read_text()


# ---------------------------------------------------------------------------------------------
# benchmarks/gpu_nmt.sh: every encoder type at once, split over calls, at a tiny scale on the CPU
from conftest import SHARED_DATA, requires_shared_data  # noqa: E402

from rnn_ablations.integrations.onmt import encoder_type_for  # noqa: E402
from rnn_ablations.variants import VARIANTS  # noqa: E402


TINY = ("--subset 120 --steps 4 --save-every 2 --timing-steps 2 --max-steps-per-call 2 "
        "--onmt-opt -layers 1 -hidden_size 8 -word_vec_size 4 -batch_size 16 "
        "-valid_batch_size 16 -bucket_size 64 -num_workers 0 -report_every 1")


@requires_shared_data("multi30k", "test_2016_flickr.lc.norm.tok.de")
def test_gpu_script_end_to_end_on_the_cpu(tmp_path):
    """Two calls of the device script on the CPU, two encoder types of the table at once: the
    first measures the time per step and trains to the middle checkpoint, the second continues
    both runs from it (-train_from), translates test 2016 with beam 5 and scores it."""
    types = [encoder_type_for(v) for v in VARIANTS[:2]]
    work, results = tmp_path / "work", tmp_path / "nmt_gpu"
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONWARNINGS="ignore",
               DEVICE="cpu", DATA=str(SHARED_DATA), WORK=str(work), RESULTS=str(results),
               TYPES=" ".join(types), PYTHON=sys.executable, EXTRA=TINY)
    outputs = []
    for _call in range(2):
        proc = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_nmt.sh"), "run", "600"],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        outputs.append(json.loads(Path(str(results) + ".json").read_text()))
    first, second = outputs
    assert [r["encoder_type"] for r in first["results"]] == types
    assert all(r["steps"] == 2 and r["status"] == "training: step 2 of 4" and
               r["bleu_test2016"] is None for r in first["results"])
    assert set(first["timing"]) == set(types)
    assert all(v["sec_per_100_steps"] > 0 and v["runs_at_once"] == 2
               for v in first["timing"].values())
    for row, enc_type in zip(second["results"], types):
        assert row["status"] == "complete" and row["steps"] == 4 and row["beam"] == 5
        assert 0.0 <= row["bleu_test2016"] <= 100.0
        assert row["seconds"] > 0 and row["calls"] == 2 and row["runs_at_once"] == 2
        assert row["paper_bleu_test2016"] == nmt_multi30k.PAPER_BLEU.get(enc_type)
        log = (work / "run" / "multi30k" / enc_type / "train.log").read_text()
        assert "Loading checkpoint from" in log and "model_step_2.pt" in log
        pred = (work / "run" / "multi30k" / enc_type / "test2016.pred.de").read_text()
        assert len(pred.splitlines()) == 30                     # the subset's test sentences
    meta = second["meta"]
    assert meta["scale"].startswith("a CHECK") and "CPU" in meta["device"]
    assert meta["command"].startswith("bash benchmarks/gpu_nmt.sh run 600")
    md = Path(str(results) + ".md").read_text()
    assert "| variant | encoder type | steps | BLEU test 2016 (beam 5) | paper | beam | seconds " \
           "| status |" in md
    assert nmt_multi30k.PAPER_TYPES[:4] == ["blstm", "bsrnn", "blstm_minus_srnn", "bran"]
