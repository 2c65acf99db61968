"""`python -m tessera.estimator.torch.realtrace --model NAME | --dims JSON --plan JSON [--stack S]
[--stage N] [-o json|text]`: trace one rank on real model code and print the RealTrace.

Without --stage the first and last pipeline stages are traced and the larger peak printed. A bad
model or plan exits 2 with the PlanInputError (field and reason) on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys

from tessera.estimator.models import ModelDims, registered
from tessera.estimator.plans import ExecutionPlan, PlanInputError
from tessera.estimator.torch.realtrace import STACKS, trace_real, trace_real_peak


def _load(text: str) -> dict[str, object]:
    """A JSON object given inline or as @path."""
    if text.startswith("@"):
        with open(text[1:]) as f:
            text = f.read()
    value = json.loads(text)
    if not isinstance(value, dict):
        raise TypeError("expected a JSON object")
    return value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tessera.estimator.torch.realtrace",
                                 description="Trace one rank's training step on real model code (fake tensors).")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="a registered model name")
    src.add_argument("--dims", help="ModelDims fields as a JSON object (or @file.json)")
    ap.add_argument("--plan", default="{}", help="ExecutionPlan fields as a JSON object (or @file.json)")
    ap.add_argument("--stack", default="auto", choices=STACKS)
    ap.add_argument("--stage", type=int, default=None, help="one pipeline stage (default: the max of first and last)")
    ap.add_argument("-o", "--output", default="text", choices=("text", "json"))
    args = ap.parse_args(argv)
    try:
        if args.model:
            found = registered(args.model)
            if found is None:
                raise PlanInputError("model", f"{args.model!r} is not a registered model")
            model = found
        else:
            model = ModelDims(**_load(args.dims))  # type: ignore[arg-type]
        plan = ExecutionPlan.from_dict(_load(args.plan))
        tr = trace_real_peak(model, plan, stack=args.stack) if args.stage is None else \
            trace_real(model, plan, stack=args.stack, stage=args.stage)
    except (PlanInputError, TypeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.output == "json":
        print(json.dumps(tr.to_dict()))
    else:
        gib = 1024**3
        for k in ("parameters", "gradients", "optimizer", "activations", "other", "peak"):
            print(f"{k:12s} {getattr(tr, k) / gib:10.3f} GiB {getattr(tr, k):16d} B")
        print(f"stack {tr.stack}, stage {tr.detail.get('stage')}, {tr.detail.get('seconds')} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
