"""The README's fixture-scale command blocks run as written.

Every fenced ```bash block preceded by the line ``<!-- readme-test -->`` (or
``<!-- readme-test slow -->``) is run with ``bash -euo pipefail`` from the repository root, as a
user would after ``bash scripts/setup.sh``; outputs go to ``runs/`` (git-ignored).  The slow ones
(the AllenNLP trainings, about a minute each on 2 idle cores) run only with
``RNN_ABLATIONS_README_SLOW=1``, so that the suite's time stays bounded; the blocks for the real
data (no marker) need the datasets and are not run."""
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MARK = re.compile(r"^<!-- readme-test( slow)? -->\n```bash\n(.*?)^```", re.M | re.S)


def blocks():
    text = (ROOT / "README.md").read_text()
    found = []
    for m in MARK.finditer(text):
        line = text[:m.start()].count("\n") + 1
        found.append(pytest.param(m.group(2), id=f"README.md:{line}",
                                  marks=[pytest.mark.skipif(
                                      bool(m.group(1)) and os.environ.get("RNN_ABLATIONS_README_SLOW") != "1",
                                      reason="slow README block: set RNN_ABLATIONS_README_SLOW=1")]))
    return found


def test_readme_marks_blocks():
    assert len(blocks()) >= 3


@pytest.mark.parametrize("script", blocks())
def test_readme_block_runs_as_written(script):
    needs = set(re.findall(r"\.venv/bin/([\w-]+)", script))
    missing = [n for n in needs if not (ROOT / ".venv" / "bin" / n).exists()]
    if missing:
        pytest.skip(f".venv lacks {', '.join(missing)}: run `bash scripts/setup.sh` first")
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=ROOT,
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, f"{script}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-5000:]}"
