"""The encoder types and ``-ablated_init`` choices that the OpenNMT-py integration adds, the
error its checks raise, and how to install OpenNMT-py: what every other module of the package
reads, without importing torch or OpenNMT-py."""
from __future__ import annotations

from typing import Dict, Tuple

from .. import ONMT_INSTALL_HINT as INSTALL_HINT
from ...variants import VARIANTS, get_variant

__all__ = ["ENCODER_TYPES", "CLASS_NAMES", "INIT_CHOICES", "DEFAULT_INIT", "INSTALL_HINT", "OnmtUsageError",
           "encoder_type_for", "require_onmt"]

#: ``-ablated_init`` choices (see the package's docstring).
INIT_CHOICES = ("gate_bias", "onmt", "variant")
DEFAULT_INIT = "onmt"

#: encoder type -> (variant, bidirectional)
ENCODER_TYPES: Dict[str, Tuple[str, bool]] = {}
for _v in VARIANTS:
    ENCODER_TYPES[_v] = (_v, False)
for _v in VARIANTS:
    ENCODER_TYPES["b" + _v] = (_v, True)


def _class_name(encoder_type: str) -> str:
    variant, bidirectional = ENCODER_TYPES[encoder_type]
    camel = "".join(part.capitalize() for part in variant.split("_"))
    return f"Ablated{'Bi' if bidirectional else ''}{camel}Encoder"


#: encoder type -> the name of its encoder class (``bran`` -> ``AblatedBiRanEncoder``)
CLASS_NAMES: Dict[str, str] = {t: _class_name(t) for t in ENCODER_TYPES}


class OnmtUsageError(ValueError):
    """An option, config or checkpoint that the OpenNMT-py integration refuses; the message
    says what was wrong and how to fix it.  Uncaught in an OpenNMT-py command (``onmt_train``,
    ``onmt_translate``) it is printed as one line ``onmt_train: error: ...`` instead of a
    traceback (:func:`rnn_ablations.integrations.onmt.register` installs that)."""


def encoder_type_for(variant: str, bidirectional: bool = True) -> str:
    """The encoder type name of a variant (aliases accepted): ``("ran", True)`` -> ``"bran"``."""
    name = get_variant(variant).name
    return ("b" if bidirectional else "") + name


def require_onmt() -> None:
    """Raise ``ImportError`` saying how to install OpenNMT-py when it cannot be imported."""
    try:
        import onmt.encoders.encoder  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"the OpenNMT-py encoders of rnn_ablations need OpenNMT-py 3.5.1, which cannot be "
            f"imported here ({exc}); install it with: {INSTALL_HINT}") from exc
