"""``rnn-ablations variants``: every row of the table with its equations and parameter count."""
import json

import pytest

from rnn_ablations import AblatedRNN, VARIANTS, get_variant, recurrent_param_count
from rnn_ablations.cli import main
from rnn_ablations.commands.variants import describe_variants


def test_every_row_shows_its_equations_and_counts(capsys):
    assert main(["variants", "--json", "--input-size", "7", "--hidden-size", "5"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == list(VARIANTS)
    for r in rows:
        v = get_variant(r["name"])
        assert r["equations"] == v.equations and r["paper_name"] == v.paper_name
        assert r["reads_hidden"] == v.reads_hidden
        assert r["parameters_per_layer"] == recurrent_param_count(v.name, 7, 5)
        # what the module allocates
        assert sum(p.numel() for p in AblatedRNN(v.name, 7, 5).parameters()) == \
            r["parameters_per_layer"]
        for alias in r["aliases"]:
            assert get_variant(alias) is v


def test_text_output_and_aliases(capsys):
    assert main(["variants", "tanh_ran"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ran (also: lstm_minus_srnn_minus_out, tanh_ran): ")
    assert get_variant("ran").equations in out


@pytest.mark.parametrize("argv,message", [
    (["variants", "nope"], "unknown variant 'nope'; valid variants are"),
    (["variants", "--hidden-size", "0"], "--hidden-size must be a positive integer"),
])
def test_bad_input_is_refused_with_the_fix(capsys, argv, message):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_describe_refuses_a_non_integer_size():
    with pytest.raises(ValueError, match="--input-size must be a positive integer"):
        describe_variants(input_size=2.5)


@pytest.mark.parametrize("variant", VARIANTS)
def test_module_mode_names_the_variant(variant):
    """``AblatedRNN.mode`` stands where ``nn.LSTM.mode`` is "LSTM": the variant's name."""
    assert AblatedRNN(variant, 3, 2).mode == variant
    assert AblatedRNN(get_variant(variant).name.upper().replace("_", "-"), 3, 2).mode == variant


def test_a_reader_that_stops_early_ends_the_command_quietly():
    """``rnn-ablations variants | head -1``: the pipe closes while the command writes; the
    command exits 0 without a BrokenPipeError traceback, as other command-line tools do."""
    import subprocess
    import sys
    proc = subprocess.run(
        f"{sys.executable} -m rnn_ablations.cli variants --input-size 7 --hidden-size 5 "
        "| head -c 1", shell=True, capture_output=True, text=True, timeout=120,
        executable="/bin/bash")
    assert len(proc.stdout) == 1
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
