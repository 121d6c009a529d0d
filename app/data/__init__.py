"""Data layer: corpus reading, subword tokenization, token-bucket batching and Multi30k preparation."""
