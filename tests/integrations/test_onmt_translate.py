"""``onmt_translate -beam_size 5 -replace_unk`` (the papers' NMT evaluation) with the registered
package: the input-feeding RNN decoder hands OpenNMT-py's searches a decoding step's attention
batch-first, as they index it (OpenNMT-py 3.5.1 returns it time-major and fails with
``IndexError``); the shipped toy config, trained and translated from any directory as from an
install.  The fix against OpenNMT-py's own ``brnn`` with and without the start-up hook:
tests/integrations/test_nmt_recipe.py."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

onmt = pytest.importorskip("onmt", reason="OpenNMT-py is not installed (bash scripts/setup.sh)")

from onmt.bin.train import _get_parser  # noqa: E402
from onmt.inputters.inputter import dict_to_vocabs  # noqa: E402
from onmt.utils.parse import ArgumentParser  # noqa: E402

from rnn_ablations.commands.configs import config_path  # noqa: E402
from rnn_ablations.integrations import onmt as ours  # noqa: E402

BIN = Path(sys.executable).parent
SRC = ["<unk>", "<blank>", "<s>", "</s>"] + [f"s{i}" for i in range(10)]
TGT = ["<unk>", "<blank>", "<s>", "</s>"] + [f"t{i}" for i in range(10)]


def _model(input_feed: int):
    ours.register()
    opt, unknown = _get_parser().parse_known_args(
        ["-data", "{}", "-src_vocab", "unused", "-layers", "1", "-hidden_size", "8", "-dropout", "0",
         "-word_vec_size", "4", "-encoder_type", "bran", "-input_feed", str(input_feed)])
    assert not unknown
    ArgumentParser.update_model_opts(opt)
    ArgumentParser.validate_model_opts(opt)
    import onmt.model_builder as mb
    torch.manual_seed(0)
    model = mb.build_model(opt, opt, dict_to_vocabs({"src": SRC, "tgt": TGT,
                                                     "data_task": "seq2seq"}), None, -1)
    return model.eval()


@pytest.mark.parametrize("input_feed", [1, 0])
def test_a_decoding_step_returns_its_attention_batch_first(input_feed):
    """What beam search and greedy search index: ``(batch, 1, src_len)`` for a decoding step,
    with both RNN decoders; training's whole-sequence call keeps OpenNMT's layout."""
    model = _model(input_feed)
    batch, src_len = 3, 5
    src = torch.randint(4, len(SRC), (batch, src_len, 1))
    lengths = torch.tensor([5, 4, 2])
    with torch.no_grad():
        enc_out, enc_final, _ = model.encoder(src, lengths)
        model.decoder.init_state(src, enc_out, enc_final)
        step_in = torch.full((batch, 1, 1), 2)
        _, attns = model.decoder(step_in, enc_out, src_len=lengths, step=0, return_attn=True)
        assert attns["std"].shape == (batch, 1, src_len)
        model.decoder.init_state(src, enc_out, enc_final)
        tgt = torch.randint(4, len(TGT), (batch, 4, 1))
        _, attns = model.decoder(tgt, enc_out, src_len=lengths)   # training: whole target
    expected = (4, batch, src_len) if input_feed else (batch, 4, src_len)
    assert attns["std"].shape == expected


def test_the_fix_is_the_patch_of_the_input_feeding_decoder():
    from onmt.decoders.decoder import InputFeedRNNDecoder, RNNDecoderBase, StdRNNDecoder

    ours.register()
    ours.register()   # once, however often it is called
    patched = InputFeedRNNDecoder.__dict__["forward"]
    assert patched.__rnn_ablations_wrapped__ and patched.__wrapped__ is RNNDecoderBase.forward
    assert "forward" not in StdRNNDecoder.__dict__


def _run(args, cwd, env):
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"{args[0]}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


@pytest.mark.slow  # trains the toy model (20 steps) with the console scripts
def test_beam_5_with_replace_unk_on_the_shipped_toy_model(tmp_path):
    """The README's OpenNMT-py walk-through from the package's own config and toy data, in an
    empty directory, then the papers' evaluation settings: the plain ``onmt_translate`` and the
    package's ``rnn-ablations onmt-translate``."""
    data = config_path("onmt_toy_data")
    config = config_path("toy_fixture")
    env = dict(os.environ, ONMT_TOY_DATA=str(data), OMP_NUM_THREADS="1",
               PYTHONWARNINGS="ignore")
    env.pop("RNN_ABLATIONS_NO_HOOKS", None)
    _run([BIN / "onmt_build_vocab", "-config", config, "-n_sample", "-1"], tmp_path, env)
    _run([BIN / "onmt_train", "-config", config, "-encoder_type", "bran"], tmp_path, env)
    model = tmp_path / "runs" / "onmt_toy" / "model_step_20.pt"
    n = len((data / "src-val.txt").read_text().splitlines())
    evaluation = ["-model", model, "-src", data / "src-val.txt", "-beam_size", "5",
                  "-replace_unk", "-max_length", "20", "-output"]
    plain = _run([BIN / "onmt_translate"] + evaluation + [tmp_path / "plain.txt"], tmp_path, env)
    assert "IndexError" not in plain.stderr
    assert len((tmp_path / "plain.txt").read_text().splitlines()) == n
    _run([BIN / "rnn-ablations", "onmt-translate"] + evaluation + [tmp_path / "cli.txt"],
         tmp_path, env)
    assert (tmp_path / "cli.txt").read_text() == (tmp_path / "plain.txt").read_text()
