"""PTB-format text: reading, vocabulary, batching.

A PTB-format corpus is a directory with one sentence per line, tokens separated by white space,
in ``ptb.train.txt`` / ``ptb.valid.txt`` / ``ptb.test.txt`` (or ``train.txt`` / ``valid.txt`` /
``test.txt``).  Every line gets an ``<eos>`` token appended (as the TF tutorial's reader, which
replaces each newline by ``<eos>``); ``<unk>`` is an ordinary word.  The vocabulary is built from
the training file, most frequent first (ties alphabetical); a valid/test word that the training
file lacks is mapped to ``<unk>`` (added to the vocabulary when the training file has none).
The test file is optional; train and valid are required.
"""
from __future__ import annotations

import collections
import dataclasses
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch

__all__ = ["EOS", "UNK", "Vocabulary", "Corpus", "find_split_files", "read_tokens",
           "load_corpus", "batchify", "num_batches"]

EOS = "<eos>"
UNK = "<unk>"
SPLITS = ("train", "valid", "test")


class Vocabulary:
    """Word ↔ id, most frequent training word first."""

    def __init__(self, words: Sequence[str]):
        words = list(words)
        if not words:
            raise ValueError("a vocabulary needs at least one word")
        if len(set(words)) != len(words):
            raise ValueError("vocabulary words must be unique")
        self.words: List[str] = words
        self.index: Dict[str, int] = {w: i for i, w in enumerate(words)}

    @classmethod
    def from_tokens(cls, tokens: Iterable[str]) -> "Vocabulary":
        counts = collections.Counter(tokens)
        return cls(sorted(counts, key=lambda w: (-counts[w], w)))

    def __len__(self) -> int:
        return len(self.words)

    def __contains__(self, word: str) -> bool:
        return word in self.index

    def encode(self, tokens: Sequence[str], unk: Optional[str] = UNK) -> Tuple[torch.Tensor, int]:
        """Ids of ``tokens`` and the number of out-of-vocabulary tokens mapped to ``unk``."""
        idx = self.index
        unk_id = idx.get(unk) if unk is not None else None
        ids, oov = [], 0
        for t in tokens:
            i = idx.get(t)
            if i is None:
                if unk_id is None:
                    raise ValueError(f"word {t!r} is not in the vocabulary and there is no "
                                     f"{unk!r} token to map it to")
                i, oov = unk_id, oov + 1
            ids.append(i)
        return torch.tensor(ids, dtype=torch.int64), oov

    def decode(self, ids: Iterable[int]) -> List[str]:
        return [self.words[int(i)] for i in ids]


@dataclasses.dataclass
class Corpus:
    """Token-id streams of the splits (``test`` may be ``None``) and their vocabulary."""

    vocab: Vocabulary
    train: torch.Tensor
    valid: torch.Tensor
    test: Optional[torch.Tensor]
    source: str                          #: where it came from (a directory or "embedded …")
    oov: Dict[str, int] = dataclasses.field(default_factory=dict)
    description: str = ""

    def split(self, name: str) -> Optional[torch.Tensor]:
        if name not in SPLITS:
            raise ValueError(f"unknown split {name!r}; choose one of {', '.join(SPLITS)}")
        return getattr(self, name)

    def summary(self) -> str:
        sizes = ", ".join(f"{s} {len(t):,}" for s in SPLITS
                          if (t := getattr(self, s)) is not None)
        no_test = "" if self.test is not None else " (no test file)"
        return f"{self.source}: vocabulary {len(self.vocab):,}; tokens: {sizes}{no_test}"


def find_split_files(data_dir) -> Dict[str, Path]:
    """``{"train": path, "valid": path[, "test": path]}`` of a PTB-format directory."""
    d = Path(data_dir)
    if not d.exists():
        raise FileNotFoundError(
            f"data directory {str(d)!r} does not exist; give a directory with ptb.train.txt and "
            "ptb.valid.txt (or train.txt and valid.txt), or leave --data out to use the embedded "
            "synthetic corpus")
    if not d.is_dir():
        raise FileNotFoundError(f"--data must be a directory with ptb.train.txt and ptb.valid.txt, "
                                f"but {str(d)!r} is a file")
    found: Dict[str, Path] = {}
    for split in SPLITS:
        for name in (f"ptb.{split}.txt", f"{split}.txt"):
            p = d / name
            if p.is_file():
                found[split] = p
                break
    missing = [s for s in ("train", "valid") if s not in found]
    if missing:
        present = sorted(p.name for p in d.iterdir())[:20]
        what = " and ".join(f"ptb.{s}.txt (or {s}.txt)" for s in missing)
        raise FileNotFoundError(
            f"data directory {str(d)!r} has no {what}; it contains "
            f"{', '.join(present) if present else 'nothing'}. A PTB-format directory needs a "
            "train and a valid file (a test file is optional)")
    return found


def read_tokens(path) -> List[str]:
    """Tokens of a PTB-format file: each line's words followed by ``<eos>``."""
    p = Path(path)
    tokens: List[str] = []
    with open(p, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(
                    f"{str(p)!r} is not UTF-8 text: line {lineno} has the byte "
                    f"0x{raw[exc.start]:02x} at byte {exc.start + 1} of the line, which UTF-8 does not "
                    "allow there. Convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8 "
                    "in > out, with the file's real encoding)") from None
            # universal newlines, as text mode reads them: \n, \r\n and a lone \r
            parts = line.replace("\r\n", "\n").replace("\r", "\n").split("\n")
            if len(parts) > 1 and parts[-1] == "":
                parts.pop()
            for part in parts:
                tokens.extend(part.split())
                tokens.append(EOS)
    if all(t == EOS for t in tokens):
        raise ValueError(f"{str(p)!r} contains no words; a PTB-format file has one sentence "
                         "per line")
    return tokens


def load_corpus(data_dir) -> Corpus:
    """Read a PTB-format directory (see the module docstring)."""
    files = find_split_files(data_dir)
    train_tokens = read_tokens(files["train"])
    vocab = Vocabulary.from_tokens(train_tokens)
    streams, oov = {}, {}
    for split in SPLITS:
        if split not in files:
            streams[split] = None
            continue
        tokens = train_tokens if split == "train" else read_tokens(files[split])
        if split != "train" and UNK not in vocab and any(t not in vocab for t in tokens):
            vocab = Vocabulary(vocab.words + [UNK])
        streams[split], oov[split] = vocab.encode(tokens)
    if len(streams["train"]) < 2:
        raise ValueError(f"{files['train']} is too short to train on")
    return Corpus(vocab, streams["train"], streams["valid"], streams["test"],
                  source=str(Path(data_dir)), oov=oov,
                  description="PTB-format text (one sentence per line, <eos> appended)")


def batchify(data: torch.Tensor, batch_size: int) -> torch.Tensor:
    """``(batch_size, N // batch_size)``: the stream cut into ``batch_size`` contiguous rows
    (the remainder is dropped), as the TF tutorial's ``ptb_producer``."""
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    n = data.numel() // batch_size
    if n < 2:
        raise ValueError(f"a stream of {data.numel()} tokens is too short for batch size "
                         f"{batch_size}: each row needs at least 2 tokens")
    return data[: n * batch_size].view(batch_size, n)


def num_batches(rows: torch.Tensor, num_steps: int, drop_last: bool = True) -> int:
    """Number of BPTT windows of a batchified stream (training drops the last partial one)."""
    n = rows.shape[1] - 1
    return n // num_steps if drop_last else -(-n // num_steps)
