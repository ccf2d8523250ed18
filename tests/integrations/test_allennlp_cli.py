"""End-to-end runs of the real ``allennlp`` command on tiny fixtures, with ablated encoders:

* BiDAF (``bidaf_ran.jsonnet``), the biaffine parser (``biaffine_parser_lstm_minus_srnn.jsonnet``)
  and DrQA (``drqa_identity_ran.jsonnet``, question encoder overridden to ``srnn``), each
  ``allennlp train ... --include-package rnn_ablations -o '{...}'`` (tiny sizes), then
  ``allennlp evaluate`` and ``allennlp predict`` on the archive;
* DrQA is trained with AllenNLP's own distributed training on two CPU processes
  (``"distributed": {"cuda_devices": [-1, -1]}``, gloo);
* the archive, reloaded in this process, gives the same predictions as ``allennlp predict``, and
  ``allennlp evaluate`` reproduces the validation metrics that the trainer recorded;
* a config whose data variable is unset fails naming the variable.

The pipelines run concurrently (each is a sequence of processes) to keep the wall time down.
"""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

_NLTK = Path(tempfile.gettempdir()) / "rnn_ablations_nltk_data"
(_NLTK / "tokenizers" / "punkt").mkdir(parents=True, exist_ok=True)
os.environ.setdefault("NLTK_DATA", str(_NLTK))

pytest.importorskip("allennlp", reason="AllenNLP is not installed (bash scripts/setup.sh installs it)")

import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "allennlp"
CONFIGS = REPO / "allennlp_configs"
ALLENNLP = Path(sys.executable).parent / "allennlp"
SQUAD = FIXTURES / "squad_tiny.json"
QUESTIONS = FIXTURES / "squad_questions.jsonl"
CONLLU = FIXTURES / "ud_tiny.conllu"
GLOVE = FIXTURES / "glove_tiny_8d.txt"  # 8-d vectors for half of the fixture words

BIDAF_OVERRIDES = {
    "model.text_field_embedder.token_embedders.tokens.embedding_dim": 8,
    "model.text_field_embedder.token_embedders.token_characters.embedding.embedding_dim": 4,
    "model.text_field_embedder.token_embedders.token_characters.encoder.embedding_dim": 4,
    "model.text_field_embedder.token_embedders.token_characters.encoder.num_filters": 8,
    "model.phrase_layer.input_size": 16, "model.phrase_layer.hidden_size": 6,
    "model.matrix_attention.tensor_1_dim": 12, "model.matrix_attention.tensor_2_dim": 12,
    "model.modeling_layer.input_size": 48, "model.modeling_layer.hidden_size": 6,
    "model.span_end_encoder.input_size": 84, "model.span_end_encoder.hidden_size": 6,
    "trainer.num_epochs": 1, "data_loader.batch_sampler.batch_size": 16,
}
PARSER_OVERRIDES = {
    "model.text_field_embedder.token_embedders.tokens.embedding_dim": 8,
    "model.pos_tag_embedding.embedding_dim": 4, "model.encoder.input_size": 12,
    "model.encoder.hidden_size": 5, "model.encoder.num_layers": 2,
    "model.arc_representation_dim": 6, "model.tag_representation_dim": 4,
    "trainer.num_epochs": 1, "data_loader.batch_sampler.batch_size": 16,
}


def _layers(variant, input_size):
    return [{"type": variant, "input_size": input_size, "hidden_size": 5, "bidirectional": True},
            {"type": variant, "input_size": 10, "hidden_size": 5, "bidirectional": True}]


DRQA_OVERRIDES = {
    # no POS/NER pipeline can be installed offline: the features the config's header says to
    # switch off without it; the lookup lemmatizer where spacy-lookups-data is installed
    "dataset_reader.pos_tags": False, "dataset_reader.ner_tags": False,
    "dataset_reader.tagger_pipeline": None,
    "dataset_reader.lemmatizer": ("lookup" if importlib.util.find_spec("spacy_lookups_data")
                                  else "tokenizer"),
    "model.pos_tag_embedding_dim": 0, "model.ner_tag_embedding_dim": 0,
    "model.text_field_embedder.token_embedders.tokens.embedding_dim": 8,
    "model.document_encoder.layers": _layers("identity_ran", 2 * 8 + 4),
    "model.question_encoder.layers": _layers("srnn", 8),
    "trainer.num_epochs": 1, "data_loader.batch_sampler.batch_size": 16,
    "distributed": {"cuda_devices": [-1, -1]},
}

PIPELINES = {
    "bidaf": dict(config="bidaf_ran.jsonnet", overrides=BIDAF_OVERRIDES, data=SQUAD,
                  predict_input=QUESTIONS, predict_args=[]),
    "parser": dict(config="biaffine_parser_lstm_minus_srnn.jsonnet", overrides=PARSER_OVERRIDES,
                   data=CONLLU, predict_input=CONLLU,
                   predict_args=["--use-dataset-reader", "--predictor", "biaffine_dependency_parser",
                                 "--predictor-args", '{"language": "blank:en"}']),
    "drqa": dict(config="drqa_identity_ran.jsonnet", overrides=DRQA_OVERRIDES, data=SQUAD,
                 predict_input=QUESTIONS, predict_args=[]),
}


def _env():
    env = dict(os.environ)
    env.update({
        "NLTK_DATA": str(_NLTK), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
        "PYTHONWARNINGS": "ignore", "TOKENIZERS_PARALLELISM": "false",
        "SQUAD_TRAIN": str(SQUAD), "SQUAD_DEV": str(SQUAD), "UD_TRAIN": str(CONLLU),
        "UD_DEV": str(CONLLU), "GLOVE_6B_100D": str(GLOVE), "GLOVE_840B_300D": str(GLOVE),
    })
    return env


def _run(args, env, log):
    start = time.time()
    proc = subprocess.run([str(ALLENNLP), *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=480)
    log.append({"args": args, "rc": proc.returncode, "seconds": round(time.time() - start, 1),
                "tail": (proc.stdout + proc.stderr)[-4000:]})
    return proc.returncode == 0


def _pipeline(name, spec, root, results):
    env, log = _env(), []
    out = root / name
    archive = out / "model.tar.gz"
    ok = _run(["train", str(CONFIGS / spec["config"]), "-s", str(out), "--include-package",
               "rnn_ablations", "-o", json.dumps(spec["overrides"])], env, log)
    ok = ok and _run(["evaluate", str(archive), str(spec["data"]), "--include-package",
                      "rnn_ablations", "--output-file", str(out / "evaluation.json")], env, log)
    ok = ok and _run(["predict", str(archive), str(spec["predict_input"]), "--include-package",
                      "rnn_ablations", "--output-file", str(out / "predictions.jsonl"), "--silent",
                      *spec["predict_args"]], env, log)
    results[name] = {"ok": ok, "log": log, "dir": out}


def _missing_variable(root, results):
    env, log = _env(), []
    env.pop("SQUAD_DEV")
    _run(["train", str(CONFIGS / "drqa_ran.jsonnet"), "-s", str(root / "missing"),
          "--include-package", "rnn_ablations"], env, log)
    results["missing"] = {"log": log}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    if not ALLENNLP.exists():
        pytest.fail(f"the allennlp command is not next to {sys.executable}; run bash scripts/setup.sh")
    root = tmp_path_factory.mktemp("allennlp_cli")
    results = {}
    threads = [threading.Thread(target=_pipeline, args=(n, s, root, results))
               for n, s in PIPELINES.items()]
    threads.append(threading.Thread(target=_missing_variable, args=(root, results)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _check(result):
    for step in result["log"]:
        assert step["rc"] == 0, f"allennlp {step['args'][0]} failed:\n{step['tail']}"
    assert result["ok"]


def _jsonl(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def reload():
    from allennlp.models.archival import load_archive
    from allennlp.predictors import Predictor
    import allennlp_models.rc  # noqa: F401  (registers bidaf, squad, reading_comprehension)
    import allennlp_models.structured_prediction  # noqa: F401
    import rnn_ablations.integrations.allennlp  # noqa: F401

    def load(path, name=None, extra_args=None):
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return Predictor.from_archive(load_archive(str(path)), name, extra_args=extra_args)
        finally:
            torch.set_num_threads(threads)
    return load


def _metrics_agree(result, keys, tol):
    trained = json.loads((result["dir"] / "metrics.json").read_text())
    evaluated = json.loads((result["dir"] / "evaluation.json").read_text())
    for key in keys:
        assert evaluated[key] == pytest.approx(trained[f"best_validation_{key}"], abs=tol), key
    return trained, evaluated


@pytest.mark.slow  # trains with `allennlp train`
def test_bidaf_with_ran(runs, reload):
    result = runs["bidaf"]
    _check(result)
    config = json.loads((result["dir"] / "config.json").read_text())
    assert {config["model"][k]["type"] for k in ("phrase_layer", "modeling_layer", "span_end_encoder")} \
        == {"ran"}
    # one epoch, one validation batch: evaluating the archive reproduces the trainer's numbers
    _metrics_agree(result, ["loss", "start_acc", "end_acc", "span_acc", "em", "f1"], 1e-5)
    cli = _jsonl(result["dir"] / "predictions.jsonl")
    assert len(cli) == len(_jsonl(QUESTIONS))
    predictor = reload(result["dir"] / "model.tar.gz")
    for line, expected in zip(_jsonl(QUESTIONS), cli):
        got = predictor.predict_json(line)
        assert got["best_span"] == expected["best_span"]
        assert got["best_span_str"] == expected["best_span_str"]
        assert got["span_start_probs"] == pytest.approx(expected["span_start_probs"], abs=1e-6)


@pytest.mark.slow  # trains with `allennlp train`
def test_biaffine_parser_with_lstm_minus_srnn(runs, reload):
    result = runs["parser"]
    _check(result)
    config = json.loads((result["dir"] / "config.json").read_text())
    assert config["model"]["encoder"]["type"] == "stacked_bidirectional_lstm_minus_srnn"
    _metrics_agree(result, ["loss", "UAS", "LAS", "UEM", "LEM"], 1e-5)
    cli = _jsonl(result["dir"] / "predictions.jsonl")
    predictor = reload(result["dir"] / "model.tar.gz", "biaffine_dependency_parser",
                       {"language": "blank:en"})
    instances = list(predictor._dataset_reader.read(str(CONLLU)))
    assert len(cli) == len(instances) == 6
    for instance, expected in zip(instances, cli):
        got = predictor.predict_instance(instance)
        assert got["words"] == expected["words"]
        assert got["predicted_heads"] == expected["predicted_heads"]
        assert got["predicted_dependencies"] == expected["predicted_dependencies"]


@pytest.mark.slow  # trains with `allennlp train`
def test_drqa_trained_on_two_cpu_processes(runs, reload):
    result = runs["drqa"]
    _check(result)
    out = result["dir"]
    # AllenNLP's distributed training ran two workers (gloo on CPU)
    assert (out / "out_worker0.log").exists() and (out / "out_worker1.log").exists()
    trained = json.loads((out / "metrics.json").read_text())
    assert "peak_worker_1_memory_MB" in trained
    config = json.loads((out / "config.json").read_text())
    assert config["distributed"]["cuda_devices"] == [-1, -1]
    assert {layer["type"] for layer in config["model"]["document_encoder"]["layers"]} == {"identity_ran"}
    # instance-level metrics do not depend on how the workers split the batches
    _metrics_agree(result, ["start_acc", "end_acc", "span_acc", "em", "f1"], 1e-6)
    cli = _jsonl(out / "predictions.jsonl")
    predictor = reload(out / "model.tar.gz")
    assert type(predictor).__name__ == "DrQAPredictor"  # the model's default predictor
    for line, expected in zip(_jsonl(QUESTIONS), cli):
        got = predictor.predict_json(line)
        assert got["best_span"] == expected["best_span"]
        assert got["best_span_str"] == expected["best_span_str"]
        assert got["span_end_probs"] == pytest.approx(expected["span_end_probs"], abs=1e-6)


@pytest.mark.slow  # trains with `allennlp train`
def test_unset_data_variable_is_named_by_the_cli(runs):
    (step,) = runs["missing"]["log"]
    assert step["rc"] != 0
    assert "undefined external variable: SQUAD_DEV" in step["tail"]
