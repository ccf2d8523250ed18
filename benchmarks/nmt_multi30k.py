#!/usr/bin/env python
"""CPU-sized Multi30k En->De benchmark of the OpenNMT-py encoders.

For every encoder type (default: the bidirectional encoders of the paper's setup, plus
OpenNMT's stock ``brnn`` LSTM encoder for reference) it runs the real commands:

1. ``onmt_build_vocab`` once with ``onmt_configs/smoke_multi30k.yaml`` (and drops the empty token
   that one double space in train.lc.norm.tok.en produces, which onmt_train cannot read back);
2. ``onmt_train -config onmt_configs/smoke_multi30k.yaml -encoder_type T`` for ``--steps`` steps
   (2 x 128 bidirectional encoder, 2 x 128 LSTM decoder with input feeding, 8000-word
   vocabularies, Adam 0.002, 64 sentences per batch, seed 3435);
3. ``onmt_translate`` of the whole val set (1014 sentences, val.lc.norm.tok.en) with greedy
   decoding (``-beam_size 1``, max length 100) from the final checkpoint;
4. BLEU of the translations against val.lc.norm.tok.de with sacrebleu
   (``corpus_bleu(..., tokenize="none")``: the files are already tokenised and lower-cased).

Time per 100 steps is measured from the training log's time stamps, between the first and the
last progress report (so data loading, model building and the first ``--report-every`` steps are
excluded); it is wall-clock time on whatever else the machine is doing.  The CPU time of each
whole ``onmt_train`` process (user + system, from ``getrusage``) is recorded too: it depends
less on the other load of a shared machine.

    nice -n 10 .venv/bin/python benchmarks/nmt_multi30k.py   # 15-27 min on 2 shared CPU cores

This smoke run is CPU-sized: 250 steps show that every encoder trains, nothing about the papers'
ordering.  Results: ``benchmarks/results/nmt_multi30k_cpu_smoke.json`` and ``.md`` (and printed).

``--full`` is the paper's recipe (ACL 2018, Table 4), for a GPU (hours per encoder on a CPU): for
every encoder type it trains ``onmt_configs/multi30k_<type>.yaml`` as written (OpenNMT's default
RNN model, 5889 steps; checkpoints in ``run/multi30k/<type>/`` under ``--work``, one folder per
type), translates Multi30k **test 2016** (``test_2016_flickr.lc.norm.tok.en``) and val with the
final checkpoint, beam 5 and ``-replace_unk``, and scores both with sacreBLEU on the tokenised,
lower-cased references (``tokenize="none"``)::

    python benchmarks/nmt_multi30k.py --full --gpu          # all six encoder types
    python benchmarks/nmt_multi30k.py --full --types bran,blstm

Results: ``benchmarks/results/nmt_multi30k_full.json`` and ``.md``.  Test 2016 is the number for a
table; val is printed beside it.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "onmt_configs" / "smoke_multi30k.yaml"
CONFIGS = REPO / "onmt_configs"
DEFAULT_DATA = Path(os.environ.get("RNN_ABLATIONS_SHARED_DATA", REPO.parent / "shared" / "data"))
DEFAULT_TYPES = ["blstm", "bsrnn", "blstm_minus_srnn", "bran", "bidentity_ran", "brnn"]
STEP_RE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO\] Step\s+(\d+)/")


def _bin(name: str) -> str:
    path = Path(sys.executable).parent / name
    if not path.exists():
        raise SystemExit(f"error: {path} not found: run this with the project's .venv/bin/python "
                         "(bash scripts/setup.sh installs OpenNMT-py 3.5.1 there)")
    return str(path)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(cmd, cwd: Path, env, log: Path) -> str:
    with open(log, "w") as f:
        proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, stdout=f,
                              stderr=subprocess.STDOUT, text=True)
    text = log.read_text()
    if proc.returncode != 0:
        raise SystemExit(f"error: {' '.join(map(str, cmd))} failed with {proc.returncode}; the end "
                         f"of {log}:\n{text[-3000:]}")
    return text


def time_per_100_steps(log: str):
    points = []
    for line in log.splitlines():
        m = STEP_RE.match(line)
        if m:
            t = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            points.append((int(m.group(2)), t))
    if len(points) < 2:
        raise SystemExit("error: fewer than two progress reports in the training log; use "
                         "--steps of at least twice --report-every")
    (s0, t0), (s1, t1) = points[0], points[-1]
    return 100.0 * (t1 - t0) / (s1 - s0), s0, s1


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _grab(pattern: str, text: str, cast=float):
    m = re.findall(pattern, text)
    return cast(m[-1]) if m else None


#: ``onmt_translate`` with one fix.  OpenNMT-py 3.5.1's RNN decoders stack the attention of a
#: decoding step time-major, ``(1, batch*beam, src_len)``, while its beam search (and greedy search)
#: index it batch-first like the transformer decoder's ``(batch*beam, 1, src_len)``; so any RNN
#: decoder, ``brnn`` included, fails with ``IndexError`` in ``beam_search.advance`` when the
#: attention is returned, i.e. with ``-replace_unk`` and ``-beam_size`` > 1.  During step-wise
#: decoding only (``step`` given; training is untouched) the wrapper hands the search the
#: batch-first layout it indexes.
TRANSLATE_WITH_ATTENTION_FIX = """
import sys
import onmt.decoders.decoder as d
_forward = d.RNNDecoderBase.forward
def forward(self, tgt, enc_out, src_len=None, step=None, **kwargs):
    dec_outs, attns = _forward(self, tgt, enc_out, src_len=src_len, step=step, **kwargs)
    if step is not None:
        attns = {k: (v.transpose(0, 1) if hasattr(v, 'transpose') and v.dim() == 3 else v)
                 for k, v in attns.items()}
    return dec_outs, attns
d.RNNDecoderBase.forward = forward
from onmt.bin.translate import main
sys.argv = ['onmt_translate'] + sys.argv[1:]
main()
"""


def _translate_cmd():
    return [sys.executable, "-c", TRANSLATE_WITH_ATTENTION_FIX]


def _bleu(sacrebleu, hyp_file: Path, ref_file: Path) -> float:
    hyps = hyp_file.read_text(encoding="utf-8").splitlines()
    refs = ref_file.read_text(encoding="utf-8").splitlines()
    if len(hyps) != len(refs):
        raise SystemExit(f"error: {hyp_file} has {len(hyps)} lines for {len(refs)} references")
    return round(sacrebleu.corpus_bleu(hyps, [refs], tokenize="none", force=True).score, 2)


def _smoke(args, types, work, env, link, multi30k, sacrebleu, save):
    gpu_train = ["-world_size", "1", "-gpu_ranks", "0"] if args.gpu else []
    gpu_translate = ["-gpu", "0"] if args.gpu else []
    results = []
    started = time.time()
    for enc_type in types:
        d = work / "run" / "bench" / enc_type  # one folder per encoder type
        d.mkdir(parents=True, exist_ok=True)
        t, cpu = time.time(), _children_cpu()
        log = _run([_bin("onmt_train"), "-config", CONFIG, "-encoder_type", enc_type,
                    "-save_model", d / "model", "-train_steps", args.steps, "-valid_steps",
                    args.steps, "-save_checkpoint_steps", args.steps, "-report_every",
                    args.report_every] + gpu_train, work, env, d / "train.log")
        train_wall, train_cpu = time.time() - t, _children_cpu() - cpu
        per100, s0, s1 = time_per_100_steps(log)
        pred = d / "val.pred.de"
        t = time.time()
        _run([_bin("onmt_translate"), "-model", d / f"model_step_{args.steps}.pt", "-src",
              link / "multi30k" / "val.lc.norm.tok.en", "-output", pred, "-beam_size", "1",
              "-batch_size", "64", "-max_length", "100"] + gpu_translate, work, env,
             d / "translate.log")
        translate_wall = time.time() - t
        row = {
            "encoder_type": enc_type,
            "bleu": _bleu(sacrebleu, pred, multi30k / "val.lc.norm.tok.de"),
            "sec_per_100_steps": round(per100, 2),
            "timed_steps": f"{s0}-{s1}",
            "val_ppl": _grab(r"Validation perplexity: ([\d.]+)", log),
            "val_acc": _grab(r"Validation accuracy: ([\d.]+)", log),
            "encoder_params": _grab(r"INFO\] encoder: (\d+)", log, int),
            "total_params": _grab(r"number of parameters: (\d+)", log, int),
            "train_wall_s": round(train_wall, 1),
            "train_cpu_s": round(train_cpu, 1),
            "translate_wall_s": round(translate_wall, 1),
        }
        results.append(row)
        save(results, started)
        print(json.dumps(row), flush=True)
    return results, started


def _config_value(path: Path, key: str) -> str:
    for line in path.read_text().splitlines():
        if line.startswith(key + ":"):
            return line.split(":", 1)[1].split("#", 1)[0].strip()
    raise SystemExit(f"error: {path} has no {key!r} line")


def _full(args, types, work, env, link, multi30k, sacrebleu, save):
    """The paper's recipe (see the module docstring)."""
    gpu_train = ["-world_size", "1", "-gpu_ranks", "0"] if args.gpu else []
    gpu_translate = ["-gpu", "0"] if args.gpu else []
    results = []
    started = time.time()
    for enc_type in types:
        config = CONFIGS / f"multi30k_{enc_type}.yaml"
        save_model = _config_value(config, "save_model")
        steps = int(_config_value(config, "train_steps")) if args.steps is None else args.steps
        d = work / Path(save_model).parent  # run/multi30k/<type>/, from the config itself
        if d.name != enc_type:
            raise SystemExit(f"error: {config.name} saves to {save_model}; it must be "
                             f"run/multi30k/{enc_type}/model so that types never share files")
        d.mkdir(parents=True, exist_ok=True)
        t, cpu = time.time(), _children_cpu()
        quick = [] if args.steps is None else ["-train_steps", args.steps, "-valid_steps", steps,
                                               "-save_checkpoint_steps", steps]
        log = _run([_bin("onmt_train"), "-config", config] + quick + gpu_train, work, env,
                   d / "train.log")
        train_wall, train_cpu = time.time() - t, _children_cpu() - cpu
        checkpoint = work / f"{save_model}_step_{steps}.pt"
        row = {"encoder_type": enc_type, "config": str(config.relative_to(REPO)),
               "checkpoint": str(checkpoint.relative_to(work)), "train_steps": steps}
        for split, src, ref in (("test2016", "test_2016_flickr.lc.norm.tok.en",
                                 "test_2016_flickr.lc.norm.tok.de"),
                                ("val", "val.lc.norm.tok.en", "val.lc.norm.tok.de")):
            pred = d / f"{split}.pred.de"
            _run(_translate_cmd() + ["-model", checkpoint, "-src", link / "multi30k" / src,
                  "-output", pred, "-beam_size", "5", "-replace_unk", "-batch_size", "64",
                  "-max_length", "100"] + gpu_translate, work, env, d / f"translate_{split}.log")
            row[f"bleu_{split}"] = _bleu(sacrebleu, pred, multi30k / ref)
        row.update({
            "val_ppl": _grab(r"Validation perplexity: ([\d.]+)", log),
            "encoder_params": _grab(r"INFO\] encoder: (\d+)", log, int),
            "train_wall_s": round(train_wall, 1),
            "train_cpu_s": round(train_cpu, 1),
        })
        results.append(row)
        save(results, started)
        print(json.dumps(row), flush=True)
    return results, started


def _write(args, argv, results, started) -> str:
    """Write ``<out>.json`` and ``<out>.md`` for the rows so far (called after every encoder, so
    an interrupted run keeps what finished); returns the markdown."""
    meta = {
        "command": ("nice -n 15 .venv/bin/python benchmarks/nmt_multi30k.py " + " ".join(
            sys.argv[1:] if argv is None else argv)).strip(),
        "scale": (("the paper's recipe (multi30k_<type>.yaml, full training)" if args.steps is None
                   else f"a QUICK CHECK of the paper's recipe ({args.steps} steps only): not a "
                        "result") if args.full else
                  "smoke scale: shows that each encoder trains; not the papers' setting, and its "
                  "ordering of the encoders means nothing"),
        "config": ("onmt_configs/multi30k_<type>.yaml" if args.full
                   else str(CONFIG.relative_to(REPO))),
        "steps": None if args.full else args.steps,
        "threads": args.threads,
        "device": "cuda:0" if args.gpu else "cpu",
        "bleu": ("sacrebleu corpus_bleu(tokenize='none') on the tokenised lower-cased references, "
                 "beam 5, -replace_unk, final checkpoint; test 2016 (1000 sentences) and val (1014)"
                 if args.full else
                 "sacrebleu corpus_bleu(tokenize='none'), greedy (-beam_size 1), all 1014 "
                 "sentences of val.lc.norm.tok.en -> val.lc.norm.tok.de"),
        "time": "wall-clock seconds per 100 training steps between the first and last progress "
                "report (onmt_train log time stamps); CPU s = user + system time of the whole "
                "onmt_train process (start-up, data loading, all steps, validation, saving)",
        "machine": f"{_cpu_model()} ({platform.machine()}), {os.cpu_count()} CPUs (shared), "
                   f"Python {platform.python_version()}",
        "load_average_at_end": os.getloadavg(),
        "total_wall_s": round(time.time() - started, 1),
        "date": dt.datetime.now().isoformat(timespec="seconds"),
    }
    try:
        import torch
        meta["torch"] = torch.__version__
    except ImportError:  # pragma: no cover
        pass
    args.out.parent.mkdir(parents=True, exist_ok=True)
    Path(str(args.out) + ".json").write_text(json.dumps({"meta": meta, "results": results},
                                                        indent=2) + "\n")
    if args.full:
        header = ("| encoder type | BLEU test 2016 (beam 5) | BLEU val (beam 5) | val ppl | "
                  "encoder params | train wall s |\n|---|---|---|---|---|---|\n")
        rows = "".join(f"| `{r['encoder_type']}` | {r['bleu_test2016']:.2f} | {r['bleu_val']:.2f} | "
                       f"{r['val_ppl']:.1f} | {r['encoder_params']:,} | {r['train_wall_s']:.0f} |\n"
                       for r in results)
        what = f"`{meta['config']}` trained as written"
    else:
        header = ("| encoder type | BLEU (val, greedy) | val ppl | val acc % | s / 100 steps (wall) | "
                  "CPU s, whole onmt_train run | encoder params |\n|---|---|---|---|---|---|---|\n")
        rows = "".join(f"| `{r['encoder_type']}` | {r['bleu']:.2f} | {r['val_ppl']:.1f} | "
                       f"{r['val_acc']:.1f} | {r['sec_per_100_steps']:.1f} | "
                       f"{r['train_cpu_s']:.0f} | {r['encoder_params']:,} |\n" for r in results)
        what = f"{args.steps} steps of `{meta['config']}` per encoder"
    md = (f"{header}{rows}\nScale: {meta['scale']}.\n{what}, {meta['device']}, "
          f"{args.threads} torch thread(s); BLEU: {meta['bleu']}; time: {meta['time']}.\n"
          f"Machine: {meta['machine']}, torch {meta.get('torch')}; load average at the end "
          f"{tuple(round(x, 1) for x in meta['load_average_at_end'])}; total "
          f"{meta['total_wall_s'] / 60:.1f} min.\nCommand: `{meta['command']}`\n")
    Path(str(args.out) + ".md").write_text(md)
    return md


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA,
                    help="folder holding multi30k/ (default: ../shared/data or "
                         "$RNN_ABLATIONS_SHARED_DATA)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/rnn_ablations_nmt_multi30k"),
                    help="scratch folder for vocabularies, checkpoints and logs")
    ap.add_argument("--types", default=",".join(DEFAULT_TYPES),
                    help="comma-separated encoder types (default: %(default)s)")
    ap.add_argument("--steps", type=int, default=None,
                    help="training steps per encoder (default 250; with --full the config's "
                         "train_steps, and a value here is only for a quick check of the recipe)")
    ap.add_argument("--report-every", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (OMP_NUM_THREADS) per run; 1 is the most stable on a "
                         "shared 2-core machine")
    ap.add_argument("--out", type=Path, default=None,
                    help="results prefix (default: benchmarks/results/nmt_multi30k_cpu_smoke, "
                         "nmt_multi30k_full with --full)")
    ap.add_argument("--full", action="store_true",
                    help="the paper's recipe: train onmt_configs/multi30k_<type>.yaml as written, "
                         "translate test 2016 and val with beam 5 and -replace_unk, sacreBLEU")
    ap.add_argument("--gpu", action="store_true", help="train and translate on GPU 0")
    args = ap.parse_args(argv)
    if args.steps is None and not args.full:
        args.steps = 250
    if args.out is None:
        args.out = REPO / "benchmarks" / "results" / ("nmt_multi30k_full" if args.full
                                                      else "nmt_multi30k_cpu_smoke")

    multi30k = args.data / "multi30k"
    needed = ["train.lc.norm.tok.en", "train.lc.norm.tok.de", "val.lc.norm.tok.en",
              "val.lc.norm.tok.de"]
    if args.full:
        needed += ["test_2016_flickr.lc.norm.tok.en", "test_2016_flickr.lc.norm.tok.de"]
    missing = [n for n in needed if not (multi30k / n).is_file()]
    if missing:
        raise SystemExit(f"error: {multi30k} lacks {', '.join(missing)}; point --data (or "
                         "RNN_ABLATIONS_SHARED_DATA) at the folder that holds multi30k/")
    if not args.full and args.steps < 2 * args.report_every:
        raise SystemExit("error: --steps must be at least twice --report-every")
    types = [t.strip() for t in args.types.split(",") if t.strip()]
    import onmt.encoders  # the start-up hook registers our encoder types
    unknown = [t for t in types if t not in onmt.encoders.str2enc]
    if unknown:
        raise SystemExit(f"error: unknown encoder types {unknown}; valid: "
                         f"{', '.join(sorted(onmt.encoders.str2enc))}")
    if args.full:
        missing = [t for t in types if not (CONFIGS / f"multi30k_{t}.yaml").is_file()]
        if missing:
            raise SystemExit(f"error: --full trains onmt_configs/multi30k_<type>.yaml; there is none "
                             f"for {missing}")
    if args.gpu:
        import torch
        if not torch.cuda.is_available():
            raise SystemExit("error: --gpu given but torch sees no CUDA device")
    import sacrebleu

    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    link = work / "data"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(args.data.resolve())
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads),
               PYTHONWARNINGS="ignore")

    vocab_en, vocab_de = work / "run/multi30k/vocab.en", work / "run/multi30k/vocab.de"
    if not (vocab_en.exists() and vocab_de.exists()):
        (work / "logs").mkdir(exist_ok=True)
        _run([_bin("onmt_build_vocab"), "-config", CONFIG, "-n_sample", "-1", "-overwrite"],
             work, env, work / "logs" / "build_vocab.log")
    for vocab in (vocab_en, vocab_de):  # the empty token of the double-spaced line
        lines = vocab.read_text(encoding="utf-8").splitlines(keepends=True)
        kept = [line for line in lines if not line.startswith("\t")]
        if len(kept) != len(lines):
            vocab.write_text("".join(kept), encoding="utf-8")

    if args.full:
        results, started = _full(args, types, work, env, link, multi30k, sacrebleu,
                                 lambda rows, t0: _write(args, argv, rows, t0))
    else:
        results, started = _smoke(args, types, work, env, link, multi30k, sacrebleu,
                                  lambda rows, t0: _write(args, argv, rows, t0))
    print()
    print(_write(args, argv, results, started))
    return 0


if __name__ == "__main__":
    sys.exit(main())
