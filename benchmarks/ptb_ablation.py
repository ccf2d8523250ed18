"""The papers' language-model ablation on real Penn Treebank data, CPU-sized.

Runs ``rnn-ablations ablate`` on ``../shared/data/ptb`` (train + valid only: there is no test file
there, so only valid perplexity is reported) with all five variants under the ``small`` config of
Zaremba et al. (2 × 200, BPTT 20, batch 20, init 0.1, lr 1.0, clip 5, no dropout, same seed)
but trained for ONE epoch over the first ``--train-tokens`` tokens of ``ptb.train.txt`` (the
full schedule is 13 epochs over all 929,589 tokens: hours per variant on 2 CPU cores).

Records the table, the exact command, the wall time and the machine into
``benchmarks/results/ptb_ablation.{json,md,csv,png}``.  The run directories (checkpoints, ~20 MB
per variant) go to ``--work`` (outside the repository).

    nice -n 10 .venv/bin/python benchmarks/ptb_ablation.py
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("RNN_ABLATIONS_SHARED_DATA", REPO.parent / "shared" / "data"))


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(SHARED / "ptb"), help="PTB directory (default: %(default)s)")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--train-tokens", type=int, default=300_000,
                    help="train on the first N tokens of ptb.train.txt (default %(default)s)")
    ap.add_argument("--variants", nargs="+", default=None)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="config overrides passed to ablate (e.g. learning_rate=0.25)")
    ap.add_argument("--work", default="/tmp/rnn_ablations_ptb_ablation",
                    help="where the run directories go (default: %(default)s)")
    ap.add_argument("--results", default=str(REPO / "benchmarks" / "results"),
                    help="where the table goes (default: %(default)s)")
    ap.add_argument("--name", default="ptb_ablation", help="file name stem of the results")
    ap.add_argument("--render-only", action="store_true",
                    help="only re-render NAME.{csv,md,png} from the recorded NAME.json")
    args = ap.parse_args(argv)
    if args.render_only:
        record = json.loads((Path(args.results) / f"{args.name}.json").read_text())
        print(render(record, Path(args.results), args.name))
        return 0

    if not (Path(args.data) / "ptb.train.txt").exists():
        print(f"skipped: no PTB data at {args.data} (set RNN_ABLATIONS_SHARED_DATA or --data)")
        return 2
    exe = Path(sys.executable).with_name("rnn-ablations")
    cmd = [str(exe) if exe.exists() else "rnn-ablations", "ablate", "--data", args.data,
           "--config", "small", "--epochs", str(args.epochs), "--out", args.work, "--overwrite",
           "--no-progress"]
    if args.train_tokens:
        cmd += ["--train-tokens", str(args.train_tokens)]
    if args.variants:
        cmd += ["--variants", *args.variants]
    for item in args.set:
        cmd += ["--set", item]
    shown = " ".join(shlex.quote(c) for c in cmd).replace(str(exe), "rnn-ablations")
    print("$", shown, flush=True)
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO)
    wall = time.perf_counter() - t0
    load_after = os.getloadavg()
    if proc.returncode != 0:
        print(f"ablate failed with exit code {proc.returncode}", file=sys.stderr)
        return proc.returncode

    import torch
    data = json.loads((Path(args.work) / "results.json").read_text())
    record = {
        "command": shown,
        "wall_time_s": wall,
        "machine": {"cpu": _cpu_model(), "cores": os.cpu_count(), "torch": torch.__version__,
                    "python": platform.python_version(),
                    "load_average_before": load_before, "load_average_after": load_after},
        "what": (f"config small (2 x 200, BPTT 20, batch 20, init 0.1, lr 1.0, clip 5, dropout 0)"
                 + (f" with {', '.join(args.set)}" if args.set else "") + ", "
                 f"{args.epochs} epoch(s) over the first {args.train_tokens:,} tokens of "
                 "ptb.train.txt; perplexity on all of ptb.valid.txt (there is no test file)"),
        "title": data["title"], "note": data["note"],
        "results": data["results"],
    }
    print(render(record, Path(args.results), args.name))
    return 0


def render(record, out: Path, name: str) -> str:
    """Write NAME.{json,csv,md,png} into ``out`` from a benchmark record; returns the markdown."""
    import tempfile
    from rnn_ablations.lm.ablate import write_results
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(record, indent=2) + "\n")
    with tempfile.TemporaryDirectory() as tmp:
        write_results(record["results"], Path(tmp), record["title"], record["note"])
        for ext in ("csv", "md", "png"):
            shutil.copyfile(Path(tmp) / f"results.{ext}", out / f"{name}.{ext}")
    m = record["machine"]
    md = (out / f"{name}.md").read_text()
    md += (f"\nWhat: {record['what']}.  \nCommand: `{record['command']}`  \n"
           f"Wall time: {record['wall_time_s'] / 60:.1f} min for all variants ({m['cpu']}, "
           f"{m['cores']} cores, torch {m['torch']}; load average {m['load_average_before'][0]:.1f} "
           f"→ {m['load_average_after'][0]:.1f}: other jobs were using the machine).\n")
    (out / f"{name}.md").write_text(md)
    return md


if __name__ == "__main__":
    sys.exit(main())
