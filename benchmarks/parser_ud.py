"""Biaffine dependency parser on UD English EWT with each variant as its encoder (CPU-sized).

Trains ``allennlp_configs/biaffine_parser_<variant>.jsonnet`` (the same configs as the full-size
experiment, shrunk with overrides) on the first ``--train-sentences`` sentences of
``../shared/data/ud_ewt/en_ewt-ud-train.conllu`` for a fixed number of epochs, validating on the
dev set after every epoch, and reports for every variant: UAS/LAS (and UEM/LEM) on dev at the best
epoch (selected by LAS, as the config says) and at the last epoch, the training time per epoch
and the dev-evaluation time per epoch.  Each variant runs in its own process.  Dev trees are
decoded greedily by default (the config's MST decoding, ``--mst``, makes each dev evaluation about
8x slower on CPU: AllenNLP's Chu-Liu-Edmonds runs in Python, sentence by sentence).

    nice -n 10 .venv/bin/python benchmarks/parser_ud.py            # all variants, both highways
    nice -n 10 .venv/bin/python benchmarks/parser_ud.py --variants ran lstm --epochs 2 --highway false

Every variant runs with ``use_highway`` false (the paper's parser, Dozat & Manning's code, had no
highway) and true (the AllenNLP config; for ``srnn`` it adds a sigmoid gate reading h_{t-1});
``--highway`` picks one.  Smoke scale: 2,000 sentences x 5 epochs of a 2 x 128 encoder show that
each encoder trains, not the papers' ordering.

Writes ``benchmarks/results/parser_ud.json`` and ``benchmarks/results/parser_ud.md`` (rewritten
after every finished run, so a partial run keeps what finished).
No GloVe file is available offline: the word embeddings start random (``GLOVE_6B_100D=""``).
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "allennlp_configs"
VARIANTS = ["lstm", "srnn", "lstm_minus_srnn", "ran", "identity_ran"]
ENCODER = {"lstm": "ablated_lstm"}


def shared_data() -> Path:
    return Path(os.environ.get("RNN_ABLATIONS_SHARED_DATA", REPO.parent / "shared" / "data"))


def _subset(src: Path, dst: Path, limit: int) -> int:
    """Copy the first ``limit`` sentences (0 = all) of a CoNLL-U file; return how many."""
    count, block = 0, []
    with open(src, encoding="utf-8") as f, open(dst, "w", encoding="utf-8") as out:
        for line in f:
            block.append(line)
            if not line.strip():
                if any(not b.startswith("#") and b.strip() for b in block):
                    out.writelines(block)
                    count += 1
                    if limit and count >= limit:
                        break
                block = []
        else:
            if any(not b.startswith("#") and b.strip() for b in block):
                out.writelines(block + ["\n"])
                count += 1
    return count


def _overrides(args) -> dict:
    return {
        "model.text_field_embedder.token_embedders.tokens.embedding_dim": args.embedding_dim,
        "model.pos_tag_embedding.embedding_dim": args.pos_dim,
        "model.encoder.input_size": args.embedding_dim + args.pos_dim,
        "model.encoder.hidden_size": args.hidden,
        "model.encoder.num_layers": args.layers,
        "model.arc_representation_dim": args.arc_dim,
        "model.tag_representation_dim": args.tag_dim,
        "data_loader.batch_sampler.batch_size": args.batch_size,
        "trainer.num_epochs": args.epochs,
        "model.use_mst_decoding_for_validation": args.mst,
        "trainer.callbacks": [{"type": "rnn_ablations_epoch_timer"}],
        "model.encoder.use_highway": args.use_highway == "true",
    }


def run_one(args) -> dict:
    """Train one variant in this process (called in a child process)."""
    import torch

    torch.set_num_threads(args.threads)
    from allennlp.common import Params
    from allennlp.commands.train import train_model
    from allennlp.training.callbacks import TrainerCallback
    import allennlp_models.structured_prediction  # noqa: F401
    import rnn_ablations.integrations.allennlp  # noqa: F401

    timings = {"train": [], "validation": []}

    @TrainerCallback.register("rnn_ablations_epoch_timer")
    class EpochTimer(TrainerCallback):
        def on_start(self, trainer, is_primary=True, **kwargs):
            super().on_start(trainer, is_primary, **kwargs)
            self._epoch_start = self._last_train = time.perf_counter()

        def on_batch(self, trainer, batch_inputs, batch_outputs, batch_metrics, epoch,
                     batch_number, is_training, is_primary=True, batch_grad_norm=None, **kwargs):
            if is_training:
                self._last_train = time.perf_counter()

        def on_epoch(self, trainer, metrics, epoch, is_primary=True, **kwargs):
            if epoch < 0:
                return
            now = time.perf_counter()
            timings["train"].append(self._last_train - self._epoch_start)
            timings["validation"].append(now - self._last_train)
            self._epoch_start = self._last_train = now

    variant = args.run_one
    config = CONFIGS / f"biaffine_parser_{variant}.jsonnet"
    params = Params.from_file(str(config), params_overrides=json.dumps(_overrides(args)),
                              ext_vars={"UD_TRAIN": args.train_file, "UD_DEV": args.dev_file,
                                        "GLOVE_6B_100D": ""})
    out = Path(args.workdir) / f"{variant}_highway_{args.use_highway}"
    start = time.perf_counter()
    model = train_model(params, str(out), force=True)
    total = time.perf_counter() - start
    metrics = json.loads((out / "metrics.json").read_text())
    last = json.loads((out / f"metrics_epoch_{args.epochs - 1}.json").read_text())
    return {
        "variant": variant,
        "use_highway": args.use_highway == "true",
        "encoder_type": f"stacked_bidirectional_{ENCODER.get(variant, variant)}",
        "encoder_parameters": sum(p.numel() for p in model.encoder.parameters()),
        "best_epoch": metrics["best_epoch"],
        "best_dev": {k: metrics[f"best_validation_{k}"] for k in ("UAS", "LAS", "UEM", "LEM", "loss")},
        "last_dev": {k: last[f"validation_{k}"] for k in ("UAS", "LAS", "UEM", "LEM", "loss")},
        "train_seconds_per_epoch": timings["train"],
        "validation_seconds_per_epoch": timings["validation"],
        "total_seconds": total,
    }


def _markdown(result) -> str:
    s = result["settings"]
    lines = [
        f"Biaffine parser on UD English EWT (first {s['train_sentences']} training sentences, "
        f"{s['dev_sentences']} dev sentences), {s['epochs']} epochs, encoder "
        f"{s['layers']} × bidirectional {s['hidden']}, embeddings {s['embedding_dim']} "
        f"(random init) + POS {s['pos_dim']}, arc {s['arc_dim']}, tag {s['tag_dim']}, batch "
        f"{s['batch_size']}, {s['threads']} thread(s), "
        f"{'MST' if s['mst'] else 'greedy'} decoding on dev; {result['machine']}.",
        "",
        f"Scale: smoke ({s['layers']} × {s['hidden']} encoder instead of 3 × 400, "
        f"{s['train_sentences']} training sentences, {s['epochs']} epochs): it shows that each "
        "encoder trains; it does not reproduce the papers' ordering.  Timings: "
        f"{s.get('timing_note', 'as measured')}.",
        "",
        "| variant | use_highway | encoder params | dev UAS (best) | dev LAS (best) | best epoch "
        "| dev UAS (last) | dev LAS (last) | train s/epoch | dev-eval s/epoch |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["runs"]:
        train = sum(r["train_seconds_per_epoch"]) / len(r["train_seconds_per_epoch"])
        val = sum(r["validation_seconds_per_epoch"]) / len(r["validation_seconds_per_epoch"])
        lines.append(
            f"| {r['variant']} | {str(r.get('use_highway', True)).lower()} | "
            f"{r['encoder_parameters']:,} | {100 * r['best_dev']['UAS']:.2f} | "
            f"{100 * r['best_dev']['LAS']:.2f} | {r['best_epoch'] + 1} | "
            f"{100 * r['last_dev']['UAS']:.2f} | {100 * r['last_dev']['LAS']:.2f} | "
            f"{train:.1f} | {val:.1f} |")
    lines += ["", f"Command: `{result['command']}`", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", nargs="+", default=VARIANTS, choices=VARIANTS)
    p.add_argument("--train-sentences", type=int, default=2000, help="0 = all")
    p.add_argument("--dev-sentences", type=int, default=0, help="0 = all (2001)")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--embedding-dim", type=int, default=100)
    p.add_argument("--pos-dim", type=int, default=50)
    p.add_argument("--arc-dim", type=int, default=200)
    p.add_argument("--tag-dim", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--mst", action=argparse.BooleanOptionalAction, default=False,
                   help="MST decoding on dev as in the config (default: greedy, ~8x faster to evaluate)")
    p.add_argument("--highway", choices=["both", "false", "true"], default="both",
                   help="use_highway setting(s) of the encoder (default: both, false first)")
    p.add_argument("--timing-note", default="wall-clock on the machine named above",
                   help="how to read the timings (e.g. 'loaded machine'), written to the results")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    p.add_argument("--run-one", help=argparse.SUPPRESS)
    p.add_argument("--use-highway", choices=["false", "true"], help=argparse.SUPPRESS)
    p.add_argument("--workdir", help=argparse.SUPPRESS)
    p.add_argument("--train-file", help=argparse.SUPPRESS)
    p.add_argument("--dev-file", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in ("train_sentences", "dev_sentences"):
        if getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be >= 0")
    for name in ("epochs", "hidden", "layers", "embedding_dim", "pos_dim", "arc_dim", "tag_dim",
                 "batch_size", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be a positive integer")

    nltk = Path(tempfile.gettempdir()) / "rnn_ablations_nltk_data"
    (nltk / "tokenizers" / "punkt").mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("NLTK_DATA", str(nltk))

    if args.run_one:
        print("RESULT " + json.dumps(run_one(args)), flush=True)
        return 0

    ud = shared_data() / "ud_ewt"
    train_src, dev_src = ud / "en_ewt-ud-train.conllu", ud / "en_ewt-ud-dev.conllu"
    for f in (train_src, dev_src):
        if not f.exists():
            p.error(f"{f} not found: the benchmark needs UD English EWT in ../shared/data/ud_ewt "
                    "(or set RNN_ABLATIONS_SHARED_DATA)")
    from rnn_ablations.commands.machine import cpu_info, describe
    settings = {k: getattr(args, k) for k in ("epochs", "hidden", "layers", "embedding_dim",
                                               "pos_dim", "arc_dim", "tag_dim", "batch_size",
                                               "threads", "mst", "highway", "timing_note")}
    result = {
        "benchmark": "parser_ud",
        "command": " ".join(["nice -n 15 .venv/bin/python benchmarks/parser_ud.py",
                             *(argv if argv is not None else sys.argv[1:])]),
        "machine": f"{describe(dict(cpu_info(), threads=args.threads))}, "
                   f"Python {platform.python_version()}",
        "settings": settings,
        "runs": [],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = "" if args.variants == VARIANTS else "_" + "_".join(args.variants)
    highways = ["false", "true"] if args.highway == "both" else [args.highway]
    if args.highway != "both":
        suffix += f"_highway_{args.highway}"

    def save() -> None:
        (args.out / f"parser_ud{suffix}.json").write_text(json.dumps(result, indent=2) + "\n")
        (args.out / f"parser_ud{suffix}.md").write_text(_markdown(result))

    with tempfile.TemporaryDirectory(prefix="parser_ud_") as tmp:
        tmp = Path(tmp)
        n_train = _subset(train_src, tmp / "train.conllu", args.train_sentences)
        n_dev = _subset(dev_src, tmp / "dev.conllu", args.dev_sentences)
        settings.update(train_sentences=n_train, dev_sentences=n_dev)
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads),
                   PYTHONWARNINGS="ignore")
        passthrough = ["--mst" if args.mst else "--no-mst"]
        for name in ("epochs", "hidden", "layers", "embedding_dim", "pos_dim", "arc_dim", "tag_dim",
                     "batch_size", "threads"):
            passthrough += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
        for highway in highways:
            for variant in args.variants:
                print(f"[parser_ud] training {variant} (use_highway {highway}) ...", flush=True)
                proc = subprocess.run(
                    [sys.executable, __file__, "--run-one", variant, "--use-highway", highway,
                     "--workdir", str(tmp), "--train-file", str(tmp / "train.conllu"),
                     "--dev-file", str(tmp / "dev.conllu"), *passthrough],
                    env=env, capture_output=True, text=True)
                lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
                if proc.returncode != 0 or not lines:
                    sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-6000:])
                    print(f"[parser_ud] {variant} failed (exit code {proc.returncode})",
                          file=sys.stderr)
                    return 1
                run = json.loads(lines[-1][len("RESULT "):])
                result["runs"].append(run)
                save()
                print(f"[parser_ud] {variant} (use_highway {highway}): dev UAS "
                      f"{100 * run['best_dev']['UAS']:.2f} LAS {100 * run['best_dev']['LAS']:.2f} "
                      f"(best epoch {run['best_epoch'] + 1}), train "
                      f"{sum(run['train_seconds_per_epoch']) / args.epochs:.1f} s/epoch", flush=True)
    print(_markdown(result))
    return 0

if __name__ == "__main__":
    sys.exit(main())
