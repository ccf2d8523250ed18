local encoder = "lstm_minus_srnn_minus_hidden";
// DrQA's document reader (Chen et al., 2017), rnn_ablations' `drqa` model, with document and question
// encoders made of three bidirectional layers of type `encoder` (the line above, the only line in
// which the drqa_<variant>.jsonnet files differ), hidden size 128, outputs of all layers
// concatenated ("concat_layers"), dropout 0.3 on the embeddings and on every RNN input; Adamax,
// gradient clipping 10, batch 32, model selection on F1.
//
// Run with:  allennlp train allennlp_configs/drqa_<variant>.jsonnet -s OUT --include-package rnn_ablations
// Environment variables (all required; unset ones stop with "undefined external variable: NAME"):
//   SQUAD_TRAIN       SQuAD v1.1 training JSON (squad-train-v1.1.json; a path or URL)
//   SQUAD_DEV         SQuAD v1.1 development JSON (squad-dev-v1.1.json)
//   GLOVE_840B_300D   GloVe 840B 300-d vectors (glove.840B.300d.txt or .txt.gz); "" = random init
// Differences from the paper: the word embeddings stay frozen (the paper fine-tunes the 1000 most
// frequent question words); no POS/NER features, because spaCy's "blank:en" (the only pipeline that
// works offline here) has no tagger: with en_core_web_sm installed, set the reader's tokenizer to
// {"type": "spacy", "language": "en_core_web_sm", "pos_tags": true, "ner": true}, its "pos_tags" and
// "ner_tags" to true, the model's "pos_tag_embedding_dim"/"ner_tag_embedding_dim" (e.g. 12 and 8)
// and add them to the document encoder's first input_size.
local hidden = 128;
local embedding_dim = 300;
local num_manual_features = 4;  // exact match (original, lower-case, lemma) + term frequency
local layers(input_size) = [
  {"type": encoder, "input_size": input_size, "hidden_size": hidden, "num_layers": 1, "bidirectional": true},
  {"type": encoder, "input_size": 2 * hidden, "hidden_size": hidden, "num_layers": 1, "bidirectional": true},
  {"type": encoder, "input_size": 2 * hidden, "hidden_size": hidden, "num_layers": 1, "bidirectional": true},
];
local glove = std.extVar("GLOVE_840B_300D");  // "" = no pretrained vectors (random init)
{
  "dataset_reader": {
    "type": "drqa_squad",
    "tokenizer": {"type": "spacy", "language": "blank:en"},
    "token_indexers": {
      "tokens": {"type": "single_id", "lowercase_tokens": false}
    }
  },
  "train_data_path": std.extVar("SQUAD_TRAIN"),
  "validation_data_path": std.extVar("SQUAD_DEV"),
  "model": {
    "type": "drqa",
    "text_field_embedder": {
      "token_embedders": {
        "tokens": {
          "type": "embedding",
          "pretrained_file": if glove == "" then null else glove,
          "embedding_dim": embedding_dim,
          "trainable": false
        }
      }
    },
    "embedding_dropout": 0.3,
    "document_encoder": {
      "type": "concat_layers",
      "dropout": 0.3,
      "layers": layers(2 * embedding_dim + num_manual_features)
    },
    "question_encoder": {
      "type": "concat_layers",
      "dropout": 0.3,
      "layers": layers(embedding_dim)
    },
    "max_span_length": 15
  },
  "data_loader": {
    "batch_sampler": {"type": "bucket", "batch_size": 32}
  },
  "trainer": {
    "num_epochs": 40,
    "grad_norm": 10.0,
    "patience": 10,
    "validation_metric": "+f1",
    "optimizer": {"type": "adamax", "lr": 0.002}
  }
}
