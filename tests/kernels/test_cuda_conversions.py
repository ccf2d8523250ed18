"""On a GPU (a loan: benchmarks/gpu_loan.sh runs it): the device's float16 / bfloat16
conversions (csrc/cuda/device_types.cuh, compiled by NVRTC: the PTX cvt of float16, the
bfloat16 rounding) give torch's bits for every 16-bit value, every tie and the special values
(benchmarks/gpu_in_use.py conversion_check).  The CPU emulation compiles the float16 conversion
from a stand-in, so only a GPU checks the instruction itself."""
import importlib.util
import os

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(),
                               reason="needs a CUDA GPU (run on a loan: benchmarks/gpu_loan.sh)")


def _gpu_in_use():
    spec = importlib.util.spec_from_file_location(
        "gpu_in_use", os.path.join(ROOT, "benchmarks", "gpu_in_use.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@needs_gpu
def test_device_16_bit_conversions_are_torchs_bit_for_bit():
    from rnn_ablations.kernels.cuda import driver
    if driver.driver_error():
        pytest.skip(f"no CUDA driver library: {driver.driver_error()}")
    assert _gpu_in_use().conversion_check("cuda") == []


def test_the_values_cover_every_16_bit_pattern_and_the_ties():
    vals = _gpu_in_use().conversion_values()
    for dt in (torch.float16, torch.bfloat16):
        patterns = vals.to(dt).view(torch.int16).unique().numel()
        assert patterns >= (1 << 16) - 2100, (dt, patterns)  # all but the NaN payloads
