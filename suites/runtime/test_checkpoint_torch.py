"""Oracle: ``sequential`` against the real ``torch.utils.checkpoint.checkpoint_sequential``.

Runs only where PyTorch is installed (``ci/check.sh --interop`` installs the CPU build,
``pip install torch==2.13.0``, and runs ``-m interop``); elsewhere it skips saying so. PyTorch is
never a dependency of the project.

Each module of an ``nn.Sequential`` counts its forward calls; a forward and backward pass through
``checkpoint_sequential(model, segments, x)`` must call each module exactly as often as the plan
predicts, for both checkpoint implementations (reentrant and not), and must fail where the plan
refuses (more segments than modules).
"""

from __future__ import annotations

import pytest

from runtime.checkpoint import checkpoint_plan

pytestmark = pytest.mark.interop


@pytest.fixture(scope="module")
def torch():
    """PyTorch, imported at the first test that runs (these are marked ``interop``: without
    ``--interop`` they skip before, each saying so). Not at import: a module skipped while it is
    collected counts in the run's totals but not among its collected items."""
    return pytest.importorskip(
        "torch",
        reason="PyTorch is not installed: the checkpoint_sequential oracle needs it"
        " (pip install torch==2.13.0, a CPU build; ci/check.sh --interop does)",
    )


def torch_forward_calls(torch, n: int, segments: int, use_reentrant: bool) -> tuple[int, ...]:
    """Forward calls per module of one forward+backward pass through PyTorch."""

    class Counted(torch.nn.Module):
        """``sin(x)``, which saves its input for backward, counting its forward calls."""

        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            return torch.sin(x)

    model = torch.nn.Sequential(*(Counted() for _ in range(n)))
    x = torch.ones(4, requires_grad=True)
    out = torch.utils.checkpoint.checkpoint_sequential(
        model, segments, x, use_reentrant=use_reentrant
    )
    out.sum().backward()
    assert x.grad is not None
    return tuple(module.calls for module in model)


@pytest.mark.parametrize("use_reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_sequential_matches_pytorch(torch, use_reentrant):
    for n in range(1, 13):
        for segments in range(1, n + 1):
            plan = checkpoint_plan("sequential", n, interval=segments)
            expected = torch_forward_calls(torch, n, segments, use_reentrant)
            assert plan.predict().forward_calls == expected, f"n={n} segments={segments}"
            assert plan.n_checkpointed == expected.count(1)


def test_pytorchs_documented_example(torch):
    assert torch_forward_calls(torch, 10, 2, use_reentrant=False) == (2,) * 5 + (1,) * 5


def test_more_segments_than_modules_fails_in_both(torch):
    with pytest.raises(ValueError):
        torch_forward_calls(torch, 3, 4, use_reentrant=False)
    with pytest.raises(ValueError, match=r"segments=4: expected 1 <= segments <= n_layers=3"):
        checkpoint_plan("sequential", 3, interval=4)
