"""``rnn-ablations visualize`` on tiny models trained with the real commands:
an AllenNLP biaffine parser (``allennlp train``), an OpenNMT-py model (``onmt_train``) and the
language model (``rnn-ablations lm train``).  Each model is trained once per module, on the tiny
fixtures in tests/fixtures, for a few steps: the point is the file formats, not the accuracy.
"""
import json
import re
import subprocess
import sys
from pathlib import Path

import matplotlib
import pytest
import torch

matplotlib.use("Agg")
import matplotlib.image  # noqa: E402

from rnn_ablations import weighted_sum  # noqa: E402
from rnn_ablations.cli import main  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
BIN = Path(sys.executable).parent


def _run(cmd, cwd):
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _check_png(path):
    img = matplotlib.image.imread(str(path))
    assert img.shape[0] > 500 and img.shape[1] > 500
    assert img[..., :3].std() > 0.1       # something was drawn


def _visualize(capsys, *args):
    code = main(["visualize", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


# ------------------------------------------------------------------------------------ AllenNLP
PARSER_CONFIG = {
    "dataset_reader": {"type": "universal_dependencies"},
    "train_data_path": str(FIXTURES / "allennlp" / "ud_tiny.conllu"),
    "validation_data_path": str(FIXTURES / "allennlp" / "ud_tiny.conllu"),
    "model": {
        "type": "biaffine_parser",
        "text_field_embedder": {"token_embedders": {"tokens": {"type": "embedding", "embedding_dim": 8}}},
        "pos_tag_embedding": {"embedding_dim": 4, "vocab_namespace": "pos"},
        "encoder": {"type": "stacked_bidirectional_ran", "input_size": 12, "hidden_size": 6,
                    "num_layers": 2, "recurrent_dropout_probability": 0.0, "use_highway": True},
        "use_mst_decoding_for_validation": False,
        "arc_representation_dim": 8, "tag_representation_dim": 4, "dropout": 0.0, "input_dropout": 0.0,
    },
    "data_loader": {"batch_size": 4, "shuffle": False},
    "trainer": {"num_epochs": 1, "optimizer": {"type": "adam", "lr": 0.01}, "cuda_device": -1},
}


@pytest.fixture(scope="module")
def parser_archive(tmp_path_factory):
    work = tmp_path_factory.mktemp("parser")
    (work / "parser.json").write_text(json.dumps(PARSER_CONFIG))
    _run([BIN / "allennlp", "train", "parser.json", "-s", "ser",
          "--include-package", "rnn_ablations.integrations.allennlp"], cwd=work)
    return work / "ser" / "model.tar.gz"


@pytest.mark.slow  # trains a model to draw
def test_allennlp_parser_png_and_json(parser_archive, tmp_path, capsys):
    out, js = tmp_path / "parser.png", tmp_path / "parser.json"
    text = "The/DET parser/NOUN reads/VERB a/DET weighted/ADJ sum/NOUN ./PUNCT"
    code, stdout, err = _visualize(capsys, "--model", parser_archive, "--text", text, "--out", out,
                                   "--json", js, "--encoder", "encoder", "--layer", "1")
    assert code == 0, err
    _check_png(out)
    data = json.loads(js.read_text())
    assert data["words"] == ["The", "parser", "reads", "a", "weighted", "sum", "."]
    assert data["variant"] == "ran" and data["layer"] == 1
    assert data["source"]["encoder"] == "encoder._module"
    assert set(data["directions"]) == {"forward", "backward"}
    assert "backward (layer 1, ran)" in stdout
    assert re.search(r"^\s+1 parser\s+->\s+0 The\s+\(max weight 0\.\d{3}\)$", stdout, re.M)
    # the serialization directory is accepted too
    code, _, err = _visualize(capsys, "--model", parser_archive.parent, "--text", text,
                              "--json", tmp_path / "dir.json", "--layer", "1")
    assert code == 0, err
    assert json.loads((tmp_path / "dir.json").read_text())["directions"] == data["directions"]


def test_allennlp_bad_input(parser_archive, tmp_path, capsys):
    out = tmp_path / "x.png"
    code, _, err = _visualize(capsys, "--model", parser_archive, "--text", "The/DET cat/NOUN",
                              "--out", out, "--encoder", "phrase_layer")
    assert code == 2 and "no encoder called 'phrase_layer'" in err and "encoder._module (ran" in err
    # the parser reads POS tags: plain words are refused with an explanation
    code, _, err = _visualize(capsys, "--model", parser_archive, "--text", "The parser reads",
                              "--out", out)
    assert code == 2 and "word/TAG" in err and "NOUN" in err
    code, _, err = _visualize(capsys, "--model", parser_archive, "--text", "", "--out", out)
    assert code == 2 and "text is empty" in err
    assert not out.exists()


# ------------------------------------------------------------------------------------ OpenNMT-py
@pytest.fixture(scope="module")
def onmt_checkpoint(tmp_path_factory):
    work = tmp_path_factory.mktemp("onmt")
    data = FIXTURES / "onmt"
    (work / "cfg.yaml").write_text(
        f"save_data: {work}/run\nsrc_vocab: {work}/vocab.src\ntgt_vocab: {work}/vocab.tgt\n"
        f"overwrite: true\ndata:\n  corpus_1:\n    path_src: {data}/src-train.txt\n"
        f"    path_tgt: {data}/tgt-train.txt\n")
    _run([BIN / "onmt_build_vocab", "-config", "cfg.yaml", "-n_sample", "-1"], cwd=work)
    _run([BIN / "onmt_train", "-config", "cfg.yaml", "-encoder_type", "blstm", "-enc_layers", "2",
          "-dec_layers", "1", "-hidden_size", "16", "-word_vec_size", "12", "-train_steps", "3",
          "-save_checkpoint_steps", "3", "-save_model", f"{work}/model", "-batch_size", "16",
          "-batch_type", "sents", "-bucket_size", "64", "-num_workers", "0", "-report_every", "1"],
         cwd=work)
    return work / "model_step_3.pt"


@pytest.mark.slow  # trains a model to draw
def test_onmt_png_and_numbers(onmt_checkpoint, tmp_path, capsys):
    out, js = tmp_path / "onmt.png", tmp_path / "onmt.json"
    code, stdout, err = _visualize(capsys, "--model", onmt_checkpoint, "--text",
                                   "a woman is playing on the qwzx street .", "--out", out,
                                   "--json", js)
    assert code == 0, err
    _check_png(out)
    data = json.loads(js.read_text())
    assert data["variant"] == "lstm" and "S-RNN state" in data["content"]
    assert data["words"][6] == "qwzx (unk)" and "qwzx" in stdout
    # independent check: the numbers are weighted_sum's on the model's own source embeddings
    from rnn_ablations.visualize import load_model
    loaded = load_model(onmt_checkpoint)
    enc = loaded.model.encoder
    vocab_ids = []
    src_vocab = list(torch.load(onmt_checkpoint, weights_only=False)["vocab"]["src"])
    for w in "a woman is playing on the qwzx street .".split():
        vocab_ids.append(src_vocab.index(w) if w in src_vocab else src_vocab.index("<unk>"))
    with torch.no_grad():
        emb = enc.embeddings(torch.tensor(vocab_ids).view(1, -1, 1))
    ref = weighted_sum(enc.rnn, emb if enc.rnn.batch_first else emb.transpose(0, 1), layer=0,
                       direction=1).weights[0].double().norm(dim=-1)
    got = torch.tensor(data["directions"]["backward"]["norms"], dtype=torch.float64)
    torch.testing.assert_close(got, ref.t(), rtol=1e-6, atol=1e-9)




# ------------------------------------------------------------------------------------ language model
def _train_lm(work, variant):
    data = work / "data"
    data.mkdir(exist_ok=True)
    # any English sentences in PTB format: the OpenNMT fixture's source side
    (data / "train.txt").write_text((FIXTURES / "onmt" / "src-train.txt").read_text())
    (data / "valid.txt").write_text((FIXTURES / "onmt" / "src-val.txt").read_text())
    out = work / f"lm_{variant}"
    code = main(["lm", "train", "--variant", variant, "--config", "tiny", "--data", str(data),
                 "--out", str(out), "--epochs", "1", "--no-progress"])
    assert code == 0
    return out


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    return _train_lm(tmp_path_factory.mktemp("lm"), "ran")


def test_lm_png_and_numbers(lm_run, tmp_path, capsys):
    capsys.readouterr()
    out, js = tmp_path / "lm.png", tmp_path / "lm.json"
    text = "a woman is playing on the street ."
    code, stdout, err = _visualize(capsys, "--model", lm_run, "--text", text, "--out", out,
                                   "--json", js, "--layer", "1")
    assert code == 0, err
    _check_png(out)
    data = json.loads(js.read_text())
    assert data["words"] == text.split() and data["layer"] == 1 and list(data["directions"]) == ["forward"]
    assert data["source"]["encoder"] == "layers.1"
    assert "7 .       ->" in stdout
    # independent check: layer 1 of the LM reads layer 0's output of the embeddings
    from rnn_ablations.lm.data import Vocabulary
    from rnn_ablations.lm.checkpoints import load_checkpoint, model_from_checkpoint
    ckpt = load_checkpoint(lm_run)
    model = model_from_checkpoint(ckpt).eval()
    ids, _ = Vocabulary(ckpt["vocab"]).encode(text.split())
    with torch.no_grad():
        h0, _ = model.layers[0](model.embedding(ids.view(-1, 1)))
        ref = weighted_sum(model.layers[1], h0).weights[0].double()
    got = torch.tensor(data["directions"]["forward"]["norms"], dtype=torch.float64)
    torch.testing.assert_close(got, ref.norm(dim=-1).t(), rtol=1e-6, atol=1e-9)
    assert data["directions"]["forward"]["arrows"] == [None] + [
        int(ref[t, :t].max(dim=-1).values.argmax()) for t in range(1, len(ids))]
    # the checkpoint file itself is accepted too; words the vocabulary lacks are refused clearly
    # (this tiny corpus has no <unk>)
    code, _, err = _visualize(capsys, "--model", lm_run / "checkpoint.pt", "--text", "a qwzx",
                              "--out", out)
    assert code == 2 and "'qwzx'" in err and "no <unk>" in err
    code, _, err = _visualize(capsys, "--model", lm_run, "--text", "a woman", "--out", out,
                              "--direction", "backward")
    assert code == 2 and "unidirectional" in err
    code, _, err = _visualize(capsys, "--model", lm_run, "--text", "a woman", "--out", out,
                              "--layer", "2")
    assert code == 2 and "[0, 1]" in err


def test_variant_without_memory_is_refused(tmp_path, capsys):
    run = _train_lm(tmp_path, "srnn")
    capsys.readouterr()
    code, _, err = _visualize(capsys, "--model", run, "--text", "a woman is playing", "--out",
                              tmp_path / "srnn.png")
    assert code == 2
    assert "'srnn'" in err and "no memory cell" in err and "lstm, lstm_minus_srnn, ran, identity_ran" in err
    assert not (tmp_path / "srnn.png").exists()
