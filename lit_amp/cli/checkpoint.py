"""Checkpoints given to ``lit-amp`` by ``ckpt_path=``: strict loading and resumable training.

There is one checkpoint format: lit_amp's files (``ModelCheckpoint``,
``BackupAndRestore``, :func:`lit_amp.save_checkpoint`) are Lightning checkpoints
(``{"state_dict", "optimizer_states", "loops", ...}`` plus ``append_info`` and the loss scale),
so ``lit-amp`` reads them exactly as Lightning's own (``Trainer.save_checkpoint`` / Lightning's
``ModelCheckpoint`` of a ``LitModel`` or of your own LightningModule). Files are read with
``torch.load(weights_only=True)``, so a file
from elsewhere cannot run code, and seen through :func:`lit_amp.serialization.checkpoint_views`
(``"network"``, ``"optimizer"``, ``"loss_scale"``, ``"append_info"``). Parameter names may carry
the attribute path of the network (``network.``, ``lit_model.network.``, ``model.`` ...):
:func:`network_state` finds that prefix by matching the network's own names.

Loading is strict: a checkpoint that does not hold every parameter of the network (or holds
parameters of another shape) is an error naming the file and the first missing keys, never a
network that silently keeps its random initialisation.

Resuming (``mode=train ckpt_path=...``) needs the optimizer state and the number of finished
epochs: ``append_info``'s ``epoch_num`` (``lit-amp``'s ``CheckpointConfig`` keeps
``append_info: [epoch_num, step_num]``), else Lightning's ``loops`` (an epoch whose last batch
was done counts as finished). A file written in the middle of an epoch is refused.

Example:
    >>> import torch
    >>> net = torch.nn.Linear(2, 1)
    >>> sd = {"lit_model.network.weight": torch.ones(1, 2), "lit_model.network.bias": torch.ones(1)}
    >>> sorted(network_state(sd, net, "x.ckpt"))
    ['bias', 'weight']
"""

from __future__ import annotations

import dataclasses

import lightning as L
import torch

from lit_amp.cli.precheck import check_checkpoint_file
from lit_amp.cli.schema import ConfigError
from lit_amp.serialization import checkpoint_views
from lit_amp.serialization import network_state as _network_state

__all__ = [
    "Resume",
    "ResumeCallback",
    "load_network",
    "network_state",
    "read_checkpoint",
    "resume_state",
]


def read_checkpoint(path: str) -> dict:
    """``torch.load`` a checkpoint safely (tensors and plain containers only).

    Args:
        path: the ``.ckpt`` file.

    Returns:
        The checkpoint dict with the derived views (:func:`lit_amp.serialization.checkpoint_views`).

    Raises:
        ConfigError: the file is missing, a directory, empty, truncated or not in torch's
            format (:func:`lit_amp.cli.precheck.check_checkpoint_file`), unreadable without
            unpickling code, or not a dict.
    """
    check_checkpoint_file(path)  # missing, a directory, empty, truncated, not torch's format
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - pickle errors of any kind
        first = (str(exc).strip().splitlines() or ["no message"])[0]  # EOFError() has none
        raise ConfigError(
            f"lit-amp: ckpt_path={path!r} could not be read as a checkpoint of tensors "
            f"({type(exc).__name__}: {first}). lit-amp never unpickles "
            "arbitrary objects; save the weights with lit_amp.save_checkpoint or Lightning."
        ) from exc
    if not isinstance(state, dict):
        raise ConfigError(f"lit-amp: ckpt_path={path!r} does not hold a checkpoint dict.")
    return checkpoint_views(state)


def _raw_weights(state: dict) -> dict:
    for key in ("network", "state_dict"):
        if isinstance(state.get(key), dict):
            return state[key]
    if state and all(torch.is_tensor(v) for v in state.values()):
        return state  # a bare state dict
    return {}


def network_state(weights: dict, network: torch.nn.Module, path: str) -> dict:
    """The entries of ``weights`` that belong to ``network``, under the network's own names.

    The prefix (``""``, ``network.``, ``lit_model.network.``, ...) is the one under which the
    most of ``network``'s names are found (:func:`lit_amp.serialization.network_state`).

    Args:
        weights: a state dict (lit_amp's ``network`` or Lightning's ``state_dict``).
        network: the network to load.
        path: the file, for messages.

    Returns:
        ``{name: tensor}`` with exactly the prefix removed.

    Raises:
        ConfigError: no prefix matches any parameter of the network, or two prefixes match
            equally well with different values.
    """
    try:
        return _network_state(weights, network, repr(path))
    except ValueError as exc:
        raise ConfigError(
            f"lit-amp: ckpt_path={path!r}: {str(exc).removeprefix('load_checkpoint: ')} Check "
            "model=... matches the model that wrote the file."
        ) from exc


def load_network(path: str, network: torch.nn.Module, state: dict | None = None) -> dict:
    """Load the network's weights from ``path`` strictly (every parameter, matching shapes).

    Args:
        path: the ``.ckpt`` file (lit_amp's or Lightning's).
        network: the network to load into.
        state: the already-read checkpoint (None: read ``path``).

    Returns:
        The checkpoint dict.

    Raises:
        ConfigError: the file cannot be read, or its weights do not fit the network (the
            message names the first missing / unexpected keys).
    """
    state = read_checkpoint(path) if state is None else state
    sd = network_state(_raw_weights(state), network, path)
    own = network.state_dict()
    missing = sorted(set(own) - set(sd))
    unexpected = sorted(set(sd) - set(own))
    shapes = [k for k in own if k in sd and tuple(sd[k].shape) != tuple(own[k].shape)]
    if missing or unexpected or shapes:
        raise ConfigError(
            f"lit-amp: ckpt_path={path!r} does not fit the network {type(network).__name__}: "
            f"missing keys {missing[:5]}, unexpected keys {unexpected[:5]}, other shapes "
            f"{shapes[:5]}. Use the model=... options the checkpoint was trained with."
        )
    network.load_state_dict(sd, strict=True)
    return state


@dataclasses.dataclass
class Resume:
    """What a resumable checkpoint holds besides the weights.

    Attributes:
        epoch: finished epochs (training continues with epoch ``epoch + 1``).
        optimizer: the optimizer's ``state_dict``.
        loss_scale: the loss-scale manager's state (None when the file has none).
    """

    epoch: int
    optimizer: dict
    loss_scale: dict | None


def _lightning_epochs(path: str, state: dict, hint: str) -> int | None:
    """Finished epochs by Lightning's ``loops``; an epoch whose last batch is done counts."""
    try:
        fit = state["loops"]["fit_loop"]
        epochs = fit["epoch_progress"]["current"]
        done = int(epochs["completed"])
        batches = fit["epoch_loop.batch_progress"]
        current = batches["current"]
    except (KeyError, TypeError, ValueError):
        return None
    if int(epochs["started"]) > done and int(current["processed"]) > 0:
        if not (batches.get("is_last_batch") and current["processed"] == current["ready"]):
            raise ConfigError(
                f"lit-amp: ckpt_path={path!r} was saved in the middle of an epoch (batch "
                f"{current['processed']} of epoch {done + 1}); resuming would train part of "
                f"that epoch twice. {hint}")
        done += 1  # saved at the end of the epoch's last batch (lit_amp's ModelCheckpoint)
    return done


def resume_state(path: str, state: dict, steps_per_epoch: int | None) -> Resume:
    """The epoch, optimizer and loss-scale state to resume training from.

    Args:
        path: the file, for messages.
        state: the checkpoint dict (:func:`read_checkpoint`'s; any raw dict is viewed too).
        steps_per_epoch: training steps per epoch (checks that the file ends an epoch).

    Returns:
        A :class:`Resume`.

    Raises:
        ConfigError: the file is not resumable (no optimizer state, no epoch, or written in
            the middle of an epoch: resuming would train part of that epoch's data twice).
    """
    hint = ("Resume from a checkpoint written by lit-amp's callbacks (they store epoch_num and "
            "the optimizer) or by Lightning at an epoch end; to evaluate it use mode=eval.")
    state = checkpoint_views(state)  # a bare state dict (weights only) has no views
    info = state.get("append_info") or {}
    if "epoch_num" in info:
        epoch: int | None = int(info["epoch_num"])
        step = info.get("step_num")
        if step and steps_per_epoch and int(step) % steps_per_epoch:
            raise ConfigError(
                f"lit-amp: ckpt_path={path!r} was saved in the middle of an epoch (step "
                f"{step}, {steps_per_epoch} steps per epoch); resuming would train part of "
                f"that epoch twice. {hint}"
            )
    else:
        epoch = _lightning_epochs(path, state, hint)
    optimizer, ls = state.get("optimizer"), state.get("loss_scale")
    if epoch is None or optimizer is None:
        what = "count of finished epochs" if epoch is None else "optimizer state"
        raise ConfigError(f"lit-amp: ckpt_path={path!r} is not a resumable checkpoint: it "
                          f"holds no {what}. {hint}")
    return Resume(epoch, optimizer, ls if isinstance(ls, dict) else None)


class ResumeCallback(L.Callback):
    """Loads a :class:`Resume`'s optimizer and loss-scale state once training has started.

    At ``on_train_start`` the optimizer lives on its device and the AMP level (which creates the
    loss-scale controller) has been applied, so the state lands where training uses it.

    Args:
        resume: what to load.

    Example:
        >>> ResumeCallback(Resume(3, {}, None)).resume.epoch
        3
    """

    def __init__(self, resume: Resume) -> None:
        self.resume = resume

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Load the optimizer state (and the loss scale) into the running objects."""
        trainer.optimizers[0].load_state_dict(self.resume.optimizer)
        controller = getattr(pl_module, "loss_scale", None)
        if controller is not None and self.resume.loss_scale is not None:
            controller.load_state_dict(self.resume.loss_scale)
