"""Weight visualisations: the numbers, the pictures, the arrows, bad input.

The model-kind tests (tiny trained AllenNLP / OpenNMT-py / LM models) are in
tests/visualize/test_visualize_models.py.
"""
import json
import math

import matplotlib
import numpy as np
import pytest
import torch

matplotlib.use("Agg")
import matplotlib.image  # noqa: E402
import matplotlib.pyplot  # noqa: E402

from rnn_ablations import AblatedRNN, get_variant, weighted_sum  # noqa: E402
from rnn_ablations.cli import main  # noqa: E402
from rnn_ablations.visualize import (heatmap_matrix, plot_arrows, plot_heatmap,  # noqa: E402
                                     plot_weight_map, select_encoder, weight_map)

WORDS = "the cat that I saw yesterday sat on the mat".split()


def _model(variant="ran", bidirectional=True, layers=2, d=6, hidden=8, seed=0):
    torch.manual_seed(seed)
    return AblatedRNN(variant, d, hidden, num_layers=layers, bidirectional=bidirectional).eval()


@pytest.mark.parametrize("variant", ["ran", "lstm", "lstm_minus_srnn", "identity_ran",
                                     "lstm_minus_srnn_minus_hidden"])
def test_plotted_numbers_equal_weighted_sum(variant):
    rnn = _model(variant)
    x = torch.randn(1, len(WORDS), 6)
    layer = 1
    wm = weight_map(rnn, x, WORDS, layer=layer)
    assert list(wm.directions) == ["forward", "backward"]
    fig, ax = matplotlib.pyplot.subplots()
    plot_heatmap(wm, ax=ax)
    image = np.ma.filled(ax.images[0].get_array().astype(float), np.nan)
    cmap, norm = ax.images[0].cmap, ax.images[0].norm
    T = len(WORDS)
    for d, name in enumerate(["forward", "backward"]):
        # independent reference: weighted_sum on the time-major unbatched input
        ref = weighted_sum(rnn, x[0], layer=layer, direction=d).weights[0]   # [t, j, m]
        ref_norm = ref.double().norm(dim=-1)
        for t in range(T):
            for j in range(T):
                want = float(ref_norm[t, j])
                assert wm.directions[name].norms[j][t] == pytest.approx(want, rel=1e-6, abs=1e-9)
                assert wm.directions[name].max_weights[j][t] == pytest.approx(
                    float(ref[t, j].max()), rel=1e-6, abs=1e-9)
                reached = j <= t if name == "forward" else j >= t
                if not reached:
                    assert want == 0.0
                if j == t:   # diagonal drawn as two half cells: colour of the half = the number
                    patch = [p for p in ax.patches if p.get_gid() == f"diag-{name}-{t}"]
                    assert len(patch) == 1
                    np.testing.assert_allclose(patch[0].get_facecolor(), cmap(norm(want)), atol=1e-6)
                    assert math.isnan(image[j, t])
                elif reached:  # upper right = forward, lower left = backward
                    assert image[j, t] == pytest.approx(want, rel=1e-6, abs=1e-9)
    # the JSON carries the same numbers
    data = json.loads(json.dumps(wm.to_dict()))
    assert data["directions"]["backward"]["norms"] == wm.directions["backward"].norms
    assert data["words"] == WORDS and data["layer"] == layer and data["variant"] == variant
    matplotlib.pyplot.close(fig)


def test_single_direction_triangles_and_batch_first():
    torch.manual_seed(1)
    rnn = AblatedRNN("ran", 5, 7, bidirectional=True, batch_first=True).eval()
    x = torch.randn(1, 6, 5)
    words = "a b c d e f".split()
    for name, d in (("forward", 0), ("backward", 1)):
        wm = weight_map(rnn, x, words, direction=name)
        assert list(wm.directions) == [name]
        mat, diag = heatmap_matrix(wm)
        ref = weighted_sum(rnn, x, direction=d).weights[0].double().norm(dim=-1)
        for j in range(6):
            for t in range(6):
                reached = j <= t if name == "forward" else j >= t
                if reached:
                    assert mat[j, t] == pytest.approx(float(ref[t, j]), rel=1e-6)
                else:
                    assert math.isnan(mat[j, t])
        assert diag[name] == pytest.approx([float(ref[t, t]) for t in range(6)], rel=1e-6)


def test_diagonal_dominates_for_untrained_cell_with_forget_bias():
    """w_j^t = i_j Π f: with gate weights near 0, i ≈ σ(0) and f ≈ σ(1) < 1, so the word itself
    has the largest weight in every column and the weights fall off with distance."""
    torch.manual_seed(2)
    rnn = AblatedRNN("ran", 6, 16, bidirectional=True, forget_bias=1.0).eval()
    x = 0.3 * torch.randn(1, 12, 6)
    words = [f"w{k}" for k in range(12)]
    wm = weight_map(rnn, x, words)
    for name, d in wm.directions.items():
        norms = np.array(d.norms)
        for t in range(12):
            col = norms[:, t]
            assert int(col.argmax()) == t
            # monotone decay away from the diagonal, on the side the direction reaches
            side = col[: t + 1][::-1] if name == "forward" else col[t:]
            assert np.all(np.diff(side) < 0)
        # nearest word is the arrow target (decay), and first/last word have none
        if name == "forward":
            assert d.arrows == [None] + list(range(11))
        else:
            assert d.arrows == list(range(1, 12)) + [None]


def _hand_built(variant, key, T, bidirectional):
    """A cell whose input gate opens on the word carrying the marker feature only and whose forget
    gate is ≈ 1: the marked word's content persists, every other word's is ≈ 0."""
    H = 3
    rnn = AblatedRNN(variant, 2, H, bidirectional=bidirectional).eval()
    blocks = rnn.variant.blocks()[0] + rnn.variant.blocks()[1]
    with torch.no_grad():
        for d in range(rnn.num_directions):
            sfx = "_l0" + ("_reverse" if d else "")
            w_ih = getattr(rnn, "weight_ih" + sfx)
            w_hh = getattr(rnn, "weight_hh" + sfx)
            w_ih.zero_()
            w_hh.zero_()
            i, f = blocks.index("i"), blocks.index("f")
            w_ih[i * H:(i + 1) * H, 0] = 20.0             # marker opens the input gate
            content = blocks.index(get_variant(variant).content_block)
            w_ih[content * H:(content + 1) * H, 1] = 1.0  # some content from the constant feature
            biases = [getattr(rnn, n) for n in ("bias" + sfx, "bias_ih" + sfx, "bias_hh" + sfx)
                      if hasattr(rnn, n)]
            for b in biases:
                b.zero_()
            b = biases[0]
            b[i * H:(i + 1) * H] = -10.0                  # input gate closed otherwise
            b[f * H:(f + 1) * H] = 10.0                   # forget gate ≈ 1: keep everything
    x = torch.zeros(1, T, 2)
    x[0, :, 1] = 1.0
    x[0, key, 0] = 1.0
    return rnn, x


@pytest.mark.parametrize("variant", ["ran", "lstm"])
def test_arrow_points_to_the_persisting_word(variant):
    T, key = 8, 3
    words = "he said the key was under the mat".split()
    rnn, x = _hand_built(variant, key, T, bidirectional=True)
    wm = weight_map(rnn, x, words)
    fwd, bwd = wm.directions["forward"].arrows, wm.directions["backward"].arrows
    for t in range(key + 1, T):
        assert fwd[t] == key, (t, fwd)
        assert wm.directions["forward"].arrow_weight(t) > 0.99
    for t in range(key):
        assert bwd[t] == key, (t, bwd)
    text = wm.arrows_text()
    assert f"  {key + 1:>3} was" in text and f"->   {key} key" in text
    # drawn: one arrow per word that has an earlier (later) word, from t to v_t
    fig, ax = matplotlib.pyplot.subplots()
    plot_arrows(wm, ax=ax)
    gids = {p.get_gid() for p in ax.patches}
    assert f"arrow-forward-{T - 1}-{key}" in gids and f"arrow-backward-0-{key}" in gids
    assert len([g for g in gids if g and g.startswith("arrow-")]) == 2 * (T - 1)
    matplotlib.pyplot.close(fig)


def test_png_is_written_and_has_a_sensible_size(tmp_path):
    rnn = _model("ran")
    wm = weight_map(rnn, torch.randn(len(WORDS), 6), WORDS, layer=0)
    out = tmp_path / "fig.png"
    plot_weight_map(wm, str(out))
    img = matplotlib.image.imread(str(out))
    assert img.shape[0] > 600 and img.shape[1] > 600
    # not blank: the heat map is coloured
    assert img[..., :3].std() > 0.1


def test_bad_input():
    rnn = _model("ran", bidirectional=False, layers=1)
    x = torch.randn(1, 3, 6)
    with pytest.raises(ValueError, match="empty"):
        weight_map(rnn, x[:, :0], [])
    with pytest.raises(ValueError, match="3 input vectors"):
        weight_map(rnn, x, ["a", "b"])
    with pytest.raises(ValueError, match="bidirectional"):
        weight_map(rnn, x, ["a", "b", "c"], direction="backward")
    with pytest.raises(ValueError, match="layer must be"):
        weight_map(rnn, x, ["a", "b", "c"], layer=1)
    with pytest.raises(ValueError, match="one sentence"):
        weight_map(rnn, torch.randn(2, 3, 6), ["a", "b", "c"])
    with pytest.raises(ValueError, match="features"):
        weight_map(rnn, torch.randn(1, 3, 5), ["a", "b", "c"])
    srnn = AblatedRNN("srnn", 6, 8)
    with pytest.raises(ValueError, match="'srnn'.*no memory cell.*lstm, lstm_minus_srnn, ran"):
        weight_map(srnn, x, ["a", "b", "c"])


def test_encoder_selection():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self._phrase_layer = torch.nn.Module()
            self._phrase_layer._module = AblatedRNN("ran", 4, 4)
            self.modeling = AblatedRNN("ran", 4, 4, num_layers=2)
            self.layers = torch.nn.ModuleList([AblatedRNN("ran", 4, 4) for _ in range(3)])

    model = Model()
    assert select_encoder(model, "phrase_layer").names == ["_phrase_layer._module"]
    assert select_encoder(model, "modeling").modules[0] is model.modeling
    stack = select_encoder(model, "layers")
    assert stack.names == ["layers.0", "layers.1", "layers.2"] and stack.num_layers == 3
    assert stack.locate(2)[0] == "layers.2"
    with pytest.raises(ValueError, match="no encoder called 'nope'.*_phrase_layer._module.*modeling"):
        select_encoder(model, "nope")
    with pytest.raises(ValueError, match="choose one with --encoder"):
        select_encoder(model)
    with pytest.raises(ValueError, match=r"layer must be an integer in \[0, 2\]"):
        stack.locate(3)


def test_cli_rejects_a_path_of_no_known_kind(tmp_path, capsys):
    junk = tmp_path / "notes.txt"
    junk.write_text("not a model\n")
    assert main(["visualize", "--model", str(junk), "--text", "a b", "--out",
                 str(tmp_path / "f.png")]) == 2
    err = capsys.readouterr().err
    assert "none of the model kinds" in err and "AllenNLP model archive" in err
    empty_dir = tmp_path / "d"
    empty_dir.mkdir()
    assert main(["visualize", "--model", str(empty_dir), "--text", "a", "--out",
                 str(tmp_path / "f.png")]) == 2
    assert "neither an AllenNLP serialization directory" in capsys.readouterr().err
    torch.save({"something": torch.zeros(2)}, tmp_path / "x.pt")
    assert main(["visualize", "--model", str(tmp_path / "x.pt"), "--text", "a", "--out",
                 str(tmp_path / "f.png")]) == 2
    assert "none of the model kinds" in capsys.readouterr().err
    assert main(["visualize", "--model", str(tmp_path / "missing.pt"), "--text", "a", "--out",
                 str(tmp_path / "f.png")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["visualize", "--model", str(junk), "--text", "   ", "--out",
                 str(tmp_path / "f.png")]) == 2
    assert "text is empty" in capsys.readouterr().err


def test_plain_nn_lstm_is_read_as_the_ablated_lstm():
    """A stock torch.nn.LSTM (e.g. OpenNMT-py's own brnn encoder) is visualised through an
    AblatedRNN('lstm') with the same parameters: same outputs, so the same weights."""
    from rnn_ablations.visualize.encoders import as_ablated

    torch.manual_seed(3)
    lstm = torch.nn.LSTM(5, 7, num_layers=2, bidirectional=True, batch_first=True)
    rnn = as_ablated(lstm)
    x = torch.randn(2, 6, 5)
    with torch.no_grad():
        torch.testing.assert_close(rnn(x)[0], lstm(x)[0], rtol=1e-5, atol=1e-6)
    wm = weight_map(rnn, x[:1], list("abcdef"), layer=1)
    assert wm.variant == "lstm" and set(wm.directions) == {"forward", "backward"}
