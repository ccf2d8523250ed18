"""Speed of every variant against torch.nn.LSTM (forward+backward and inference, batch 32,
length 64, hidden 256 and 650, batch_first, median of interleaved repeats).

    .venv/bin/python benchmarks/speed.py            # prints the table, writes benchmarks/results/speed_*.{json,md}
    python3 benchmarks/speed.py --device cuda --dtype float32 bfloat16 float16 autocast-bfloat16
                                                    # CUDA: against cuDNN's nn.LSTM in the same dtype
    python3 benchmarks/speed.py --device cuda --shapes experiments --name speed_cuda_experiments
                                                    # the experiments' own shapes (PTB LMs, BiDAF, ...)

Every row carries its dtype; on CUDA, --cuda-graphs on|off picks graph replay of the kernel's
step loop (rnn_ablations.kernels.cuda.graphs).  `bash benchmarks/gpu_check.sh OUT` runs the CUDA rows.
"""
import sys
from pathlib import Path

from rnn_ablations.cli import main

if __name__ == "__main__":
    out = Path(__file__).resolve().parent / "results"
    sys.exit(main(["speed", "--out", str(out), *sys.argv[1:]]))
