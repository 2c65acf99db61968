"""What the estimator has learned: fitted performance models by (model key, GPU type) and measured
Cell iteration times by (Cell model signature, GPU type, GPUs, stages), each bounded.

Every new key costs memory and a row on disk, and keys come from requests: a caller that sends
model after model would otherwise grow both without end. So each map keeps its most recently used
`size` entries; the least recently used one is dropped from memory and from the state database
together (a restart brings back exactly what was kept). A dropped model is refitted from the
prior on its next report, as a model never seen; a dropped measurement falls back to the estimate.

Not thread-safe: the Estimator calls it under its own lock.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from tessera.estimator import perf_model as pm
from tessera.estimator.service.state import EstimatorState, MeasuredKey

FittedKey = tuple[str, str]  # (model key, GPU type)
MAX_FITTED = 4096
MAX_MEASURED = 65536


@dataclass(frozen=True)
class FittedModel:
    """A performance model kept under (model key, GPU type): its parameters, mode, environment and
    the samples it was first fitted on (the base of later online refits)."""

    params: pm.Params
    mode: pm.Mode
    env: pm.Environment
    samples: tuple[pm.Sample, ...] = ()


class Learned:
    def __init__(self, state: EstimatorState | None = None, max_fitted: int = MAX_FITTED,
                 max_measured: int = MAX_MEASURED) -> None:
        if max_fitted < 1 or max_measured < 1:
            raise ValueError("max_fitted and max_measured must be >= 1")
        self._state = state
        self.max_fitted = max_fitted
        self.max_measured = max_measured
        self._fitted: OrderedDict[FittedKey, FittedModel] = OrderedDict()
        self._measured: OrderedDict[MeasuredKey, float] = OrderedDict()
        if state is not None:
            fitted, measured = state.load()  # oldest write first
            for k, f in fitted.items():
                self._fitted[k] = FittedModel(*f)
            self._measured.update(measured)
            self._trim_fitted()  # a database kept under larger bounds
            self._trim_measured()

    def fitted(self, key: FittedKey) -> FittedModel | None:
        got = self._fitted.get(key)
        if got is not None:
            self._fitted.move_to_end(key)
        return got

    def put_fitted(self, key: FittedKey, model: FittedModel) -> None:
        self._fitted[key] = model
        self._fitted.move_to_end(key)
        if self._state is not None:
            self._state.put_fitted(key[0], key[1], (model.params, model.mode, model.env, model.samples))
        self._trim_fitted()

    def put_measured(self, key: MeasuredKey, seconds: float) -> list[MeasuredKey]:
        """Keep a measurement; returns the measurements dropped to make room (the Cell estimators
        holding copies forget them too)."""
        self._measured[key] = seconds
        self._measured.move_to_end(key)
        if self._state is not None:
            self._state.put_measured(key, seconds)
        return self._trim_measured()

    def measured(self) -> list[tuple[MeasuredKey, float]]:
        return list(self._measured.items())

    def num_fitted(self) -> int:
        return len(self._fitted)

    def num_measured(self) -> int:
        return len(self._measured)

    def _trim_fitted(self) -> None:
        while len(self._fitted) > self.max_fitted:
            (key, gpu), _ = self._fitted.popitem(last=False)
            if self._state is not None:
                self._state.drop_fitted(key, gpu)

    def _trim_measured(self) -> list[MeasuredKey]:
        dropped = []
        while len(self._measured) > self.max_measured:
            mkey, _ = self._measured.popitem(last=False)
            dropped.append(mkey)
            if self._state is not None:
                self._state.drop_measured(mkey)
        return dropped
