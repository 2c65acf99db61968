"""The model a Launch carries (controller/launches.model_pb, the workers' TESSERA_MODEL): every family
field, a registered name's included. Before, only the six dimensions went out, and LLaMA and Mixtral
jobs trained as GPT-2s of those dimensions (a live audit saw `arch=gpt2` for llama-tiny)."""

from __future__ import annotations

from types import SimpleNamespace

from tessera.clients.jobfile import load_job_file
from tessera.controller.launches import model_pb
from tessera.nodeagent.contract import model_json
from tessera.v1 import common_pb2 as P
from tests.procs import REPO


def sent(spec: P.JobSpec) -> dict[str, object]:
    import json

    got = model_pb(SimpleNamespace(spec=spec))  # type: ignore[arg-type]
    assert got is not None
    out: dict[str, object] = json.loads(model_json(got))
    return out


def test_a_llama_and_a_mixtral_job_file_keep_their_family_fields() -> None:
    llama = sent(load_job_file(REPO / "examples/jobs/llama-tiny.yaml"))
    assert (llama["gated"], llama["num_kv_heads"], llama["ffn_hidden"], llama["untied_embeddings"]) == (True, 2, 96, True)
    assert "num_experts" not in llama and "top_k" not in llama  # no routing fields for a dense model
    moe = sent(load_job_file(REPO / "examples/jobs/moe-tiny.yaml"))
    assert (moe["family"], moe["num_experts"], moe["top_k"], moe["moe_every"], moe["dropless"]) == (
        "MODEL_FAMILY_MOE", 4, 2, 1, True)


def test_a_registered_name_goes_out_with_its_dimensions_and_structure() -> None:
    m = sent(P.JobSpec(model=P.ModelSpec(name="llama3.1-8b")))
    assert (m["hidden_size"], m["num_layers"], m["gated"], m["num_kv_heads"], m["ffn_hidden"]) == (4096, 32, True, 8, 14336)


def test_a_gpt2_style_job_is_sent_as_before_plus_its_family() -> None:
    m = sent(load_job_file(REPO / "examples/jobs/tiny.yaml"))
    assert m == {"name": "", "hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 256,
                 "seq_length": 64, "family": "MODEL_FAMILY_DECODER"}
