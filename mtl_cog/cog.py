"""COG in any training loop: a calibrator on any network, and the follower / leader parameter groups.

Calibration in One Go (COG, paper Sec. 3) trains a network to be accurate and calibrated in one run by
treating calibration as a Stackelberg game inside the training loop. The network f_theta is the
*follower*; a calibrator g_phi on its logits (per-task temperatures, vector or matrix scaling, the TST
head stack, or the task heads themselves for COG-FC) is the *leader*. Both minimise the same loss of the
same minibatch, L(g_phi(f_theta(x)), y), from one forward and one backward pass; only the rates differ:

    theta <- theta - lambda_f * grad_theta L        (follower)
    phi   <- phi   - lambda_c * grad_phi   L        (leader),   lambda_c < lambda_f

The leader's smaller rate lambda_c is the one extra hyperparameter: the follower adapts faster, so the
leader sees (approximately) the follower's best response, which is what makes it the leader. With
Adam or any other optimiser the two rates are two parameter groups of one optimiser, so COG costs what
standard training costs. This module is that mechanism and nothing else: it needs neither the data sets
nor the config objects, and ``mtl_cog.training`` (``fit``, ``mtl-cog train``) runs on it.

COG-TS on a 10-class network, in a loop of one's own::

    from mtl_cog import cog
    model = cog.Calibrated(net, "ts", tasks=10)            # logits / T, T learned (the leader)
    optimizer = torch.optim.Adam(cog.parameter_groups(model, lr=1e-3, leader_ratio=0.1))
    ...  loss = F.cross_entropy(model(x), y); loss.backward(); optimizer.step()

COG-FC (the heads lead; nothing is added to the network)::

    optimizer = torch.optim.Adam(cog.parameter_groups(net, lr=1e-3, leader_lr=1e-4, leader="fc"))

Logits are a tensor (one task, or several side by side: a binary task owns one column, a K-class
task K columns, as in ``mtl_cog.data.task_api.LogitLayout``) or a dict of per-task tensors.
``export`` writes the calibrated model as one ``torch.export`` file that plain torch loads.
"""

from __future__ import annotations

import difflib
import math
import numbers
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from torch import nn

from mtl_cog.data.task_api import LogitLayout
from mtl_cog.errors import CogError
from mtl_cog.models.calibrators import CALIBRATORS
from mtl_cog.models.heads import HEADS

__all__ = ["CALIBRATOR_NAMES", "Calibrated", "Probabilities", "apply_calibrator", "export", "leader_rate",
           "logit_layout", "make_calibrator", "optimizer", "parameter_groups", "split_parameters", "tst_heads"]

# The paper's short names -> the registered calibrator classes (``CALIBRATORS``; any registered name works too).
CALIBRATOR_NAMES = {"ts": "temperature", "vs": "vector", "ms": "matrix", "identity": "identity"}
TST = "tst"  # the TST head stack (Jordahn & Olmos, 2024): a leader on the features, not on the logits

Tasks = int | Sequence[int] | Mapping[str, int] | LogitLayout


def logit_layout(tasks: Tasks) -> LogitLayout:
    """Where each task's logits sit: ``10`` (one 10-class task), ``[2] * 40`` (40 binary tasks, one logit
    each), ``{"smiling": 2, "age": 5}`` (named tasks, in that order) or a ``LogitLayout``."""
    if isinstance(tasks, LogitLayout):
        return tasks
    if isinstance(tasks, Mapping):
        counts = tuple(tasks.values())
    elif isinstance(tasks, numbers.Integral) and not isinstance(tasks, bool):
        counts = (tasks,)
    elif isinstance(tasks, Sequence) and not isinstance(tasks, str):
        counts = tuple(tasks)
    else:
        raise CogError(f"tasks: give the classes per task (10, [2] * 40 or {{'task': K}}); got {tasks!r}.")
    if not counts or any(isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 2 for k in counts):
        raise CogError(f"tasks: every task needs a whole number of classes >= 2 (2 = binary, one logit); "
                       f"got {tasks!r}.")
    return LogitLayout(tuple(int(k) for k in counts))


def _describe(layout: LogitLayout) -> str:
    kinds = [f"{len(layout.binary_tasks)} binary task(s) (one logit each)"] if layout.binary_tasks else []
    kinds += [f"a {layout.num_classes[t]}-class task" for t in layout.multiclass_tasks]
    return ", ".join(kinds)


def make_calibrator(name: str | None, tasks: Tasks, **settings: object) -> nn.Module:
    """The calibrator ``name`` for ``tasks``: logits (B, L) -> logits (B, L), the identity at initialisation.

    ``"ts"``: z_t / T_t, one temperature per task; ``"vs"``: a * z + b per logit; ``"ms"``: W_t z_t + b_t per
    task (Guo et al., 2017); ``None`` or ``"identity"``: nothing (COG-FC). Any name registered in
    ``mtl_cog.models.calibrators.CALIBRATORS`` works too; ``settings`` go to its constructor.
    """
    registered = CALIBRATOR_NAMES.get(name or "identity", name)
    if registered == TST:
        raise CogError("calibrator 'tst' is a head stack on the features, not a map of logits: "
                       "use Calibrated(model, 'tst', tasks=...) on a model that returns features, or tst_heads().")
    if registered not in CALIBRATORS:
        known = [*CALIBRATOR_NAMES, TST, *CALIBRATORS.names()]
        close = difflib.get_close_matches(str(name), known, n=3, cutoff=0.5)  # two-letter names
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise CogError(f"unknown calibrator {name!r}.{hint} Known: {', '.join(dict.fromkeys(known))}, or None.")
    return CALIBRATORS.get(registered)(logit_layout(tasks), **settings)


def tst_heads(in_features: int, tasks: Tasks, latent_dim: int = 10) -> nn.Module:
    """The TST head stack per task, Linear(D, 3Z) -> ReLU -> Linear(3Z, Z) -> Linear(Z, K_t) (Jordahn &
    Olmos, 2024), batched over tasks: features (B, D) -> flat logits (B, L). As the leader it is COG-TST."""
    return HEADS.get("mlp")(in_features, logit_layout(tasks), latent_dim=latent_dim)


def _check_flat(logits: object, layout: LogitLayout, what: str) -> None:
    shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.shape[1] != layout.total:
        raise CogError(f"{what} of shape {shape} do not fit the calibrator: it expects (batch, {layout.total}) "
                       f"for {_describe(layout)}.")


def _join(logits: Mapping[str, torch.Tensor], layout: LogitLayout, names: Sequence[str] | None) -> torch.Tensor:
    """Per-task logits {task: (B,) or (B, 1) binary, (B, K)} -> flat (B, L) in the layout's task order."""
    names = list(names) if names is not None else list(logits)
    if set(logits) != set(names) or len(names) != layout.num_tasks:
        raise CogError(f"logits for tasks {sorted(logits)} do not fit the calibrator's tasks {names}.")
    blocks = []
    for t, name in enumerate(names):
        z, width = logits[name], layout.widths[t]
        fits = isinstance(z, torch.Tensor) and ((z.dim() == 1 and width == 1) or (z.dim() == 2 and z.shape[1] == width))
        if not fits:
            shape = tuple(z.shape) if isinstance(z, torch.Tensor) else type(z).__name__
            expected = "(batch,) or (batch, 1): a binary task has one logit" if width == 1 else f"(batch, {width})"
            raise CogError(f"logits of task {name!r} have shape {shape}; the calibrator expects {expected}.")
        blocks.append(z.reshape(-1, width))
    if any(b.shape[0] != blocks[0].shape[0] for b in blocks):
        raise CogError(f"the tasks' logits have different batch sizes: {[b.shape[0] for b in blocks]}.")
    return torch.cat(blocks, dim=1)


def apply_calibrator(calibrator: nn.Module, logits: torch.Tensor | Mapping[str, torch.Tensor],
                     layout: LogitLayout | None = None, names: Sequence[str] | None = None):
    """``calibrator(logits)`` with the shape checked: the calibrated logits, as a tensor or a dict like ``logits``.

    A flat tensor must be (B, L) for the calibrator's layout (``layout``, else its own ``layout``); one
    binary task may also be (B,). A dict is joined in the order of ``names`` (else its own), calibrated as
    one tensor and split back, each task keeping its shape. A calibrator without a layout (the identity)
    is applied to a tensor unchecked. ``Network.forward`` (``mtl_cog.models.network``) calls this.
    """
    layout = layout if layout is not None else getattr(calibrator, "layout", None)
    if isinstance(logits, Mapping):
        if layout is None:
            raise CogError("per-task logits (a dict) need the tasks: Calibrated(model, calibrator, tasks={...}).")
        order = list(names) if names is not None else list(logits)
        flat = calibrator(_join(logits, layout, order))
        return {name: flat[:, layout.task_slice(t)].reshape(logits[name].shape) for t, name in enumerate(order)}
    if layout is None:
        return calibrator(logits)
    if isinstance(logits, torch.Tensor) and logits.dim() == 1 and layout.total == 1:
        return calibrator(logits.unsqueeze(1)).squeeze(1)
    _check_flat(logits, layout, "logits")
    return calibrator(logits)


class Calibrated(nn.Module):
    """``calibrator(model(x))``: the calibrated network g_phi(f_theta(x)) of COG, with its leader named.

    ``calibrator``: ``"ts"``, ``"vs"``, ``"ms"`` (or any ``make_calibrator`` name, or a module of one's own)
    on the logits ``model`` returns (a tensor or a dict of per-task tensors, see ``apply_calibrator``);
    ``"tst"``: ``model`` returns features (B, D) and the TST head stack (``tst_heads``) maps them to logits;
    ``None``: no calibrator (COG-FC), ``leader`` then names the modules of ``model`` that lead.
    ``tasks``: the classes per task (``logit_layout``); a dict also names the tasks, and then dict logits
    come back as a dict. ``leader``: modules of ``model`` (``"fc"``, ``"head.fc"``) that lead besides the
    calibrator. ``leader_modules`` is what ``parameter_groups`` puts in the leader group.
    """

    def __init__(self, model: nn.Module, calibrator: str | nn.Module | None = "ts", tasks: Tasks | None = None, *,
                 leader: str | Sequence[str] = (), in_features: int | None = None, latent_dim: int = 10,
                 **settings: object) -> None:
        super().__init__()
        self.model = model
        self.task_names = list(tasks) if isinstance(tasks, Mapping) else None
        self.layout = logit_layout(tasks) if tasks is not None else getattr(calibrator, "layout", None)
        self.in_features = None
        if isinstance(calibrator, nn.Module):
            self.calibrator = calibrator
        elif calibrator == TST:
            self.in_features = in_features or getattr(model, "num_features", None)
            if self.layout is None or not self.in_features:
                raise CogError("calibrator 'tst' needs tasks=... and in_features=D (the width of the model's "
                               "features; a timm model with num_classes=0 has it as num_features).")
            self.calibrator = tst_heads(self.in_features, self.layout, latent_dim)
        elif calibrator in (None, "identity"):
            self.calibrator = make_calibrator(None, self.layout or 2)
        else:
            if self.layout is None:
                raise CogError(f"calibrator {calibrator!r} needs the tasks: tasks=10, [2] * 40 or {{'task': K}}.")
            self.calibrator = make_calibrator(calibrator, self.layout, **settings)
        named = [leader] if isinstance(leader, str) else list(leader)
        for name in named:
            _submodule(model, name)
        learns = any(p.requires_grad for p in self.calibrator.parameters())
        self.leader_modules = (["calibrator"] if learns else []) + [f"model.{name}" for name in named]
        if not self.leader_modules:
            raise CogError("nothing leads: without a calibrator (COG-FC) name the leader modules of the model, "
                           "e.g. Calibrated(net, None, leader='fc') for its classifier.")

    def forward(self, *args, **kwargs):
        out = self.model(*args, **kwargs)
        if self.in_features is None:
            return apply_calibrator(self.calibrator, out, self.layout, self.task_names)
        if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[1] != self.in_features:
            shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise CogError(f"the TST stack reads features (batch, {self.in_features}); the model returned {shape}.")
        logits = self.calibrator(out)
        if self.task_names is None:
            return logits
        return dict(zip(self.task_names, self.layout.split(logits)))


def _unwrap(model: nn.Module) -> nn.Module:
    """The module itself under ``torch.compile`` (``_orig_mod``) or DDP (``module``): names are the user's."""
    while isinstance(getattr(model, "_orig_mod", None), nn.Module) or type(model).__name__ in (
            "DistributedDataParallel", "DataParallel"):
        model = model._orig_mod if isinstance(getattr(model, "_orig_mod", None), nn.Module) else model.module
    return model


def _submodule(model: nn.Module, name: str) -> nn.Module:
    try:
        return model.get_submodule(name)
    except AttributeError:
        known = [n for n, _ in model.named_modules() if n]
        close = difflib.get_close_matches(name, known, n=3)
        hint = f"Did you mean {', '.join(close)}?" if close else f"Its modules include {', '.join(known[:8])}."
        raise CogError(f"leader {name!r}: {type(model).__name__} has no module of that name. {hint}") from None


def split_parameters(model: nn.Module, leader: str | Sequence[str]) -> dict[str, list[nn.Parameter]]:
    """{"follower": [...], "leader": [...]}: every trainable parameter of ``model`` exactly once, in
    ``model.parameters()`` order; a parameter is the leader's when it lies in a module named in ``leader``.

    Refused: a leader ``model`` does not have, a leader with no trainable parameter (frozen: it would
    never move, and the run would silently be standard training), and a parameter that a leader module
    shares with a follower module (tied weights would be in both groups, stepped at two rates).
    """
    model = _unwrap(model)
    names = [leader] if isinstance(leader, str) else list(leader)
    for name in names:
        if not any(p.requires_grad for p in _submodule(model, name).parameters()):
            raise CogError(f"leader {name!r} has no trainable parameter (frozen, or none at all): it would never "
                           "be updated. Unfreeze it (requires_grad_(True)) or name a module that learns.")
    owners: dict[int, dict[str, str]] = {}  # parameter -> {group: the first name it has in that group}
    params: dict[int, nn.Parameter] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if not param.requires_grad:
            continue
        owner = "leader" if any(name.startswith(f"{lead}.") for lead in names) else "follower"
        params.setdefault(id(param), param)
        owners.setdefault(id(param), {}).setdefault(owner, name)
    groups: dict[str, list[nn.Parameter]] = {"follower": [], "leader": []}
    for key, param in params.items():
        if len(owners[key]) > 1:
            raise CogError(f"parameter {owners[key]['leader']} is also {owners[key]['follower']}: a weight tied "
                           "between a leader and a follower module would be in both groups. Untie it, or make "
                           "both modules leaders.")
        groups[next(iter(owners[key]))].append(param)
    return groups


def leader_rate(lr: float, leader_lr: float | None = None, leader_ratio: float | None = None,
                allow_fast_leader: bool = False) -> float:
    """lambda_c, given as a rate (``leader_lr``) or as a share of the follower's lambda_f (``leader_ratio``:
    lambda_c = ratio * lambda_f). COG needs lambda_c < lambda_f (paper Sec. 3): a leader as fast as its
    follower is warned about, unless ``allow_fast_leader`` says it is meant (an ablation)."""
    if (leader_lr is None) == (leader_ratio is None):
        raise CogError("give the leader's rate as leader_lr=... or as leader_ratio=... (a share of lr), one of them.")
    rate = leader_lr if leader_lr is not None else leader_ratio * lr
    if isinstance(rate, bool) or not isinstance(rate, numbers.Real) or not math.isfinite(rate) or rate < 0:
        raise CogError(f"the leader's rate must be a finite number >= 0; got {rate!r}.")
    if rate >= lr and not allow_fast_leader:
        warnings.warn(f"leader rate {rate:g} >= follower rate {lr:g}: COG needs the leader slower than the follower "
                      "(lambda_c < lambda_f, paper Sec. 3).", UserWarning, stacklevel=3)
    return rate


def parameter_groups(model: nn.Module, lr: float, *, leader: str | Sequence[str] | None = None,
                     leader_lr: float | None = None, leader_ratio: float | None = None,
                     allow_fast_leader: bool = False) -> list[dict]:
    """The optimiser's parameter groups of COG: ``[{"name": "follower", "lr": lambda_f, ...}, {"name": "leader",
    "lr": lambda_c, ...}]``, for any ``torch.optim`` class (and any schedule, which scales both groups).

    ``leader``: module names (``split_parameters``); left out, a ``Calibrated`` model's ``leader_modules``.
    An empty ``leader`` is standard training: one group. Build the groups before ``torch.compile`` or
    ``accelerator.prepare`` or after, with the user's module names either way.
    """
    if leader is None:
        leader = getattr(_unwrap(model), "leader_modules", None)
        if leader is None:
            raise CogError(f"{type(_unwrap(model)).__name__} names no leader: pass leader='fc' (the modules that "
                           "lead), or wrap the model with Calibrated(model, 'ts', tasks=...).")
    groups = split_parameters(model, leader)
    out = [{"name": "follower", "params": groups["follower"], "lr": lr}]
    if groups["leader"]:
        rate = leader_rate(lr, leader_lr, leader_ratio, allow_fast_leader)
        out.append({"name": "leader", "params": groups["leader"], "lr": rate})
    return out


def optimizer(optimizer_class: type[torch.optim.Optimizer], model: nn.Module, lr: float, *,
              leader: str | Sequence[str] | None = None, leader_lr: float | None = None,
              leader_ratio: float | None = None, **optimizer_kwargs: object) -> torch.optim.Optimizer:
    """``optimizer_class(parameter_groups(model, lr, ...), lr=lr, **optimizer_kwargs)``, e.g.
    ``cog.optimizer(torch.optim.AdamW, model, 1e-3, leader_ratio=0.1, weight_decay=0.05)``."""
    groups = parameter_groups(model, lr, leader=leader, leader_lr=leader_lr, leader_ratio=leader_ratio)
    return optimizer_class(groups, lr=lr, **optimizer_kwargs)


class Probabilities(nn.Module):
    """``model``'s logits as probabilities per task, in float64: {task: (B,) P(y=1) for a binary task,
    (B, K) softmax otherwise}; the calibrator is inside ``model``. ``names`` default to a dict ``tasks``'s."""

    def __init__(self, model: nn.Module, tasks: Tasks, names: Sequence[str] | None = None) -> None:
        super().__init__()
        self.model, self.layout = model, logit_layout(tasks)
        given = list(names) if names is not None else list(tasks) if isinstance(tasks, Mapping) else None
        self.names = given or [f"task{t}" for t in range(self.layout.num_tasks)]

    def forward(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        out = self.model(*args, **kwargs)
        per_task = [out[n] for n in self.names] if isinstance(out, Mapping) else self.layout.split(out)
        return {name: torch.sigmoid(z.double().reshape(-1)) if width == 1 else torch.softmax(z.double(), dim=1)
                for name, z, width in zip(self.names, per_task, self.layout.widths)}


def export(model: nn.Module, path: str | Path, example_inputs: torch.Tensor | tuple) -> Path:
    """Write ``model`` (calibrator included) as one ``torch.export`` file (``.pt2``), in eval mode, any batch size.

    It loads with plain torch, without mtl_cog or timm: ``torch.export.load(path).module()(images)``.
    The file holds the traced graph and its weights, no pickled Python code. ``example_inputs`` (a
    tensor, or a tuple of the forward's inputs) fixes everything but the batch size; give two or more
    rows, since a batch of one would be traced as a constant.
    """
    model = _unwrap(model)
    inputs = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    dims = torch.export.ShapesCollection()  # by tensor, so any forward signature (``*args`` too) fits
    for x in inputs:
        if isinstance(x, torch.Tensor):
            dims[x] = {0: torch.export.Dim.DYNAMIC}  # refused at export when the model fixes it
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            program = torch.export.export(model, inputs, dynamic_shapes=dims)
    finally:
        model.train(was_training)
    _check_any_batch_size(program)
    path = Path(path)
    torch.export.save(program, path)
    return path


def _check_any_batch_size(program: torch.export.ExportedProgram) -> None:
    """Refuse a program whose inputs kept the example's batch size: it would fail on any other batch, where the user
    runs it, with only ``Guard failed: args_0.size()[0] == 2`` to go on (seen once under pytest-xdist)."""
    values = {node.name: node.meta.get("val") for node in program.graph.nodes if node.op == "placeholder"}
    for name in program.graph_signature.user_inputs:
        value = values.get(name)
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            continue
        batch = value.shape[0]
        if isinstance(batch, torch.SymInt):
            bounds = program.range_constraints.get(batch.node.expr)
            if bounds is None or bounds.lower != bounds.upper:
                continue  # a free batch size
            batch = bounds.lower
        raise CogError(f"torch.export fixed the batch size of input {name!r} to {batch}: the file would run on "
                       f"batches of that size only; export in a fresh process, or file an issue")
