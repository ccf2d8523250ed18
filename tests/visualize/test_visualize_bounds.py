"""`rnn-ablations visualize` on long texts and damaged files: the figure's size (pixels, memory)
is bounded whatever the text's length, a figure of more than READABLE_WORDS positions needs
--span, --json works for any length; colour scales; truncated archives."""
import gzip
import io
import json
import math
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg", force=True)
import matplotlib.pyplot  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from rnn_ablations import AblatedRNN  # noqa: E402
from rnn_ablations.cli import main  # noqa: E402
from rnn_ablations.visualize import plot_heatmap, weight_map  # noqa: E402
from rnn_ablations.visualize.plot import (MAX_FIGURE_PIXELS, READABLE_WORDS,  # noqa: E402
                                          figure_dpi, heatmap_matrix)

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"

pytestmark = pytest.mark.usefixtures("one_thread")


def _wm(T=12, bidirectional=True, seed=0):
    torch.manual_seed(seed)
    rnn = AblatedRNN("ran", 6, 8, bidirectional=bidirectional).eval()
    words = [f"w{t}" for t in range(T)]
    return weight_map(rnn, torch.randn(T, 6), words)


# ------------------------------------------------------------------------------- bounded figure
BIG_SCRIPT = textwrap.dedent("""
    import json, sys
    import torch
    from rnn_ablations import AblatedRNN
    from rnn_ablations.commands.machine import peak_memory
    from rnn_ablations.visualize import weight_map, plot_weight_map
    import matplotlib.image
    T, out = int(sys.argv[1]), sys.argv[2]
    torch.manual_seed(0)
    rnn = AblatedRNN("ran", 16, 64, bidirectional=True).eval()
    # long and short words, some longer than the label limit
    words = [("word%d" % t) * (1 + t % 3) + ("-supercalifragilistic" if t % 50 == 0 else "")
             for t in range(T)]
    wm = weight_map(rnn, torch.randn(T, 16), words)
    plot_weight_map(wm, out)
    h, w = matplotlib.image.imread(out).shape[:2]
    print(json.dumps({"pixels": h * w, "peak_bytes": peak_memory()}))
""")


def test_500_token_figure_has_bounded_pixels_and_memory(tmp_path):
    """Before: a 455-word text needed 21.7 GB and wrote a 910-megapixel PNG."""
    out = tmp_path / "big.png"
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", BIG_SCRIPT, "500", str(out)], capture_output=True,
                          text=True, env=env, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["pixels"] <= 60e6
    assert got["pixels"] <= MAX_FIGURE_PIXELS * 1.05      # bbox "tight" may only crop
    assert got["peak_bytes"] < 3e9
    assert "more than a figure can show readably" in proc.stderr   # logged, with the way out


def test_dpi_is_lowered_to_stay_within_the_pixel_cap():
    assert figure_dpi(10, 10, 150) == 150
    d = figure_dpi(32, 36, 600)
    assert d < 600 and (32 * d) * (36 * d) <= MAX_FIGURE_PIXELS


# -------------------------------------------------------------------------------------- window
def test_window_slices_the_numbers_and_rebases_the_arrows():
    wm = _wm(14)
    win = wm.window(4, 10)
    assert win.words == wm.words[4:10]
    for name, d in wm.directions.items():
        w = win.directions[name]
        assert w.norms == [row[4:10] for row in d.norms[4:10]]
        assert w.max_weights == [row[4:10] for row in d.max_weights[4:10]]
        for k, t in enumerate(range(4, 10)):
            v = d.arrows[t]
            if v is not None and 4 <= v < 10:
                assert w.arrows[k] == v - 4
                assert w.arrow_weight(k) == d.arrow_weight(t)
            else:
                assert w.arrows[k] is None
    outside = sum(1 for d in wm.directions.values() for v in d.arrows[4:10]
                  if v is not None and not 4 <= v < 10)
    assert outside > 0     # the first word of a forward span points before it
    assert "positions 4-9 of 0-13" in win.source["span"]
    assert f"{outside} arrow(s)" in win.source["span"]
    for bad in ((0, 0), (5, 3), (-1, 4), (0, 15)):
        with pytest.raises(ValueError, match="span"):
            wm.window(*bad)


# -------------------------------------------------------------------------------- colour scales
@pytest.mark.parametrize("scale", ["row", "column"])
def test_row_and_column_scales_divide_by_the_largest_value(scale):
    wm = _wm(9)
    raw, diag = heatmap_matrix(wm)
    T = len(wm.words)
    full = np.where(np.isfinite(raw), raw, 0.0)
    for vals in diag.values():
        full[np.arange(T), np.arange(T)] = np.maximum(full[np.arange(T), np.arange(T)], vals)
    peak = full.max(axis=1 if scale == "row" else 0)
    fig, ax = matplotlib.pyplot.subplots()
    plot_heatmap(wm, ax=ax, scale=scale)
    image = np.ma.filled(ax.images[0].get_array().astype(float), np.nan)
    for j in range(T):
        for t in range(T):
            if np.isfinite(raw[j, t]):
                p = peak[j] if scale == "row" else peak[t]
                assert image[j, t] == pytest.approx(raw[j, t] / p, rel=1e-9)
    # every row (column) reaches 1 somewhere: in a cell or a diagonal half
    best = np.nanmax(np.where(np.isfinite(image), image, np.nan), axis=1 if scale == "row" else 0)
    half = np.array([max(diag[n][k] for n in diag) / peak[k] for k in range(T)])
    assert np.allclose(np.fmax(best, half), 1.0)
    assert "largest" in fig.axes[-1].get_ylabel()
    matplotlib.pyplot.close(fig)


def test_log_scale_is_the_default_and_keeps_the_raw_norms():
    from matplotlib.colors import LogNorm
    wm = _wm(9, bidirectional=False)
    raw, _ = heatmap_matrix(wm)
    fig, ax = matplotlib.pyplot.subplots()
    plot_heatmap(wm, ax=ax)
    im = ax.images[0]
    assert isinstance(im.norm, LogNorm)
    image = np.ma.filled(im.get_array().astype(float), np.nan)
    np.testing.assert_allclose(image[np.isfinite(raw)], raw[np.isfinite(raw)], rtol=1e-12)
    # the far-off weights get distinct colours: their log spread covers a good part of the bar
    far = raw[0, 5:]
    spread = np.log10(far.max() / far.min()) / np.log10(im.norm.vmax / im.norm.vmin)
    assert spread > 0.05
    # on the linear scale the same weights are squeezed into the bottom of the bar
    fig2, ax2 = matplotlib.pyplot.subplots()
    plot_heatmap(wm, ax=ax2, scale="linear")
    lin = ax2.images[0].norm
    assert (lin(far.max()) - lin(far.min())) < (im.norm(far.max()) - im.norm(far.min()))
    with pytest.raises(ValueError, match="scale must be one of log, row, column, linear"):
        plot_heatmap(wm, ax=ax, scale="sqrt")
    matplotlib.pyplot.close(fig)
    matplotlib.pyplot.close(fig2)


# ----------------------------------------------------------------------------------------- CLI
@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("lmviz")
    data = work / "data"
    data.mkdir()
    (data / "train.txt").write_text((FIXTURES / "onmt" / "src-train.txt").read_text())
    (data / "valid.txt").write_text((FIXTURES / "onmt" / "src-val.txt").read_text())
    out = work / "lm"
    assert main(["lm", "train", "--variant", "ran", "--config", "tiny", "--data", str(data),
                 "--out", str(out), "--epochs", "1", "--max-steps", "2", "--no-progress"]) == 0
    return out


def test_long_text_needs_a_span_for_the_figure_but_not_for_json(lm_run, tmp_path, capsys):
    from rnn_ablations.lm import load_checkpoint
    T = READABLE_WORDS + 50
    vocab = [w for w in load_checkpoint(lm_run)["vocab"] if w != "<eos>"]
    words = [vocab[(7 * t) % len(vocab)] for t in range(T)]
    text = " ".join(words)
    fig = tmp_path / "fig.png"
    capsys.readouterr()
    assert main(["visualize", "--model", str(lm_run), "--text", text, "--out", str(fig)]) == 2
    err = capsys.readouterr().err
    assert f"the text has {T} positions" in err and "--span START:END" in err and "--json" in err
    assert not fig.exists()
    js = tmp_path / "all.json"
    assert main(["visualize", "--model", str(lm_run), "--text", text, "--json", str(js)]) == 0
    data = json.loads(js.read_text())
    assert data["words"] == words and len(data["directions"]["forward"]["norms"]) == T
    capsys.readouterr()
    assert main(["visualize", "--model", str(lm_run), "--text", text, "--out", str(fig),
                 "--span", "100:160", "--scale", "row", "--json", str(tmp_path / "s.json")]) == 0
    assert "positions 100-159 of 0-199" in capsys.readouterr().out
    img = matplotlib.image.imread(str(fig))
    assert img.shape[0] > 600 and img[..., :3].std() > 0.1
    # the JSON of a span run still has the whole text, raw norms
    assert json.loads((tmp_path / "s.json").read_text())["directions"] == data["directions"]
    for span, msg in (("0:400", "the text has 200 positions"), ("10", "START:END"),
                      ("a:b", "START:END"), ("9:3", "START < END"), ("0:180", "at most")):
        assert main(["visualize", "--model", str(lm_run), "--text", text, "--out", str(fig),
                     "--span", span]) == 2
        assert msg in capsys.readouterr().err, span


def _fake_archive(path: Path, size: int = 400_000) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, payload in (("config.json", b'{"model": {"type": "x"}}'),
                              ("weights.th", os.urandom(size))):
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))


@pytest.mark.parametrize("keep", [0.5, 12])
def test_truncated_model_archive_gets_a_clear_message(tmp_path, capsys, keep):
    path = tmp_path / "model.tar.gz"
    _fake_archive(path)
    data = path.read_bytes()
    n = int(len(data) * keep) if keep < 1 else keep
    path.write_bytes(data[:n])
    capsys.readouterr()
    assert main(["visualize", "--model", str(path), "--text", "a b", "--json",
                 str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert "damaged or truncated archive" in err and "model.tar.gz" in err
    assert "Traceback" not in err


def test_damaged_lm_checkpoint_in_a_run_dir(lm_run, tmp_path, capsys):
    import shutil
    run = tmp_path / "run"
    shutil.copytree(lm_run, run)
    ck = run / "checkpoint.pt"
    ck.write_bytes(ck.read_bytes()[:1000])
    capsys.readouterr()
    assert main(["visualize", "--model", str(run), "--text", "a man", "--json",
                 str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert "checkpoint.pt" in err and "damaged or truncated" in err
