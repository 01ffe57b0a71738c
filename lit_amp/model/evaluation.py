"""``LitModel``'s evaluation passes: MindSpore's eval network, metrics and mean eval loss.

A pass is :meth:`~EvaluationMixin.begin_eval` (reset), :meth:`~EvaluationMixin.eval_step` per
batch (the eval network's outputs update the metrics through ``eval_indexes``) and
:meth:`~EvaluationMixin.end_eval` (compute, reduce the loss over the ranks, log). Lightning's
validation and test epochs run it; so do loops that evaluate outside a Trainer epoch
(``RecModel.online_train``'s held-out window). Under DDP the samples a padding sampler
repeats are not counted (:func:`~lit_amp.model.rank_placement.padding_trim`); under FSDP2 the
parameters stay gathered for the whole pass.
"""

from __future__ import annotations

from typing import Any

import torch

from lit_amp.metrics import metric_value_to_python, update_metrics
from lit_amp.metrics.aggregation import Loss
from lit_amp.model._lightning import mean_over_ranks
from lit_amp.model.data_checks import as_batch_tuple
from lit_amp.model.rank_placement import NO_BATCH, padding_trim
from lit_amp.model.sharding import gathered

__all__ = ["EvaluationMixin"]


class EvaluationMixin:
    """``LitModel``'s evaluation hooks and passes (mixed into the LightningModule)."""

    def on_validation_epoch_start(self) -> None:
        self._broadcast_buffers()
        self._gather_for_eval()
        self.begin_eval()
        # a DistributedSampler (Lightning's or the user's) repeats samples to pad the ranks
        self.__dict__["_eval_trim"] = padding_trim(self.trainer.val_dataloaders)

    def on_test_epoch_start(self) -> None:
        self._gather_for_eval()
        self.begin_eval()
        self.__dict__["_eval_trim"] = padding_trim(self.trainer.test_dataloaders)

    def on_predict_epoch_start(self) -> None:
        self._gather_for_eval()

    def on_predict_epoch_end(self) -> None:
        self._release_eval_gather()

    def _gather_for_eval(self) -> None:
        """FSDP2: parameters gathered for the whole pass (ranks may see unequal batches)."""
        self._release_eval_gather()
        ctx = gathered(self.network)
        ctx.__enter__()
        self.__dict__["_eval_gather"] = ctx

    def _release_eval_gather(self) -> None:
        ctx = self.__dict__.pop("_eval_gather", None)
        if ctx is not None:
            ctx.__exit__(None, None, None)

    def begin_eval(self) -> None:
        """Start an evaluation pass: reset the metrics and the running eval loss.

        Lightning calls it at the start of each validation/test epoch; loops that evaluate
        outside a Trainer epoch (``RecModel.online_train``'s held-out window) call it, then
        :meth:`eval_step` per batch, then :meth:`end_eval`.

        Raises:
            ValueError: the model has no metrics.

        Example:
            >>> from torch import nn
            >>> from lit_amp import LitModel
            >>> net = nn.Linear(4, 3)
            >>> lit = LitModel(net, nn.CrossEntropyLoss(), metrics={"acc"})
            >>> lit.begin_eval()
            >>> _ = lit.eval_step((torch.randn(4, 4), torch.tensor([0, 1, 2, 0])))
            >>> lit.end_eval()
            >>> sorted(lit.last_eval_results["metrics"])
            ['acc']
        """
        if not self.metric_fns:
            raise ValueError(
                "Evaluation needs 'metrics': construct the model with metrics={...} "
                "(for example {'acc'})."
            )
        for m in self.metric_fns.values():
            m.reset()
        self._eval_loss_sum = None
        self._eval_loss_n = 0

    def eval_step(self, batch: Any) -> Any:
        """Run the eval network on one batch, update the metrics; returns the raw outputs."""
        assert self._eval_network is not None
        inputs = as_batch_tuple(batch, expect_pair=False)
        outputs = self._eval_network(*inputs)
        update_metrics(self.metric_fns, outputs, self.eval_indexes)
        if self.eval_indexes is not None:
            loss = outputs[self.eval_indexes[0]]
            if torch.is_tensor(loss):
                loss = loss.detach().float().mean()
                self._eval_loss_sum = (
                    loss if self._eval_loss_sum is None else self._eval_loss_sum + loss
                )
                self._eval_loss_n += 1
        return outputs

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        return self._eval_batch(batch, batch_idx)

    def test_step(self, batch: Any, batch_idx: int) -> Any:
        return self._eval_batch(batch, batch_idx)

    def _eval_batch(self, batch: Any, batch_idx: int) -> Any:
        """One evaluation step; the samples a padding sampler repeated are not counted."""
        trim = self.__dict__.get("_eval_trim")
        if trim is not None and batch is not NO_BATCH:
            batch = trim(batch, batch_idx)
        return None if batch is NO_BATCH else self.eval_step(batch)

    def end_eval(self, prefix: str = "") -> None:
        """Finish an evaluation pass: compute the metrics and the mean eval loss.

        The mean loss is reduced over the ranks under DDP (every rank takes part, also one
        that evaluated no batch). Scalar results are logged (``prefix`` + name) when attached
        to a Trainer -- a ``Loss`` metric (``metrics={"loss"}``) is the mean eval loss by
        construction, so it is logged once, as ``eval_loss`` -- and all results land in
        ``last_eval_results`` (``{"metrics": {...}, "eval_loss": float | None}``).

        Args:
            prefix: prepended to the logged names.
        """
        results: dict[str, Any] = {}
        for name, m in self.metric_fns.items():
            results[name] = metric_value_to_python(m.compute())
        trainer = self.trainer if self._trainer is not None else None
        eval_loss = mean_over_ranks(trainer, self._eval_loss_sum, self._eval_loss_n)
        scalars = {k: v for k, v in results.items() if isinstance(v, float)}
        if eval_loss is not None:
            # Loss: Σ_k mean(loss_k) / n_batches of outputs[eval_indexes[0]], as eval_loss
            for k, m in self.metric_fns.items():
                if type(m) is Loss:
                    scalars.pop(k, None)
            scalars["eval_loss"] = eval_loss
        if scalars and self._trainer is not None:
            self.log_dict({f"{prefix}{k}": v for k, v in scalars.items()}, sync_dist=False)
        self.last_eval_results = {"metrics": results, "eval_loss": eval_loss}

    def on_validation_epoch_end(self) -> None:
        self._release_eval_gather()
        self.end_eval("val/")

    def on_test_epoch_end(self) -> None:
        self._release_eval_gather()
        self.end_eval("test/")
