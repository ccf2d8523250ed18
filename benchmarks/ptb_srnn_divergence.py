"""Why does the S-RNN (LSTM − GATES) diverge on PTB medium at the papers' settings?

`rnn-ablations reproduce ptb --config medium` trains ``srnn`` with the Zaremba medium settings
(SGD lr 1.0, clip 5, U(±0.05) init, dropout 0.5): it diverged in its first epoch on the GPU
(validation perplexity 5e9), and the small config diverged on the CPU too.  This script answers
the first question to ask — is it our cell? — by training, window by window on the same PTB
batches with the same dropout masks, two copies of the same language model from the same
initial weights: one with our ``srnn`` layers (:class:`rnn_ablations.AblatedRNN`), one whose
layers are ``torch.nn.RNN(nonlinearity="tanh")`` holding the same weights.  If both diverge at
the same window, the divergence belongs to the settings (SGD at lr 1 on a tanh RNN of 650
units), not to our implementation.  It then repeats our model at lower learning rates.

    RNN_ABLATIONS_PTB=DIR .venv/bin/python benchmarks/ptb_srnn_divergence.py [--windows 300]

Writes ``benchmarks/results/ptb_srnn_divergence.{json,md}`` (CPU: minutes per 100 windows).
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rnn_ablations.lm.configs import get_config  # noqa: E402
from rnn_ablations.lm.data import batchify, load_corpus  # noqa: E402
from rnn_ablations.lm.model import LanguageModel  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


class TorchRNNLayer(nn.Module):
    """``torch.nn.RNN`` (tanh) behind a single-layer AblatedRNN's call: (x, (h0, c0)) → out, (h, h)."""

    def __init__(self, ours):
        super().__init__()
        H = ours.hidden_size
        self.rnn = nn.RNN(ours.input_size, H, nonlinearity="tanh")
        with torch.no_grad():
            self.rnn.weight_ih_l0.copy_(ours.weight_ih_l0)
            self.rnn.weight_hh_l0.copy_(ours.weight_hh_l0)
            self.rnn.bias_ih_l0.copy_(ours.bias_l0)
            self.rnn.bias_hh_l0.zero_()
        # nn.RNN has two bias vectors where the S-RNN has one: both would receive the same
        # gradient and the bias would move twice as fast.  Keep the second at zero.
        self.rnn.bias_hh_l0.requires_grad_(False)

    def forward(self, x, state):
        out, h = self.rnn(x, state[0])
        return out, (h, h)


def _cpu_model() -> str:
    """The CPU model and its widest vector ISA (lscpu), e.g. 'AMD EPYC (AVX2, no AVX-512)'."""
    try:
        import subprocess
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.machine()
    model = next((ln.split(":", 1)[1].strip() for ln in text.splitlines()
                  if ln.startswith("Model name")), platform.machine())
    isa = "AVX-512" if "avx512f" in text else ("AVX2, no AVX-512" if "avx2" in text else "no AVX2")
    return f"{model} ({isa})"


def train(model, windows, cfg, lr, seed, report_every):
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    params = list(model.parameters())
    state = model.init_state(cfg.batch_size)
    trace, tot, n = [], 0.0, 0
    model.train()
    for i, (x, y) in enumerate(windows, 1):
        logits, new = model(x, state, generator=gen)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        (loss * cfg.num_steps).backward()      # the trainer's loss: mean over the batch, sum over T
        norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm))
        opt.step()
        state = (new[0].detach(), new[1].detach())
        tot += float(loss.detach())
        n += 1
        if i % report_every == 0 or i == len(windows):
            w_hh = max(float(torch.linalg.matrix_norm(p.detach(), ord=2))
                       for name, p in model.named_parameters() if "weight_hh" in name)
            trace.append({"window": i, "train_ppl": math.exp(min(tot / n, 700.0)),
                          "grad_norm": norm, "max_w_hh_spectral_norm": w_hh,
                          "decoder_weight_max": float(model.decoder.weight.abs().max())})
            tot, n = 0.0, 0
    return trace


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=os.environ.get("RNN_ABLATIONS_PTB", ".data/ptb"))
    ap.add_argument("--windows", type=int, default=300)
    ap.add_argument("--report-every", type=int, default=25)
    ap.add_argument("--lrs", type=float, nargs="+", default=[0.5, 0.25])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS))
    a = ap.parse_args(argv)
    if a.windows < 1 or a.report_every < 1 or a.threads < 1 or any(lr <= 0 for lr in a.lrs):
        ap.error("--windows, --report-every, --threads and --lrs must be positive")
    if not (Path(a.data) / "ptb.train.txt").exists():
        ap.error(f"{a.data}/ptb.train.txt not found: pass --data DIR (PTB with ptb.train.txt) "
                 "or set RNN_ABLATIONS_PTB")
    torch.set_num_threads(a.threads)
    cfg = get_config("medium")
    corpus = load_corpus(a.data)
    rows = batchify(corpus.train, cfg.batch_size)
    T = cfg.num_steps
    windows = [(rows[:, s * T:(s + 1) * T].t(), rows[:, s * T + 1:(s + 1) * T + 1].t())
               for s in range(min(a.windows, (rows.shape[1] - 1) // T))]
    torch.manual_seed(a.seed)
    ours = LanguageModel("srnn", len(corpus.vocab), cfg.hidden_size, cfg.num_layers,
                         dropout=cfg.dropout, init_scale=cfg.init_scale)
    ref = copy.deepcopy(ours)
    ref.layers = nn.ModuleList([TorchRNNLayer(layer) for layer in ours.layers])
    runs = {}
    t0 = time.time()
    for name, model, lr in ([("ours (AblatedRNN srnn), lr 1.0", ours, 1.0),
                             ("torch.nn.RNN tanh, same weights, lr 1.0", ref, 1.0)]
                            + [(f"ours, lr {lr:g}", None, lr) for lr in a.lrs]):
        if model is None:
            torch.manual_seed(a.seed)
            model = LanguageModel("srnn", len(corpus.vocab), cfg.hidden_size, cfg.num_layers,
                                  dropout=cfg.dropout, init_scale=cfg.init_scale)
            model.load_state_dict(runs_init)
        if name.startswith("ours (AblatedRNN"):
            runs_init = copy.deepcopy(model.state_dict())
        print(f"[srnn divergence] {name}: {len(windows)} windows ...", flush=True)
        runs[name] = train(model, windows, cfg, lr, a.seed, a.report_every)
        for r in runs[name]:
            print(f"  window {r['window']:5d}  train ppl {r['train_ppl']:.4g}  grad norm "
                  f"{r['grad_norm']:.3g}  |W_hh|_2 {r['max_w_hh_spectral_norm']:.3g}  "
                  f"max|decoder| {r['decoder_weight_max']:.3g}", flush=True)
    res = {"config": "medium", "variant": "srnn", "windows": len(windows),
           "batch": cfg.batch_size, "bptt": T, "clip": cfg.max_grad_norm,
           "init_scale": cfg.init_scale, "dropout": cfg.dropout, "seed": a.seed,
           "machine": f"{_cpu_model()}, torch {torch.__version__}, "
                      f"{a.threads} thread(s)",
           "seconds": round(time.time() - t0, 1), "runs": runs}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ptb_srnn_divergence.json").write_text(json.dumps(res, indent=2) + "\n")
    lines = [f"S-RNN (LSTM − GATES) on PTB, medium settings (batch {cfg.batch_size}, BPTT {T}, "
             f"clip {cfg.max_grad_norm:g}, U(±{cfg.init_scale:g}) init, dropout {cfg.dropout:g}), "
             f"first {len(windows)} training windows, seed {a.seed}; train perplexity of the "
             f"windows since the previous row.", "",
             "| run | " + " | ".join(f"w{r['window']}" for r in next(iter(runs.values()))) + " |",
             "|---|" + "---:|" * len(next(iter(runs.values())))]
    for name, trace in runs.items():
        lines.append(f"| {name} | " + " | ".join(f"{r['train_ppl']:.4g}" for r in trace) + " |")
    lines += ["", f"Command: `.venv/bin/python benchmarks/ptb_srnn_divergence.py --windows "
              f"{a.windows}`; {res['machine']}; {res['seconds']:.0f} s."]
    (out / "ptb_srnn_divergence.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
