"""attn-mt: encoder-decoder machine translation with pluggable attention."""
