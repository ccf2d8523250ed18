"""A small PTB-format corpus for the language-model tests (sentences of a 40-word vocabulary with
some structure, so that a tiny model learns it within one epoch)."""
import random
from pathlib import Path


def write_ptb(d: Path, n_train: int = 4000, n_eval: int = 500, seed: int = 0) -> Path:
    """``ptb.train.txt``, ``ptb.valid.txt`` and ``ptb.test.txt`` in ``d`` (created)."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(40)]

    def text(n):
        out, count = [], 0
        while count < n:
            k = rng.randint(3, 12)
            start = rng.randrange(40)
            sent = [words[(start + 3 * j + rng.randint(0, 1)) % 40] for j in range(k)]
            out.append(" ".join(sent))
            count += k + 1
        return "\n".join(out) + "\n"

    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    (d / "ptb.train.txt").write_text(text(n_train))
    (d / "ptb.valid.txt").write_text(text(n_eval))
    (d / "ptb.test.txt").write_text(text(n_eval))
    return d
