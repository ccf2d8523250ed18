"""Loading a trained model of one of the three kinds and embedding a text as its reader would.

* **AllenNLP model archive**: a ``model.tar.gz`` or a serialization directory with
  ``config.json`` and ``weights.th``/``best.th`` (from ``allennlp train``).  The text is tokenised
  by the archive's dataset reader's tokenizer (whitespace when the reader has none, e.g. the
  Universal Dependencies reader), indexed by its token indexers with the model's vocabulary and
  embedded by the model's text-field embedder; a model's layers between the embedder and its
  encoders are applied as the model does (BiDAF's highway layer, the biaffine parser's POS-tag
  embedding, for which the text is written ``word/TAG``).
* **OpenNMT-py checkpoint**: a ``.pt`` file holding ``opt`` and ``model`` (from ``onmt_train``).
  Whitespace tokens, the checkpoint's source vocabulary (``<unk>`` for unknown words), the model's
  source embeddings, then its encoder.
* **language-model run directory** (or its ``checkpoint.pt``) from ``rnn-ablations lm train``: whitespace tokens, the LM's
  vocabulary (``<unk>`` for unknown words), its embedding, then its recurrent layers.

The input of the chosen recurrent module is captured with a forward pre-hook while this embedding
path runs, so whatever a wrapper does before the recurrent module (packing, stacking) is respected.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import tarfile
import zlib
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

from ..integrations import ALLENNLP_INSTALL_HINT, ONMT_INSTALL_HINT
from ..lm import load_checkpoint as load_lm_checkpoint
from . import lm_support
from .core import WeightMap, resolve_directions, weight_map
from .embedded import Embedded
from .encoders import (as_ablated, capture_inputs, captured_sequence, describe_candidates,
                       recurrent_modules, select_encoder)

__all__ = ["LoadedModel", "load_model", "detect_kind", "visualize_model", "KINDS"]

ALLENNLP, ONMT, LM = "allennlp", "onmt", "lm"
KINDS = {
    ALLENNLP: "AllenNLP model archive",
    ONMT: "OpenNMT-py checkpoint",
    LM: "rnn-ablations language-model checkpoint",
}
_EXPECTED = ("an AllenNLP model archive (model.tar.gz, or a serialization directory with "
             "config.json and weights.th or best.th), an OpenNMT-py checkpoint (.pt with 'opt' and "
             "'model' entries, from onmt_train) or a language-model run directory or its "
             "checkpoint.pt from 'rnn-ablations lm train'")


@dataclasses.dataclass
class LoadedModel:
    kind: str
    path: str
    model: nn.Module
    #: ``run(text, target_name)`` runs the model's embedding path for ``text`` through the
    #: encoder that contains ``target_name`` (whose inputs are then captured by hooks).
    run: Callable[[str, str], Embedded]

    @property
    def kind_name(self) -> str:
        return KINDS[self.kind]


# ---------------------------------------------------------------------------------- detection
@contextlib.contextmanager
def _namespace_allowed():
    """``argparse.Namespace`` (in OpenNMT-py checkpoints) allowed for ``weights_only`` loading.
    torch's ``safe_globals`` context removes the class on exit even when it was allowed before
    (as :func:`rnn_ablations.integrations.onmt.register` does for the whole process), so it is
    entered only when the class is not allowed yet."""
    get = getattr(torch.serialization, "get_safe_globals", None)
    if get is not None and argparse.Namespace in get():
        yield
    else:
        with torch.serialization.safe_globals([argparse.Namespace]):
            yield


def _torch_load(path: str):
    try:
        with _namespace_allowed():
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # not a torch file, or a pickle of classes we do not know
        raise ValueError(f"{path} is none of the model kinds this command reads: it could not be "
                         f"loaded as a torch checkpoint ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''}). Expected {_EXPECTED}") from None


_DAMAGED_ARCHIVE = (EOFError, tarfile.TarError, zlib.error, OSError)


def _looks_compressed(path: str) -> bool:
    """gzip, bzip2 or xz magic bytes (an archive, even a damaged one)."""
    with open(path, "rb") as f:
        head = f.read(6)
    return head.startswith(b"\x1f\x8b") or head.startswith(b"BZh") or \
        head.startswith(b"\xfd7zXZ\x00")


def _damaged_archive(path: str, exc: BaseException) -> ValueError:
    detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return ValueError(f"{path} is a damaged or truncated archive ({type(exc).__name__}: {detail}); "
                      f"it cannot be read to its end. Copy or download the model archive again "
                      f"(compare its size with the original's), or point --model at the "
                      f"serialization directory it was made from")


def _tar_members(path: str):
    """The normalised member names of a tar archive, reading it to its end (so a truncated
    archive is reported here, not later by the framework)."""
    try:
        with tarfile.open(path) as tar:
            return {os.path.normpath(m.name) for m in tar.getmembers()}
    except _DAMAGED_ARCHIVE as exc:
        raise _damaged_archive(path, exc) from None


def detect_kind(path) -> Tuple[str, object]:
    """``(kind, loaded checkpoint or None)`` for ``path``; ``ValueError`` when it is none."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"model path {path} does not exist; expected {_EXPECTED}")
    if os.path.isdir(path):
        names = set(os.listdir(path))
        if "config.json" in names and names & {"weights.th", "best.th"}:
            return ALLENNLP, None
        if "model.tar.gz" in names:
            return ALLENNLP, None
        try:
            obj = load_lm_checkpoint(path)
        except FileNotFoundError:
            obj = None    # no language-model checkpoint in it
        except ValueError as exc:
            raise ValueError(f"{path} holds a language-model checkpoint that could not be read: "
                             f"it is damaged or truncated, or not a checkpoint ({exc})") from None
        if obj is not None:
            return LM, obj
        raise ValueError(f"directory {path} is neither an AllenNLP serialization directory (it has no "
                         f"config.json with weights.th or best.th, nor model.tar.gz) nor a "
                         f"language-model run directory (no checkpoint.pt); expected {_EXPECTED}")
    if _looks_compressed(path) or tarfile.is_tarfile(path):
        members = _tar_members(path)
        if "config.json" in members and "weights.th" in members:
            return ALLENNLP, None
        raise ValueError(f"{path} is a tar archive but not an AllenNLP model archive (it lacks "
                         f"config.json or weights.th); expected {_EXPECTED}")
    obj = _torch_load(path)
    if isinstance(obj, dict) and "opt" in obj and "model" in obj:
        return ONMT, obj
    if lm_support.is_lm_checkpoint(obj):
        return LM, obj
    keys = sorted(obj)[:12] if isinstance(obj, dict) else type(obj).__name__
    raise ValueError(f"{path} is a torch file but none of the model kinds this command reads "
                     f"(found {keys}); expected {_EXPECTED}")


def load_model(path) -> LoadedModel:
    """Load ``path`` (any of the three kinds) on the CPU, in evaluation mode."""
    kind, obj = detect_kind(path)
    path = os.fspath(path)
    if kind == ALLENNLP:
        loaded = _load_allennlp(path)
    elif kind == ONMT:
        loaded = _load_onmt(path)
    else:
        model, run = lm_support.load(path)
        loaded = LoadedModel(LM, path, model, run)
    loaded.model.eval()
    return loaded


# ---------------------------------------------------------------------------------- AllenNLP
def _prefixes(name: str) -> List[str]:
    parts = name.split(".")
    return [".".join(parts[:k]) for k in range(1, len(parts) + 1)]


def _load_allennlp(path: str) -> LoadedModel:
    try:
        import allennlp  # noqa: F401  (the start-up hook installs what it needs first)
    except ImportError as exc:
        raise ValueError(f"{path} is an AllenNLP model archive but AllenNLP cannot be imported "
                         f"({exc}); install it with: {ALLENNLP_INSTALL_HINT}") from exc
    from allennlp.common.checks import ConfigurationError
    from allennlp.common.plugins import import_plugins
    from allennlp.models.archival import load_archive

    import_plugins()   # allennlp_models (BiDAF, the parser) and .allennlp_plugins
    try:
        import rnn_ablations.integrations.allennlp  # noqa: F401  registers the ablated encoders
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("rnn_ablations"):
            raise
    try:
        archive = load_archive(path)
    except ConfigurationError as exc:
        raise ValueError(f"could not load the AllenNLP archive {path}: {exc}") from exc
    except _DAMAGED_ARCHIVE as exc:
        if not os.path.isdir(path) and (_looks_compressed(path) or tarfile.is_tarfile(path)):
            raise _damaged_archive(path, exc) from None
        raise
    model = archive.model.eval()
    reader = archive.validation_dataset_reader or archive.dataset_reader

    def run(text: str, target: str) -> Embedded:
        return _allennlp_embed(model, reader, text, target)

    return LoadedModel(ALLENNLP, path, model, run)


def _allennlp_text_embedder(model):
    from allennlp.modules.text_field_embedders import TextFieldEmbedder

    for attr in ("_text_field_embedder", "text_field_embedder"):
        emb = getattr(model, attr, None)
        if isinstance(emb, TextFieldEmbedder):
            return emb
    found = [m for _, m in model.named_modules() if isinstance(m, TextFieldEmbedder)]
    if len(found) == 1:
        return found[0]
    raise ValueError(f"cannot tell which text-field embedder of the {type(model).__name__} embeds "
                     f"the text (found {len(found)})")


def _allennlp_embed(model, reader, text: str, target: str) -> Embedded:
    from allennlp.data import Batch, Instance, Token
    from allennlp.data.fields import TextField
    from allennlp.modules.seq2seq_encoders import Seq2SeqEncoder
    from allennlp.modules.seq2vec_encoders import Seq2VecEncoder

    pos_embedding = getattr(model, "_pos_tag_embedding", None)
    tags = None
    if pos_embedding is not None:
        pairs = [tok.rsplit("/", 1) for tok in text.split()]
        namespace = getattr(pos_embedding, "_vocab_namespace", None) or "pos"
        known = [t for t in model.vocab.get_token_to_index_vocabulary(namespace)
                 if t not in ("@@PADDING@@", "@@UNKNOWN@@")]
        if not all(len(p) == 2 and p[0] and p[1] for p in pairs):
            raise ValueError(
                f"this {type(model).__name__} also reads POS tags (it concatenates a POS-tag embedding "
                f"to the words): write the text as word/TAG pairs, e.g. 'The/DET cat/NOUN sat/VERB', "
                f"with tags from the vocabulary namespace {namespace!r}: {' '.join(known[:40])}")
        unknown_tags = sorted({t for _, t in pairs if t not in known})
        if unknown_tags:
            raise ValueError(f"unknown POS tag(s) {', '.join(unknown_tags)}; the model knows: "
                             f"{' '.join(known[:60])}")
        tokens = [Token(w) for w, _ in pairs]
        tags = [t for _, t in pairs]
    else:
        tokenizer = getattr(reader, "_tokenizer", None) or getattr(reader, "tokenizer", None)
        if tokenizer is not None:
            tokens = tokenizer.tokenize(text)
        else:
            tokens = [Token(w) for w in text.split()]
    if not tokens:
        raise ValueError("the text is empty after tokenisation: give at least one word")
    indexers = getattr(reader, "_token_indexers", None) or getattr(reader, "token_indexers", None)
    if not indexers:
        raise ValueError(f"the archive's dataset reader ({type(reader).__name__}) has no token "
                         "indexers to index the text with")
    unknown = _allennlp_unknown_words(model.vocab, indexers, tokens)
    batch = Batch([Instance({"tokens": TextField(tokens, indexers)})])
    batch.index_instances(model.vocab)
    tensors = batch.as_tensor_dict()["tokens"]
    with torch.no_grad():
        embedded = _allennlp_text_embedder(model)(tensors)
        steps = ["text-field embedder"]
        highway = getattr(model, "_highway_layer", None)
        if isinstance(highway, nn.Module):
            embedded = highway(embedded)
            steps.append("highway layer")
        if tags is not None:
            namespace = getattr(pos_embedding, "_vocab_namespace", None) or "pos"
            ids = torch.tensor([[model.vocab.get_token_index(t, namespace) for t in tags]])
            embedded = torch.cat([embedded, pos_embedding(ids)], dim=-1)
            steps.append("POS-tag embedding")
        mask = torch.ones(embedded.shape[:2], dtype=torch.bool)
        dim = embedded.shape[-1]
        encoder = None
        for prefix in _prefixes(target):
            sub = model.get_submodule(prefix)
            if isinstance(sub, (Seq2SeqEncoder, Seq2VecEncoder)):
                encoder = sub
                break
        if encoder is not None:
            if encoder.get_input_dim() != dim:
                raise ValueError(_not_reading_embeddings(model, target, prefix, encoder.get_input_dim(),
                                                         dim, steps))
            encoder(embedded, mask)
        else:
            rnn = model.get_submodule(target)
            if rnn.input_size != dim:
                raise ValueError(_not_reading_embeddings(model, target, target, rnn.input_size, dim,
                                                         steps))
            rnn(embedded if rnn.batch_first else embedded.transpose(0, 1))
    return Embedded([t.text for t in tokens], unknown)


def _allennlp_unknown_words(vocab, indexers, tokens) -> List[str]:
    """Words that a single-id indexer of the text maps to the unknown token."""
    from allennlp.data.token_indexers import SingleIdTokenIndexer

    unknown = []
    for indexer in indexers.values():
        if not isinstance(indexer, SingleIdTokenIndexer):
            continue
        known = vocab.get_token_to_index_vocabulary(indexer.namespace)
        for tok in tokens:
            text = tok.text.lower() if indexer.lowercase_tokens else tok.text
            if text not in known and tok.text not in unknown:
                unknown.append(tok.text)
    return unknown


def _not_reading_embeddings(model, target, encoder_name, wanted, dim, steps) -> str:
    from allennlp.modules.seq2seq_encoders import Seq2SeqEncoder
    from allennlp.modules.seq2vec_encoders import Seq2VecEncoder

    readers = []
    for name in recurrent_modules(model):
        for prefix in _prefixes(name):
            sub = model.get_submodule(prefix)
            if isinstance(sub, (Seq2SeqEncoder, Seq2VecEncoder)):
                if sub.get_input_dim() == dim and prefix not in readers:
                    readers.append(prefix)
                break
    return (f"encoder {encoder_name!r} reads {wanted}-dimensional vectors computed inside the "
            f"{type(model).__name__} from more than the text, not the {dim}-dimensional word "
            f"representations ({' + '.join(steps)}); this command can show the encoders that read "
            f"the text's embeddings: {', '.join(readers) or 'none in this model'}")


# ---------------------------------------------------------------------------------- OpenNMT-py
def _load_onmt(path: str) -> LoadedModel:
    try:
        import onmt  # noqa: F401  (the start-up hook registers the ablated encoders)
        from onmt.inputters.inputter import dict_to_vocabs
        from onmt.model_builder import build_base_model
        from onmt.models.model_saver import load_checkpoint
        from onmt.utils.parse import ArgumentParser
    except ImportError as exc:
        raise ValueError(f"{path} is an OpenNMT-py checkpoint but OpenNMT-py cannot be imported "
                         f"({exc}); install it with: {ONMT_INSTALL_HINT}") from exc
    try:
        import rnn_ablations.integrations.onmt as ours
        if hasattr(ours, "register"):
            ours.register()
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("rnn_ablations"):
            raise
    with _namespace_allowed():
        checkpoint = load_checkpoint(path)
    model_opt = ArgumentParser.ckpt_model_opts(checkpoint["opt"])
    ArgumentParser.update_model_opts(model_opt)
    ArgumentParser.validate_model_opts(model_opt)
    if getattr(model_opt, "model_type", "text") != "text":
        raise ValueError(f"{path} is an OpenNMT-py {model_opt.model_type!r} model; only text models "
                         "can be visualised")
    vocabs = dict_to_vocabs(checkpoint["vocab"])
    import onmt.encoders as onmt_encoders
    if model_opt.encoder_type not in onmt_encoders.str2enc:
        raise ValueError(f"{path} uses encoder type {model_opt.encoder_type!r}, which is not "
                         "registered in OpenNMT-py (is rnn_ablations installed in this environment?)")
    model = build_base_model(model_opt, vocabs)
    model.load_state_dict(checkpoint, precision=torch.float32, device=torch.device("cpu"),
                          strict=True)
    model.eval()
    if vocabs.get("src_feats"):
        raise ValueError(f"{path} reads source features besides the words; this command feeds "
                         "words only")

    def run(text: str, target: str) -> Embedded:
        from onmt.constants import DefaultTokens

        tokens = text.split()
        if not tokens:
            raise ValueError("the text is empty: give at least one word")
        vocab = vocabs["src"]
        unk = vocab.lookup_token(DefaultTokens.UNK)
        ids, unknown = [], []
        for tok in tokens:
            if tok in vocab:
                ids.append(vocab.lookup_token(tok))
            else:
                ids.append(unk)
                unknown.append(tok)
        src = torch.tensor(ids, dtype=torch.long).view(1, -1, 1)
        with torch.no_grad():
            model.encoder(src, torch.tensor([len(ids)]))
        return Embedded(tokens, unknown)

    return LoadedModel(ONMT, path, model, run)


# ---------------------------------------------------------------------------------- all kinds
def visualize_model(path, text: str, encoder: Optional[str] = None, layer: int = 0,
                    direction: Optional[str] = None, loaded: Optional[LoadedModel] = None) -> WeightMap:
    """The :class:`WeightMap` of ``text`` for the recurrent encoder ``encoder`` of the model at
    ``path`` (pass ``loaded`` to reuse a model loaded with :func:`load_model`)."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("the text is empty: give a sentence, e.g. --text \"the cat sat on the mat\"")
    loaded = loaded or load_model(path)
    stack = select_encoder(loaded.model, encoder)
    name, module, local_layer = stack.locate(layer)
    rnn = as_ablated(module)
    if not rnn.variant.has_memory:   # fail before running anything
        weight_map(rnn, torch.zeros(1, rnn.input_size), ["x"])
    resolve_directions(rnn, direction)
    with capture_inputs({name: module}) as calls:
        embedded = loaded.run(text, name)
    if name not in calls:
        raise ValueError(f"encoder {name!r} did not run on the text's embeddings; it reads something "
                         f"else. Recurrent encoders: {describe_candidates(recurrent_modules(loaded.model))}")
    inputs = captured_sequence(module, calls[name])
    words = embedded.words
    if inputs.shape[0] != len(words):
        raise ValueError(f"the encoder read {inputs.shape[0]} positions for {len(words)} tokens "
                         f"({' '.join(words)}); cannot label them")
    labels = [w + " (unk)" if w in embedded.unknown else w for w in words]
    source = {"kind": loaded.kind_name, "path": os.fspath(loaded.path), "encoder": name}
    if len(stack.names) > 1:
        source["stack"] = stack.label
    if len(stack.names) > 1 or local_layer != layer:
        source["module_layer"] = str(local_layer)
    if embedded.unknown:
        source["unknown_words"] = " ".join(embedded.unknown)
    wm = weight_map(rnn, inputs, labels, layer=local_layer, direction=direction, source=source)
    wm.layer = layer
    return wm
