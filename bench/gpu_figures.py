"""The figures table of a bench/gpu_check.sh run (OUT/figures.md), from its OUT/results.jsonl: each bar
beside what was measured, in the layout of bench/README.md's "GPU check" table.

    python bench/gpu_figures.py OUT/results.jsonl
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _pct(x) -> str:
    return "" if x is None else f"{x:.1%}"


def _throughput(result: dict) -> list[tuple[str, str, str]]:
    """The bars of the recipe's step from bench_gpu_throughput.py's summary: MFU per dims and objective, PMLM / MLM,
    ours / HF, auto's distance from the best layout, synchronisations and allocator retries."""
    bars, out = result.get("bars", {}), []
    card = f"{result.get('device')}, peak {result.get('peak_source')}"
    for dims, s in (result.get("summary") or {}).items():
        for objective in ("mlm", "pmlm"):
            best = s.get(f"best_{objective}")
            if best:
                bar = f">= {bars.get('mfu_xl', 0.5):.0%}" if dims == "xl" else f">= {bars.get('mfu_base', 0.4):.0%}"
                value = (
                    f"{_pct(best.get('mfu'))} ({best['non_pad_tokens_per_s']:,} tok/s; {best['micro_tokens']:,}-token "
                    f"micro-batches, {best['layout']}{', compiled' if best.get('compiled') else ''}; "
                    f"{best['step_ms']} ms/step)"
                )
                out.append((f"{objective.upper()}-{dims} MFU at the recipe's step ({card})", value, bar))
        if "pmlm_over_mlm_step" in s:
            out.append((f"PMLM / MLM step, {dims}", f"{s['pmlm_over_mlm_step']:.3f}", "<= 1.15"))
        for objective, bar in (("mlm", ">= 3x"), ("pmlm", ">= 2.5x")):
            ratio = s.get(f"ours_{objective}_over_hf_tokens_per_s")
            if ratio is not None:
                out.append(
                    (f"ours {objective.upper()} / HF EsmForMaskedLM non-pad tokens/s, {dims}", f"{ratio:.2f}x", bar)
                )
        worst = max(s.get("auto_vs_best_layout") or [], key=lambda a: a["best_over_auto"], default=None)
        if worst:
            value = f"{worst['best_over_auto']:.3f} (worst: {worst['objective']}, {worst['micro_tokens']:,} tokens, auto {worst['auto']})"
            out.append((f"best layout / auto, {dims}", value, "<= 1.03"))
    rows = [r for r in result.get("rows", []) if r.get("model") == "ours" and "step_ms" in r]
    if rows:
        syncs = sum(r.get("syncs_counted") or 0 for r in rows)
        cuda = [r["cuda_syncs"] for r in rows if r.get("cuda_syncs") is not None]
        retries = sum(r.get("alloc_retries") or 0 for r in rows)
        value = f"{syncs} counted ops; CUDA: {sum(cuda) if cuda else 'not checked'}; allocator retries {retries}"
        out.append(("synchronisations per step, all configurations", value, "0"))
        memory = [r for r in rows if r.get("peak_mem_gib") and r.get("estimate_gib")]
        if memory:
            ratios = [r["estimate_gib"] / r["peak_mem_gib"] for r in memory]
            out.append(("`pmlm plan` peak estimate / measured", f"{min(ratios):.2f} - {max(ratios):.2f}", ""))
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
    if step == "compile":
        value = (
            f"first step {result['cold_first_step_s']} s cold, {result['warm_first_step_s']} s warm; then "
            f"{result['step_ms']} ms/step, {result['non_pad_tokens_per_s']:,} tok/s, MFU {_pct(result.get('mfu'))}; "
            f"graph breaks {result.get('graph_breaks')}"
        )
        return [("PMLM-base compiled whole, the recipe's step", value, "warm < cold, 0 breaks")]
    if step == "fsdp":
        value = f"final step {result['final_step']}, first step {result['first_step_s']} s, then {result['median_step_s_after_first']} s/step"
        return [("FSDP, PMLM-large, torchrun 1 GPU", value, "runs")]
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
