import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("RNN_ABLATIONS_SHARED_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture
def one_thread():
    """Tiny tensors: one thread is much faster than two, above all on a busy 2-core machine
    (waiting OpenMP threads spin)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def requires_shared_data(*parts):
    path = SHARED_DATA.joinpath(*parts)
    return pytest.mark.skipif(not path.exists(),
                              reason=f"shared data {path} is absent (set RNN_ABLATIONS_SHARED_DATA)")
