"""What a model's embedding path returns for a text: the labels of the positions its encoder read."""
from __future__ import annotations

import dataclasses
from typing import List

__all__ = ["Embedded"]


@dataclasses.dataclass
class Embedded:
    #: the labels of the positions (one per input vector of the encoder).
    words: List[str]
    #: words that the vocabulary did not know (shown as themselves, embedded as <unk>).
    unknown: List[str] = dataclasses.field(default_factory=list)
