"""Helpers several test files share: counting the thread pool's splits, the vector register
name of this CPU, and the checks of a language model's `blasnet train --task text` output."""
from __future__ import annotations

import numba
import pytest

from kernels import parallel


def count_splits(monkeypatch) -> list:
    """Wrap ``kernels.parallel.split`` for the test: the returned list gets the thread count
    of each split over more than one thread."""
    calls, real = [], parallel.split

    def counting(*args, **kwargs):
        k = real(*args, **kwargs)
        if k > 1:
            calls.append(k)
        return k
    monkeypatch.setattr(parallel, "split", counting)
    return calls


def vector_register() -> str:
    """``"zmm"`` on an AVX-512 CPU, ``"ymm"`` with AVX2; skips the test where compiled code
    cannot be inspected (NUMBA_DISABLE_JIT) or the CPU has neither."""
    if numba.config.DISABLE_JIT:
        pytest.skip("NUMBA_DISABLE_JIT")
    from llvmlite import binding as ll
    features = ll.get_host_cpu_features()
    reg = "zmm" if features.get("avx512f") else "ymm" if features.get("avx2") else None
    if reg is None:
        pytest.skip("no AVX2 on this CPU")
    return reg


def check_text_run(code: int, out: str) -> None:
    """Assert what every `train --task text --prompt "for "` run prints: exit 0, the corpus,
    the unigram baseline, a reload that gives identical loss, a sample from the prompt."""
    assert code == 0
    assert "pydoc_data.topics" in out and "unigram baseline" in out and "identical" in out
    sample = out.split("temperature 0.8):\n")[1].splitlines()[0]
    assert sample.startswith("for ") and len(sample) >= 4


def capture_config(monkeypatch, module, argv):
    """The config ``blasnet train *argv`` hands to ``module.setup`` (engine.training.lm or
    gpt_lm), captured there: nothing is trained."""
    from engine.cli import main
    seen = {}

    def capture(config, **_):
        seen["config"] = config
        raise SystemExit(0)
    monkeypatch.setattr(module, "setup", capture)
    with pytest.raises(SystemExit):
        main(["train", *argv])
    return seen["config"]
