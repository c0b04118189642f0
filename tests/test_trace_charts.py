"""Trace charts (``trace_board``, ``entropy_flow``) through ``to_dict()``, and their widgets.

Real traces come from the ``toy_trace`` fixture (a 6-step replay with a NaN at step 3);
synthetic ones are built by hand for what a short replay does not show (infinities, nulls,
100,000 steps).
"""

from __future__ import annotations

import json
import math

import ipywidgets.embed
import numpy as np
import pytest
import traitlets

from moescope.analyze.findings import Finding
from moescope.display import charts
from moescope.display.charts import entropy_flow, trace_board
from moescope.display.charts._panels import EDGE_INSET
from moescope.display.charts._series import OFF_SCALE
from moescope.display.charts.entropy import FLOW_WIDTH
from moescope.display.charts.traces import BOARD_COLUMNS, PANEL_SIZE
from moescope.display.widgets import EntropyFlow, TraceBoard
from moescope.errors import MoescopeError
from moescope.schema import ACTOR_LOSS, ENTROPY, GRAD_NORM, KL, LOAD_CV, REWARD_MEAN, TOKEN_ENTROPY
from moescope.traces import Trace

BUCKETS = [[0, 1], [1, 2], [2, 4], [4, 8], [8, 16], [16, None]]


def _trace(steps: dict[int, dict], **header) -> Trace:
    return Trace(header={"model": "synthetic", **header}, steps=[{"step": s, **m} for s, m in steps.items()])


def _token_entropy(means, tokens=(4, 4, 8, 16, 32, 0)) -> dict:
    return {"position_buckets": BUCKETS, "bucket_mean": list(means), "bucket_tokens": list(tokens)}


def _long_trace(n: int, seed: int = 0, **header) -> Trace:
    """``n`` steps of noisy metrics with a gradient spike at ``n // 2`` and a NaN loss at ``n // 3``."""
    rng = np.random.default_rng(seed)
    columns = {key: rng.normal(1.0, 0.05, n).tolist() for key in charts.DEFAULT_METRICS}
    steps = {i: {key: values[i] for key, values in columns.items()} for i in range(n)}
    steps[n // 2][GRAD_NORM] = 1e6
    steps[n // 3][ACTOR_LOSS] = math.nan
    return _trace(steps, **header)


def _panels(spec: dict) -> dict[str, list[dict]]:
    """Each panel's layers, keyed by the metric in its subtitle."""
    return {p["title"]["subtitle"].split(" · ")[0]: _layers(p) for p in spec["concat"]}


def _layers(panel: dict) -> list[dict]:
    """A layered panel's layers, each with its data (altair lifts data shared by all layers)."""
    return [{"data": panel.get("data"), **layer} for layer in panel["layer"]]


def _rows(spec: dict, layer: dict) -> list[dict]:
    """A layer's data; packed rows flattened back (as the chart's flatten transform does)."""
    rows = spec["datasets"][layer["data"]["name"]]
    if isinstance(rows, str):  # a trace's points travel as one JSON string
        rows = json.loads(rows)
    flat = []
    for row in rows:
        lists = [k for k, v in row.items() if isinstance(v, list)]
        if not lists:
            flat.append(row)
            continue
        flat += [{**row, **{k: row[k][i] for k in lists}} for i in range(len(row[lists[0]]))]
    return flat


def _layer(layers: list[dict], mark: str, **encoding_values) -> list[dict]:
    return [
        layer
        for layer in layers
        if layer["mark"]["type"] == mark
        and all(layer["encoding"].get(k, {}).get("value") == v for k, v in encoding_values.items())
    ]


def _json(spec: dict) -> str:
    return json.dumps(spec, allow_nan=False)  # NaN/Inf must never reach the spec


# ----------------------------------------------------------------------------------- trace board


def test_board_draws_one_panel_per_metric_with_a_shared_step_zoom(toy_trace) -> None:
    spec = trace_board(toy_trace).to_dict()
    panels = _panels(spec)
    assert list(panels) == list(charts.DEFAULT_METRICS)
    assert spec["resolve"]["scale"]["x"] == "shared" and spec["columns"] == BOARD_COLUMNS
    (zoom,) = spec["params"]
    assert zoom == {
        "name": charts.ZOOM,
        "select": {"type": "interval", "encodings": ["x"]},
        "bind": "scales",
        "views": [f"panel_{i}" for i in range(6)],
    }
    for metric, layers in panels.items():
        line = layers[0]
        assert line["mark"]["type"] == "line" and line["mark"]["clip"]
        assert line["data"]["format"] == {"type": "json"}, "points travel as one JSON string"
        assert (line["encoding"]["x"]["field"], line["encoding"]["y"]["field"]) == ("step", "value")
        log = line["encoding"]["y"]["scale"].get("type") == "log"
        assert log == (metric == GRAD_NORM), metric
        steps = [row["step"] for row in _rows(spec, line)]
        assert steps == list(range(6)), metric
    assert spec["title"]["text"] == "Replay trace · original"
    _json(spec)


def test_a_nan_step_breaks_the_line_and_is_marked_on_the_top_edge(toy_trace) -> None:
    spec = trace_board(toy_trace).to_dict()
    for metric in (ACTOR_LOSS, GRAD_NORM, ENTROPY, KL):
        layers = _panels(spec)[metric]
        line = {row["step"]: row["value"] for row in _rows(spec, layers[0])}
        assert line[3] is None and line[4] is not None, metric
        (top,) = _layer(layers, "point", y=EDGE_INSET)
        assert [(r["step"], r["flag"]) for r in _rows(spec, top)] == [(3, "NaN")], metric
        assert top["encoding"]["shape"]["scale"]["domain"] == list(OFF_SCALE)
    reward = _panels(spec)[REWARD_MEAN]
    assert not _layer(reward, "point"), "the reward stayed finite: no markers"


def test_infinities_nulls_and_absent_steps() -> None:
    trace = _trace(
        {
            0: {ACTOR_LOSS: 1.0},
            1: {ACTOR_LOSS: math.inf},
            2: {ACTOR_LOSS: None},
            3: {},
            4: {ACTOR_LOSS: -math.inf},
            5: {ACTOR_LOSS: 2.0},
        }
    )
    spec = trace_board(trace, metrics=[ACTOR_LOSS]).to_dict()
    layers = _panels(spec)[ACTOR_LOSS]
    assert [(r["step"], r["value"]) for r in _rows(spec, layers[0])] == [
        (0, 1.0),
        (1, None),
        (4, None),
        (5, 2.0),
    ]
    (top,) = _layer(layers, "point", y=EDGE_INSET)
    (bottom,) = _layer(layers, "point", y=PANEL_SIZE[1] - EDGE_INSET)
    assert [(r["step"], r["flag"], r["raw"]) for r in _rows(spec, top)] == [(1, "+Inf", "inf")]
    assert [(r["step"], r["flag"], r["raw"]) for r in _rows(spec, bottom)] == [(4, "-Inf", "-inf")]
    _json(spec)


def test_log_scale_puts_zero_gradient_norms_on_the_bottom_edge(toy_trace) -> None:
    assert toy_trace.steps[0][GRAD_NORM] == 0.0
    spec = trace_board(toy_trace, metrics=[GRAD_NORM, ACTOR_LOSS]).to_dict()
    grad = _panels(spec)[GRAD_NORM]
    (bottom,) = _layer(grad, "point", y=PANEL_SIZE[1] - EDGE_INSET)
    assert [(r["step"], r["flag"]) for r in _rows(spec, bottom)] == [(0, "≤ 0")]
    assert _rows(spec, grad[0])[0]["value"] is None
    loss = _panels(spec)[ACTOR_LOSS]
    assert _rows(spec, loss[0])[0] == {"model": "original", "step": 0, "value": 0.0}, (
        "linear: zero is a value"
    )


def test_findings_are_rules_on_the_panels_they_concern(toy_trace) -> None:
    findings = [
        Finding("grad_spike", 1, "warning", "gradient norm 8.5 at step 1"),
        Finding("nonfinite", 3, "error", "NaN loss at step 3"),
        Finding("no_signal", None, "info", "the log does not say when"),
    ]
    spec = trace_board(toy_trace, findings=findings).to_dict()
    for metric, layers in _panels(spec).items():
        (rules,) = _layer(layers, "rule")
        rows = _rows(spec, rules)
        expected = [1, 3] if metric == GRAD_NORM else [3]
        assert [r["step"] for r in rows] == expected, metric
        assert {t["field"] for t in rules["encoding"]["tooltip"]} >= {"type", "severity", "message"}
        assert rules["encoding"]["stroke"]["scale"]["domain"] == ["info", "warning", "error"]
    grad_rows = _rows(spec, _layer(_panels(spec)[GRAD_NORM], "rule")[0])
    assert grad_rows[0]["message"] == "gradient norm 8.5 at step 1" and grad_rows[0]["type"] == "grad_spike"


def test_proxy_overlay_in_a_second_colour_and_dash(toy_trace) -> None:
    proxy = Trace(header={**toy_trace.header, "proxy": {"keep": 0.5}}, steps=toy_trace.steps[:4])
    findings = [Finding("nonfinite", 3, "error", "NaN")]
    spec = trace_board(toy_trace, proxy, findings=findings, proxy_findings=findings).to_dict()
    assert spec["title"]["text"] == "Replay trace · original vs proxy"
    line = _panels(spec)[ACTOR_LOSS][0]
    colour = line["encoding"]["color"]
    assert colour["scale"] == {"domain": ["original", "proxy"], "range": list(charts.MODEL_COLOURS)}
    assert line["encoding"]["strokeDash"]["scale"]["range"] == [[1, 0], [5, 3]]
    rows = _rows(spec, line)
    assert [r["step"] for r in rows if r["model"] == "proxy"] == [0, 1, 2, 3]
    (rules,) = _layer(_panels(spec)[ACTOR_LOSS], "rule")
    assert sorted(r["model"] for r in _rows(spec, rules)) == ["original", "proxy"]
    assert rules["encoding"]["strokeDash"]["field"] == "model"


def test_labels_from_headers_or_given() -> None:
    steps = {0: {ACTOR_LOSS: 1.0}}
    first, second = _trace(steps, model="/ckpt/qwen-a"), _trace(steps, model="/ckpt/qwen-b")
    domain = lambda spec: _panels(spec)[ACTOR_LOSS][0]["encoding"]["color"]["scale"]["domain"]  # noqa: E731
    assert domain(trace_board(first, second, metrics=[ACTOR_LOSS]).to_dict()) == ["qwen-a", "qwen-b"]
    same = trace_board(first, first, metrics=[ACTOR_LOSS]).to_dict()
    assert domain(same) == ["original", "proxy"]
    named = trace_board(first, second, metrics=[ACTOR_LOSS], labels=("fp32", "bf16")).to_dict()
    assert domain(named) == ["fp32", "bf16"] and named["title"]["text"].endswith("fp32 vs bf16")


def test_a_metric_neither_trace_logged_says_so() -> None:
    spec = trace_board(_trace({0: {ACTOR_LOSS: 1.0}}), metrics=[ACTOR_LOSS, LOAD_CV]).to_dict()
    (note,) = _layer(_panels(spec)[LOAD_CV], "text")
    assert _rows(spec, note) == [{"note": "no moe/load_cv in this trace"}]
    assert not _layer(_panels(spec)[ACTOR_LOSS], "text")


def test_board_refuses_what_it_cannot_draw(toy_trace) -> None:
    with pytest.raises(MoescopeError, match="at least one metric"):
        trace_board(toy_trace, metrics=[])
    with pytest.raises(MoescopeError, match="without a proxy trace"):
        trace_board(toy_trace, proxy_findings=[Finding("nonfinite", 3, "error", "NaN")])


def test_downsampling_keeps_spikes_and_nonfinite_points_within_the_bound() -> None:
    n, max_points = 100_000, 2000
    trace = _long_trace(n)
    trace.steps[70_000][ACTOR_LOSS] = -5.0  # a dip, one step long
    for step in range(80_000, 80_050):
        trace.steps[step][ACTOR_LOSS] = math.inf
    spec = trace_board(trace, metrics=[ACTOR_LOSS, GRAD_NORM], max_points=max_points).to_dict()
    loss = _panels(spec)[ACTOR_LOSS]
    line = _rows(spec, loss[0])
    finite = [r for r in line if r["value"] is not None]
    assert len(finite) <= max_points and len(line) < 2 * max_points
    assert min(r["value"] for r in finite) == -5.0, "the one-step dip survives"
    (top,) = _layer(loss, "point", y=EDGE_INSET)
    marked = [(r["step"], r["flag"]) for r in _rows(spec, top)]
    assert (n // 3, "NaN") in marked and (80_000, "+Inf") in marked
    assert len(marked) <= 3, "one marker per kind and bucket of steps"
    grad = _rows(spec, _panels(spec)[GRAD_NORM][0])
    assert max(r["value"] for r in grad) == 1e6 and len(grad) <= max_points
    assert not loss[0]["mark"]["point"], "no per-point symbols on a long line"
    assert any("reduced" in line for line in spec["title"]["subtitle"])


def test_short_series_are_not_reduced(toy_trace) -> None:
    spec = trace_board(toy_trace, max_points=6).to_dict()
    assert len(_rows(spec, _panels(spec)[ACTOR_LOSS][0])) == 6
    assert not any("reduced" in line for line in spec["title"]["subtitle"])


def test_a_100k_step_board_of_two_traces_stays_compact() -> None:
    """The spec size is bounded by the downsampling, not the trace (timings: bench/charts.py)."""
    original, proxy = _long_trace(100_000), _long_trace(100_000, seed=1, proxy={"keep": 0.25})
    text = trace_board(original, proxy).to_json()
    compact = json.dumps(json.loads(text), separators=(",", ":"))
    assert len(compact) < 500_000, f"{len(compact)} bytes"


def test_step_range_redraws_only_those_steps(toy_trace) -> None:
    findings = [Finding("nonfinite", 3, "error", "NaN"), Finding("grad_spike", 1, "warning", "spike")]
    spec = trace_board(toy_trace, findings=findings, step_range=(2, 4)).to_dict()
    layers = _panels(spec)[GRAD_NORM]
    assert [r["step"] for r in _rows(spec, layers[0])] == [2, 3, 4]
    assert [r["step"] for r in _rows(spec, _layer(layers, "rule")[0])] == [3]


def test_the_board_renders(toy_trace) -> None:
    import vl_convert

    svg = vl_convert.vegalite_to_svg(
        trace_board(toy_trace, findings=[Finding("nonfinite", 3, "error", "x")]).to_dict()
    )
    assert svg.count('aria-roledescription="line mark"') == 6
    assert "gradient norm" in svg and "off the scale" in svg


# ---------------------------------------------------------------------------------- entropy flow


def test_entropy_flow_heatmap_over_the_mean_line(toy_trace) -> None:
    spec = entropy_flow(toy_trace).to_dict()
    heat_layers, line_layers = (_layers(panel) for panel in spec["vconcat"])
    heat = heat_layers[0]
    assert heat["mark"]["type"] == "rect"
    assert (heat["encoding"]["x"]["field"], heat["encoding"]["x2"]["field"]) == ("start", "end")
    assert heat["encoding"]["y"]["sort"] == ["0", "1", "2–3", "4–7", "8–15", "16+"]
    assert heat["encoding"]["color"]["field"] == "entropy"
    cells = _rows(spec, heat)
    first = {r["position"]: r["entropy"] for r in cells if r["first"] == 0}
    means = toy_trace.steps[0][TOKEN_ENTROPY]["bucket_mean"]
    assert first["0"] == pytest.approx(means[0], rel=1e-2) and "16+" not in first, (
        "an empty bucket has no cell"
    )
    assert {(r["start"], r["end"]) for r in cells if r["first"] == 2} == {(1.5, 2.5)}
    assert line_layers[0]["mark"]["type"] == "line" and line_layers[0]["name"] == "entropy_line_1"
    assert spec["params"][0]["views"] == [heat["name"], line_layers[0]["name"]]
    assert spec["resolve"]["scale"]["x"] == "shared"
    _json(spec)


def test_entropy_flow_marks_nan_cells(toy_trace) -> None:
    spec = entropy_flow(toy_trace).to_dict()
    heat_layers = _layers(spec["vconcat"][0])
    (broken,) = [layer for layer in heat_layers[1:] if layer["mark"]["type"] == "rect"]
    rows = _rows(spec, broken)
    assert {r["first"] for r in rows} == {3} and not any(r["finite"] for r in rows)
    assert broken["mark"]["fill"] == charts.NONFINITE_COLOUR
    assert {r["position"] for r in rows} == {"0", "1", "2–3", "4–7", "8–15"}


def test_entropy_floor_from_the_argument_or_the_replay_config(toy_trace) -> None:
    def floor(spec: dict) -> list[float]:
        layers = _layers(spec["vconcat"][1])
        return [
            row["floor"]
            for layer in layers
            if layer["mark"]["type"] == "rule"
            for row in _rows(spec, layer)
            if "floor" in row
        ]

    assert toy_trace.header["replay_config"]["token_entropy_flow_control"] is False
    assert floor(entropy_flow(toy_trace).to_dict()) == [], "no flow control: no floor"
    assert floor(entropy_flow(toy_trace, floor=0.25).to_dict()) == [0.25]
    config = {
        **toy_trace.header["replay_config"],
        "token_entropy_flow_control": True,
        "min_entropy_floor": 0.4,
    }
    controlled = Trace(header={**toy_trace.header, "replay_config": config}, steps=toy_trace.steps)
    spec = entropy_flow(controlled).to_dict()
    assert floor(spec) == [0.4] and "OPEFO entropy floor (0.4)" in spec["title"]["subtitle"][-1]


def test_entropy_flow_marks_collapses_on_both_panels(toy_trace) -> None:
    findings = [
        Finding("entropy_collapse", 4, "warning", "entropy under the floor from step 4"),
        Finding("entropy_surge", 1, "info", "entropy doubles"),
        Finding("grad_spike", 2, "warning", "not an entropy finding"),
    ]
    spec = entropy_flow(toy_trace, findings=findings).to_dict()
    for panel in spec["vconcat"]:
        rules = [
            layer for layer in panel["layer"] if layer["mark"]["type"] == "rule" and "x" in layer["encoding"]
        ]
        (rule,) = rules
        assert sorted((r["step"], r["type"]) for r in _rows(spec, rule)) == [
            (1, "entropy_surge"),
            (4, "entropy_collapse"),
        ]


def test_entropy_flow_of_many_steps_has_one_column_per_pixel_at_most() -> None:
    n = 10_000
    steps = {
        i: {ENTROPY: 0.5, TOKEN_ENTROPY: _token_entropy([0.5, 0.4, 0.3, 0.2, 0.1, None])} for i in range(n)
    }
    steps[5000][TOKEN_ENTROPY] = _token_entropy([1.0, 0.4, 0.3, 0.2, math.inf, None])
    steps[5001][TOKEN_ENTROPY] = _token_entropy([0.0, 0.4, 0.3, 0.2, 0.1, None], tokens=(12, 4, 8, 16, 32, 0))
    spec = entropy_flow(_trace(steps)).to_dict()
    heat_layers = _layers(spec["vconcat"][0])
    cells = _rows(spec, heat_layers[0])
    first = [r for r in cells if r["position"] == "0"]
    assert len(first) <= FLOW_WIDTH and first[0]["start"] == -0.5 and first[-1]["end"] == n - 0.5
    (mixed,) = [r for r in first if r["first"] <= 5000 <= r["last"]]
    width = mixed["last"] - mixed["first"] + 1
    tokens = 4 * (width - 1) + 12  # the column's token-weighted mean
    expected = (0.5 * 4 * (width - 2) + 1.0 * 4 + 0.0 * 12) / tokens
    assert mixed["entropy"] == pytest.approx(expected, rel=1e-2) and mixed["tokens"] == tokens
    broken = _rows(spec, heat_layers[1])
    assert [(r["position"], r["finite"], r["nonfinite"]) for r in broken] == [("8–15", True, 1)]


def test_entropy_flow_without_summaries_says_so() -> None:
    spec = entropy_flow(_trace({0: {ENTROPY: 0.3}})).to_dict()
    (note,) = _layers(spec["vconcat"][0])
    assert _rows(spec, note) == [{"note": "no token-entropy summaries in this trace"}]
    _json(spec)


# ---------------------------------------------------------------------------------------- widgets


def test_trace_board_widget_redraws_on_its_controls(toy_trace) -> None:
    proxy = Trace(header={**toy_trace.header, "proxy": {"keep": 0.5}}, steps=toy_trace.steps)
    board = TraceBoard(toy_trace, proxy, [Finding("nonfinite", 3, "error", "NaN")])
    assert "moescope-trace-board" in board._dom_classes
    assert board.metrics == charts.DEFAULT_METRICS and board.step_range == (0, 5)
    assert board.metric_picker.options[:6] == charts.DEFAULT_METRICS
    assert "optim/loss_scale" in board.metric_picker.options, "other logged canonical metrics are offered"
    assert len(board.chart.spec["concat"]) == 6
    board.metric_picker.value = (ACTOR_LOSS, REWARD_MEAN)
    assert board.metrics == (ACTOR_LOSS, REWARD_MEAN) and len(board.chart.spec["concat"]) == 2
    board.range_slider.value = (2, 4)  # what dragging the slider does
    layers = _panels(board.chart.spec)[ACTOR_LOSS]
    assert sorted({r["step"] for r in _rows(board.chart.spec, layers[0])}) == [2, 3, 4]
    board.step_range = (0, 5)
    assert board.range_slider.value == (0, 5)
    with pytest.raises(traitlets.TraitError, match="first <= last"):
        board.step_range = (4, 9)
    with pytest.raises(traitlets.TraitError, match="at least one metric"):
        board.metrics = ()


def test_entropy_flow_widget_redraws_on_range_and_floor(toy_trace) -> None:
    flow = EntropyFlow(toy_trace, findings=[Finding("entropy_collapse", 4, "warning", "low")])
    assert "moescope-entropy-flow" in flow._dom_classes and flow.floor is None
    assert flow.chart.embed_options == {"renderer": "canvas", "actions": False}, "SVG clip ids would collide"
    flow.floor = 0.2
    assert flow.chart.spec["title"]["subtitle"][-1] == "dashed: the OPEFO entropy floor (0.2)"
    flow.range_slider.value = (3, 5)
    heat = _layers(flow.chart.spec["vconcat"][0])[0]
    assert min(r["first"] for r in _rows(flow.chart.spec, heat)) == 4, "step 3 is all NaN: no mean cell"


@pytest.mark.parametrize("make", [TraceBoard, EntropyFlow])
def test_trace_widget_state_is_plain_json(toy_trace, make) -> None:
    """The state papermill saves and the static report draws: no NaN may leak into it."""
    widget = make(toy_trace)
    state = ipywidgets.embed.embed_data(
        views=[widget], state=ipywidgets.embed.dependency_state([widget], drop_defaults=False)
    )["manager_state"]
    (spec,) = [m["state"]["spec"] for m in state["state"].values() if m["state"].get("spec")]
    assert spec["params"][0]["name"] == charts.ZOOM
    json.dumps(state, allow_nan=False)
