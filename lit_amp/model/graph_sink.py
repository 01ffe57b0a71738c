"""A sink's training steps as one CUDA graph, replayed per batch (``LitModel.sink_graph``).

In sink mode a Lightning step runs ``sink_size`` train steps; on CUDA a small network is bound
by the host (Python and kernel launches). :class:`SinkGraph` warms the step up eagerly on a
side stream, captures it once as a ``torch.cuda.CUDAGraph`` (forward, loss, backward, clipping,
optimizer update: one launch) and replays it for each batch copied into static buffers, with
the losses and weights of eager training. It drives the step only through ``LitModel``'s
public seam (:mod:`lit_amp.model.train_step`), so the step has one definition; whether it may
be captured is :mod:`lit_amp.model.graph_plan`'s. A batch of another shape runs eagerly, and
a change of what it baked in captures it again (rules: docs/differences.md, "Sink mode").
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from lightning_utilities.core.apply_func import apply_to_collection
from torch import nn

from lit_amp.model.graph_plan import SinkGraphPlan, plan_sink_graph

__all__ = ["SinkGraph", "WARMUP_STEPS"]

log = logging.getLogger(__name__)

#: the torch.cuda API the runner calls (one name, so that a test can stand in for it on CPU)
_cuda: Any = torch.cuda

#: eager steps (on a side stream) before the capture: lazy initialisation (optimizer state,
#: cuBLAS handles, autotuning) must not happen inside the graph (torch's recipe uses 3)
WARMUP_STEPS = 3


# ----------------------------------------------------------------------------- batches
def _signature(batch: Any, leaves: list[torch.Tensor], device: torch.device) -> Any:
    """A comparable description of ``batch`` (its tensors appended to ``leaves``); None when
    it holds something other than CUDA tensors on ``device`` and plain constants."""
    if torch.is_tensor(batch):
        if batch.device != device or batch.requires_grad or batch.is_sparse:
            return None
        leaves.append(batch)
        return (batch.shape, batch.dtype, batch.stride())
    if isinstance(batch, (tuple, list)):
        parts = []
        for item in batch:
            sig = _signature(item, leaves, device)
            if sig is None:
                return None
            parts.append(sig)
        return (type(batch), tuple(parts))
    if isinstance(batch, dict):
        parts = []
        for key, item in batch.items():
            sig = _signature(item, leaves, device)
            if sig is None:
                return None
            parts.append((key, sig))
        return (type(batch), tuple(parts))
    if batch is None or isinstance(batch, (bool, int, float, str)):
        return ("const", type(batch), batch)  # baked into the graph: must stay equal
    return None


def _rebuild(batch: Any, tensors: Any) -> Any:
    """``batch``'s structure with its tensors taken, in order, from the iterator ``tensors``."""
    return apply_to_collection(batch, torch.Tensor, lambda _: next(tensors))


# ----------------------------------------------------------------------------- runner
def _released() -> None:
    return None


def _state_ids(state: Any) -> dict:
    """Which objects an optimizer's state holds, per parameter and key."""
    return {id(p): {k: id(v) for k, v in s.items()} for p, s in state.items()}


def _hyper(value: Any) -> Any:
    """A comparable stand-in for an optimizer hyperparameter or state value."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if torch.is_tensor(value):
        return ("tensor", id(value), value.data_ptr())
    if isinstance(value, (list, tuple)):
        return tuple(_hyper(v) for v in value)
    return ("object", type(value).__name__, id(value))


class SinkGraph:
    """Runs the sinks of one ``train`` call: eagerly, or through one captured CUDA graph.

    ``LitModel`` makes one per ``train`` call (at the first sink) and releases it when
    training ends. The rules: docs/differences.md, "Sink mode as a CUDA graph".

    Args:
        lit: the :class:`~lit_amp.model.lit_model.LitModel`.
        device: the device of the training steps.

    Example:
        >>> from lit_amp.model.lit_model import LitModel
        >>> net = nn.Linear(4, 2)
        >>> lit = LitModel(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), 0.1))
        >>> runner = SinkGraph(lit, torch.device("cpu"))
        >>> runner.status["captured"], runner.status["reason"]
        (False, 'no sink has run')
    """

    def __init__(self, lit: Any, device: torch.device) -> None:
        self._lit = lit
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", _cuda.current_device())
        self._device = device
        #: CUDA: plan again when what the graph bakes in changes (elsewhere: plan once)
        self._watch = device.type == "cuda"
        self._plan: SinkGraphPlan | None = None
        self._setting: bool | str | None = None  # lit.sink_graph when last planned
        self._fingerprint: Any = None
        self._warm = 0
        self._graph: Any = None
        self._static_leaves: list[torch.Tensor] = []
        self._static_loss: torch.Tensor | None = None
        self._static_grads: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._grads_moved = False
        self._sig: Any = None
        self._side: Any = None
        self._capture_stream: Any = None
        self._amp_states: list[Any] = []
        self._notes: list[str] = []
        self._counts = {"replayed_steps": 0, "eager_steps": 0, "captures": 0}
        self._partial = 0
        self._failed: str | None = None  # a failed capture: no other one in this train call
        self._raw: Any = None  # the torch optimizer the captured step updates

    def __reduce__(self) -> tuple:
        # a deep copy or pickle of the LitModel during training carries no graph
        return (_released, ())

    # ------------------------------------------------------------------ status
    @property
    def status(self) -> dict[str, Any]:
        """``{"captured", "reason", "replayed_steps", "eager_steps", "captures"}``.

        ``reason`` says why steps ran eagerly (empty when none did but the warm-up);
        ``eager_steps`` counts the warm-up steps too.
        """
        notes = list(self._notes)
        if self._partial:
            notes.append(f"{self._partial} batch(es) differed from the captured one in shape, "
                         "dtype or layout (such as a last partial batch) and ran eagerly")
        if self._plan is None:
            notes = notes or ["no sink has run"]
        return {"captured": self._counts["captures"] > 0, "reason": "; ".join(notes),
                **self._counts}

    def _note(self, reason: str) -> None:
        if reason and reason not in self._notes:
            self._notes.append(reason)
            log.info("Sink steps run eagerly (no CUDA graph): %s", reason)

    # ------------------------------------------------------------------ planning
    def _snapshot(self) -> Any:
        """What a captured step bakes in, beyond the batch (a change: plan and capture again)."""
        lit = self._lit
        opt = lit.optimizer
        groups = []
        if opt is not None:
            state = opt.state
            for g in opt.param_groups:
                hyper = tuple((k, _hyper(v)) for k, v in g.items() if k != "params")
                params = tuple(
                    (id(p), p.data_ptr(), p.requires_grad,
                     tuple((k, _hyper(v)) for k, v in state.get(p, {}).items()))
                    for p in g["params"]
                )
                groups.append((hyper, params))
        net = lit.network
        modes = tuple(m.training for m in net.modules())
        if isinstance(lit.loss_fn, nn.Module):
            modes += tuple(m.training for m in lit.loss_fn.modules())
        buffers = tuple((id(b), b.data_ptr()) for b in net.buffers())
        return (lit.sink_graph, id(opt), tuple(groups), modes, buffers, lit.train_step_settings)

    def _replan(self) -> None:
        self._drop_graph()
        plan = plan_sink_graph(self._lit, self._device)
        if plan.capture and self._failed is not None:
            plan = SinkGraphPlan(False, self._failed)
        if plan.capture and not self._lit.fast_path:  # the captured step is the fast path's
            plan = SinkGraphPlan(False, "Lightning's per-step wrappers are in use (not the "
                                        "single-device fast path)")
        self._plan = plan
        if not plan.capture:
            self._refuse(plan.reason)
        elif not self._amp_states:
            self._cast_every_step()

    def _refuse(self, reason: str) -> None:
        self._plan = SinkGraphPlan(False, reason)
        self._drop_graph()
        if self._lit.sink_graph is True:
            raise RuntimeError(
                "LitModel.sink_graph=True asks to capture the sink's train step as a CUDA "
                f"graph, but it cannot be captured: {reason}. Set sink_graph='auto' to train "
                "eagerly instead."
            )
        self._note(reason)

    def _cast_every_step(self) -> None:
        """AMP: no cached low-precision copies while a graph may replay (a replayed update
        bumps no version counter, which the cast cache reads)."""
        from lit_amp.amp.casting import invalidate_cast_cache

        net = self._lit.network
        for m in net.modules():
            state = m.__dict__.get("_amp_state")
            if state is not None and getattr(state, "cache_casts", False):
                state.cache_casts = False
                self._amp_states.append(state)
        if self._amp_states:
            invalidate_cast_cache(net)

    # ------------------------------------------------------------------ running
    def run(self, steps: Any) -> dict[str, Any]:
        """Train on every batch of ``steps`` (one sink); returns the last step's outputs."""
        lit = self._lit
        setting = lit.sink_graph
        # off (the default): no fingerprint of the optimizer state per sink
        snap = self._snapshot() if self._watch and setting not in (False, "off") else None
        if (self._plan is None or setting != self._setting
                or (snap is not None and snap != self._fingerprint)):
            self._setting, self._fingerprint = setting, snap
            self._replan()
        if not self._plan.capture:
            out: dict[str, Any] = {}
            n = 0
            for b in steps:
                out = lit.train_one_step(b)
                n += 1
            self._counts["eager_steps"] += n
            if snap is not None:
                self._fingerprint = self._snapshot()  # the steps may have created state
            return out
        return self._run_graph(steps)

    def _run_graph(self, steps: Any) -> dict[str, Any]:
        lit = self._lit
        raw = lit.optimizers().optimizer  # the torch optimizer the train step drives
        counts = self._counts
        out: dict[str, Any] = {}
        replayed_last = False
        for b in steps:
            if not self._plan.capture:
                out, replayed_last = lit.train_one_step(b), False
                counts["eager_steps"] += 1
                continue
            if self._graph is None and self._warm < WARMUP_STEPS:
                out, replayed_last = self._warmup_step(b), False
                counts["eager_steps"] += 1
                continue
            leaves: list[torch.Tensor] = []
            sig = _signature(b, leaves, self._device)
            if self._graph is None:
                if sig is None:
                    self._note("a batch holds values other than tensors on "
                               f"{self._device} and constants")
                    out, replayed_last = self._eager_step(b), False
                    continue
                replayed_last = self._capture(b, leaves, sig, raw)
                if not replayed_last:
                    out = self._eager_step(b)
                continue
            if sig is None or sig != self._sig:
                self._partial += 1
                out, replayed_last = self._eager_step(b), False
                continue
            for static, t in zip(self._static_leaves, leaves):
                static.copy_(t)
            self._replay()
            replayed_last = True
        if replayed_last:
            assert self._static_loss is not None
            out = {"loss": self._static_loss.clone()}
        self._fingerprint = self._snapshot()  # the step itself may have created state
        return out

    def _eager_step(self, batch: Any) -> dict[str, Any]:
        out = self._lit.train_one_step(batch)
        self._counts["eager_steps"] += 1
        if self._graph is not None:
            self._grads_moved = True  # .grad now holds this step's gradients
        return out

    def _replay(self) -> None:
        if self._grads_moved:  # .grad shows the graph's gradients again (as eager would)
            for p, g in self._static_grads:
                p.grad = g
            self._grads_moved = False
        self._lit.train_optimizer_step(self._graph.replay)  # Lightning counts the step
        self._counts["replayed_steps"] += 1

    def _warmup_step(self, batch: Any) -> dict[str, Any]:
        """One eager train step on a side stream; refuses capture if it drew random numbers."""
        dev = self._device
        if self._side is None:
            self._side = _cuda.Stream(dev)
        cur = _cuda.current_stream(dev)
        cpu_rng, cuda_rng = torch.get_rng_state(), _cuda.get_rng_state(dev)
        self._side.wait_stream(cur)
        with _cuda.stream(self._side):
            out = self._lit.train_one_step(batch)
        cur.wait_stream(self._side)
        self._warm += 1
        if not (torch.equal(cpu_rng, torch.get_rng_state())
                and torch.equal(cuda_rng, _cuda.get_rng_state(dev))):
            self._refuse("the train step draws random numbers (dropout or another random "
                         "op): a graph would not reproduce eager training")
        return out

    def _capture(self, batch: Any, leaves: list[torch.Tensor], sig: Any,
                 raw: torch.optim.Optimizer) -> bool:
        """Capture the step on ``batch`` and replay it once (that trains on ``batch``).

        Returns:
            True when the step ran by replay; False when capture failed (nothing trained).
        """
        dev = self._device
        static = [torch.empty_like(t) for t in leaves]
        if any(s.stride() != t.stride() for s, t in zip(static, leaves)):
            self._partial += 1  # an overlapping/expanded layout: no static buffer for it
            return False
        for s, t in zip(static, leaves):
            s.copy_(t)
        static_batch = _rebuild(batch, iter(static))
        if self._capture_stream is None:
            self._capture_stream = _cuda.Stream(dev)
        graph = _cuda.CUDAGraph()
        raw.zero_grad(set_to_none=True)  # the gradients are allocated in the graph's pool
        state = {p: dict(s) for p, s in raw.state.items()}
        self._raw = raw
        try:
            with _cuda.device(dev), _cuda.graph(
                graph, stream=self._capture_stream, capture_error_mode="thread_local"
            ):
                static_loss = self._captured_step(static_batch)
        except Exception as err:  # e.g. a host read (.item()) in the step
            _cuda.synchronize(dev)
            raw.zero_grad(set_to_none=True)
            self._capture_stream = None  # never capture on a stream whose capture failed
            # the step's error, not the capture_end that failed after it (its context)
            cause = err.__context__ if isinstance(err.__context__, Exception) else err
            text = str(cause).strip()
            self._failed = (f"capturing the train step failed ({type(cause).__name__}: "
                            f"{text.splitlines()[0] if text else ''}); train with "
                            "sink_graph=False or remove the host read from the step")
            self._refuse(self._failed)
            return False
        if _state_ids(raw.state) != _state_ids(state):
            # optimizer state first made inside the graph (a parameter's first gradient):
            # a replay would initialise it again at every step; the capture trained nothing,
            # so the state goes back to what it was and the step runs eagerly
            graph.reset()
            raw.zero_grad(set_to_none=True)
            raw.state.clear()
            raw.state.update(state)
            self._failed = ("the optimizer created state during the capture (a parameter "
                            "received its first gradient there, after the warm-up)")
            self._refuse(self._failed)
            return False
        self._graph, self._static_leaves, self._sig = graph, static, sig
        self._static_loss = static_loss
        self._static_grads = [(p, p.grad) for g in raw.param_groups for p in g["params"]
                              if p.grad is not None]
        self._grads_moved = False
        self._counts["captures"] += 1
        self._replay()
        return True

    def _captured_step(self, static_batch: Any) -> torch.Tensor:
        """The step the graph records: what ``LitModel.train_one_step`` does when the plan
        allows capture (no accumulation, no loss scaling, the fast path), less the host-side
        bookkeeping of ``train_optimizer_step``, which runs around every replay."""
        lit = self._lit
        raw = self._raw
        loss = lit.loss_of(static_batch)
        lit.train_backward(loss, sync=True)
        lit.clip_gradients_(raw)
        raw.step()
        return loss.detach()

    def _drop_graph(self) -> None:
        if self._graph is None:
            return
        _cuda.synchronize(self._device)
        self._graph.reset()
        self._graph = None
        self._static_leaves, self._static_loss, self._static_grads = [], None, []
        self._sig = None
        opt = self._lit.optimizer
        if opt is not None:
            opt.zero_grad(set_to_none=True)  # drop the graph pool's gradients

    def release(self) -> None:
        """Free the graph and turn the AMP cast cache back on (training ended)."""
        if self._graph is not None:
            _cuda.synchronize(self._device)
            self._graph.reset()
            self._graph = None
            self._static_leaves, self._static_loss, self._static_grads = [], None, []
        if self._amp_states:
            from lit_amp.amp.casting import invalidate_cast_cache

            for state in self._amp_states:
                state.cache_casts = True
            self._amp_states = []
            invalidate_cast_cache(self._lit.network)  # replays bumped no version counter
        self._side = self._capture_stream = None
