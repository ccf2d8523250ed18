"""Adapters to host frameworks (AllenNLP, OpenNMT-py).  Each imports its framework lazily, and
each imports without the other framework (or without its own: then it says how to install it)."""

__all__ = ["ALLENNLP_INSTALL_HINT", "ONMT_INSTALL_HINT", "extra_hint"]


#: what ``$PKG`` in the install commands stands for: the package is on no index
_PKG = "(PKG: the rnn_ablations wheel or checkout; it is on no index)"


def extra_hint(extra: str) -> str:
    """The pip command that installs one of the package's extras (``$PKG``: its wheel or
    checkout, said in the command)."""
    return f'pip install "$PKG[{extra}]" {_PKG}'


#: How to install AllenNLP next to an installed rnn_ablations: its own pins (torch<1.13, ...)
#: cannot be met, hence ``--no-deps``; the extra brings its working dependency set.
ALLENNLP_INSTALL_HINT = ('pip install "$PKG[allennlp]" && pip install --no-deps allennlp==2.10.1 '
                         f'allennlp-models==2.10.1 {_PKG}')

#: How to install OpenNMT-py next to an installed rnn_ablations: its own pin (torch<2.3) cannot
#: be met, hence ``--no-deps``; the extra brings what it imports.
ONMT_INSTALL_HINT = f'pip install "$PKG[onmt]" && pip install --no-deps OpenNMT-py==3.5.1 {_PKG}'
