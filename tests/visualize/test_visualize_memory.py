"""The weight map's norms are reduced step by step: the same numbers as reducing the whole
(T, T, H) weights of :func:`rnn_ablations.weighted_sum`, without holding them in memory."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from rnn_ablations import AblatedRNN, VARIANTS, get_variant, weighted_sum
from rnn_ablations.visualize import weight_map

REPO = Path(__file__).resolve().parents[2]
WITH_MEMORY = [v for v in VARIANTS if get_variant(v).has_memory]


def _reference(rnn, x, layer, direction):
    """norms[j][t], max_weights[j][t] from the whole weights tensor (positions of the input)."""
    w = weighted_sum(rnn, x, layer=layer, direction=direction).weights[0].double()  # [t, j, m]
    return w.norm(dim=-1).t(), w.max(dim=-1).values.t()


@pytest.mark.parametrize("variant", WITH_MEMORY)
def test_norms_equal_the_whole_tensor_reduction(variant):
    torch.manual_seed(0)
    rnn = AblatedRNN(variant, 5, 6, num_layers=2, bidirectional=True, dropout=0.3).train()
    x = torch.randn(9, 5)
    words = [f"w{k}" for k in range(9)]
    for layer in (0, 1):
        wm = weight_map(rnn, x, words, layer=layer)
        assert rnn.training   # the model's mode is restored
        for d, name in ((0, "forward"), (1, "backward")):
            ref_norms, ref_max = _reference(rnn, x, layer, d)
            got = wm.directions[name]
            torch.testing.assert_close(torch.tensor(got.norms, dtype=torch.float64), ref_norms,
                                       rtol=1e-12, atol=0)
            torch.testing.assert_close(torch.tensor(got.max_weights, dtype=torch.float64), ref_max,
                                       rtol=1e-12, atol=0)
            for t, v in enumerate(got.arrows):
                cand = list(range(t)) if d == 0 else list(range(t + 1, 9))
                assert v == (cand[int(torch.argmax(ref_max[cand, t]))] if cand else None)


PEAK = textwrap.dedent('''
    import sys, torch
    from rnn_ablations import AblatedRNN
    from rnn_ablations.commands.machine import call_peak_memory
    from rnn_ablations.visualize import weight_map
    torch.set_num_threads(1)
    T, H = int(sys.argv[1]), int(sys.argv[2])
    rnn = AblatedRNN("ran", 8, H)
    x = torch.randn(T, 8)
    weight_map(rnn, x[:4], ["w"] * 4)                       # warm up the code paths
    words = [f"w{k}" for k in range(T)]
    maps = []
    grown = call_peak_memory(lambda: maps.append(weight_map(rnn, x, words)))
    assert len(maps[0].directions["forward"].norms) == T
    print(grown / 2.0 ** 20)                                # MiB the call added at its peak
''')


def test_peak_memory_does_not_grow_with_words_squared_times_hidden():
    """500 words, hidden 256: the (T, T, H) float32 weights alone would be 244 MiB (and the
    reduction of the whole tensor held several copies); reduced step by step the map needs the
    T x T results (2 MiB per matrix, plus their Python lists) and one (T, H) row."""
    T, H = 500, 256
    whole_tensor_mib = T * T * H * 4 / 2 ** 20
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", PEAK, str(T), str(H)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    grown = float(proc.stdout.split()[-1])
    assert grown < whole_tensor_mib / 3, f"peak memory grew by {grown:.0f} MiB"
