"""AllenNLP finds the package's encoders however it loads plugins: a ``.allennlp_plugins`` file
naming ``rnn_ablations``, ``import rnn_ablations`` after ``import allennlp``, and
``import rnn_ablations`` before it (the start-up hook then registers them when AllenNLP has been
imported).  ``--include-package rnn_ablations`` is what tests/integrations/test_allennlp_cli.py trains with.
Each case runs in a fresh interpreter, with the start-up hook, as the ``allennlp`` command does.
The wheel check (scripts/check_wheel.sh) trains the fixtures through each mechanism."""
import os

import pytest

from conftest import REPO, requires_allennlp, run_python

pytestmark = requires_allennlp

_CHECK = """
import sys
how = sys.argv[1]
if how == "plugins":          # what the allennlp command does first
    from allennlp.common.plugins import import_plugins
    import_plugins()
elif how == "after":
    import allennlp, rnn_ablations
elif how == "before":
    import rnn_ablations, allennlp
from allennlp.modules.seq2seq_encoders import Seq2SeqEncoder
from allennlp.modules.seq2vec_encoders import Seq2VecEncoder
print(Seq2SeqEncoder.by_name("srnn").__module__,
      Seq2VecEncoder.by_name("stacked_bidirectional_ran").__module__)
"""


@pytest.mark.parametrize("how", ["plugins", "after", "before"])
def test_encoders_registered(how, tmp_path):
    (tmp_path / ".allennlp_plugins").write_text("rnn_ablations\n" if how == "plugins" else "")
    env = {"PYTHONPATH": os.pathsep.join(
        [str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p]), "OMP_NUM_THREADS": "1"}
    env.pop("RNN_ABLATIONS_NO_HOOKS", None)
    old = os.getcwd()
    os.chdir(tmp_path)  # AllenNLP reads .allennlp_plugins from the working directory
    try:
        proc = run_python(_CHECK, how, env=env)
    finally:
        os.chdir(old)
    assert proc.returncode == 0, proc.stderr[-3000:]
    modules = proc.stdout.split()[-2:]
    assert len(modules) == 2 and all(m.startswith("rnn_ablations.") for m in modules), proc.stdout
