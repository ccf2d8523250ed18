"""The CPU kernel's operators (rnn_ablations.kernels.ops): ``torch.library.opcheck`` on every operator, as
the layers call it (every variant, uni- and bidirectional, both schedules, training and
inference, with and without the highway connection), and what a dispatch mode sees."""
import pytest
import torch
from torch.library import opcheck
from torch.utils._python_dispatch import TorchDispatchMode

from rnn_ablations import AblatedRNN, VARIANTS, kernel_available, options
from rnn_ablations.kernels.ops import OPERATORS

pytestmark = pytest.mark.skipif(not kernel_available(), reason="the CPU kernel is not built")


class _Record(TorchDispatchMode):
    """Keeps the first calls of every rnn_ablations operator, with copies of their arguments
    (a mutating operator changes them)."""

    def __init__(self, padded):
        super().__init__()
        self.calls = {}
        self.padded = padded

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "rnn_ablations":
            def copy(a):
                if isinstance(a, torch.Tensor):
                    return a.detach().clone()
                if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor):
                    return [t.detach().clone() for t in a]
                return a
            self.calls.setdefault(func, []).append(
                (tuple(copy(a) for a in args), dict(kwargs), self.padded))
        return func(*args, **kwargs)


def _record(padded):
    rec = _Record(padded)
    for variant in VARIANTS:
        for bidirectional in (False, True):
            for schedule in ("pipelined", "plain"):
                for highway in (False, True):
                    torch.manual_seed(0)
                    rnn = AblatedRNN(variant, 5, 4, num_layers=2, bidirectional=bidirectional,
                                     highway=highway)
                    x = torch.randn(6, 3, 5, requires_grad=True)
                    lengths = torch.tensor([6, 4, 1]) if padded else None
                    with options(backend="kernel", cpu_schedule=schedule,
                                 concurrent_directions="on" if bidirectional else "off"), rec:
                        out, _ = rnn(x, lengths=lengths)
                        out.square().sum().backward()
                        with torch.no_grad():
                            rnn(x, lengths=lengths)
    return rec.calls


@pytest.fixture(scope="module")
def recorded(one_thread_module):
    calls = _record(padded=False)
    for func, more in _record(padded=True).items():
        calls.setdefault(func, []).extend(more)
    return calls


@pytest.fixture(scope="module")
def one_thread_module():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def test_every_operator_is_called_by_the_layers(recorded):
    """The layers call every operator but ``plain_forward`` (the copying form of
    ``plain_forward_``, for a caller that keeps its projections; checked on the same calls)."""
    called = {f._schema.name.split("::")[1] for f in recorded}
    assert called == set(OPERATORS) - {"plain_forward"}, \
        f"not exercised: {set(OPERATORS) - called}"


@pytest.mark.parametrize("name", OPERATORS)
def test_opcheck(recorded, name):
    """Schema, fake kernel and traceability of each operator on calls the layers made, full and
    padded batches alike (the rows no step reaches are written: every result is a function of
    the inputs)."""
    func = getattr(torch.ops.rnn_ablations, name).default
    calls = recorded[torch.ops.rnn_ablations.plain_forward_.default if name == "plain_forward"
                     else func]
    # one call per distinct set of flags and sizes is enough (they share the code paths), and
    # two of the padded ones (what padding adds is the rows no step reaches)
    seen = set()
    checked = {False: 0, True: 0}
    for args, kwargs, padded in calls:
        key = (padded,) + tuple(a if isinstance(a, (bool, int)) else
                                (tuple(a.shape) if isinstance(a, torch.Tensor) else len(a))
                                for a in args)
        if key in seen or (padded and checked[True] >= 2):
            continue
        seen.add(key)
        opcheck(func, args, kwargs)
        checked[padded] += 1
    assert checked[False] and checked[True], checked


def test_forward_operators_give_the_same_results_twice_on_a_padded_batch(recorded):
    """What a forward saves at the rows no step reaches is written, not left as it was in
    memory: two calls with the same inputs give the same bits in every result."""
    for name in ("plain_forward", "pipelined_forward", "pipelined_directions_forward",
                 "plain_directions_forward_", "plain_forward_", "scan_forward"):
        func = getattr(torch.ops.rnn_ablations, name).default
        calls = [c for c in recorded[torch.ops.rnn_ablations.plain_forward_.default
                                     if name == "plain_forward" else func] if c[2]]
        assert calls, name
        for args, kwargs, _ in calls[:3]:
            def fresh():
                return [a.clone() if isinstance(a, torch.Tensor) else
                        [t.clone() for t in a] if isinstance(a, list) else a for a in args]
            first, second = func(*fresh(), **kwargs), func(*fresh(), **kwargs)
            for i, (a, b) in enumerate(zip(first, second)):
                assert torch.equal(a, b), f"{name}: result {i} differs between two calls"


def test_a_dispatch_mode_sees_the_operators():
    seen = []

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func._schema.name)
            return func(*args, **(kwargs or {}))

    rnn = AblatedRNN("ran", 5, 4, bidirectional=True)
    with options(backend="kernel"), Seen():
        out, _ = rnn(torch.randn(6, 3, 5, requires_grad=True))
        out.sum().backward()
    ours = [s for s in seen if s.startswith("rnn_ablations::")]
    assert any("forward" in s for s in ours) and any("backward" in s for s in ours), ours


def test_the_profiler_records_the_operators():
    """Under ``torch.profiler`` a layer call goes through the dispatcher, so the profile names the
    kernel's operators (and the time spent in them)."""
    from torch.profiler import ProfilerActivity, profile

    rnn = AblatedRNN("ran", 5, 4, num_layers=2)
    x = torch.randn(6, 3, 5, requires_grad=True)
    with options(backend="kernel"), profile(activities=[ProfilerActivity.CPU]) as prof:
        rnn(x)[0].sum().backward()
    names = {e.name for e in prof.events()}
    ours = {n for n in names if n.startswith("rnn_ablations::")}
    assert any("forward" in n for n in ours) and any("backward" in n for n in ours), sorted(names)


def test_opcheck_onednn_linear():
    """The oneDNN input projection's operator (what a compiled graph calls), in the layouts the
    projection uses: a weight as it is and transposed (the input gradient), with and without
    bias."""
    from rnn_ablations.kernels import registry

    if not registry.onednn_usable():
        pytest.skip("this torch build has no oneDNN linear")
    torch.manual_seed(0)
    x, w, b = torch.randn(7, 5), torch.randn(6, 5), torch.randn(6)
    op = torch.ops.rnn_ablations.onednn_linear.default
    torch.testing.assert_close(op(x, w, b), torch.nn.functional.linear(x, w, b))
    for args in ((x, w, b), (x, w, None), (torch.randn(7, 6), w.t(), None)):
        opcheck(op, args)
