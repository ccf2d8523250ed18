"""rnn_ablations: the LSTM ablations of *LSTM as a Dynamically Computed Element-wise Weighted Sum*
(Levy et al., ACL 2018) and *Recurrent Additive Networks* (Lee et al., 2017) as drop-ins for
``torch.nn.LSTM``, with AllenNLP and OpenNMT-py integrations.

Importing this package needs only torch; the framework integrations are imported lazily.
"""
from .variants import ALIASES, VARIANTS, Variant, get_variant, recurrent_param_count
from .settings import Options, get_options, options, reset_options, set_options
from .rnn import AblatedRNN
from .analysis import WeightedSum, weighted_sum
from .explanation import explain
from .kernels.registry import cuda_kernel_available, kernel_available, kernel_isa, supported_kernel_isas
from .aliases import (get_cuda_graphs, get_cuda_recurrence, set_backend, set_cuda_graphs,
                      set_cuda_recurrence, set_kernel_isa, set_pipeline, use_backend,
                      use_cuda_graphs, use_cuda_recurrence, use_kernel_isa, use_pipeline)

__version__ = "0.1.0"

__all__ = [
    "VARIANTS", "ALIASES", "Variant", "get_variant", "recurrent_param_count", "AblatedRNN",
    "weighted_sum", "WeightedSum", "explain", "options", "set_options", "get_options",
    "reset_options",
    "Options", "kernel_available", "cuda_kernel_available", "set_backend",
    "use_backend",
    "set_pipeline", "use_pipeline", "set_cuda_graphs", "use_cuda_graphs", "get_cuda_graphs",
    "set_cuda_recurrence", "get_cuda_recurrence", "use_cuda_recurrence",
    "kernel_isa", "supported_kernel_isas", "set_kernel_isa",
    "use_kernel_isa",
]

import sys as _sys

if "allennlp" in _sys.modules:  # AllenNLP in use: register the encoders, DrQA model, reader, predictor
    from .integrations import allennlp as _allennlp_integration  # noqa: E402,F401
del _sys
