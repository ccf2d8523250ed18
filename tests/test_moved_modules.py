"""The deprecated import paths of the modules that moved into ``rnn_ablations.kernels``: each
warns, naming the new path, and is the moved module itself."""
import importlib
import subprocess
import sys

import pytest

from rnn_ablations._moved import MOVED


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_path_warns_and_is_the_module(old):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=MOVED[old].replace(".", r"\.")):
        module = importlib.import_module(old)
    assert module is importlib.import_module(MOVED[old])


def test_backend_alias_from_import_and_attribute():
    code = ("import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
            "try:\n    from rnn_ablations.backend import kernel_available\n"
            "except DeprecationWarning as e:\n    print('warned:', e)\n"
            "warnings.simplefilter('ignore')\n"
            "import rnn_ablations.backend as old, rnn_ablations.kernels.backend as new\n"
            "print(old is new, old.kernel_available is new.kernel_available)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "warned: rnn_ablations.backend moved to rnn_ablations.kernels.backend" in out.stdout
    assert "True True" in out.stdout
