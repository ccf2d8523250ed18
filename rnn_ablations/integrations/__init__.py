"""Adapters to host frameworks (AllenNLP, OpenNMT-py).  Each imports its framework lazily, and
each imports without the other framework (or without its own: then it says how to install it)."""

__all__ = ["ALLENNLP_INSTALL_HINT", "ONMT_INSTALL_HINT"]

#: How to install AllenNLP next to an installed rnn_ablations: its own pins (torch<1.13, ...)
#: cannot be met, hence ``--no-deps``; the extra brings its working dependency set.
ALLENNLP_INSTALL_HINT = ('pip install "rnn-ablations[allennlp]" && pip install --no-deps '
                         'allennlp==2.10.1 allennlp-models==2.10.1')

#: How to install OpenNMT-py next to an installed rnn_ablations: its own pin (torch<2.3) cannot
#: be met, hence ``--no-deps``; the extra brings what it imports.
ONMT_INSTALL_HINT = 'pip install "rnn-ablations[onmt]" && pip install --no-deps OpenNMT-py==3.5.1'
