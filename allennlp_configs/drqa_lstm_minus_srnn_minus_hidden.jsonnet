local encoder = "lstm_minus_srnn_minus_hidden";
// DrQA's document reader (Chen et al., 2017), rnn_ablations' `drqa` model, with document and question
// encoders made of three bidirectional layers of type `encoder` (the line above, the only line in
// which the drqa_<variant>.jsonnet files differ), hidden size 128, outputs of all layers
// concatenated ("concat_layers"), dropout 0.3 on the embeddings and on every RNN input; Adamax,
// gradient clipping 10, batch 32, model selection on F1.
//
// Run with:  allennlp train $(rnn-ablations configs path drqa_<variant>) -s OUT --include-package rnn_ablations
// (or a .allennlp_plugins file holding the line rnn_ablations instead of --include-package)
// Environment variables (all required; unset ones stop with "undefined external variable: NAME"):
//   SQUAD_TRAIN       SQuAD v1.1 training JSON (squad-train-v1.1.json; a path or URL)
//   SQUAD_DEV         SQuAD v1.1 development JSON (squad-dev-v1.1.json)
//   GLOVE_840B_300D   GloVe 840B 300-d vectors (glove.840B.300d.txt or .txt.gz); "" = random init
// As hitvoice/DrQA (Chen et al. 2017): the embeddings of the 1000 most frequent question words
// are fine-tuned, all other rows stay fixed ("tune_question_words"); dropout 0.3 on the embeddings,
// on every RNN input and on the RNN output ("dropout_output", hitvoice's dropout_rnn_output); the
// lemma exact match uses spaCy's lookup lemmatizer (pip install spacy-lookups-data); POS and NER
// tags of the passage come from the spaCy pipeline named by `tagger` below (install it with
// `python -m spacy download en_core_web_sm`).  Without that pipeline switch the two features off
// with -o '{"dataset_reader.pos_tags": false, "dataset_reader.ner_tags": false,
// "dataset_reader.tagger_pipeline": null, "model.pos_tag_embedding_dim": 0,
// "model.ner_tag_embedding_dim": 0}' and the first document layer's input_size reduced by 12 + 8
// (the reader stops with this advice when the pipeline is missing).
// Differences from the paper: POS/NER tags enter through small learned embeddings (12 and 8
// dimensions) instead of one-hot vectors; the tokeniser is spaCy's rule-based "blank:en" (the
// tagger pipeline tags its tokens); no SQuAD-specific text normalisation beyond AllenNLP's reader.
local hidden = 128;
local embedding_dim = 300;
local num_manual_features = 4;  // exact match (original, lower-case, lemma) + term frequency
local tagger = "en_core_web_sm";  // spaCy pipeline for the POS and NER features
local pos_dim = 12;
local ner_dim = 8;
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
    "lemmatizer": "lookup",
    "pos_tags": true,
    "ner_tags": true,
    "tagger_pipeline": tagger,
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
          "trainable": true
        }
      }
    },
    "embedding_dropout": 0.3,
    "tune_question_words": 1000,
    "pos_tag_embedding_dim": pos_dim,
    "ner_tag_embedding_dim": ner_dim,
    "document_encoder": {
      "type": "concat_layers",
      "dropout": 0.3,
      "dropout_output": true,
      "layers": layers(2 * embedding_dim + num_manual_features + pos_dim + ner_dim)
    },
    "question_encoder": {
      "type": "concat_layers",
      "dropout": 0.3,
      "dropout_output": true,
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
