"""Reading finished runs and sweeps, and the tables, figures and reports made from them.

One job per module: ``runs`` (one run directory, read once), ``variants`` (a sweep's runs as variants
and comparable groups), ``significance`` (spread over seeds, the sentence- and seed-level bootstraps),
``measurements`` (KV-cache bytes, attention maps), ``decode_speed`` (decoding speed timed by the report,
cached per variant), ``lengths`` (groups lined up by input length, per arm), ``figures``
(matplotlib, byte-stable PNGs), ``render`` (one Table and document model, written as Markdown and HTML),
``report`` (the ablation report, assembled from those; ``callback`` runs it when a sweep ends), and the
smaller reports ``summary`` (a table of runs), ``loss_match`` (two runs' training losses), ``eole`` and
``multilingual`` with ``multilingual_report`` (one multilingual model against bilingual ones, per direction).
"""
