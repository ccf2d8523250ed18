"""Speed of every variant against torch.nn.LSTM (forward+backward and inference, float32,
batch 32, length 64, hidden 256 and 650, batch_first, median of interleaved repeats).

    .venv/bin/python benchmarks/speed.py            # prints the table, writes benchmarks/results/speed.{json,md}
"""
import sys
from pathlib import Path

from rnn_ablations.cli import main

if __name__ == "__main__":
    out = Path(__file__).resolve().parent / "results"
    sys.exit(main(["speed", "--out", str(out), *sys.argv[1:]]))
