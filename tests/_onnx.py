"""An exported ONNX file as a function of torch tensors, run by onnxruntime (skips without it)."""
import pytest


def onnx_runner(path):
    """``f(*tensors) -> [numpy arrays]``: the model at ``path`` in onnxruntime, its inputs in the
    order the file declares them."""
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed "
                                                    "(requirements/core.txt)")
    runtime = ort.InferenceSession(str(path))
    names = [i.name for i in runtime.get_inputs()]
    return lambda *arrays: runtime.run(None, dict(zip(names, (a.numpy() for a in arrays))))
