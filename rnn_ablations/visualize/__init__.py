"""Weight visualisations of trained models: the ACL paper's Table 5 heat maps and the RAN paper's
Figure 1 arrows.

Python API::

    from rnn_ablations.visualize import weight_map, plot_weight_map, visualize_model
    wm = weight_map(rnn, embeddings, words)          # an AblatedRNN + (1, T, d) inputs
    wm = visualize_model("model.tar.gz", "the cat sat", encoder="phrase_layer")
    plot_weight_map(wm, "fig.png"); print(wm.arrows_text()); wm.to_dict()

Command line: ``rnn-ablations visualize --model PATH --text "…" --out fig.png`` (see
``docs/visualize.md``).  Importing this package needs torch only; matplotlib and the frameworks
are imported when used.
"""
from .cli import add_subparser
from .core import DirectionWeights, WeightMap, weight_map
from .encoders import EncoderStack, select_encoder
from .loaders import detect_kind, load_model, visualize_model
from .plot import heatmap_matrix, plot_arrows, plot_heatmap, plot_weight_map

__all__ = [
    "weight_map", "WeightMap", "DirectionWeights", "plot_heatmap", "plot_arrows", "plot_weight_map",
    "heatmap_matrix", "visualize_model", "load_model", "detect_kind", "select_encoder",
    "EncoderStack", "add_subparser",
]
