"""translate.py in a pipe, driven through real pipes: ``--buffer-size 1`` answers each line as it
arrives, a reader that stops early (``| head -1``) ends the run quietly, and so does Ctrl-C."""

from __future__ import annotations

import queue
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from helpers.models import TINY_TRANSFORMER
from helpers.training import REPO_ROOT, subprocess_env

pytestmark = pytest.mark.usefixtures("single_torch_thread")

DECODING = ["--beam", "1", "--max-len", "5", "--device", "cpu"]


@pytest.fixture(scope="module")
def checkpoint(
    checkpoint_factory: Callable[..., torch.nn.Module], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    path = tmp_path_factory.mktemp("pipes") / "model.ckpt"
    checkpoint_factory(path, model_cfg=TINY_TRANSFORMER, attention_cfg={"kernel": "eager"})
    return path


def read_line(stream, timeout: float) -> bytes | None:
    """The next line of ``stream``, or None when none comes within ``timeout`` seconds."""
    lines: queue.Queue[bytes] = queue.Queue()
    threading.Thread(target=lambda: lines.put(stream.readline()), daemon=True).start()
    try:
        return lines.get(timeout=timeout)
    except queue.Empty:
        return None


def test_buffer_size_1_answers_each_line_before_the_next_is_written(checkpoint: Path) -> None:
    command = [sys.executable, "translate.py", str(checkpoint), *DECODING, "--buffer-size", "1"]
    process = subprocess.Popen(
        command,
        cwd=REPO_ROOT,
        env=subprocess_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        answers = []
        for sentence in (b"Ein Hund.\n", b"Zwei Katzen spielen.\n"):
            process.stdin.write(sentence)
            process.stdin.flush()  # stdin stays open: the program must answer without seeing EOF
            answer = read_line(process.stdout, timeout=120)
            assert answer is not None, "no answer while the input pipe stayed open"
            answers.append(answer)
        process.stdin.close()
        assert process.stdout.read() == b""  # one answer per line, nothing held back
        assert process.wait(timeout=60) == 0, process.stderr.read().decode()
    finally:
        process.kill()
        process.wait()
    assert all(answer.endswith(b"\n") for answer in answers)


def test_a_reader_that_stops_early_ends_the_run_quietly(checkpoint: Path, tmp_path: Path) -> None:
    source = tmp_path / "input.de"
    source.write_text("Ein Hund läuft im Park.\n" * 400, encoding="utf-8")
    translate = shlex.join([sys.executable, "translate.py", str(checkpoint), *DECODING, "--buffer-size", "1"])
    script = f'{translate} -i {shlex.quote(str(source))} | head -1; echo "status=${{PIPESTATUS[0]}}" >&2'
    result = subprocess.run(
        ["bash", "-c", script], cwd=REPO_ROOT, env=subprocess_env(), capture_output=True, timeout=300
    )
    stderr = result.stderr.decode()
    assert len(result.stdout.splitlines()) == 1
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr and "Exception ignored" not in stderr
    assert stderr.strip().splitlines()[-1] == "status=0"


def test_buffer_size_must_be_positive(checkpoint: Path) -> None:
    result = subprocess.run(
        [sys.executable, "translate.py", str(checkpoint), *DECODING, "--buffer-size", "0"],
        cwd=REPO_ROOT,
        env=subprocess_env(),
        input=b"Ein Hund.\n",
        capture_output=True,
        timeout=300,
    )
    assert result.returncode == 2
    assert b"--buffer-size must be >= 1, got 0" in result.stderr


def test_ctrl_c_mid_run_exits_130_quietly_leaving_no_output_file(checkpoint: Path, tmp_path: Path) -> None:
    """A real SIGINT to translate.py once its first answer is in -o's temporary file: status 130, nothing
    on stderr (no KeyboardInterrupt traceback), and neither the output nor its temporary file remains."""
    target = tmp_path / "out.en"
    command = [
        sys.executable,
        "translate.py",
        str(checkpoint),
        *DECODING,
        "--buffer-size",
        "1",
        "-o",
        str(target),
    ]
    process = subprocess.Popen(
        command, cwd=REPO_ROOT, env=subprocess_env(), stdin=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        process.stdin.write(b"Ein Hund.\n")
        process.stdin.flush()  # stdin stays open: the program waits for the next line
        deadline = time.monotonic() + 120
        while not any(p.stat().st_size for p in tmp_path.glob(".out.en.*.tmp")):  # the first answer
            assert time.monotonic() < deadline and process.poll() is None, process.stderr.read().decode()
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 130
        assert process.stderr.read() == b""
    finally:
        process.kill()
        process.wait()
    assert list(tmp_path.iterdir()) == []
