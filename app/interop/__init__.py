"""Models from other toolkits turned into this toolkit's checkpoints (Marian / OPUS-MT: :mod:`.marian`)."""
