"""What an export wrote and measured: :class:`ExportResult`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

    from moescope.explore.embeddings import ExpertEmbeddings
    from moescope.explore.selection import Selection
    from moescope.export.fidelity.measure import Fidelity
    from moescope.export.fidelity.validity import Check
    from moescope.export.healing import HealingReport
    from moescope.export.targeting import Targeting


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export_proxy` wrote, and what it measured on the way.

    ``embeddings`` are the weight-view vectors a streaming export clustered (when it did);
    ``fidelity``, ``checklist``, ``healing`` and ``targeting`` (the capability target's rounds
    and, for ``keep="auto"``, the kept counts tried) are ``None`` when not measured or not done.
    """

    path: Path
    manifest: dict[str, Any]
    selection: Selection
    embeddings: ExpertEmbeddings | None = None
    fidelity: Fidelity | None = None
    checklist: list[Check] | None = None
    healing: HealingReport | None = None
    targeting: Targeting | None = None

    def healing_frame(self) -> pd.DataFrame:
        """Healing's record (:meth:`HealingReport.to_frame`), or one ``note`` row saying it was not done."""
        if self.healing is not None:
            return self.healing.to_frame()
        if self.targeting is not None and self.targeting.chosen.steps:
            steps = self.targeting.chosen.steps
            return _note(
                f"not healed by heal_steps; the capability target healed {steps} steps (targeting_frame)"
            )
        return _note("not healed (heal_steps = 0)")

    def targeting_frame(self) -> pd.DataFrame:
        """The capability target's curves (:meth:`Targeting.to_frame`), or one ``note`` row saying
        why there were none."""
        if self.targeting is not None:
            return self.targeting.to_frame()
        why = self.manifest.get("targeting", {}).get("why")
        return _note(
            f"capability target not measured: {why}" if why else "no capability target (min_capability = 0)"
        )

    def accuracy_frame(self) -> pd.DataFrame:
        """Task accuracy of original and proxy, or one ``note`` row saying why none was measured."""
        if self.fidelity is None:
            return _note("fidelity was not measured (fidelity=False)")
        if self.fidelity.task_accuracy is None:
            return _note("no tasks for this model: pass tasks= a .jsonl of prompts and answers")
        return self.fidelity.task_accuracy

    def text(self) -> str:
        """What ``moescope export`` prints: the proxy, how the original was read, the method chosen,
        healing, calibration, the capability target, fidelity and the checklist, or why no
        capability was measured; a missed target last, so it is what a reader sees."""
        m = self.manifest
        experts = m["source"]["num_experts"]
        lines = [
            f"proxy: {self.path} ({m['keep']} of {experts} routed experts per layer, "
            f"{m['keep_ratio']:.1%}, method {m['method']})",
            *_original_lines(m.get("original")),
            *_proxy_read_lines(m.get("proxy_read")),
            *_method_choice_lines(m.get("method_choice")),
        ]
        if self.healing is not None:
            h = self.healing
            lines.append(f"healing: {h.steps} steps, held-out KL {h.kl_before:.4f} -> {h.kl_after:.4f}")
        lines += _calibration_lines(m.get("calibration", {}))
        if self.targeting is not None:
            lines.append(self.targeting.text(experts))
        if self.fidelity is not None:
            f = self.fidelity
            lines.append(
                f"fidelity: KL {f.kl:.4f} nats, top-1 agreement {f.top1_agreement:.3f}, "
                f"perplexity ratio {f.perplexity_ratio:.3f}"
            )
        lines += [f"{'PASS' if c.passed else 'FAIL'}  {c.name}: {c.figure}" for c in self.checklist or ()]
        if self.checklist is None:
            lines.append(f"capability: not measured: {_unmeasured(m)}")
        if self.targeting is not None and not self.targeting.passed:
            lines.append(f"FAIL: the proxy misses its capability target: {self.targeting.reason}")
        return "\n".join(lines)


def _original_lines(original: dict[str, Any] | None) -> list[str]:
    """How the original was read (and how often its checkpoint was), its accuracy, and where it ran."""
    if original is None:
        return []
    figure = original.get("accuracy", {}).get("source")
    accuracy = f"; its accuracy {figure}" if figure else ""
    reads = original.get("checkpoint_reads")
    read = f"; its checkpoint read {reads} time{'' if reads == 1 else 's'}" if reads is not None else ""
    lines = [f"original: read {original['read']} ({original['why']}{read}){accuracy}"]
    if "device" in original:
        lines.append(f"compute: {original['device']}, {original['dtype']} ({original['compute_why']})")
    return lines


def _proxy_read_lines(read: dict[str, Any] | None) -> list[str]:
    """How the proxy cut from a layer-sequential original's shards was read to be measured."""
    if not read:
        return []
    reads = read["checkpoint_reads"]
    times = f"; its cut read {reads} time{'' if reads == 1 else 's'}" if reads else ""
    return [f"proxy measured: read {read['read']} ({read['why']}{times})"]


def _method_choice_lines(choice: dict[str, Any] | None) -> list[str]:
    """What ``method="auto"`` measured of each candidate, and what it kept."""
    if not choice:
        return []
    lines = []
    if choice.get("why"):
        lines.append(f"method auto: {choice['fallback']}, since nothing can be measured ({choice['why']})")
    for c in choice["choices"]:
        ratios = ", ".join(f"{m} {'n/a' if r is None else f'{r:.2f}'}" for m, r in c["ratios"].items())
        lines.append(f"method auto, keep {c['keep']}: accuracy ratio {ratios} -> {c['chosen']}")
    return lines


def _calibration_lines(c: dict[str, Any]) -> list[str]:
    """Where the calibration tokens came from: RL samples, given rollouts, or a named source."""
    if c.get("sampled"):
        return [f"calibration: rl, {c['prompts']} replay prompts + own samples ({c['tokens']} tokens)"]
    if c.get("source") == "rollouts":
        given = f"{c['prompts']} prompts ({c['tokens']} tokens)"
        return [f"calibration: rollouts of {c['file']}, {given}, none sampled"]
    if c.get("used", True) and c.get("source"):
        return [f"calibration: {c['source']}" + (f" ({c['data']})" if c.get("data") else "")]
    return []


def _unmeasured(manifest: dict[str, Any]) -> str:
    """Why an export measured no capability, from its manifest."""
    targeting = manifest.get("targeting") or {}
    if targeting.get("why"):
        return targeting["why"]
    if not manifest["config"].get("fidelity"):
        return "fidelity is off (--no-fidelity)"
    return manifest.get("calibration", {}).get("why", "no measurement was asked for")


def _note(text: str) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame({"note": [text]})
