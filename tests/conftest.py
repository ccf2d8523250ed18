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


def requires_shared_data(*parts):
    path = SHARED_DATA.joinpath(*parts)
    return pytest.mark.skipif(not path.exists(),
                              reason=f"shared data {path} is absent (set RNN_ABLATIONS_SHARED_DATA)")
