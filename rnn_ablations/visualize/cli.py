"""``rnn-ablations visualize``: the heat map and arrows of a trained model for one sentence."""
from __future__ import annotations

import argparse
import json
import os

from .core import DIRECTIONS
from .plot import DEFAULT_SCALE, READABLE_WORDS, SCALES

__all__ = ["add_subparser", "run"]

_EPILOG = """\
model kinds (detected from PATH):
  AllenNLP archive     model.tar.gz, or a serialization directory with config.json and
                       weights.th/best.th; the text is tokenised by the archive's dataset reader
                       and embedded by the model (biaffine parser with POS tags: word/TAG pairs)
  OpenNMT-py           a .pt checkpoint from onmt_train (our encoder types, or OpenNMT's own
                       rnn/brnn LSTM encoders); whitespace tokens, the source vocabulary
  language model       a run directory (or its checkpoint.pt) from 'rnn-ablations lm train';
                       whitespace tokens, its vocabulary; layers.0, layers.1, ... are --layer 0, 1, ...
The chosen encoder must read the text's word representations (BiDAF: phrase_layer; DrQA:
question_encoder; parser: encoder); encoders that read features computed from other inputs are
refused with the list of those that can be shown.

examples:
  rnn-ablations visualize --model runs/ptb_ran --text "the cat sat on the mat" --out fig.png
  rnn-ablations visualize --model nmt/model_step_1000.pt --text "a man is riding a bike ." \\
      --layer 1 --direction forward --out fig.png
  rnn-ablations visualize --model bidaf/model.tar.gz --encoder phrase_layer \\
      --text "The cat sat on the mat ." --out fig.png --json fig.json
  rnn-ablations visualize --model runs/ptb_ran --text "$(cat long.txt)" --span 40:80 --out fig.png

long texts: a figure of more than %d positions is not readable, so --out then needs --span
START:END (positions START to END-1, 0-based, as the printed arrows number them); the model still
reads the whole text. --json alone has no limit. A figure's size is bounded whatever the span
(at most 40 megapixels: --dpi is lowered when needed).
""" % READABLE_WORDS


def add_subparser(subparsers) -> None:
    p = subparsers.add_parser(
        "visualize",
        help="weight heat map (ACL paper Table 5) and arrows (RAN paper Figure 1) of a trained model",
        description="Decompose the memory of one layer of a trained model's recurrent encoder for "
                    "a sentence, c_t = Σ_j w_j^t ∘ c̃_j, and draw ‖w_j^t‖₂ as a heat map (column = "
                    "current word t, row = context word j; for a bidirectional encoder the forward "
                    "direction in the upper-right triangle and the backward direction in the "
                    "lower-left) and, for each word, an arrow to its most influential earlier "
                    "(later) word v_t = argmax_j max_m w_j^t(m), also printed as text.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, metavar="PATH",
                   help="AllenNLP archive, OpenNMT-py checkpoint, or rnn-ablations LM run directory "
                        "(or its checkpoint.pt)")
    p.add_argument("--text", required=True, help="the sentence to analyse")
    p.add_argument("--out", metavar="FIG", help="where to write the figure (.png, .pdf, .svg)")
    p.add_argument("--encoder", metavar="NAME",
                   help="which recurrent encoder (module name, e.g. BiDAF's phrase_layer); "
                        "needed when the model has several, which are then listed")
    p.add_argument("--layer", type=int, default=0, metavar="K",
                   help="layer of the encoder, 0-based (default 0: the layer that reads the words)")
    p.add_argument("--direction", choices=DIRECTIONS, default=None,
                   help="default: both for a bidirectional encoder, forward otherwise")
    p.add_argument("--json", metavar="FILE",
                   help="also write the numbers as JSON (the raw norms, for the whole text)")
    p.add_argument("--span", metavar="START:END", default=None,
                   help="draw only the positions START to END-1 of the text (0-based; needed for "
                        f"a figure of a text longer than {READABLE_WORDS} positions)")
    p.add_argument("--scale", choices=SCALES, default=DEFAULT_SCALE,
                   help="colour scale of the heat map: log (default; shows the long-range weights "
                        "next to the much larger diagonal), row (each context word's row divided "
                        "by its largest value: how long a word is kept), column (each current "
                        "word's column divided by its largest value: what its memory holds), "
                        "linear (the raw norm)")
    p.add_argument("--dpi", type=int, default=150, help="resolution of raster figures (default 150)")
    p.set_defaults(func=run)


def run(args) -> int:
    from .loaders import visualize_model
    from .plot import plot_weight_map

    if not args.out and not args.json:
        raise ValueError("nothing to write: give --out FIG.png and/or --json FILE")
    for path in (args.out, args.json):
        if path:
            parent = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(parent):
                raise FileNotFoundError(f"the directory of {path} does not exist; create it first")
    if args.out:
        ext = os.path.splitext(args.out)[1].lower()
        if ext not in (".png", ".pdf", ".svg", ".jpg", ".jpeg"):
            raise ValueError(f"--out must end in .png, .pdf, .svg or .jpg, got {args.out!r}")
    if args.dpi <= 0:
        raise ValueError(f"--dpi must be positive, got {args.dpi}")
    span = _parse_span(args.span) if args.span is not None else None
    if span is not None and not args.out:
        raise ValueError("--span selects what the figure draws: give --out too (--json always "
                         "has the whole text)")
    wm = visualize_model(args.model, args.text, encoder=args.encoder, layer=args.layer,
                         direction=args.direction)
    drawn = None
    if args.out:
        T = len(wm.words)
        if span is not None:
            start, end = span
            if end is None:
                end = T
            if not 0 <= start < end <= T:
                raise ValueError(f"--span {args.span}: the text has {T} positions (0 to {T - 1}); "
                                 f"give START:END with 0 <= START < END <= {T}")
            drawn = wm.window(start, end)
        elif T > READABLE_WORDS:
            raise ValueError(
                f"the text has {T} positions; a figure of more than {READABLE_WORDS} is not "
                f"readable. Draw a span of it with --span START:END (e.g. --span 0:{READABLE_WORDS}; "
                "positions are 0-based, END excluded, numbered as the printed arrows; the model "
                "still reads the whole text), or leave out --out and write the numbers of the whole "
                "text with --json FILE")
        else:
            drawn = wm
        if len(drawn.words) > READABLE_WORDS:
            raise ValueError(f"--span {args.span} has {len(drawn.words)} positions; a figure can "
                             f"show at most {READABLE_WORDS} readably: choose a shorter span")
    print(f"{wm.source.get('kind')}: {wm.source.get('path')}, encoder {wm.source.get('encoder')}")
    if wm.source.get("unknown_words"):
        print(f"not in the vocabulary (embedded as <unk>): {wm.source['unknown_words']}")
    print(wm.arrows_text())
    if args.out:
        plot_weight_map(drawn, args.out, dpi=args.dpi, scale=args.scale)
        print(f"wrote {args.out}" + (f" ({drawn.source['span']})" if span is not None else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(wm.to_dict(), f, indent=1)
        print(f"wrote {args.json}")
    return 0


def _parse_span(text: str):
    """``"START:END"`` (END may be empty: to the end) -> ``(start, end or None)``."""
    parts = text.split(":")
    try:
        if len(parts) != 2:
            raise ValueError
        start = int(parts[0]) if parts[0].strip() else 0
        end = int(parts[1]) if parts[1].strip() else None
    except ValueError:
        raise ValueError(f"--span must be START:END with integer positions (0-based, END "
                         f"excluded), e.g. --span 0:100; got {text!r}") from None
    if start < 0 or (end is not None and end <= start):
        raise ValueError(f"--span {text}: need 0 <= START < END")
    return start, end
