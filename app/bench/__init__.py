"""The measuring wing: benchmarks of the attention kernels, training, the data pipeline and decoding.

It sits above the core (attention, models, decoding, data) and the training and inference packages it
times; nothing below imports it. Each benchmark is one module with its own ``main`` (the scripts under
``scripts/bench_*.py`` are thin wrappers of them); what they share, a clock for training steps, the
train config bounded to a benchmark (:mod:`app.bench.runs`), medians of repeated timings
(:mod:`app.bench.timing`) and memory readings (:mod:`app.bench.memory`), is written once.

    attention.py (+ attention_cases.py, attention_plot.py)  one attention layer per kernel
    training.py   tokens/s, MFU and memory of a train.py config
    data.py       preparation, start-up and throughput of the data pipeline on a synthetic corpus
    decoding.py   sentences/s of one checkpoint per beam size
    engines.py    decoding speed and BLEU across engines (torch fp32/bf16, CTranslate2 fp32/int8)
    timing.py     repository paths, medians of timed calls, rates over windows of steps (torch only)
    runs.py       the bounded train config and StepClock, the training-step clock
    memory.py     peak and anonymous RSS, peak bytes of one call (CUDA statistics or the CPU profiler)
    gpu_check.py  the GPU check in one command (+ gpu_plan.py its steps, gpu_report.py and gpu_markdown.py
                  its report, gpu_env.py the machine); gpu_bundle.py the wheels it carries to a lent GPU
"""
