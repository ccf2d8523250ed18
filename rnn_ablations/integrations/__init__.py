"""Adapters to host frameworks (AllenNLP, OpenNMT-py).  Each imports its framework lazily, and
each imports without the other framework (or without its own: then it says how to install it)."""

__all__ = ["ALLENNLP_INSTALL_HINT", "ONMT_INSTALL_HINT", "extra_hint"]


def extra_hint(extra: str) -> str:
    """The pip command that installs one of the package's extras.  The package is on no index,
    so the command names ``$PKG``, its wheel or checkout, and says so."""
    return f'pip install "$PKG[{extra}]" (PKG: the rnn_ablations wheel or checkout; it is on no index)'

#: How to install AllenNLP next to an installed rnn_ablations: its own pins (torch<1.13, ...)
#: cannot be met, hence ``--no-deps``; the extra brings its working dependency set.
ALLENNLP_INSTALL_HINT = ('pip install "$PKG[allennlp]" && pip install --no-deps allennlp==2.10.1 '
                         'allennlp-models==2.10.1 (PKG: the rnn_ablations wheel or checkout; it '
                         'is on no index)')

#: How to install OpenNMT-py next to an installed rnn_ablations: its own pin (torch<2.3) cannot
#: be met, hence ``--no-deps``; the extra brings what it imports.
ONMT_INSTALL_HINT = ('pip install "$PKG[onmt]" && pip install --no-deps OpenNMT-py==3.5.1 (PKG: '
                     'the rnn_ablations wheel or checkout; it is on no index)')
