local encoder = "lstm_minus_srnn_minus_hidden";
// Biaffine dependency parser (Dozat & Manning, 2017) as in allennlp-models'
// training_config/structured_prediction/dependency_parser.jsonnet, with its encoder of type
// "stacked_bidirectional_" + `encoder` (the line above, the only line in which the
// biaffine_parser_<variant>.jsonnet files differ).  "ablated_lstm" is rnn_ablations' LSTM; "lstm"
// would give AllenNLP's own stacked_bidirectional_lstm.
//
// Initialisation, the same for every variant: the encoder initialises itself as AllenNLP's
// stacked_bidirectional_lstm does (AugmentedLstm: block-orthogonal weights, one orthogonal block per
// gate, biases 0 with the forget gate at 1).  The initializer's regexes are the original's; in the
// original, the four nn.LSTM-style ones (weight_ih, weight_hh, bias_ih, bias_hh) match none of
// AugmentedLstm's parameters.  Ours are named like nn.LSTM's, so "prevent_regexes" keeps the
// initializer off the encoder ("^encoder\\.") and the original's behaviour is kept for every variant.
//
// Highway: "use_highway": true as in the AllenNLP config.  With it every layer computes
// h_t <- r_t*h_t + (1 - r_t)*W_hw x_t with a sigmoid gate r_t that reads x_t and h_{t-1}; for
// "srnn" (LSTM - GATES) that is a gate the paper's S-RNN does not have (the paper's parser, Dozat &
// Manning's code, had no highway).  For the paper's setting override it:
//   -o '{"model.encoder.use_highway": false}'
//
// Run with:  allennlp train $(rnn-ablations configs path biaffine_parser_<variant>) -s OUT --include-package rnn_ablations
// (or a .allennlp_plugins file holding the line rnn_ablations instead of --include-package)
// Environment variables (all required; unset ones stop with "undefined external variable: NAME"):
//   UD_TRAIN        training CoNLL-U file (e.g. ../shared/data/ud_ewt/en_ewt-ud-train.conllu)
//   UD_DEV          validation CoNLL-U file (e.g. ../shared/data/ud_ewt/en_ewt-ud-dev.conllu)
//   GLOVE_6B_100D   GloVe 6B 100-d vectors (glove.6B.100d.txt or .txt.gz); "" = random init
// Differences from the original: dense embedding gradients ("sparse": false; torch 2.x's
// clip_grad_norm_, which "grad_norm" calls, cannot take sparse gradients; dense_sparse_adam
// handles dense ones), no "cuda_device" (GPU 0 when there is one, else the CPU), paths from the
// environment.
// Predicting from raw sentences needs a spaCy pipeline: --predictor-args '{"language": "blank:en"}'
// works offline (no POS tagger: prefer --use-dataset-reader on CoNLL-U input).
local glove = std.extVar("GLOVE_6B_100D");  // "" = no pretrained vectors (random init)
{
  "dataset_reader": {
    "type": "universal_dependencies"
  },
  "train_data_path": std.extVar("UD_TRAIN"),
  "validation_data_path": std.extVar("UD_DEV"),
  "model": {
    "type": "biaffine_parser",
    "text_field_embedder": {
      "token_embedders": {
        "tokens": {
          "type": "embedding",
          "embedding_dim": 100,
          "pretrained_file": if glove == "" then null else glove,
          "trainable": true,
          "sparse": false
        }
      }
    },
    "pos_tag_embedding": {
      "embedding_dim": 100,
      "vocab_namespace": "pos",
      "sparse": false
    },
    "encoder": {
      "type": "stacked_bidirectional_" + encoder,
      "input_size": 200,
      "hidden_size": 400,
      "num_layers": 3,
      "recurrent_dropout_probability": 0.3,
      "use_highway": true
    },
    "use_mst_decoding_for_validation": true,
    "arc_representation_dim": 500,
    "tag_representation_dim": 100,
    "dropout": 0.3,
    "input_dropout": 0.3,
    "initializer": {
      "regexes": [
        [".*projection.*weight", {"type": "xavier_uniform"}],
        [".*projection.*bias", {"type": "zero"}],
        [".*tag_bilinear.*weight", {"type": "xavier_uniform"}],
        [".*tag_bilinear.*bias", {"type": "zero"}],
        [".*weight_ih.*", {"type": "xavier_uniform"}],
        [".*weight_hh.*", {"type": "orthogonal"}],
        [".*bias_ih.*", {"type": "zero"}],
        [".*bias_hh.*", {"type": "lstm_hidden_bias"}]
      ],
      "prevent_regexes": ["^encoder\\."]
    }
  },
  "data_loader": {
    "batch_sampler": {"type": "bucket", "batch_size": 128}
  },
  "trainer": {
    "num_epochs": 50,
    "grad_norm": 5.0,
    "patience": 50,
    "validation_metric": "+LAS",
    "optimizer": {"type": "dense_sparse_adam", "betas": [0.9, 0.9]}
  }
}
