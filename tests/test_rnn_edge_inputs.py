"""``AblatedRNN`` on edge inputs, on every code path (the pipelined and plain kernels, the
generic PyTorch path): an empty batch behaves like ``torch.nn.LSTM`` (shapes, zero gradients,
no crash of the process), sequences shorter than the pipeline's chunks, and an input whose dtype
does not match the module's fails with a message that says what to do."""
import subprocess
import sys

import pytest
import torch

from rnn_ablations import AblatedRNN, VARIANTS
from rnn_ablations.variants import get_variant

from conftest import BACKENDS, REPO, backend_path as path, requires_kernel

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: see conftest.one_thread


def test_empty_batch_does_not_kill_the_process():
    """In a child process, so that a crash (a signal such as SIGFPE from a division by the
    batch size) fails the test instead of killing the run: every schedule, long and short
    sequences, forward and backward on an empty batch."""
    code = ("import torch, rnn_ablations as ra\n"
            "torch.set_num_threads(1)\n"
            "for mode in ('always', 'never', 'auto'):\n"
            "    for T in (20, 2):\n"
            "        with ra.use_pipeline(mode):\n"
            "            m = ra.AblatedRNN('ran', 4, 5)\n"
            "            x = torch.randn(T, 0, 4, requires_grad=True)\n"
            "            out, (h, c) = m(x)\n"
            "            (out.sum() + h.sum()).backward()\n"
            "            assert out.shape == (T, 0, 5) and h.shape == (1, 0, 5), out.shape\n"
            "print('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", (proc.returncode, proc.stderr)

def _empty_case(variant, layers, bidirectional, batch_first, how, seq_len):
    ours = AblatedRNN(variant, 4, 5, num_layers=layers, bidirectional=bidirectional,
                      batch_first=batch_first)
    ref = torch.nn.LSTM(4, 5, num_layers=layers, bidirectional=bidirectional,
                        batch_first=batch_first)
    shape = (0, seq_len, 4) if batch_first else (seq_len, 0, 4)
    x = torch.randn(*shape, requires_grad=True)
    kwargs, hx = {}, None
    if how == "mask":
        kwargs["mask"] = torch.ones(0, seq_len, dtype=torch.bool)
    elif how == "lengths":
        kwargs["lengths"] = torch.zeros(0, dtype=torch.int64)
    elif how == "hx":
        hx = tuple(torch.randn(layers * (2 if bidirectional else 1), 0, 5, requires_grad=True)
                   for _ in range(2))
    return ours, ref, x, kwargs, hx

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("layers,bidirectional,batch_first,how,seq_len", [
    (1, False, False, "plain", 20), (2, True, True, "mask", 6), (3, True, False, "lengths", 3),
    (2, False, True, "hx", 2), (1, True, False, "hx", 1)])
def test_empty_batch_behaves_like_nn_lstm(backend, variant, layers, bidirectional, batch_first,
                                          how, seq_len):
    ours, ref, x, kwargs, hx = _empty_case(variant, layers, bidirectional, batch_first, how,
                                           seq_len)
    ref_out, (ref_h, ref_c) = ref(x, hx)
    ours.train()  # dropout / recurrent dropout draw masks of B = 0 rows
    ours.recurrent_dropout = 0.3
    with path(backend):
        out, (h, c) = ours(x, hx, **kwargs)
        assert out.shape == ref_out.shape and h.shape == ref_h.shape and c.shape == ref_c.shape
        (out.sum() + h.sum() + c.sum()).backward()
    assert x.grad is not None and x.grad.shape == x.shape
    for name, p in ours.named_parameters():  # nn.LSTM: zero gradients of the parameter's shape
        assert p.grad is not None and p.grad.shape == p.shape and not p.grad.any(), name
    if hx is not None:  # (srnn ignores c_0; lstm_minus_srnn_minus_hidden never reads h_0)
        v = get_variant(variant)
        used = hx[:1] if not v.has_memory else hx if v.reads_hidden else hx[1:]
        for s in used:
            assert s.grad is not None and s.grad.shape == s.shape

@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_batch_unbatched_and_inference(backend):
    m = AblatedRNN("lstm_minus_srnn", 3, 4, num_layers=2, bidirectional=True).eval()
    with path(backend), torch.no_grad():
        out, (h, c) = m(torch.randn(7, 0, 3))
    assert out.shape == (7, 0, 8) and h.shape == c.shape == (4, 0, 4)

@requires_kernel
@pytest.mark.parametrize("seq_len", [1, 2, 3])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("highway", [False, True])
def test_pipelined_short_sequences_forward_and_backward(seq_len, variant, highway):
    """T < 4 (fewer steps than the pipeline's usual four chunks), padded rows included."""
    m = AblatedRNN(variant, 3, 4, num_layers=2, bidirectional=True, highway=highway)
    x = torch.randn(seq_len, 3, 3, requires_grad=True)
    lengths = torch.tensor([seq_len, max(1, seq_len - 1), 1])
    results = []
    for backend in ("pipelined", "generic"):
        with path(backend):
            out, (h, c) = m(x, lengths=lengths)
            (out.square().sum() + h.sum() + 2 * c.sum()).backward()
        results.append([out.detach(), h.detach(), c.detach(), x.grad.clone()]
                       + [p.grad.clone() for p in m.parameters()])
        x.grad = None
        m.zero_grad()
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)

@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_input_dtype_mismatch_says_what_to_do(dtype):
    m = AblatedRNN("ran", 4, 5)
    with pytest.raises(ValueError, match=f"input dtype \\({dtype}\\) does not match the module's "
                                         f"parameter dtype \\(torch.float32\\).*model.to\\({dtype}\\)"):
        m(torch.randn(3, 2, 4).to(dtype))
    out, _ = m.to(dtype)(torch.randn(3, 2, 4).to(dtype)) if dtype != torch.float16 else (None, None)
    assert out is None or out.dtype == dtype


@pytest.mark.parametrize("lengths", [None, [7, 7, 5, 2, 1]])
def test_reversal_a_few_steps_at_a_time_equals_the_whole_reversal(lengths):
    """functional.Reversal, as the second direction reads its input: `steps` gives steps t0:t1
    of the reversed tensor, `place` writes them back to their original places (into a view, as
    the streamed forward writes a direction's half of the layer's output)."""
    from rnn_ablations.functional import Reversal, reversal_index
    T, B, X = 7, 5, 3
    t = torch.randn(T, B, X)
    rev = Reversal(None if lengths is None else reversal_index(torch.tensor(lengths), T))
    whole = rev(t)
    if lengths is not None:  # padded steps stay where they are, each row reversed in its length
        for b, n in enumerate(lengths):
            torch.testing.assert_close(whole[:n, b], t[:n, b].flip(0), rtol=0, atol=0)
            torch.testing.assert_close(whole[n:, b], t[n:, b], rtol=0, atol=0)
    else:
        torch.testing.assert_close(whole, t.flip(0), rtol=0, atol=0)
    out = torch.zeros(T, B, 2 * X)
    for t0 in range(0, T, 3):
        t1 = min(T, t0 + 3)
        part = rev.steps(t, t0, t1)
        torch.testing.assert_close(part, whole[t0:t1], rtol=0, atol=0)
        rev.place(out[..., X:], part, t0)
    torch.testing.assert_close(out[..., X:], t, rtol=0, atol=0)
    assert out[..., :X].abs().sum() == 0
