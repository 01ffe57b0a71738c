"""The CUDA subset (``pytest -m cuda``): each CUDA path run the way a GPU user runs it.

Every module here sets ``pytestmark = pytest.mark.cuda`` and takes the ``device`` fixture.
Without CUDA the tests skip; ``LIT_AMP_CUDA_TESTS_ON=cpu`` runs them on the CPU instead, which
checks the tests' own logic on a machine without a GPU (``on_cuda`` says which it is, for the
few assertions that only hold on CUDA). ``make gpu-check`` fails when any of them skips on a
GPU machine.
"""

from __future__ import annotations

import os
import warnings

import pytest
import torch

ON = os.environ.get("LIT_AMP_CUDA_TESTS_ON", "cuda")


@pytest.fixture
def device() -> torch.device:
    """The device the CUDA tests run on: ``cuda``, or ``cpu`` under LIT_AMP_CUDA_TESTS_ON=cpu."""
    if ON == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA (LIT_AMP_CUDA_TESTS_ON=cpu runs these tests' logic on the CPU)")
    return torch.device("cuda")


@pytest.fixture
def on_cuda(device: torch.device) -> bool:
    """True on a CUDA device (assertions about CUDA-only behaviour)."""
    return device.type == "cuda"


@pytest.fixture
def accelerator(device: torch.device) -> dict:
    """Lightning ``Trainer`` arguments that put the run on ``device`` (one device, quiet)."""
    return {
        "accelerator": "gpu" if device.type == "cuda" else "cpu",
        "devices": 1,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "logger": False,
    }


@pytest.fixture
def exact_fp32():
    """fp32 matmuls and convolutions without TF32, for comparisons with the CPU."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


@pytest.fixture(autouse=True)
def _one_cpu_thread_fp16_quiet():
    """One intra-op CPU thread (tiny tensors: two threads spin-wait on each other on a loaded
    2-core machine, 10x slower); CPU mode computes float16 on the CPU, which lit_amp rightly
    warns about."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*float16.*CPU")
        yield
    torch.set_num_threads(threads)
