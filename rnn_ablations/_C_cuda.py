"""The CUDA kernels' entry points under the name the run layer imports (``rnn_ablations.backend``,
``rnn_ablations.scan``): the NVRTC-compiled kernels of :mod:`rnn_ablations.kernels.cuda` (host
code in :mod:`rnn_ablations.kernels.cuda.host`).  Importing it raises ``ImportError`` with the
reason when the CUDA kernels cannot run in this process (no CUDA in torch, no visible device, no
NVRTC or driver, ``RNN_ABLATIONS_NO_KERNEL=1``); nothing is compiled at import."""
from .kernels.cuda import load as _load

_host, _why = _load()
if _host is None:
    raise ImportError(f"the CUDA kernels are not in use: {_why}")

forward = _host.forward
backward = _host.backward
scan_forward = _host.scan_forward
scan_backward = _host.scan_backward
persistent_forward = _host.persistent_forward
persistent_backward = _host.persistent_backward
persistent_plan = _host.persistent_plan
#: the scan entry points' calling convention (rnn_ablations.backend.SCAN_ABI)
scan_abi = _host.SCAN_ABI
