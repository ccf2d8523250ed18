local encoder = "ablated_lstm";
// BiDAF (Seo et al., 2017) as in allennlp-models' training_config/rc/bidaf.jsonnet, with its three
// LSTMs (phrase layer, modeling layer, span-end encoder) of type `encoder` (the line above, the only
// line in which the bidaf_<variant>.jsonnet files differ).  "ablated_lstm" is rnn_ablations' LSTM
// (nn.LSTM's equations, parameters and init); "lstm" would be AllenNLP's own torch.nn.LSTM.
//
// Run with:  allennlp train $(rnn-ablations configs path bidaf_<variant>) -s OUT --include-package rnn_ablations
// (or a .allennlp_plugins file holding the line rnn_ablations instead of --include-package)
// Environment variables (all required; unset ones stop with "undefined external variable: NAME"):
//   SQUAD_TRAIN     SQuAD v1.1 training JSON (squad-train-v1.1.json; a path or URL)
//   SQUAD_DEV       SQuAD v1.1 development JSON (squad-dev-v1.1.json)
//   GLOVE_6B_100D   GloVe 6B 100-d vectors (glove.6B.100d.txt or .txt.gz); "" = random init
// Differences from the original: the "reduce_on_plateau_torch2" scheduler (AllenNLP's
// "reduce_on_plateau" passes an argument that torch 2.x removed), spaCy "blank:en" tokenizer (the
// English tokenization rules of en_core_web_sm, which cannot be downloaded here), no "cuda_device"
// (AllenNLP picks GPU 0 when there is one, else the CPU), paths from the environment, not URLs.
local glove = std.extVar("GLOVE_6B_100D");  // "" = no pretrained vectors (random init)
{
  "dataset_reader": {
    "type": "squad",
    "tokenizer": {"type": "spacy", "language": "blank:en"},
    "token_indexers": {
      "tokens": {"type": "single_id", "lowercase_tokens": true},
      "token_characters": {
        "type": "characters",
        "character_tokenizer": {"byte_encoding": "utf-8", "start_tokens": [259], "end_tokens": [260]},
        "min_padding_length": 5
      }
    }
  },
  "train_data_path": std.extVar("SQUAD_TRAIN"),
  "validation_data_path": std.extVar("SQUAD_DEV"),
  "model": {
    "type": "bidaf",
    "text_field_embedder": {
      "token_embedders": {
        "tokens": {
          "type": "embedding",
          "pretrained_file": if glove == "" then null else glove,
          "embedding_dim": 100,
          "trainable": false
        },
        "token_characters": {
          "type": "character_encoding",
          "embedding": {"num_embeddings": 262, "embedding_dim": 16},
          "encoder": {"type": "cnn", "embedding_dim": 16, "num_filters": 100, "ngram_filter_sizes": [5]},
          "dropout": 0.2
        }
      }
    },
    "num_highway_layers": 2,
    "phrase_layer": {
      "type": encoder,
      "bidirectional": true,
      "input_size": 200,
      "hidden_size": 100,
      "num_layers": 1
    },
    "matrix_attention": {
      "type": "linear",
      "combination": "x,y,x*y",
      "tensor_1_dim": 200,
      "tensor_2_dim": 200
    },
    "modeling_layer": {
      "type": encoder,
      "bidirectional": true,
      "input_size": 800,
      "hidden_size": 100,
      "num_layers": 2,
      "dropout": 0.2
    },
    "span_end_encoder": {
      "type": encoder,
      "bidirectional": true,
      "input_size": 1400,
      "hidden_size": 100,
      "num_layers": 1
    },
    "dropout": 0.2
  },
  "data_loader": {
    "batch_sampler": {"type": "bucket", "batch_size": 40}
  },
  "trainer": {
    "num_epochs": 20,
    "grad_norm": 5.0,
    "patience": 10,
    "validation_metric": "+em",
    "learning_rate_scheduler": {"type": "reduce_on_plateau_torch2", "factor": 0.5, "mode": "max", "patience": 2},
    "optimizer": {"type": "adam", "betas": [0.9, 0.9]}
  }
}
