"""Reference tables generated from moescope's own registries when the site is built.

Each directive writes a Markdown table (or list) from the code that holds the facts and parses
it in place, so a table cannot drift from the code:

* ``moescope-metrics``: :data:`moescope.schema.METRICS` (the metric vocabulary);
* ``moescope-faults``: :data:`moescope.replay.faults.KINDS`;
* ``moescope-fixes``: :data:`moescope.analyze.fixes.FIXES`;
* ``moescope-architectures``: :data:`moescope.models.table.ARCHITECTURES`, each routing rule
  described by :func:`moescope.models.routers.describe` on the architecture's tiny config;
* ``moescope-keymap FRAMEWORK``: :data:`moescope.analyze.readers.KEY_MAP` of one framework;
* ``moescope-reference-cost``: :func:`moescope.export.cost.table.reference_table`;
* ``moescope-paper-cost``: :func:`moescope.export.cost.paper.paper_comparison`.

The functions that write the tables are plain (``metrics_table()`` …), so a test reads them too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _arg(value: object) -> str:
    """A default argument as the command line takes it (``—`` for none)."""
    if value is None:
        return "—"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def metrics_table() -> str:
    from moescope import schema

    return schema.markdown_table()


def faults_table() -> str:
    from moescope.replay.faults import KINDS

    rows = [
        (
            f"`{k.name}`",
            k.simulates,
            _arg(k.default_arg),
            k.default_step,
            "every step from then on" if k.persistent else "one step",
            ", ".join(f"`{s}`" for s in k.signature) or "—",
        )
        for k in KINDS.values()
    ]
    header = ("fault", "simulates", "default ARG", "default STEP", "lasts", "signature (findings)")
    return markdown_table(header, rows)


def fixes_table() -> str:
    from moescope.analyze.fixes import FIXES

    rows = [(f"`{f.name}`", f.does, _arg(f.default)) for f in FIXES.values()]
    return markdown_table(("fix", "what it changes", "default ARG"), rows)


def architectures_table() -> str:
    import transformers

    from moescope.models.routers import describe
    from moescope.models.table import ARCHITECTURES
    from moescope.models.zoo import tiny_config

    transformers.logging.set_verbosity_error()  # tiny configs trip config sanity warnings
    rows = []
    for spec in ARCHITECTURES.values():
        biases = [
            name
            for name, path in (("router bias", spec.router_bias), ("correction bias", spec.correction_bias))
            if path
        ]
        rows.append(
            (
                spec.name,
                f"`{spec.model_type}`",
                describe(spec.rule(tiny_config(spec.model_type))),
                ", ".join(biases) or "",
                "yes" + (" (gated)" if spec.shared_gate else "") if spec.shared_experts else "",
                spec.layout,
                spec.notes,
            )
        )
    header = (
        "architecture",
        "`model_type`",
        "routing (on its tiny test config)",
        "biases",
        "shared experts",
        "expert layout",
        "notes",
    )
    return markdown_table(header, rows)


def keymap_table(framework: str) -> str:
    from moescope.analyze.readers import KEY_MAP

    rows = [(f"`{foreign}`", f"`{canonical}`") for foreign, canonical in KEY_MAP[framework].items()]
    return markdown_table(("key in the log", "canonical key"), rows)


def _seconds(value: float) -> str:
    """The paper's step times: exact where it gives them, ``~`` where it rounds to minutes."""
    return f"~{value:,.0f}" if float(value).is_integer() else f"{value:,.2f}"


def paper_cost_table() -> str:
    from moescope.export.cost.paper import paper_comparison

    rows = [
        (
            row["label"],
            row["experts"],
            f"{row['devices']} ({row['devices_model']})",
            "{} → {} s".format(*map(_seconds, row["step_paper_s"])),
            "{:,.0f} → {:,.0f} s".format(*row["step_predicted_s"]),
            f"{row['ratio_paper']:.2f}×",
            f"{row['ratio_predicted']:.2f}×",
        )
        for _, row in paper_comparison().iterrows()
    ]
    header = (
        "model",
        "experts",
        "devices, paper (moescope's memory model)",
        "step, paper",
        "step, predicted",
        "device-hours full ÷ proxy, paper",
        "predicted",
    )
    return markdown_table(header, rows)


def reference_cost_table() -> str:
    import pandas as pd

    from moescope.export.cost.table import reference_table

    table = reference_table()
    rows = []
    for model, group in table.groupby("model", sort=False):
        by_keep = group.set_index("keep")
        cells = [
            "—" if pd.isna(by_keep.loc[k, "reduction_pct"]) else f"{by_keep.loc[k, 'reduction_pct']:.1f} %"
            for k in ("1/2", "1/4", "1/8")
        ]
        rows.append((model, by_keep.loc["full", "devices"], *cells))
    return markdown_table(("model", "devices (full)", "keep 1/2", "keep 1/4", "keep 1/8"), rows)


TABLES = {
    "moescope-reference-cost": reference_cost_table,
    "moescope-metrics": metrics_table,
    "moescope-faults": faults_table,
    "moescope-fixes": fixes_table,
    "moescope-architectures": architectures_table,
    "moescope-paper-cost": paper_cost_table,
}


class _Table(SphinxDirective):
    """Parses the Markdown its table function returns, in place."""

    make = staticmethod(metrics_table)
    optional_arguments = 1

    def run(self):
        text = self.make(*self.arguments)
        container = self.parse_text_to_nodes(text) if hasattr(self, "parse_text_to_nodes") else None
        if container is None:
            from docutils import nodes

            node = nodes.container()
            self.state.nested_parse(StringList(text.splitlines()), self.content_offset, node)
            container = node.children
        return list(container)


# moescope's numpy-style sections write ``name : what it is`` (a description, not a type), its
# Returns as prose, and sometimes a paragraph after the Parameters; napoleon reads the text
# after a colon as a type and every line up to the next section as a field. So before napoleon
# runs, ``name : text`` becomes ``name`` with ``text`` as its body, a Returns paragraph becomes an
# entry with neither name nor type, and a paragraph after a field section opens a Notes section.
_FIELD_SECTIONS = {"Parameters", "Other Parameters", "Attributes", "Keyword Arguments"}
_PROSE_SECTIONS = {"Returns", "Yields"}
_FIELD = re.compile(r"^(?P<name>\*{0,2}[\w.]+(?:, *\*{0,2}[\w.]+)*) : (?P<text>.+)$")


def _section_of(lines: list[str], i: int) -> str | None:
    following = lines[i + 1].strip() if i + 1 < len(lines) else ""
    if lines[i].strip() and following and set(following) == {"-"}:
        return lines[i].strip()
    return None


def describe_fields(app, what, name, obj, options, lines: list[str]) -> None:
    """Rewrite moescope's sections into the shape napoleon reads (see above)."""
    out: list[str] = []
    section, i = None, 0
    while i < len(lines):
        line = lines[i]
        title = _section_of(lines, i)
        if title in _PROSE_SECTIONS and i + 2 < len(lines) and " : " not in lines[i + 2]:
            section = title
            out += [line, lines[i + 1], ":"]  # an entry with neither name nor type: the prose
            i += 2
            while i < len(lines) and lines[i].strip() and _section_of(lines, i) is None:
                out.append("    " + lines[i])
                i += 1
            continue
        if title is not None:
            section = title
            out += [line, lines[i + 1]]
            i += 2
            continue
        if section in _FIELD_SECTIONS:
            match = _FIELD.match(line)
            if match:
                out += [match["name"], "    " + match["text"]]
                i += 1
                continue
            if line.strip() and not line.startswith(" ") and out and not out[-1].strip():
                out += ["Notes", "-----"]
                section = "Notes"
        out.append(line)
        i += 1
    lines[:] = out


def setup(app):
    app.connect("autodoc-process-docstring", describe_fields, priority=400)
    for name, make in {**TABLES, "moescope-keymap": keymap_table}.items():
        app.add_directive(name, type(name, (_Table,), {"make": staticmethod(make)}))
    return {"parallel_read_safe": True, "parallel_write_safe": True}
