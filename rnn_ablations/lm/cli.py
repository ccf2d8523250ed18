"""Sub-commands ``lm`` (``train``, ``evaluate``), ``ablate``, ``params`` and ``reproduce`` of
``rnn-ablations``."""
from __future__ import annotations

import argparse
import functools
import json
import math
import os
import shlex
import sys
from pathlib import Path
from typing import Dict, Tuple

import torch

from ..validation import (check_int_range, check_nonnegative_int, check_positive_float,
                          check_positive_int, cli_type)
from ..variants import VARIANTS, get_variant
from .ablate import parse_variants, run_ablation
from .checkpoints import CHECKPOINT, load_checkpoint, model_from_checkpoint
from .configs import LMConfig, get_config
from .corpora import check_corpus_matches, corpus_from_spec, truncate_train
from .data import load_corpus
from .distributed import init_distributed, resolve_device
from .evaluation import evaluate, long_range_positions
from .interrupt import SigtermAsInterrupt, TrainingInterrupted
from .params import format_param_table, param_rows
from .reproduce import reproduce_ptb
from .reproduce_timing import run_timing
from .rundir import check_out_path
from .synthetic import SyntheticSpec, synthetic_corpus
from .trainer import MAX_SEED, MIN_SEED, train_lm

__all__ = ["add_subparser"]

_VARIANT_HELP = ", ".join(VARIANTS)


def _file_errors(func):
    """A failed read or write (disk full, no permission, a path under a file) ends the command
    with one line naming the file and the fix, not a traceback; what was written before stays
    (checkpoints are replaced atomically)."""
    @functools.wraps(func)
    def run(args) -> int:
        try:
            return func(args)
        except (FileNotFoundError, FileExistsError):
            raise
        except OSError as exc:
            where = f" {exc.filename!r}" if exc.filename else ""
            raise ValueError(
                f"could not read or write{where}: {exc.strerror or exc}. Files written before "
                "are intact (checkpoints are replaced atomically); free space or fix the path or "
                "permissions, then run again (--resume continues a run)") from exc
    return run


#: the options' argparse types (the checks of rnn_ablations/validation.py)
_positive_int = cli_type(check_positive_int)
_nonneg_int = cli_type(check_nonnegative_int)
_positive_float = cli_type(check_positive_float, parse=float)


def _seed_type(low: int):
    """The argparse type of a seed from ``low`` to MAX_SEED (torch's generators' range; the
    dropout generator gets seed + 1)."""
    return cli_type(check_int_range, low=low, high=MAX_SEED, why="what torch's generators take")


def _parse_set(items) -> Dict:
    """``--set key=value`` overrides of config fields (numbers parsed)."""
    out = {}
    for item in items or []:
        if "=" not in item:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE, e.g. --set hidden_size=64")
        k, val = item.split("=", 1)
        k = k.strip()
        try:
            num = float(val)
        except ValueError:
            raise ValueError(f"--set {item!r}: the value must be a number") from None
        if not math.isfinite(num):
            raise ValueError(f"--set {item!r}: the value must be a finite number (not nan or inf)")
        out[k] = int(num) if num.is_integer() and "." not in val and "e" not in val.lower() else num
    return out


def _add_common(p: argparse.ArgumentParser, config_default_help: str) -> None:
    p.add_argument("--config", default=None,
                   help=f"hyper-parameter set: tiny, synthetic, small, medium, large "
                        f"(default: {config_default_help})")
    p.add_argument("--data", default=None, metavar="DIR",
                   help="PTB-format directory (ptb.train.txt, ptb.valid.txt[, ptb.test.txt] or "
                        "train.txt, valid.txt[, test.txt]); default: the embedded synthetic corpus")
    p.add_argument("--seed", type=_seed_type(MIN_SEED), default=0, help="random seed (default 0)")
    p.add_argument("--epochs", type=_positive_int, default=None, help="override the config's epochs")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", default=[],
                   help="override any config field, e.g. --set hidden_size=64 (repeatable)")
    p.add_argument("--same-lr", action="store_true",
                   help="do not apply the RAN code's lowered learning rates (medium/large RAN runs)")
    p.add_argument("--corpus-seed", type=int, default=None,
                   help="seed of the embedded synthetic corpus (default 1234)")
    p.add_argument("--corpus-sentences", type=_positive_int, default=None,
                   help="training sentences of the embedded corpus (default 6000; valid and test "
                        "get a tenth each)")
    p.add_argument("--train-tokens", type=_positive_int, default=None, metavar="N",
                   help="train on the first N tokens of the training split only (a CPU-sized run "
                        "on big data; valid/test are kept whole)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run(s) in --out (which must exist) from the last checkpoint")
    p.add_argument("--overwrite", action="store_true", help="discard the run(s) in --out and start again")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available)")
    p.add_argument("--threads", type=_positive_int, default=None,
                   help="CPU threads for torch (default: 1 for hidden size <= 256, whose "
                        "per-step products are too small to share; torch's choice otherwise)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _corpus(args) -> Tuple[object, Dict]:
    corpus, spec = _base_corpus(args)
    if args.train_tokens is not None:
        corpus = truncate_train(corpus, args.train_tokens)
        spec = dict(spec, train_tokens=args.train_tokens)
    return corpus, spec


def _base_corpus(args) -> Tuple[object, Dict]:
    if args.data is not None:
        if args.corpus_seed is not None or args.corpus_sentences is not None:
            raise ValueError("--corpus-seed/--corpus-sentences apply to the embedded corpus only; "
                             "drop them or drop --data")
        path = str(Path(args.data).resolve()) if Path(args.data).exists() else args.data
        return load_corpus(args.data), {"kind": "dir", "path": path}
    kw = {}
    if args.corpus_seed is not None:
        kw["seed"] = args.corpus_seed
    if args.corpus_sentences is not None:
        n = args.corpus_sentences
        kw.update(train_sentences=n, valid_sentences=max(1, n // 10), test_sentences=max(1, n // 10))
    spec = SyntheticSpec(**kw)
    return synthetic_corpus(spec), {"kind": "synthetic", "spec": spec.to_dict()}


def _config(args):
    name = args.config or ("small" if args.data is not None else "synthetic")
    overrides = _parse_set(args.set)
    if args.epochs is not None:
        overrides["epochs"] = args.epochs
    return get_config(name, **overrides)


#: Below this hidden size the per-step matrix products are too small to gain from a second
#: thread, and on a busy machine OpenMP threads that wait for each other slow down a lot.
SINGLE_THREAD_MAX_HIDDEN = 256


def _setup(args, cfg):
    if args.resume and args.overwrite:
        raise ValueError("give either --resume or --overwrite, not both")
    ctx = init_distributed(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    elif (not ctx.distributed and ctx.device.type == "cpu"
          and cfg.hidden_size <= SINGLE_THREAD_MAX_HIDDEN):
        torch.set_num_threads(1)
    return ctx


def resume_command(args) -> str:
    """The command line that continues the run of ``args`` (the options the user gave, with
    ``--resume`` instead of ``--overwrite``), for the message after Ctrl-C."""
    parser = args._parser
    words = ["rnn-ablations"] + list(args._command_words)
    for action in parser._actions:
        if not action.option_strings or action.dest in ("help", "resume", "overwrite"):
            continue
        value = getattr(args, action.dest, None)
        if value is None or value == action.default or value == []:
            continue
        flag = max(action.option_strings, key=len)
        if isinstance(action, argparse._StoreTrueAction):
            words.append(flag)
        elif isinstance(action, argparse._AppendAction):
            for item in value:
                words += [flag, str(item)]
        elif isinstance(value, (list, tuple)):
            words += [flag] + [str(x) for x in value]
        else:
            words += [flag, str(value)]
    words.append("--resume")
    return shlex.join(words)


def _interrupted(args, exc) -> int:
    if isinstance(exc, TrainingInterrupted):
        what = f"{exc}."
    else:   # a second Ctrl-C, or one before training started: no new checkpoint
        what = (f"interrupted; {args.out} keeps its last checkpoint, if one was written (at "
                "epoch ends and every --checkpoint-every windows).")
    print(f"\n{what}\nContinue the run with:\n  {resume_command(args)}", file=sys.stderr)
    # the shell's code for the signal that stopped the run (128 + SIGTERM's 15, + SIGINT's 2)
    return 143 if getattr(exc, "signal_name", "") == "SIGTERM" else 130


@_file_errors
def _cmd_train(args) -> int:
    check_out_path(Path(args.out))
    if args.data is None and args.corpus_seed is None and args.corpus_sentences is None:
        args.data = _ptb_from_environment(synthetic_default=True)  # docs/options.md
    out = Path(args.out)
    if args.resume and out.is_dir() and not (out / CHECKPOINT).exists():
        raise ValueError(
            f"--resume: {args.out!r} holds no checkpoint ({CHECKPOINT}), so there is nothing to "
            "continue (a run writes one at every epoch end, every --checkpoint-every windows and "
            "when Ctrl-C or SIGTERM stops it; one stopped before that leaves none); drop "
            "--resume to start the run anew (with --overwrite if the folder holds its other files)")
    cfg = _config(args)
    corpus, spec = _corpus(args)
    variant = get_variant(args.variant).name
    ctx = _setup(args, cfg)
    cfg = cfg.for_variant(variant, paper_lr=not args.same_lr)
    try:
        with SigtermAsInterrupt():  # SIGTERM at any stage ends with the --resume command
            result = train_lm(variant, cfg, corpus, args.out, corpus_spec=spec, seed=args.seed,
                              ctx=ctx, resume=args.resume, overwrite=args.overwrite,
                              checkpoint_every=args.checkpoint_every, max_steps=args.max_steps,
                              progress=not args.no_progress, record_losses=args.log_losses,
                              log=print)
    except KeyboardInterrupt as exc:   # TrainingInterrupted: after a checkpoint
        return _interrupted(args, exc)
    if result is not None and ctx.is_main and corpus.test is None:
        print(f"note: {corpus.source} has no test file; only valid perplexity is reported")
    return 0


@_file_errors
def _cmd_evaluate(args) -> int:
    ckpt = load_checkpoint(args.run)
    if args.variant is not None:
        if get_variant(args.variant).name != ckpt["variant"]:
            raise ValueError(f"{args.run} holds a {ckpt['variant']!r} model, not "
                             f"{get_variant(args.variant).name!r}")
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = LMConfig.from_dict(ckpt["config"])
    if args.data is not None:
        corpus = load_corpus(args.data)
        if corpus.vocab.words != ckpt["vocab"]:
            raise ValueError(f"the vocabulary of {args.data} differs from the one the checkpoint "
                             f"was trained on ({ckpt['corpus']['source']}); evaluate on that data")
    else:
        spec = ckpt["corpus"].get("spec")
        if not spec:
            raise ValueError("the checkpoint does not say which data it was trained on; pass --data")
        corpus = corpus_from_spec(spec)
        check_corpus_matches(corpus, ckpt["vocab"], ckpt["corpus"].get("fingerprint"),
                             f"the checkpoint {args.run}")
    device = resolve_device(args.device)
    model = model_from_checkpoint(ckpt, device)
    bs = args.batch_size or cfg.eval_batch_size
    out = {"variant": ckpt["variant"], "config": cfg.name, "epochs_trained": ckpt["epoch"],
           "data": corpus.source}
    for split in args.splits:
        data = corpus.split(split)
        if data is None:
            print(f"{split}: no {split} file in {corpus.source}; skipped")
            continue
        r = evaluate(model, data, bs, cfg.num_steps, device, long_range_positions(corpus, split))
        out[split] = r
        extra = (f", agreement accuracy {r['long_range_acc']:.1%}" if "long_range_acc" in r else "")
        print(f"{ckpt['variant']} {split}: perplexity {r['ppl']:.2f} over {r['tokens']:,} tokens{extra}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


@_file_errors
def _cmd_ablate(args) -> int:
    check_out_path(Path(args.out))
    cfg = _config(args)
    variants = parse_variants(args.variants)
    corpus, spec = _corpus(args)
    ctx = _setup(args, cfg)
    try:
        with SigtermAsInterrupt():  # SIGTERM at any stage ends with the --resume command
            run_ablation(cfg, corpus, args.out, variants=variants, corpus_spec=spec,
                         seed=args.seed, paper_lr=not args.same_lr, resume=args.resume,
                         overwrite=args.overwrite, ctx=ctx, progress=not args.no_progress,
                         log=print)
    except KeyboardInterrupt as exc:   # TrainingInterrupted: after a checkpoint
        return _interrupted(args, exc)
    return 0


def _cmd_params(args) -> int:
    configs = args.configs if args.configs is not None else ([] if args.sizes else
                                                              ["small", "medium", "large"])
    rows = param_rows(configs, args.sizes or [], args.variants, args.input_size)
    print(format_param_table(rows))
    print("\nRecurrent layers only (no embedding, no softmax), input size = hidden size unless "
          "--input-size; LSTM biases counted as torch.nn.LSTM stores them (b_ih and b_hh).")
    return 0


def _ptb_from_environment(synthetic_default: bool = False):
    """``RNN_ABLATIONS_PTB`` (the default --data of `reproduce ptb` and `lm train`), checked: a
    folder.  ``synthetic_default``: the command trains on the embedded corpus without data
    (`lm train`), so unsetting the variable is a way out; `reproduce ptb` needs the data."""
    value = os.environ.get("RNN_ABLATIONS_PTB", "").strip()
    if not value:
        return None
    path = Path(value).expanduser()
    if not path.is_dir():
        what = "is a file, not a folder" if path.exists() else "does not exist"
        way_out = (", or unset it to train on the embedded synthetic corpus" if synthetic_default
                   else "")
        raise ValueError(
            f"the environment variable RNN_ABLATIONS_PTB={value!r} names the PTB data folder, but "
            f"{str(path)!r} {what}; set RNN_ABLATIONS_PTB to the folder that holds "
            f"ptb.train.txt, ptb.valid.txt and ptb.test.txt, or pass --data DIR{way_out}")
    return str(path)


@_file_errors
def _cmd_reproduce(args) -> int:
    check_out_path(Path(args.out))
    data = args.data or _ptb_from_environment()
    if args.timing is not None:
        if args.resume or args.overwrite or args.time_budget is not None:
            raise ValueError("--timing measures only: drop --resume/--overwrite/--time-budget")
        run_timing(args.config, data, args.out, variants=args.variants, seeds=args.seeds,
                   lrs=args.lr,
                   device=args.device, max_parallel=args.max_parallel,
                   cuda_graph=args.cuda_graph, steps=args.timing, epochs=args.epochs,
                   threads=args.threads, paper_lr=not args.same_lr,
                   runs_per_process=args.runs_per_process)
        return 0
    try:
        res = reproduce_ptb(args.config, data, args.out, variants=args.variants, seeds=args.seeds,
                            lrs=args.lr,
                            device=args.device, max_parallel=args.max_parallel, resume=args.resume,
                            overwrite=args.overwrite, time_budget=args.time_budget,
                            cuda_graph=args.cuda_graph, checkpoint_every=args.checkpoint_every,
                            epochs=args.epochs, max_steps=args.max_steps, threads=args.threads,
                            paper_lr=not args.same_lr, runs_per_process=args.runs_per_process)
    except KeyboardInterrupt:   # Ctrl-C or SIGTERM: the children checkpointed their runs
        print(f"\ninterrupted; the runs in {args.out} keep their checkpoints.\nContinue with:\n  "
              f"{resume_command(args)}", file=sys.stderr)
        return 130
    return 0 if all(r.get("status") != "failed" for r in res["rows"]) else 1


_FORMAT = argparse.RawDescriptionHelpFormatter


def add_subparser(subparsers) -> None:
    """The sub-commands ``lm`` (``train``, ``evaluate``), ``ablate``, ``params`` and
    ``reproduce`` (``ptb``), one function each."""
    _add_lm(subparsers)
    _add_ablate(subparsers)
    _add_params(subparsers)
    _add_reproduce(subparsers)


def _add_lm(subparsers) -> None:
    lm = subparsers.add_parser(
        "lm", help="train / evaluate the PTB language model with one variant",
        description="The word-level language model of Zaremba et al. (2014) with any variant "
                    "as its recurrent layers (configs small/medium/large of the papers, tiny, "
                    "synthetic).", formatter_class=_FORMAT)
    lm_sub = lm.add_subparsers(dest="lm_command", metavar="{train,evaluate}")
    lm_sub.required = True
    _add_lm_train(lm_sub)
    _add_lm_evaluate(lm_sub)


def _add_lm_train(lm_sub) -> None:
    tr = lm_sub.add_parser(
        "train", help="train one language model",
        description="Train one language model; prints a progress bar (perplexity, words/s, the "
                    "whole run's ETA), a line per epoch and the final valid/test perplexity. "
                    "RUN_DIR receives checkpoint.pt (with a checksum, verified when it is read), "
                    "result.json and train.log, also when --max-steps stops the run (result.json "
                    "then says \"complete\": false and gives the validation perplexity at that "
                    "point). Ctrl-C finishes the current window, writes a checkpoint and prints the "
                    "command that continues the run.\n\n"
                    "Multi-process: torchrun --nproc-per-node N $(which rnn-ablations) lm train …",
        formatter_class=_FORMAT)
    tr.add_argument("--variant", required=True, help=f"one of {_VARIANT_HELP} (or an alias)")
    tr.add_argument("--out", required=True, metavar="RUN_DIR", help="run directory")
    _add_common(tr, "small with --data, synthetic without")
    tr.add_argument("--checkpoint-every", type=_nonneg_int, default=0, metavar="STEPS",
                    help="also checkpoint every STEPS training windows (default: at epoch ends)")
    tr.add_argument("--max-steps", type=_positive_int, default=None,
                    help="stop after this many windows in total, with checkpoint.pt, train.log and "
                         "result.json (\"complete\": false, valid ppl at that point); --resume "
                         "continues")
    tr.add_argument("--log-losses", action="store_true",
                    help="write the mean training loss of every window to RUN_DIR/losses.json")
    for action in tr._actions:
        if action.dest == "data":
            action.help = action.help.replace("default: the embedded synthetic corpus",
                                              "default: $RNN_ABLATIONS_PTB, else the embedded "
                                              "synthetic corpus")
    tr.set_defaults(func=_cmd_train, _parser=tr, _command_words=("lm", "train"))


def _add_lm_evaluate(lm_sub) -> None:
    ev = lm_sub.add_parser(
        "evaluate", help="perplexity of a trained model on valid/test",
        description="Perplexity of a checkpoint on the valid/test split of the data it was "
                    "trained on (or of --data, which must have the same vocabulary).")
    ev.add_argument("run", metavar="RUN", help="run directory or checkpoint file")
    ev.add_argument("--data", default=None, metavar="DIR", help="PTB-format directory")
    ev.add_argument("--splits", nargs="+", choices=("train", "valid", "test"),
                    default=["valid", "test"])
    ev.add_argument("--variant", default=None, help="fail unless the checkpoint is this variant")
    ev.add_argument("--batch-size", type=_positive_int, default=None,
                    help="evaluation batch size (default: the config's eval_batch_size)")
    ev.add_argument("--device", default=None)
    ev.add_argument("--threads", type=_positive_int, default=None)
    ev.add_argument("--json", default=None, metavar="FILE", help="also write the numbers as JSON")
    ev.set_defaults(func=_cmd_evaluate)


def _add_ablate(subparsers) -> None:
    ab = subparsers.add_parser(
        "ablate", help="the ablation study: train every variant, print and save the table",
        description="Train every variant (or --variants) under the same config and seed; print "
                    "the papers' table (variant, recurrent parameters, valid/test perplexity, "
                    "training words/s) and write results.csv, results.json, results.md and "
                    "results.png into --out (perplexity on an axis fitted to the values, agreement "
                    "accuracy, training speed; diverged runs marked). Ctrl-C checkpoints the "
                    "current variant and prints the command that continues the study.\n\n"
                    "Without --data it runs on the embedded synthetic corpus (nested noun-verb "
                    "agreement over long distances, generated from a seed) with the 'synthetic' "
                    "config: a few minutes on 2 CPU cores. With --data DIR it runs on PTB-format "
                    "text with the 'small' config unless --config says otherwise.",
        formatter_class=_FORMAT)
    ab.add_argument("--variants", nargs="+", default=None, metavar="VARIANT",
                    help=f"subset of {_VARIANT_HELP} (default: all)")
    ab.add_argument("--out", default="ablation_results", metavar="DIR",
                    help="output directory (default: ./ablation_results)")
    _add_common(ab, "synthetic without --data, small with it")
    ab.set_defaults(func=_cmd_ablate, _parser=ab, _command_words=("ablate",))


def _add_params(subparsers) -> None:
    pa = subparsers.add_parser(
        "params", help="recurrent parameter counts of every variant (RAN paper, Table 1)",
        description="Parameter counts of the recurrent layers for the configs' sizes (or "
                    "--sizes), beside the RAN paper's Table 1 where it gives them.")
    pa.add_argument("--configs", nargs="+", default=None,
                    help="config names (default: small medium large)")
    pa.add_argument("--sizes", nargs="+", default=None, metavar="LAYERSxHIDDEN",
                    help="extra sizes, e.g. 2x650")
    pa.add_argument("--variants", nargs="+", default=None, help=f"subset of {_VARIANT_HELP}")
    pa.add_argument("--input-size", type=_positive_int, default=None,
                    help="input size of the first layer (default: = hidden size)")
    pa.set_defaults(func=_cmd_params)


def _add_reproduce(subparsers) -> None:
    rp = subparsers.add_parser(
        "reproduce", help="the papers' PTB table: every variant trained concurrently, test "
                          "perplexity beside the papers'",
        description="Reproduce a table of the papers at their scale.", formatter_class=_FORMAT)
    rp_sub = rp.add_subparsers(dest="reproduce_target", metavar="{ptb}")
    rp_sub.required = True
    _add_reproduce_ptb(rp_sub)


def _add_reproduce_ptb(rp_sub) -> None:
    pt = rp_sub.add_parser(
        "ptb", help="PTB language model, config medium or large (tiny/small for a quick look)",
        description="Train every variant (default: lstm srnn lstm_minus_srnn ran identity_ran) "
                    "for every seed (and every --lr given for it) with the papers' settings, "
                    "one process per run, "
                    "concurrently on one device (on CUDA each step is replayed from a CUDA "
                    "graph); evaluate valid and test perplexity; write results.json, "
                    "results.md, results.csv and results.png into --out with the papers' "
                    "test perplexities beside ours. Each run lives in OUT/<variant>_s<seed>/ "
                    "with its checkpoint: --resume continues cut runs bit-identically.\n\n"
                    "--timing STEPS times STEPS steps of every run at once and prints the "
                    "projected wall time of the full run instead of training.\n\n"
                    "  rnn-ablations reproduce ptb --config medium --data data/ptb --out ptb_medium",
        formatter_class=_FORMAT)
    pt.add_argument("--config", default="medium", choices=("tiny", "small", "medium", "large"),
                    help="hyper-parameter set (default medium, the papers' PTB table)")
    pt.add_argument("--data", default=None, metavar="DIR",
                    help="PTB directory with ptb.train.txt, ptb.valid.txt, ptb.test.txt "
                         "(default: $RNN_ABLATIONS_PTB)")
    pt.add_argument("--variants", nargs="+", default=None, metavar="VARIANT",
                    help=f"subset of {_VARIANT_HELP} (default: all five)")
    pt.add_argument("--seeds", nargs="+", type=_seed_type(0), default=None, metavar="SEED",
                    help="one run per variant and seed (default: 0)")
    pt.add_argument("--lr", action="append", default=None, metavar="VARIANT=LR",
                    help="train VARIANT at learning rate LR instead of the papers' (repeatable; "
                         "several for one variant give one run each, and the table reports the "
                         "one with the best final validation perplexity), e.g. --lr srnn=0.25 "
                         "--lr srnn=0.1")
    pt.add_argument("--out", required=True, metavar="DIR", help="output directory")
    pt.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available)")
    pt.add_argument("--max-parallel", type=_positive_int, default=None, metavar="N",
                    help="processes at a time (default: all on CUDA, one per core on the CPU)")
    pt.add_argument("--runs-per-process", type=_positive_int, default=1, metavar="K",
                    help="K runs per process, each in its own thread and (on CUDA) its own "
                         "stream, so that their kernels run at the same time on the GPU; "
                         "separate processes take turns on a GPU unless MPS is running "
                         "(default 1)")
    pt.add_argument("--resume", action="store_true", help="continue the runs in --out")
    pt.add_argument("--overwrite", action="store_true", help="discard the runs in --out")
    pt.add_argument("--time-budget", type=_positive_float, default=None, metavar="SECONDS",
                    help="end within SECONDS: training stops early enough for the final "
                         "evaluations (a reserve of min(30 s, 10%%)), and runs still going at "
                         "min(10 s, 10%%) before the end are stopped; a cut run is reported "
                         "with the epochs it did and the perplexities evaluated in time, marked "
                         "incomplete and cut; a run that cannot "
                         "start with at least that reserve of training time left is not started "
                         "and listed as not run (--resume continues both); an overrun is stated "
                         "in the results")
    pt.add_argument("--cuda-graph", choices=("auto", "on", "off"), default="auto",
                    help="replay the training step as a CUDA graph: auto (on CUDA, falling back "
                         "to eager with a warning if capture fails), on (fail if it cannot; on "
                         "the CPU: the same static step run eagerly), off")
    pt.add_argument("--checkpoint-every", type=_nonneg_int, default=0, metavar="STEPS",
                    help="also checkpoint every STEPS windows (default: at epoch ends)")
    pt.add_argument("--epochs", type=_positive_int, default=None, help="override the config's epochs")
    pt.add_argument("--max-steps", type=_positive_int, default=None,
                    help="stop every run after this many windows (a quick look; --resume continues)")
    pt.add_argument("--threads", type=_positive_int, default=None,
                    help="CPU threads per run (default: cores / runs at a time)")
    pt.add_argument("--same-lr", action="store_true",
                    help="do not apply the RAN code's lowered learning rates")
    pt.add_argument("--timing", type=_positive_int, default=None, metavar="STEPS",
                    help="time STEPS steps of every run at once and project the full run's "
                         "wall time (OUT/timing.json, timing.md) instead of training")
    pt.set_defaults(func=_cmd_reproduce, _parser=pt, _command_words=("reproduce", "ptb"))
