"""A language-model checkpoint keeps the layers' variant record (the state dict's metadata): a
resumed or evaluated ran / identity_ran run loads it without the warning that its parameter
shapes fit the other variant too."""
import warnings

import pytest
import torch

from rnn_ablations.lm import get_config, load_checkpoint, synthetic_corpus, train_lm
from rnn_ablations.lm.synthetic import SyntheticSpec
from rnn_ablations.rnn import AblatedRNN

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("variant", ["ran", "identity_ran"])
def test_resume_of_a_twin_variant_does_not_warn(tmp_path, variant):
    corpus = synthetic_corpus(SyntheticSpec(train_sentences=40, valid_sentences=5,
                                            test_sentences=5))
    cfg = get_config("tiny", epochs=1)
    assert train_lm(variant, cfg, corpus, tmp_path, seed=1, log=None, max_steps=2) is None
    model = load_checkpoint(tmp_path)["model"]
    records = [m for m in getattr(model, "_metadata", {}).values()
               if AblatedRNN.METADATA_VARIANT in m]
    assert records and all(m[AblatedRNN.METADATA_VARIANT] == variant for m in records)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train_lm(variant, cfg, corpus, tmp_path, seed=1, log=None, resume=True, max_steps=3)
    twins = [str(w.message) for w in caught if "fit" in str(w.message)]
    assert twins == []
