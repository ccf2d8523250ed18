"""The real OpenNMT-py commands with the rnn_ablations encoders, on the tiny parallel data in
tests/fixtures/onmt: onmt_build_vocab, onmt_train (every encoder type, uni and bi, with LSTM and
GRU decoders, with and without input feeding and -bridge), onmt_translate from the saved
checkpoints, -train_from, clear errors, onmt_train -h, and the `python -S` wrapper path.

Interpreter start-up (torch + onmt + spaCy, then torch._dynamo on the first embedding init) is
most of the cost, so the encoder-type matrix runs OpenNMT-py's own console entry points
(onmt.bin.train.main / onmt.bin.translate.main, what the onmt_train / onmt_translate scripts call)
one after the other in ONE fresh interpreter, where registration comes from the start-up hook
exactly as for the console scripts; the console scripts themselves run for one encoder type.
"""
import json
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest
import torch

onmt = pytest.importorskip("onmt", reason="OpenNMT-py is not installed (bash scripts/setup.sh)")

from rnn_ablations.integrations.onmt import ENCODER_TYPES  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "onmt"
BIN = Path(sys.executable).parent
N_VAL = len((FIXTURES / "src-val.txt").read_text().splitlines())


def _env(**extra):
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONWARNINGS="ignore",
               TOKENIZERS_PARALLELISM="false")
    env.pop("RNN_ABLATIONS_NO_HOOKS", None)
    env.update(extra)
    return env


def _run(args, cwd, env=None, check=True, timeout=300):
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=env or _env(), capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{args[0]} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                             f"{proc.stderr[-6000:]}")
    return proc


def write_config(directory: Path, **overrides) -> Path:
    """A tiny onmt_train config on the fixture data (paths absolute, outputs in directory)."""
    opts = dict(save_data=directory / "ex", src_vocab=directory / "vocab.src",
                tgt_vocab=directory / "vocab.tgt", save_model=directory / "model",
                train_steps=4, save_checkpoint_steps=4, valid_steps=4, report_every=2,
                batch_size=16, valid_batch_size=16, bucket_size=64, num_workers=0, world_size=1,
                layers=2, hidden_size=16, word_vec_size=8, seed=1, encoder_type="bran")
    opts.update(overrides)
    lines = [f"{k}: {v}" for k, v in opts.items()]
    lines += ["data:", "  toy:", f"    path_src: {FIXTURES / 'src-train.txt'}",
              f"    path_tgt: {FIXTURES / 'tgt-train.txt'}", "  valid:",
              f"    path_src: {FIXTURES / 'src-val.txt'}", f"    path_tgt: {FIXTURES / 'tgt-val.txt'}"]
    path = directory / "config.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A directory with a config and the vocabulary built by the real onmt_build_vocab."""
    d = tmp_path_factory.mktemp("onmt")
    cfg = write_config(d)
    _run([BIN / "onmt_build_vocab", "-config", cfg, "-n_sample", "-1"], cwd=d)
    return d


def test_onmt_build_vocab(workdir):
    src = (workdir / "vocab.src").read_text().split("\n")
    tgt = (workdir / "vocab.tgt").read_text()
    assert any(line.startswith("man\t") for line in src)
    assert "mädchen\t" in tgt and "man\t" not in tgt


@pytest.mark.slow  # trains with `onmt_train`
def test_onmt_train_translate_and_train_from(workdir):
    """The console scripts, one encoder type: bran, LSTM decoder with input feeding, -bridge,
    -dropout_steps; then onmt_translate and -train_from from its checkpoint."""
    d = workdir / "bran_cli"
    d.mkdir()
    cfg = workdir / "config.yaml"
    train = _run([BIN / "onmt_train", "-config", cfg, "-save_model", d / "model", "-bridge",
                  "-dropout", "0.3", "0.1", "-attention_dropout", "0.1", "0.1",
                  "-dropout_steps", "0", "2"], cwd=workdir)
    log = train.stdout + train.stderr
    assert "(encoder): AblatedBiRanEncoder(" in log
    assert "AblatedRNN('ran', 8, 8, num_layers=2, batch_first=True, dropout=0.3, bidirectional=True)" in log
    assert "Updated dropout/attn dropout to 0.100000" in log  # -dropout_steps
    assert "Step  4/    4" in log
    ckpt_path = d / "model_step_4.pt"
    ckpt = torch.load(ckpt_path)  # weights_only: argparse.Namespace is a safe global
    assert ckpt["opt"].encoder_type == "bran" and ckpt["opt"].ablated_init == "onmt"
    assert ckpt["opt"].bridge is True
    assert {"encoder.bridge.0.weight", "encoder.bridge.1.weight", "encoder.rnn.bias_l1_reverse",
            "encoder.rnn.weight_ih_l1_reverse"} <= set(ckpt["model"])

    pred = d / "pred.txt"
    tr = _run([BIN / "onmt_translate", "-model", ckpt_path, "-src", FIXTURES / "src-val.txt",
               "-output", pred, "-beam_size", "3", "-max_length", "12"], cwd=workdir)
    assert "PRED SCORE" in tr.stdout + tr.stderr
    assert len(pred.read_text().split("\n")) - 1 == N_VAL

    resumed = _run([BIN / "onmt_train", "-config", cfg, "-save_model", d / "model", "-bridge",
                    "-train_from", ckpt_path, "-train_steps", "6"], cwd=workdir)
    log = resumed.stdout + resumed.stderr
    assert f"Loading checkpoint from {ckpt_path}" in log
    assert "Step  6/    6" in log and "Step  2/" not in log  # resumed at step 5
    new = torch.load(d / "model_step_6.pt")
    assert new["opt"].encoder_type == "bran"
    moved = [k for k in ckpt["model"] if k.startswith("encoder.rnn")
             and not torch.equal(ckpt["model"][k], new["model"][k])]
    assert moved  # it trained on from the checkpoint's weights


MATRIX_DRIVER = textwrap.dedent('''
    import json, sys
    assert "onmt" not in sys.modules
    # importing our module first imports onmt, whose start-up hook calls back into the module
    # while it is still being imported: the registration must still happen
    import rnn_ablations.integrations.onmt as ours
    assert ours.is_registered()
    from onmt.bin.train import main as train_main
    from onmt.bin.translate import main as translate_main
    cfg, out, runs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    results = {}
    for run in runs:
        d = f"{out}/{run['type']}"
        sys.argv = ["onmt_train", "-config", cfg, "-encoder_type", run["type"], "-save_model",
                    f"{d}/model", "-train_steps", "3", "-save_checkpoint_steps", "3",
                    "-valid_steps", "3"] + run["args"]
        train_main()
        sys.argv = ["onmt_translate", "-model", f"{d}/model_step_3.pt", "-src", run["src"],
                    "-output", f"{d}/pred.txt", "-beam_size", "2", "-max_length", "8"]
        translate_main()
        results[run["type"]] = open(f"{d}/pred.txt").read().count("\\n")
    print("RESULTS", json.dumps(results))
''')


def _matrix_runs():
    """Every encoder type; the 8 combinations of decoder cell x input feeding x bridge are
    spread over them so that a variant's uni and bi encoders get different combinations."""
    runs = []
    for i, enc_type in enumerate(ENCODER_TYPES):
        rnn_type = "LSTM" if i % 2 == 0 else "GRU"
        input_feed = (i // 2) % 2
        bridge = (i // 4) % 2 == 1
        args = ["-rnn_type", rnn_type, "-input_feed", str(input_feed)] + (["-bridge"] if bridge else [])
        runs.append({"type": enc_type, "args": args, "src": str(FIXTURES / "src-val.txt")})
    return runs


@pytest.mark.slow  # trains with `onmt_train`
def test_every_encoder_type_trains_and_translates(workdir):
    runs = _matrix_runs()
    combos = {tuple(r["args"]) for r in runs}
    assert len(combos) == 8  # LSTM/GRU x input feed 0/1 x bridge on/off all present
    out = workdir / "matrix"
    proc = _run([sys.executable, "-c", MATRIX_DRIVER, workdir / "config.yaml", out,
                 json.dumps(runs)], cwd=workdir)
    results = json.loads(proc.stdout.split("RESULTS", 1)[1])
    assert results == {r["type"]: N_VAL for r in runs}
    log = proc.stdout + proc.stderr
    assert "start-up hook" not in log
    for r in runs:
        ckpt = torch.load(out / r["type"] / "model_step_3.pt")
        assert ckpt["opt"].encoder_type == r["type"]
        assert ckpt["opt"].rnn_type == r["args"][1]
        assert ckpt["opt"].input_feed == int(r["args"][3])
        assert ckpt["opt"].bridge == ("-bridge" in r["args"])
        variant, bi = ENCODER_TYPES[r["type"]]
        assert f"AblatedRNN('{variant}', 8, {8 if bi else 16}, num_layers=2" in log
    assert "InputFeedRNNDecoder" in log and "StdRNNDecoder" in log
    assert "StackedGRU" in log and "GRU(8, 16, num_layers=2" in log


def test_unknown_encoder_type_fails_early_with_the_valid_ones(workdir):
    proc = _run([BIN / "onmt_train", "-config", workdir / "config.yaml", "-encoder_type", "rann"],
                cwd=workdir, check=False)
    assert proc.returncode != 0
    err = proc.stderr
    # one line, no traceback: the message says what to change
    line = "onmt_train: error: -encoder_type 'rann' is unknown (did you mean 'ran'?); valid encoder types are:"
    assert line in err and err.strip().splitlines()[-1].startswith(line)
    assert "Traceback" not in err
    assert "bran" in err.splitlines()[-1] and "brnn" in err.splitlines()[-1]
    assert "KeyError" not in err and "Building model" not in proc.stdout + err


def test_onmt_train_help_shows_the_new_option():
    proc = _run([BIN / "onmt_train", "-h"], cwd=REPO)
    assert "-ablated_init {gate_bias,onmt,variant}" in proc.stdout
    assert "bidentity_ran" in proc.stdout


def test_python_S_wrapper(workdir, tmp_path):
    """No .pth processing (python -S): plain `import onmt` does not know our encoders, the
    `rnn-ablations onmt-train` / `onmt-translate` wrappers do."""
    site = sysconfig.get_paths()["purelib"]
    env = _env(PYTHONPATH=os.pathsep.join([str(REPO), site]))
    script = textwrap.dedent(f'''
        import runpy, sys
        assert "rnn_ablations_hooks" not in sys.modules
        import onmt.encoders
        assert "bran" not in onmt.encoders.str2enc, "the hook ran although -S was given"

        def cli(*args):  # what `python -S -m rnn_ablations.cli ARGS` runs
            sys.argv = ["rnn-ablations", *args]
            try:
                runpy.run_module("rnn_ablations.cli", run_name="__main__")
            except SystemExit as exc:
                assert not exc.code, exc.code

        cli("onmt-train", "-config", {str(workdir / "config.yaml")!r}, "-encoder_type",
            "identity_ran", "-save_model", {str(tmp_path / "m")!r}, "-train_steps", "2",
            "-save_checkpoint_steps", "2", "-valid_steps", "2")
        print("TRAINED")
        from rnn_ablations.integrations.onmt import ENCODER_TYPES
        for name in ENCODER_TYPES:  # as in a fresh interpreter: onmt-translate must register
            del onmt.encoders.str2enc[name]
        cli("onmt-translate", "-model", {str(tmp_path / "m_step_2.pt")!r}, "-src",
            {str(FIXTURES / "src-val.txt")!r}, "-output", {str(tmp_path / "pred.txt")!r},
            "-max_length", "5")
        print("TRANSLATED")
    ''')
    proc = _run([sys.executable, "-S", "-c", script], cwd=workdir, env=env)
    assert "TRAINED" in proc.stdout and "TRANSLATED" in proc.stdout
    assert "AblatedIdentityRanEncoder" in proc.stdout + proc.stderr
    assert (tmp_path / "m_step_2.pt").exists()
    assert len((tmp_path / "pred.txt").read_text().split("\n")) - 1 == N_VAL


def test_wrapper_patches_the_training_entry_for_spawned_workers(monkeypatch):
    import functools
    import pickle

    import onmt.bin.train as onmt_train_module
    from rnn_ablations.integrations.onmt import cli as onmt_cli

    seen = {}
    monkeypatch.setattr(onmt_train_module, "train", lambda opt: seen.setdefault(
        "entry", onmt_train_module.single_main))
    monkeypatch.setattr(onmt_train_module, "single_main", onmt_train_module.single_main)
    onmt_cli.run("onmt-train", ["-data", "{}", "-src_vocab", "x"])
    entry = seen["entry"]
    assert entry is onmt_cli._single_main_with_registration
    restored = pickle.loads(pickle.dumps(functools.partial(entry)))
    assert restored.func is onmt_cli._single_main_with_registration
