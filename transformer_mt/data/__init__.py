"""Data: corpus registry and download, cleaning, tokenizer, binarized cache and batching."""
