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

``--full --concurrent`` is the same recipe for one GPU, every type at once (one ``onmt_train``
process each), resumable over calls (``benchmarks/gpu_nmt.sh`` runs it on a lent machine):
``--phase timing`` measures ``--timing-steps`` steps of every type at once and projects the full
schedule; ``--phase train`` trains on from each type's last checkpoint in ``--work`` (at most
``--max-steps-per-call`` steps, or what ``--budget`` seconds allow, ending on a checkpoint);
``--phase evaluate`` translates test 2016 with beam 5 and ``-replace_unk`` for the finished runs and
scores them; ``--phase all`` does the three.  Results: ``benchmarks/results/nmt_multi30k_gpu.json``
and ``.md`` (``--results``), one row per type: variant, encoder_type, steps, bleu_test2016, beam,
seconds, status, with the paper's BLEU beside ours.  ``--subset``, ``--steps`` and ``--onmt-opt``
make a check of the recipe at a tiny scale (labelled as such in the results).
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


def _translate_cmd():
    """``onmt_translate`` through ``rnn-ablations onmt-translate``, which registers the package
    first: with it, beam 5 and ``-replace_unk`` run on OpenNMT-py 3.5.1's input-feeding RNN
    decoder, which alone fails there with ``IndexError``
    (:mod:`rnn_ablations.integrations.onmt.translate`)."""
    return _onmt_cmd("onmt-translate")


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


# ---------------------------------------------------------------------------------------------
# The paper's recipe for one GPU: every encoder type at once, split over calls when needed.
#: BLEU of the ACL 2018 paper's Table 4 (Multi30k test 2016), by our encoder type.
PAPER_BLEU = {"blstm": 35.95, "bsrnn": 12.22, "blstm_minus_srnn": 36.66, "bran": 36.39}
#: the paper's four encoders first, then the two further ablations
PAPER_TYPES = ["blstm", "bsrnn", "blstm_minus_srnn", "bran", "bidentity_ran",
               "blstm_minus_srnn_minus_hidden"]
CKPT_RE = re.compile(r"^model_step_(\d+)\.pt$")


def _onmt_cmd(command: str):
    """An OpenNMT-py command through ``rnn-ablations``'s wrapper, which registers the encoders
    itself (a machine where the package is only on PYTHONPATH has no start-up hook)."""
    return [sys.executable, "-m", "rnn_ablations.cli", command]


def _variant_of(enc_type: str) -> str:
    from rnn_ablations.integrations.onmt import ENCODER_TYPES
    return ENCODER_TYPES[enc_type][0] if enc_type in ENCODER_TYPES else enc_type


def _checkpoints(d: Path):
    """``{step: path}`` of the checkpoints in ``d``."""
    found = {}
    for f in d.glob("model_step_*.pt") if d.is_dir() else []:
        m = CKPT_RE.match(f.name)
        if m:
            found[int(m.group(1))] = f
    return found


def _latest_loadable(d: Path) -> int:
    """The step of the newest checkpoint in ``d`` that loads (0 when none); a checkpoint cut
    short by a stopped process is deleted."""
    import torch
    found = _checkpoints(d)
    for step in sorted(found, reverse=True):
        try:
            torch.load(found[step], map_location="cpu", weights_only=False)
            return step
        except Exception as exc:  # noqa: BLE001 - a truncated file
            print(f"[nmt] {found[step]} does not load ({type(exc).__name__}); deleted", flush=True)
            found[step].unlink()
    return 0


def _json_load(path: Path, default):
    return json.loads(path.read_text()) if path.is_file() else default


def _run_at_once(jobs, cwd: Path, env, deadline=None):
    """Start every ``(name, cmd, log)`` job at once; wait for all (SIGTERM at ``deadline``, a
    monotonic time).  Returns ``{name: (returncode, seconds, stopped)}``."""
    running = {}
    for name, cmd, log in jobs:
        f = open(log, "a")
        f.write(f"\n$ {' '.join(map(str, cmd))}\n")
        f.flush()
        running[name] = (subprocess.Popen([str(c) for c in cmd], cwd=cwd, env=env, stdout=f,
                                          stderr=subprocess.STDOUT), f, time.monotonic())
    done, stopped = {}, set()
    while running:
        for name in list(running):
            proc, f, t0 = running[name]
            if proc.poll() is not None:
                f.close()
                done[name] = (proc.returncode, time.monotonic() - t0, name in stopped)
                del running[name]
        if running and deadline is not None and time.monotonic() > deadline and not stopped:
            for name, (proc, _f, _t0) in running.items():
                print(f"[nmt] budget reached: stopping {name}", flush=True)
                proc.terminate()
                stopped.add(name)
        if running and stopped and time.monotonic() > deadline + 60:
            for proc, _f, _t0 in running.values():
                proc.kill()
        time.sleep(0.5)
    return done


def _subset(data: Path, work: Path, n: int) -> Path:
    """The first ``n`` sentence pairs of train and of val and test 2016 (``n // 4``, at least 4),
    in ``work/data_subset/multi30k``: a check of the recipe on little data."""
    out = work / "data_subset" / "multi30k"
    out.mkdir(parents=True, exist_ok=True)
    for name in ("train", "val", "test_2016_flickr"):
        keep = n if name == "train" else max(4, n // 4)
        for lang in ("en", "de"):
            src = data / "multi30k" / f"{name}.lc.norm.tok.{lang}"
            lines = src.read_text(encoding="utf-8").splitlines(keepends=True)[:keep]
            (out / src.name).write_text("".join(lines), encoding="utf-8")
    return out.parent


def _device_name(gpu: bool) -> str:
    if gpu:
        import torch
        return f"{torch.cuda.get_device_name(0)} (torch {torch.__version__}, CUDA {torch.version.cuda})"
    return f"{_cpu_model()} ({os.cpu_count()} CPUs), CPU"


def _concurrent(args, types, work, env, multi30k, sacrebleu, argv):
    """Timing, training and evaluation of every type at once (one process per type); see
    ``benchmarks/gpu_nmt.sh``.  State lives in ``work`` (checkpoints, logs, progress), so a
    later call continues where this one stopped."""
    t_start = time.monotonic()
    deadline = None if args.budget is None else t_start + args.budget
    gpu_train = ["-world_size", "1", "-gpu_ranks", "0"] if args.gpu else []
    gpu_translate = ["-gpu", "0"] if args.gpu else []
    extra = list(args.onmt_opt)
    quick = args.steps is not None or args.subset is not None or bool(extra)
    state_file = work / "recipe_state.json"
    state = _json_load(state_file, {"timing": {}, "runs": {}})
    dirs, configs, final = {}, {}, {}
    for t in types:
        configs[t] = CONFIGS / f"multi30k_{t}.yaml"
        dirs[t] = work / Path(_config_value(configs[t], "save_model")).parent
        dirs[t].mkdir(parents=True, exist_ok=True)
        final[t] = args.steps or int(_config_value(configs[t], "train_steps"))
    every = (args.steps if args.save_every is None else args.save_every) if args.steps else \
        int(_config_value(configs[types[0]], "save_checkpoint_steps"))
    quick_opts = ["-valid_steps", every, "-save_checkpoint_steps", every] if args.steps else []

    def save():
        state_file.write_text(json.dumps(state, indent=1) + "\n")
        _write_concurrent(args, argv, types, state, final, quick, t_start)

    phases = ["timing", "train", "evaluate"] if args.phase == "all" else [args.phase]
    if args.phase == "all" and all(t in state["timing"] for t in types):
        phases.remove("timing")      # measured by an earlier call of this work folder
    if "timing" in phases:
        jobs = []
        for t in types:
            d = work / "timing" / t
            d.mkdir(parents=True, exist_ok=True)
            (d / "train.log").write_text("")
            jobs.append((t, _onmt_cmd("onmt-train") + [
                "-config", configs[t], "-save_model", d / "model", "-train_steps",
                args.timing_steps, "-valid_steps", 10 ** 9, "-save_checkpoint_steps", 10 ** 9]
                + extra + gpu_train, d / "train.log"))
        print(f"[nmt] timing: {args.timing_steps} steps of {len(types)} types at once", flush=True)
        for t, (rc, seconds, _) in _run_at_once(jobs, work, env).items():
            log = (work / "timing" / t / "train.log").read_text()
            if rc != 0:
                raise SystemExit(f"error: timing run of {t} failed ({rc}):\n{log[-3000:]}")
            per100, s0, s1 = time_per_100_steps(log)
            state["timing"][t] = {"steps": args.timing_steps, "runs_at_once": len(types),
                                  "sec_per_100_steps": round(per100, 3), "timed_steps": f"{s0}-{s1}",
                                  "process_seconds": round(seconds, 1),
                                  "projected_train_s": round(per100 * final[t] / 100.0, 1)}
        save()
    if "train" in phases:
        reserve = args.eval_reserve if "evaluate" in phases else 0
        jobs = []
        for t in types:
            run = state["runs"].setdefault(t, {"train_seconds": 0.0, "calls": 0})
            step = _latest_loadable(dirs[t])
            run["steps"] = step
            if step >= final[t]:
                continue
            target = final[t]
            if args.max_steps_per_call is not None:
                target = min(target, step + args.max_steps_per_call)
            timing = state["timing"].get(t)
            if deadline is not None and timing:
                per_step = timing["sec_per_100_steps"] / 100.0
                left = deadline - reserve - time.monotonic() - args.startup_s
                target = min(target, step + int(left / per_step))
            if target < final[t]:
                target = (target // every) * every     # end this call on a checkpoint
            if target <= step:
                print(f"[nmt] {t}: no checkpoint interval fits in this call", flush=True)
                continue
            cmd = _onmt_cmd("onmt-train") + ["-config", configs[t], "-train_steps", target]
            if step:
                cmd += ["-train_from", _checkpoints(dirs[t])[step]]
            jobs.append((t, cmd + quick_opts + extra + gpu_train, dirs[t] / "train.log"))
            run["target"] = target
        if jobs:
            print(f"[nmt] training {', '.join(j[0] for j in jobs)} at once", flush=True)
            train_deadline = None if deadline is None else deadline - reserve
            for t, (rc, seconds, stopped) in _run_at_once(jobs, work, env, train_deadline).items():
                run = state["runs"][t]
                run["train_seconds"] = round(run["train_seconds"] + seconds, 1)
                run["calls"] += 1
                run["runs_at_once"] = len(jobs)
                run["steps"] = _latest_loadable(dirs[t])
                if rc != 0 and not stopped:
                    run["error"] = (dirs[t] / "train.log").read_text()[-2000:]
                    print(f"[nmt] {t} failed ({rc}); see {dirs[t] / 'train.log'}", flush=True)
        save()
    if "evaluate" in phases:
        jobs, preds = [], {}
        for t in types:
            run = state["runs"].setdefault(t, {"train_seconds": 0.0, "calls": 0})
            run["steps"] = _latest_loadable(dirs[t])
            if run["steps"] < final[t] or run.get("bleu_test2016") is not None:
                continue
            preds[t] = dirs[t] / "test2016.pred.de"
            jobs.append((t, _translate_cmd() + [
                "-model", _checkpoints(dirs[t])[final[t]], "-src",
                work / "data" / "multi30k" / "test_2016_flickr.lc.norm.tok.en", "-output",
                preds[t], "-beam_size", 5, "-replace_unk", "-batch_size", 64, "-max_length",
                100] + gpu_translate, dirs[t] / "translate_test2016.log"))
        if jobs:
            print(f"[nmt] translating test 2016 with {', '.join(preds)} at once", flush=True)
            for t, (rc, seconds, _) in _run_at_once(jobs, work, env, deadline).items():
                run = state["runs"][t]
                if rc != 0:
                    run["error"] = (dirs[t] / "translate_test2016.log").read_text()[-2000:]
                    continue
                run["bleu_test2016"] = _bleu(sacrebleu, preds[t],
                                             multi30k / "test_2016_flickr.lc.norm.tok.de")
                run["translate_seconds"] = round(seconds, 1)
        save()
    print(_write_concurrent(args, argv, types, state, final, quick, t_start))
    return 0


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 600 else f"{seconds / 60:.0f} min"


def _status(run, final_steps):
    if run.get("bleu_test2016") is not None:
        return "complete"
    if run.get("error"):
        return "failed (see the run's log)"
    steps = run.get("steps", 0)
    if steps >= final_steps:
        return "trained, not evaluated"
    return f"training: step {steps} of {final_steps}" if steps else "not started"


def _write_concurrent(args, argv, types, state, final, quick, t_start) -> str:
    rows = []
    for t in types:
        run = state["runs"].get(t, {})
        seconds = run.get("train_seconds", 0.0) + run.get("translate_seconds", 0.0)
        rows.append({
            "variant": _variant_of(t), "encoder_type": t, "steps": run.get("steps", 0),
            "bleu_test2016": run.get("bleu_test2016"), "beam": 5,
            "seconds": round(seconds, 1) if seconds else None,
            "status": _status(run, final[t]),
            "paper_bleu_test2016": PAPER_BLEU.get(t),
            "train_seconds": run.get("train_seconds"), "translate_seconds":
                run.get("translate_seconds"), "calls": run.get("calls", 0),
            "runs_at_once": run.get("runs_at_once"),
        })
    command = "python benchmarks/nmt_multi30k.py " + " ".join(
        sys.argv[1:] if argv is None else map(str, argv))
    if os.environ.get("RNN_ABLATIONS_GPU_NMT"):   # run by benchmarks/gpu_nmt.sh
        command = f"{os.environ['RNN_ABLATIONS_GPU_NMT']}, which ran {command}"
    meta = {
        "scale": ("a CHECK of the recipe (fewer steps, less data or other model options): not a "
                  "result" if quick else
                  "the paper's recipe: onmt_configs/multi30k_<type>.yaml trained as written"),
        "config": "onmt_configs/multi30k_<type>.yaml" + (
            f" with {' '.join(map(str, args.onmt_opt))}" if args.onmt_opt else "") + (
            f", {args.steps} steps" if args.steps else "") + (
            f", first {args.subset} training pairs" if args.subset else ""),
        "bleu": "test 2016 (test_2016_flickr), beam 5, -replace_unk, final checkpoint; sacreBLEU "
                "corpus_bleu(tokenize='none') on the tokenised lower-cased reference",
        "seconds": "wall-clock seconds of the run's onmt_train processes (all calls) plus its "
                   "translation, with runs_at_once processes sharing the device",
        "split": "a run stopped at a checkpoint continues in a later call with -train_from (the "
                 "step, optimiser and learning-rate schedule continue; the data iterator starts "
                 "from the beginning of the corpus again)",
        "device": _device_name(args.gpu),
        "command": command.strip(),
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "this_call_wall_s": round(time.monotonic() - t_start, 1),
    }
    out = Path(args.results)
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(str(out) + ".json").write_text(json.dumps(
        {"meta": meta, "paper_bleu_test2016": PAPER_BLEU, "timing": state["timing"],
         "results": rows}, indent=2) + "\n")
    fmt = (lambda v, spec: "–" if v is None else format(v, spec))
    md = ["| variant | encoder type | steps | BLEU test 2016 (beam 5) | paper | beam | seconds "
          "| status |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| `{r['variant']}` | `{r['encoder_type']}` | {r['steps']} | "
                  f"{fmt(r['bleu_test2016'], '.2f')} | {fmt(r['paper_bleu_test2016'], '.2f')} | "
                  f"{r['beam']} | {fmt(r['seconds'], '.0f')} | {r['status']} |")
    if any(t in state["timing"] for t in types):
        md += ["", "Timing (all types at once): "
               + "; ".join(f"`{t}` {v['sec_per_100_steps']:.1f} s / 100 steps "
                           f"(steps {v['timed_steps']} of {v['steps']}, {v['runs_at_once']} at "
                           f"once), {final[t]} steps ≈ {_duration(v['projected_train_s'])}"
                           for t, v in ((t, state["timing"][t]) for t in types
                                        if t in state["timing"])) + "."]
    md += ["", f"Scale: {meta['scale']} ({meta['config']}). BLEU: {meta['bleu']}. Paper: ACL 2018 "
           f"Table 4. Seconds: {meta['seconds']}. {meta['split'][0].upper()}{meta['split'][1:]}.",
           f"Device: {meta['device']}. Command: `{meta['command']}`."]
    text = "\n".join(md) + "\n"
    Path(str(out) + ".md").write_text(text)
    return text


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
    g = ap.add_argument_group("every encoder type at once (--full --concurrent; "
                              "benchmarks/gpu_nmt.sh runs this on a GPU)")
    g.add_argument("--concurrent", action="store_true",
                   help="with --full: one onmt_train process per type, all at once, then the "
                        "test 2016 translations at once; state kept in --work, so a later call "
                        "continues where this one stopped")
    g.add_argument("--phase", choices=("all", "timing", "train", "evaluate"), default="all",
                   help="timing: --timing-steps steps of every type at once, the time per step "
                        "and the projected time of the full schedule; train: train on from the "
                        "last checkpoint; evaluate: translate and score the finished runs; all: "
                        "the three (default)")
    g.add_argument("--timing-steps", type=int, default=300)
    g.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                   help="wall-clock seconds for this call: training stops at the last checkpoint "
                        "that fits (from the timing), or is stopped at the budget, keeping "
                        "--eval-reserve seconds for the translations")
    g.add_argument("--eval-reserve", type=float, default=120.0, metavar="SECONDS")
    g.add_argument("--startup-s", type=float, default=30.0, metavar="SECONDS",
                   help="start-up time of an onmt_train process, for the budget (default 30)")
    g.add_argument("--max-steps-per-call", type=int, default=None,
                   help="train at most this many more steps in this call (ends on a checkpoint)")
    g.add_argument("--save-every", type=int, default=None,
                   help="with --steps: checkpoint interval (default: --steps)")
    g.add_argument("--subset", type=int, default=None, metavar="N",
                   help="a check of the recipe on the first N training pairs (N/4 of val and "
                        "test 2016)")
    g.add_argument("--onmt-opt", nargs=argparse.REMAINDER, default=[],
                   help="the rest of the command line is passed to every onmt_train (a check "
                        "of the recipe with another model size, e.g. -hidden_size 16)")
    g.add_argument("--results", default=str(REPO / "benchmarks" / "results" / "nmt_multi30k_gpu"),
                   help="results prefix of --concurrent (default: %(default)s)")
    args = ap.parse_args(argv)
    if args.concurrent and not args.full:
        ap.error("--concurrent runs the paper's recipe: give --full too")
    for name in ("timing_steps", "max_steps_per_call", "save_every", "subset", "steps"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            ap.error(f"--{name.replace('_', '-')} must be positive, got {value}")
    if args.budget is not None and args.budget <= 0:
        ap.error(f"--budget must be positive, got {args.budget}")
    if args.steps is None and not args.full:
        args.steps = 250
    if args.out is None:
        args.out = REPO / "benchmarks" / "results" / ("nmt_multi30k_full" if args.full
                                                      else "nmt_multi30k_cpu_smoke")

    args.work = args.work.resolve()   # the OpenNMT-py processes run inside it
    if args.subset is not None:
        args.data = _subset(args.data, args.work, args.subset)
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
    import onmt.encoders

    import rnn_ablations.integrations.onmt as ours
    ours.register()  # also where the start-up hook is not installed (the package on PYTHONPATH)
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
               PYTHONWARNINGS="ignore",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))

    vocab_en, vocab_de = work / "run/multi30k/vocab.en", work / "run/multi30k/vocab.de"
    if not (vocab_en.exists() and vocab_de.exists()):
        (work / "logs").mkdir(exist_ok=True)
        build_vocab = _onmt_cmd("onmt-build-vocab") if args.concurrent else [_bin("onmt_build_vocab")]
        _run(build_vocab + ["-config", CONFIG, "-n_sample", "-1", "-overwrite"],
             work, env, work / "logs" / "build_vocab.log")
    for vocab in (vocab_en, vocab_de):  # the empty token of the double-spaced line
        lines = vocab.read_text(encoding="utf-8").splitlines(keepends=True)
        kept = [line for line in lines if not line.startswith("\t")]
        if len(kept) != len(lines):
            vocab.write_text("".join(kept), encoding="utf-8")

    if args.concurrent:
        return _concurrent(args, types, work, env, multi30k, sacrebleu, argv)
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
