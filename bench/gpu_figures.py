"""The figures table of a bench/gpu_check.sh run (OUT/figures.md), from its OUT/results.jsonl: each bar of issue 32
beside what was measured, in the layout of bench/README.md's "GPU check" table.

    python bench/gpu_figures.py OUT/results.jsonl
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _find(rows: list[dict], **keys) -> dict | None:
    return next((r for r in rows if all(r.get(k) == v for k, v in keys.items()) and "step_ms" in r), None)


def _throughput(result: dict) -> list[tuple[str, str, str]]:
    rows, out = result.get("rows") or [], []
    main = result.get("summary_layout", "auto")  # auto on a GPU; the CPU rehearsal's first layout
    other = next((r["layout"] for r in rows if r["model"] == "ours" and r["layout"] != main), None)
    for L in sorted({r["L"] for r in rows}):
        mlm = _find(rows, L=L, model="ours", objective="mlm", layout=main, compiled=False)
        pmlm = _find(rows, L=L, model="ours", objective="pmlm", layout=main, compiled=False)
        pmlm_other = _find(rows, L=L, model="ours", objective="pmlm", layout=other, compiled=False)
        hf = _find(rows, L=L, model="hf_esm")
        dims = rows[0]["dims"]
        if pmlm and pmlm.get("mfu") is not None:
            figure = f"PMLM-{dims} MFU, L = {L} (peak {result.get('peak_source')}, {result.get('device')})"
            out.append((figure, f"{pmlm['mfu']:.1%}", ">= 45 % (bf16)"))
        if mlm and pmlm:
            ratio = pmlm["step_ms"] / mlm["step_ms"]
            out.append(
                (f"PMLM / MLM step, L = {L}", f"{ratio:.3f} ({pmlm['step_ms']} / {mlm['step_ms']} ms)", "<= 1.15")
            )
        if pmlm and pmlm_other:
            ratio = pmlm_other["step_ms"] / pmlm["step_ms"]
            out.append((f"PMLM step, {other} / {main}, L = {L}", f"{ratio:.2f}", ""))
        for name, ours in (("MLM", mlm), ("PMLM", pmlm)):
            if ours and hf:
                ratio = ours["non_pad_tokens_per_s"] / hf["non_pad_tokens_per_s"]
                value = f"{ratio:.2f}x ({ours['non_pad_tokens_per_s']:,} / {hf['non_pad_tokens_per_s']:,} tok/s)"
                out.append((f"ours {name} / HF EsmForMaskedLM non-pad tokens/s, L = {L}", value, ">= 2"))
    return out


def _lines(step: str, result: dict) -> list[tuple[str, str, str]]:
    """(figure, value, bar) rows of one step's result."""
    if step == "env":
        return [("card", f"{result.get('device')} (torch {result.get('torch')}, CUDA {result.get('cuda')})", "")]
    if step == "gpu_tests":
        return [
            (
                "GPU-marked tests",
                f"{result['tests'] - result['skipped']} run of {result['tests']}, "
                f"{result['failures'] + result['errors']} failed, {result['skipped']} skipped",
                "all pass",
            )
        ]
    if step == "pretrain_resume":
        value = (
            f"exit {result['first_exit']} after step {result['signal_sent_after_step']}, {result['checkpoint']}; "
            f"resumed: {bool(result['resumed_line'])}, final step {result['final_step']}; "
            f"{result['median_step_s']} s/step, {result['median_residues_per_s']} residues/s"
        )
        return [("PMLM-base short run, SIGTERM and resume", value, "exit 99, resumes")]
    if step == "throughput":
        return _throughput(result)
    if step == "memory":
        return [
            (
                f"peak memory, {r['objective']} ({r['precision']}): estimate / measured",
                f"{r['estimate_gib']} / {r['measured_gib']} GiB = {r['estimate_over_measured']}",
                "",
            )
            for r in result.get("rows", [])
        ]
    if step == "pair_memory":
        L = result["target_length"]
        ours = result["ours"][str(L)]["peak_gib"]
        ref = (
            result["reference"]
            .get(str(L), {})
            .get("peak_gib", f"{result.get('reference_analytic_target_gib')} (analytic)")
        )
        ratio = result["ratio_ours_over_reference_at_target"]
        return [(f"pair-loss peak at L = {L}, ours / all pairs", f"{ours} / {ref} GiB = 1/{1 / ratio:.0f}", "<= 1/20")]
    if step in ("compile", "fsdp"):
        value = f"final step {result['final_step']}, first step {result['first_step_s']} s, then {result['median_step_s_after_first']} s/step"
        return [
            ("compile: true, PMLM-base" if step == "compile" else "FSDP, PMLM-large, torchrun 1 GPU", value, "runs")
        ]
    if step == "inputs":
        return [("carried inputs", f"{len(result['files'])} files, {result['bytes'] / 2**20:.1f} MiB", "")]
    if step == "finetune":
        shown = ("P@L/5_medium_long", "P@L_long")  # TAPE's and RaptorX's headline metrics
        cells = "; ".join(
            f"{r['metric']} {float(r['value']):.3f}" for r in result.get("rows", []) if r["metric"] in shown
        )
        return [("contact head (ResNet) on the short run's encoder, 10 steps", cells, "runs")]
    if step == "coupling_curve":
        return [
            (
                f"co-evolution curve at step {result.get('step')}",
                f"Spearman planted {result.get('spearman_planted')}",
                "",
            )
        ]
    return []


def render(lines: list[dict]) -> str:
    out = ["| step | status | s (limit) | figure | value | bar |", "|---|---|---|---|---|---|"]
    for line in lines:
        head = f"| {line['step']} | {line['status']} | {line['seconds']} ({line['budget_s']}) |"
        rows = []
        if isinstance(line.get("result"), dict):
            try:
                rows = _lines(line["step"], line["result"])
            except (KeyError, TypeError, ZeroDivisionError) as exc:
                rows = [("(result unreadable)", repr(exc), "")]
        for k, (figure, value, bar) in enumerate(rows or [("", "", "")]):
            out.append(f"{head if k == 0 else '| | | |'} {figure} | {value} | {bar} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    results = [json.loads(x) for x in Path(sys.argv[1]).read_text().splitlines() if x.strip()]
    sys.stdout.write(render(results))
