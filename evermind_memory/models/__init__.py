"""The shipped default model, as package data only: model.evlm, tokenizer.json, model.json (its card) and
train_log.json. The code that reads them is evermind_memory.embedder (card() and default_embedder())."""
