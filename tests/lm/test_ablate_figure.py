"""The ablation figure (results.png): perplexity on an axis that shows the differences (broken
when −GATES is far from the rest), an agreement-accuracy panel, diverged runs marked."""
import math

import matplotlib

matplotlib.use("Agg", force=True)
import matplotlib.pyplot  # noqa: E402
import pytest  # noqa: E402

from rnn_ablations.lm.ablate import ablation_figure, diverged, write_results  # noqa: E402


def _result(variant, valid, test, acc=None, wps=1000.0, vocab=53):
    return {"variant": variant, "paper_name": variant, "recurrent_params": 1000,
            "hyper_parameters": {"learning_rate": 1.0}, "valid_ppl": valid, "test_ppl": test,
            "valid_long_range_acc": acc, "test_long_range_acc": acc, "train_words_per_sec": wps,
            "vocab_size": vocab}


# the embedded run of docs/reproduction.md: the gated cells within 0.03 of each other, -GATES 1.2 above
EMBEDDED = [_result("lstm", 3.24, 3.21, 0.914), _result("srnn", 4.40, 4.37, 0.030),
            _result("lstm_minus_srnn", 3.22, 3.20, 0.923), _result("ran", 3.21, 3.18, 0.946),
            _result("identity_ran", 3.23, 3.22, 0.903)]


def _texts(fig):
    return [t.get_text() for ax in fig.axes for t in ax.texts] + [t.get_text() for t in fig.texts]


def test_perplexity_axis_shows_the_differences_and_the_gap():
    fig = ablation_figure(EMBEDDED, "embedded")
    titles = [ax.get_title() for ax in fig.axes]
    assert any("agreement" in t for t in titles) and any("speed" in t for t in titles)
    hi, lo = fig.axes[0], fig.axes[1]          # the broken perplexity axis: -GATES above
    assert lo.get_ylim()[0] > 3.1 and lo.get_ylim()[1] < 3.3     # zoomed on the gated cells
    assert hi.get_ylim()[0] > 4.2 and hi.get_ylim()[1] < 4.5
    # 0.03 apart is a visible distance on the lower axis (> 10 % of its height)
    lo_span = lo.get_ylim()[1] - lo.get_ylim()[0]
    assert 0.03 / lo_span > 0.1
    labels = [t.get_text() for t in lo.texts + hi.texts]
    assert "4.40\n(+1.19)" in labels and "3.21\n(best)" in labels
    acc = [ax for ax in fig.axes if "agreement" in ax.get_title()][0]
    heights = sorted(round(p.get_height(), 1) for p in acc.patches)
    assert heights[0] == pytest.approx(3.0) and heights[-1] == pytest.approx(94.6)
    matplotlib.pyplot.close(fig)


def test_diverged_runs_are_marked():
    results = [_result("lstm", 312.9, None, vocab=10000), _result("srnn", 1.04e7, None, vocab=10000),
               _result("ran", 261.9, None, vocab=10000),
               _result("identity_ran", float("inf"), None, vocab=10000)]
    assert [diverged(r) for r in results] == [False, True, False, True]
    assert diverged({"valid_ppl": float("nan")}) and diverged({"valid_ppl": 2e5})
    fig = ablation_figure(results, "ptb")
    texts = _texts(fig)
    assert sum("diverged" in t for t in texts) == 3          # two runs and the legend line
    assert any("1.04e+07" in t for t in texts)
    ppl = fig.axes[0]
    assert ppl.get_ylim()[1] < 400          # the diverged values do not stretch the axis
    speed = fig.axes[-1]
    reds = [p for p in speed.patches if p.get_facecolor()[0] > 0.7 and p.get_facecolor()[1] < 0.3]
    assert len(reds) == 2
    matplotlib.pyplot.close(fig)


def test_results_png_is_written(tmp_path):
    for r in EMBEDDED:
        r.update(train_time_s=1.0, epochs=1, config="tiny", seed=0, corpus="x")
    paths = write_results(EMBEDDED, tmp_path, "title")
    img = matplotlib.image.imread(str(paths["results.png"]))
    assert img.shape[1] > 1200 and img[..., :3].std() > 0.1
    assert not math.isnan(img.mean())


# the main job's run (docs/reproduction.md): identity RAN diverged on valid, its test ppl is 3.21
MAIN_JOB = [dict(r, history=[]) for r in EMBEDDED[:4]] + [
    dict(_result("identity_ran", 1.29e7, 3.21, 0.883), test_long_range_acc=0.918,
         history=[{"epoch": e, "valid_ppl": 1e7 if e >= 8 or e == 4 else 3.3}
                  for e in range(1, 11)]),
    dict(_result("lstm_minus_srnn_minus_hidden", 3.24, 3.21, 0.921), history=[])]
for _r, _wps in zip(MAIN_JOB, (65803, 188633, 80216, 102497, 98853, 89398)):
    _r["train_words_per_sec"] = float(_wps)


def _drawn(fig):
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def test_every_number_of_the_table_is_on_the_figure():
    fig = ablation_figure(MAIN_JOB, "main job")
    texts = "\n".join(_texts(fig) + [t.get_text() for ax in fig.axes
                                     for t in ax.get_xticklabels()] + [fig._suptitle.get_text()])
    for r in MAIN_JOB:
        if not diverged(r):
            assert f"{r['valid_ppl']:.2f}" in texts, r["variant"]
        assert f"{r['test_ppl']:.2f}" in texts, r["variant"]     # identity RAN's 3.21 too
        for key in ("valid_long_range_acc", "test_long_range_acc"):
            assert f"{100 * r[key]:.1f}" in texts, (r["variant"], key)
        assert f"{r['train_words_per_sec']:,.0f}" in texts, r["variant"]   # the speed's values
        assert f"{r['recurrent_params'] / 1e6:.3f}M" in texts
    assert "lr 1" in fig._suptitle.get_text()            # every run's learning rate
    # identity RAN's test point is drawn on the perplexity axis
    lo = fig.axes[1]
    assert any(abs(y - 3.21) < 1e-9 for line in lo.lines for y in line.get_ydata())
    matplotlib.pyplot.close(fig)


def test_the_divergence_is_explained_on_the_figure_in_one_line():
    fig = ablation_figure(MAIN_JOB, "main job")
    notes = [t.get_text() for t in fig.texts if t is not fig._suptitle]
    assert len(notes) == 1 and notes[0].count("\n") == 0, notes
    assert "identity RAN 1.29e+07 from epoch 8" in notes[0]
    assert "vocabulary size (53)" in notes[0] and "other numbers are as measured" in notes[0]
    matplotlib.pyplot.close(fig)


@pytest.mark.parametrize("results", [EMBEDDED, MAIN_JOB], ids=["embedded", "main_job"])
def test_no_label_is_covered_by_a_legend(results):
    fig = ablation_figure(results, "x")
    renderer = _drawn(fig)
    legends = [ax.get_legend().get_window_extent(renderer) for ax in fig.axes
               if ax.get_legend() is not None]
    assert legends
    labels = [t for ax in fig.axes for t in ax.texts + ax.get_xticklabels() if t.get_text()]
    points = [ax.transData.transform(xy) for ax in fig.axes for line in ax.lines
              if line.get_transform() == ax.transData for xy in line.get_xydata()]
    for box in legends:
        for t in labels:
            assert not box.overlaps(t.get_window_extent(renderer)), t.get_text()
        for x, y in points:
            assert not box.contains(x, y)
    matplotlib.pyplot.close(fig)
