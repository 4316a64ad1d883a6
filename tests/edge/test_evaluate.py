"""`edge eval`'s prompt schedule (--test-prompt) and phase splits (--plan) on tiny models: the prompt's rows come
from the tested decoder's prompt path (a split's prefill half), the rows after from its decode path over the
prompt's K/V, and each part is reported apart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import pytest

from edge.errors import EdgeError, PlanError
from edge.evaluate import EvalConfig, evaluate
from edge.kvcache.staging import WINDOW
from tests.tiny_models import TinySpec, write_tiny_model

pytestmark = pytest.mark.usefixtures("edge_cache")


def _cfg(**kw: Any) -> EvalConfig:
    """Against the exact graph on ORT: what the precision guards measure from."""
    return EvalConfig(reference="ort", reference_precision="exact", threads=1, **kw)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = TinySpec(arch="qwen2", weight_type=gguf.GGMLQuantizationType.Q4_1, seed=3)
    return write_tiny_model(tmp_path_factory.mktemp("eval") / "qwen2-q4_1.gguf", spec)


def test_a_split_scores_its_prompt_on_the_prefill_half_and_the_rest_on_the_decode_half(tiny: Path) -> None:
    """Prefill half exact, decode half fast: the prompt's rows are the exact graph's (KL ~0), the rows after are
    the fast half's over the exact half's K/V (int8 activations: KL > 0)."""
    plan = "prefill=openvino:cpu:exact,decode=ort:cpu:fast"
    cfg = _cfg(plan=plan, tokens=100, test_prompt=40, test_chunk=1)
    r = evaluate(str(tiny), cfg)
    assert r.prompt is not None and r.after is not None
    assert (r.metrics.tokens, r.prompt.tokens, r.after.tokens) == (100, 40, 60)
    assert r.prompt.kl_mean < 1e-6 and r.prompt.top1_agree == 1.0
    assert r.after.kl_mean > 1e-6
    out = r.to_dict()
    assert (out["backend"], out["plan"], out["test_prompt"]) == ("openvino:exact+ort", plan, 40)
    assert out["prompt"]["tokens"] == 40 and out["after"]["tokens"] == 60


def test_each_window_starts_with_its_own_prompt(tiny: Path) -> None:
    """Texts longer than the context run in windows, the KV reset between them: each window's first tokens are
    a prompt again."""
    cfg = _cfg(backend="ort", precision="exact", tokens=100, max_ctx=50, test_prompt=20)
    r = evaluate(str(tiny), cfg)
    assert r.prompt is not None and r.after is not None
    assert (r.prompt.tokens, r.after.tokens) == (40, 60)  # windows of 50 rows: 20 + 30, twice
    assert r.metrics.kl_mean < 1e-6
    plain = evaluate(str(tiny), _cfg(backend="ort", precision="exact", tokens=100))
    assert plain.prompt is None and plain.after is None and "prompt" not in plain.to_dict()


def test_a_prompt_the_split_would_not_send_to_its_prefill_half_is_refused(tiny: Path) -> None:
    cfg = _cfg(plan="prefill=openvino:cpu,decode=ort:cpu", tokens=64, test_prompt=WINDOW)
    with pytest.raises(EdgeError, match="no prompt to this split") as err:
        evaluate(str(tiny), cfg)
    assert err.value.hint == f"pass --test-prompt {WINDOW + 1} or more"


def test_pieces_the_split_would_send_to_its_prefill_half_are_refused(tiny: Path) -> None:
    """Without --test-chunk the tested decoder gets 128-token forwards: on a split those are the prefill
    half's, so "the rows after" would not be its decode path."""
    for test_prompt in (40, None):
        cfg = _cfg(plan="prefill=openvino:cpu,decode=ort:cpu", tokens=64, test_prompt=test_prompt)
        with pytest.raises(EdgeError, match="run on this split's prefill half") as err:
            evaluate(str(tiny), cfg)
        assert err.value.hint is not None and f"--test-chunk {WINDOW} or fewer" in err.value.hint


def test_the_config_is_checked_before_anything_loads() -> None:
    with pytest.raises(ValueError, match="no --backend"):
        EvalConfig(backend="ort", plan="prefill=openvino:cpu,decode=ort:cpu")
    with pytest.raises(PlanError, match="--plan"):
        EvalConfig(plan="prefill=llamacpp:cpu,decode=ort:cpu")
    with pytest.raises(ValueError, match="--test-prompt"):
        EvalConfig(tokens=64, test_prompt=64)
    with pytest.raises(ValueError, match="--test-prompt"):
        EvalConfig(test_prompt=0)
