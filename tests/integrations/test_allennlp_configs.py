"""The AllenNLP configs: one file per experiment × variant, each identical to the LSTM file except
for its first line, and that line changes exactly the recurrent encoders."""
import difflib
import json
import re
from pathlib import Path

import pytest

from rnn_ablations.variants import VARIANTS  # the table ("lstm" first)

CONFIGS = Path(__file__).resolve().parents[2] / "allennlp_configs"
FAMILIES = ["bidaf", "biaffine_parser", "drqa"]

#: the encoder type of each variant: AllenNLP owns ``lstm``, so ours is ``ablated_lstm``
ENCODER = {v: "ablated_lstm" if v == "lstm" else v for v in VARIANTS}
ENV = {"bidaf": ["SQUAD_TRAIN", "SQUAD_DEV", "GLOVE_6B_100D"],
       "biaffine_parser": ["UD_TRAIN", "UD_DEV", "GLOVE_6B_100D"],
       "drqa": ["SQUAD_TRAIN", "SQUAD_DEV", "GLOVE_840B_300D"]}


def test_exactly_the_expected_files():
    expected = {f"{f}_{v}.jsonnet" for f in FAMILIES for v in VARIANTS}
    assert {p.name for p in CONFIGS.glob("*.jsonnet")} == expected


@pytest.mark.parametrize("family", FAMILIES)
def test_each_variant_differs_from_the_lstm_file_by_one_line(family):
    base = (CONFIGS / f"{family}_lstm.jsonnet").read_text().splitlines()
    assert base[0] == 'local encoder = "ablated_lstm";'
    for variant in VARIANTS[1:]:
        lines = (CONFIGS / f"{family}_{variant}.jsonnet").read_text().splitlines()
        changed = [(tag, i1, i2, j1, j2) for tag, i1, i2, j1, j2 in
                   difflib.SequenceMatcher(a=base, b=lines, autojunk=False).get_opcodes()
                   if tag != "equal"]
        assert changed == [("replace", 0, 1, 0, 1)], f"{family}_{variant}: {changed}"
        assert lines[0] == f'local encoder = "{ENCODER[variant]}";'


def _evaluate(path, env):
    _jsonnet = pytest.importorskip("_jsonnet", reason="the jsonnet package is not installed")
    return json.loads(_jsonnet.evaluate_file(str(path), ext_vars=env))


def _encoder_types(family, config):
    model = config["model"]
    if family == "bidaf":
        return [model[k]["type"] for k in ("phrase_layer", "modeling_layer", "span_end_encoder")]
    if family == "biaffine_parser":
        return [model["encoder"]["type"]]
    return [layer["type"] for enc in ("document_encoder", "question_encoder")
            for layer in model[enc]["layers"]]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_line_changes_every_recurrent_encoder_and_nothing_else(family):
    env = {name: f"/data/{name.lower()}" for name in ENV[family]}
    base = _evaluate(CONFIGS / f"{family}_lstm.jsonnet", env)
    assert base["train_data_path"] == env[ENV[family][0]]
    assert base["validation_data_path"] == env[ENV[family][1]]
    prefix = "stacked_bidirectional_" if family == "biaffine_parser" else ""
    counts = {"bidaf": 3, "biaffine_parser": 1, "drqa": 6}[family]
    for variant in VARIANTS:
        config = _evaluate(CONFIGS / f"{family}_{variant}.jsonnet", env)
        assert _encoder_types(family, config) == [prefix + ENCODER[variant]] * counts
        # replacing the encoder types back gives the LSTM config
        text = json.dumps(config)
        text = text.replace(f'"type": "{prefix}{ENCODER[variant]}"', f'"type": "{prefix}ablated_lstm"')
        assert json.loads(text) == base
    # the pretrained vectors come from the environment; "" means none
    glove = ENV[family][2]
    tokens = base["model"]["text_field_embedder"]["token_embedders"]["tokens"]
    assert tokens["pretrained_file"] == env[glove]
    none = _evaluate(CONFIGS / f"{family}_ran.jsonnet", dict(env, **{glove: ""}))
    assert none["model"]["text_field_embedder"]["token_embedders"]["tokens"]["pretrained_file"] is None


@pytest.mark.parametrize("family", FAMILIES)
def test_every_variable_is_documented_and_a_missing_one_is_named(family):
    _jsonnet = pytest.importorskip("_jsonnet", reason="the jsonnet package is not installed")
    text = (CONFIGS / f"{family}_ran.jsonnet").read_text()
    assert sorted(set(re.findall(r'std\.extVar\("(\w+)"\)', text))) == sorted(ENV[family])
    header = "\n".join(line for line in text.splitlines() if line.startswith("//"))
    for name in ENV[family]:
        assert re.search(rf"//\s+{name}\s+\S", header), f"{name} is not documented in the header"
        env = {n: "x" for n in ENV[family] if n != name}
        with pytest.raises(RuntimeError, match=f"undefined external variable: {name}"):
            _jsonnet.evaluate_file(str(CONFIGS / f"{family}_ran.jsonnet"), ext_vars=env)


def test_parser_config_keeps_the_original_initializer():
    env = {name: "x" for name in ENV["biaffine_parser"]}
    config = _evaluate(CONFIGS / "biaffine_parser_ran.jsonnet", env)
    regexes = {pattern: init["type"] for pattern, init in config["model"]["initializer"]["regexes"]}
    assert regexes == {
        ".*projection.*weight": "xavier_uniform", ".*projection.*bias": "zero",
        ".*tag_bilinear.*weight": "xavier_uniform", ".*tag_bilinear.*bias": "zero",
        ".*weight_ih.*": "xavier_uniform", ".*weight_hh.*": "orthogonal",
        ".*bias_ih.*": "zero", ".*bias_hh.*": "lstm_hidden_bias",
    }
    encoder = config["model"]["encoder"]
    assert {k: encoder[k] for k in ("input_size", "hidden_size", "num_layers",
                                    "recurrent_dropout_probability", "use_highway")} == \
        {"input_size": 200, "hidden_size": 400, "num_layers": 3,
         "recurrent_dropout_probability": 0.3, "use_highway": True}
