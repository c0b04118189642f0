"""The metric vocabulary: a replay writes only declared keys and every declared key has a writer,
no library code spells a metric key outside ``moescope.schema``, and the docs show the table."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import moescope
from moescope import schema as S
from moescope.analyze.readers import KEY_MAP, read_log
from moescope.replay import ReplayConfig

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "moescope"
LOGS = Path(__file__).parent / "data" / "logs"
FOREIGN_TABLES = PACKAGE / "analyze" / "readers" / "keymap.py"  # other frameworks' keys are data there
BASE = {"steps": 2, "prompts_per_step": 4, "group_size": 4, "tasks": ("add2", "add3"), "lr": 1e-4}
CONFIGS = {
    "everything on": ReplayConfig(
        **BASE,
        precision="fp16",
        rollout_precision="bf16",
        aux_loss_coef=0.01,
        z_loss_coef=0.001,
        token_entropy_flow_control=True,
        min_entropy_floor=10.0,
        use_gepo=True,
        faults=("routing_mismatch@1",),
        is_correction="token",
        routing_replay=True,  # rollout/route_overlap
        is_mask=2.0,  # rollout/masked_frac
    ),
    "pivot": ReplayConfig(**BASE, pivot=True, sample_steps=2),
}


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    out = tmp_path_factory.mktemp("schema")
    return {
        name: moescope.replay("toy", c, out=out / f"{i}.jsonl") for i, (name, c) in enumerate(CONFIGS.items())
    }


def test_replay_writes_only_declared_keys(traces):
    for name, trace in traces.items():
        header_fields = {m.key for m in S.METRICS.values() if m.source in ("header", "trace")}
        assert set(trace.header) <= header_fields, (name, set(trace.header) - header_fields)
        for step in trace.steps:
            undeclared = [k for k in step if S.declared(k) is None or S.declared(k).source == "header"]
            assert not undeclared, (
                f"{name}: undeclared step keys {undeclared}; declare them in moescope/schema.py"
            )


def test_every_declared_key_has_a_writer(traces, tmp_path):
    replayed = {k for t in traces.values() for s in t.steps for k in s} | {
        k for t in traces.values() for k in t.header
    }
    labelled = tmp_path / "expert_load.log"  # layers named 3 and 12: their ids are recorded
    labelled.write_text("step=1 layer=12 expert=0 tokens=4\nstep=1 layer=3 expert=1 tokens=2\n")
    read = [
        read_log(p)
        for p in [
            *sorted(p for p in LOGS.iterdir() if p.suffix != ".md" and p.is_file()),
            *sorted((LOGS / "pasted").iterdir()),  # the pasted excerpts: what readers meet in threads
            labelled,
        ]
    ]
    from_logs = {k for t in read for s in t.steps for k in s} | {k for t in read for k in t.header}
    canonical_targets = {v for table in KEY_MAP.values() for v in table.values()}
    for m in S.METRICS.values():
        if m.source in ("replay", "trace"):
            assert any(m.matches(k) for k in replayed), f"no replay configuration writes {m.key}"
        elif m.source == "readers":
            assert m.key in from_logs | canonical_targets, f"no reader writes {m.key}"
        elif m.source == "header":
            assert m.key in replayed | from_logs, f"no trace header carries {m.key}"
        else:  # foreign: another framework's own name, which no reader renames onto
            assert m.key not in canonical_targets, f"{m.key} is canonical, not foreign"


def test_declarations_are_consistent():
    assert set(S.CANONICAL_METRICS) <= set(S.METRICS)
    assert S.declared(S.GRAD_NORM_GROUP + "routed_experts").key == "actor/grad_norm/<group>"
    assert S.declared(S.GRAD_NORM_GROUP) is None and S.declared("actor/unknown") is None
    assert S.HEADER_FIELDS[:2] == ("format", "schema_version")
    for m in S.METRICS.values():
        assert m.meaning and "\n" not in m.meaning and m.kind in S.KINDS and m.source in S.SOURCES, m


def _literals(tree: ast.AST, skip_dict_keys: bool) -> list[tuple[int, str]]:
    """String constants of a module, less docstrings (and dict keys where those are data)."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            skipped.add(id(node.value))  # docstrings and other bare strings: prose
        if skip_dict_keys and isinstance(node, ast.Dict):
            skipped |= {id(k) for k in node.keys if k is not None}
        if skip_dict_keys and isinstance(node, ast.Call) and getattr(node.func, "id", "") == "frozenset":
            skipped |= {id(n) for n in ast.walk(node) if isinstance(n, ast.Constant)}
    return [
        (n.lineno, n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skipped
    ]


def metric_literals(source: str, *, foreign_tables: bool = False) -> list[tuple[int, str]]:
    """Constants that spell a declared metric key, or start a key of a declared template."""
    keys = {m.key for m in S.METRICS.values() if m.kind not in ("field", "template")}
    prefixes = tuple(m.prefix for m in S.METRICS.values() if m.kind == "template")
    found = _literals(ast.parse(source), foreign_tables)
    return [(line, text) for line, text in found if text in keys or text.startswith(prefixes)]


def test_the_scan_finds_literals():
    planted = 'x = {"reward/mean": 1}\ny = f"actor/grad_norm/{g}"\n"""reward/mean in prose"""\n'
    assert metric_literals(planted) == [(1, "reward/mean"), (2, "actor/grad_norm/")]
    assert metric_literals(planted, foreign_tables=True) == [(2, "actor/grad_norm/")]


def test_no_metric_key_literal_outside_schema():
    hits = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "schema.py" and path.parent == PACKAGE:
            continue
        source = path.read_text(encoding="utf-8")
        hits += [
            f"{path.relative_to(ROOT)}:{line}: {text!r}"
            for line, text in metric_literals(source, foreign_tables=path == FOREIGN_TABLES)
        ]
    assert not hits, "use the moescope.schema constants instead of:\n" + "\n".join(hits)


def test_docs_table_is_generated_from_the_schema():
    """The metric vocabulary is shown by the site's reference page, generated from
    ``moescope.schema`` when the site is built (``tests/test_docs.py`` checks the built page)."""
    page = (ROOT / "docs" / "reference" / "metrics.md").read_text(encoding="utf-8")
    assert "```{moescope-metrics}" in page
    assert "| `actor/loss` |" not in (ROOT / "README.md").read_text(encoding="utf-8")
